"""The WAL sweeper deletes only objects that no index entry names and that the metadata store
fenced off: orphans once they are older than the orphan grace, objects whose entries went once it
has seen them unreferenced for the read grace; and only on the leader."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

import pytest
from prometheus_client import REGISTRY

from metadata.embedded import EmbeddedMetadataStore
from metadata.model import ObjectType
from metadata.store import MetadataStore, load_metadata_store
from tests.metadata.helpers import append, commit
from wal.s3 import from_url
from wal.store import MemoryObjectStore
from wal.sweeper import Sweeper, run_sweeper, sweep_once, watch_interval


async def aged(store: MemoryObjectStore, keys: list[str], young: list[str]) -> float:
    """Put `keys` and `young`; every one but the young is backdated an hour. Returns now."""
    for key in keys + young:
        await store.put(key, b"x")
    now = time.time()
    for key in keys:
        data, _ = store._objects[key]
        store._objects[key] = (data, now - 3600)
    return now


async def test_only_old_unreferenced_fenced_objects_are_deleted():
    store = MemoryObjectStore()
    now = await aged(store, ["wal/orphan", "wal/committed", "wal/committed-meanwhile", "other/not-wal"], young=["wal/young-orphan"])
    fenced = []

    async def fence(keys):
        fenced.append(sorted(keys))
        return {k for k in keys if k != "wal/committed-meanwhile"}  # its commit landed before the fence

    deleted = await sweep_once(store, lambda: {"wal/committed"}, fence, grace_s=600, now=now)
    assert deleted == ["wal/orphan"]
    assert fenced == [["wal/committed-meanwhile", "wal/orphan"]]  # only old, unreferenced objects are fenced
    assert sorted([o.key async for o in store.list()]) == ["other/not-wal", "wal/committed", "wal/committed-meanwhile", "wal/young-orphan"]


async def test_references_are_read_after_listing_and_nothing_referenced_is_fenced():
    store = MemoryObjectStore()
    await store.put("wal/a", b"x")
    calls = []

    def referenced():
        calls.append("refs")
        return {"wal/a"}

    async def fence(keys):
        calls.append(("fence", sorted(keys)))
        return set(keys)

    assert await sweep_once(store, referenced, fence, grace_s=0, now=time.time() + 1) == []
    assert calls == ["refs"]


async def test_references_may_be_awaited_and_what_they_name_is_kept():
    store = MemoryObjectStore()
    now = await aged(store, ["wal/compacted", "wal/orphan"], young=[])

    async def referenced():  # e.g. the WAL objects of the cycle manifests compacted entries name
        return {"wal/compacted"}

    async def fence(keys):
        return set(keys)

    assert await sweep_once(store, referenced, fence, grace_s=600, now=now) == ["wal/orphan"]
    assert [o.key async for o in store.list()] == ["wal/compacted"]


# -- the WAL collector: unreferenced objects after the read grace, on the leader only ------------

READ_GRACE_S = 60
ORPHAN_GRACE_S = 3600


def deleted_total(metric: str, reason: str) -> float:
    return REGISTRY.get_sample_value(f"neve_wal_{metric}_deleted_total", {"reason": reason}) or 0.0


class Deletions:
    """The sweeper's counters from now on: objects and bytes deleted, by reason."""

    def __init__(self) -> None:
        self.start = {(m, r): deleted_total(m, r) for m in ("objects", "bytes") for r in ("orphan", "unreferenced")}

    def __call__(self, reason: str) -> tuple[float, float]:
        return tuple(deleted_total(m, reason) - self.start[(m, reason)] for m in ("objects", "bytes"))


async def replace_by_another_object(meta: MetadataStore, topic_id, object_key: str, other: str) -> None:
    """The compactor's index swap, as a test: the partition's entry in `object_key` becomes one
    naming `other` (a Parquet file), so `object_key` is referenced no more."""
    [entry] = [e for e in meta.entries(topic_id, 0, 0) if e.object_key == object_key]
    assert await meta.replace_entries(topic_id, 0, [entry], dataclasses.replace(entry, object_key=other, object_type=ObjectType.PARQUET))


async def listed(store) -> list[str]:
    return sorted([o.key async for o in store.list("wal/")])


async def test_an_object_whose_entries_went_is_kept_for_the_read_grace_then_deleted_and_counted():
    meta = EmbeddedMetadataStore(None)
    await meta.start()
    objects = MemoryObjectStore()
    try:
        topic = await meta.create_topic("t", 1)
        await objects.put("wal/a", b"a" * 700)
        await objects.put("wal/b", b"b" * 300)
        await meta.commit(commit(append(topic.topic_id, 0, 0, 700, 7), key="wal/a"))
        await meta.commit(commit(append(topic.topic_id, 0, 0, 300, 3), key="wal/b"))
        sweeper = Sweeper(objects, meta.referenced_objects, meta.fence_objects, ORPHAN_GRACE_S, READ_GRACE_S)
        t0 = time.time()
        assert await sweeper.sweep(now=t0) == []
        await replace_by_another_object(meta, topic.topic_id, "wal/a", "table/data/a.parquet")
        counted = Deletions()
        assert await sweeper.sweep(now=t0 + 1) == []  # first seen unreferenced
        assert await sweeper.sweep(now=t0 + READ_GRACE_S) == []  # a fetch that read the entry may read on
        assert await listed(objects) == ["wal/a", "wal/b"]
        assert await sweeper.sweep(now=t0 + 1 + READ_GRACE_S) == ["wal/a"]
        assert await listed(objects) == ["wal/b"]
        assert counted("unreferenced") == (1, 700)
        assert counted("orphan") == (0, 0)
    finally:
        await meta.close()


async def test_an_object_known_committed_waits_the_read_grace_though_no_round_saw_it_referenced():
    """A compactor can replace an object's entries between two rounds: the sweeper never sees it
    referenced, but the cycle manifests say it was committed (`committed`): it goes after the read
    grace, not after the orphan grace."""
    objects = MemoryObjectStore()
    await objects.put("wal/compacted", b"c" * 50)
    await objects.put("wal/orphan", b"o" * 20)

    async def fence(keys):
        return set(keys)

    async def committed():
        return {"wal/compacted"}

    sweeper = Sweeper(objects, set, fence, orphan_grace_s=600, read_grace_s=READ_GRACE_S, committed=committed)
    counted = Deletions()
    t0 = time.time()
    assert await sweeper.sweep(now=t0) == []
    assert await sweeper.sweep(now=t0 + READ_GRACE_S - 1) == []
    assert await sweeper.sweep(now=t0 + READ_GRACE_S) == ["wal/compacted"]  # the young orphan stays
    assert await listed(objects) == ["wal/orphan"]
    assert counted("unreferenced") == (1, 50)


async def test_a_new_sweeper_keeps_what_it_finds_unreferenced_for_the_read_grace_and_sweeps_orphans():
    """A sweeper that starts (a new leader) cannot tell an old object whose entries just went from
    an old orphan: it starts their clocks afresh. An orphan it sees appear goes by its age."""
    objects = MemoryObjectStore()
    now = await aged(objects, ["wal/inherited"], young=[])

    async def fence(keys):
        return set(keys)

    sweeper = Sweeper(objects, set, fence, orphan_grace_s=600, read_grace_s=READ_GRACE_S)
    counted = Deletions()
    assert await sweeper.sweep(now=now) == []  # an hour old, but unreferenced since when?
    await objects.put("wal/orphan", b"never committed")
    objects._objects["wal/orphan"] = (objects._objects["wal/orphan"][0], now - 3600)
    assert await sweeper.sweep(now=now + 1) == ["wal/orphan"]  # appeared after the first listing: its age decides
    assert await sweeper.sweep(now=now + READ_GRACE_S - 1) == []
    assert await sweeper.sweep(now=now + READ_GRACE_S) == ["wal/inherited"]
    assert counted("orphan") == (2, len(b"x") + len(b"never committed"))


async def test_a_sweeper_that_stops_leading_deletes_nothing_and_forgets():
    objects = MemoryObjectStore()
    now = await aged(objects, ["wal/orphan"], young=[])

    async def fence(keys):
        return set(keys)

    sweeper = Sweeper(objects, set, fence, orphan_grace_s=600, read_grace_s=READ_GRACE_S)
    assert await sweeper.tick(leading=True, current=True, now=now) == []  # first listing: inherited
    assert await sweeper.tick(leading=False, current=True, now=now + READ_GRACE_S) == []
    assert await sweeper.tick(leading=True, current=False, now=now + READ_GRACE_S) == []  # a stale view: no round
    assert await sweeper.tick(leading=True, current=True, now=now + READ_GRACE_S) == []  # leading again: clocks afresh
    assert await sweeper.tick(leading=True, current=True, now=now + 2 * READ_GRACE_S) == ["wal/orphan"]


# -- the index watch between listings: an object goes within its read grace of its swap ------------


class CountedStore(MemoryObjectStore):
    """A memory store that counts full listings of the WAL prefix and notes each deletion's time."""

    def __init__(self) -> None:
        super().__init__()
        self.listings = 0
        self.deleted: dict[str, float] = {}
        self.deletion = asyncio.Event()

    def list(self, prefix: str = ""):
        self.listings += prefix == "wal/"
        return super().list(prefix)

    async def delete(self, key: str) -> None:
        await super().delete(key)
        self.deleted[key] = time.monotonic()
        self.deletion.set()


def held(objects: MemoryObjectStore) -> list[str]:
    """The WAL objects in the store, not by a listing (which the tests count)."""
    return sorted(k for k in objects._objects if k.startswith("wal/"))


async def committed_store(*sizes: tuple[str, int]):
    """An embedded store with topic `t` (1 partition) and a CountedStore holding a committed
    object of each (key, size)."""
    meta = EmbeddedMetadataStore(None)
    await meta.start()
    objects = CountedStore()
    topic = await meta.create_topic("t", 1)
    for key, size in sizes:
        await objects.put(key, b"x" * size)
        await meta.commit(commit(append(topic.topic_id, 0, 0, size, 1), key=key))
    return meta, objects, topic


async def test_the_watch_deletes_an_object_the_read_grace_after_its_entries_went_without_listing():
    meta, objects, topic = await committed_store(("wal/a", 700), ("wal/b", 300))
    try:
        sweeper = Sweeper(objects, meta.referenced_objects, meta.fence_objects, ORPHAN_GRACE_S, READ_GRACE_S)
        counted = Deletions()
        t0 = time.time()
        assert await sweeper.watch(now=t0) == []  # the first look learns what is referenced
        await replace_by_another_object(meta, topic.topic_id, "wal/a", "table/data/a.parquet")
        assert await sweeper.watch(now=t0 + 1) == []  # its clock starts
        assert sweeper.next_due() == t0 + 1 + READ_GRACE_S
        assert await sweeper.watch(now=t0 + READ_GRACE_S) == []  # a fetch that read the entry may read on
        assert held(objects) == ["wal/a", "wal/b"]
        assert await sweeper.watch(now=t0 + 1 + READ_GRACE_S) == ["wal/a"]
        assert held(objects) == ["wal/b"]
        assert objects.listings == 0
        assert counted("unreferenced") == (1, 700)  # its size by a HEAD, no listing having seen it
        assert sweeper.next_due() is None
        # a listing round afterwards finds nothing more to do, and wal/b stays
        assert await sweeper.sweep(now=t0 + 2 + READ_GRACE_S) == []
        assert held(objects) == ["wal/b"]
    finally:
        await meta.close()


async def test_an_object_a_swap_replaced_between_two_looks_is_learnt_from_the_swap():
    """A cycle takes an object seconds after its commit, between two looks: the watch never sees
    it referenced, but the swap's new entry names a manifest that says it replaced it."""
    meta, objects, topic = await committed_store(("wal/old", 10))
    replaced_by = {"compacted/cycle-1.json": {"wal/c"}}
    asked = []

    async def superseded(keys: set[str]) -> set[str]:
        asked.append(sorted(keys))
        return set().union(*(replaced_by.get(k, set()) for k in keys))

    try:
        sweeper = Sweeper(objects, meta.referenced_objects, meta.fence_objects, ORPHAN_GRACE_S, READ_GRACE_S, superseded=superseded)
        t0 = time.time()
        assert await sweeper.watch(now=t0) == []
        await objects.put("wal/c", b"c" * 40)
        await meta.commit(commit(append(topic.topic_id, 0, 0, 40, 1), key="wal/c"))
        await replace_by_another_object(meta, topic.topic_id, "wal/c", "compacted/cycle-1.json")
        assert await sweeper.watch(now=t0 + 2) == []
        assert asked == [["compacted/cycle-1.json"]]  # only what the index names anew since the last look
        assert await sweeper.watch(now=t0 + 2 + READ_GRACE_S - 0.5) == []
        assert await sweeper.watch(now=t0 + 2 + READ_GRACE_S) == ["wal/c"]
        assert asked == [["compacted/cycle-1.json"]]
        assert held(objects) == ["wal/old"]
    finally:
        await meta.close()


async def test_without_the_swap_the_watch_leaves_an_object_it_never_saw_to_the_listing():
    meta, objects, topic = await committed_store(("wal/old", 10))
    try:
        sweeper = Sweeper(objects, meta.referenced_objects, meta.fence_objects, ORPHAN_GRACE_S, READ_GRACE_S)
        t0 = time.time()
        assert await sweeper.watch(now=t0) == []
        await objects.put("wal/c", b"c" * 40)
        await meta.commit(commit(append(topic.topic_id, 0, 0, 40, 1), key="wal/c"))
        await replace_by_another_object(meta, topic.topic_id, "wal/c", "compacted/cycle-1.json")
        assert await sweeper.watch(now=t0 + 2 * ORPHAN_GRACE_S) == []  # never seen referenced: not the watch's to judge
        assert held(objects) == ["wal/c", "wal/old"]
    finally:
        await meta.close()


async def test_a_running_sweeper_deletes_a_compacted_object_within_its_read_grace_and_a_watch_interval():
    """run_sweeper with a listing an hour away: the swap is followed by the deletion after the
    read grace, and before the read grace plus a watch interval (and a second for a busy loop)."""
    read_grace_s = 1.5
    meta, objects, topic = await committed_store(("wal/a", 70), ("wal/b", 30))
    task = asyncio.create_task(run_sweeper(objects, meta.referenced_objects, meta.fence_objects, meta.is_current, ORPHAN_GRACE_S, 3600, read_grace_s=read_grace_s))
    try:
        await asyncio.sleep(watch_interval(read_grace_s) * 1.5)  # the first look has happened
        swapped = time.monotonic()
        await replace_by_another_object(meta, topic.topic_id, "wal/a", "table/data/a.parquet")
        await asyncio.wait_for(objects.deletion.wait(), 60)
        assert list(objects.deleted) == ["wal/a"]
        took = objects.deleted["wal/a"] - swapped
        assert read_grace_s <= took <= read_grace_s + watch_interval(read_grace_s) + 1.0, took
        assert objects.listings == 0
    finally:
        task.cancel()
        await meta.close()


# -- two nodes over a real etcd and SeaweedFS --------------------------------------------------------


@pytest.fixture
def aws_env(seaweedfs, monkeypatch):
    for key, value in seaweedfs.env.items():
        monkeypatch.setenv(key, value)


@pytest.mark.integration
async def test_only_the_leader_deletes_and_its_successor_starts_the_clocks_afresh(etcd_server, seaweedfs, aws_env):
    name = f"sweep-{uuid.uuid4().hex[:8]}"
    # a 10 s lease: a loaded machine's late keep-alive must not cost the leader its lead mid-test
    metas = [load_metadata_store(f"{etcd_server.url}/{name}", lease_ttl_s=10) for _ in range(2)]
    objects = [from_url(seaweedfs.object_store_url(name)) for _ in range(2)]
    for meta in metas:
        await meta.start()
    try:
        topic = await metas[0].create_topic("t", 1)
        await objects[0].put("wal/a", b"a" * 700)
        await objects[0].put("wal/b", b"b" * 300)
        await metas[0].commit(commit(append(topic.topic_id, 0, 0, 700, 7), key="wal/a"))
        await metas[0].commit(commit(append(topic.topic_id, 0, 0, 300, 3), key="wal/b"))
        leaderships = [await meta.campaign("wal-sweeper", f"node-{i}") for i, meta in enumerate(metas)]
        waits = [asyncio.ensure_future(lead.wait_leading(60)) for lead in leaderships]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        [leader] = [i for i, lead in enumerate(leaderships) if lead.is_leader()]
        follower = 1 - leader
        sweepers = [Sweeper(objects[i], metas[i].referenced_objects, metas[i].fence_objects, ORPHAN_GRACE_S, READ_GRACE_S) for i in range(2)]

        def tick(i: int, now: float):
            return sweepers[i].tick(leaderships[i].is_leader(), metas[i].is_current(), now)

        assert await metas[leader]._view_reaches(await etcd_revision(metas[0]), 30)
        t0 = time.time()
        assert await tick(leader, t0) == [] and await tick(follower, t0) == []
        await replace_by_another_object(metas[leader], topic.topic_id, "wal/a", "table/data/a.parquet")
        counted = Deletions()
        assert await tick(leader, t0 + 1) == []
        assert await tick(leader, t0 + READ_GRACE_S) == []
        assert await tick(follower, t0 + 2 * ORPHAN_GRACE_S) == []  # not the leader: nothing, whatever the time
        assert await listed(objects[0]) == ["wal/a", "wal/b"]
        assert await tick(leader, t0 + 1 + READ_GRACE_S) == ["wal/a"]
        assert await listed(objects[0]) == ["wal/b"]
        assert counted("unreferenced") == (1, 700)

        # An orphan the leader sees appear goes once its age is past the orphan grace.
        await objects[0].put("wal/orphan", b"never committed")
        assert await tick(leader, t0 + 2 + READ_GRACE_S) == []
        assert await tick(leader, time.time() + ORPHAN_GRACE_S) == ["wal/orphan"]
        assert counted("orphan") == (1, len(b"never committed"))

        # wal/b's entry goes too, and then the leader: its successor never saw wal/b referenced,
        # and gives it the read grace from its own first listing.
        await replace_by_another_object(metas[leader], topic.topic_id, "wal/b", "table/data/b.parquet")
        revision = await etcd_revision(metas[leader])
        await metas[leader].close()
        assert await leaderships[follower].wait_leading(60)
        assert await metas[follower]._view_reaches(revision, 30)
        t1 = time.time() + 2 * ORPHAN_GRACE_S  # wal/b is far older than the orphan grace by then
        assert await tick(follower, t1) == []
        assert await tick(follower, t1 + READ_GRACE_S - 1) == []
        assert await tick(follower, t1 + READ_GRACE_S) == ["wal/b"]
        assert await listed(objects[follower]) == []
        assert counted("orphan") == (2, len(b"never committed") + 300)
    finally:
        for meta in metas:
            await meta.close()
        for store in objects:
            async for info in store.list(""):
                await store.delete(info.key)
            await store.close()


async def etcd_revision(meta) -> int:
    """etcd's revision now, past every write made so far (a put of a marker key)."""
    return (await meta._client.put(meta.keys.prefix("test-marker"), b"")).header.revision

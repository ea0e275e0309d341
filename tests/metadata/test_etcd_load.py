"""Loading the etcd store's view when the metadata is large, and reloading it after the watch fell
behind etcd's compacted history, against a real etcd. Everything is written through the store's
own commit path."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from metadata.etcd import EtcdSettings
from metadata.etcd import store as etcd_store
from tests.metadata.helpers import append, commit, open_etcd_store

PARTITIONS = 100
WRITERS = 4
COMMITS_PER_WRITER = 300  # 1,200 wal-index records of 100 partitions: 5.3 MB, over gRPC's 4 MiB default
PATIENT = EtcdSettings(timeout=60.0)  # a slow disk takes its time over 1,200 transactions


async def write_index(etcd_server, root: str) -> dict:
    """Each writer its own topic of PARTITIONS partitions, COMMITS_PER_WRITER commits of one
    10-record append per partition: returns {topic id: high watermark per partition}."""
    writers = [await open_etcd_store(etcd_server, root, PATIENT) for _ in range(WRITERS)]
    try:
        topics = [(await w.create_topic(f"t{i}", PARTITIONS)).topic_id for i, w in enumerate(writers)]

        async def run(writer, t) -> None:
            for n in range(COMMITS_PER_WRITER):
                results = await writer.commit(commit(*(append(t, p, p * 100, 100, 10, max_ts=n) for p in range(PARTITIONS))))
                assert {r.error_code for r in results} == {0}

        await asyncio.gather(*(run(w, t) for w, t in zip(writers, topics, strict=True)))
        return {t: COMMITS_PER_WRITER * 10 for t in topics}
    finally:
        for w in writers:
            await w.close()


@pytest.mark.integration
@pytest.mark.timeout(600)
async def test_a_store_starts_on_metadata_larger_than_a_grpc_message(etcd_server, monkeypatch):
    """A single range read of the root failed here with 'Received message larger than max'. The
    paged read also shrinks a page that gRPC refuses: its limit is set below the pages' size."""
    expected = await write_index(etcd_server, "large")
    records = await _count(etcd_server, "/large/wal-index/")
    assert records == WRITERS * COMMITS_PER_WRITER
    for grpc_limit in (etcd_store.GRPC_MAX_MESSAGE_BYTES, 1024 * 1024):  # then pages of 4 MiB refused
        monkeypatch.setattr(etcd_store, "GRPC_MAX_MESSAGE_BYTES", grpc_limit)
        store = await open_etcd_store(etcd_server, "large", PATIENT)
        try:
            for t, hw in expected.items():
                for p in range(PARTITIONS):
                    assert store.high_watermark(t, p) == hw
                entries = store.entries(t, 7, 0, max_entries=10_000)
                assert [(e.base_offset, e.last_offset, e.max_timestamp) for e in entries] == [(n * 10, n * 10 + 9, n) for n in range(COMMITS_PER_WRITER)]
        finally:
            await store.close()


async def _count(etcd_server, prefix: str) -> int:
    store = await open_etcd_store(etcd_server, "count-helper")
    try:
        return sum(1 for _ in await store._client.get_prefix(prefix.encode(), keys_only=True))
    finally:
        await store.close()


@pytest.mark.integration
@pytest.mark.timeout(300)
async def test_a_watch_behind_a_compacted_revision_reloads_and_catches_up_while_commits_continue(etcd_server):
    writer = await open_etcd_store(etcd_server, "behind")
    follower = await open_etcd_store(etcd_server, "behind")
    try:
        t = (await writer.create_topic("t", 3)).topic_id
        assert await writer.commit(commit(append(t, 0, 0, 10, 5)))
        while follower.high_watermark(t, 0) < 5:
            assert await follower.wait_for_commit([(t, 0)], timeout=30), "the follower never saw the first commit"
        watch = follower._tasks[0]  # the follower's watch stops here, at revision `behind`
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        behind = follower._revision

        stop = asyncio.Event()
        committed = {0: 5, 1: 0, 2: 0}

        async def keep_committing() -> None:
            n = 0
            while not stop.is_set():
                p = n % 3
                await writer.commit(commit(append(t, p, 0, 10, 2)))
                committed[p] += 2
                n += 1
                await asyncio.sleep(0.005)

        committing = asyncio.create_task(keep_committing())
        while sum(committed.values()) < 5 + 60:
            await asyncio.sleep(0.01)
        now = await writer._current_revision()
        assert now > behind + 1
        await writer._client.compact(now)  # the follower's next event is history now
        follower._tasks[0] = asyncio.create_task(follower._follow(behind))  # it watches from `behind` + 1: compacted
        while sum(committed.values()) < 5 + 120:  # commits go on while it reloads
            await asyncio.sleep(0.01)
        stop.set()
        await committing
        deadline = asyncio.get_running_loop().time() + 60
        while [follower.high_watermark(t, p) for p in range(3)] != [committed[p] for p in range(3)]:
            assert asyncio.get_running_loop().time() < deadline, f"the follower is at {[follower.high_watermark(t, p) for p in range(3)]}, not {committed}"
            await asyncio.sleep(0.02)
        assert follower.is_current()
        assert [(e.base_offset, e.last_offset) for e in follower.entries(t, 1, 0, max_entries=1000)] == [(o, o + 1) for o in range(0, committed[1], 2)]
    finally:
        await writer.close()
        await follower.close()


@pytest.mark.integration
async def test_each_store_compacts_the_history_it_no_longer_needs(etcd_server):
    """Every `compact_interval_s` a store compacts etcd's history up to `keep_revisions` behind
    the newest revision; a read at an older revision is then refused."""
    store = await open_etcd_store(etcd_server, "history", EtcdSettings(compact_interval_s=0.05, keep_revisions=10))
    try:
        t = (await store.create_topic("t", 1)).topic_id
        first = await store._current_revision()
        for _ in range(30):
            await store.commit(commit(append(t, 0, 0, 10, 1)))
        newest = await store._current_revision()
        assert newest >= first + 30
        deadline = asyncio.get_running_loop().time() + 60
        while True:  # the compaction reaches at least newest - keep_revisions
            await _read_at(store, newest - 10)  # still kept
            try:
                await _read_at(store, first)
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.OUT_OF_RANGE and "compacted" in e.details(), e
                break
            assert asyncio.get_running_loop().time() < deadline, "the history was never compacted"
            await asyncio.sleep(0.05)
    finally:
        await store.close()


async def _read_at(store, revision: int):
    from aetcd import rpc

    return await store._client.kvstub.Range(rpc.RangeRequest(key=store.keys.topic("t"), revision=revision), timeout=10, metadata=store._client.metadata)


# Issue 20's acceptance load, scaled to the suite: the 1,000 partitions and 2,000 idempotent
# producers of `python -m bench.metadata_load` (which writes the whole 50 GiB, 12,800 commits,
# and records its figures in bench/RESULTS.md), with as many 4 MiB objects as a minute allows.
SUITE_COMMITS_PER_TOPIC = 200  # 2,000 objects: 7.8 GiB


@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.xdist_group("etcd-heavy")
async def test_a_broker_starts_serves_and_follows_on_the_metadata_of_1000_partitions_and_2000_producers(etcd_server, tmp_path):
    """Written through the store's own commit path (one 4 MiB object of 100 one-batch appends per
    commit, the batches of 200 producers per topic with sequences running on); then a fresh store
    loads every high watermark exactly and finds the entries of old and new objects, follows
    another store's commits, and `neve broker` starts on it and answers every partition's high
    watermark through ListOffsets. Start times and memory are printed."""
    from bench import metadata_load as load

    port = etcd_server.ports["client"]
    root = f"acceptance-load-{uuid.uuid4().hex[:8]}"
    try:
        await _acceptance_load(load, port, root, tmp_path)
    finally:
        # The worker's etcd serves other tests: 90 MB of keys less to keep. A plain client with a
        # generous deadline (a slow disk took etcd over 5 s to delete them), not a store, which
        # would load all of it first.
        import aetcd

        async with aetcd.Client("127.0.0.1", port, timeout=300) as client:
            # etcd itself may time the one large delete out under a loaded disk ("etcdserver:
            # request timed out"; it may still apply it): asked again until it answers
            for attempt in range(10):
                try:
                    await client.delete_prefix(f"/{root}/".encode())  # every key of the store under `root`
                    break
                except aetcd.exceptions.ConnectionFailedError:
                    if attempt == 9:
                        raise
                    await asyncio.sleep(1 + attempt)  # a backoff between retries of a failed request


async def _acceptance_load(load, port: int, root: str, tmp_path) -> None:
    from bench.servers import terminate

    topic_ids = await load.create_topics(port, root)
    setup_s = await asyncio.to_thread(load.populate, port, root, topic_ids, SUITE_COMMITS_PER_TOPIC, 2)
    store, start_s, rss = await load.start_store(port, root)
    try:
        assert load.check_view(store, topic_ids, SUITE_COMMITS_PER_TOPIC) == 10 * 3 * 4 * 2
        follow_s = await load.follows(store, port, root, topic_ids, SUITE_COMMITS_PER_TOPIC, load.FOLLOWED)
    finally:
        await store.close()
    proc, bootstrap, broker_start_s, broker_rss = await asyncio.to_thread(load.start_broker, port, root, tmp_path)
    try:
        hws = await asyncio.to_thread(load.broker_high_watermarks, bootstrap, topic_ids)
        made = {load.topic_name(t): SUITE_COMMITS_PER_TOPIC + (load.FOLLOWED if t == 0 else 0) for t in topic_ids}
        assert len(hws) == 1_000
        assert {tp: hw for tp, hw in hws.items() if hw != load.high_watermark(int(tp[0].split("-")[1]), tp[1], made[tp[0]])} == {}
    finally:
        await asyncio.to_thread(terminate, proc, timeout=30)
    print(
        f"\n{SUITE_COMMITS_PER_TOPIC * 10} commits ({SUITE_COMMITS_PER_TOPIC * 10 * 4 / 1024:.1f} GiB) written in {setup_s:.1f} s; "
        f"store start {start_s:.2f} s, +{rss / 2**20:.0f} MiB RSS, followed {load.FOLLOWED} commits in {follow_s:.2f} s; "
        f"neve broker listening after {broker_start_s:.2f} s at {broker_rss / 2**20:.0f} MiB RSS"
    )

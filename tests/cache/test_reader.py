"""ObjectReader.read_many: the ranges a fetch needs, read concurrently, close ranges of one object
with one GET, exact bytes back."""

from __future__ import annotations

import asyncio

import pytest

from cache.reader import MERGE_GAP_BYTES, ObjectReader
from cache.recent import RecentObjects
from wal.store import MemoryObjectStore, ObjectNotFound

OBJECT = bytes(range(256)) * 4096  # 1 MiB, every byte's value its position mod 256


class GatedStore(MemoryObjectStore):
    """Records every GET and holds each until `release` is set, so a test can see which GETs
    were in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gets: list[tuple[str, int, int | None]] = []
        self.all_started = asyncio.Event()
        self.expected = 0
        self.release = asyncio.Event()

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.gets.append((key, start, end))
        if len(self.gets) == self.expected:
            self.all_started.set()
        await self.release.wait()
        return await super().get(key, start, end)


async def stored(*keys: str) -> GatedStore:
    store = GatedStore()
    for key in keys:
        await store.put(key, OBJECT)
    return store


async def read_all(reader: ObjectReader, store: GatedStore, ranges, expected_gets: int):
    store.expected = expected_gets
    task = asyncio.create_task(reader.read_many(ranges))
    await asyncio.wait_for(store.all_started.wait(), 5)  # every GET under way before any answered
    store.release.set()
    return await task


async def test_close_ranges_of_one_object_share_one_get():
    store = await stored("a")
    gets = []
    reader = ObjectReader(store, RecentObjects(0), on_get=gets.append)
    ranges = [("a", 1000, 500), ("a", 0, 100), ("a", 1500 + MERGE_GAP_BYTES, 10)]  # gaps 900 and exactly the limit
    got = await read_all(reader, store, ranges, 1)
    assert store.gets == [("a", 0, 1510 + MERGE_GAP_BYTES)]
    assert gets == [1510 + MERGE_GAP_BYTES]
    assert {r: bytes(v) for r, v in got.items()} == {r: OBJECT[r[1] : r[1] + r[2]] for r in ranges}


async def test_far_ranges_and_other_objects_are_read_concurrently():
    store = await stored("a", "b")
    reader = ObjectReader(store, RecentObjects(0))
    ranges = [("a", 0, 10), ("a", 11 + MERGE_GAP_BYTES, 20), ("b", 5, 5), ("b", 0, 0)]  # the empty range needs no GET
    got = await read_all(reader, store, ranges, 3)
    assert sorted(store.gets) == [("a", 0, 10), ("a", 11 + MERGE_GAP_BYTES, 31 + MERGE_GAP_BYTES), ("b", 5, 10)]
    assert {r: bytes(v) for r, v in got.items()} == {r: OBJECT[r[1] : r[1] + r[2]] for r in ranges[:3]}


async def test_ranges_of_recent_objects_come_from_the_cache_and_outlive_it():
    store = await stored("a", "b")
    recent = RecentObjects(len(OBJECT))
    recent.add("a", [OBJECT])
    reader = ObjectReader(store, recent)
    got = await read_all(reader, store, [("a", 0, 10), ("a", 4096, 7), ("b", 0, 10)], 1)
    assert store.gets == [("b", 0, 10)]  # no GET for a
    assert {r: bytes(v) for r, v in got.items()} == {("a", 0, 10): OBJECT[:10], ("a", 4096, 7): OBJECT[4096:4103], ("b", 0, 10): OBJECT[:10]}
    assert (recent.hits, recent.misses) == (2, 1)  # a's two ranges; b's GET is the one miss
    # the cache drops a (a newer object fills it): the bytes read_many gave are still the same
    recent.add("c", [bytes(len(OBJECT))])
    assert not recent.has("a")
    assert bytes(got[("a", 4096, 7)]) == OBJECT[4096:4103]


async def test_a_failed_get_leaves_only_its_ranges_out():
    store = await stored("a")
    reader = ObjectReader(store, RecentObjects(0))
    got = await read_all(reader, store, [("gone", 0, 10), ("a", 3, 4)], 2)
    assert {r: bytes(v) for r, v in got.items()} == {("a", 3, 4): OBJECT[3:7]}
    with pytest.raises(ObjectNotFound):  # the caller's own read of it fails as before
        await reader.read("gone", 0, 10)


async def test_a_compacted_entry_reads_the_wal_bytes_its_manifest_replaced_and_the_manifest_once():
    import uuid

    from wal.manifest import CycleManifest, PartitionCompaction, WalRange

    store = MemoryObjectStore()
    await store.put("wal/a", OBJECT)
    await store.put("wal/b", OBJECT[::-1])
    p0 = PartitionCompaction(0, (WalRange("wal/a", 100, 50, 0, 4, 1), WalRange("wal/b", 0, 30, 5, 6, 2)), ())
    p1 = PartitionCompaction(1, (WalRange("wal/a", 150, 20, 0, 1, 3),), ())
    manifest = CycleManifest("c1", uuid.uuid4(), "t", "neve.t", (p0, p1))
    await store.put(manifest.key, manifest.encode())
    gets = []
    reader = ObjectReader(store, RecentObjects(0), on_get=gets.append)

    assert bytes(await reader.read(manifest.key, 0, 80)) == OBJECT[100:150] + OBJECT[::-1][0:30]
    assert bytes(await reader.read(manifest.key, 80, 20)) == OBJECT[150:170]
    many = await reader.read_many([(manifest.key, 0, 80), (manifest.key, 80, 20), ("wal/a", 0, 10)])
    assert {r: bytes(v) for r, v in many.items()} == {(manifest.key, 0, 80): OBJECT[100:150] + OBJECT[::-1][0:30], (manifest.key, 80, 20): OBJECT[150:170], ("wal/a", 0, 10): OBJECT[:10]}
    assert gets.count(len(manifest.encode())) == 1  # the manifest was read once


async def test_a_compacted_entry_whose_manifest_is_missing_or_broken_is_a_storage_error():
    from wal.store import ObjectStoreError

    store = MemoryObjectStore()
    await store.put("compacted/x/broken.json", b"{not json")
    reader = ObjectReader(store, RecentObjects(0))
    with pytest.raises(ObjectNotFound):
        await reader.read("compacted/x/missing.json", 0, 10)
    with pytest.raises(ObjectStoreError):
        await reader.read("compacted/x/broken.json", 0, 10)

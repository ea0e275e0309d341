"""The per-zone chunk cache: rendezvous ownership, the byte-bounded LRU, one GET per chunk however
many readers miss at once, reads through the owner over the chunk protocol on loopback, and what a
reader does when the owner is gone or slow."""

from __future__ import annotations

import asyncio
import random

import pytest

from cache import metrics
from cache.chunks import ChunkLRU, Member, ZoneChunks, owner_of
from cache.peers import ChunkServer
from cache.reader import ObjectReader
from cache.recent import RecentObjects
from wal.store import MemoryObjectStore, ObjectNotFound

CHUNK = 64 * 1024
OBJECT = random.Random(7).randbytes(5 * CHUNK + 1234)  # five whole chunks and a short last one


class CountingStore(MemoryObjectStore):
    def __init__(self) -> None:
        super().__init__()
        self.gets: list[tuple[str, int, int | None]] = []
        self.gate: asyncio.Event | None = None

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.gets.append((key, start, end))
        if self.gate is not None:
            await self.gate.wait()
        return await super().get(key, start, end)


def counter(c) -> float:
    return c._value.get()


async def store_with(*keys: str) -> CountingStore:
    store = CountingStore()
    for key in keys:
        await store.put(key, OBJECT)
    return store


# -- ownership -------------------------------------------------------------------------------------


def members(*ids: int) -> list[Member]:
    return [Member(i, "127.0.0.1", 1000 + i) for i in ids]


def test_owner_is_the_same_whatever_the_order_of_members():
    keys = [(f"wal/{i:04d}", c * CHUNK) for i in range(50) for c in range(4)]
    assert [owner_of(k, c, members(1, 2, 3, 4)) for k, c in keys] == [owner_of(k, c, members(4, 2, 3, 1)) for k, c in keys]
    assert owner_of("x", 0, []) is None


def test_a_member_leaving_moves_only_its_own_chunks_and_a_joining_one_takes_only_chunks_to_itself():
    keys = [(f"wal/{i:05d}", c * CHUNK) for i in range(500) for c in range(4)]
    before = {k: owner_of(*k, members(1, 2, 3, 4)).node_id for k in keys}
    after_leave = {k: owner_of(*k, members(1, 2, 4)).node_id for k in keys}
    moved = {k for k in keys if before[k] != after_leave[k]}
    assert moved == {k for k in keys if before[k] == 3}
    after_join = {k: owner_of(*k, members(1, 2, 3, 4, 5)).node_id for k in keys}
    assert {k for k in keys if before[k] != after_join[k]} == {k for k in keys if after_join[k] == 5}
    shares = [sum(1 for v in before.values() if v == n) for n in (1, 2, 3, 4)]
    assert all(350 < s < 650 for s in shares), shares  # 2000 chunks over 4: about 500 each


# -- the LRU ---------------------------------------------------------------------------------------


def test_lru_keeps_at_most_its_bytes_and_evicts_the_least_recently_used():
    lru = ChunkLRU(300)
    for i in range(3):
        lru.put(("k", i * 100, 100), bytes([i]) * 100)
    assert lru.size == 300 and len(lru) == 3
    assert lru.get(("k", 0, 100)) == bytes([0]) * 100  # now the most recently used
    lru.put(("k", 300, 100), b"\x03" * 100)
    assert lru.size == 300
    assert lru.get(("k", 100, 100)) is None  # the least recently used went
    assert [lru.get(("k", s, 100)) is not None for s in (0, 200, 300)] == [True, True, True]
    lru.put(("big", 0, 400), b"x" * 301)  # larger than the whole cache: not kept, nothing evicted
    assert lru.get(("big", 0, 400)) is None and lru.size == 300 and len(lru) == 3
    lru.put(("k", 0, 100), b"y" * 50)  # replaced, not counted twice
    assert lru.size == 250


# -- one broker: every chunk its own ---------------------------------------------------------------


def alone(store, recent=None, memory=10 * CHUNK, node_id=0) -> ZoneChunks:
    return ZoneChunks(store, recent or RecentObjects(0), node_id=node_id, members=lambda: [], chunk_bytes=CHUNK, memory_bytes=memory)


async def test_concurrent_misses_of_one_chunk_share_one_get_and_later_reads_none():
    store = await store_with("a")
    chunks = alone(store)
    store.gate = asyncio.Event()
    ranges = [(s, s + 1000) for s in range(CHUNK, 2 * CHUNK - 1000, 7919)]
    tasks = [asyncio.create_task(chunks.get("a", s, e)) for s, e in ranges]
    await asyncio.sleep(0)
    store.gate.set()
    got = await asyncio.gather(*tasks)
    assert [bytes(g) for g in got] == [OBJECT[s:e] for s, e in ranges]
    assert store.gets == [("a", CHUNK, 2 * CHUNK)]
    assert bytes(await chunks.get("a", CHUNK + 5, CHUNK + 6)) == OBJECT[CHUNK + 5 : CHUNK + 6]
    assert len(store.gets) == 1


async def test_a_range_across_chunks_reads_its_aligned_chunks_in_one_get_and_is_a_view_of_it():
    store = await store_with("a")
    chunks = alone(store, memory=16 * CHUNK)  # runs of up to 4 chunks: a quarter of it
    got = await chunks.get("a", CHUNK - 10, 3 * CHUNK + 10)
    assert bytes(got) == OBJECT[CHUNK - 10 : 3 * CHUNK + 10]
    assert store.gets == [("a", 0, 4 * CHUNK)]  # the four chunks it covers, once
    assert isinstance(got, memoryview) and got.obj is chunks.lru.held(("a", 0, CHUNK))[0]  # not joined: no copy
    assert len(chunks.lru) == 4 and chunks.lru.size == 4 * CHUNK
    again = await chunks.get("a", 10, 4 * CHUNK - 10)  # held: no GET, a view of the same bytes
    assert bytes(again) == OBJECT[10 : 4 * CHUNK - 10] and again.obj is got.obj and len(store.gets) == 1
    tail = await chunks.get("a", len(OBJECT) - 100, len(OBJECT) + 5000)  # past the end, as a slice
    assert bytes(tail) == OBJECT[-100:]
    assert store.gets[-1] == ("a", 5 * CHUNK, 6 * CHUNK)


async def test_a_range_across_chunks_of_two_gets_is_joined_exactly_and_each_chunk_read_once():
    store = await store_with("a")
    chunks = alone(store)
    await chunks.get("a", CHUNK + 5, CHUNK + 6)  # chunk 1 alone
    got = await chunks.get("a", 10, 3 * CHUNK + 7)  # chunk 0, then chunk 1 held, then chunks 2-3
    assert bytes(got) == OBJECT[10 : 3 * CHUNK + 7]
    assert store.gets == [("a", CHUNK, 2 * CHUNK), ("a", 0, CHUNK), ("a", 2 * CHUNK, 4 * CHUNK)]


async def test_reading_ahead_gets_the_chunks_ahead_with_the_wanted_ones_and_the_next_read_is_a_view():
    store = await store_with("a")
    chunks = alone(store, memory=16 * CHUNK)  # runs of up to 4 chunks: a quarter of it
    first = await chunks.get("a", 100, CHUNK + 100, ahead=2 * CHUNK)
    assert bytes(first) == OBJECT[100 : CHUNK + 100]
    assert store.gets == [("a", 0, 4 * CHUNK)]  # up to the chunk holding end + ahead
    nxt = await chunks.get("a", CHUNK + 100, 3 * CHUNK + 5, ahead=2 * CHUNK)  # nothing of it missing: nothing read ahead
    assert bytes(nxt) == OBJECT[CHUNK + 100 : 3 * CHUNK + 5] and nxt.obj is first.obj
    assert len(store.gets) == 1
    last = await chunks.get("a", 3 * CHUNK + 5, 5 * CHUNK + 1, ahead=len(OBJECT) - 5 * CHUNK - 1)  # chunk 3 held, 4-5 one GET
    assert bytes(last) == OBJECT[3 * CHUNK + 5 : 5 * CHUNK + 1]
    assert store.gets == [("a", 0, 4 * CHUNK), ("a", 4 * CHUNK, 6 * CHUNK)]


def test_lru_counts_a_get_read_as_several_chunks_until_its_last_chunk_goes():
    lru = ChunkLRU(500)
    run = bytes(range(200)) + bytes(100)
    lru.put_many([("k", 0, 100), ("k", 100, 100), ("k", 200, 100)], run, 0)
    assert lru.size == 300 and bytes(lru.get(("k", 100, 100))) == run[100:200]
    lru.put(("j", 0, 100), b"j" * 100)
    lru.put(("i", 0, 200), b"i" * 200)  # 600 held: the least recently used chunks go until a buffer is freed
    assert lru.size == 300 and len(lru) == 2  # k's three chunks (its buffer whole), then j went
    assert lru.get(("k", 0, 100)) is None and bytes(lru.get(("i", 0, 200))) == b"i" * 200


async def test_chunks_held_stay_within_memory():
    store = await store_with("a")
    chunks = alone(store, memory=2 * CHUNK)
    for c in range(5):
        await chunks.get("a", c * CHUNK, c * CHUNK + 1)
    assert chunks.lru.size == 2 * CHUNK and len(chunks.lru) == 2
    await chunks.get("a", 0, 1)  # evicted: read again
    assert store.gets.count(("a", 0, CHUNK)) == 2


async def test_the_writer_serves_its_recent_objects_without_a_get():
    store = await store_with("a")
    recent = RecentObjects(10 * CHUNK)
    recent.add("a", [OBJECT[:1000], OBJECT[1000:]])
    chunks = alone(store, recent)
    assert bytes(await chunks.get("a", 10, 3 * CHUNK)) == OBJECT[10 : 3 * CHUNK]
    assert store.gets == []


async def test_object_reader_reads_through_the_chunks_and_keeps_its_interface():
    store = await store_with("a", "b")
    reader = ObjectReader(store, RecentObjects(0), chunks=alone(store))
    ranges = [("a", 0, 100), ("a", 2 * CHUNK, 100), ("b", CHUNK + 3, 5)]
    got = await reader.read_many(ranges)
    assert {r: bytes(v) for r, v in got.items()} == {r: OBJECT[r[1] : r[1] + r[2]] for r in ranges}
    assert sorted(store.gets) == [("a", 0, 3 * CHUNK), ("b", CHUNK, 2 * CHUNK)]  # a's two ranges are merged: one span of 3 chunks
    with pytest.raises(ObjectNotFound):
        await reader.read("missing", 0, 10)


# -- a zone of brokers on loopback -----------------------------------------------------------------


class Zone:
    """Brokers sharing one object store, each with its chunk server, all in one event loop."""

    def __init__(self, store, n: int, timeout_s: float = 5.0) -> None:
        self.store = store
        self.n = n
        self.timeout_s = timeout_s
        self.nodes: list[ZoneChunks] = []
        self.servers: list[ChunkServer] = []
        self.live: set[int] = set(range(n))

    def members(self) -> list[Member]:
        return [Member(i, "127.0.0.1", self.servers[i].port) for i in sorted(self.live)]

    async def __aenter__(self) -> Zone:
        for i in range(self.n):
            node = ZoneChunks(self.store, RecentObjects(0), node_id=i, members=self.members, chunk_bytes=CHUNK, memory_bytes=100 * CHUNK, peer_timeout_s=self.timeout_s)
            server = ChunkServer(node.serve, "127.0.0.1", 0, CHUNK)
            await server.start()
            self.nodes.append(node)
            self.servers.append(server)
        return self

    async def __aexit__(self, *exc) -> None:
        for node, server in zip(self.nodes, self.servers, strict=True):
            await node.close()
            await server.stop()


def chunk_owned_by(n: int, live: list[int], key: str = "a", avoid: tuple[int, ...] = ()) -> int:
    """The start of a chunk of `key` owned by `n` among `live`."""
    for c in range(0, len(OBJECT), CHUNK):
        if owner_of(key, c, members(*live)).node_id == n and all(owner_of(key, c, members(*[m for m in live if m != a])).node_id != b for a, b in avoid):
            return c
    raise AssertionError(f"no chunk of {key} owned by {n}")


async def test_every_broker_of_a_zone_reads_a_chunk_through_its_owner_which_gets_it_once():
    store = await store_with("a")
    async with Zone(store, 3) as zone:
        before = {c: counter(c) for c in (metrics.PEER_HIT, metrics.PEER_MISS, metrics.PEER_BYTES_IN, metrics.PEER_BYTES_OUT)}
        results = await asyncio.gather(*(node.get("a", s, s + 5000) for node in zone.nodes for s in range(0, len(OBJECT), 20_000)))
        expected = [OBJECT[s : s + 5000] for _ in zone.nodes for s in range(0, len(OBJECT), 20_000)]
        assert [bytes(r) for r in results] == expected
        touched = sorted({s - s % CHUNK for s in range(0, len(OBJECT), 20_000)})
        assert sorted(store.gets) == [("a", c, c + CHUNK) for c in touched]  # once per chunk for the zone
        for i, node in enumerate(zone.nodes):  # each holds only the chunks it owns
            assert {slot[1] for slot in node.lru._chunks} == {c for c in touched if owner_of("a", c, members(0, 1, 2)).node_id == i}
        # what crossed between brokers: each range's part in a chunk another broker owns, exactly
        parts = [(i, lo, hi) for i in range(3) for s in range(0, len(OBJECT), 20_000) for lo, hi in cut(s, s + 5000)]
        remote = [(lo, hi) for i, lo, hi in parts if owner_of("a", lo - lo % CHUNK, members(0, 1, 2)).node_id != i]
        assert counter(metrics.PEER_HIT) + counter(metrics.PEER_MISS) - before[metrics.PEER_HIT] - before[metrics.PEER_MISS] == len(remote)
        moved = counter(metrics.PEER_BYTES_IN) - before[metrics.PEER_BYTES_IN]
        assert moved == counter(metrics.PEER_BYTES_OUT) - before[metrics.PEER_BYTES_OUT] == sum(hi - lo for lo, hi in remote)


def cut(start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) in pieces at chunk boundaries."""
    return [(max(start, c), min(end, c + CHUNK)) for c in range(start - start % CHUNK, end, CHUNK)]


async def test_an_unreachable_owner_hands_its_chunks_to_the_next_owner_which_reads_each_once():
    store = await store_with("a")
    async with Zone(store, 3, timeout_s=5.0) as zone:
        c = chunk_owned_by(2, [0, 1, 2])
        nxt = owner_of("a", c, members(0, 1)).node_id
        other = 1 - nxt
        await zone.servers[2].stop()  # dead, but still registered (its lease has not expired)
        failures = counter(metrics.PEER_FAILURES.labels("unreachable"))
        direct = counter(metrics.DIRECT_READS)
        for node in (zone.nodes[other], zone.nodes[nxt], zone.nodes[other]):
            assert bytes(await node.get("a", c + 10, c + 20)) == OBJECT[c + 10 : c + 20]
        assert store.gets == [("a", c, c + CHUNK)]  # read once, by the next owner
        assert counter(metrics.DIRECT_READS) == direct
        # the first asker found it gone once and left it out after; the next owner held the chunk by then
        assert counter(metrics.PEER_FAILURES.labels("unreachable")) - failures == 1


async def test_a_slow_owner_is_passed_by_with_a_direct_read_counted():
    store = await store_with("a")
    async with Zone(store, 2, timeout_s=0.2) as zone:
        c = chunk_owned_by(1, [0, 1])
        stuck = asyncio.Event()

        async def never(*args):
            await stuck.wait()

        zone.servers[1]._serve = never
        direct = counter(metrics.DIRECT_READS)
        timeouts = counter(metrics.PEER_FAILURES.labels("timeout"))
        assert bytes(await zone.nodes[0].get("a", c + 1, c + 99)) == OBJECT[c + 1 : c + 99]
        assert store.gets == [("a", c + 1, c + 99)]  # only the bytes wanted, not the chunk
        assert counter(metrics.DIRECT_READS) - direct == 1
        assert counter(metrics.PEER_FAILURES.labels("timeout")) - timeouts == 1
        # left out for peer_retry_s: the next read of its chunk is the asker's own
        assert bytes(await zone.nodes[0].get("a", c, c + 5)) == OBJECT[c : c + 5]
        assert store.gets[-1] == ("a", c, c + CHUNK)
        stuck.set()


async def test_the_owners_store_errors_reach_the_asker_as_they_are():
    store = await store_with("a")
    async with Zone(store, 2) as zone:
        c = chunk_owned_by(1, [0, 1], key="gone")
        direct = counter(metrics.DIRECT_READS)
        with pytest.raises(ObjectNotFound):
            await zone.nodes[0].get("gone", c, c + 10)
        assert store.gets == [("gone", c, c + CHUNK)]  # the owner's GET only
        assert counter(metrics.DIRECT_READS) == direct


async def test_a_cache_too_small_to_keep_a_run_reads_nothing_ahead_and_no_chunk_twice_for_one_read():
    store = await store_with("a")
    chunks = alone(store, memory=CHUNK)  # keeps one chunk: runs of one chunk, nothing ahead
    got = await chunks.get("a", 10, 2 * CHUNK + 10, ahead=2 * CHUNK)
    assert bytes(got) == OBJECT[10 : 2 * CHUNK + 10]
    assert sorted(store.gets) == [("a", c * CHUNK, (c + 1) * CHUNK) for c in range(3)]

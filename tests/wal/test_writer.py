"""The flush pipeline: linger and size flushes, commit order under out-of-order uploads,
backpressure, and failure reporting."""

from __future__ import annotations

import asyncio
import gc
import uuid

import pytest

from wal.format import Chunk, decode_footer
from wal.store import MemoryObjectStore, ObjectExists, ObjectStoreError
from wal.writer import WalUnavailable, WalWriter

TOPIC = uuid.UUID(int=7)


def chunk(partition: int, payload: bytes) -> Chunk:
    return Chunk(TOPIC, partition, payload, batch_count=1, record_count=1, max_timestamp=0)


class GatedStore(MemoryObjectStore):
    """Holds the first put until `release` is set, so a later object finishes uploading first."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.first_started = asyncio.Event()
        self.puts = 0

    async def put(self, key: str, data: bytes) -> None:
        self.puts += 1
        if self.puts == 1:
            self.first_started.set()
            await self.release.wait()
        await super().put(key, data)


class Recorder:
    def __init__(self) -> None:
        self.commits: list[tuple[str, list[bytes], list]] = []

    async def __call__(self, key, encoded, chunks, metas):
        self.commits.append((key, [c.data for c in chunks], list(metas)))
        return [f"{key}#{i}" for i in range(len(chunks))]


async def test_a_chunk_submitted_within_a_deadline_seals_its_object_sooner_than_the_linger():
    store, commits = MemoryObjectStore(), Recorder()
    writer = WalWriter(store, commits, linger_ms=600_000, flush_bytes=1 << 20)
    loop = asyncio.get_running_loop()
    produced = writer.submit(chunk(0, b"records"), meta="records")
    marker = writer.submit(chunk(1, b"marker"), meta="marker", within=0.01)
    assert writer.seal_at(loop.time()) <= loop.time() + 0.01
    # both in one object, sealed by the marker's deadline, not the ten-minute linger
    await asyncio.wait_for(asyncio.gather(produced, marker), 60)
    assert [(datas, metas) for _, datas, metas in commits.commits] == [([b"records", b"marker"], ["records", "marker"])]
    # a later deadline does not put off an earlier one
    first = writer.submit(chunk(0, b"a"), meta="a", within=0.01)
    second = writer.submit(chunk(0, b"b"), meta="b", within=300)
    await asyncio.wait_for(asyncio.gather(first, second), 60)
    assert [metas for _, _, metas in commits.commits[1:]] == [["a", "b"]]
    await writer.close()


async def test_linger_seals_one_object_with_every_chunk_in_submit_order():
    store, commits = MemoryObjectStore(), Recorder()
    writer = WalWriter(store, commits, linger_ms=1, flush_bytes=1 << 20)
    futures = [writer.submit(chunk(p % 3, b"x%d" % p), meta=p) for p in range(9)]
    results = await asyncio.gather(*futures)
    assert len(commits.commits) == 1
    key, datas, metas = commits.commits[0]
    assert datas == [b"x%d" % p for p in range(9)] and metas == list(range(9))
    assert results == [f"{key}#{i}" for i in range(9)]
    stored = await store.get(key)
    sections = decode_footer(stored)
    assert [(s.partition, s.batch_count) for s in sections] == [(0, 3), (1, 3), (2, 3)]
    await writer.close()


async def test_seal_at_is_the_linger_deadline_or_sooner_when_the_object_fills_faster():
    store, commits = MemoryObjectStore(), Recorder()
    writer = WalWriter(store, commits, linger_ms=5_000, flush_bytes=100)
    loop = asyncio.get_running_loop()
    assert writer.seal_at(loop.time()) is None  # nothing open
    before = loop.time()
    first = writer.submit(chunk(0, b"x" * 40))
    opened_by = loop.time()
    # Seen long after it opened, 40 bytes would take past the linger to reach 100: the deadline.
    deadline = writer.seal_at(opened_by + 4.0)
    assert before + 5.0 <= deadline <= opened_by + 5.0
    writer.submit(chunk(1, b"y" * 40))
    assert writer.seal_at(opened_by + 4.0) == deadline  # the same object: its deadline stands
    # 80 bytes 0.1 s after it opened: 100 at this rate 0.125 s after it opened.
    opened = deadline - 5.0
    assert writer.seal_at(opened + 0.1) == pytest.approx(opened + 0.125)
    assert writer.seal_at(opened + 0.2) == pytest.approx(opened + 0.25)
    last = writer.submit(chunk(2, b"z" * 40))  # 120 bytes: sealed by size
    assert writer.seal_at(loop.time()) is None
    await asyncio.gather(first, last)
    assert [datas for _, datas, _ in commits.commits] == [[b"x" * 40, b"y" * 40, b"z" * 40]]
    await writer.close()


async def test_commits_follow_upload_start_order_even_when_a_later_upload_finishes_first():
    store, commits = GatedStore(), Recorder()
    writer = WalWriter(store, commits, linger_ms=10_000, flush_bytes=4, max_inflight_uploads=4)
    first = writer.submit(chunk(0, b"aaaa"))  # reaches flush_bytes: sealed at once
    await store.first_started.wait()
    second = writer.submit(chunk(0, b"bbbb"))
    # the second object uploads while the first is held; its commit must still wait
    while store.puts < 2 or len(store._objects) < 1:
        await asyncio.sleep(0)
    assert commits.commits == [] and not second.done()
    store.release.set()
    await asyncio.gather(first, second)
    assert [datas for _, datas, _ in commits.commits] == [[b"aaaa"], [b"bbbb"]]
    await writer.close()


async def test_room_blocks_while_buffer_is_full_and_frees_after_commit():
    store, commits = GatedStore(), Recorder()
    writer = WalWriter(store, commits, linger_ms=10_000, flush_bytes=8, buffer_bytes=8)
    fut = writer.submit(chunk(0, b"12345678"))
    waiter = asyncio.ensure_future(writer.room())
    await store.first_started.wait()
    assert not waiter.done()
    store.release.set()
    await fut
    await asyncio.wait_for(waiter, 5)
    await writer.close()


async def test_failed_put_fails_its_chunks_and_the_next_object_still_commits():
    class FailingOnce(MemoryObjectStore):
        failed = False

        async def put(self, key, data):
            if not self.failed:
                self.failed = True
                raise ObjectStoreError("injected")
            await super().put(key, data)

    commits = Recorder()
    writer = WalWriter(FailingOnce(), commits, linger_ms=1, upload_timeout_ms=1)
    with pytest.raises(WalUnavailable):
        await writer.submit(chunk(0, b"lost"))
    assert await writer.submit(chunk(0, b"kept")) == f"{commits.commits[0][0]}#0"
    assert [datas for _, datas, _ in commits.commits] == [[b"kept"]]
    await writer.close()


async def test_put_is_retried_before_giving_up():
    class FailingTwice(MemoryObjectStore):
        attempts = 0

        async def put(self, key, data):
            self.attempts += 1
            if self.attempts <= 2:
                raise ObjectStoreError("injected")
            await super().put(key, data)

    store, commits = FailingTwice(), Recorder()
    writer = WalWriter(store, commits, linger_ms=1, upload_timeout_ms=5_000)
    await writer.submit(chunk(0, b"eventually"))
    assert store.attempts == 3 and len(commits.commits) == 1
    await writer.close()


@pytest.mark.parametrize(
    "chunk_size, objects",
    [
        # 3 x 300 = 900 is 100 short of 1000; a fourth chunk would overshoot by 200: seal at 900
        (300, [900, 900, 900, 300]),
        # 700 is 300 short; 1400 would overshoot by 400: every chunk is an object of its own
        (700, [700] * 4),
        # 2 x 450 = 900 is 100 short; 1350 overshoots by 350: seal at 900 (not at 1350, as before)
        (450, [900, 900]),
        # 2 x 550 = 1100 overshoots by 100, less than 550 falls short by 450: seal after it
        (550, [1100, 1100]),
    ],
)
async def test_objects_are_sealed_at_the_chunk_boundary_nearest_flush_bytes(chunk_size, objects):
    store, commits = MemoryObjectStore(), Recorder()
    writer = WalWriter(store, commits, linger_ms=10_000, flush_bytes=1000)
    count = sum(objects) // chunk_size
    futures = [writer.submit(chunk(i % 5, bytes([i]) * chunk_size)) for i in range(count)]
    await writer.flush()
    await asyncio.gather(*futures)
    assert [sum(len(d) for d in datas) for _, datas, _ in commits.commits] == objects
    # every chunk stored once, in submit order across the objects
    assert [d for _, datas, _ in commits.commits for d in datas] == [bytes([i]) * chunk_size for i in range(count)]
    await writer.close()


async def test_large_objects_are_encoded_off_the_event_loop(monkeypatch):
    import threading

    import wal.writer as writer_module

    threads = []
    real_encode = writer_module.encode

    def spy(chunks):
        threads.append(threading.current_thread())
        return real_encode(chunks)

    monkeypatch.setattr(writer_module, "encode", spy)
    store, commits = MemoryObjectStore(), Recorder()
    writer = WalWriter(store, commits, linger_ms=1, flush_bytes=1 << 30)
    await writer.submit(chunk(0, b"s" * 100))  # small: encoded inline
    await writer.submit(chunk(0, b"L" * writer_module.INLINE_ENCODE_BYTES))
    assert threads[0] is threading.main_thread() and threads[1] is not threading.main_thread()
    stored = await store.get(commits.commits[1][0])
    assert stored[decode_footer(stored)[0].start :][: writer_module.INLINE_ENCODE_BYTES] == b"L" * writer_module.INLINE_ENCODE_BYTES
    await writer.close()


async def test_a_failed_flush_leaves_no_reference_cycle_holding_its_chunks():
    """The futures of a failed flush get an exception of their own: the caught one's traceback
    reaches the flush's frame, and through it the chunks and the encoded object, so handing it to
    the futures made a cycle that kept those bytes until a full collection (during an etcd outage,
    hundreds of MiB)."""

    async def failing_commit(key, encoded, chunks, metas):
        raise WalUnavailable("metadata store unreachable")

    gc.collect()
    gc.disable()
    try:
        writer = WalWriter(MemoryObjectStore(), failing_commit, linger_ms=1)
        futures = [writer.submit(Chunk(uuid.uuid4(), 0, b"x" * 1000, 1, 1, 0)) for _ in range(3)]
        await writer.flush()
        assert [str(f.exception()) for f in futures] == ["metadata store unreachable"] * 3
        assert all(f.exception().__traceback__ is None for f in futures)
        del futures
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        leaked = [o for o in gc.garbage if isinstance(o, Chunk)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert leaked == []


class StuckFirstPut(MemoryObjectStore):
    """The first PUT of every key hangs until cancelled (a request stuck on its connection);
    later PUTs of the key store it at once."""

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[str] = []
        self.cancelled: list[str] = []

    async def put(self, key: str, data: bytes) -> None:
        first = key not in self.puts
        self.puts.append(key)
        if first:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(key)
                raise
        await super().put(key, data)


async def test_a_stuck_put_is_raced_by_a_second_and_the_object_commits_once():
    store, commits = StuckFirstPut(), Recorder()
    writer = WalWriter(store, commits, linger_ms=1, upload_timeout_ms=30_000, put_hedge_after_ms=20)
    result = await asyncio.wait_for(writer.submit(chunk(0, b"hedged")), 10)  # not the 30 s upload deadline
    key = commits.commits[0][0]
    assert result == f"{key}#0" and len(commits.commits) == 1
    assert store.puts == [key, key] and store.cancelled == [key] and writer.hedged_puts == 1
    assert decode_footer(await store.get(key))[0].partition == 0
    await writer.close()


class FirstLandsAfterTheHedge(MemoryObjectStore):
    """The first PUT is slow but lands once the hedge has started. The hedge is then refused by
    create-only: at once (`refused_on_cancel=False`), or only when cancelled, ending with
    ObjectExists rather than the cancellation (Python 3.11's `asyncio.wait_for` raises the inner
    outcome when the request completes as it is cancelled, as obstore's can)."""

    def __init__(self, refused_on_cancel: bool = False) -> None:
        super().__init__()
        self.refused_on_cancel = refused_on_cancel
        self.hedge_started = asyncio.Event()
        self.attempts = 0

    async def put(self, key, data):
        self.attempts += 1
        if self.attempts == 1:
            await self.hedge_started.wait()
            await super().put(key, data)
            return
        self.hedge_started.set()
        if not self.refused_on_cancel:
            await asyncio.sleep(0)  # let the first land first
            await super().put(key, data)  # raises ObjectExists
            return
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ObjectExists(key) from None


async def test_the_slow_put_landing_first_wins_and_the_race_is_refused_harmlessly():
    store, commits = FirstLandsAfterTheHedge(), Recorder()
    writer = WalWriter(store, commits, linger_ms=1, put_hedge_after_ms=20)
    assert await asyncio.wait_for(writer.submit(chunk(0, b"once")), 10) == f"{commits.commits[0][0]}#0"
    assert store.attempts == 2 and writer.hedged_puts == 1
    await writer.close()


async def test_hedging_adapts_to_recent_put_times_and_can_be_off():
    writer = WalWriter(MemoryObjectStore(), Recorder(), put_hedge_after_ms=-1)
    assert writer.hedge_after() is None  # no PUT seen yet: nothing to call slow
    writer._put_seconds.extend([0.2] * 19)
    assert writer.hedge_after() is None  # still too few
    writer._put_seconds.extend([0.2] * 179 + [0.3, 0.4])  # 200 PUTs, the slowest two 0.3 and 0.4 s
    assert writer.hedge_after() == pytest.approx(0.6)  # twice the 99th percentile (the second slowest, 0.3 s)
    writer._put_seconds.clear()
    writer._put_seconds.extend([0.001] * 200)
    assert writer.hedge_after() == pytest.approx(0.25)  # never below the floor
    assert WalWriter(MemoryObjectStore(), Recorder(), put_hedge_after_ms=0).hedge_after() is None
    assert WalWriter(MemoryObjectStore(), Recorder(), put_hedge_after_ms=250).hedge_after() == 0.25


async def test_an_object_past_its_commit_deadline_is_left_uncommitted_for_the_sweeper():
    """A flush whose commit would start after the deadline (here: held behind an earlier commit)
    fails its chunks with a retriable error and never commits, so the orphan sweeper may delete
    the object safely; the flushes around it are unaffected."""
    store = MemoryObjectStore()
    first_in, release_first = asyncio.Event(), asyncio.Event()
    committed: list[list[bytes]] = []

    async def commit(key, encoded, chunks, metas):
        committed.append([c.data for c in chunks])
        if len(committed) == 1:
            first_in.set()
            await release_first.wait()
        return [key] * len(chunks)

    writer = WalWriter(store, commit, linger_ms=1, commit_deadline_s=0.05)
    first = writer.submit(chunk(0, b"first"))
    await first_in.wait()
    late = writer.submit(chunk(0, b"late"))  # uploaded now, its commit held behind the first's
    while len([k async for k in store.list("wal/")]) < 2:
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.1)  # the deadline is elapsed time itself: let it pass
    release_first.set()
    assert await first
    with pytest.raises(WalUnavailable, match="commit deadline"):
        await late
    after = writer.submit(chunk(0, b"after"))  # a fresh object commits as usual
    assert await after
    assert committed == [[b"first"], [b"after"]]
    stored = [k async for k in store.list("wal/")]
    assert len(stored) == 3  # the late object stays, unreferenced: the sweeper's to delete
    await writer.close()


async def test_a_losing_put_that_ends_in_an_error_after_its_cancellation_is_not_left_unretrieved():
    """The first PUT lands; the hedge's, cancelled then, ends with ObjectExists. Nobody awaits
    the loser, so its error must be retrieved, or asyncio logs "Task exception was never
    retrieved" at error level."""
    unretrieved = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    try:
        store, commits = FirstLandsAfterTheHedge(refused_on_cancel=True), Recorder()
        writer = WalWriter(store, commits, linger_ms=1, put_hedge_after_ms=20)
        assert await asyncio.wait_for(writer.submit(chunk(0, b"once")), 10) == f"{commits.commits[0][0]}#0"
        assert store.attempts == 2 and writer.hedged_puts == 1
        await writer.close()
        for _ in range(3):  # the cancelled hedge finishes, and is collected
            await asyncio.sleep(0)
        gc.collect()
        assert [c.get("message") for c in unretrieved] == []
    finally:
        loop.set_exception_handler(None)

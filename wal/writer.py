"""The flush pipeline: buffers produce chunks of many partitions, seals them into one WAL object
on linger or size, uploads objects in parallel, and commits them in upload-start order.

Ordering: chunks are sealed in submit order and object N's commit waits for object N-1's commit
to finish, so one producer's pipelined requests get offsets in the order they were sent.
Durability: a chunk's future resolves only after its object is stored AND its commit is done.
Orphans: the orphan sweeper deletes unreferenced objects older than its grace period, after
fencing them off in the metadata store (a commit that finds the fence fails, retriably). As a
second guard, an object whose PUT began more than `commit_deadline_s` ago is never committed (its
chunks fail with a retriable error): the node sets the deadline to half that grace.
Backpressure: `room()` waits while buffered plus uploading bytes exceed `buffer_bytes`; callers
(the connection reader) await it before accepting more produce requests.
Object size: a chunk (one partition's records of one produce request, up to a megabyte) is never
split, so an object is sealed at whichever chunk boundary lands nearest `flush_bytes`; objects
then stay within half a chunk of the configured size instead of overshooting by a whole one.
The loop never encodes a large object itself: checksumming megabytes runs in a thread (crc32c
releases the GIL). An object is never joined: it is stored from its parts (ObjectStore.put_parts).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .format import Chunk, EncodedObject, encode
from .store import ObjectExists, ObjectStore

log = logging.getLogger("neve.wal.writer")

# Smaller objects are encoded on the loop: below this a thread hop costs more than the work.
INLINE_ENCODE_BYTES = 64 * 1024

# Adaptive PUT hedging (put_hedge_after_ms=-1): a PUT slower than twice the 99th percentile of
# the last PUT_SAMPLES PUTs, and at least HEDGE_FLOOR_S, gets a second PUT racing it. Only
# outliers are raced: a store that is merely busy is not sent more work.
PUT_SAMPLES = 200
HEDGE_MIN_SAMPLES = 20
HEDGE_FLOOR_S = 0.25

# commit(object_key, encoded, chunks, metas) -> one result per chunk, in order; `metas` are the
# opaque values given to submit() (the broker passes each chunk's producer fields through here).
CommitFn = Callable[[str, EncodedObject, Sequence[Chunk], Sequence[Any]], Awaitable[Sequence[Any]]]


class WalUnavailable(Exception):
    """The object could not be stored (or committed) in time; retriable for the client."""


class Abandoned(WalUnavailable):
    """The chunk's request was answered (timed out) or its connection closed before the commit of
    its object began: it is left out of that commit, never sequenced later (WalWriter.abandon)."""


class WalWriter:
    def __init__(
        self,
        store: ObjectStore,
        commit: CommitFn,
        *,
        node_id: int = 0,
        linger_ms: int = 200,
        flush_bytes: int = 4 * 1024 * 1024,
        max_inflight_uploads: int = 4,
        buffer_bytes: int = 64 * 1024 * 1024,
        upload_timeout_ms: int = 10_000,
        put_hedge_after_ms: int = -1,
        commit_deadline_s: float | None = None,
        on_object_stored: Callable[[str, Sequence[bytes]], None] | None = None,
        metrics: Any = None,
    ) -> None:
        self.store = store
        self._commit = commit
        self.node_id = node_id
        self.linger = linger_ms / 1000
        self.flush_bytes = flush_bytes
        self.buffer_bytes = buffer_bytes
        self.upload_timeout = upload_timeout_ms / 1000
        self.put_hedge_after_ms = put_hedge_after_ms  # -1 adaptive, 0 never, > 0 fixed
        self.commit_deadline = commit_deadline_s  # None: none (unit tests; the node always sets one)
        self._put_seconds: deque[float] = deque(maxlen=PUT_SAMPLES)
        self.hedged_puts = 0
        self._uploads = asyncio.Semaphore(max_inflight_uploads)
        self._on_object_stored = on_object_stored
        self._metrics = metrics
        self._chunks: list[Chunk] = []
        self._metas: list[Any] = []
        self._futures: list[asyncio.Future] = []
        self._pending_bytes = 0
        self._held_bytes = 0  # buffered + uploading + committing
        self._room = asyncio.Event()
        self._room.set()
        self._timer: asyncio.TimerHandle | None = None
        self._opened = 0.0  # loop time the object being filled got its first chunk
        self._last_commit: asyncio.Future | None = None
        self._committing: set[asyncio.Future] = set()  # chunks whose object's commit has begun
        self._flushes: set[asyncio.Task] = set()
        self._closed = False
        # One thread of its own checksums every large object: 2-3% less broker CPU on the sink
        # than asyncio.to_thread's shared pool (A/B/A/B, bench/RESULTS.md 2026-11-24).
        self._encoder: ThreadPoolExecutor | None = None

    # -- producing side ---------------------------------------------------------------------------

    def has_room(self) -> bool:
        """Whether the buffer has room now (checked before awaiting `room`, which costs a coroutine)."""
        return self._room.is_set()

    async def room(self) -> None:
        """Wait until the buffer has room (backpressure for produce)."""
        while not self._room.is_set():
            await self._room.wait()

    def submit(self, chunk: Chunk, meta: Any = None, within: float | None = None) -> asyncio.Future:
        """Buffer a chunk; the future resolves with its commit result. Never blocks, so callers
        keep their submit order. `within` (seconds): the object holding it is sealed at most this
        long from now, sooner than the linger (a transaction's markers, which its producer waits
        for: a short wait of their own still gathers the markers of many transactions in one
        object)."""
        if self._closed:
            raise WalUnavailable("writer is closed")
        fut = asyncio.get_running_loop().create_future()
        size = len(chunk.data)
        if self._chunks and self._pending_bytes + size - self.flush_bytes > self.flush_bytes - self._pending_bytes:
            self._flush()  # adding this chunk would overshoot by more than sealing now falls short
        self._chunks.append(chunk)
        self._metas.append(meta)
        self._futures.append(fut)
        self._pending_bytes += size
        self._hold(size)
        if self._pending_bytes >= self.flush_bytes:
            self._flush()
        elif self._timer is None:
            self._opened = asyncio.get_running_loop().time()
            self._timer = asyncio.get_running_loop().call_later(self.linger if within is None else min(within, self.linger), self._flush)
        elif within is not None and self._timer.when() > (due := asyncio.get_running_loop().time() + within):
            self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(due, self._flush)
        return fut

    def abandon(self, fut: asyncio.Future) -> bool:
        """Whether the chunk of `fut` (a future `submit` returned) is settled for its caller's
        answer: done, or now abandoned (failed with Abandoned, and left out of its object's
        commit). False while its object's commit is in flight: then its outcome is the commit's,
        and the caller waits for it. Whatever answer a request gets, its chunks are never
        sequenced after it."""
        if fut.done():
            return True
        if fut in self._committing:
            return False
        fut.set_exception(Abandoned("abandoned before its object's commit began"))
        fut.exception()  # retrieved: nobody awaits it
        return True

    def seal_at(self, now: float) -> float | None:
        """When (event loop time) the object being filled is expected to be sealed, seen at loop
        time `now`: at its linger deadline, or sooner if the bytes it has gathered since it was
        opened, at the same rate, reach `flush_bytes` first. None while no object is open (the
        next chunk opens one, sealed at most a linger later)."""
        if self._timer is None:
            return None
        deadline = self._timer.when()
        opened = self._opened
        if self._pending_bytes <= 0 or now <= opened:
            return deadline
        return min(deadline, opened + (now - opened) * self.flush_bytes / self._pending_bytes)

    def _hold(self, size: int) -> None:
        self._held_bytes += size
        if self._held_bytes >= self.buffer_bytes:
            self._room.clear()

    def _release(self, size: int) -> None:
        self._held_bytes -= size
        if self._held_bytes < self.buffer_bytes:
            self._room.set()

    # -- flushing -----------------------------------------------------------------------------

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._chunks:
            return
        chunks, metas, futures, size = self._chunks, self._metas, self._futures, self._pending_bytes
        self._chunks, self._metas, self._futures, self._pending_bytes = [], [], [], 0
        previous = self._last_commit
        done = asyncio.get_running_loop().create_future()
        self._last_commit = done
        task = asyncio.create_task(self._upload_and_commit(chunks, metas, futures, size, previous, done))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    def new_object_key(self) -> str:
        # Time first so listings (and the orphan sweeper's grace period) follow age.
        return f"wal/{time.time_ns() // 1_000_000:013d}-{self.node_id}-{uuid.uuid4().hex}.wal"

    async def _upload_and_commit(self, chunks, metas, futures, size, previous, done) -> None:
        key = self.new_object_key()
        try:
            async with self._uploads:
                encoded = encode(chunks) if size < INLINE_ENCODE_BYTES else await self._encode_in_thread(chunks)
                put_started = time.monotonic()
                await self._put(key, encoded)
            if self._on_object_stored is not None:
                self._on_object_stored(key, encoded.parts)
            if previous is not None:
                await asyncio.shield(previous)
            commit_started = time.monotonic()
            if self.commit_deadline is not None and commit_started - put_started > self.commit_deadline:
                raise WalUnavailable(
                    f"{key} was uploaded {commit_started - put_started:.1f}s ago, past the {self.commit_deadline:g}s commit deadline: left to the orphan sweeper"
                )
            # From here (no await since the check) a chunk is committed or abandoned, never both:
            # one whose request was answered already is left out, the others can no longer be.
            live = [i for i, fut in enumerate(futures) if not fut.done()]
            if not live:
                raise WalUnavailable(f"every chunk of {key} was abandoned before its commit: left to the orphan sweeper")
            if len(live) < len(futures):
                log.info("wal_chunks_abandoned", extra={"object_key": key, "abandoned": len(futures) - len(live), "chunks": len(futures)})
                chunks, metas, futures = [chunks[i] for i in live], [metas[i] for i in live], [futures[i] for i in live]
                encoded = dataclasses.replace(encoded, chunk_starts=[encoded.chunk_starts[i] for i in live])
            committing = self._committing
            committing.update(futures)
            try:
                results = await self._commit(key, encoded, chunks, metas)
            finally:
                committing.difference_update(futures)
            for fut, result in zip(futures, results, strict=True):
                if not fut.done():
                    fut.set_result(result)
            if self._metrics is not None:
                self._metrics.object_committed(encoded.size, len(chunks), time.monotonic() - commit_started)
        except Exception as e:
            log.error("wal_flush_failed", extra={"object_key": key, "error": repr(e), "chunks": len(chunks)})
            # A fresh exception, never raised, so it has no traceback: handing the caught one to
            # the futures would tie them to this frame (and `encoded`'s bytes) in a reference cycle.
            failure = WalUnavailable(str(e) if isinstance(e, WalUnavailable) else repr(e))
            for fut in futures:
                if not fut.done():
                    fut.set_exception(failure)
                    fut.exception()  # mark retrieved: a caller that timed out no longer awaits it
        finally:
            self._release(size)
            done.set_result(None)

    async def _encode_in_thread(self, chunks: list[Chunk]) -> EncodedObject:
        if self._encoder is None:
            self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wal-encode")
        return await asyncio.get_running_loop().run_in_executor(self._encoder, encode, chunks)

    async def _put(self, key: str, encoded: EncodedObject) -> None:
        """Store the object, retrying with backoff until the upload deadline. The deadline is
        shorter than clients' request timeout, so a produce is answered (with a retriable error)
        before the client gives up, and an object that missed it is never committed later."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.upload_timeout
        delay = 0.05
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - loop.time()
            attempt_started = loop.time()
            try:
                await asyncio.wait_for(self._put_hedged(key, encoded.parts), max(remaining, 0.001))
                self._put_seconds.append(loop.time() - attempt_started)
                if self._metrics is not None:
                    self._metrics.object_put(encoded.size, loop.time() - started)
                return
            except ObjectExists:
                # An earlier attempt's PUT landed but its answer was lost: the bytes are ours.
                return
            except Exception as e:
                if loop.time() + delay >= deadline:
                    raise WalUnavailable(f"put {key} failed after {attempt} attempts: {e!r}") from e
                log.warning("wal_put_retry", extra={"object_key": key, "attempt": attempt, "error": repr(e)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def hedge_after(self) -> float | None:
        """Seconds a PUT may take before a second one races it; None: never."""
        if self.put_hedge_after_ms > 0:
            return self.put_hedge_after_ms / 1000
        if self.put_hedge_after_ms == 0 or len(self._put_seconds) < HEDGE_MIN_SAMPLES:
            return None  # off, or too few PUTs seen to know what slow is
        recent = sorted(self._put_seconds)
        return max(HEDGE_FLOOR_S, 2 * recent[int(len(recent) * 0.99)])

    async def _put_hedged(self, key: str, parts: Sequence[bytes]) -> None:
        """One PUT of the object; if it has not answered within `hedge_after()`, a second PUT of
        the same bytes races it (a request stuck on one connection or one slow server thread then
        no longer holds up every later commit of this broker). The key is this object's alone
        and PUTs only create, so whichever lands first stores it and the other, if it gets that
        far, is refused with ObjectExists: both mean stored."""
        after = self.hedge_after()
        if after is None:
            return await self.store.put_parts(key, parts)
        tasks = [asyncio.ensure_future(self.store.put_parts(key, parts))]
        try:
            done, _ = await asyncio.wait(tasks, timeout=after)
            if not done:
                self.hedged_puts += 1
                if self._metrics is not None:
                    self._metrics.object_put_hedged()
                log.info("wal_put_hedged", extra={"object_key": key, "after_s": round(after, 3)})
                tasks.append(asyncio.ensure_future(self.store.put_parts(key, parts)))
            pending = set(tasks)
            error: BaseException | None = None
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                outcomes = [task.exception() for task in done]  # every one retrieved
                if any(e is None or isinstance(e, ObjectExists) for e in outcomes):
                    return
                error = outcomes[0]
            assert error is not None
            raise error
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()
                    # Nobody awaits the loser; a PUT that completes as it is cancelled ends with
                    # its own outcome (Python 3.11's wait_for), often ObjectExists: retrieve it,
                    # or asyncio logs it as an error.
                    task.add_done_callback(_retrieve)

    async def flush(self) -> None:
        """Seal what is buffered and wait for every flush under way to finish."""
        self._flush()
        while self._flushes:
            await asyncio.gather(*list(self._flushes), return_exceptions=True)

    async def close(self) -> None:
        await self.flush()
        self._closed = True
        if self._encoder is not None:
            self._encoder.shutdown(wait=False)


def _retrieve(task: asyncio.Future) -> None:
    """Mark a task's outcome as seen (an abandoned hedged PUT)."""
    if not task.cancelled():
        task.exception()

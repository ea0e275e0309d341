"""A client connection's byte stream: Kafka's size-prefixed request frames in, response bytes out.

asyncio's StreamReader copied every byte three times on its way to a frame (the event loop's
bytes per read, the reader's growing bytearray, the frame sliced out of it), and regrew that
bytearray under large produce requests: about 14% of the broker's CPU when it received 64 KiB
records (perf, bench/RESULTS.md). Here the socket is read straight into a fixed buffer, and a
frame that does not fit is read straight into 1 MiB chunks taken as its bytes arrive (so a length
prefix alone reserves at most one chunk; a frame under half a chunk gets a buffer of its own size
instead, so no frame holds more than twice its bytes). A frame that fits the fixed buffer is copied
once, into the `bytes` the request decoder reads; a larger one is handed over as a read-only view
of its chunk when it fits one (a produce request of librdkafka's default 1 MB batches does), else
joined. kio reads read-only buffers only, and copies every field out of them.

Chunks come from a small free list shared by the process's connections and go back to it once
their frame is decoded (`recycle`): a fresh `bytearray` per large request was zero-filled and
faulted in page by page only to be overwritten by the socket read, 11% of the broker's CPU at
1 KiB records (perf, bench/RESULTS.md).

Reading pauses while the connection has more than `MAX_QUEUED_BYTES` of frames it has not taken
(the connection stops taking them while the WAL buffer is full), as the StreamReader's limit did.

It also pauses for `read_pause_s` after a read that emptied the socket and brought only Produce
requests (whole ones, and perhaps the start of the next). librdkafka sends one ProduceRequest per
partition, so a producer writing to thousands of partitions sends a stream of small requests, and
the broker woke up for every one or two of them: at 10,000 partitions 2,150 wake-ups a second,
each a context switch, an epoll round and a pass through the event loop, for requests whose
answers wait for the WAL linger (200 ms) anyway. Pausing a few milliseconds lets the next requests
gather in the socket and be read in one wake-up. Any other request (a Fetch, Metadata, a group's
heartbeat) is read at once.

A pause never runs past the sealing of the WAL object being filled (`seal_at`: the writer's
linger deadline, or sooner when the object fills at a rate that reaches its size first): it ends
a quarter of a pause before it, so the requests it held back still join that object, and within
that margin of the seal reading does not pause at all. A request held back past a linger seal
would wait a whole linger more for the next object.

Before a SASL listener's connection has authenticated, its stream is gated (`Gate`): it reads
into a buffer of PRE_AUTH_BUFFER_BYTES, takes a frame only once its api key has arrived and is one
of those allowed before authentication (anything else ends the stream), refuses a frame over the
gate's limit (Kafka's `sasl.server.max.receive.size`), and reads a frame larger than its buffer by
appending what arrives, so that a length prefix alone takes no memory and a frame's bytes take
only as much as has arrived. The gate opens (the full buffer, limit and chunks) once the stream's
`authenticated` says so, checked before every read.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

_SIZE = struct.Struct(">i")
READ_BUFFER_BYTES = 64 * 1024  # frames that fit are sliced out of it; larger ones are read in chunks
PRE_AUTH_BUFFER_BYTES = 4 * 1024  # a gated stream's read buffer (before authentication)
CHUNK_BYTES = 1024 * 1024
MAX_QUEUED_BYTES = 2 * 1024 * 1024
MIN_FREE_BYTES = 16 * 1024  # compact the read buffer when less than this is free at its end
SPARE_CHUNKS = 8  # chunks kept for reuse, process-wide (8 MiB)

_spare_chunks: list[bytearray] = []


def _take_chunk() -> bytearray:
    return _spare_chunks.pop() if _spare_chunks else bytearray(CHUNK_BYTES)


def _give_chunk(chunk: bytearray) -> None:
    if len(chunk) == CHUNK_BYTES and len(_spare_chunks) < SPARE_CHUNKS:
        _spare_chunks.append(chunk)


class FrameSizeError(Exception):
    """A frame's length prefix is below the smallest request or above the limit (`limit`)."""

    def __init__(self, size: int, limit: int = 0) -> None:
        super().__init__(f"frame length {size}")
        self.size = size
        self.limit = limit


class FrameRefused(Exception):
    """A gated stream's frame is a request not allowed before authentication (its api key)."""

    def __init__(self, api_key: int) -> None:
        super().__init__(f"api key {api_key} before authentication")
        self.api_key = api_key


@dataclass(frozen=True, slots=True)
class Gate:
    """What a stream takes before its connection has authenticated: frames of at most
    `max_frame_bytes` of the `api_keys`."""

    max_frame_bytes: int
    api_keys: frozenset[int]


class FrameStream(asyncio.BufferedProtocol):
    def __init__(
        self,
        max_frame_bytes: int,
        on_connected: Callable[[FrameStream], None],
        read_pause_s: float = 0.0,
        seal_at: Callable[[float], float | None] | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._gate = gate
        # whether the connection has authenticated (set by it; a gated stream opens once it has)
        self.authenticated: Callable[[], bool] = lambda: False
        self._on_connected = on_connected
        self._read_pause_s = read_pause_s
        self._seal_at = seal_at  # (loop time now) -> when the open WAL object is sealed, None if none is open
        self._offered = 0  # bytes the last get_buffer offered the read buffer's reader
        self._between_reads = False  # paused for read_pause_s (its timer resumes reading)
        self.transport: asyncio.Transport | None = None
        self.peer = None
        self._buf = bytearray(READ_BUFFER_BYTES if gate is None else PRE_AUTH_BUFFER_BYTES)
        self._start = self._end = 0  # unparsed bytes are _buf[_start:_end]
        self._gated_size = 0  # a gated stream's frame larger than _buf being read (0: none): its size,
        self._gated = bytearray()  # and its bytes so far
        self._big_size = 0  # a frame larger than _buf being read (0: none): its size,
        self._big_chunks: list[bytearray] = []  # the chunks it is read into (see _parse),
        self._big_filled = 0  # and how much of it has arrived
        self._chunk_filled = 0  # of the last chunk
        self._frames: collections.deque[tuple[bytes | memoryview, int]] = collections.deque()
        self._queued_bytes = 0
        self._reading_paused = False
        self._frame_waiter: asyncio.Future | None = None
        self._end_error: BaseException | None = None  # raised once the queued frames are taken
        self._writing_paused = False
        self._drain_waiter: asyncio.Future | None = None
        self._lost = False

    # -- asyncio's side --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._on_connected(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._gate is not None:
            if self._gated_size:  # a frame begun before authentication: read to its end, no further
                return memoryview(self._buf)[: min(len(self._buf), self._gated_size - len(self._gated))]
            if self.authenticated():
                self._open_gate()
        if self._big_size:
            chunk = self._big_chunks[-1]
            if self._chunk_filled == len(chunk):
                chunk = _take_chunk()
                self._big_chunks.append(chunk)
                self._chunk_filled = 0
            # never past the frame's end: the next frame's bytes belong in the read buffer
            end = min(len(chunk), self._chunk_filled + self._big_size - self._big_filled)
            return memoryview(chunk)[self._chunk_filled : end]
        if len(self._buf) - self._end < MIN_FREE_BYTES:
            self._compact()
        self._offered = len(self._buf) - self._end
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._gated_size:
            self._gated += memoryview(self._buf)[:nbytes]
            if len(self._gated) == self._gated_size:
                frame, size = bytes(self._gated), self._gated_size
                self._gated_size, self._gated = 0, bytearray()
                self._deliver(frame, size)
            return
        if self._big_size:
            self._big_filled += nbytes
            self._chunk_filled += nbytes
            if self._big_filled == self._big_size:
                chunks, size = self._big_chunks, self._big_size
                self._big_size, self._big_chunks = 0, []
                if len(chunks) == 1:  # decoded from its chunk, which `recycle` then takes back
                    self._deliver(memoryview(chunks[0])[:size].toreadonly(), len(chunks[0]))
                else:
                    with memoryview(chunks[-1]) as last:
                        frame = b"".join([*chunks[:-1], last[: self._chunk_filled]])
                    for chunk in chunks:
                        _give_chunk(chunk)
                    self._deliver(frame, size)
            return
        self._end += nbytes
        produce_only = self._parse()
        # The socket is empty (the read took less than it was offered), every request it brought
        # is a Produce request, and so is the one it began, if any (as far as it shows): wait a
        # little before reading again.
        if produce_only and self._read_pause_s and nbytes < self._offered and not self._big_size and self._begun_produce():
            self._pause_between_reads()

    def eof_received(self) -> bool:
        self._finish(asyncio.IncompleteReadError(b"", None))
        # half-closed: the requests already read are still answered, then the connection closes it
        # (TLS has no half-close: asyncio closes such a transport itself, and warns if asked not to)
        return self.transport is None or self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._finish(exc if exc is not None else asyncio.IncompleteReadError(b"", None))
        self._wake_drain(exc or ConnectionResetError("connection lost"))

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_drain(None)

    # -- the connection's side -------------------------------------------------------------------

    async def read_frame(self) -> bytes | memoryview:
        """The next request frame (without its length prefix). Raises FrameSizeError for a bad
        length prefix, asyncio.IncompleteReadError or ConnectionError when the client is gone.
        Give the frame to `recycle` once it is decoded."""
        while not self._frames:
            if self._end_error is not None:
                raise self._end_error
            self._frame_waiter = asyncio.get_running_loop().create_future()
            try:
                await self._frame_waiter
            finally:
                self._frame_waiter = None
        frame, held = self._frames.popleft()
        self._queued_bytes -= held
        if self._reading_paused and self._queued_bytes < MAX_QUEUED_BYTES and self._end_error is None:
            self._reading_paused = False
            if not self._between_reads:  # else the pause's timer resumes
                self.transport.resume_reading()
        return frame

    @staticmethod
    def recycle(frame: bytes | memoryview) -> None:
        """The frame has been decoded and nothing refers to its bytes any more: a frame read into
        a chunk gives the chunk back for the next large frame (its view is released, so a stray
        use of it raises instead of reading another request's bytes)."""
        if isinstance(frame, memoryview):
            chunk = frame.obj
            frame.release()
            _give_chunk(chunk)

    def stop_reading(self) -> None:
        """Read nothing more of the socket (the connection is about to close)."""
        self._pause_reading()

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def writelines(self, frames: list[bytes]) -> None:
        """Frames, or the pieces of frames, in one write (one system call where the transport can)."""
        self.transport.writelines(frames)

    def write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size()

    async def drain(self) -> None:
        """Wait until the transport has sent enough of what it holds (below its low-water mark)."""
        if self._lost:
            raise ConnectionResetError("connection lost")
        if not self._writing_paused:
            return
        self._drain_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._drain_waiter
        finally:
            self._drain_waiter = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- inside ----------------------------------------------------------------------------------

    def _parse(self) -> bool:
        """Take the whole frames out of the read buffer; True if there were some and all of
        them were Produce requests (api key 0)."""
        buf = self._buf
        frames, others = 0, False
        gate = self._gate
        while self._end - self._start >= 4:
            (size,) = _SIZE.unpack_from(buf, self._start)
            limit = self.max_frame_bytes if gate is None else gate.max_frame_bytes
            if size < 8 or size > limit:
                return self._end_with(FrameSizeError(size, limit))
            body = self._start + 4
            if gate is not None:
                if self._end - body < 2:  # taken only once its api key shows it is allowed
                    break
                api_key = int.from_bytes(buf[body : body + 2], "big", signed=True)
                if api_key not in gate.api_keys:
                    return self._end_with(FrameRefused(api_key))
                if 4 + size > len(buf):  # appended to as its bytes arrive
                    with memoryview(buf) as view:
                        self._gated = bytearray(view[body : self._end])
                    self._gated_size = size
                    self._start = self._end = 0
                    break
            if self._end - body >= size:
                frames += 1
                others = others or buf[body] != 0 or buf[body + 1] != 0
                with memoryview(buf) as view:
                    frame = bytes(view[body : body + size])
                self._start = body + size
                self._deliver(frame, size)
                continue
            if 4 + size > len(buf):  # cannot fit: read the rest of it in chunks, the first holding what arrived
                arrived = self._end - body  # less than the read buffer, so less than a chunk
                # A frame of half a chunk or more is read into pooled chunks; a smaller one into
                # a buffer of its own size, so no frame holds more than twice its bytes.
                head = _take_chunk() if size >= CHUNK_BYTES // 2 else bytearray(size)
                with memoryview(buf) as view:
                    head[:arrived] = view[body : self._end]
                self._big_size, self._big_chunks = size, [head]
                self._big_filled = self._chunk_filled = arrived
                self._start = self._end = 0
            break
        if self._start == self._end:
            self._start = self._end = 0
        return frames > 0 and not others

    def _end_with(self, error: BaseException) -> bool:
        """End the stream after the frames already taken: nothing more of it is read."""
        self._finish(error)
        self._pause_reading()
        self._start = self._end = 0
        return False

    def _open_gate(self) -> None:
        """The connection has authenticated: the full read buffer (holding the bytes not yet
        parsed), the full frame limit, large frames in chunks."""
        self._gate = None
        pending = self._buf[self._start : self._end]
        self._buf = bytearray(READ_BUFFER_BYTES)
        self._buf[: len(pending)] = pending
        self._start, self._end = 0, len(pending)

    def _begun_produce(self) -> bool:
        """The read buffer holds no part of a frame, or the start of one that is not known to
        be anything but a Produce request (its api key has not arrived, or is 0)."""
        begun = self._end - self._start
        return begun < 6 or self._buf[self._start + 4] == 0 and self._buf[self._start + 5] == 0

    def _compact(self) -> None:
        """Move the unparsed bytes (part of one frame that fits the buffer) to its start."""
        pending = bytes(self._buf[self._start : self._end])
        self._buf[: len(pending)] = pending
        self._start, self._end = 0, len(pending)

    def _deliver(self, frame: bytes | memoryview, held: int) -> None:
        """Queue a frame for the connection; `held` is the memory it holds (a chunk's whole size
        for a view of one), which is what the queue limit bounds."""
        self._frames.append((frame, held))
        self._queued_bytes += held
        if self._queued_bytes >= MAX_QUEUED_BYTES:
            self._pause_reading()
        self._wake_reader()

    def _finish(self, error: BaseException) -> None:
        if self._end_error is None:
            self._end_error = error
        self._wake_reader()

    def _pause_reading(self) -> None:
        if not self._reading_paused and not self._lost and self.transport is not None:
            self._reading_paused = True
            if not self._between_reads:
                self.transport.pause_reading()

    def _pause_between_reads(self) -> None:
        if self._between_reads or self._reading_paused or self._lost or self._end_error is not None:
            return
        loop = asyncio.get_running_loop()
        pause = self._read_pause_s
        if self._seal_at is not None and (seal := self._seal_at(now := loop.time())) is not None:
            # Read what gathered a quarter of a pause before the seal, in time to join the object.
            pause = min(pause, seal - pause / 4 - now)
            if pause <= 0:  # the seal is that near: read on
                return
        self._between_reads = True
        self.transport.pause_reading()
        loop.call_later(pause, self._end_pause_between_reads)

    def _end_pause_between_reads(self) -> None:
        self._between_reads = False
        if not self._reading_paused and not self._lost and not self.transport.is_closing():
            self.transport.resume_reading()

    def _wake_reader(self) -> None:
        waiter = self._frame_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_drain(self, exc: BaseException | None) -> None:
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)

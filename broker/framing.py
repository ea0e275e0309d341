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
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
from collections.abc import Callable

_SIZE = struct.Struct(">i")
READ_BUFFER_BYTES = 64 * 1024  # frames that fit are sliced out of it; larger ones are read in chunks
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
    """A frame's length prefix is below the smallest request or above the configured limit."""

    def __init__(self, size: int) -> None:
        super().__init__(f"frame length {size}")
        self.size = size


class FrameStream(asyncio.BufferedProtocol):
    def __init__(self, max_frame_bytes: int, on_connected: Callable[[FrameStream], None]) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._on_connected = on_connected
        self.transport: asyncio.Transport | None = None
        self.peer = None
        self._buf = bytearray(READ_BUFFER_BYTES)
        self._start = self._end = 0  # unparsed bytes are _buf[_start:_end]
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
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
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
        self._parse()

    def eof_received(self) -> bool:
        self._finish(asyncio.IncompleteReadError(b"", None))
        return True  # half-closed: the requests already read are still answered, then the connection closes it

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

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def writelines(self, frames: list[bytes]) -> None:
        """Several frames in one write (one system call where the transport can)."""
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

    def _parse(self) -> None:
        buf = self._buf
        while self._end - self._start >= 4:
            (size,) = _SIZE.unpack_from(buf, self._start)
            if size < 8 or size > self.max_frame_bytes:
                self._finish(FrameSizeError(size))
                self._pause_reading()
                self._start = self._end = 0
                return
            body = self._start + 4
            if self._end - body >= size:
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
            self.transport.pause_reading()

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

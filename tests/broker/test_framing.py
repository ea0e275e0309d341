"""broker/framing.py over a real loopback socket: frames come out byte for byte whatever the reads'
boundaries, large frames included; a bad length ends the stream after the frames before it;
reading pauses while too many bytes of frames wait."""

from __future__ import annotations

import asyncio
import os
import struct

import pytest

from broker import framing
from broker.framing import FrameSizeError, FrameStream


class Server:
    def __init__(self, max_frame: int = 100 * 1024 * 1024) -> None:
        self.max_frame = max_frame
        self.streams: asyncio.Queue[FrameStream] = asyncio.Queue()

    async def __aenter__(self):
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: FrameStream(self.max_frame, self.streams.put_nowait), "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        self.stream = await asyncio.wait_for(self.streams.get(), 5)
        return self

    async def __aexit__(self, *exc) -> None:
        self.writer.close()
        self.stream.abort()  # the server's end: closing the server leaves accepted connections open
        self.server.close()
        await self.server.wait_closed()
        await self.writer.wait_closed()


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


async def read(stream: FrameStream, n: int) -> list[bytes]:
    return [await asyncio.wait_for(stream.read_frame(), 10) for _ in range(n)]


@pytest.mark.parametrize("piece", [1, 3, 4096, 1 << 20])
async def test_frames_come_out_exactly_whatever_the_read_boundaries(piece):
    buffer, chunk = framing.READ_BUFFER_BYTES, framing.CHUNK_BYTES
    sizes = [8, 100, 4096, buffer - 4, buffer - 3, buffer + 1, chunk, chunk + 1, 3 * chunk + 17, 9]
    if piece == 1:
        sizes = [s for s in sizes if s < 70_000]  # one byte per write: keep it short
    bodies = [os.urandom(n) for n in sizes]
    wire = b"".join(framed(b) for b in bodies)
    async with Server() as s:
        for i in range(0, len(wire), piece):
            s.writer.write(wire[i : i + piece])
            await s.writer.drain()
        got = await read(s.stream, len(bodies))  # every frame has arrived before any is looked at
    # Frames that fit the read buffer are copied out of it; a larger one that fits one chunk is a
    # view of that chunk; larger still, its chunks joined. kio decodes read-only buffers only.
    kinds = ["bytes" if n <= buffer - 4 or n > chunk else "view" for n in sizes]
    assert ["view" if isinstance(g, memoryview) and g.readonly else "bytes" if type(g) is bytes else type(g) for g in got] == kinds
    assert [bytes(g) for g in got] == bodies


async def test_a_bad_length_ends_the_stream_after_the_frames_before_it():
    async with Server(max_frame=1000) as s:
        s.writer.write(framed(b"a" * 8) + framed(b"b" * 1000) + struct.pack(">i", 1001) + b"c" * 50)
        assert await read(s.stream, 2) == [b"a" * 8, b"b" * 1000]
        with pytest.raises(FrameSizeError) as e:
            await asyncio.wait_for(s.stream.read_frame(), 10)
        assert e.value.size == 1001
    async with Server() as s:
        s.writer.write(struct.pack(">i", 7))
        with pytest.raises(FrameSizeError) as e:
            await asyncio.wait_for(s.stream.read_frame(), 10)
        assert e.value.size == 7


async def test_end_of_stream_mid_frame_is_an_incomplete_read():
    async with Server() as s:
        s.writer.write(framed(b"x" * 20) + struct.pack(">i", 500_000) + b"y" * 1000)
        await s.writer.drain()
        s.writer.write_eof()
        assert await read(s.stream, 1) == [b"x" * 20]
        with pytest.raises(asyncio.IncompleteReadError):
            await asyncio.wait_for(s.stream.read_frame(), 10)


async def test_reading_pauses_while_frames_wait_and_resumes_when_taken():
    body = os.urandom(512 * 1024)
    count = 2 * framing.MAX_QUEUED_BYTES // len(body) + 4  # twice what may wait
    async with Server() as s:
        s.writer.write(framed(body) * count)
        deadline = asyncio.get_running_loop().time() + 10
        while s.stream.transport.is_reading():  # the connection takes nothing meanwhile
            assert asyncio.get_running_loop().time() < deadline, "reading never paused"
            await asyncio.sleep(0.01)
        assert await read(s.stream, count) == [body] * count  # taking them resumes reading
        assert s.stream.transport.is_reading()


async def test_a_half_closed_connection_still_gets_its_answers():
    """A client that shuts its sending side after its requests still reads the replies (as
    asyncio's streams kept it open)."""
    async with Server() as s:
        s.writer.write(framed(b"q" * 10))
        s.writer.write_eof()
        assert await read(s.stream, 1) == [b"q" * 10]
        with pytest.raises(asyncio.IncompleteReadError):
            await asyncio.wait_for(s.stream.read_frame(), 10)
        s.stream.write(framed(b"answer"))
        assert await asyncio.wait_for(s.reader.readexactly(10), 10) == framed(b"answer")

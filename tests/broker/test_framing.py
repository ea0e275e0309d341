"""broker/framing.py over a real loopback socket: frames come out byte for byte whatever the reads'
boundaries, large frames included; a bad length ends the stream after the frames before it;
reading pauses while too many bytes of frames wait; the chunks of large frames are reused once
their requests are decoded, and nothing decoded still refers to them."""

from __future__ import annotations

import asyncio
import datetime
import io
import os
import struct

import pytest
from kio.schema.produce.v9 import request as produce_v9
from kio.serial import entity_writer
from kio.static.primitive import i16, i32

from broker import framing
from broker.codec import decode_request
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


async def test_a_recycled_chunk_takes_the_next_large_frame_and_its_old_view_is_dead():
    framing._spare_chunks.clear()
    chunk_bytes = framing.CHUNK_BYTES
    first, second, small = os.urandom(chunk_bytes - 100), os.urandom(chunk_bytes // 2), os.urandom(chunk_bytes // 2 - 1)
    async with Server() as s:
        s.writer.write(framed(first))
        (a,) = await read(s.stream, 1)
        assert bytes(a) == first and len(a.obj) == chunk_bytes
        chunk = a.obj
        s.stream.recycle(a)
        assert framing._spare_chunks == [chunk]
        with pytest.raises(ValueError):  # released: a stray use fails instead of reading another request
            bytes(a)
        s.writer.write(framed(second))
        (b,) = await read(s.stream, 1)
        assert b.obj is chunk and bytes(b) == second and framing._spare_chunks == []
        s.stream.recycle(b)
        # under half a chunk: a buffer of its own size, never pooled
        s.writer.write(framed(small))
        (c,) = await read(s.stream, 1)
        assert len(c.obj) == len(small) and bytes(c) == small
        s.stream.recycle(c)
        assert framing._spare_chunks == [chunk]
        # over one chunk: joined into bytes, and every chunk it was read into goes back
        large = os.urandom(3 * chunk_bytes + 17)
        s.writer.write(framed(large))
        (d,) = await read(s.stream, 1)
        assert type(d) is bytes and d == large
        assert len(framing._spare_chunks) == 4 and chunk in framing._spare_chunks
        s.stream.recycle(d)  # bytes: nothing to give back
        assert len(framing._spare_chunks) == 4
    framing._spare_chunks.clear()


def produce_request_frame(records: bytes, correlation_id: int) -> bytes:
    header = produce_v9.RequestHeader(request_api_key=i16(0), request_api_version=i16(9), correlation_id=i32(correlation_id), client_id="framing-test")
    partition = produce_v9.PartitionProduceData(index=i32(0), records=records)
    body = produce_v9.ProduceRequest(transactional_id=None, acks=i16(-1), timeout=datetime.timedelta(seconds=30), topic_data=(produce_v9.TopicProduceData(name="t", partition_data=(partition,)),))
    out = io.BytesIO()
    entity_writer(produce_v9.RequestHeader)(out, header)
    entity_writer(produce_v9.ProduceRequest)(out, body)
    return out.getvalue()


async def test_a_decoded_request_keeps_its_bytes_after_its_chunk_takes_the_next_request():
    """Recycling rests on the decoder copying every field out of the frame (kio does)."""
    framing._spare_chunks.clear()
    records = [os.urandom(framing.CHUNK_BYTES - 200) for _ in range(2)]
    async with Server() as s:
        s.writer.write(framed(produce_request_frame(records[0], 1)))
        (frame,) = await read(s.stream, 1)
        chunk = frame.obj
        header, body = decode_request(frame, 0, 9)
        s.stream.recycle(frame)
        s.writer.write(framed(produce_request_frame(records[1], 2)))
        (frame,) = await read(s.stream, 1)
        assert frame.obj is chunk  # the second request overwrote the first's bytes
        _, second = decode_request(frame, 0, 9)
        s.stream.recycle(frame)
    assert header.correlation_id == 1 and body.topic_data[0].name == "t"
    assert body.topic_data[0].partition_data[0].records == records[0]
    assert second.topic_data[0].partition_data[0].records == records[1]
    framing._spare_chunks.clear()

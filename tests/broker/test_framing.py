"""broker/framing.py over a real loopback socket: frames come out byte for byte whatever the reads'
boundaries, large frames included; a bad length ends the stream after the frames before it;
reading pauses while too many bytes of frames wait, and for a moment after a read that brought
only Produce requests and emptied the socket; the chunks of large frames are reused once their
requests are decoded, and nothing decoded still refers to them."""

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
    def __init__(self, max_frame: int = 100 * 1024 * 1024, read_pause_s: float = 0.0, seal_at=None) -> None:
        self.max_frame = max_frame
        self.read_pause_s = read_pause_s
        self.seal_at = seal_at
        self.streams: asyncio.Queue[FrameStream] = asyncio.Queue()

    async def __aenter__(self):
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: FrameStream(self.max_frame, self.streams.put_nowait, self.read_pause_s, self.seal_at), "127.0.0.1", 0)
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


def request(api_key: int, size: int = 100) -> bytes:
    """A frame body that starts like a request of `api_key` (the stream looks no further)."""
    return struct.pack(">hhi", api_key, 9, 7) + os.urandom(size - 8)


@pytest.mark.parametrize("seal_at", [None, lambda now: None], ids=["no-wal", "no-object-open"])
async def test_reading_pauses_after_produce_requests_that_empty_the_socket(seal_at):
    pause = 0.2
    async with Server(read_pause_s=pause, seal_at=seal_at) as s:
        loop = asyncio.get_running_loop()
        first = [request(0), request(0, 5000)]
        written = loop.time()
        s.writer.write(b"".join(framed(b) for b in first))
        assert await read(s.stream, 2) == first
        assert not s.stream.transport.is_reading()  # paused: the next requests wait in the socket
        second = [request(0, 300), request(0, 40)]
        for body in second:
            s.writer.write(framed(body))
            await s.writer.drain()
        assert await read(s.stream, 2) == second
        assert loop.time() - written >= pause - 0.01  # not read before the pause was over


async def test_a_pause_ends_a_quarter_pause_before_the_wal_object_is_sealed():
    pause, seal_in = 4.0, 2.0  # the pause alone would end at 4 s; the object is sealed at 2 s
    seal = []
    async with Server(read_pause_s=pause, seal_at=lambda now: seal[0]) as s:
        loop = asyncio.get_running_loop()
        written = loop.time()
        seal.append(written + seal_in)
        first = [request(0), request(0, 5000)]
        s.writer.write(b"".join(framed(b) for b in first))
        assert await read(s.stream, 2) == first
        assert not s.stream.transport.is_reading()
        second = request(0, 300)
        s.writer.write(framed(second))
        await s.writer.drain()
        assert await read(s.stream, 1) == [second]
        waited = loop.time() - written
        assert seal_in - pause / 4 - 0.01 <= waited < pause - 0.5  # at 1.5 s: before the seal, not at the pause's end


async def test_reading_does_not_pause_within_a_quarter_pause_of_the_seal():
    async with Server(read_pause_s=30.0, seal_at=lambda now: now + 7.0) as s:
        first, second = request(0), request(0, 40)
        s.writer.write(framed(first))
        assert await read(s.stream, 1) == [first]
        assert s.stream.transport.is_reading()
        s.writer.write(framed(second))
        assert await read(s.stream, 1) == [second]  # within read()'s 10 s: no 30 s pause


@pytest.mark.parametrize(
    "bodies, read_pause_s",
    [
        ([request(0), request(3)], 0.5),  # a Metadata request among them
        ([request(18)], 0.5),  # no Produce request at all
        ([request(0)], 0.0),  # pausing turned off
    ],
)
async def test_reading_goes_on_after_other_requests_or_with_no_pause(bodies, read_pause_s):
    async with Server(read_pause_s=read_pause_s) as s:
        s.writer.write(b"".join(framed(b) for b in bodies))
        assert await read(s.stream, len(bodies)) == bodies
        assert s.stream.transport.is_reading()


async def test_reading_goes_on_while_another_request_is_half_read():
    async with Server(read_pause_s=30.0) as s:  # longer than read()'s timeout
        whole, half_read = request(0, 200), request(3, 30_000)
        wire = framed(whole) + framed(half_read)
        s.writer.write(wire[:300])
        await s.writer.drain()
        assert await read(s.stream, 1) == [whole]
        assert s.stream.transport.is_reading()
        s.writer.write(wire[300:])
        assert await read(s.stream, 1) == [half_read]  # not held back by a pause


async def test_a_half_read_produce_request_is_read_on_after_the_pause():
    pause = 0.2
    async with Server(read_pause_s=pause) as s:
        loop = asyncio.get_running_loop()
        whole, half_read = request(0, 200), request(0, 30_000)
        wire = framed(whole) + framed(half_read)
        written = loop.time()
        s.writer.write(wire[:300])
        await s.writer.drain()
        assert await read(s.stream, 1) == [whole]
        assert not s.stream.transport.is_reading()
        s.writer.write(wire[300:])
        assert await read(s.stream, 1) == [half_read]
        assert loop.time() - written >= pause - 0.01


async def test_the_pause_after_produce_requests_and_the_queue_limit_both_end():
    body = request(0, 30_000)
    count = 2 * framing.MAX_QUEUED_BYTES // len(body) + 4  # twice what may wait
    async with Server(read_pause_s=0.05) as s:
        s.writer.write(framed(body) * count)
        deadline = asyncio.get_running_loop().time() + 10
        while s.stream.transport.is_reading():  # the connection takes nothing meanwhile
            assert asyncio.get_running_loop().time() < deadline, "reading never paused"
            await asyncio.sleep(0.01)
        assert await read(s.stream, count) == [body] * count
        s.writer.write(framed(body))
        assert await read(s.stream, 1) == [body]
        while not s.stream.transport.is_reading():  # the last pause's timer resumes reading
            assert asyncio.get_running_loop().time() < deadline, "reading never resumed"
            await asyncio.sleep(0.01)


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


# -- before authentication (framing.Gate) ------------------------------------------------------------

GATE = framing.Gate(600, frozenset((18, 17, 36)))


class GatedServer(Server):
    """A server whose streams are gated as a SASL listener's are before authentication; `opened`
    says whether the connection counts as authenticated."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = False

    async def __aenter__(self):
        loop = asyncio.get_running_loop()

        def made() -> FrameStream:
            stream = FrameStream(self.max_frame, self.streams.put_nowait, gate=GATE)
            stream.authenticated = lambda: self.opened
            return stream

        self.server = await loop.create_server(made, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        self.stream = await asyncio.wait_for(self.streams.get(), 5)
        return self


async def test_before_authentication_only_the_sasl_requests_are_taken_and_the_rest_ends_the_stream():
    async with GatedServer() as s:
        s.writer.write(b"".join(framed(request(k, n)) for k, n in ((18, 20), (17, 30), (3, 20), (18, 20))))
        assert [f[:2] for f in await read(s.stream, 2)] == [b"\x00\x12", b"\x00\x11"]
        with pytest.raises(framing.FrameRefused) as e:
            await asyncio.wait_for(s.stream.read_frame(), 10)
        assert e.value.api_key == 3
        assert not s.stream.transport.is_reading()  # nothing more of it is read


async def test_before_authentication_a_frame_over_the_gates_limit_ends_the_stream_unread():
    async with GatedServer() as s:
        s.writer.write(framed(request(36, 600)) + struct.pack(">i", 601))
        assert [len(f) for f in await read(s.stream, 1)] == [600]
        with pytest.raises(FrameSizeError) as e:
            await asyncio.wait_for(s.stream.read_frame(), 10)
        assert (e.value.size, e.value.limit) == (601, 600)


@pytest.mark.parametrize("piece", [1, 5, 7, 4096])
async def test_a_gated_frame_larger_than_its_buffer_comes_out_whole_whatever_the_read_boundaries(piece, monkeypatch):
    monkeypatch.setattr(framing, "PRE_AUTH_BUFFER_BYTES", 64)  # frames of 600 bytes are then larger than the buffer
    bodies = [b"\x00\x24" + os.urandom(n - 2) for n in (60, 598, 61, 600, 8)]
    wire = b"".join(framed(b) for b in bodies)
    async with GatedServer() as s:
        for i in range(0, len(wire), piece):
            s.writer.write(wire[i : i + piece])
            await s.writer.drain()
        assert await read(s.stream, len(bodies)) == bodies


async def test_once_authenticated_the_stream_takes_any_request_of_any_size():
    async with GatedServer() as s:
        s.writer.write(framed(request(36, 100)))
        assert len((await read(s.stream, 1))[0]) == 100
        s.opened = True  # the SaslAuthenticate succeeded
        big = b"\x00\x00" + os.urandom(framing.CHUNK_BYTES + 5)
        s.writer.write(framed(request(3, 50)) + framed(big))
        got = await read(s.stream, 2)
        assert got[0][:2] == b"\x00\x03" and bytes(got[1]) == big

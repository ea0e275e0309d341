"""The chunk protocol's framing on loopback: requests round-trip, pipelined requests are matched
by id, and a malformed or oversized frame closes that connection (counted) while the server goes
on serving others; a client given a broken answer fails its requests and reconnects."""

from __future__ import annotations

import asyncio
import struct

import pytest

from cache import metrics
from cache.peerauth import client_handshake, server_handshake
from cache.peers import LENGTH, REQUEST, REQUEST_MAX_BYTES, VERSION, ChunkServer, FrameError, PeerClient, PeerError, decode_request, encode_request
from wal.store import ObjectNotFound, ObjectStoreError

CHUNK = 1 << 20
OBJECT = bytes(range(256)) * (CHUNK // 256)


async def serve(key: str, chunk_start: int, chunk_size: int, lo: int, hi: int):
    if key == "missing":
        raise ObjectNotFound(key)
    if key == "broken":
        raise RuntimeError("a bug")
    if key.startswith("slow"):
        await asyncio.sleep(float(key[4:]))
    return memoryview(OBJECT)[lo:hi], key == "held"


@pytest.fixture
async def server():
    s = ChunkServer(serve, "127.0.0.1", 0, CHUNK)
    await s.start()
    yield s
    await s.stop()


def test_requests_round_trip_and_bad_ones_are_refused():
    frame = encode_request(7, "wal/ä", 3 * CHUNK, CHUNK, 10, 20)
    assert LENGTH.unpack(frame[:4])[0] == len(frame) - 4
    assert decode_request(frame[4:], CHUNK) == (7, "wal/ä", 3 * CHUNK, CHUNK, 10, 20)
    good = REQUEST.pack(VERSION, 1, 0, CHUNK, 0, 10, 1) + b"k"
    for bad in (
        good[:10],  # shorter than the header
        REQUEST.pack(VERSION + 1, 1, 0, CHUNK, 0, 10, 1) + b"k",  # another version
        REQUEST.pack(VERSION, 1, 0, CHUNK, 0, 10, 5) + b"k",  # key length beyond the frame
        REQUEST.pack(VERSION, 1, 0, CHUNK, 10, 10, 1) + b"k",  # empty range
        REQUEST.pack(VERSION, 1, 0, CHUNK, 0, CHUNK + 1, 1) + b"k",  # past the chunk
        REQUEST.pack(VERSION, 1, 0, 2 * CHUNK, 0, 10, 1) + b"k",  # a chunk larger than served
        REQUEST.pack(VERSION, 1, 5, CHUNK, 0, 10, 1) + b"k",  # not aligned
        REQUEST.pack(VERSION, 1, 0, CHUNK, 0, 10, 1) + b"\xff",  # not utf-8
    ):
        with pytest.raises(FrameError):
            decode_request(bad, CHUNK)
    with pytest.raises(ValueError):
        encode_request(1, "k" * 2000, 0, CHUNK, 0, 1)


async def test_pipelined_requests_are_answered_each_with_its_own_bytes(server):
    client = PeerClient("127.0.0.1", server.port, CHUNK)
    try:
        spans = [(i * 1000, i * 1000 + 500 + i) for i in range(50)]
        got = await asyncio.gather(*(client.get("slow0.01" if i % 3 else "held", 0, CHUNK, lo, hi, 5) for i, (lo, hi) in enumerate(spans)))
        assert [(bytes(d), h) for d, h in got] == [(OBJECT[lo:hi], i % 3 == 0) for i, (lo, hi) in enumerate(spans)]
        with pytest.raises(ObjectNotFound):
            await client.get("missing", 0, CHUNK, 0, 1, 5)
        with pytest.raises(ObjectStoreError, match="a bug"):
            await client.get("broken", 0, CHUNK, 0, 1, 5)
        assert bytes((await client.get("k", 0, CHUNK, 5, 9, 5))[0]) == OBJECT[5:9]  # the connection lived on
    finally:
        await client.close()


async def test_a_request_past_its_deadline_fails_and_its_late_answer_is_dropped(server):
    from cache.peers import PeerTimeout

    client = PeerClient("127.0.0.1", server.port, CHUNK)
    try:
        with pytest.raises(PeerTimeout):
            await client.get("slow0.5", 0, CHUNK, 0, 10, 0.05)
        await asyncio.sleep(0.6)  # its answer arrives to no one
        assert bytes((await client.get("k", 0, CHUNK, 0, 10, 5))[0]) == OBJECT[:10]
    finally:
        await client.close()


async def raw_exchange(port: int, data: bytes) -> bytes:
    """Send `data` on a fresh connection (past the handshake) and end it; everything the server
    sends until it closes (or 5 s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await client_handshake(reader, writer, None)
    writer.write(data)
    writer.write_eof()
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(LENGTH.pack(REQUEST_MAX_BYTES + 1) + b"x" * 100, id="oversized"),
        pytest.param(LENGTH.pack(3) + b"abc", id="short"),
        pytest.param(LENGTH.pack(REQUEST.size + 1) + REQUEST.pack(99, 1, 0, CHUNK, 0, 10, 1) + b"k", id="version"),
        pytest.param(LENGTH.pack(50) + b"x" * 10, id="truncated"),
        pytest.param(b"\x00\x00", id="truncated-length"),
    ],
)
async def test_a_bad_frame_closes_its_connection_and_the_server_serves_on(server, frame):
    bad = metrics.BAD_FRAMES._value.get()
    # a good request after it (for the truncated ones, its bytes are taken as the rest of the bad frame)
    answered = await raw_exchange(server.port, frame + encode_request(1, "k", 0, CHUNK, 0, 10))
    assert answered == b""  # closed without answering the request after the bad frame
    assert metrics.BAD_FRAMES._value.get() - bad == 1
    client = PeerClient("127.0.0.1", server.port, CHUNK)
    try:
        assert bytes((await client.get("k", 0, CHUNK, 0, 10, 5))[0]) == OBJECT[:10]
    finally:
        await client.close()


async def test_a_truncated_frame_at_the_end_of_the_stream_is_a_bad_frame(server):
    bad = metrics.BAD_FRAMES._value.get()
    assert await raw_exchange(server.port, LENGTH.pack(50) + b"x" * 10) == b""
    assert await raw_exchange(server.port, b"\x00\x00") == b""
    assert metrics.BAD_FRAMES._value.get() - bad == 2


async def fake_server(answer: bytes):
    """A 'peer' that answers every request with `answer`, then keeps the connection open."""

    async def handle(reader, writer):
        try:
            await server_handshake(reader, writer, None)
            while await reader.read(65536):
                writer.write(answer)
                await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(LENGTH.pack(CHUNK + 100), id="oversized"),
        pytest.param(LENGTH.pack(3) + b"abc", id="short"),
        pytest.param(LENGTH.pack(6 + 20) + struct.pack(">IBB", 1, 0, 0) + b"x" * 20, id="more-bytes-than-asked"),
    ],
)
async def test_a_broken_answer_fails_the_request_and_the_client_reconnects(answer):
    fake = await fake_server(answer)
    port = fake.sockets[0].getsockname()[1]
    client = PeerClient("127.0.0.1", port, CHUNK)
    try:
        with pytest.raises(PeerError):
            await client.get("k", 0, CHUNK, 0, 10, 5)
        fake.close()
        await fake.wait_closed()
        good = ChunkServer(serve, "127.0.0.1", port, CHUNK)
        await good.start()
        try:
            assert bytes((await client.get("k", 0, CHUNK, 0, 10, 5))[0]) == OBJECT[:10]
        finally:
            await good.stop()
    finally:
        await client.close()
        fake.close()


async def test_an_unreachable_peer_fails_at_once():
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    client = PeerClient("127.0.0.1", port, CHUNK)
    try:
        with pytest.raises(PeerError):
            await client.get("k", 0, CHUNK, 0, 10, 5)
    finally:
        await client.close()

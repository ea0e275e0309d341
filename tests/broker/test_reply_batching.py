"""A connection answers in request order, and responses that are ready together leave in one write
(a WAL commit answers every produce request it holds at once: one system call instead of one per
response). Driven through Connection._send_replies with a stream that records its writes."""

from __future__ import annotations

import asyncio
import struct
from types import SimpleNamespace

from broker.codec import encode_response
from broker.config import FaultsConfig
from broker.connection import API_VERSIONS, Connection
from broker.handlers.api18_api_versions import unsupported_version_response


class RecordingStream:
    peer = ("127.0.0.1", 9)

    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []

    def writelines(self, frames: list[bytes]) -> None:
        self.writes.append(list(frames))

    def write(self, data: bytes) -> None:
        self.writes.append([data])

    def write_buffer_size(self) -> int:
        return 0

    async def drain(self) -> None:
        return None


def connection() -> tuple[Connection, RecordingStream]:
    settings = SimpleNamespace(max_inflight_requests=64, max_inflight_produce_requests=64, produce_timeout_ms=1000)
    stream = RecordingStream()
    return Connection(SimpleNamespace(settings=settings, faults=FaultsConfig()), stream), stream  # type: ignore[arg-type]


def answered() -> asyncio.Future:
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(unsupported_version_response())
    return fut


def frame(correlation_id: int) -> bytes:
    (piece,) = encode_response(API_VERSIONS, 0, correlation_id, unsupported_version_response())  # small: one piece
    return bytes(piece)


def correlation_ids(frames: list[bytes]) -> list[int]:
    return [struct.unpack_from(">i", f, 4)[0] for f in frames]


async def test_responses_ready_together_leave_in_one_write_in_request_order():
    conn, stream = connection()
    for cid in (7, 8, 9, 10):
        await conn._replies.put((answered(), API_VERSIONS, 0, cid))
    await conn._replies.put(None)
    await conn._send_replies()
    assert stream.writes == [[frame(7), frame(8), frame(9), frame(10)]]


async def test_a_response_still_pending_sends_what_is_ready_before_waiting():
    conn, stream = connection()
    later = asyncio.get_running_loop().create_future()
    for item in ((answered(), 1), (answered(), 2), (later, 3), (answered(), 4)):
        await conn._replies.put((item[0], API_VERSIONS, 0, item[1]))
    sender = asyncio.create_task(conn._send_replies())
    for _ in range(100):  # the first two go out while the third is pending
        if stream.writes:
            break
        await asyncio.sleep(0)  # one loop iteration, for the sender to run
    assert [correlation_ids(w) for w in stream.writes] == [[1, 2]]
    later.set_result(unsupported_version_response())
    await conn._replies.put(None)
    await asyncio.wait_for(sender, 5)
    assert [correlation_ids(w) for w in stream.writes] == [[1, 2], [3, 4]]

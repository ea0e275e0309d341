"""The Produce handler answers from its WAL appends' callbacks (no task per request): with the
offsets once the appends are committed, REQUEST_TIMED_OUT when they are not done within the
request's timeout, the retriable KAFKA_STORAGE_ERROR when one failed, nothing for acks=0; and its
chunks are in the WAL buffer, in order, before it returns."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from types import SimpleNamespace

from kio.schema.errors import ErrorCode
from kio.schema.produce.v9 import request as produce_v9

from broker.codec import OnePartitionProduce, response_module
from broker.config import BrokerSettings
from broker.handlers.api00_produce import produce
from broker.waiting import SLOT_S
from metadata.model import AppendResult, TopicInfo
from tests.batches import make_batch

TOPIC = TopicInfo("orders", uuid.uuid4(), 4)


class Wal:
    """Takes chunks and hands out the futures a test completes."""

    def __init__(self) -> None:
        self.submitted: list[tuple[int, bytes, asyncio.Future]] = []

    def submit(self, chunk, summary) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.submitted.append((chunk.partition, chunk.data, fut))
        return fut


def context(wal: Wal):
    services = SimpleNamespace(
        metadata=SimpleNamespace(topics=lambda: {TOPIC.name: TOPIC}),
        settings=BrokerSettings(max_message_bytes=1 << 20, produce_timeout_ms=30_000),  # the others as a broker's
        wal=wal,
    )
    return SimpleNamespace(services=services, response=response_module(0, 9), api_version=9, peer=None)


def request(partitions: list[int], acks: int = -1, timeout_s: float = 30.0):
    batch = make_batch([(b"k", b"v", [], 1_700_000_000_000)])
    data = tuple(produce_v9.PartitionProduceData(index=p, records=batch) for p in partitions)
    return produce_v9.ProduceRequest(
        transactional_id=None, acks=acks, timeout=datetime.timedelta(seconds=timeout_s), topic_data=(produce_v9.TopicProduceData(name=TOPIC.name, partition_data=data),)
    )


async def test_answers_with_the_offsets_once_the_append_is_committed():
    wal = Wal()
    answer = produce(context(wal), request([2]))
    assert [p for p, _, _ in wal.submitted] == [2]  # submitted before it returned
    await asyncio.sleep(0)
    assert not answer.done()
    wal.submitted[0][2].set_result(AppendResult(0, 41, 7))
    assert await asyncio.wait_for(answer, 1) == OnePartitionProduce(TOPIC.name, 2, ErrorCode.none, 41, 7, None)


async def test_several_partitions_are_answered_when_the_last_is_committed():
    wal = Wal()
    answer = produce(context(wal), request([0, 3, 9]))  # 9: no such partition
    assert [p for p, _, _ in wal.submitted] == [0, 3]
    wal.submitted[1][2].set_result(AppendResult(0, 5, 0))
    await asyncio.sleep(0)
    assert not answer.done()
    wal.submitted[0][2].set_exception(OSError("the object store is down"))
    response = await asyncio.wait_for(answer, 1)
    parts = response.responses[0].partition_responses
    assert [(p.index, p.error_code, p.base_offset) for p in parts] == [(0, ErrorCode.kafka_storage_error, -1), (3, ErrorCode.none, 5), (9, ErrorCode.unknown_topic_or_partition, -1)]


async def test_an_append_not_done_within_the_request_timeout_is_answered_timed_out():
    wal = Wal()
    loop = asyncio.get_running_loop()
    started = loop.time()
    answer = produce(context(wal), request([1], timeout_s=0.05))
    got = await asyncio.wait_for(answer, 5)
    assert loop.time() - started >= 0.05 - 0.01
    assert loop.time() - started <= 0.05 + SLOT_S + 1
    assert (got.error_code, got.base_offset) == (ErrorCode.request_timed_out, -1)
    wal.submitted[0][2].set_result(AppendResult(0, 3, 0))  # committed later: nothing more happens
    await asyncio.sleep(0)


async def test_acks_0_submits_and_answers_nothing():
    wal = Wal()
    answer = produce(context(wal), request([0, 1], acks=0))
    assert answer.done() and answer.result() is None
    assert [p for p, _, _ in wal.submitted] == [0, 1]


async def test_a_request_with_nothing_to_store_is_answered_at_once():
    answer = produce(context(Wal()), request([7]))
    assert answer.done()
    assert (answer.result().index, answer.result().error_code) == (7, ErrorCode.unknown_topic_or_partition)

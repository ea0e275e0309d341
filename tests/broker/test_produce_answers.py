"""The Produce handler answers from its WAL appends' callbacks (no task per request): with the
offsets once the appends are committed, REQUEST_TIMED_OUT when they are not done within the
request's timeout, the retriable KAFKA_STORAGE_ERROR when one failed, nothing for acks=0; and its
chunks are in the WAL buffer, in order, before it returns."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from types import SimpleNamespace

import pytest
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9 import request as produce_v9
from kio.serial import entity_reader

from broker.appender import commit_fn
from broker.codec import OnePartitionProduce, encode_response, response_module
from broker.config import BrokerConfig, FaultsConfig
from broker.handlers.api00_produce import produce
from broker.waiting import SLOT_S
from metadata.embedded import EmbeddedMetadataStore
from metadata.model import AppendResult, TopicInfo
from tests.batches import make_batch
from wal.store import MemoryObjectStore
from wal.writer import Abandoned, WalWriter

TOPIC = TopicInfo("orders", uuid.uuid4(), 4)


class Wal:
    """Takes chunks and hands out the futures a test completes."""

    def __init__(self) -> None:
        self.submitted: list[tuple[int, bytes, asyncio.Future]] = []

        self.committing: set[asyncio.Future] = set()  # as WalWriter's: the commit of these has begun

    def submit(self, chunk, summary) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.submitted.append((chunk.partition, chunk.data, fut))
        return fut

    def abandon(self, fut: asyncio.Future) -> bool:
        if fut.done():
            return True
        if fut in self.committing:
            return False
        fut.set_exception(Abandoned("abandoned"))
        return True


def context(wal: Wal):
    services = SimpleNamespace(
        metadata=SimpleNamespace(topics=lambda: {TOPIC.name: TOPIC}),
        settings=BrokerConfig(max_message_bytes=1 << 20, produce_timeout_ms=30_000),  # the others as a broker's
        wal=wal,
        authorizer=None,  # no ACLs
        faults=FaultsConfig(),  # none
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
    fut = wal.submitted[0][2]  # abandoned: its object's commit leaves it out (WalWriter.abandon)
    assert fut.done() and isinstance(fut.exception(), Abandoned)


async def test_an_append_whose_commit_is_in_flight_at_the_timeout_is_answered_its_outcome():
    """Issue 42 finding 1: an answer of REQUEST_TIMED_OUT must not be followed by the append's
    commit. One whose commit has begun cannot be abandoned: the answer waits for its outcome."""
    wal = Wal()
    answer = produce(context(wal), request([1], timeout_s=0.05))
    wal.committing.add(wal.submitted[0][2])
    await asyncio.sleep(0.05 + SLOT_S + 0.2)  # past the request's timeout
    assert not answer.done()
    wal.submitted[0][2].set_result(AppendResult(0, 3, 0))
    assert await asyncio.wait_for(answer, 5) == OnePartitionProduce(TOPIC.name, 1, ErrorCode.none, 3, 0, None)


async def test_an_answered_append_is_never_committed_after_its_answer(tmp_path):
    """Issue 42 finding 1, on a real WAL writer and store: a produce waits behind a slow PUT past
    its request timeout and is answered REQUEST_TIMED_OUT; the PUT then succeeds, and the object
    is committed without it (a transactional batch written so, long after its producer moved on,
    could open a transaction its next one's marker commits). A batch of another request in the
    same object, still waited for, is committed."""
    objects = HeldPuts()
    store = EmbeddedMetadataStore(None)
    await store.start()
    writer = WalWriter(objects, commit_fn(store), linger_ms=1)
    try:
        info = await store.create_topic(TOPIC.name, 4)
        services = context(writer).services
        services.metadata = store
        ctx = SimpleNamespace(services=services, response=response_module(0, 9), api_version=9, peer=None)
        late = produce(ctx, request([1], timeout_s=0.1))
        patient = produce(ctx, request([2], timeout_s=30))
        await asyncio.wait_for(objects.put_started.wait(), 5)
        got = await asyncio.wait_for(late, 5)
        assert (got.error_code, got.base_offset) == (ErrorCode.request_timed_out, -1)
        objects.release.set()
        got = await asyncio.wait_for(patient, 10)
        assert (got.error_code, got.base_offset) == (ErrorCode.none, 0)
        assert (store.high_watermark(info.topic_id, 1), store.high_watermark(info.topic_id, 2)) == (0, 1)
    finally:
        objects.release.set()
        await writer.close()
        await store.close()


class HeldPuts(MemoryObjectStore):
    """An object store whose PUTs wait until released."""

    def __init__(self) -> None:
        super().__init__()
        self.put_started, self.release = asyncio.Event(), asyncio.Event()

    async def put_parts(self, key, parts, *args, **kwargs):
        self.put_started.set()
        await self.release.wait()
        return await super().put_parts(key, parts, *args, **kwargs)


async def test_acks_0_submits_and_answers_nothing():
    wal = Wal()
    answer = produce(context(wal), request([0, 1], acks=0))
    assert answer.done() and answer.result() is None
    assert [p for p, _, _ in wal.submitted] == [0, 1]


async def test_a_request_with_nothing_to_store_is_answered_at_once():
    answer = produce(context(Wal()), request([7]))
    assert answer.done()
    assert (answer.result().index, answer.result().error_code) == (7, ErrorCode.unknown_topic_or_partition)


COMPACTED = TopicInfo("compacted", uuid.uuid4(), 2, {"cleanup.policy": "delete,compact"})
WHY = "Compacted topic cannot accept message without key in topic partition compacted-1."


def compacted_context(wal: Wal, version: int):
    ctx = context(wal)
    ctx.services.metadata = SimpleNamespace(topics=lambda: {COMPACTED.name: COMPACTED})
    ctx.response, ctx.api_version = response_module(0, version), version
    return ctx


def on_the_wire(version: int, answer):
    """The answer as its client reads it: encoded by the broker's codec, decoded by kio."""
    frame = b"".join(encode_response(0, version, 7, answer))
    cls = load_response_schema(0, version)
    header, used = entity_reader(cls.__header_schema__)(frame, 4)
    body, _ = entity_reader(cls)(frame, 4 + used)
    return body


@pytest.mark.parametrize("version", range(3, 12))
async def test_keyless_records_on_a_compacted_topic_are_named_from_v8(version):
    """Kafka's answer (KIP-467): the partition INVALID_RECORD, from v8 its record_errors naming each
    keyless record by its index within the batch and an error message in Kafka's words; before
    v8 INVALID_RECORD alone. Nothing of the batch is submitted; the keyed partition beside it is."""
    wal = Wal()
    recs = [(None if i in (1, 3) else b"k%d" % i, b"v%d" % i, [], 1_700_000_000_000 + i) for i in range(5)]
    data = (
        produce_v9.PartitionProduceData(index=1, records=make_batch(recs)),
        produce_v9.PartitionProduceData(index=0, records=make_batch([(b"k", b"v", [], 1_700_000_000_000)])),
    )
    topic_data = (produce_v9.TopicProduceData(name=COMPACTED.name, partition_data=data),)
    req = produce_v9.ProduceRequest(transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30), topic_data=topic_data)
    answer = produce(compacted_context(wal, version), req)
    assert [p for p, _, _ in wal.submitted] == [0]
    wal.submitted[0][2].set_result(AppendResult(0, 12, 0))
    (topic,) = on_the_wire(version, await asyncio.wait_for(answer, 1)).responses
    refused, stored = topic.partition_responses
    assert (stored.index, stored.error_code, stored.base_offset) == (0, ErrorCode.none, 12)
    assert (refused.index, refused.error_code, refused.base_offset) == (1, ErrorCode.invalid_record, -1)
    assert refused.error_code == 87
    if version < 8:
        assert not hasattr(refused, "record_errors") and not hasattr(refused, "error_message")
        return
    assert [(e.batch_index, e.batch_index_error_message) for e in refused.record_errors] == [(1, WHY), (3, WHY)]
    assert refused.error_message == (
        "One or more records have been rejected due to 2 record errors in total, and only showing the first three errors at most: "
        f"[RecordError(batchIndex=1, message='{WHY}'), RecordError(batchIndex=3, message='{WHY}')]"
    )


async def test_a_one_partition_keyless_refusal_names_its_records():
    """librdkafka's requests hold one partition: their refusal carries its record errors too."""
    wal = Wal()
    recs = [(None, b"v", [], 1_700_000_000_000 + i) for i in range(5)]
    data = (produce_v9.PartitionProduceData(index=1, records=make_batch(recs)),)
    req = produce_v9.ProduceRequest(transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=30), topic_data=(produce_v9.TopicProduceData(name=COMPACTED.name, partition_data=data),))
    answer = produce(compacted_context(wal, 9), req)
    assert wal.submitted == []
    (refused,) = on_the_wire(9, await asyncio.wait_for(answer, 1)).responses[0].partition_responses
    assert (refused.error_code, [e.batch_index for e in refused.record_errors]) == (ErrorCode.invalid_record, [0, 1, 2, 3, 4])
    assert refused.error_message.startswith("One or more records have been rejected due to 5 record errors in total")
    assert refused.error_message.count("RecordError(") == 3  # Kafka shows the first three

"""Produce (key 0), v3-v11 (record batch v2 only).

Each partition's records are validated (magic 2, CRC-32C, lengths, and every record's framing,
as Kafka does) and summarised, then handed to the WAL buffer as they are. The response waits
until the WAL object is stored and its sequencer commit is done; acks=1 and acks=all therefore mean the same thing, and
acks=0 answers nothing. Per-partition errors: UNKNOWN_TOPIC_OR_PARTITION, CORRUPT_MESSAGE,
UNSUPPORTED_FOR_MESSAGE_FORMAT, INVALID_RECORD (also a record without a key on a topic whose
cleanup.policy compacts), MESSAGE_TOO_LARGE (a batch over the
topic's max.message.bytes, by default the broker's), OUT_OF_ORDER_SEQUENCE_NUMBER,
INVALID_PRODUCER_EPOCH, and the retriable KAFKA_STORAGE_ERROR / REQUEST_TIMED_OUT when the object
store or the metadata store fails.

The handler is not a coroutine: it submits every chunk at once and returns a future that its
WAL appends' callbacks answer, so a produce request costs no task (librdkafka sends one request
per partition, thousands a second). That is also the ordering contract with the connection: a
connection's requests enter the WAL buffer in the order they arrived.
"""

from __future__ import annotations

import asyncio
import logging

from kio.schema.errors import ErrorCode

from metadata.store import MetadataError
from wal.batch import InvalidRecords, validate
from wal.format import Chunk
from wal.writer import WalUnavailable

from ..codec import NO_THROTTLE, OnePartitionProduce, build, error
from ..metrics import PRODUCE_BYTES
from ..registry import handles
from ..topic_configs import max_message_bytes
from ..waiting import call_when_done

log = logging.getLogger("neve.broker.produce")


@handles(0, "Produce", 3, 11)
def produce(ctx, request) -> asyncio.Future:
    """Submit the request's records; the future's result is its response (None for acks=0)."""
    s = ctx.services
    topics = s.metadata.topics()
    max_bytes = s.settings.max_message_bytes
    plan = []  # (topic name, [(partition, future | None, error code, message, bytes submitted)])
    for topic in request.topic_data:
        info = topics.get(topic.name)
        # each batch within the topic's max.message.bytes (else the broker's), as in Kafka
        limit = max_message_bytes(info.configs, max_bytes) if info is not None else max_bytes
        # Kafka refuses a record without a key on a topic whose cleanup.policy compacts
        keyed = info is not None and "compact" in (v.strip() for v in info.configs.get("cleanup.policy", "delete").split(","))
        parts = []
        for p in topic.partition_data:
            if info is None or not 0 <= p.index < info.partitions:
                parts.append((p.index, None, ErrorCode.unknown_topic_or_partition, None, 0))
                continue
            records = p.records
            if not records:
                parts.append((p.index, None, ErrorCode.invalid_record, "no records", 0))
                continue
            data = bytes(records)  # what the WAL keeps, and the fastest thing to walk records in
            try:
                summary = validate(data, max_size=limit, keyed=keyed, max_expanded=s.settings.max_decompressed_batch_bytes)
            except InvalidRecords as e:
                parts.append((p.index, None, error(e.error_code), str(e), 0))
                continue
            chunk = Chunk(info.topic_id, p.index, data, summary.batch_count, summary.record_count, summary.max_timestamp)
            try:
                fut = s.wal.submit(chunk, summary)
            except WalUnavailable as e:
                parts.append((p.index, None, ErrorCode.kafka_storage_error, str(e), 0))
                continue
            parts.append((p.index, fut, ErrorCode.none, None, len(chunk.data)))
        plan.append((topic.name, parts))

    answer = asyncio.get_running_loop().create_future()
    if request.acks == 0:
        answer.set_result(None)
        return answer

    def respond() -> None:
        if answer.done():  # cancelled: the connection closed
            return
        try:
            answer.set_result(_response(ctx, plan))
        except Exception as e:  # a bug: the connection logs it and closes
            answer.set_exception(e)

    futures = [fut for _, parts in plan for _, fut, _, _, _ in parts if fut is not None]
    longest = s.settings.produce_timeout_ms / 1000
    asked = request.timeout.total_seconds()
    call_when_done(futures, max(min(asked, longest) if asked > 0 else longest, 0.001), respond)
    return answer


def _response(ctx, plan: list):
    """The response to a request planned and submitted by `produce`, once its appends are done
    (or its time is up)."""
    if len(plan) == 1 and len(plan[0][1]) == 1:  # librdkafka's requests: one partition each
        name, [(index, fut, code, message, size)] = plan[0]
        code, base_offset, log_start, message = _outcome(fut, code, message)
        if code == ErrorCode.none:
            PRODUCE_BYTES.inc(size)
        return OnePartitionProduce(name, index, code, base_offset, log_start, message)
    r = ctx.response
    responses = []
    stored = 0
    for name, parts in plan:
        partition_responses = []
        for index, fut, code, message, size in parts:
            code, base_offset, log_start, message = _outcome(fut, code, message)
            if code == ErrorCode.none:
                stored += size
            partition_responses.append(
                build(
                    r.PartitionProduceResponse,
                    index=index,
                    error_code=code,
                    base_offset=base_offset,
                    log_append_time=None,
                    log_start_offset=log_start,
                    record_errors=(),
                    error_message=message,
                )
            )
        responses.append(build(r.TopicProduceResponse, name=name, partition_responses=tuple(partition_responses)))
    PRODUCE_BYTES.inc(stored)
    return build(r.ProduceResponse, responses=tuple(responses), throttle_time=NO_THROTTLE)


def _outcome(fut, code: ErrorCode, message: str | None) -> tuple[ErrorCode, int, int, str | None]:
    """(error code, base offset, log start offset, error message) of one partition: the error found
    before submitting, or what became of its WAL append."""
    base_offset, log_start = -1, -1
    if fut is not None:
        if not fut.done():
            code, message = ErrorCode.request_timed_out, "not stored within the request timeout"
        elif fut.exception() is not None:
            exc = fut.exception()
            code = error(exc.error_code) if isinstance(exc, MetadataError) else ErrorCode.kafka_storage_error
            message = str(exc)
        else:
            result = fut.result()
            code = error(result.error_code)
            if result.error_code == 0:
                base_offset, log_start = result.base_offset, result.log_start_offset
    return code, base_offset, log_start, message if code != ErrorCode.none else None

"""Produce (key 0), v3-v11 (record batch v2 only).

Each partition's records are validated (magic 2, CRC-32C, lengths, and every record's framing,
as Kafka does) and summarised, then handed to the WAL buffer as they are. The response waits
until the WAL object is stored and its sequencer commit is done; acks=1 and acks=all therefore mean the same thing, and
acks=0 answers nothing. Per-partition errors: UNKNOWN_TOPIC_OR_PARTITION, CORRUPT_MESSAGE,
UNSUPPORTED_FOR_MESSAGE_FORMAT, INVALID_RECORD (also records without a key on a topic whose
cleanup.policy compacts: from v8 the answer's record_errors name each, as Kafka's, and nothing of
the batch is stored), MESSAGE_TOO_LARGE (a batch over the topic's max.message.bytes, by default
the broker's), OUT_OF_ORDER_SEQUENCE_NUMBER,
INVALID_PRODUCER_EPOCH, and the retriable KAFKA_STORAGE_ERROR / REQUEST_TIMED_OUT when the object
store or the metadata store fails. With ACLs (broker/authorization.py): WRITE on each topic, else
its partitions answer TOPIC_AUTHORIZATION_FAILED (whether it exists or not); a transactional
request needs WRITE on its transactional id, else every partition answers
TRANSACTIONAL_ID_AUTHORIZATION_FAILED (an idempotent producer's right, IDEMPOTENT_WRITE, is checked
once at InitProducerId, as Kafka does since KIP-679).

The handler is not a coroutine: it submits every chunk at once and returns a future that its
WAL appends' callbacks answer, so a produce request costs no task (librdkafka sends one request
per partition, thousands a second). That is also the ordering contract with the connection: a
connection's requests enter the WAL buffer in the order they arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging

from kio.schema.errors import ErrorCode

from metadata.store import MetadataError
from wal.batch import InvalidRecords, validate
from wal.format import Chunk
from wal.writer import Abandoned, WalUnavailable

from ..authorization import TOPIC, TRANSACTIONAL_ID, WRITE, allowed, allowed_names
from ..codec import NO_THROTTLE, OnePartitionProduce, build, error, has_field
from ..metrics import PRODUCE_BYTES, TRANSACTIONAL_PRODUCE_REFUSED
from ..registry import handles
from ..topic_configs import max_message_bytes
from ..transactions.coordinator import TransactionError
from ..waiting import call_when_done

log = logging.getLogger("neve.broker.produce")


# Connections whose produce requests wait for a transaction check, by peer: the future that
# resolves once the last of them is submitted. The connection's next requests are submitted after
# it, so a connection's requests still enter the WAL buffer in arrival order.
_ordered: dict = {}

# How long an answer whose time is up waits for the commits in flight of its appends: more than
# the metadata store's deadlines for one commit; past it, the answer is REQUEST_TIMED_OUT.
COMMIT_IN_FLIGHT_S = 60.0
# Idempotent batches submitted, counted for the batch_twice plant alone (`_store_twice`).
_idempotent_batches = 0


@handles(0, "Produce", 3, 11)
def produce(ctx, request) -> asyncio.Future:
    """Submit the request's records; the future's result is its response (None for acks=0)."""
    s = ctx.services
    topics = s.metadata.topics()
    max_bytes = s.settings.max_message_bytes
    plan = []  # (topic name, [(partition, future | None, error code, message, bytes submitted, record errors)])
    submits = []  # (its parts list, index there, chunk, summary) of every partition to submit
    checks = []  # (topic id, partition) of transactional records that may start their transaction
    refused = _refused_topics(ctx, request) if s.authorizer is not None else None
    for topic in request.topic_data:
        if refused and topic.name in refused:
            plan.append((topic.name, [(p.index, None, refused[topic.name], None, 0, ()) for p in topic.partition_data]))
            continue
        info = topics.get(topic.name)
        # each batch within the topic's max.message.bytes (else the broker's), as in Kafka
        limit = max_message_bytes(info.configs, max_bytes) if info is not None else max_bytes
        # Kafka refuses a record without a key on a topic whose cleanup.policy compacts
        keyed = info is not None and "compact" in (v.strip() for v in info.configs.get("cleanup.policy", "delete").split(","))
        parts = []
        for p in topic.partition_data:
            if info is None or not 0 <= p.index < info.partitions:
                parts.append((p.index, None, ErrorCode.unknown_topic_or_partition, None, 0, ()))
                continue
            records = p.records
            if not records:
                parts.append((p.index, None, ErrorCode.invalid_record, "no records", 0, ()))
                continue
            data = bytes(records)  # what the WAL keeps, and the fastest thing to walk records in
            try:
                summary = validate(data, max_size=limit, keyed=keyed, max_expanded=s.settings.max_decompressed_batch_bytes)
            except InvalidRecords as e:
                if e.keyless:
                    message, record_errors = _keyless_refusal(topic.name, p.index, e.keyless)
                    parts.append((p.index, None, ErrorCode.invalid_record, message, 0, record_errors))
                else:
                    parts.append((p.index, None, error(e.error_code), str(e), 0, ()))
                continue
            if summary.transactional:
                if request.transactional_id is None or summary.producer_id < 0:
                    parts.append((p.index, None, ErrorCode.transactional_id_authorization_failed, "transactional records need the request's transactional id and a producer id", 0, ()))
                    continue
                views = s.metadata.topic_views(info.topic_id)
                view = views[p.index] if p.index < len(views) else None
                if view is None or view.txn_starts is None or summary.producer_id not in view.txn_starts:
                    checks.append((info.topic_id, p.index))  # the transaction's first records here
                # Its guard, taken before any verification: stored only if no marker of the
                # producer lands here before it (a late batch of a transaction ended since is refused).
                state = s.metadata.producer_state(info.topic_id, p.index, summary.producer_id)
                summary = dataclasses.replace(summary, txn_guard=state.last_marker if state is not None else -1)
            submits.append((parts, len(parts), Chunk(info.topic_id, p.index, data, summary.batch_count, summary.record_count, summary.max_timestamp), summary))
            parts.append((p.index, None, ErrorCode.none, None, 0, ()))
        plan.append((topic.name, parts))

    key = ctx.peer if ctx.peer is not None else id(ctx)
    previous = _ordered.get(key) if _ordered else None
    if not checks and previous is None:
        _submit(s.wal, submits, {}, s.faults.batch_twice_every)
        return _answer(ctx, request, plan)
    return _checked(ctx, request, plan, submits, checks, key, previous)


def _refused_topics(ctx, request) -> dict:
    """The topics this principal may not write to, with the error their partitions answer."""
    names = [t.name for t in request.topic_data]
    if request.transactional_id is not None and not allowed(ctx, WRITE, TRANSACTIONAL_ID, request.transactional_id):
        return dict.fromkeys(names, ErrorCode.transactional_id_authorization_failed)
    writable = allowed_names(ctx, WRITE, TOPIC, names)
    return {n: ErrorCode.topic_authorization_failed for n in names if n not in writable}


def _submit(wal, submits: list, refused: dict, twice_every: int = 0) -> None:
    """Hand the planned partitions to the WAL buffer, in plan order, but those `refused` (topic id,
    partition) -> (error code, message). `twice_every`: the batch_twice plant's N (0: off)."""
    for parts, i, chunk, summary in submits:
        index = parts[i][0]
        refusal = refused.get((chunk.topic_id, chunk.partition)) if refused else None
        if refusal is not None:
            parts[i] = (index, None, refusal[0], refusal[1], 0, ())
            continue
        try:
            parts[i] = (index, wal.submit(chunk, summary), ErrorCode.none, None, len(chunk.data), ())
        except WalUnavailable as e:
            parts[i] = (index, None, ErrorCode.kafka_storage_error, str(e), 0, ())
            continue
        if twice_every and summary.producer_id >= 0 and not summary.transactional:
            _store_twice(wal, chunk, summary, twice_every)


def _store_twice(wal, chunk: Chunk, summary, every: int) -> None:
    """The batch_twice plant (a deliberate bug, test only: [faults] batch_twice_every): every Nth
    idempotent batch is submitted a second time right after the first, summarised as from no
    producer, so the sequencer's duplicate check (by producer id and sequence) never sees the
    copy: it takes offsets of its own, and a consumer reads its records twice. The producer gets
    the one answer of the first copy; the second's outcome is dropped."""
    global _idempotent_batches
    _idempotent_batches += 1
    if _idempotent_batches % every:
        return
    unsequenced = dataclasses.replace(summary, producer_id=-1, producer_epoch=-1, base_sequence=-1)
    with contextlib.suppress(WalUnavailable):
        wal.submit(chunk, unsequenced).add_done_callback(lambda f: f.cancelled() or f.exception())


def _answer(ctx, request, plan: list) -> asyncio.Future:
    """The response future of a submitted plan: answered once its appends are done (or its time
    is up); None at once for acks=0."""
    s = ctx.services
    answer = asyncio.get_running_loop().create_future()
    if request.acks == 0:
        answer.set_result(None)
        return answer

    futures = [fut for _, parts in plan for _, fut, _, _, _, _ in parts if fut is not None]
    waited = []

    def respond() -> None:
        if answer.done():  # cancelled: the connection closed
            return
        # Time is up for the appends not done: each is abandoned (never sequenced after this
        # answer, which says REQUEST_TIMED_OUT) unless its commit is in flight, whose outcome
        # the answer then waits for (bounded by the store's own deadlines).
        committing = [fut for fut in futures if not s.wal.abandon(fut)]
        if committing and not waited:
            waited.append(True)
            call_when_done(committing, COMMIT_IN_FLIGHT_S, respond)
            return
        try:
            answer.set_result(_response(ctx, plan))
        except Exception as e:  # a bug: the connection logs it and closes
            answer.set_exception(e)

    def closed(_answer) -> None:
        if answer.cancelled():  # the connection closed: what is not committing is never sequenced
            for fut in futures:
                s.wal.abandon(fut)

    answer.add_done_callback(closed)
    longest = s.settings.produce_timeout_ms / 1000
    asked = request.timeout.total_seconds()
    call_when_done(futures, max(min(asked, longest) if asked > 0 else longest, 0.001), respond)
    return answer


def _checked(ctx, request, plan: list, submits: list, checks: list, key, previous: asyncio.Future | None) -> asyncio.Future:
    """KIP-890's defense: transactional records that would start their producer's transaction on a
    partition are stored only if the transaction coordinator's state has that partition in the
    producer's open transaction. A late retry of a transaction that has ended, or records sent
    without AddPartitionsToTxn, would otherwise open a transaction no marker ever ends, and hold
    the partition's last stable offset back. Submitted after the connection's earlier requests."""
    loop = asyncio.get_running_loop()
    submitted = loop.create_future()
    _ordered[key] = submitted

    async def check_then_submit():
        try:
            if previous is not None:
                await asyncio.wait([previous])
            refused = await _verify(ctx.services, request, checks, submits) if checks else {}
            _submit(ctx.services.wal, submits, refused, ctx.services.faults.batch_twice_every)
        finally:
            submitted.set_result(None)
            if _ordered.get(key) is submitted:
                del _ordered[key]
        return await _answer(ctx, request, plan)

    # the task is this request's answer (a closed connection cancels it, and with it what it has
    # not submitted yet)
    return loop.create_task(check_then_submit())


async def _verify(s, request, checks: list, submits: list) -> dict:
    """The refusals of the transactional partitions `checks` (the others' batches are named the
    open transaction's generation): INVALID_TXN_STATE for one not in the producer's open
    transaction, INVALID_PRODUCER_EPOCH for a fenced producer, and the retriable
    NOT_ENOUGH_REPLICAS when the coordinator's state cannot be read (as Kafka answers a
    verification that could not be made)."""
    summaries = {(chunk.topic_id, chunk.partition): summary for _, _, chunk, summary in submits}
    first = summaries[checks[0]]
    try:
        verified = await s.transactions.verify_partitions(request.transactional_id, first.producer_id, first.producer_epoch, checks)
    except TransactionError as e:
        return dict.fromkeys(checks, (ErrorCode.not_enough_replicas, f"the transaction could not be verified: {e}"))
    refused = {}
    for tp, code in verified.codes.items():
        summary = summaries[tp]
        if (summary.producer_id, summary.producer_epoch) != (first.producer_id, first.producer_epoch):
            refused[tp] = (ErrorCode.invalid_record, "batches of one request belong to one producer")
        elif code in (ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch):
            refused[tp] = (ErrorCode.invalid_producer_epoch, "the producer was fenced by a newer one with its transactional id")
        elif code != ErrorCode.none:
            refused[tp] = (ErrorCode.invalid_txn_state, "the partition is not in the producer's open transaction (AddPartitionsToTxn)")
    for tp in verified.codes.keys() - refused.keys():
        summaries[tp].txn_generation = verified.generation  # it opens that transaction here, no other
    for code, _ in refused.values():
        TRANSACTIONAL_PRODUCE_REFUSED.labels(code.name.lower()).inc()
    if refused:
        log.info("transactional_produce_refused", extra={"transactional_id": request.transactional_id, "producer_id": first.producer_id, "partitions": len(refused)})
    return refused


def _response(ctx, plan: list):
    """The response to a request planned and submitted by `produce`, once its appends are done
    (or its time is up)."""
    if len(plan) == 1 and len(plan[0][1]) == 1 and not plan[0][1][0][5]:  # librdkafka's requests: one partition each
        name, [(index, fut, code, message, size, _)] = plan[0]
        code, base_offset, log_start, message = _outcome(fut, code, message)
        if code == ErrorCode.none:
            PRODUCE_BYTES.inc(size)
        return OnePartitionProduce(name, index, code, base_offset, log_start, message)
    r = ctx.response
    with_record_errors = has_field(r.PartitionProduceResponse, "record_errors")  # v8 on
    responses = []
    stored = 0
    for name, parts in plan:
        partition_responses = []
        for index, fut, code, message, size, record_errors in parts:
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
                    record_errors=tuple(build(r.BatchIndexAndErrorMessage, batch_index=i, batch_index_error_message=m) for i, m in record_errors) if with_record_errors else (),
                    error_message=message,
                )
            )
        responses.append(build(r.TopicProduceResponse, name=name, partition_responses=tuple(partition_responses)))
    PRODUCE_BYTES.inc(stored)
    return build(r.ProduceResponse, responses=tuple(responses), throttle_time=NO_THROTTLE)


def _keyless_refusal(topic: str, partition: int, keyless: tuple[int, ...]) -> tuple[str, tuple]:
    """Kafka's answer to a batch holding records without a key for a compacted topic: the
    partition's error message and its record errors, one per keyless record (batch index, message),
    in Kafka's words (LogValidator). Clients fail those records with INVALID_RECORD and the
    batch's others as refused for another record's sake (librdkafka's INVALID_DIFFERENT_RECORD),
    to be sent again by the application."""
    why = f"Compacted topic cannot accept message without key in topic partition {topic}-{partition}."
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{why}')" for i in keyless[:3])
    message = f"One or more records have been rejected due to {len(keyless)} record errors in total, and only showing the first three errors at most: [{shown}]"
    return message, tuple((i, why) for i in keyless)


def _outcome(fut, code: ErrorCode, message: str | None) -> tuple[ErrorCode, int, int, str | None]:
    """(error code, base offset, log start offset, error message) of one partition: the error found
    before submitting, or what became of its WAL append."""
    base_offset, log_start = -1, -1
    if fut is not None:
        if not fut.done() or isinstance(fut.exception(), Abandoned):
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

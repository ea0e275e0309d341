"""AddPartitionsToTxn (key 24), v0-v4. v0-v3, from producers: the partitions join the producer's
transaction. v4 (KIP-890 part 1) batches several transactions, as a partition leader asks a
coordinator, and each may be `verify_only`: is each partition already in the open transaction
(INVALID_TXN_STATE if not)? v5, whose errors belong to transactions v2, is not advertised.

Partitions of unknown topics get UNKNOWN_TOPIC_OR_PARTITION and the rest of that transaction's
OPERATION_NOT_ATTEMPTED, as Kafka answers; the coordinator's errors apply to every partition.
With ACLs, as Kafka checks: v0-v3 need WRITE on the transactional id (else every partition answers
TRANSACTIONAL_ID_AUTHORIZATION_FAILED) and WRITE on each topic (else TOPIC_AUTHORIZATION_FAILED,
the others OPERATION_NOT_ATTEMPTED); v4, a broker's request, needs CLUSTER_ACTION on the cluster
(else CLUSTER_AUTHORIZATION_FAILED for the request)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..authorization import CLUSTER, CLUSTER_ACTION, TOPIC, TRANSACTIONAL_ID, WRITE, allowed, allowed_names
from ..codec import NO_THROTTLE, build
from ..registry import handles
from ..transactions.coordinator import TransactionError, error_code

BATCHED_SINCE = 4
PRODUCER_FENCED_SINCE = 2  # KIP-588: older versions are answered INVALID_PRODUCER_EPOCH


async def _results(ctx, transactional_id: str, producer_id: int, producer_epoch: int, topics, verify_only: bool) -> tuple:
    r = ctx.response
    known = ctx.services.metadata.topics()
    asked = [(t.name, p) for t in topics for p in t.partitions]
    unknown = {(name, p) for name, p in asked if (info := known.get(name)) is None or not 0 <= p < info.partitions}
    codes: dict[tuple[str, int], ErrorCode]
    writable = None
    if ctx.services.authorizer is not None and ctx.api_version < BATCHED_SINCE:
        writable = allowed_names(ctx, WRITE, TOPIC, [t.name for t in topics])
    if ctx.services.authorizer is not None and ctx.api_version < BATCHED_SINCE and not allowed(ctx, WRITE, TRANSACTIONAL_ID, transactional_id):
        codes = dict.fromkeys(asked, ErrorCode.transactional_id_authorization_failed)
    elif writable is not None and any(name not in writable for name, _ in asked):
        codes = {tp: ErrorCode.topic_authorization_failed if tp[0] not in writable else ErrorCode.unknown_topic_or_partition if tp in unknown else ErrorCode.operation_not_attempted for tp in asked}
    elif unknown:
        codes = {tp: ErrorCode.unknown_topic_or_partition if tp in unknown else ErrorCode.operation_not_attempted for tp in asked}
    else:
        partitions = [(known[name].topic_id, p) for name, p in asked]
        coordinator = ctx.services.transactions
        try:
            if verify_only:
                verified = await coordinator.verify_partitions(transactional_id, producer_id, producer_epoch, partitions)
                codes = {tp: verified.codes[(known[tp[0]].topic_id, tp[1])] for tp in asked}
            else:
                await coordinator.add_partitions(transactional_id, producer_id, producer_epoch, partitions)
                codes = dict.fromkeys(asked, ErrorCode.none)
        except TransactionError as e:
            codes = dict.fromkeys(asked, error_code(e, ctx.api_version, PRODUCER_FENCED_SINCE))
    return tuple(
        build(r.AddPartitionsToTxnTopicResult, name=t.name, results_by_partition=tuple(build(r.AddPartitionsToTxnPartitionResult, partition_index=p, partition_error_code=codes[(t.name, p)]) for p in t.partitions))
        for t in topics
    )


@handles(24, "AddPartitionsToTxn", 0, 4)
async def add_partitions_to_txn(ctx, request):
    r = ctx.response
    if ctx.api_version < BATCHED_SINCE:
        results = await _results(ctx, request.v3_and_below_transactional_id, request.v3_and_below_producer_id, request.v3_and_below_producer_epoch, request.v3_and_below_topics, False)
        return build(r.AddPartitionsToTxnResponse, throttle_time=NO_THROTTLE, results_by_topic_v3_and_below=results)
    if not allowed(ctx, CLUSTER_ACTION, CLUSTER):
        return build(r.AddPartitionsToTxnResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.cluster_authorization_failed, results_by_transaction=())
    by_transaction = []
    for txn in request.transactions:
        results = await _results(ctx, txn.transactional_id, txn.producer_id, txn.producer_epoch, txn.topics, txn.verify_only)
        by_transaction.append(build(r.AddPartitionsToTxnResult, transactional_id=txn.transactional_id, topic_results=results))
    return build(r.AddPartitionsToTxnResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, results_by_transaction=tuple(by_transaction))

"""DescribeTransactions (key 65), v0 (KIP-664): each transactional id's stored state, its
producer, timeout, start time and partitions (TRANSACTIONAL_ID_NOT_FOUND for an unknown id). Any
broker answers for any id: the state is the metadata store's. With ACLs: DESCRIBE on the
transactional id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED); its topics the principal may not
DESCRIBE are left out."""

from __future__ import annotations

import datetime
import uuid

from kio.schema.errors import ErrorCode

from ..authorization import DESCRIBE, TOPIC, TRANSACTIONAL_ID, allowed
from ..codec import NO_THROTTLE, build
from ..registry import handles
from ..transactions.coordinator import TransactionError


@handles(65, "DescribeTransactions", 0, 0)
async def describe_transactions(ctx, request):
    r = ctx.response
    s = ctx.services
    states = []
    for transactional_id in request.transactional_ids:
        try:
            if not allowed(ctx, DESCRIBE, TRANSACTIONAL_ID, transactional_id):
                raise TransactionError(ErrorCode.transactional_id_authorization_failed)
            txn, _ = await s.transactions.load(transactional_id)
        except TransactionError as e:
            txn, code = None, e.code
        else:
            code = ErrorCode.none if txn is not None else ErrorCode.transactional_id_not_found
        if txn is None:
            unknown = dict(transaction_state="", transaction_timeout=datetime.timedelta(0), transaction_start_time=_time(-1), producer_id=-1, producer_epoch=-1, topics=())
            states.append(build(r.TransactionState, error_code=code, transactional_id=transactional_id, **unknown))
            continue
        by_topic: dict[str, list[int]] = {}
        for topic_hex, partition in txn.partitions:
            info = s.metadata.topic_by_id(_uuid(topic_hex))
            if info is not None and allowed(ctx, DESCRIBE, TOPIC, info.name):
                by_topic.setdefault(info.name, []).append(partition)
        topics = tuple(build(r.TopicData, topic=name, partitions=tuple(parts)) for name, parts in by_topic.items())
        states.append(
            build(
                r.TransactionState,
                error_code=ErrorCode.none,
                transactional_id=transactional_id,
                transaction_state=str(txn.status),
                transaction_timeout=datetime.timedelta(milliseconds=txn.timeout_ms),
                transaction_start_time=_time(txn.started_ms),
                producer_id=txn.producer_id,
                producer_epoch=txn.producer_epoch,
                topics=topics,
            )
        )
    return build(r.DescribeTransactionsResponse, throttle_time=NO_THROTTLE, transaction_states=tuple(states))


def _time(ms: int) -> datetime.datetime:
    """Kafka's start time field (ms since the epoch; -1 when no transaction is open)."""
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


def _uuid(topic_hex: str) -> uuid.UUID:
    return uuid.UUID(hex=topic_hex)

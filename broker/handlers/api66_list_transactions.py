"""ListTransactions (key 66), v0-v1 (KIP-664): the stored transactional ids with their producer
and state, filtered by state names, producer ids and (v1) how long the transaction has been open.
An unknown state name is listed back in unknown_state_filters, as Kafka does. With ACLs, only the
transactional ids the principal may DESCRIBE are listed."""

from __future__ import annotations

import time

from kio.schema.errors import ErrorCode

from metadata.transactions import Status

from ..authorization import DESCRIBE, TRANSACTIONAL_ID, allowed
from ..codec import NO_THROTTLE, build
from ..registry import handles
from ..transactions.coordinator import TransactionError


@handles(66, "ListTransactions", 0, 1)
async def list_transactions(ctx, request):
    r = ctx.response
    names = {str(s) for s in Status}
    unknown = tuple(f for f in request.state_filters if f not in names)
    try:
        stored = await ctx.services.transactions.transactions()
    except TransactionError as e:
        return build(r.ListTransactionsResponse, throttle_time=NO_THROTTLE, error_code=e.code, unknown_state_filters=unknown, transaction_states=())
    wanted_states = set(request.state_filters)
    wanted_producers = set(request.producer_id_filters)
    longer_than = getattr(request, "duration_filter", -1)
    now = int(time.time() * 1000)
    states = []
    for transactional_id, (txn, _) in sorted(stored.items()):
        if wanted_states and str(txn.status) not in wanted_states:
            continue
        if wanted_producers and txn.producer_id not in wanted_producers:
            continue
        if longer_than >= 0 and (txn.started_ms < 0 or now - txn.started_ms <= longer_than):
            continue
        if not allowed(ctx, DESCRIBE, TRANSACTIONAL_ID, transactional_id):
            continue
        states.append(build(r.TransactionState, transactional_id=transactional_id, producer_id=txn.producer_id, transaction_state=str(txn.status)))
    return build(r.ListTransactionsResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, unknown_state_filters=unknown, transaction_states=tuple(states))

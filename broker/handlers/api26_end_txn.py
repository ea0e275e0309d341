"""EndTxn (key 26), v0-v4: commit or abort the producer's transaction. Answered once the outcome
is durable and carried out: the group offsets committed (on commit) and a marker stored on every
partition of the transaction. If a part could not be stored, the answer is the retriable
CONCURRENT_TRANSACTIONS and the decision stands: the retry (or the sweep) completes it. v5
belongs to transactions v2 and is not advertised. With ACLs: WRITE on the transactional id, else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..authorization import TRANSACTIONAL_ID, WRITE, allowed
from ..codec import NO_THROTTLE, build
from ..registry import handles
from ..transactions.coordinator import TransactionError, error_code

PRODUCER_FENCED_SINCE = 2  # KIP-588: older versions are answered INVALID_PRODUCER_EPOCH


@handles(26, "EndTxn", 0, 4)
async def end_txn(ctx, request):
    if not allowed(ctx, WRITE, TRANSACTIONAL_ID, request.transactional_id):
        return build(ctx.response.EndTxnResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.transactional_id_authorization_failed)
    code = ErrorCode.none
    try:
        await ctx.services.transactions.end(request.transactional_id, request.producer_id, request.producer_epoch, request.committed)
    except TransactionError as e:
        code = error_code(e, ctx.api_version, PRODUCER_FENCED_SINCE)
    return build(ctx.response.EndTxnResponse, throttle_time=NO_THROTTLE, error_code=code)

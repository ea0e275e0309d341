"""AddOffsetsToTxn (key 25), v0-v3: the group's offsets will be committed by the producer's
transaction (TxnOffsetCommit names them, EndTxn commits or drops them). v4 belongs to
transactions v2 and is not advertised. With ACLs: WRITE on the transactional id (else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED), then READ on the group (else GROUP_AUTHORIZATION_FAILED)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..authorization import GROUP, READ, TRANSACTIONAL_ID, WRITE, allowed
from ..codec import NO_THROTTLE, build
from ..registry import handles
from ..transactions.coordinator import TransactionError, error_code

PRODUCER_FENCED_SINCE = 2  # KIP-588: older versions are answered INVALID_PRODUCER_EPOCH


@handles(25, "AddOffsetsToTxn", 0, 3)
async def add_offsets_to_txn(ctx, request):
    code = ErrorCode.none
    if not allowed(ctx, WRITE, TRANSACTIONAL_ID, request.transactional_id):
        code = ErrorCode.transactional_id_authorization_failed
    elif not allowed(ctx, READ, GROUP, request.group_id):
        code = ErrorCode.group_authorization_failed
    elif not request.group_id:
        code = ErrorCode.invalid_group_id
    else:
        try:
            await ctx.services.transactions.add_offsets(request.transactional_id, request.producer_id, request.producer_epoch, request.group_id)
        except TransactionError as e:
            code = error_code(e, ctx.api_version, PRODUCER_FENCED_SINCE)
    return build(ctx.response.AddOffsetsToTxnResponse, throttle_time=NO_THROTTLE, error_code=code)

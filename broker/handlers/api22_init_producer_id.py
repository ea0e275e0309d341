"""InitProducerId (key 22), v0-v5. Without a transactional id (idempotent producers): a new
producer id at epoch 0, or (v3+, KIP-360) the same id with a bumped epoch when the client gives
its current one. With one: the transaction coordinator's producer id and epoch for it, after
fencing its earlier producer (broker/transactions/coordinator.py). With ACLs, as Kafka checks:
WRITE on the transactional id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED); without one,
IDEMPOTENT_WRITE on the cluster or WRITE on some topic (else CLUSTER_AUTHORIZATION_FAILED)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from metadata.store import MetadataError

from ..authorization import CLUSTER, IDEMPOTENT_WRITE, TOPIC, TRANSACTIONAL_ID, WRITE, allowed, allowed_on_any
from ..codec import NO_THROTTLE, build, error
from ..registry import handles
from ..transactions.coordinator import TransactionError, error_code

PRODUCER_FENCED_SINCE = 4  # KIP-588: older versions are answered INVALID_PRODUCER_EPOCH


@handles(22, "InitProducerId", 0, 5)
async def init_producer_id(ctx, request):
    r = ctx.response
    producer_id, producer_epoch = getattr(request, "producer_id", -1), getattr(request, "producer_epoch", -1)
    if ctx.services.authorizer is not None:
        if request.transactional_id is not None:
            refused = None if allowed(ctx, WRITE, TRANSACTIONAL_ID, request.transactional_id) else ErrorCode.transactional_id_authorization_failed
        else:
            refused = None if allowed(ctx, IDEMPOTENT_WRITE, CLUSTER) or allowed_on_any(ctx, WRITE, TOPIC) else ErrorCode.cluster_authorization_failed
        if refused is not None:
            return build(r.InitProducerIdResponse, throttle_time=NO_THROTTLE, error_code=refused, producer_id=-1, producer_epoch=-1)
    try:
        if request.transactional_id is not None:
            timeout_ms = int(request.transaction_timeout.total_seconds() * 1000)
            pid, epoch = await ctx.services.transactions.init_producer_id(request.transactional_id, timeout_ms, producer_id, producer_epoch)
        else:
            pid, epoch = await ctx.services.metadata.init_producer_id(producer_id, producer_epoch)
    except TransactionError as e:
        return build(r.InitProducerIdResponse, throttle_time=NO_THROTTLE, error_code=error_code(e, ctx.api_version, PRODUCER_FENCED_SINCE), producer_id=-1, producer_epoch=-1)
    except MetadataError as e:
        return build(r.InitProducerIdResponse, throttle_time=NO_THROTTLE, error_code=error(e.error_code), producer_id=-1, producer_epoch=-1)
    return build(r.InitProducerIdResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, producer_id=pid, producer_epoch=epoch)

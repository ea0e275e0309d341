"""InitProducerId (key 22), v0-v5, for idempotent producers: a new producer id at epoch 0, or
(v3+, KIP-360) the same id with a bumped epoch when the client gives its current one.
Transactions are not implemented yet: a transactional id is refused."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode

from metadata.store import MetadataError

from ..codec import build, error
from ..registry import handles

NO_THROTTLE = datetime.timedelta(0)


@handles(22, "InitProducerId", 0, 5)
async def init_producer_id(ctx, request):
    r = ctx.response
    if request.transactional_id is not None:
        return build(r.InitProducerIdResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.transactional_id_authorization_failed, producer_id=-1, producer_epoch=-1)
    try:
        pid, epoch = await ctx.services.metadata.init_producer_id(getattr(request, "producer_id", -1), getattr(request, "producer_epoch", -1))
    except MetadataError as e:
        return build(r.InitProducerIdResponse, throttle_time=NO_THROTTLE, error_code=error(e.error_code), producer_id=-1, producer_epoch=-1)
    return build(r.InitProducerIdResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, producer_id=pid, producer_epoch=epoch)

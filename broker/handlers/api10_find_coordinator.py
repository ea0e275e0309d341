"""FindCoordinator (key 10), v0-v5; v4+ batches several keys in one request.

Groups (key_type 0) are coordinated by one live broker chosen by rendezvous hashing of the group
id over every live broker (see broker/groups/coordinator.py); a single node always answers
itself. Transactions are not supported: key_type 1 gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED
(as InitProducerId with a transactional id does), any other key type INVALID_REQUEST."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode

from ..codec import build, has_field
from ..registry import handles

NO_THROTTLE = datetime.timedelta(0)
GROUP, TRANSACTION = 0, 1


def _find(ctx, key: str, key_type: int) -> dict:
    if key_type == TRANSACTION:
        return dict(error_code=ErrorCode.transactional_id_authorization_failed, error_message="transactions are not supported", node_id=-1, host="", port=-1)
    if key_type != GROUP:
        return dict(error_code=ErrorCode.invalid_request, error_message=f"unknown key type {key_type}", node_id=-1, host="", port=-1)
    if not key:
        return dict(error_code=ErrorCode.invalid_group_id, error_message="empty group id", node_id=-1, host="", port=-1)
    broker = ctx.services.coordinator.coordinator(key)
    return dict(error_code=ErrorCode.none, error_message=None, node_id=broker.node_id, host=broker.host, port=broker.port)


@handles(10, "FindCoordinator", 0, 5)
async def find_coordinator(ctx, request):
    r = ctx.response
    key_type = getattr(request, "key_type", GROUP)
    if has_field(request, "coordinator_keys"):
        coordinators = tuple(build(r.Coordinator, key=key, **_find(ctx, key, key_type)) for key in request.coordinator_keys)
        return build(r.FindCoordinatorResponse, throttle_time=NO_THROTTLE, coordinators=coordinators)
    return build(r.FindCoordinatorResponse, throttle_time=NO_THROTTLE, **_find(ctx, request.key, key_type))

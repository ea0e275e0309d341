"""Heartbeat (key 12), v0-v4 (v3+ carries group.instance.id). Keeps a member's session alive;
answers REBALANCE_IN_PROGRESS while the group gathers its members (the member then rejoins; once
joined and waiting for the leader's SyncGroup, heartbeats are accepted, as Kafka does),
ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID for stale members and NOT_COORDINATOR
when another broker owns the group. With ACLs: READ on the group, else GROUP_AUTHORIZATION_FAILED."""

from __future__ import annotations

from ..authorization import GROUP, READ, allowed
from ..codec import NO_THROTTLE, build, error
from ..groups.group import GROUP_AUTHORIZATION_FAILED, GroupError
from ..registry import handles


@handles(12, "Heartbeat", 0, 4)
async def heartbeat(ctx, request):
    try:
        if not allowed(ctx, READ, GROUP, request.group_id):
            raise GroupError(GROUP_AUTHORIZATION_FAILED)
        code = await ctx.services.coordinator.heartbeat(request.group_id, request.generation_id, request.member_id, getattr(request, "group_instance_id", None))
    except GroupError as e:
        code = e.code
    return build(ctx.response.HeartbeatResponse, throttle_time=NO_THROTTLE, error_code=error(code))

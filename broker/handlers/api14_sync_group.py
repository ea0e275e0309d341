"""SyncGroup (key 14), v0-v5. The leader sends every member's assignment; each member (leader
included) gets its own once the leader's arrives. v5 carries protocol type and name, checked
against the group's (INCONSISTENT_GROUP_PROTOCOL on mismatch). Stale members get
ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID; a sync during a new rebalance REBALANCE_IN_PROGRESS. With
ACLs: READ on the group, else GROUP_AUTHORIZATION_FAILED."""

from __future__ import annotations

from ..authorization import GROUP, READ, allowed
from ..codec import NO_THROTTLE, build, error
from ..groups.group import GROUP_AUTHORIZATION_FAILED, GroupError, SyncResult
from ..registry import handles


@handles(14, "SyncGroup", 0, 5)
async def sync_group(ctx, request):
    try:
        if not allowed(ctx, READ, GROUP, request.group_id):
            raise GroupError(GROUP_AUTHORIZATION_FAILED)
        result = await ctx.services.coordinator.sync(
            request.group_id,
            request.generation_id,
            request.member_id,
            getattr(request, "group_instance_id", None),
            getattr(request, "protocol_type", None),
            getattr(request, "protocol_name", None),
            {a.member_id: a.assignment for a in request.assignments},
        )
    except GroupError as e:
        result = SyncResult(e.code)
    return build(
        ctx.response.SyncGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=error(result.error),
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )

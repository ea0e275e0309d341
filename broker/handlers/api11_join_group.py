"""JoinGroup (key 11), v0-v9. Classic-protocol membership: a member joins (or rejoins), waits for
the rebalance to gather every known member (up to the rebalance timeout), and gets the generation,
the chosen protocol and the leader; the leader also gets every member's metadata.

v4+ first answers a join without member id with MEMBER_ID_REQUIRED and a fresh id (KIP-394),
except for static members (v5+, group.instance.id, KIP-345), which restart in place. v0 has no
rebalance timeout: the session timeout stands in. Session timeouts outside [6 s, 30 min] get
INVALID_SESSION_TIMEOUT; a protocol type or protocol set foreign to the group gets
INCONSISTENT_GROUP_PROTOCOL. v9 never asks the leader to skip assignment. With ACLs: READ on the
group, else GROUP_AUTHORIZATION_FAILED."""

from __future__ import annotations

import datetime

from ..authorization import GROUP, READ, allowed
from ..codec import NO_THROTTLE, build, error
from ..groups.group import GROUP_AUTHORIZATION_FAILED, GroupError, JoinResult
from ..registry import handles


def _ms(value) -> int:
    return int(value.total_seconds() * 1000) if isinstance(value, datetime.timedelta) else int(value)


@handles(11, "JoinGroup", 0, 9)
async def join_group(ctx, request):
    r = ctx.response
    session_ms = _ms(request.session_timeout)
    rebalance_ms = _ms(request.rebalance_timeout) if hasattr(request, "rebalance_timeout") else session_ms
    try:
        if not allowed(ctx, READ, GROUP, request.group_id):
            raise GroupError(GROUP_AUTHORIZATION_FAILED)
        result = await ctx.services.coordinator.join(
            request.group_id,
            request.member_id,
            getattr(request, "group_instance_id", None),
            request.protocol_type,
            [(p.name, p.metadata) for p in request.protocols],
            session_ms,
            rebalance_ms,
            ctx.client_id or "",
            str(ctx.peer[0]) if ctx.peer else "",
            require_known_member_id=ctx.api_version >= 4,
        )
    except GroupError as e:
        result = JoinResult(e.code, member_id=request.member_id)
    nullable = ctx.api_version >= 7
    members = tuple(build(r.JoinGroupResponseMember, member_id=m, group_instance_id=i, metadata=meta) for m, i, meta in result.members)
    return build(
        r.JoinGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=error(result.error),
        generation_id=result.generation,
        protocol_type=result.protocol_type if nullable else (result.protocol_type or ""),
        protocol_name=result.protocol_name if nullable else (result.protocol_name or ""),
        leader=result.leader,
        skip_assignment=False,
        member_id=result.member_id,
        members=members,
    )

"""LeaveGroup (key 13), v0-v5. v0-v2 name one member; v3+ a batch of members, each by member id
and/or group.instance.id (KIP-345), each answered on its own. Leaving starts a rebalance of the
others; a static member named with a member id other than its current one is FENCED_INSTANCE_ID.
With ACLs: READ on the group, else GROUP_AUTHORIZATION_FAILED."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..authorization import GROUP, READ, allowed
from ..codec import NO_THROTTLE, build, error, has_field
from ..groups.group import GROUP_AUTHORIZATION_FAILED, GroupError
from ..registry import handles


@handles(13, "LeaveGroup", 0, 5)
async def leave_group(ctx, request):
    r = ctx.response
    batched = has_field(request, "members")
    members = [(m.member_id, m.group_instance_id) for m in request.members] if batched else [(request.member_id, None)]
    try:
        if not allowed(ctx, READ, GROUP, request.group_id):
            raise GroupError(GROUP_AUTHORIZATION_FAILED)
        codes = await ctx.services.coordinator.leave(request.group_id, members)
        top = ErrorCode.none if batched else error(codes[0])
    except GroupError as e:
        codes, top = [], error(e.code)
    responses = tuple(build(r.MemberResponse, member_id=m, group_instance_id=i, error_code=error(c)) for (m, i), c in zip(members, codes, strict=False)) if batched else ()
    return build(r.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=top, members=responses)

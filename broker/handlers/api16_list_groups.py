"""ListGroups (key 16), v0-v5: the groups this broker coordinates (clients ask every broker and
merge), with protocol type and (v4+) state; v4+ filters by state, v5+ by group type ("classic", or "consumer" for KIP-848
groups, whose states are Empty, Assigning, Reconciling and Stable). With ACLs: every group to a
principal that may DESCRIBE the cluster, else those it may DESCRIBE."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..authorization import CLUSTER, DESCRIBE, GROUP, allowed, allowed_names
from ..codec import NO_THROTTLE, build, error
from ..groups.group import GroupError
from ..registry import handles


@handles(16, "ListGroups", 0, 5)
async def list_groups(ctx, request):
    r = ctx.response
    states = {s.lower() for s in getattr(request, "states_filter", ())}
    types = {t.lower() for t in getattr(request, "types_filter", ())}
    try:
        listed = await ctx.services.coordinator.listing()
    except GroupError as e:
        return build(r.ListGroupsResponse, throttle_time=NO_THROTTLE, error_code=error(e.code), groups=())
    if not allowed(ctx, DESCRIBE, CLUSTER):
        described = allowed_names(ctx, DESCRIBE, GROUP, [name for name, *_ in listed])
        listed = [g for g in listed if g[0] in described]
    groups = tuple(
        build(r.ListedGroup, group_id=name, protocol_type=protocol_type, group_state=state, group_type=group_type)
        for name, protocol_type, state, group_type in listed
        if (not states or state.lower() in states) and (not types or group_type in types)
    )
    return build(r.ListGroupsResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, groups=groups)

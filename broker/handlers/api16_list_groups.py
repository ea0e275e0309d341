"""ListGroups (key 16), v0-v5: the groups this broker coordinates (clients ask every broker and
merge), with protocol type and (v4+) state; v4+ filters by state, v5+ by group type (every group
here is "classic": KIP-848 groups are not supported)."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode

from ..codec import build, error
from ..groups.group import GroupError
from ..registry import handles

NO_THROTTLE = datetime.timedelta(0)
CLASSIC = "classic"


@handles(16, "ListGroups", 0, 5)
async def list_groups(ctx, request):
    r = ctx.response
    states = {s.lower() for s in getattr(request, "states_filter", ())}
    types = {t.lower() for t in getattr(request, "types_filter", ())}
    if types and CLASSIC not in types:
        return build(r.ListGroupsResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, groups=())
    try:
        listed = await ctx.services.coordinator.list()
    except GroupError as e:
        return build(r.ListGroupsResponse, throttle_time=NO_THROTTLE, error_code=error(e.code), groups=())
    groups = tuple(
        build(r.ListedGroup, group_id=name, protocol_type=protocol_type, group_state=state, group_type=CLASSIC)
        for name, protocol_type, state in listed
        if not states or state.lower() in states
    )
    return build(r.ListGroupsResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, groups=groups)

"""DeleteGroups (key 42), v0-v2: deletes a group's stored state and committed offsets. A group
with members gets NON_EMPTY_GROUP, an unknown one GROUP_ID_NOT_FOUND, one coordinated elsewhere
NOT_COORDINATOR. With ACLs: DELETE on the group, else GROUP_AUTHORIZATION_FAILED."""

from __future__ import annotations

from ..authorization import DELETE, GROUP, allowed
from ..codec import NO_THROTTLE, build, error
from ..groups.group import GROUP_AUTHORIZATION_FAILED, GroupError
from ..registry import handles


@handles(42, "DeleteGroups", 0, 2)
async def delete_groups(ctx, request):
    r = ctx.response
    results = []
    for group_id in request.groups_names:
        try:
            if not allowed(ctx, DELETE, GROUP, group_id):
                raise GroupError(GROUP_AUTHORIZATION_FAILED)
            code = await ctx.services.coordinator.delete(group_id)
        except GroupError as e:
            code = e.code
        results.append(build(r.DeletableGroupResult, group_id=group_id, error_code=error(code)))
    return build(r.DeleteGroupsResponse, throttle_time=NO_THROTTLE, results=tuple(results))

"""DescribeGroups (key 15), v0-v5: state, protocol type, chosen protocol and members (with the
chosen protocol's metadata and their assignment) of each group. A group nothing is known of is
Dead with no error (as Kafka answers up to v5); a group with only committed offsets is Empty.
Groups coordinated elsewhere get NOT_COORDINATOR. A KIP-848 consumer group shows protocol type
"consumer", its ConsumerGroupState name and its members without metadata or assignment (those
are in ConsumerGroupDescribe). With ACLs: DESCRIBE on each group, else GROUP_AUTHORIZATION_FAILED
for it; its authorized operations (v3+) are reported when asked."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..authorization import DESCRIBE, GROUP, NOT_REPORTED, allowed, authorized_operations
from ..codec import NO_THROTTLE, build, error
from ..groups.consumer_group import ConsumerGroup
from ..groups.group import GroupError, GroupState
from ..registry import handles


@handles(15, "DescribeGroups", 0, 5)
async def describe_groups(ctx, request):
    r = ctx.response
    out = []
    with_operations = getattr(request, "include_authorized_operations", False)
    for group_id in request.groups:
        fields = dict(group_id=group_id, protocol_type="", protocol_data="", members=(), authorized_operations=NOT_REPORTED)
        if not allowed(ctx, DESCRIBE, GROUP, group_id):
            out.append(build(r.DescribedGroup, error_code=ErrorCode.group_authorization_failed, group_state="", **fields))
            continue
        if with_operations:
            fields["authorized_operations"] = authorized_operations(ctx, GROUP, group_id)
        try:
            group = await ctx.services.coordinator.describe(group_id)
        except GroupError as e:
            out.append(build(r.DescribedGroup, error_code=error(e.code), group_state="", **fields))
            continue
        if group is None:
            out.append(build(r.DescribedGroup, error_code=ErrorCode.none, group_state=GroupState.DEAD.value, **fields))
            continue
        if isinstance(group, ConsumerGroup):
            members = tuple(
                build(r.DescribedGroupMember, member_id=m.member_id, group_instance_id=m.instance_id, client_id=m.client_id, client_host=m.client_host, member_metadata=b"", member_assignment=b"")
                for m in group.members.values()
            )
            fields.update(protocol_type=ConsumerGroup.TYPE, members=members)
            out.append(build(r.DescribedGroup, error_code=ErrorCode.none, group_state=group.state_name, **fields))
            continue
        stable = group.state is GroupState.STABLE
        members = tuple(
            build(
                r.DescribedGroupMember,
                member_id=m.member_id,
                group_instance_id=m.instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata_for(group.protocol_name),
                member_assignment=m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
        fields.update(protocol_type=group.protocol_type or "", protocol_data=group.protocol_name or "", members=members)
        out.append(build(r.DescribedGroup, error_code=ErrorCode.none, group_state=group.state.value, **fields))
    return build(r.DescribeGroupsResponse, throttle_time=NO_THROTTLE, groups=tuple(out))

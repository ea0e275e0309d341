"""ConsumerGroupDescribe (key 69), v0-v1: KIP-848 groups with their group epoch, target
assignment epoch, assignor and members (epoch, subscription, current and target assignment; v1
member type 1 = consumer). A group that does not exist or is a classic group gets
GROUP_ID_NOT_FOUND, as Kafka answers; one coordinated elsewhere NOT_COORDINATOR. With ACLs:
DESCRIBE on each group, else GROUP_AUTHORIZATION_FAILED for it, and DESCRIBE on every topic its
members hold or are to hold, else TOPIC_AUTHORIZATION_FAILED for it (as Kafka: a member's regex
subscription may have taken topics the describer may not know of); its authorized operations are
reported when asked."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..authorization import DESCRIBE, GROUP, NOT_REPORTED, TOPIC, allowed, allowed_names, authorized_operations
from ..codec import NO_THROTTLE, build, error
from ..groups.group import GROUP_AUTHORIZATION_FAILED, GroupError
from ..registry import handles

CONSUMER_MEMBER = 1


def _assignment(r, assignment, names: dict) -> object:
    topics = tuple(build(r.TopicPartitions, topic_id=t, topic_name=names.get(t, ""), partitions=tuple(sorted(ps))) for t, ps in sorted(assignment.items(), key=lambda kv: names.get(kv[0], str(kv[0]))))
    return build(r.Assignment, topic_partitions=topics)


@handles(69, "ConsumerGroupDescribe", 0, 1)
async def consumer_group_describe(ctx, request):
    r = ctx.response
    names = {info.topic_id: name for name, info in ctx.services.metadata.topics().items()}
    out = []
    for group_id in request.group_ids:
        try:
            if not allowed(ctx, DESCRIBE, GROUP, group_id):
                raise GroupError(GROUP_AUTHORIZATION_FAILED, "DESCRIBE on the group is needed")
            group = await ctx.services.coordinator.describe_consumer_group(group_id)
            if ctx.services.authorizer is not None:
                # a member's regex may have given it topics the describer may not know of (Kafka)
                held = {names.get(t, "") for m in group.members.values() for a in (m.assigned, group.target.get(m.member_id, {})) for t in a}
                held.discard("")
                if not held <= allowed_names(ctx, DESCRIBE, TOPIC, sorted(held)):
                    raise GroupError(ErrorCode.topic_authorization_failed, "The group has described topic(s) that the client is not authorized to describe.")
        except GroupError as e:
            fields = dict(group_state="", group_epoch=-1, assignment_epoch=-1, assignor_name="", members=(), authorized_operations=NOT_REPORTED)
            out.append(build(r.DescribedGroup, error_code=error(e.code), error_message=str(e), group_id=group_id, **fields))
            continue
        members = tuple(
            build(
                r.Member,
                member_id=m.member_id,
                instance_id=m.instance_id,
                rack_id=m.rack_id,
                member_epoch=m.epoch,
                client_id=m.client_id,
                client_host=m.client_host,
                subscribed_topic_names=m.topic_names,
                subscribed_topic_regex=m.topic_regex,
                assignment=_assignment(r, m.assigned, names),
                target_assignment=_assignment(r, group.target.get(m.member_id, {}), names),
                member_type=CONSUMER_MEMBER,
            )
            for m in group.members.values()
        )
        out.append(
            build(
                r.DescribedGroup,
                error_code=ErrorCode.none,
                error_message=None,
                group_id=group_id,
                group_state=group.state_name,
                group_epoch=group.group_epoch,
                assignment_epoch=group.assignment_epoch,
                assignor_name=group.assignor,
                members=members,
                authorized_operations=authorized_operations(ctx, GROUP, group_id) if request.include_authorized_operations else NOT_REPORTED,
            )
        )
    return build(r.ConsumerGroupDescribeResponse, throttle_time=NO_THROTTLE, groups=tuple(out))

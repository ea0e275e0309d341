"""OffsetDelete (key 47), v0: forgets a group's committed offsets for some partitions. Unknown
groups get GROUP_ID_NOT_FOUND; partitions of a topic the group's live consumers subscribe to get
GROUP_SUBSCRIBED_TO_TOPIC (their offsets are kept), unknown partitions UNKNOWN_TOPIC_OR_PARTITION.
With ACLs, as Kafka checks: DELETE on the group (else GROUP_AUTHORIZATION_FAILED), READ on each
topic (else TOPIC_AUTHORIZATION_FAILED for its partitions)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..authorization import DELETE, GROUP, READ, TOPIC, allowed, allowed_names
from ..codec import NO_THROTTLE, build, error
from ..groups.group import GroupError
from ..groups.subscription import subscribed_topics
from ..registry import handles


@handles(47, "OffsetDelete", 0, 0)
async def offset_delete(ctx, request):
    r = ctx.response
    coordinator = ctx.services.coordinator
    topics = ctx.services.metadata.topics()
    if not allowed(ctx, DELETE, GROUP, request.group_id):
        return build(r.OffsetDeleteResponse, error_code=ErrorCode.group_authorization_failed, throttle_time=NO_THROTTLE, topics=())
    readable = allowed_names(ctx, READ, TOPIC, [t.name for t in request.topics])
    try:
        if not await coordinator.exists(request.group_id):
            return build(r.OffsetDeleteResponse, error_code=ErrorCode.group_id_not_found, throttle_time=NO_THROTTLE, topics=())
        group = await coordinator.group(request.group_id)
        subscribed = subscribed_topics(group) if group is not None else set()
        codes = {}
        deletable = []
        for t in request.topics:
            info = topics.get(t.name)
            for p in t.partitions:
                if t.name not in readable:
                    codes[(t.name, p.partition_index)] = ErrorCode.topic_authorization_failed
                elif info is None or not 0 <= p.partition_index < info.partitions:
                    codes[(t.name, p.partition_index)] = ErrorCode.unknown_topic_or_partition
                elif t.name in subscribed:
                    codes[(t.name, p.partition_index)] = ErrorCode.group_subscribed_to_topic
                else:
                    codes[(t.name, p.partition_index)] = ErrorCode.none
                    deletable.append((info.topic_id, p.partition_index))
        if deletable:
            await coordinator.delete_offsets(request.group_id, deletable)
    except GroupError as e:
        return build(r.OffsetDeleteResponse, error_code=error(e.code), throttle_time=NO_THROTTLE, topics=())
    out = tuple(
        build(r.OffsetDeleteResponseTopic, name=t.name, partitions=tuple(build(r.OffsetDeleteResponsePartition, partition_index=p.partition_index, error_code=codes[(t.name, p.partition_index)]) for p in t.partitions))
        for t in request.topics
    )
    return build(r.OffsetDeleteResponse, error_code=ErrorCode.none, throttle_time=NO_THROTTLE, topics=out)

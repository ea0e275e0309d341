"""OffsetCommit (key 8), v2-v9 (kio has no v0/v1 schemas, so those are not advertised).

Group-managed commits (generation >= 0 or a member id) must come from a current member of the
current generation (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID otherwise; commits
while the group waits for the leader's assignments get REBALANCE_IN_PROGRESS). "Simple" commits
(generation -1, no member: consumers using assign()) are accepted while the group has no members,
as Kafka does. Each partition gets its own answer: UNKNOWN_TOPIC_OR_PARTITION for partitions that
do not exist, OFFSET_METADATA_TOO_LARGE over 4096 bytes of metadata. Offsets are durable in the
metadata store before the answer. In a KIP-848 consumer group generation_id_or_member_epoch is
the member epoch: an old one gets STALE_MEMBER_EPOCH, an unknown member UNKNOWN_MEMBER_ID; a
partition the member no longer holds gets STALE_MEMBER_EPOCH too (KIP-1251), the others are
committed. retention_time (v2-v4) is accepted and ignored: offsets are kept until the group or the
topic is deleted. With ACLs: READ on the group (else every partition answers
GROUP_AUTHORIZATION_FAILED) and READ on each topic (else TOPIC_AUTHORIZATION_FAILED)."""

from __future__ import annotations

import time

from kio.schema.errors import ErrorCode

from metadata.model import CommittedOffset

from ..authorization import GROUP, READ, TOPIC, allowed, allowed_names
from ..codec import NO_THROTTLE, build, error
from ..groups.group import GroupError
from ..registry import handles

MAX_METADATA = 4096


@handles(8, "OffsetCommit", 2, 9)
async def offset_commit(ctx, request):
    r = ctx.response
    topics = ctx.services.metadata.topics()
    now = int(time.time() * 1000)
    codes: dict[tuple[str, int], int] = {}
    offsets = {}
    refused = None  # with ACLs: the error of every partition of a topic not to be committed to
    group_allowed = True
    if ctx.services.authorizer is not None:
        names = [t.name for t in request.topics]
        group_allowed = allowed(ctx, READ, GROUP, request.group_id)
        if not group_allowed:
            refused = dict.fromkeys(names, int(ErrorCode.group_authorization_failed))
        else:
            readable = allowed_names(ctx, READ, TOPIC, names)
            refused = {n: int(ErrorCode.topic_authorization_failed) for n in names if n not in readable}
    for t in request.topics:
        info = topics.get(t.name)
        for p in t.partitions:
            if refused and t.name in refused:
                codes[(t.name, p.partition_index)] = refused[t.name]
            elif info is None or not 0 <= p.partition_index < info.partitions:
                codes[(t.name, p.partition_index)] = int(ErrorCode.unknown_topic_or_partition)
            elif p.committed_metadata is not None and len(p.committed_metadata.encode()) > MAX_METADATA:
                codes[(t.name, p.partition_index)] = int(ErrorCode.offset_metadata_too_large)
            else:
                epoch = getattr(p, "committed_leader_epoch", -1)
                offsets[(info.topic_id, p.partition_index)] = CommittedOffset(p.committed_offset, epoch, p.committed_metadata, now)
                codes[(t.name, p.partition_index)] = 0
    try:
        answers = {}
        if group_allowed:
            answers = await ctx.services.coordinator.commit_offsets(
                request.group_id, request.generation_id_or_member_epoch, request.member_id, getattr(request, "group_instance_id", None), offsets
            )
    except GroupError as e:
        answers = dict.fromkeys(offsets, e.code)
    out = []
    for t in request.topics:
        info = topics.get(t.name)
        partitions = []
        for p in t.partitions:
            code = codes[(t.name, p.partition_index)] or answers[(info.topic_id, p.partition_index)]
            partitions.append(build(r.OffsetCommitResponsePartition, partition_index=p.partition_index, error_code=error(code)))
        out.append(build(r.OffsetCommitResponseTopic, name=t.name, partitions=tuple(partitions)))
    return build(r.OffsetCommitResponse, throttle_time=NO_THROTTLE, topics=tuple(out))

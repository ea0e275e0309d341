"""TxnOffsetCommit (key 28), v0-v4: offsets a transaction commits for a consumer group, sent to
the group's coordinator. From v3 (KIP-447) it names the member and its generation, checked as
OffsetCommit checks them (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID), so that a
zombie of a rebalanced-away member cannot commit. The offsets are kept with the transaction and
reach the group only when it commits (nothing of an aborted one). v5 belongs to transactions v2
and is not advertised. With ACLs: WRITE on the transactional id (else every partition answers
TRANSACTIONAL_ID_AUTHORIZATION_FAILED), READ on the group (else GROUP_AUTHORIZATION_FAILED) and
READ on each topic (else TOPIC_AUTHORIZATION_FAILED for its partitions)."""

from __future__ import annotations

import time

from kio.schema.errors import ErrorCode

from metadata.model import CommittedOffset

from ..authorization import GROUP, READ, TOPIC, TRANSACTIONAL_ID, WRITE, allowed, allowed_names
from ..codec import NO_THROTTLE, build, error
from ..groups.group import GroupError
from ..registry import handles
from ..transactions.coordinator import TransactionError, error_code

PRODUCER_FENCED_SINCE = 3  # KIP-588: older versions are answered INVALID_PRODUCER_EPOCH
MAX_METADATA = 4096


@handles(28, "TxnOffsetCommit", 0, 4)
async def txn_offset_commit(ctx, request):
    r = ctx.response
    s = ctx.services
    topics = s.metadata.topics()
    now = int(time.time() * 1000)
    codes: dict[tuple[str, int], ErrorCode] = {}
    offsets = {}
    refused: dict[str, ErrorCode] = {}  # with ACLs: the error of every partition of a refused topic
    if s.authorizer is not None:
        names = [t.name for t in request.topics]
        if not allowed(ctx, WRITE, TRANSACTIONAL_ID, request.transactional_id):
            refused = dict.fromkeys(names, ErrorCode.transactional_id_authorization_failed)
        elif not allowed(ctx, READ, GROUP, request.group_id):
            refused = dict.fromkeys(names, ErrorCode.group_authorization_failed)
        else:
            readable = allowed_names(ctx, READ, TOPIC, names)
            refused = {n: ErrorCode.topic_authorization_failed for n in names if n not in readable}
    for t in request.topics:
        info = topics.get(t.name)
        for p in t.partitions:
            if t.name in refused:
                codes[(t.name, p.partition_index)] = refused[t.name]
            elif info is None or not 0 <= p.partition_index < info.partitions:
                codes[(t.name, p.partition_index)] = ErrorCode.unknown_topic_or_partition
            elif p.committed_metadata is not None and len(p.committed_metadata.encode()) > MAX_METADATA:
                codes[(t.name, p.partition_index)] = ErrorCode.offset_metadata_too_large
            else:
                offsets[(info.topic_id, p.partition_index)] = CommittedOffset(p.committed_offset, getattr(p, "committed_leader_epoch", -1), p.committed_metadata, now)
    code = ErrorCode.none
    if offsets:
        try:
            member_code = await s.coordinator.check_commit(request.group_id, getattr(request, "generation_id", -1), getattr(request, "member_id", ""), getattr(request, "group_instance_id", None))
            if member_code:
                code = error(member_code)
            else:
                await s.transactions.commit_offsets(request.transactional_id, request.producer_id, request.producer_epoch, request.group_id, offsets)
        except GroupError as e:
            code = error(e.code)
        except TransactionError as e:
            code = error_code(e, ctx.api_version, PRODUCER_FENCED_SINCE)
    out = []
    for t in request.topics:
        partitions = tuple(build(r.TxnOffsetCommitResponsePartition, partition_index=p.partition_index, error_code=codes.get((t.name, p.partition_index), code)) for p in t.partitions)
        out.append(build(r.TxnOffsetCommitResponseTopic, name=t.name, partitions=partitions))
    return build(r.TxnOffsetCommitResponse, throttle_time=NO_THROTTLE, topics=tuple(out))

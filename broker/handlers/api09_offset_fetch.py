"""OffsetFetch (key 9), v1-v9 (kio has no v0 schema); v8+ asks for several groups at once.

Offsets are read from the metadata store (never a cache), so a new coordinator returns every
offset committed through the old one. topics=None (v2+) returns every committed offset of the
group (of topics that still exist); a partition without a commit answers offset -1. With
require_stable (v7+, KIP-447), a partition for which an unfinished transaction holds offsets
(TxnOffsetCommit) answers UNSTABLE_OFFSET_COMMIT, and the client asks again. v9 members of a
KIP-848 group name themselves and their epoch: UNKNOWN_MEMBER_ID / STALE_MEMBER_EPOCH otherwise. Errors are per group
(NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE); v1 has only per-partition error codes, so they go
there. With ACLs: DESCRIBE on the group (else GROUP_AUTHORIZATION_FAILED), and on each topic: a
named one answers TOPIC_AUTHORIZATION_FAILED, and the group's other topics are left out of an
all-topics answer."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..authorization import DESCRIBE, GROUP, TOPIC, allowed, allowed_names
from ..codec import NO_THROTTLE, build, error, has_field
from ..groups.group import GroupError
from ..registry import handles
from ..transactions.coordinator import TransactionError


async def _fetch_group(ctx, group_id: str, wanted, cls, member: tuple[str | None, int] = (None, -1), require_stable: bool = False) -> tuple[int, list]:
    """(group error code, topics) for one group; `cls` names the version's (topic, partition) classes."""
    topic_cls, partition_cls = cls
    store = ctx.services.metadata
    unstable: set = set()
    try:
        if not allowed(ctx, DESCRIBE, GROUP, group_id):
            raise GroupError(int(ErrorCode.group_authorization_failed))
        committed = await ctx.services.coordinator.fetch_offsets(group_id, *member)
        code = 0
        if require_stable:
            unstable = await ctx.services.transactions.pending_offsets(group_id)
    except GroupError as e:
        committed, code = {}, e.code
    except TransactionError as e:
        committed, code = {}, e.code
    if wanted is None:
        by_topic: dict[str, list[int]] = {}
        for (topic_id, partition) in sorted(committed, key=lambda tp: (str(tp[0]), tp[1])):
            info = store.topic_by_id(topic_id)
            if info is not None:
                by_topic.setdefault(info.name, []).append(partition)
        wanted = sorted(by_topic.items())
        if ctx.services.authorizer is not None:
            described = allowed_names(ctx, DESCRIBE, TOPIC, by_topic)
            wanted = [(name, partitions) for name, partitions in wanted if name in described]
    described = allowed_names(ctx, DESCRIBE, TOPIC, [name for name, _ in wanted]) if ctx.services.authorizer is not None else None
    topics = store.topics()
    out = []
    for name, partitions in wanted:
        info = topics.get(name)
        parts = []
        for p in partitions:
            if described is not None and name not in described:
                parts.append(build(partition_cls, partition_index=p, committed_offset=-1, committed_leader_epoch=-1, metadata="", error_code=ErrorCode.topic_authorization_failed))
                continue
            if unstable and info is not None and (info.topic_id, p) in unstable:
                parts.append(build(partition_cls, partition_index=p, committed_offset=-1, committed_leader_epoch=-1, metadata="", error_code=ErrorCode.unstable_offset_commit))
                continue
            c = committed.get((info.topic_id, p)) if info is not None else None
            parts.append(
                build(
                    partition_cls,
                    partition_index=p,
                    committed_offset=c.offset if c else -1,
                    committed_leader_epoch=c.leader_epoch if c else -1,
                    metadata=(c.metadata if c else "") or "",
                    error_code=error(code) if ctx.api_version < 2 else ErrorCode.none,  # v1: no group-level code
                )
            )
        out.append(build(topic_cls, name=name, partitions=tuple(parts)))
    return code, out


@handles(9, "OffsetFetch", 1, 9)
async def offset_fetch(ctx, request):
    r = ctx.response
    if has_field(request, "groups"):
        groups = []
        for g in request.groups:
            wanted = None if g.topics is None else [(t.name, list(t.partition_indexes)) for t in g.topics]
            member = (getattr(g, "member_id", None), getattr(g, "member_epoch", -1))
            code, topics = await _fetch_group(ctx, g.group_id, wanted, (r.OffsetFetchResponseTopics, r.OffsetFetchResponsePartitions), member, request.require_stable)
            groups.append(build(r.OffsetFetchResponseGroup, group_id=g.group_id, topics=tuple(topics), error_code=error(code)))
        return build(r.OffsetFetchResponse, throttle_time=NO_THROTTLE, groups=tuple(groups))
    wanted = None if request.topics is None else [(t.name, list(t.partition_indexes)) for t in request.topics]
    code, topics = await _fetch_group(ctx, request.group_id, wanted, (r.OffsetFetchResponseTopic, r.OffsetFetchResponsePartition), require_stable=getattr(request, "require_stable", False))
    return build(r.OffsetFetchResponse, throttle_time=NO_THROTTLE, topics=tuple(topics), error_code=error(code))

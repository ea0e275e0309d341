"""OffsetForLeaderEpoch (key 23), v2-v4 (kio has no v0-v1): how clients check their position
after a leader change (KIP-320). neve has no leaders and one leader epoch, 0, starting at offset
0 of every partition (Metadata and Fetch answer epoch 0). So, as Kafka's leader answers from its
epoch cache: epoch 0 ends at the high watermark (answered as epoch 0); any other epoch (-1, or a
higher one neve never had) is unknown: epoch -1, end offset -1. A current_leader_epoch above 0
answers UNKNOWN_LEADER_EPOCH (the client knows a newer epoch than the broker), -1 skips the
check. replica_id (v3+) is -1 from consumers and -2 from debugging tools; a follower id would be
answered the same way (neve has no followers). With ACLs: DESCRIBE on the topic (or CLUSTER_ACTION
on the cluster, a broker's right), else TOPIC_AUTHORIZATION_FAILED.

Epoch 0 ends at the high watermark as the metadata store holds it, not as this broker's view shows
it: a view that lags (its watch stalled on a paused etcd member) would answer an end below records
the client fetched through another broker, which the client takes for a truncated log and seeks
back to, dropping the records it had fetched and not yet handed to the application (librdkafka
purges its fetch queue on that seek: the chaos harness's poll-skip under etcd pauses). The store
unreadable, the answer is the retriable OFFSET_NOT_AVAILABLE (clients validate again)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from metadata.store import MetadataUnavailable

from ..authorization import CLUSTER, CLUSTER_ACTION, DESCRIBE, TOPIC, allowed, allowed_names
from ..codec import NO_THROTTLE, build
from ..registry import handles

EPOCH = 0


@handles(23, "OffsetForLeaderEpoch", 2, 4)
async def offset_for_leader_epoch(ctx, request):
    r = ctx.response
    store = ctx.services.metadata
    topics = store.topics()
    names = [t.topic for t in request.topics]
    described = set(names) if allowed(ctx, CLUSTER_ACTION, CLUSTER) else allowed_names(ctx, DESCRIBE, TOPIC, names)
    asked = {
        (info.topic_id, p.partition)
        for t in request.topics
        if t.topic in described and (info := topics.get(t.topic)) is not None
        for p in t.partitions
        if 0 <= p.partition < info.partitions and p.current_leader_epoch <= EPOCH and p.leader_epoch == EPOCH
    }
    durable: dict | None = {}
    if asked:
        try:
            durable = await store.durable_high_watermarks(asked)
        except MetadataUnavailable:
            durable = None
    out = []
    for topic in request.topics:
        info = topics.get(topic.topic)
        parts = []
        for p in topic.partitions:
            code, epoch, end = ErrorCode.none, -1, -1
            if topic.topic not in described:
                code = ErrorCode.topic_authorization_failed
            elif info is None or not 0 <= p.partition < info.partitions:
                code = ErrorCode.unknown_topic_or_partition
            elif p.current_leader_epoch > EPOCH:
                code = ErrorCode.unknown_leader_epoch
            elif p.leader_epoch == EPOCH:
                if durable is None:
                    code = ErrorCode.offset_not_available
                else:
                    tp = (info.topic_id, p.partition)
                    epoch, end = EPOCH, max(store.high_watermark(*tp), durable.get(tp, 0))
            parts.append(build(r.EpochEndOffset, error_code=code, partition=p.partition, leader_epoch=epoch, end_offset=end))
        out.append(build(r.OffsetForLeaderTopicResult, topic=topic.topic, partitions=tuple(parts)))
    return build(r.OffsetForLeaderEpochResponse, throttle_time=NO_THROTTLE, topics=tuple(out))

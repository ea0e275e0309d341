"""DescribeLogDirs (key 35), v1-v4 (kio has no v0), answered honestly for a diskless broker: one
"log dir" named by the object store URL (query string dropped) that holds every partition, since
any broker serves any partition from it. A partition's size is the bytes of its index entries
from the log start on (read from the in-memory offset index; hidden data before the log start
is not counted), offset lag 0, never a future replica. Total and usable bytes are -1: an object
store has no meaningful capacity. Topics that do not exist are left out, as in Kafka. With ACLs:
DESCRIBE on the cluster, else CLUSTER_AUTHORIZATION_FAILED and no results."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..authorization import CLUSTER, DESCRIBE, allowed
from ..codec import NO_THROTTLE, build
from ..registry import handles

PAGE = 4096


def partition_bytes(store, topic_id, partition: int) -> int:
    total = 0
    offset = store.log_start_offset(topic_id, partition)
    while batch := store.entries(topic_id, partition, offset, max_entries=PAGE):
        total += sum(e.size for e in batch)
        offset = batch[-1].last_offset + 1
    return total


@handles(35, "DescribeLogDirs", 1, 4)
async def describe_log_dirs(ctx, request):
    r = ctx.response
    s = ctx.services
    store = s.metadata
    if not allowed(ctx, DESCRIBE, CLUSTER):
        return build(r.DescribeLogDirsResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.cluster_authorization_failed, results=())
    topics = store.topics()
    if request.topics is None:
        wanted = [(info, range(info.partitions)) for _, info in sorted(topics.items())]
    else:
        wanted = [(topics[t.topic], t.partitions) for t in request.topics if t.topic in topics]
    out = []
    for info, partitions in wanted:
        parts = tuple(
            build(r.DescribeLogDirsPartition, partition_index=p, partition_size=partition_bytes(store, info.topic_id, p), offset_lag=0, is_future_key=False)
            for p in partitions
            if 0 <= p < info.partitions
        )
        out.append(build(r.DescribeLogDirsTopic, name=info.name, partitions=parts))
    result = build(r.DescribeLogDirsResult, error_code=ErrorCode.none, log_dir=s.storage or "object-store", topics=tuple(out), total_bytes=-1, usable_bytes=-1)
    return build(r.DescribeLogDirsResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, results=(result,))

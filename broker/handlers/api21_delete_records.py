"""DeleteRecords (key 21), v0-v2: move each partition's log start offset to the given offset (-1:
the high watermark) and answer the new low watermark. The Kafka view hides what lies before it;
the data itself is kept (object storage, the Iceberg table). An offset below the current log
start changes nothing; one above the high watermark (or below -1) answers OFFSET_OUT_OF_RANGE;
an unknown topic or partition UNKNOWN_TOPIC_OR_PARTITION. The answer comes once the new log
start is durable in the metadata store; the request timeout is not needed. With ACLs: DELETE on
the topic, else TOPIC_AUTHORIZATION_FAILED."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from metadata.store import MetadataError

from ..authorization import DELETE, TOPIC, allowed_names
from ..codec import NO_THROTTLE, build, error
from ..registry import handles

HIGH_WATERMARK = -1


async def _delete(store, info, partition: int, offset: int) -> tuple[ErrorCode, int]:
    if info is None or not 0 <= partition < info.partitions:
        return ErrorCode.unknown_topic_or_partition, -1
    hw = store.high_watermark(info.topic_id, partition)
    target = hw if offset == HIGH_WATERMARK else offset
    if target < 0 or target > hw:
        return ErrorCode.offset_out_of_range, -1
    try:
        return ErrorCode.none, await store.advance_log_start(info.topic_id, partition, target)
    except MetadataError as e:
        return error(e.error_code), -1


@handles(21, "DeleteRecords", 0, 2)
async def delete_records(ctx, request):
    r = ctx.response
    store = ctx.services.metadata
    topics = store.topics()
    deletable = allowed_names(ctx, DELETE, TOPIC, [t.name for t in request.topics])
    out = []
    for topic in request.topics:
        info = topics.get(topic.name)
        parts = []
        for p in topic.partitions:
            if topic.name not in deletable:
                code, low = ErrorCode.topic_authorization_failed, -1
            else:
                code, low = await _delete(store, info, p.partition_index, p.offset)
            parts.append(build(r.DeleteRecordsPartitionResult, partition_index=p.partition_index, low_watermark=low, error_code=code))
        out.append(build(r.DeleteRecordsTopicResult, name=topic.name, partitions=tuple(parts)))
    return build(r.DeleteRecordsResponse, throttle_time=NO_THROTTLE, topics=tuple(out))

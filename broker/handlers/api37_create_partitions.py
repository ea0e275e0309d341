"""CreatePartitions (key 37), v0-v3: grow a topic to `count` partitions. New partitions start
empty at offset 0 and are served by every broker at once (no assignment: manual assignments are
accepted and ignored, as CreateTopics does). A count not above the current one answers
INVALID_PARTITIONS, an unknown topic UNKNOWN_TOPIC_OR_PARTITION, a topic named twice
INVALID_REQUEST. validate_only checks without growing. With ACLs: ALTER on the topic, else
TOPIC_AUTHORIZATION_FAILED."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from metadata.store import MetadataError

from ..authorization import ALTER, TOPIC, allowed
from ..codec import NO_THROTTLE, build, error
from ..registry import handles

MAX_PARTITIONS = 100_000  # as CreateTopics


async def _grow(store, name: str, count: int, validate_only: bool) -> tuple[ErrorCode, str | None]:
    info = store.topics().get(name)
    if info is None:
        return ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist."
    if count == info.partitions:
        return ErrorCode.invalid_partitions, f"Topic already has {count} partitions."
    if count < info.partitions:
        return ErrorCode.invalid_partitions, f"Topic currently has {info.partitions} partitions, which is higher than the requested {count}."
    if count > MAX_PARTITIONS:
        return ErrorCode.invalid_partitions, f"at most {MAX_PARTITIONS} partitions per topic"
    if validate_only:
        return ErrorCode.none, None
    try:
        await store.update_topic(name, partitions=count)
    except MetadataError as e:
        return error(e.error_code), str(e) or type(e).__name__
    return ErrorCode.none, None


@handles(37, "CreatePartitions", 0, 3)
async def create_partitions(ctx, request):
    r = ctx.response
    store = ctx.services.metadata
    names = [t.name for t in request.topics]
    results = []
    for topic in request.topics:
        if names.count(topic.name) > 1:
            code, message = ErrorCode.invalid_request, "Duplicate topic in request."
        elif not allowed(ctx, ALTER, TOPIC, topic.name):
            code, message = ErrorCode.topic_authorization_failed, None
        else:
            code, message = await _grow(store, topic.name, topic.count, request.validate_only)
        results.append(build(r.CreatePartitionsTopicResult, name=topic.name, error_code=code, error_message=message))
    return build(r.CreatePartitionsResponse, throttle_time=NO_THROTTLE, results=tuple(results))

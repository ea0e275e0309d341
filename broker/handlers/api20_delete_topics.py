"""DeleteTopics (key 20), v1-v6; v6 may name topics by id. With ACLs: DELETE on the topic, else
TOPIC_AUTHORIZATION_FAILED (whether it exists or not); a topic named by id that the principal may
not DESCRIBE answers TOPIC_AUTHORIZATION_FAILED without its name, as Kafka answers."""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode

from metadata.store import MetadataError

from ..authorization import DELETE, DESCRIBE, TOPIC, allowed
from ..codec import NO_THROTTLE, build, error, has_field
from ..registry import handles

ZERO_UUID = uuid.UUID(int=0)


@handles(20, "DeleteTopics", 1, 6)
async def delete_topics(ctx, request):
    r = ctx.response
    store = ctx.services.metadata
    if has_field(request, "topic_names"):
        wanted = [(name, None) for name in request.topic_names]
    else:
        wanted = [(t.name, t.topic_id) for t in request.topics]
    results = []
    for name, topic_id in wanted:
        if name is None and topic_id not in (None, ZERO_UUID):
            info = store.topic_by_id(topic_id)
            if info is None:
                results.append(build(r.DeletableTopicResult, name=None, topic_id=topic_id, error_code=ErrorCode.unknown_topic_id, error_message="unknown topic id"))
                continue
            name = info.name
            if not allowed(ctx, DESCRIBE, TOPIC, name):
                results.append(build(r.DeletableTopicResult, name=None, topic_id=topic_id, error_code=ErrorCode.topic_authorization_failed, error_message=None))
                continue
        if name is not None and not allowed(ctx, DELETE, TOPIC, name):
            results.append(build(r.DeletableTopicResult, name=name, topic_id=topic_id or ZERO_UUID, error_code=ErrorCode.topic_authorization_failed, error_message=None))
            continue
        try:
            info = await store.delete_topic(name)
            results.append(build(r.DeletableTopicResult, name=name, topic_id=info.topic_id, error_code=ErrorCode.none, error_message=None))
        except MetadataError as e:
            results.append(build(r.DeletableTopicResult, name=name, topic_id=topic_id or ZERO_UUID, error_code=error(e.error_code), error_message=str(e) or None))
    return build(r.DeleteTopicsResponse, throttle_time=NO_THROTTLE, responses=tuple(results))

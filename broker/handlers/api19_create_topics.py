"""CreateTopics (key 19), v2-v7. Replication factor and assignments are accepted and ignored: the
one copy of the data lives on object storage. validate_only checks without creating."""

from __future__ import annotations

import datetime
import uuid

from kio.schema.errors import ErrorCode

from ..codec import build, error
from ..registry import handles
from ..topics import INVALID_PARTITIONS, INVALID_TOPIC_EXCEPTION, create_topic_checked, topic_name_error

NO_THROTTLE = datetime.timedelta(0)
ZERO_UUID = uuid.UUID(int=0)


@handles(19, "CreateTopics", 2, 7)
async def create_topics(ctx, request):
    r = ctx.response
    s = ctx.services
    results = []
    seen: set[str] = set()
    for topic in request.topics:
        partitions = topic.num_partitions if topic.num_partitions != -1 else s.settings.default_partitions
        configs = {c.name: c.value for c in topic.configs if c.value is not None}
        message = None
        info = None
        if topic.name in seen:
            code, message = int(ErrorCode.invalid_request), "topic named twice in one request"
        elif (message := topic_name_error(topic.name)) is not None:
            code = INVALID_TOPIC_EXCEPTION
        elif partitions <= 0:
            code, message = INVALID_PARTITIONS, f"num_partitions {partitions} must be positive"
        elif request.validate_only:
            code = int(ErrorCode.topic_already_exists) if topic.name in s.metadata.topics() else 0
        else:
            code, info = await create_topic_checked(s, topic.name, partitions, configs)
        seen.add(topic.name)
        results.append(
            build(
                r.CreatableTopicResult,
                name=topic.name,
                topic_id=info.topic_id if info else ZERO_UUID,
                error_code=error(code),
                error_message=message if code else None,
                topic_config_error_code=ErrorCode.none,
                num_partitions=partitions if code == 0 else -1,
                replication_factor=1 if code == 0 else -1,
                configs=(),
            )
        )
    return build(r.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=tuple(results))

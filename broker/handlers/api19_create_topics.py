"""CreateTopics (key 19), v2-v7. Replication factor and replicas are accepted and ignored: the
one copy of the data lives on object storage. A manual assignment makes one partition per
assignment, as in Kafka: its partition indexes must be 0..n-1 each once (else
INVALID_REPLICA_ASSIGNMENT), and num_partitions and replication_factor -1 (else INVALID_REQUEST);
the brokers it names are not looked at. Configs are validated against the known topic
configs (broker/topic_configs.py): an unknown name or invalid value answers INVALID_CONFIG. A
topic whose Iceberg table would be another topic's (broker/topics.py) is refused:
INVALID_TOPIC_EXCEPTION for its name, INVALID_CONFIG for its neve.iceberg.table. v5+
answers with the created topic's configs, as DescribeConfigs would. validate_only checks without
creating. With ACLs: CREATE on the cluster or on the topic, else TOPIC_AUTHORIZATION_FAILED; the
created topic's configs are answered only to a principal that may DESCRIBE_CONFIGS it (else its
topic_config_error_code is TOPIC_AUTHORIZATION_FAILED)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ..authorization import CLUSTER, CREATE, DESCRIBE_CONFIGS, TOPIC, allowed, allowed_names
from ..codec import NO_THROTTLE, build, error
from ..registry import handles
from ..topic_configs import InvalidConfig, check, describe
from ..topics import create_topic_checked, table_refusal, topic_name_error

ZERO_UUID = uuid.UUID(int=0)


@handles(19, "CreateTopics", 2, 7)
async def create_topics(ctx, request):
    r = ctx.response
    s = ctx.services
    results = []
    seen: set[str] = set()
    validated: dict[str, _Checked] = {}  # validate_only: the topics this request would have made
    names = [t.name for t in request.topics]
    creatable = described = None  # with ACLs, the topics the principal may create, and see the configs of
    if s.authorizer is not None:
        creatable = set(names) if allowed(ctx, CREATE, CLUSTER) else allowed_names(ctx, CREATE, TOPIC, names)
        described = allowed_names(ctx, DESCRIBE_CONFIGS, TOPIC, names)
    for topic in request.topics:
        assigned = _assigned_partitions(topic)
        if isinstance(assigned, int):
            partitions = assigned
        elif topic.num_partitions != -1:
            partitions = topic.num_partitions
        else:
            partitions = s.settings.default_partitions
        message = None
        info = None
        try:
            configs = check({c.name: c.value for c in topic.configs if c.value is not None})
        except InvalidConfig as e:
            configs, config_error = {}, str(e)
        else:
            config_error = None
        if topic.name in seen:
            code, message = int(ErrorCode.invalid_request), "topic named twice in one request"
        elif creatable is not None and topic.name not in creatable:
            code, message = int(ErrorCode.topic_authorization_failed), "CREATE on the cluster or the topic is needed"
        elif (message := topic_name_error(topic.name)) is not None:
            code = ErrorCode.invalid_topic_exception
        elif isinstance(assigned, tuple):
            code, message = assigned
        elif partitions <= 0:
            code, message = ErrorCode.invalid_partitions, f"num_partitions {partitions} must be positive"
        elif config_error is not None:
            code, message = ErrorCode.invalid_config, config_error
        elif topic.name in s.metadata.topics():
            code, message = int(ErrorCode.topic_already_exists), f"Topic '{topic.name}' already exists."
        elif (refusal := table_refusal(topic.name, configs, {**s.metadata.topics(), **validated})) is not None:
            code, message = refusal
        elif request.validate_only:
            code = 0
            validated[topic.name] = _Checked(configs)
        else:
            code, message, info = await create_topic_checked(s, topic.name, partitions, configs)
        seen.add(topic.name)
        hidden = described is not None and topic.name not in described
        results.append(
            build(
                r.CreatableTopicResult,
                name=topic.name,
                topic_id=info.topic_id if info else ZERO_UUID,
                error_code=error(code),
                error_message=message if code else None,
                topic_config_error_code=ErrorCode.topic_authorization_failed if code == 0 and hidden else ErrorCode.none,
                num_partitions=partitions if code == 0 else -1,
                replication_factor=1 if code == 0 else -1,
                configs=() if hidden else _described(r, info, s.settings.max_message_bytes),
            )
        )
    return build(r.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=tuple(results))


def _assigned_partitions(topic) -> int | tuple[ErrorCode, str] | None:
    """A manual assignment's partition count, or its refusal (error code, Kafka's message); None
    without one."""
    if not topic.assignments:
        return None
    if topic.replication_factor != -1:
        return ErrorCode.invalid_request, "A manual partition assignment was specified, but replication factor was not set to -1."
    if topic.num_partitions != -1:
        return ErrorCode.invalid_request, "A manual partition assignment was specified, but numPartitions was not set to -1."
    indexes: set[int] = set()
    for assignment in topic.assignments:
        if assignment.partition_index in indexes:
            return ErrorCode.invalid_replica_assignment, f"Found multiple manual partition assignments for partition {assignment.partition_index}"
        indexes.add(assignment.partition_index)
    if indexes != set(range(len(indexes))):
        return ErrorCode.invalid_replica_assignment, "partitions should be a consecutive 0-based integer sequence"
    return len(indexes)


@dataclass(frozen=True, slots=True)
class _Checked:
    configs: dict[str, str]


def _described(r, info, max_message_bytes: int) -> tuple:
    if info is None or not hasattr(r, "CreatableTopicConfigs"):
        return ()
    return tuple(
        build(r.CreatableTopicConfigs, name=d.name, value=d.value, read_only=d.read_only, config_source=int(d.source), is_sensitive=False)
        for d in describe(info.configs, max_message_bytes)
    )

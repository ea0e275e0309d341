"""DescribeConfigs (key 32), v1-v4 (kio has no v0).

Topics (resource type 2): every config in broker/topic_configs.py with its effective value;
source DYNAMIC_TOPIC_CONFIG when set on the topic, else DEFAULT_CONFIG (or STATIC_BROKER_CONFIG
for max.message.bytes when the node configures message.max.bytes). Never sensitive; read-only
only where neve supports a single value. Synonyms (include_synonyms) list the topic's own value
then the broker default Kafka would fall back to; documentation (v3+, include_documentation)
says whether neve honours the config. Brokers (type 4, name "" or this node's id): the node's
configuration that Kafka clients ask about, all read-only. An unknown topic answers
UNKNOWN_TOPIC_OR_PARTITION; other resource types INVALID_REQUEST. With ACLs: DESCRIBE_CONFIGS on
the topic (else TOPIC_AUTHORIZATION_FAILED) or, for a broker, on the cluster (else
CLUSTER_AUTHORIZATION_FAILED)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..authorization import CLUSTER, DESCRIBE_CONFIGS, TOPIC, allowed
from ..codec import NO_THROTTLE, build, has_field
from ..config import BrokerConfig
from ..registry import handles
from ..topic_configs import BROKER_RESOURCE, TOPIC_RESOURCE, ConfigSource, ConfigType, describe

_DEFAULTS = BrokerConfig()


def broker_configs(s) -> list[tuple[str, str | None, ConfigSource, ConfigType, str]]:
    """(name, value, source, type, documentation) of the broker configs neve reports."""
    settings = s.settings

    def source(field: str) -> ConfigSource:
        return ConfigSource.DEFAULT if getattr(settings, field) == getattr(_DEFAULTS, field) else ConfigSource.STATIC_BROKER

    return [
        ("broker.id", str(settings.node_id), ConfigSource.STATIC_BROKER, ConfigType.INT, "This broker's node id (neve: broker.node_id)."),
        ("broker.rack", settings.zone or None, source("zone"), ConfigType.STRING, "This broker's zone (neve: broker.zone)."),
        ("message.max.bytes", str(settings.max_message_bytes), source("max_message_bytes"), ConfigType.INT, "Largest records of one produce partition (neve: broker.max_message_bytes)."),
        ("num.partitions", str(settings.default_partitions), source("default_partitions"), ConfigType.INT, "Partitions of auto-created topics (neve: broker.default_partitions)."),
        ("auto.create.topics.enable", str(settings.auto_create_topics).lower(), source("auto_create_topics"), ConfigType.BOOLEAN, "Auto-creation of topics on Metadata (neve: broker.auto_create_topics)."),
        ("socket.request.max.bytes", str(settings.max_frame_bytes), source("max_frame_bytes"), ConfigType.INT, "Largest request accepted (neve: broker.max_frame_bytes)."),
        ("fetch.max.bytes", str(settings.fetch_max_bytes), source("fetch_max_bytes"), ConfigType.INT, "Upper bound of one Fetch response (neve: broker.fetch_max_bytes)."),
        ("default.replication.factor", "1", ConfigSource.DEFAULT, ConfigType.INT, "One copy of the data, on object storage."),
        ("log.retention.ms", "604800000", ConfigSource.DEFAULT, ConfigType.LONG, "Default retention.ms of topics."),
        ("log.retention.bytes", "-1", ConfigSource.DEFAULT, ConfigType.LONG, "Default retention.bytes of topics."),
        ("log.cleanup.policy", "delete", ConfigSource.DEFAULT, ConfigType.LIST, "Default cleanup.policy of topics."),
        ("log.message.timestamp.type", "CreateTime", ConfigSource.DEFAULT, ConfigType.STRING, "Records keep the producer's CreateTime."),
    ]


def _entry(r, request, version_has_docs: bool, name, value, source, read_only, ctype, doc, synonyms):
    include_synonyms = getattr(request, "include_synonyms", False)
    return build(
        r.DescribeConfigsResourceResult,
        name=name,
        value=value,
        read_only=read_only,
        config_source=int(source),
        is_sensitive=False,
        synonyms=tuple(build(r.DescribeConfigsSynonym, name=n, value=v, source=int(src)) for n, v, src in synonyms) if include_synonyms else (),
        config_type=int(ctype),
        documentation=doc if version_has_docs and getattr(request, "include_documentation", False) else None,
    )


@handles(32, "DescribeConfigs", 1, 4)
async def describe_configs(ctx, request):
    r = ctx.response
    s = ctx.services
    topics = s.metadata.topics()
    docs = has_field(r.DescribeConfigsResourceResult, "documentation")
    results = []
    for res in request.resources:
        code, message, configs = ErrorCode.none, None, []
        names = res.configuration_keys  # None or empty: all
        if res.resource_type == TOPIC_RESOURCE:
            info = topics.get(res.resource_name)
            if not allowed(ctx, DESCRIBE_CONFIGS, TOPIC, res.resource_name):
                code, message = ErrorCode.topic_authorization_failed, None
            elif info is None:
                code, message = ErrorCode.unknown_topic_or_partition, f"The topic '{res.resource_name}' does not exist."
            else:
                for d in describe(info.configs, s.settings.max_message_bytes, names or None):
                    configs.append(_entry(r, request, docs, d.name, d.value, d.source, d.read_only, d.type, d.doc, d.synonyms))
        elif res.resource_type == BROKER_RESOURCE:
            if not allowed(ctx, DESCRIBE_CONFIGS, CLUSTER):
                code, message = ErrorCode.cluster_authorization_failed, None
            elif res.resource_name not in ("", str(s.settings.node_id)):
                code, message = ErrorCode.invalid_request, f"Unexpected broker id, expected {s.settings.node_id} or empty string, but received {res.resource_name}"
            else:
                for name, value, source, ctype, doc in broker_configs(s):
                    if not names or name in names:
                        configs.append(_entry(r, request, docs, name, value, source, True, ctype, doc, ((name, value, source),)))
        else:
            code, message = ErrorCode.invalid_request, f"Unsupported resource type {res.resource_type}"
        results.append(build(r.DescribeConfigsResult, error_code=code, error_message=message, resource_type=res.resource_type, resource_name=res.resource_name, configs=tuple(configs)))
    return build(r.DescribeConfigsResponse, throttle_time=NO_THROTTLE, results=tuple(results))

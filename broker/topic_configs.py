"""The topic configs neve knows, declared once: name, type, default, validation, documentation and
whether neve honours them. CreateTopics, AlterConfigs and IncrementalAlterConfigs validate with
`check` (the two that name a table or its partitions with table/names.py's rules, and a table
that is another topic's is refused); DescribeConfigs and CreateTopics (v5+) describe with `describe`; retention reads
`retention_policy`.

Names and defaults are Kafka's (3.9), so stock tools and frameworks (Kafka Streams, Connect) that
create topics with configs work unchanged. A config Kafka knows but that has no meaning for a
diskless, leaderless broker (segments, flushing, replication) is accepted and stored, and its
documentation says it has no effect. A config whose only honest value is neve's behaviour
(message.timestamp.type) is read-only: that value is accepted, any other is INVALID_CONFIG.
Unknown names are INVALID_CONFIG, as in Kafka."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from metadata.store import MetadataError
from table import names
from wal.batch_builder import COMPRESSION_TYPES

from .config import BrokerConfig


class ConfigType(enum.IntEnum):
    """Kafka's DescribeConfigs config_type."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    DOUBLE = 6
    LIST = 7


class ConfigSource(enum.IntEnum):
    """Kafka's DescribeConfigs config_source (the ones neve answers with)."""

    TOPIC = 1  # DYNAMIC_TOPIC_CONFIG: set on the topic
    STATIC_BROKER = 4  # STATIC_BROKER_CONFIG: from the node's configuration
    DEFAULT = 5  # DEFAULT_CONFIG


class InvalidConfig(ValueError):
    """Answered as INVALID_CONFIG (40) with this message."""


LONG_MAX = 2**63 - 1
_RANGES = {ConfigType.INT: (-(2**31), 2**31 - 1), ConfigType.LONG: (-(2**63), LONG_MAX)}
_DEFAULT_SETTINGS = BrokerConfig()
NO_EFFECT = " Accepted and stored; no effect in neve (no broker disks, no replicas)."


@dataclass(frozen=True, slots=True)
class TopicConfig:
    name: str
    type: ConfigType
    default: str
    doc: str
    broker_synonym: str | None = None  # the broker config that supplies the default in Kafka
    minimum: int | None = None
    choices: tuple[str, ...] | None = None  # allowed values (each item, for lists)
    read_only: bool = False
    syntax: Callable[[str], object] | None = None  # raises ValueError saying what is wrong with a value

    def parse(self, value: str | None) -> str:
        """The value as stored, or InvalidConfig naming what is wrong."""
        if value is None:
            raise InvalidConfig(f"Null value not supported for topic configs: {self.name}")
        v = value.strip()
        if self.type in _RANGES:
            try:
                n = int(v)
            except ValueError:
                raise InvalidConfig(f"Invalid value {value} for configuration {self.name}: Not a number of type {self.type.name}") from None
            low, high = _RANGES[self.type]
            if not low <= n <= high:
                raise InvalidConfig(f"Invalid value {value} for configuration {self.name}: out of range for type {self.type.name}")
            if self.minimum is not None and n < self.minimum:
                raise InvalidConfig(f"Invalid value {value} for configuration {self.name}: Value must be at least {self.minimum}")
            v = str(n)
        elif self.type == ConfigType.DOUBLE:
            try:
                d = float(v)
            except ValueError:
                raise InvalidConfig(f"Invalid value {value} for configuration {self.name}: Not a number of type DOUBLE") from None
            if not 0 <= d <= 1:
                raise InvalidConfig(f"Invalid value {value} for configuration {self.name}: Value must be between 0 and 1")
        elif self.type == ConfigType.BOOLEAN:
            if v.lower() not in ("true", "false"):
                raise InvalidConfig(f"Invalid value {value} for configuration {self.name}: Expected value to be either true or false")
            v = v.lower()
        elif self.type == ConfigType.LIST:
            items = [i.strip() for i in v.split(",") if i.strip()]
            if self.choices is not None:
                for item in items:
                    if item not in self.choices:
                        raise InvalidConfig(f"Invalid value {item} for configuration {self.name}: String must be one of: {', '.join(self.choices)}")
            v = ",".join(items)
        if self.type != ConfigType.LIST and self.choices is not None and v not in self.choices:
            why = " (the only value neve supports)" if self.read_only else ""
            raise InvalidConfig(f"Invalid value {value} for configuration {self.name}: String must be one of: {', '.join(self.choices)}{why}")
        if self.syntax is not None and v:
            try:
                self.syntax(v)
            except ValueError as e:
                raise InvalidConfig(f"Invalid value {value} for configuration {self.name}: {str(e).removeprefix(f'{self.name}: ')}") from None
        return v


def _c(name, type_, default, doc, **kw) -> TopicConfig:
    return TopicConfig(name, type_, default, doc, **kw)


T = ConfigType
MAX_MESSAGE_BYTES = "max.message.bytes"

TOPIC_CONFIGS: dict[str, TopicConfig] = {
    c.name: c
    for c in (
        # honoured by neve
        _c("retention.ms", T.LONG, "604800000", "How long records are kept in the Kafka view (-1: forever). Retention advances the log start offset by whole index entries whose newest timestamp is older than this; the data stays in object storage and the Iceberg table.", broker_synonym="log.retention.ms", minimum=-1),
        _c("retention.bytes", T.LONG, "-1", "The most bytes a partition keeps in the Kafka view before the oldest index entries are hidden (-1: no limit); as in Kafka, whole entries are hidden only while what remains is at least this size.", broker_synonym="log.retention.bytes"),
        _c("cleanup.policy", T.LIST, "delete", "'delete' applies retention.ms and retention.bytes. 'compact' keeps the latest record of each key: the topic's Iceberg table holds one row per live key (an upsert table: each compaction cycle deletes the rows its records supersede, and a tombstone's key, with Iceberg position deletes) and Kafka readers of its compacted offsets get each key's latest record at its offset (gaps between, as after Kafka's log cleaner), tombstones for delete.retention.ms; records without a key are refused. 'compact,delete' does both. A policy without 'delete' keeps everything else.", broker_synonym="log.cleanup.policy", choices=("compact", "delete")),
        _c(MAX_MESSAGE_BYTES, T.INT, "", "The largest record batch (default: the broker's message.max.bytes); Produce answers MESSAGE_TOO_LARGE for a bigger batch.", broker_synonym="message.max.bytes", minimum=0),
        _c("message.timestamp.type", T.STRING, "CreateTime", "Records keep the producer's CreateTime; LogAppendTime is not supported (a gap).", broker_synonym="log.message.timestamp.type", choices=("CreateTime",), read_only=True),
        _c("compression.type", T.STRING, "producer", "The codec of batches rebuilt from the topic's Iceberg table (its Parquet files) for a fetch: 'producer' keeps the codec each batch was produced with. Batches still in the WAL are served as produced, with the producer's codec: neve never recompresses on produce.", broker_synonym="compression.type", choices=COMPRESSION_TYPES),
        _c("delete.retention.ms", T.LONG, "86400000", "How long a compacted topic's tombstone (a record with a key and no value) is still served to Kafka readers once compaction has reached it: its table never holds it (the key's row is deleted at once), its Kafka view skips it from the compaction cycle's time plus this; the key's earlier records are skipped at once. Table maintenance leaves the files holding it unmerged until then. Set when the cycle compacts the tombstone: a change applies to tombstones compacted after it.", broker_synonym="log.cleaner.delete.retention.ms", minimum=0),
        _c("min.compaction.lag.ms", T.LONG, "0", "How long a compacted topic's records stay uncompacted: the compactor takes a partition's records into its table only up to its first WAL index entry holding a record younger than this (by record timestamp), so younger ones stay in the WAL, every one served to Kafka readers, and the table's freshness is at least this.", broker_synonym="log.cleaner.min.compaction.lag.ms", minimum=0),
        _c("max.compaction.lag.ms", T.LONG, str(LONG_MAX), "The longest a compacted topic's record stays uncompacted: the compactor compacts a record within its freshness setting (2 s by default) or this, whichever is less (its own cycle interval and load permitting).", broker_synonym="log.cleaner.max.compaction.lag.ms", minimum=1),
        _c("min.cleanable.dirty.ratio", T.DOUBLE, "0.5", "Accepted and stored; no effect in neve: a compacted topic's records are compacted by every cycle (the cycle's deletes cost what its keys changed, not the log's size), not once a share of the log is dirty.", broker_synonym="log.cleaner.min.cleanable.ratio"),
        # neve's own
        _c("neve.iceberg.enabled", T.BOOLEAN, "true", "Whether the compactor maintains an Apache Iceberg table for this topic (every topic is one unless this is false)."),
        _c(names.TABLE_CONFIG, T.STRING, "", "The Iceberg table of this topic: an identifier ([A-Za-z_][A-Za-z0-9_]*), optionally after the compactor's namespace and a dot (a compactor refuses any other namespace); empty: the topic's name (with . and - made _). Refused when it is another topic's table.", syntax=names.parse_table_config),
        _c(names.PARTITION_BY_CONFIG, T.STRING, names.DEFAULT_PARTITION_BY, "How the topic's table is partitioned, set when the compactor creates it: day(timestamp), hour(timestamp), month(timestamp), year(timestamp) of the Kafka timestamp, identity(partition), bucket[N](partition), truncate[W](column), several separated by commas, or none.", syntax=names.parse_partition_by),
        _c("neve.iceberg.retention.ms", T.LONG, "-1", "How long rows are kept in the topic's Iceberg table (-1: forever, the default: retention.ms and DeleteRecords never delete table rows). Each table maintenance round (the compactor's maintenance interval) expires the rows of each partition up to its first record not older than this: the partition's log start moves there first, then the rows are deleted in one Iceberg snapshot (files holding only expired rows dropped whole, others rewritten) and their files deleted when the snapshots holding them expire. Like Kafka's segments, a record with an older timestamp after the first one kept stays. Only compacted records are expired.", minimum=-1),
        _c("neve.iceberg.drop.on.delete", T.BOOLEAN, "false", "Whether deleting the topic also drops its Iceberg table and purges the table's files (false: the table stays, with every row). The compactor drops the table when it sees the topic gone; a compactor that was not running then drops it at its next start only when the table is in its namespace: each such table is marked with the table properties neve.drop-on-delete and neve.topic-id while the topic lives."),
        # Kafka's, with no meaning for neve
        _c("segment.bytes", T.INT, "1073741824", "Log segment size." + NO_EFFECT, broker_synonym="log.segment.bytes", minimum=14),
        _c("segment.ms", T.LONG, "604800000", "Log segment roll time." + NO_EFFECT + " A compacted topic's records are compacted by the compactor's cycles (its freshness), not when a segment rolls.", broker_synonym="log.roll.ms", minimum=1),
        _c("segment.jitter.ms", T.LONG, "0", "Log segment roll jitter." + NO_EFFECT, broker_synonym="log.roll.jitter.ms", minimum=0),
        _c("segment.index.bytes", T.INT, "10485760", "Offset index size per segment." + NO_EFFECT, broker_synonym="log.index.size.max.bytes", minimum=4),
        _c("index.interval.bytes", T.INT, "4096", "Offset index granularity." + NO_EFFECT, broker_synonym="log.index.interval.bytes", minimum=0),
        _c("flush.messages", T.LONG, str(LONG_MAX), "Records between fsyncs (neve acknowledges only durable records)." + NO_EFFECT, broker_synonym="log.flush.interval.messages", minimum=1),
        _c("flush.ms", T.LONG, str(LONG_MAX), "Time between fsyncs (neve acknowledges only durable records)." + NO_EFFECT, broker_synonym="log.flush.interval.ms", minimum=0),
        _c("file.delete.delay.ms", T.LONG, "60000", "Delay before deleting a segment file." + NO_EFFECT, broker_synonym="log.segment.delete.delay.ms", minimum=0),
        _c("preallocate", T.BOOLEAN, "false", "Preallocate segment files." + NO_EFFECT, broker_synonym="log.preallocate"),
        _c("min.insync.replicas", T.INT, "1", "Replicas that must acknowledge acks=all (every acknowledged record is on object storage)." + NO_EFFECT, broker_synonym="min.insync.replicas", minimum=1),
        _c("unclean.leader.election.enable", T.BOOLEAN, "false", "Unclean leader election (neve has no partition leaders)." + NO_EFFECT, broker_synonym="unclean.leader.election.enable"),
        _c("leader.replication.throttled.replicas", T.LIST, "", "Replication throttling." + NO_EFFECT),
        _c("follower.replication.throttled.replicas", T.LIST, "", "Replication throttling." + NO_EFFECT),
        _c("message.timestamp.before.max.ms", T.LONG, str(LONG_MAX), "Largest allowed age of a record timestamp; not enforced yet (a gap).", broker_synonym="log.message.timestamp.before.max.ms", minimum=0),
        _c("message.timestamp.after.max.ms", T.LONG, str(LONG_MAX), "Largest allowed future skew of a record timestamp; not enforced yet (a gap).", broker_synonym="log.message.timestamp.after.max.ms", minimum=0),
        _c("remote.storage.enable", T.BOOLEAN, "false", "Tiered storage (neve's only storage is the object store)." + NO_EFFECT),
        _c("local.retention.ms", T.LONG, "-2", "Local retention with tiered storage." + NO_EFFECT, broker_synonym="log.local.retention.ms", minimum=-2),
        _c("local.retention.bytes", T.LONG, "-2", "Local retention with tiered storage." + NO_EFFECT, broker_synonym="log.local.retention.bytes", minimum=-2),
    )
}


def check(configs: Mapping[str, str | None]) -> dict[str, str]:
    """The configs as stored, or InvalidConfig for an unknown name or an invalid value."""
    out = {}
    for name, value in configs.items():
        spec = TOPIC_CONFIGS.get(name)
        if spec is None:
            raise InvalidConfig(f"Unknown topic config name: {name}")
        out[name] = spec.parse(value)
    return out


@dataclass(frozen=True, slots=True)
class Described:
    """One topic config as DescribeConfigs reports it."""

    name: str
    value: str
    source: ConfigSource
    read_only: bool
    type: ConfigType
    doc: str
    synonyms: tuple[tuple[str, str, ConfigSource], ...]  # (name, value, source), most specific first


def default_value(spec: TopicConfig, max_message_bytes: int) -> tuple[str, ConfigSource]:
    """The value a topic has when it does not set `spec`, and where it comes from."""
    if spec.name == MAX_MESSAGE_BYTES:
        configured = max_message_bytes != _DEFAULT_SETTINGS.max_message_bytes
        return str(max_message_bytes), ConfigSource.STATIC_BROKER if configured else ConfigSource.DEFAULT
    return spec.default, ConfigSource.DEFAULT


def describe(configs: Mapping[str, str], max_message_bytes: int, names=None) -> list[Described]:
    """Every known config of a topic (or those in `names`, in their order; unknown names are
    skipped, as Kafka does), with its effective value and source."""
    wanted = list(TOPIC_CONFIGS) if names is None else [n for n in dict.fromkeys(names) if n in TOPIC_CONFIGS]
    out = []
    for name in wanted:
        spec = TOPIC_CONFIGS[name]
        default, default_source = default_value(spec, max_message_bytes)
        synonyms = []
        if name in configs:
            synonyms.append((name, configs[name], ConfigSource.TOPIC))
        synonyms.append((spec.broker_synonym or name, default, default_source))
        value, source = synonyms[0][1], synonyms[0][2]
        out.append(Described(name, value, source, spec.read_only, spec.type, spec.doc, tuple(synonyms)))
    return out


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    retention_ms: int  # -1: none
    retention_bytes: int  # -1: none

    @property
    def active(self) -> bool:
        return self.retention_ms >= 0 or self.retention_bytes >= 0


def max_message_bytes(configs: Mapping[str, str], broker_default: int) -> int:
    """The largest record batch Produce accepts for a topic with these configs."""
    value = configs.get(MAX_MESSAGE_BYTES)
    if value is None:
        return broker_default
    try:
        return int(value)
    except ValueError:  # stored before configs were validated
        return broker_default


def retention_policy(configs: Mapping[str, str]) -> RetentionPolicy:
    """What retention does to a topic with these configs: nothing unless cleanup.policy has
    'delete' (a compact-only topic keeps everything, as in Kafka)."""
    policy = configs.get("cleanup.policy", TOPIC_CONFIGS["cleanup.policy"].default)
    if "delete" not in policy.split(","):
        return RetentionPolicy(-1, -1)
    try:
        ms = int(configs.get("retention.ms", TOPIC_CONFIGS["retention.ms"].default))
        size = int(configs.get("retention.bytes", TOPIC_CONFIGS["retention.bytes"].default))
    except ValueError:  # stored before configs were validated: hide nothing rather than guess
        return RetentionPolicy(-1, -1)
    return RetentionPolicy(ms if ms >= 0 else -1, size if size >= 0 else -1)


# -- changing a topic's configs (AlterConfigs, IncrementalAlterConfigs) ---------------------------

TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4


def resource_refusal(resource_type: int, name: str, topics: Mapping) -> tuple[int, str] | None:
    """The (error code, message) for an alter of anything but an existing topic, else None."""
    if resource_type == BROKER_RESOURCE:
        return ErrorCode.invalid_request, "broker configs are read-only in neve: set them in the node's configuration (neve config) and restart"
    if resource_type != TOPIC_RESOURCE:
        return ErrorCode.invalid_request, f"unsupported resource type {resource_type}"
    if name not in topics:
        return ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist."
    return None


async def alter_topic(metadata, resource, validate_only: bool, compute) -> tuple[int, str | None]:
    """One resource of AlterConfigs or IncrementalAlterConfigs: refuse anything but an existing
    topic, and a config named twice; then `compute(old configs)` gives (new whole set | None,
    error code, message), and the new set is validated and stored."""
    refusal = resource_refusal(resource.resource_type, resource.resource_name, metadata.topics())
    if refusal is not None:
        return refusal
    names = [c.name for c in resource.configs]
    if len(set(names)) != len(names):
        return ErrorCode.invalid_request, "Error due to duplicate config keys"
    old = metadata.topics()[resource.resource_name].configs
    new, code, message = compute(old)
    if new is None:
        return code, message
    return await replace_configs(metadata, resource.resource_name, old, new, validate_only)


async def replace_configs(metadata, name: str, old: Mapping[str, str], new: Mapping[str, str], validate_only: bool) -> tuple[int, str | None]:
    """Make `new` the topic's whole set of configs: (0, None), or an error code and message."""
    try:
        stored = check(new)
    except InvalidConfig as e:
        return ErrorCode.invalid_config, str(e)
    changed_table = stored.get(names.TABLE_CONFIG, "") != old.get(names.TABLE_CONFIG, "")
    other = names.table_collision(name, stored, (names.Topic(n, t.configs) for n, t in metadata.topics().items())) if changed_table else None
    if other is not None:
        return ErrorCode.invalid_config, names.collision_message(name, stored, other)
    if validate_only:
        return 0, None
    changes: dict[str, str | None] = {k: None for k in old if k not in stored}
    changes.update({k: v for k, v in stored.items() if old.get(k) != v})
    if changes:
        try:
            await metadata.update_topic(name, configs=changes)
        except MetadataError as e:
            return e.error_code, str(e) or type(e).__name__
    return 0, None

"""Admin and housekeeping APIs against a real `neve dev` node, driven by stock clients
(confluent-kafka's AdminClient, kafka-python's KafkaAdminClient) and, for the APIs those do not
expose, by raw kio requests. Every assertion is an exact value."""

from __future__ import annotations

import sys
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from kio.index import load_request_schema
from kio.schema.describe_log_dirs.v4.request import DescribableLogDirTopic, DescribeLogDirsRequest
from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
from kio.schema.offset_for_leader_epoch.v4.request import OffsetForLeaderEpochRequest, OffsetForLeaderPartition, OffsetForLeaderTopic

from tests.scenarios.records import LOG, create_topic
from tests.scenarios.test_bad_input import Raw

pytestmark = pytest.mark.integration
T = 30  # seconds: bound of every client call
ENV = {"NEVE_WAL_LINGER_MS": "10"}

DEFAULT, TOPIC_SET = ConfigSource.DEFAULT_CONFIG.value, ConfigSource.DYNAMIC_TOPIC_CONFIG.value
INVALID_CONFIG = 40
INVALID_TOPIC_EXCEPTION = 17


def admin(node) -> AdminClient:
    return AdminClient({"bootstrap.servers": node.bootstrap, "logger": LOG})


def describe(client: AdminClient, topic: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return client.describe_configs([resource], request_timeout=T)[resource].result(T)


def alter_configs(client: AdminClient, resource: ConfigResource) -> None:
    """The legacy AlterConfigs (replaces the whole set), deprecated in confluent-kafka but still
    what older tools send."""
    with pytest.warns(DeprecationWarning):
        futures = client.alter_configs([resource])
    futures[resource].result(T)


def summary(entries: dict[str, ConfigEntry], names) -> dict[str, tuple]:
    return {n: (entries[n].value, entries[n].source, entries[n].is_read_only, entries[n].is_default) for n in names}


def produce(bootstrap: str, topic: str, records: list[tuple[int, bytes]], **config) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "logger": LOG, **config})
    errors = []
    for partition, value in records:
        producer.produce(topic, value=value, partition=partition, on_delivery=lambda err, msg: errors.append(err) if err else None)
    assert producer.flush(T) == 0 and errors == []


def consume(bootstrap: str, topic: str, partition: int, offset: int, count: int) -> list[tuple[int, bytes]]:
    """Exactly `count` records of one partition from `offset` (OFFSET_BEGINNING: the log start)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False, "logger": LOG})
    consumer.assign([TopicPartition(topic, partition, offset)])
    got = []
    try:
        for _ in range(200):
            if len(got) >= count:
                break
            for m in consumer.consume(count - len(got), timeout=0.5):
                assert m.error() is None, m.error()
                got.append((m.offset(), m.value()))
    finally:
        consumer.close()
    return got


def test_topic_configs_create_describe_alter(neve_factory):
    node = neve_factory(env=ENV)
    client = admin(node)
    topic = "configs-t"
    futures = client.create_topics([NewTopic(topic, 2, 1, config={"retention.ms": "3600000", "cleanup.policy": "compact,delete"})], operation_timeout=T)
    futures[topic].result(T)

    entries = describe(client, topic)
    assert summary(entries, ["retention.ms", "cleanup.policy", "retention.bytes", "max.message.bytes", "message.timestamp.type", "neve.iceberg.enabled", "neve.iceberg.table"]) == {
        "retention.ms": ("3600000", TOPIC_SET, False, False),
        "cleanup.policy": ("compact,delete", TOPIC_SET, False, False),
        "retention.bytes": ("-1", DEFAULT, False, True),
        "max.message.bytes": (str(10 * 1024 * 1024), DEFAULT, False, True),
        "message.timestamp.type": ("CreateTime", DEFAULT, True, True),
        "neve.iceberg.enabled": ("true", DEFAULT, False, True),
        "neve.iceberg.table": ("", DEFAULT, False, True),
    }
    assert all(not e.is_sensitive for e in entries.values())

    # incremental: SET one, DELETE one (back to default), APPEND to a list
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
            ConfigEntry("neve.iceberg.enabled", "false", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    client.incremental_alter_configs([resource])[resource].result(T)
    entries = describe(client, topic)
    assert summary(entries, ["retention.bytes", "retention.ms", "cleanup.policy", "neve.iceberg.enabled"]) == {
        "retention.bytes": ("1048576", TOPIC_SET, False, False),
        "retention.ms": ("604800000", DEFAULT, False, True),
        "cleanup.policy": ("compact,delete", TOPIC_SET, False, False),
        "neve.iceberg.enabled": ("false", TOPIC_SET, False, False),
    }
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SUBTRACT)])
    client.incremental_alter_configs([resource])[resource].result(T)
    assert describe(client, topic)["cleanup.policy"].value == "delete"

    # AlterConfigs replaces the whole set: what is left out returns to its default
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config={"segment.bytes": "1048576", "neve.iceberg.table": "lake.orders"})
    alter_configs(client, resource)
    entries = describe(client, topic)
    set_on_topic = {n: e.value for n, e in entries.items() if e.source == TOPIC_SET}
    assert set_on_topic == {"segment.bytes": "1048576", "neve.iceberg.table": "lake.orders"}
    assert summary(entries, ["retention.bytes", "cleanup.policy"]) == {"retention.bytes": ("-1", DEFAULT, False, True), "cleanup.policy": ("delete", DEFAULT, False, True)}


def test_compression_type_takes_every_kafka_value(neve_node):
    """librdkafka's admin test 0081 creates a topic with compression.type=lz4; the codec is the
    one batches rebuilt from the table are served with, so every Kafka value is accepted."""
    client = admin(neve_node)
    topic = "compressed-t"
    client.create_topics([NewTopic(topic, 1, 1, config={"compression.type": "lz4"})], operation_timeout=T)[topic].result(T)
    assert summary(describe(client, topic), ["compression.type"]) == {"compression.type": ("lz4", TOPIC_SET, False, False)}

    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry("compression.type", "zstd", incremental_operation=AlterConfigOpType.SET)])
    client.incremental_alter_configs([resource])[resource].result(T)
    assert summary(describe(client, topic), ["compression.type"]) == {"compression.type": ("zstd", TOPIC_SET, False, False)}
    for value in ("uncompressed", "gzip", "snappy", "producer"):
        alter_configs(client, ConfigResource(ResourceType.TOPIC, topic, set_config={"compression.type": value}))
        assert describe(client, topic)["compression.type"].value == value
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry("compression.type", None, incremental_operation=AlterConfigOpType.DELETE)])
    client.incremental_alter_configs([resource])[resource].result(T)
    assert summary(describe(client, topic), ["compression.type"]) == {"compression.type": ("producer", DEFAULT, False, True)}


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("retention.ms", "soon", "Invalid value soon for configuration retention.ms: Not a number of type LONG"),
        ("retention.ms", "-7", "Invalid value -7 for configuration retention.ms: Value must be at least -1"),
        ("cleanup.policy", "shred", "Invalid value shred for configuration cleanup.policy: String must be one of: compact, delete"),
        ("message.timestamp.type", "LogAppendTime", "Invalid value LogAppendTime for configuration message.timestamp.type: String must be one of: CreateTime (the only value neve supports)"),
        ("compression.type", "bogus", "Invalid value bogus for configuration compression.type: String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer"),
        ("no.such.config", "1", "Unknown topic config name: no.such.config"),
        ("neve.iceberg.table", "neve.x\" AS SELECT 1; --", "for configuration neve.iceberg.table: 'neve.x\" AS SELECT 1; --' is not a table name"),
        ("neve.iceberg.table", "a.b.c", "for configuration neve.iceberg.table: 'a.b.c' is not a table name"),
        ("neve.iceberg.partition.by", "week(timestamp)", "for configuration neve.iceberg.partition.by: unknown transform 'week'"),
        ("neve.iceberg.partition.by", "day(timestamp); DROP TABLE t", "for configuration neve.iceberg.partition.by: 'day(timestamp); DROP TABLE t' is not transform(column)"),
    ],
)
def test_invalid_config_is_refused_everywhere(neve_node, name, value, message):
    client = admin(neve_node)
    futures = client.create_topics([NewTopic("bad-config", 1, 1, config={name: value})], operation_timeout=T)
    with pytest.raises(KafkaException) as raised:
        futures["bad-config"].result(T)
    assert raised.value.args[0].code() == INVALID_CONFIG and message in raised.value.args[0].str()
    assert "bad-config" not in client.list_topics(timeout=T).topics

    topic = create_topic(neve_node.bootstrap, 1, prefix="alter")
    for resource in (
        ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)]),
        ConfigResource(ResourceType.TOPIC, topic, set_config={name: value}),
    ):
        with pytest.raises(KafkaException) as raised:
            if resource.incremental_configs:
                client.incremental_alter_configs([resource])[resource].result(T)
            else:
                alter_configs(client, resource)
        assert raised.value.args[0].code() == INVALID_CONFIG and message in raised.value.args[0].str()
    assert {n: e.value for n, e in describe(client, topic).items() if e.source == TOPIC_SET} == {}


def test_validate_only_changes_nothing(neve_node):
    client = admin(neve_node)
    topic = create_topic(neve_node.bootstrap, 2, prefix="validate")
    client.create_partitions([NewPartitions(topic, 5)], validate_only=True, operation_timeout=T)[topic].result(T)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    client.incremental_alter_configs([resource], validate_only=True)[resource].result(T)
    assert len(client.list_topics(topic, timeout=T).topics[topic].partitions) == 2
    assert describe(client, topic)["retention.ms"].value == "604800000"
    # validation still happens: APPEND only applies to list configs
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.APPEND)])
    with pytest.raises(KafkaException) as raised:
        client.incremental_alter_configs([resource], validate_only=True)[resource].result(T)
    assert raised.value.args[0].code() == INVALID_CONFIG and "Can't APPEND to key retention.ms because its type is not LIST." in raised.value.args[0].str()


def test_create_partitions_then_produce_to_a_new_one(neve_factory):
    node = neve_factory(env=ENV)
    client = admin(node)
    topic = create_topic(node.bootstrap, 3, prefix="grow")
    client.create_partitions([NewPartitions(topic, 6)], operation_timeout=T)[topic].result(T)
    assert len(client.list_topics(topic, timeout=T).topics[topic].partitions) == 6
    for count, code in ((6, 37), (4, 37)):  # INVALID_PARTITIONS: same count, shrink
        with pytest.raises(KafkaException) as raised:
            client.create_partitions([NewPartitions(topic, count)], operation_timeout=T)[topic].result(T)
        assert raised.value.args[0].code() == code
    with pytest.raises(KafkaException) as raised:
        client.create_partitions([NewPartitions("no-such-topic", 2)], operation_timeout=T)["no-such-topic"].result(T)
    assert raised.value.args[0].code() == 3

    produce(node.bootstrap, topic, [(5, b"p5-a"), (5, b"p5-b"), (0, b"p0")])
    assert consume(node.bootstrap, topic, 5, OFFSET_BEGINNING, 2) == [(0, b"p5-a"), (1, b"p5-b")]


def test_delete_records_moves_the_log_start(neve_factory):
    node = neve_factory(env=ENV)
    client = admin(node)
    topic = create_topic(node.bootstrap, 2, prefix="delrec")
    produce(node.bootstrap, topic, [(0, f"r{i}".encode()) for i in range(10)] + [(1, b"only")])

    futures = client.delete_records([TopicPartition(topic, 0, 4), TopicPartition(topic, 1, -1)], request_timeout=T)
    assert futures[TopicPartition(topic, 0)].result(T).low_watermark == 4
    assert futures[TopicPartition(topic, 1)].result(T).low_watermark == 1  # -1: up to the high watermark
    earliest = client.list_offsets({TopicPartition(topic, 0): OffsetSpec.earliest(), TopicPartition(topic, 1): OffsetSpec.earliest()}, request_timeout=T)
    assert {tp.partition: f.result(T).offset for tp, f in earliest.items()} == {0: 4, 1: 1}
    assert consume(node.bootstrap, topic, 0, OFFSET_BEGINNING, 6) == [(i, f"r{i}".encode()) for i in range(4, 10)]

    # below the log start: nothing changes; beyond the high watermark: OFFSET_OUT_OF_RANGE
    futures = client.delete_records([TopicPartition(topic, 0, 2)], request_timeout=T)
    assert futures[TopicPartition(topic, 0)].result(T).low_watermark == 4
    futures = client.delete_records([TopicPartition(topic, 0, 11)], request_timeout=T)
    with pytest.raises(KafkaException) as raised:
        futures[TopicPartition(topic, 0)].result(T)
    assert raised.value.args[0].code() == 1


def test_describe_cluster(neve_factory):
    node = neve_factory(env=ENV)
    client = admin(node)  # kept referenced: a destroyed handle fails its futures
    result = client.describe_cluster(request_timeout=T).result(T)
    assert result.cluster_id == "neve"
    assert [(n.id, n.host, n.port, n.rack) for n in result.nodes] == [(0, "127.0.0.1", node.port, None)]
    assert result.controller.id == 0


def test_describe_cluster_lists_what_metadata_lists(cluster_factory):
    cluster = cluster_factory(zones=("a", "b", "a"))
    expected = {n.port: i for i, n in enumerate(cluster.nodes)}
    # A zoned client learns its zone's live brokers (as from Metadata), and a client of a one-broker
    # zone the others too (they are never its leaders: broker/locality.py brokers_listed); a client
    # without a zone, or naming a zone no broker is in, learns every live broker.
    every = [(0, "a"), (1, "b"), (2, "a")]
    for client_id, nodes in (("app,zone_id=a", [(0, "a"), (2, "a")]), ("ws_az=b", every), ("no-zone", every), ("lost,zone=c", every)):
        client = AdminClient({"bootstrap.servers": cluster.bootstrap, "client.id": client_id, "logger": LOG})
        result = client.describe_cluster(request_timeout=T).result(T)
        assert sorted((n.id, n.rack) for n in result.nodes) == nodes, client_id
        assert all(expected[n.port] == n.id for n in result.nodes)
        zone = {"app,zone_id=a": "a", "ws_az=b": "b"}.get(client_id)
        assert result.controller.id == min(n.id for n in result.nodes if zone is None or n.rack == zone)  # in the client's zone
        listed = client.list_topics(timeout=T).brokers
        assert sorted(listed) == sorted(n.id for n in result.nodes), "DescribeCluster lists what Metadata lists"


# kafka-python loads its protocol schemas through importlib.resources' legacy API (its warning is
# attributed to importlib, so pyproject's kafka.* filter does not catch it)
@pytest.mark.filterwarnings("ignore:.*_text is deprecated:DeprecationWarning")
def test_kafka_python_admin_describes_and_grows(neve_node):
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.admin import NewPartitions as KpNewPartitions

    topic = create_topic(neve_node.bootstrap, 1, prefix="kp")
    client = KafkaAdminClient(bootstrap_servers=neve_node.bootstrap, request_timeout_ms=T * 1000)
    try:
        client.create_partitions({topic: KpNewPartitions(total_count=3)})
        described = client.describe_configs([KpResource(ConfigResourceType.TOPIC, topic, ["retention.ms", "cleanup.policy"])], config_filter="all")
        configs = described["topic"][topic]
        assert {name: (c["value"], c["config_source"], c["read_only"], c["config_type"]) for name, c in configs.items()} == {
            "retention.ms": ("604800000", "DEFAULT_CONFIG", False, "LONG"),
            "cleanup.policy": ("delete", "DEFAULT_CONFIG", False, "LIST"),
        }
    finally:
        client.close()
    assert len(admin(neve_node).list_topics(topic, timeout=T).topics[topic].partitions) == 3


# -- raw requests: the APIs stock admin clients do not expose everywhere -----------------------------


def offset_for_leader_epoch(raw: Raw, topic: str, asks: list[tuple[int, int, int]]):
    """asks: (partition, current leader epoch, leader epoch) -> [(partition, error, epoch, end offset)]"""
    request = OffsetForLeaderEpochRequest(
        replica_id=-1,
        topics=(OffsetForLeaderTopic(topic=topic, partitions=tuple(OffsetForLeaderPartition(partition=p, current_leader_epoch=c, leader_epoch=e) for p, c, e in asks)),),
    )
    response = raw.response(23, 4, raw.request(request))
    return [(p.partition, p.error_code, p.leader_epoch, p.end_offset) for t in response.topics for p in t.partitions]


def test_offset_for_leader_epoch(neve_factory):
    node = neve_factory(env=ENV)
    topic = create_topic(node.bootstrap, 2, prefix="ofle")
    produce(node.bootstrap, topic, [(0, b"a"), (0, b"b"), (0, b"c")])
    raw = Raw(node.port)
    try:
        assert offset_for_leader_epoch(raw, topic, [(0, 0, 0), (1, -1, 0), (0, -1, 5), (0, -1, -1), (0, 3, 0), (9, -1, 0)]) == [
            (0, 0, 0, 3),  # epoch 0 ends at the high watermark
            (1, 0, 0, 0),  # empty partition
            (0, 0, -1, -1),  # an epoch neve never had
            (0, 0, -1, -1),
            (0, 75, -1, -1),  # UNKNOWN_LEADER_EPOCH: the client knows a newer epoch than the broker
            (9, 3, -1, -1),  # UNKNOWN_TOPIC_OR_PARTITION
        ]
    finally:
        raw.close()


def test_describe_log_dirs(neve_factory):
    node = neve_factory(env=ENV)
    topic = create_topic(node.bootstrap, 2, prefix="logdirs")
    produce(node.bootstrap, topic, [(1, b"x" * 100)])
    raw = Raw(node.port)
    try:
        request = DescribeLogDirsRequest(topics=(DescribableLogDirTopic(topic=topic, partitions=(0, 1, 7)), DescribableLogDirTopic(topic="nope", partitions=(0,))))
        response = raw.response(35, 4, raw.request(request))
    finally:
        raw.close()
    assert response.error_code == 0 and len(response.results) == 1
    result = response.results[0]
    assert (result.error_code, result.log_dir, result.total_bytes, result.usable_bytes) == (0, f"file://{node.data_dir.resolve()}/objects", -1, -1)
    assert [t.name for t in result.topics] == [topic]
    parts = [(p.partition_index, p.offset_lag, p.is_future_key) for p in result.topics[0].partitions]
    assert parts == [(0, 0, False), (1, 0, False)]
    sizes = [p.partition_size for p in result.topics[0].partitions]
    assert sizes[0] == 0 and 100 < sizes[1] < 300  # one batch of one 100-byte record


def test_describe_producers_after_idempotent_producer(neve_factory):
    node = neve_factory(env=ENV)
    topic = create_topic(node.bootstrap, 2, prefix="producers")
    producer = Producer({"bootstrap.servers": node.bootstrap, "enable.idempotence": True, "linger.ms": 0, "logger": LOG})
    for i in range(5):  # one batch per record: flushed one by one
        producer.produce(topic, value=f"v{i}".encode(), partition=0, timestamp=1_700_000_000_000 + i)
        assert producer.flush(T) == 0
    raw = Raw(node.port)
    try:
        request = DescribeProducersRequest(topics=(TopicRequest(name=topic, partition_indexes=(0, 1, 4)),))
        response = raw.response(61, 0, raw.request(request))
    finally:
        raw.close()
    parts = response.topics[0].partitions
    assert [(p.partition_index, p.error_code) for p in parts] == [(0, 0), (1, 0), (4, 3)]
    assert parts[1].active_producers == () and parts[2].active_producers == ()
    [state] = parts[0].active_producers
    assert state.producer_id >= 0
    assert (state.producer_epoch, state.last_sequence, state.last_timestamp, state.coordinator_epoch, state.current_txn_start_offset) == (0, 4, 1_700_000_000_004, -1, -1)


def test_describe_configs_of_the_broker(neve_node):
    resource = ConfigResource(ResourceType.BROKER, "0")
    client = admin(neve_node)
    entries = client.describe_configs([resource], request_timeout=T)[resource].result(T)
    assert summary(entries, ["broker.id", "message.max.bytes", "auto.create.topics.enable"]) == {
        "broker.id": ("0", ConfigSource.STATIC_BROKER_CONFIG.value, True, False),
        "message.max.bytes": (str(10 * 1024 * 1024), DEFAULT, True, True),
        # neve dev creates topics on first use, as Kafka's default does: its own setting, not the default
        "auto.create.topics.enable": ("true", ConfigSource.STATIC_BROKER_CONFIG.value, True, False),
    }
    # broker configs cannot be altered through the API
    alter = ConfigResource(ResourceType.BROKER, "0", set_config={"message.max.bytes": "1"})
    with pytest.raises(KafkaException) as raised:
        alter_configs(client, alter)
    assert raised.value.args[0].code() == 42




def test_a_table_config_naming_another_topics_table_is_refused_and_look_alikes_too_in_one_request(neve_node):
    client = admin(neve_node)
    owner = create_topic(neve_node.bootstrap, 1, prefix="owner.x")
    table = owner.replace(".", "_").replace("-", "_")
    other = create_topic(neve_node.bootstrap, 1, prefix="other")
    for resource in (
        ConfigResource(ResourceType.TOPIC, other, incremental_configs=[ConfigEntry("neve.iceberg.table", table, incremental_operation=AlterConfigOpType.SET)]),
        ConfigResource(ResourceType.TOPIC, other, set_config={"neve.iceberg.table": f"neve.{table.upper()}"}),
    ):
        with pytest.raises(KafkaException) as raised:
            if resource.incremental_configs:
                client.incremental_alter_configs([resource])[resource].result(T)
            else:
                alter_configs(client, resource)
        assert raised.value.args[0].code() == INVALID_CONFIG and f"with topic '{owner}'" in raised.value.args[0].str()
    assert {n: e.value for n, e in describe(client, other).items() if e.source == TOPIC_SET} == {}
    # the owner may keep (or set) its own table name; a new name of its own is fine too
    alter_configs(client, ConfigResource(ResourceType.TOPIC, owner, set_config={"neve.iceberg.table": table}))
    mine, pair = f"mine_{uuid.uuid4().hex[:8]}", f"pair.{uuid.uuid4().hex[:8]}"
    alter_configs(client, ConfigResource(ResourceType.TOPIC, other, set_config={"neve.iceberg.table": mine}))

    # two look-alikes in one request, validated only: the second collides with the first
    futures = client.create_topics([NewTopic(pair, 1, 1), NewTopic(pair.replace(".", "-"), 1, 1), NewTopic(mine, 1, 1)], validate_only=True, operation_timeout=T)
    futures[pair].result(T)
    for name, taken_by in ((pair.replace(".", "-"), pair), (mine, other)):
        with pytest.raises(KafkaException) as raised:
            futures[name].result(T)
        assert raised.value.args[0].code() == INVALID_TOPIC_EXCEPTION and f"with topic '{taken_by}'" in raised.value.args[0].str()


def create_assigned(raw: Raw, topics: list[tuple[str, int, int, list[int]]], validate_only: bool = False, version: int = 7):
    """CreateTopics of (name, num_partitions, replication_factor, assigned partition indexes, each
    on broker 1) -> [(name, error code, message, num_partitions)]."""
    module = load_request_schema(19, version)
    r = sys.modules[module.__module__]
    request = module(
        topics=tuple(
            r.CreatableTopic(name=name, num_partitions=n, replication_factor=rf, assignments=tuple(r.CreatableReplicaAssignment(partition_index=i, broker_ids=(1,)) for i in indexes), configs=())
            for name, n, rf, indexes in topics
        ),
        validate_only=validate_only,
    )
    response = raw.response(19, version, raw.request(request))
    return [(t.name, t.error_code, t.error_message, t.num_partitions) for t in response.topics]


@pytest.mark.parametrize("version", [4, 7])
def test_a_manual_assignment_makes_one_partition_per_assignment(neve_node, version):
    """As Kafka: the partition indexes 0..n-1 each once make n partitions (validate_only answers the
    same and makes none); a duplicate or missing index is INVALID_REPLICA_ASSIGNMENT, a
    num_partitions or replication factor other than -1 beside an assignment INVALID_REQUEST."""
    tag = uuid.uuid4().hex[:8]
    made, checked, twice, gap, factor, count = (f"assigned-{what}-{tag}" for what in ("made", "checked", "twice", "gap", "factor", "count"))
    client = admin(neve_node)
    raw = Raw(neve_node.port)
    try:
        assert create_assigned(raw, [(checked, -1, -1, [1, 0, 2, 3])], validate_only=True) == [(checked, 0, None, 4)]
        assert create_assigned(
            raw,
            [(made, -1, -1, [2, 0, 1]), (twice, -1, -1, [0, 1, 0]), (gap, -1, -1, [0, 2]), (factor, -1, 1, [0]), (count, 1, -1, [0])],
        ) == [
            (made, 0, None, 3),
            (twice, 39, "Found multiple manual partition assignments for partition 0", -1),
            (gap, 39, "partitions should be a consecutive 0-based integer sequence", -1),
            (factor, 42, "A manual partition assignment was specified, but replication factor was not set to -1.", -1),
            (count, 42, "A manual partition assignment was specified, but numPartitions was not set to -1.", -1),
        ]
    finally:
        raw.close()
    topics = client.list_topics(timeout=T).topics
    assert sorted(topics[made].partitions) == [0, 1, 2]
    assert not {checked, twice, gap, factor, count} & set(topics)


def test_the_admin_client_creates_a_topic_by_its_replica_assignment(neve_node):
    """confluent-kafka's NewTopic with a replica_assignment (it wants the count too) sends
    num_partitions and replication factor -1 and one assignment per partition: 22 of them make 22
    partitions."""
    client = admin(neve_node)
    topic = f"by-assignment-{uuid.uuid4().hex[:8]}"
    client.create_topics([NewTopic(topic, num_partitions=22, replica_assignment=[[1]] * 22)], operation_timeout=T)[topic].result(T)
    assert sorted(client.list_topics(topic, timeout=T).topics[topic].partitions) == list(range(22))

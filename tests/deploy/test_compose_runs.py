"""deploy/compose/compose.yaml started for real, without a container engine (tests/deploy/compose.py):
etcd, SeaweedFS, the three brokers, the registry and the compactor run as local processes with the
file's commands, variables and health checks, in its start order. A stock client (librdkafka)
produces through the brokers; Metadata lists the three, and a client naming zone b only broker-b1;
every record comes back, exactly, from that broker; the registry answers a registered schema; the
compactor (Spark, the REST catalog on SeaweedFS) puts every record in the topic's table, read with
pyiceberg through the compactor's own catalog settings and with `neve sql` in the compactor's
environment (the README's command); and every neve process stops cleanly on
SIGTERM. Trino is left out (no JVM image here); its catalog file is checked in test_compose_file.py."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.workload import wait_until
from tests.deploy.compose import NEVE, LocalCompose, is_neve, resolved

pytestmark = pytest.mark.integration

RUN = ("etcd", "seaweedfs")  # besides every neve service; what is left out must be said here
SKIPPED = {"trino"}
PARTITIONS, RECORDS = 3, 300
WAIT_S = 240.0  # events awaited (a JVM started, a cycle committed): generous for a slow, busy machine


@pytest.fixture
def compose(artifacts_dir):
    model = resolved()
    names = [n for n, spec in model["services"].items() if n in RUN or is_neve(spec)]
    assert set(model["services"]) - set(names) == SKIPPED
    local = LocalCompose(model, artifacts_dir, names)
    try:
        local.up()
        yield local
    finally:
        codes = local.down()
    assert {n: c for n, c in codes.items() if is_neve(model["services"][n])} == dict.fromkeys(["broker-a1", "broker-a2", "broker-b1", "registry", "compactor"], 0)


def bootstrap(compose: LocalCompose, *brokers: str) -> str:
    """The brokers' Kafka addresses: each broker's published port (its NEVE_BROKER_PORT)."""
    return ",".join(compose.published(b, int(compose.services[b].spec["environment"]["NEVE_BROKER_PORT"])) for b in brokers)


def produce(servers: str, topic: str) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    acked: dict[tuple[int, int], tuple[bytes, bytes]] = {}
    failures: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            acked[(msg.partition(), msg.offset())] = (msg.key(), msg.value())

    producer = Producer({"bootstrap.servers": servers, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(topic, key=b"k%d" % i, value=b"value %d " % i * (i % 7 + 1), partition=i % PARTITIONS, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures[:3]
    return acked


def consume(servers: str, topic: str, client_id: str) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": servers, "client.id": client_id, "group.id": f"check-{uuid.uuid4().hex}", "enable.auto.commit": False})
    consumer.assign([KafkaPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: dict[tuple[int, int], tuple[bytes, bytes]] = {}
    try:
        wait_until(lambda: _poll_into(consumer, got) >= RECORDS, timeout=WAIT_S, what=f"{RECORDS} records consumed", interval=0)
    finally:
        consumer.close()
    return got


def _poll_into(consumer: Consumer, got: dict) -> int:
    msg = consumer.poll(0.5)
    if msg is not None:
        assert msg.error() is None, msg.error()
        assert (msg.partition(), msg.offset()) not in got, "a record twice"
        got[(msg.partition(), msg.offset())] = (msg.key(), msg.value())
    return len(got)


def table_rows(catalog, identifier: str) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    if not catalog.table_exists(identifier):
        return {}
    rows = catalog.load_table(identifier).scan(selected_fields=("kafka", "key_raw", "value_raw")).to_arrow().to_pylist()
    return {(r["kafka"]["partition"], r["kafka"]["offset"]): (r["key_raw"], r["value_raw"]) for r in rows}


@pytest.mark.timeout(900)
def test_the_compose_file_runs_brokers_registry_and_compactor_end_to_end(compose):
    everyone = bootstrap(compose, "broker-a1", "broker-a2", "broker-b1")
    metadata = AdminClient({"bootstrap.servers": everyone}).list_topics(timeout=30)
    assert sorted(metadata.brokers) == [1, 2, 3]
    zone_a = AdminClient({"bootstrap.servers": everyone, "client.id": "zone_id=a"}).list_topics(timeout=30)
    assert sorted(zone_a.brokers) == [1, 2]  # NEVE_BROKER_ZONE of broker-a1 and a2; b1 is zone b

    topic = f"compose-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": everyone})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)
    # zone b has one broker: its clients also learn of the others, but their leaders are all b1
    zone_b = AdminClient({"bootstrap.servers": everyone, "client.id": "zone_id=b"}).list_topics(topic, timeout=30)
    assert {p.leader for p in zone_b.topics[topic].partitions.values()} == {3}
    acked = produce(everyone, topic)
    assert len(acked) == RECORDS
    assert consume(bootstrap(compose, "broker-b1"), topic, "zone_id=b") == acked

    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    schema = '{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}'
    with SchemaRegistryClient({"url": f"http://{compose.published('registry', 8081)}"}) as registry:
        schema_id = registry.register_schema(f"{topic}-key", Schema(schema, "AVRO"))
        assert registry.get_subjects() == [f"{topic}-key"] and registry.get_schema(schema_id).schema_str.replace(" ", "") == schema.replace(" ", "")

    # the table, read with pyiceberg through the compactor's own settings
    from compactor.catalog import load_catalog
    from neve.config import load_config

    config = load_config(env=compose.environment(compose.services["compactor"])).compactor
    with load_catalog(config) as catalog:
        identifier = f"{config.namespace}.{topic.replace('-', '_')}"
        wait_until(lambda: table_rows(catalog, identifier) == acked, timeout=WAIT_S, what="every record in the topic's table", interval=1.0)
    # README's `docker compose exec compactor neve sql ...`: DuckDB over the table, with the compactor's settings
    query = f"SELECT kafka.partition AS p, kafka.offset AS o, hex(key_raw) AS k, hex(value_raw) AS v FROM {topic.replace('-', '_')}"
    done = subprocess.run([*NEVE, "sql", "--format", "json", query], capture_output=True, text=True, timeout=WAIT_S, env=compose.environment(compose.services["compactor"]), cwd=compose.workdir)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert {(r["p"], r["o"]): (bytes.fromhex(r["k"]), bytes.fromhex(r["v"])) for r in rows} == acked and len(rows) == RECORDS
    assert compose.healthy("compactor")  # its /metrics, the compose file's health check
    assert "tasks run spark" in compose.services["compactor"].log_path.read_text()  # NEVE_COMPACTOR_RUNNER

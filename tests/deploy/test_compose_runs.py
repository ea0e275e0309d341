"""deploy/compose/compose.yaml started for real, without a container engine (tests/deploy/compose.py):
etcd, SeaweedFS, the three brokers, the registry and the compactor run as local processes with the
file's commands, variables and health checks, in its start order. A stock client (librdkafka)
produces through the brokers; Metadata lists the three, and a client naming zone b only broker-b1;
every record comes back, exactly, from that broker; the registry answers a registered schema; the
compactor (Spark, the REST catalog on SeaweedFS) puts every record in the topic's table, read with
pyiceberg through the compactor's own catalog settings and with `neve sql` in the compactor's
environment (the README's command); and every neve process stops cleanly on
SIGTERM. The secure variant (compose.secure.yaml over it, with `make certs`'s files) runs the same
way: a client authenticated with SCRAM-SHA-512 over TLS (the generated CA trusted) produces and
consumes as the admin, a wrong password and an untrusted certificate are refused, the registry
serves HTTPS to its users only, a zone-b client's group request is relayed between brokers over
their SASL_SSL listener, a user the admin creates sees the topic only once an ACL lets it, and
`neve sql` reads every row. Trino is left out (no JVM image here); its catalog file is checked in test_compose_file.py."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.workload import wait_until
from tests.deploy.compose import COMPOSE_FILE, NEVE, SECURE_FILE, LocalCompose, dev_certs, is_neve, resolved

pytestmark = pytest.mark.integration

RUN = ("etcd", "seaweedfs")  # besides every neve service; what is left out must be said here
SKIPPED = {"trino"}
PARTITIONS, RECORDS = 3, 300
WAIT_S = 240.0  # events awaited (a JVM started, a cycle committed): generous for a slow, busy machine


def running(model: dict, workdir):
    """The model's etcd, SeaweedFS and neve services up as local processes; on exit, every neve
    process stopped with exit code 0."""
    names = [n for n, spec in model["services"].items() if n in RUN or is_neve(spec)]
    assert set(model["services"]) - set(names) == SKIPPED
    local = LocalCompose(model, workdir, names)
    try:
        local.up()
        yield local
    finally:
        codes = local.down()
    assert {n: c for n, c in codes.items() if is_neve(model["services"][n])} == dict.fromkeys(["broker-a1", "broker-a2", "broker-b1", "registry", "compactor"], 0)


@pytest.fixture
def compose(artifacts_dir):
    yield from running(resolved(), artifacts_dir)


@pytest.fixture
def secure_compose(artifacts_dir):
    yield from running(resolved(COMPOSE_FILE, SECURE_FILE, variables=dev_certs(artifacts_dir / "certs")), artifacts_dir)


def bootstrap(compose: LocalCompose, *brokers: str) -> str:
    """The brokers' Kafka addresses: each broker's published port (its NEVE_BROKER_PORT, or its
    first listener's port)."""
    addresses = []
    for b in brokers:
        env = compose.services[b].spec["environment"]
        port = env["NEVE_BROKER_LISTENERS"].split(",")[0].rsplit(":", 1)[1] if "NEVE_BROKER_LISTENERS" in env else env["NEVE_BROKER_PORT"]
        addresses.append(compose.published(b, int(port)))
    return ",".join(addresses)


def produce(servers: str, topic: str, **client: str) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    acked: dict[tuple[int, int], tuple[bytes, bytes]] = {}
    failures: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            acked[(msg.partition(), msg.offset())] = (msg.key(), msg.value())

    producer = Producer({"bootstrap.servers": servers, "acks": "all", "enable.idempotence": True, "linger.ms": 5, **client})
    for i in range(RECORDS):
        producer.produce(topic, key=b"k%d" % i, value=b"value %d " % i * (i % 7 + 1), partition=i % PARTITIONS, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures[:3]
    return acked


def consume(servers: str, topic: str, client_id: str, **client: str) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": servers, "client.id": client_id, "group.id": f"check-{uuid.uuid4().hex}", "enable.auto.commit": False, **client})
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
    assert sql_rows(compose, topic) == acked
    assert compose.healthy("compactor")  # its /metrics, the compose file's health check
    assert "tasks run spark" in compose.services["compactor"].log_path.read_text()  # NEVE_COMPACTOR_RUNNER


def refused(servers: str, config: dict, expected: int) -> None:
    """A client with `config` gets no metadata, and librdkafka reports the `expected` error."""
    errors: list[KafkaError] = []
    client = AdminClient({"bootstrap.servers": servers, **config, "error_cb": errors.append})
    with pytest.raises(KafkaException):
        client.list_topics(timeout=10)

    def reported() -> bool:
        client.poll(0.2)  # serves error_cb
        return expected in {e.code() for e in errors}

    wait_until(reported, timeout=30, what=f"librdkafka reporting {expected}", interval=0)


def sql_rows(compose: LocalCompose, topic: str) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    """The topic's table as `neve sql` reads it in the compactor's environment, each row once."""
    query = f"SELECT kafka.partition AS p, kafka.offset AS o, hex(key_raw) AS k, hex(value_raw) AS v FROM {topic.replace('-', '_')}"
    done = subprocess.run([*NEVE, "sql", "--format", "json", query], capture_output=True, text=True, timeout=WAIT_S, env=compose.environment(compose.services["compactor"]), cwd=compose.workdir)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    got = {(r["p"], r["o"]): (bytes.fromhex(r["k"]), bytes.fromhex(r["v"])) for r in rows}
    assert len(got) == len(rows), "a row twice"
    return got


@pytest.mark.timeout(900)
def test_the_secure_compose_variant_serves_scram_over_tls_end_to_end(secure_compose, artifacts_dir):
    certs = artifacts_dir / "certs"
    admin = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "admin",
        "sasl.password": (certs / "admin.password").read_text().strip(),
        "ssl.ca.location": str(certs / "ca.crt"),  # librdkafka checks the broker's name too (ssl.endpoint.identification.algorithm=https)
    }
    everyone = bootstrap(secure_compose, "broker-a1", "broker-a2", "broker-b1")
    metadata = AdminClient({"bootstrap.servers": everyone, **admin}).list_topics(timeout=30)
    assert sorted(metadata.brokers) == [1, 2, 3]
    # a wrong password and a CA that did not sign the brokers' certificate: refused, as librdkafka reports them
    wrong = {**admin, "sasl.password": "not-" + admin["sasl.password"]}
    untrusted = {**admin, "ssl.ca.location": str(certs / "client.crt")}
    for config, expected in ((wrong, KafkaError._AUTHENTICATION), (untrusted, KafkaError._SSL)):
        refused(everyone, config, expected)

    topic = f"secure-{uuid.uuid4().hex[:8]}"
    admin_client = AdminClient({"bootstrap.servers": everyone, **admin})
    admin_client.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)
    acked = produce(everyone, topic, **admin)
    assert len(acked) == RECORDS
    assert consume(everyone, topic, "secure-check", **admin) == acked

    # the registry: HTTPS (the generated CA), its admin in with Basic auth, anonymous refused
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    url = f"https://{secure_compose.published('registry', 8081)}"
    schema = '{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}'
    with SchemaRegistryClient({"url": url, "ssl.ca.location": admin["ssl.ca.location"], "basic.auth.user.info": f"admin:{admin['sasl.password']}"}) as registry:
        registry.register_schema(f"{topic}-value", Schema(schema, "AVRO"))
        assert registry.get_subjects() == [f"{topic}-value"]
    with SchemaRegistryClient({"url": url, "ssl.ca.location": admin["ssl.ca.location"]}) as anonymous, pytest.raises(SchemaRegistryError) as refused_registry:
        anonymous.get_subjects()
    assert refused_registry.value.http_status_code == 401
    assert secure_compose.healthy("registry")  # the image's health check, over HTTPS

    # a zone-b client's group commit, relayed by broker-b1 to a zone-a coordinator over the INTERNAL
    # listener (SASL_SSL as the brokers' user): the offsets land where any client reads them
    from confluent_kafka import ConsumerGroupTopicPartitions

    coordinators = {g: admin_client.describe_consumer_groups([g])[g].result(60).coordinator.id for g in (f"{topic}-relay-{i}" for i in range(8))}
    group = next(g for g, node in coordinators.items() if node != 3)  # broker-b1 is node 3, zone b's only broker
    committed = [KafkaPartition(topic, p, 10 + p) for p in range(PARTITIONS)]
    zoned = Consumer({"bootstrap.servers": bootstrap(secure_compose, "broker-b1"), "client.id": "zone_id=b", "group.id": group, "enable.auto.commit": False, **admin})
    try:
        zoned.commit(offsets=committed, asynchronous=False)
    finally:
        zoned.close()
    (listed,) = admin_client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
    assert sorted((tp.topic, tp.partition, tp.offset) for tp in listed.result(60).topic_partitions) == [(topic, p, 10 + p) for p in range(PARTITIONS)]
    with urllib.request.urlopen(f"http://{secure_compose.published('broker-b1', 9464)}/metrics", timeout=30) as answer:
        relayed = re.search(r'^neve_group_forwarded_requests_total\{api="OffsetCommit"\} (\S+)$', answer.read().decode(), re.M)
    assert relayed and float(relayed[1]) >= 1  # relayed, not answered by broker-b1 itself

    # the authorizer: a user the admin creates (AlterUserScramCredentials) sees no topic until an ACL lets it
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    alice = {**admin, "sasl.username": "alice", "sasl.password": "alice-" + uuid.uuid4().hex}
    upsert = UserScramCredentialUpsertion("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), alice["sasl.password"].encode())
    admin_client.alter_user_scram_credentials([upsert])["alice"].result(60)
    alice_client = AdminClient({"bootstrap.servers": everyone, **alice})
    assert topic not in alice_client.list_topics(timeout=30).topics  # Metadata omits what she may not describe
    read = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)
    admin_client.create_acls([read])[read].result(60)
    wait_until(lambda: topic in alice_client.list_topics(timeout=30).topics, timeout=30, what="alice's READ ACL in effect", interval=0.2)
    from compactor.catalog import load_catalog
    from neve.config import load_config

    config = load_config(env=secure_compose.environment(secure_compose.services["compactor"])).compactor
    with load_catalog(config) as catalog:
        identifier = f"{config.namespace}.{topic.replace('-', '_')}"
        wait_until(lambda: table_rows(catalog, identifier) == acked, timeout=WAIT_S, what="every record in the topic's table", interval=1.0)
    assert sql_rows(secure_compose, topic) == acked
    for broker in ("broker-a1", "broker-a2", "broker-b1"):
        assert secure_compose.healthy(broker)  # the image's health check, over TLS

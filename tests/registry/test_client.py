"""The registry through the official client: confluent-kafka's SchemaRegistryClient and its Avro
serde against a real `neve dev` node's registry, and Avro records produced to and consumed from
that node with confluent-kafka; then two brokers over one etcd registering at once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from registry.wire import unframe
from tests.fixtures import NeveNode, free_port

USER = {"type": "record", "name": "User", "namespace": "t", "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}]}
USER_V2 = {**USER, "fields": [*USER["fields"], {"name": "email", "type": ["null", "string"], "default": None}]}
USER_INCOMPATIBLE = {**USER, "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "string"}]}


def avro(schema: dict) -> Schema:
    return Schema(json.dumps(schema), "AVRO")


@pytest.fixture
def node(neve_factory):
    port = free_port()
    n = neve_factory(env={"NEVE_REGISTRY_PORT": str(port), "NEVE_WAL_LINGER_MS": "5"})
    n.registry_url = f"http://127.0.0.1:{port}"
    return n


@pytest.fixture
def clients():
    """`clients(url)`: a new SchemaRegistryClient (its own cache); each is closed at teardown (its
    HTTP connections otherwise end as ResourceWarnings, which are errors here)."""
    made: list[SchemaRegistryClient] = []

    def make(url: str) -> SchemaRegistryClient:
        made.append(SchemaRegistryClient({"url": url}))
        return made[-1]

    yield make
    for c in made:
        c.close()


@pytest.fixture
def client(node, clients):
    return clients(node.registry_url)


def error_of(call) -> tuple[int, int]:
    with pytest.raises(SchemaRegistryError) as raised:
        call()
    return raised.value.http_status_code, raised.value.error_code


def test_register_is_idempotent_and_reads_back(node, client, clients):
    schema_id = client.register_schema("users-value", avro(USER))
    fresh = clients(node.registry_url)  # no client-side cache
    assert fresh.register_schema("users-value", avro(USER)) == schema_id
    assert fresh.register_schema("other-value", avro(USER)) == schema_id, "one schema, one id in every subject"
    assert json.loads(fresh.get_schema(schema_id).schema_str) == USER
    v2_id = fresh.register_schema("users-value", avro(USER_V2))
    assert v2_id != schema_id
    assert fresh.get_versions("users-value") == [1, 2]
    latest = fresh.get_latest_version("users-value")
    assert (latest.schema_id, latest.version, latest.subject, json.loads(latest.schema.schema_str)) == (v2_id, 2, "users-value", USER_V2)
    first = fresh.get_version("users-value", 1)
    assert (first.schema_id, first.version) == (schema_id, 1)
    found = fresh.lookup_schema("users-value", avro(USER))
    assert (found.schema_id, found.version) == (schema_id, 1)
    assert fresh.get_subjects() == ["other-value", "users-value"]
    assert sorted(fresh.get_subjects_by_schema_id(schema_id)) == ["other-value", "users-value"]
    assert fresh.get_schema_types() == ["JSON", "PROTOBUF", "AVRO"]


def test_error_codes_as_the_client_surfaces_them(client):
    assert error_of(lambda: client.get_versions("nobody")) == (404, 40401)
    assert error_of(lambda: client.get_latest_version("nobody")) == (404, 40401)
    assert error_of(lambda: client.get_schema(424242)) == (404, 40403)
    client.register_schema("users-value", avro(USER))
    assert error_of(lambda: client.lookup_schema("users-value", avro(USER_V2))) == (404, 40403)
    assert error_of(lambda: client.register_schema("users-value", avro(USER_INCOMPATIBLE))) == (409, 409)
    assert error_of(lambda: client.register_schema("users-value", Schema('{"type": "record", "name": "X"}', "AVRO"))) == (422, 42201)
    assert error_of(lambda: client.get_version("users-value", 7)) == (404, 40402)
    assert error_of(lambda: client.set_compatibility(level="SIDEWAYS")) == (422, 42203)


def test_delete_soft_then_hard(node, client, clients):
    client.register_schema("users-value", avro(USER))
    v2_id = client.register_schema("users-value", avro(USER_V2))
    assert error_of(lambda: client.delete_version("users-value", 1, permanent=True)) == (404, 40407)
    assert client.delete_version("users-value", 1) == 1
    assert client.get_versions("users-value") == [2]
    assert client.get_versions("users-value", deleted=True) == [1, 2]
    assert error_of(lambda: client.delete_subject("users-value", permanent=True)) == (404, 40405)
    assert client.delete_subject("users-value") == [2]
    assert client.get_subjects() == []
    assert error_of(lambda: client.get_versions("users-value")) == (404, 40401)
    assert sorted(client.delete_subject("users-value", permanent=True)) == [1, 2]
    assert error_of(lambda: client.delete_subject("users-value")) == (404, 40401)
    assert json.loads(clients(node.registry_url).get_schema(v2_id).schema_str) == USER_V2, "ids stay resolvable (docs/GAPS.md)"


def test_compatibility_config_global_and_per_subject(client):
    assert client.get_compatibility() == "BACKWARD"
    client.register_schema("users-value", avro(USER))
    assert client.test_compatibility("users-value", avro(USER_V2)) is True
    assert client.test_compatibility("users-value", avro(USER_INCOMPATIBLE)) is False
    assert client.set_compatibility("users-value", "NONE") == {"compatibility": "NONE"}
    assert client.get_compatibility("users-value") == "NONE"
    assert client.test_compatibility("users-value", avro(USER_INCOMPATIBLE)) is True
    assert client.register_schema("users-value", avro(USER_INCOMPATIBLE)) > 0
    assert client.set_compatibility(level="FORWARD") == {"compatibility": "FORWARD"}
    assert client.get_compatibility() == "FORWARD"
    client.register_schema("orders-value", avro(USER))
    # FORWARD: the old schema must read the new one's data; a new field without default is fine,
    # dropping a field the old one needs without a default is not
    assert client.test_compatibility("orders-value", avro({**USER, "fields": [*USER["fields"], {"name": "x", "type": "long"}]})) is True
    assert client.test_compatibility("orders-value", avro({**USER, "fields": USER["fields"][:1]})) is False
    assert error_of(lambda: client.register_schema("orders-value", avro({**USER, "fields": USER["fields"][:1]}))) == (409, 409)


def test_avro_records_through_neve_come_back_exactly(node, client, clients):
    topic = f"users-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": node.bootstrap})  # kept: the future dies with its handle
    admin.create_topics([NewTopic(topic, 2)])[topic].result(30)
    schema = {
        "type": "record",
        "name": "Event",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "name", "type": "string"},
            {"name": "score", "type": "double"},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "attrs", "type": {"type": "map", "values": "int"}},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
            {"name": "raw", "type": "bytes"},
            {"name": "note", "type": ["null", "string"], "default": None},
        ],
    }
    serializer = AvroSerializer(client, json.dumps(schema))
    records = [
        {"id": i, "name": f"n{i}" * (i % 5), "score": i / 7, "tags": [str(j) for j in range(i % 3)], "attrs": {"k": i}, "kind": "AB"[i % 2], "raw": bytes([i % 256]) * (i % 4), "note": None if i % 2 else f"note {i}"}
        for i in range(200)
    ]
    producer = Producer({"bootstrap.servers": node.bootstrap, "enable.idempotence": True})
    delivered = []
    for r in records:
        value = serializer(r, SerializationContext(topic, MessageField.VALUE))
        producer.produce(topic, key=str(r["id"]).encode(), value=value, on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(60) == 0 and delivered == [None] * len(records)
    schema_id = client.get_latest_version(f"{topic}-value").schema_id

    deserializer = AvroDeserializer(clients(node.registry_url))
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "g", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got = {}
    try:
        while len(got) < len(records):
            msg = consumer.poll(30)
            assert msg is not None, f"only {len(got)} of {len(records)} records consumed"
            assert msg.error() is None
            assert unframe(msg.value())[0] == schema_id
            got[int(msg.key())] = deserializer(msg.value(), SerializationContext(topic, MessageField.VALUE))
    finally:
        consumer.close()
    assert [got[i] for i in range(len(records))] == records


def test_two_brokers_on_one_etcd_register_concurrently(etcd_server, artifacts_dir, clients):
    root = f"t{uuid.uuid4().hex[:12]}"
    nodes, urls = [], []
    try:
        for i in range(2):
            port = free_port()
            env = {
                "NEVE_METADATA_URL": f"{etcd_server.url}/{root}",
                "NEVE_WAL_OBJECT_STORE": f"file://{artifacts_dir / 'objects'}",
                "NEVE_BROKER_NODE_ID": str(i),
                "NEVE_REGISTRY_PORT": str(port),
                "NEVE_DATA_DIR": str(artifacts_dir / f"broker{i}-data"),
            }
            nodes.append(NeveNode(data_dir=artifacts_dir / f"broker{i}-data", log_path=artifacts_dir / f"broker{i}.log", env=env, command="broker").start())
            urls.append(f"http://127.0.0.1:{port}")
        schemas = [{"type": "record", "name": f"R{n}", "fields": [{"name": "f", "type": "int"}]} for n in range(8)]
        barrier = threading.Barrier(len(urls) * 2)
        results: dict[tuple[int, int], list[int]] = {}

        def register(thread: int, url: str) -> None:
            client = clients(url)
            barrier.wait(30)
            ids = []
            for n, schema in enumerate(schemas):
                # every thread registers every schema in the same subject (and a subject of its own)
                ids.append(client.register_schema(f"shared-{n % 2}", avro(schema) if n < 2 else avro(schemas[n % 2])))
                ids.append(client.register_schema(f"s{n}", avro(schema)))
            results[(thread, 0)] = ids

        threads = [threading.Thread(target=register, args=(t, urls[t % 2])) for t in range(len(urls) * 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(results) == len(threads), "a registering thread failed"
        first, *rest = results.values()
        assert all(r == first for r in rest), results
        both = [clients(u) for u in urls]
        for c in both:
            # one id per distinct schema, one version per subject
            assert c.get_versions("shared-0") == [1] and c.get_versions("shared-1") == [1]
            assert [c.get_versions(f"s{n}") for n in range(8)] == [[1]] * 8
            assert len({c.get_version(f"s{n}").schema_id for n in range(8)}) == 8
            assert c.get_version("shared-0").schema_id == c.get_version("s0").schema_id
        # a registration on one broker is read by the other at once
        new_id = both[0].register_schema("late", avro({"type": "record", "name": "Late", "fields": []}))
        assert json.loads(both[1].get_schema(new_id).schema_str) == {"type": "record", "name": "Late", "fields": []}
        assert both[1].get_latest_version("late").schema_id == new_id
    finally:
        for n in nodes:
            try:
                n.stop()
            except Exception:  # noqa: BLE001 - as neve_factory does: a node that will not stop is killed
                n.kill9()


def test_neve_registry_serves_only_the_registry(etcd_server, artifacts_dir, clients):
    port = free_port()
    env = {**os.environ, "NEVE_METADATA_URL": f"{etcd_server.url}/t{uuid.uuid4().hex[:12]}", "NEVE_REGISTRY_PORT": str(port)}
    with open(artifacts_dir / "registry.log", "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "neve", "registry"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (artifacts_dir / "registry.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "neve registry not listening after 60 s"
                time.sleep(0.05)
        client = clients(f"http://127.0.0.1:{port}")
        schema_id = client.register_schema("alone-value", avro(USER))
        assert json.loads(clients(f"http://127.0.0.1:{port}").get_schema(schema_id).schema_str) == USER
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0

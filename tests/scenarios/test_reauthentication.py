"""KIP-368 with the Java client and librdkafka on `neve dev`: a node whose SASL sessions last 3
seconds (connections_max_reauth_ms) tells each client that lifetime when it authenticates, and a
consumer re-authenticates on its open connections before each lifetime ends: it keeps consuming,
records produced after several lifetimes passed still reach it, and it never has to reconnect
(the node logs each re-authentication; the number of first authentications, one per connection,
stays that of a client's few connections)."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer

from tests.clients.java_client import JavaProcess
from tests.scenarios.secure_node import WAIT_S, SecureNode, rdkafka_produce, start_secure_node

LIFETIME_MS = 3000


@pytest.fixture
def short_sessions(artifacts_dir):
    node = start_secure_node(artifacts_dir / "reauth-node", {"NEVE_BROKER_CONNECTIONS_MAX_REAUTH_MS": str(LIFETIME_MS)})
    yield node
    node.node.stop()


def authentications(node: SecureNode, reauthentication: bool) -> list[dict]:
    return [e for e in node.log_events("sasl_authenticated") if e["reauthentication"] is reauthentication]


def wait_for_reauthentications(node: SecureNode, count: int, meanwhile=lambda: time.sleep(0.2)) -> None:
    """Until the node logged `count` re-authentications (each comes before a session's lifetime
    ends: waiting for them is waiting for lifetimes to pass), calling `meanwhile` between looks."""
    deadline = time.monotonic() + WAIT_S
    while len(authentications(node, True)) < count:
        assert time.monotonic() < deadline, f"{len(authentications(node, True))} re-authentications, waited for {count}"
        meanwhile()


def check_no_reconnection_storm(node: SecureNode, principal: str) -> None:
    """Re-authenticated on the same connections, never refused, never cut off for an expired
    session; a client's connections are the bootstrap one, the broker's and the coordinator's at
    most (a client reconnecting at each lifetime would authenticate anew every 3 seconds)."""
    reauthenticated = authentications(node, True)
    first = authentications(node, False)
    assert len(reauthenticated) >= 4
    assert {e["principal"] for e in reauthenticated + first} == {principal}
    assert {e["session_lifetime_ms"] for e in reauthenticated + first} == {LIFETIME_MS}
    assert node.log_events("sasl_authentication_failed") == []
    assert [e for e in node.log_events("connection_closed") if e["reason"] == "authentication expired"] == []
    assert len(first) <= 3, [e["ts"] for e in first]


def test_a_java_consumer_keeps_consuming_across_reauthentications(short_sessions: SecureNode, java_client, artifacts_dir):
    node = short_sessions
    plain = {"bootstrap.servers": node.node.bootstrap}  # the producer comes in on PLAINTEXT: every SASL session is the consumer's
    topic = "reauthenticated"
    assert rdkafka_produce(plain, topic, [str(i).encode() for i in range(10)]) == [(0, i) for i in range(10)]
    config = node.java_scram("alice") | {"client.id": "reauth-consumer"}
    args = ["consume", "--bootstrap", node.sasl_bootstrap, "--topic", topic, "--partitions", "1", "--expect", "30", "--timeout-ms", str(WAIT_S * 1000 * 2)]
    consumer = JavaProcess(args, artifacts_dir / "java-consumer.log", config=config)
    try:
        wait_for_reauthentications(node, 2)  # a first lifetime has passed
        assert rdkafka_produce(plain, topic, [str(i).encode() for i in range(10, 20)]) == [(0, i) for i in range(10, 20)]
        seen = len(authentications(node, True))
        wait_for_reauthentications(node, seen + 2)
        assert rdkafka_produce(plain, topic, [str(i).encode() for i in range(20, 30)]) == [(0, i) for i in range(20, 30)]
        lines = consumer.finish(WAIT_S * 3)
    finally:
        if consumer.process.poll() is None:
            consumer.process.kill()
    assert [line for line in lines if not line.startswith("end ")] == [f"0 {i} {i}" for i in range(30)]
    check_no_reconnection_storm(node, "User:alice")


def test_a_librdkafka_consumer_keeps_consuming_across_reauthentications(short_sessions: SecureNode):
    node = short_sessions
    plain = {"bootstrap.servers": node.node.bootstrap}
    topic = "reauthenticated-rdkafka"
    got: list[bytes] = []
    consumer = Consumer({**node.rdkafka_sasl("SCRAM-SHA-512", "bob"), "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest", "enable.auto.commit": False})

    def poll() -> None:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            got.append(msg.value())

    def poll_until(count: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while len(got) < count:
            assert time.monotonic() < deadline, f"{len(got)} records, waited for {count}"
            poll()

    try:
        assert rdkafka_produce(plain, topic, [b"0", b"1", b"2"]) == [(0, 0), (0, 1), (0, 2)]
        consumer.subscribe([topic])
        poll_until(3)
        wait_for_reauthentications(node, 2, poll)
        assert rdkafka_produce(plain, topic, [b"3", b"4", b"5"]) == [(0, 3), (0, 4), (0, 5)]
        poll_until(6)
        wait_for_reauthentications(node, len(authentications(node, True)) + 2, poll)
        assert rdkafka_produce(plain, topic, [b"6", b"7", b"8"]) == [(0, 6), (0, 7), (0, 8)]
        poll_until(9)
    finally:
        consumer.close()
    assert got == [str(i).encode() for i in range(9)]
    check_no_reconnection_storm(node, "User:bob")

"""KIP-368 with the Java client on `neve dev`: a node whose SASL sessions last 3 seconds
(connections_max_reauth_ms) tells each client that lifetime when it authenticates, and a Java
consumer re-authenticates on its open connections before each lifetime ends: it keeps consuming,
records produced after several lifetimes passed still reach it, and it never has to reconnect
(the node logs each re-authentication; the number of first authentications, one per connection,
stays that of a client's few connections)."""

from __future__ import annotations

import time

import pytest

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


def wait_for_reauthentications(node: SecureNode, count: int) -> None:
    """Until the node logged `count` re-authentications (each comes before a session's lifetime
    ends: waiting for them is waiting for lifetimes to pass)."""
    deadline = time.monotonic() + WAIT_S
    while len(authentications(node, True)) < count:
        assert time.monotonic() < deadline, f"{len(authentications(node, True))} re-authentications, waited for {count}"
        time.sleep(0.2)


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
    # re-authenticated on the same connections, never refused, never cut off for an expired session
    reauthenticated = authentications(node, True)
    first = authentications(node, False)
    assert len(reauthenticated) >= 4
    assert {e["principal"] for e in reauthenticated + first} == {"User:alice"}
    assert {e["session_lifetime_ms"] for e in reauthenticated + first} == {LIFETIME_MS}
    assert node.log_events("sasl_authentication_failed") == []
    assert [e for e in node.log_events("connection_closed") if e["reason"] == "authentication expired"] == []
    # a client's connections: the bootstrap one, the broker's, the coordinator's at most; a client
    # reconnecting at each lifetime would authenticate anew every 3 seconds instead
    assert len(first) <= 3, [e["ts"] for e in first]

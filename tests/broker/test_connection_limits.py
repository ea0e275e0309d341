"""Issue 43: Kafka's connection bounds (broker/connection_limits.py): max.connections,
max.connections.per.ip with overrides, KIP-612's creation rate; and on `neve dev`, a flood of
3,000 connections from one address past max_connections_per_ip=1,000: the 2,000 past it closed as
accepted and counted, the broker serving again once the flood ends."""

from __future__ import annotations

import resource
import socket
import struct

import pytest

from broker.config import BrokerConfig
from broker.connection_limits import RESERVED_FILES, ConnectionLimits, parse_overrides
from tests.broker.test_pre_authentication import FLOOD, connections, produce, sasl_node, wait_for
from tests.neve.test_metrics import scrape


def test_the_bounds_count_each_address_and_the_broker_and_the_rate():
    now = [0.0]
    limits = ConnectionLimits(BrokerConfig(max_connections=6, max_connections_per_ip=2, max_connections_per_ip_overrides="10.0.0.9:3", max_connection_creation_rate=4), clock=lambda: now[0])
    assert [limits.admit("10.0.0.1") for _ in range(3)] == [None, None, "max_connections_per_ip"]
    assert [limits.admit("10.0.0.9") for _ in range(3)] == [None, None, "max_connection_creation_rate"]  # 4 a second
    now[0] = 1.0
    assert [limits.admit("10.0.0.9"), limits.admit("10.0.0.9")] == [None, "max_connections_per_ip"]  # its override: 3
    assert [limits.admit("10.0.0.2"), limits.admit("10.0.0.3")] == [None, "max_connections"]  # 6 held
    limits.release("10.0.0.1")
    assert limits.admit("10.0.0.3") is None and limits.total == 6
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert ConnectionLimits(BrokerConfig()).max_connections == max(soft - RESERVED_FILES, soft // 2)
    assert parse_overrides(" a:1, ::1:7 ,") == {"a": 1, "::1": 7}
    with pytest.raises(ValueError, match="is not host:count"):
        parse_overrides("a:b")


@pytest.mark.integration
def test_a_flood_past_the_bound_of_one_address_is_refused_and_the_broker_goes_on(neve_factory, tmp_path):
    node, port, metrics_port = sasl_node(neve_factory, tmp_path, NEVE_BROKER_MAX_CONNECTIONS_PER_IP=str(FLOOD))
    refused_before = scrape(metrics_port).get('neve_connections_refused_total{listener="SASL_PLAINTEXT",reason="max_connections_per_ip"}', 0.0)
    flood, closed = [], 0
    try:
        for _ in range(3 * FLOOD):
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            s.sendall(struct.pack(">ih", 512 * 1024, 36))
            flood.append(s)
        wait_for("the flood's first thousand held", lambda: connections(metrics_port, "authenticating") == FLOOD)
        counter = 'neve_connections_refused_total{listener="SASL_PLAINTEXT",reason="max_connections_per_ip"}'
        wait_for("the rest refused", lambda: scrape(metrics_port).get(counter, 0.0) - refused_before == 2 * FLOOD)
        for s in flood:
            s.settimeout(0)
            try:
                closed += s.recv(1) == b""
            except (BlockingIOError, ConnectionResetError) as e:
                closed += isinstance(e, ConnectionResetError)
        assert closed == 2 * FLOOD
    finally:
        for s in flood:
            s.close()
    wait_for("the flood's connections gone", lambda: connections(metrics_port, "authenticating") == 0)
    assert produce(port, "after-flood", [b"v"]) == [0]  # the broker serves the address again

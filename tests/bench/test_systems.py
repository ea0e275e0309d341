"""The bench's systems start on ports of their own even when the free port they picked is taken
before the broker binds it (parallel test workers pick ports the same way)."""

from __future__ import annotations

import socket

import pytest

from bench.servers import PORT_ATTEMPTS, Etcd, SeaweedFS, Servers, start_on_free_ports
from bench.systems import NeveDev


@pytest.mark.integration
def test_a_taken_port_is_replaced_not_mistaken_for_the_broker(tmp_path):
    system = NeveDev(tmp_path / "system", tmp_path / "broker.log", {}, Servers(tmp_path / "servers", tmp_path))
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", system.port))
    squatter.listen()  # accepts connections on the broker's port: a readiness probe would be fooled
    taken = system.port
    try:
        system.start()
        assert system.port != taken
        assert system.process.poll() is None
        assert "address already in use" in (tmp_path / "broker.log").read_text()
        assert system.metrics()["neve_wal_object_puts_total"] == 0  # this broker's own metrics port
        with socket.create_connection(("127.0.0.1", system.port), timeout=5):
            pass
    finally:
        system.stop()
        squatter.close()


@pytest.mark.integration
def test_seaweedfs_and_etcd_move_off_a_taken_port(tmp_path):
    """The same for the servers a run starts (an A/B run once lost a step to SeaweedFS's master
    port being taken between its pick and its bind)."""
    s3, etcd = SeaweedFS(tmp_path / "weed", tmp_path / "seaweedfs.log"), Etcd(tmp_path / "etcd", tmp_path / "etcd.log")
    squatters = []
    for port in (s3.ports["master.port"], etcd.client_port):
        squatter = socket.socket()
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        squatters.append(squatter)
    taken = (s3.ports["master.port"], etcd.client_port)
    try:
        s3.start()
        etcd.start()
        assert (s3.ports["master.port"], etcd.client_port) != taken
        assert taken[0] not in s3.ports.values() and taken[1] != etcd.client_port
        assert s3.process.poll() is None and etcd.process.poll() is None  # both started (their buckets and health answered)
        assert "Port allocation failed" in (tmp_path / "seaweedfs.log").read_text()  # weed mini checks its ports first
        assert "address already in use" in (tmp_path / "etcd.log").read_text()
    finally:
        s3.stop()
        etcd.stop()
        for squatter in squatters:
            squatter.close()


def test_other_start_errors_are_not_retried():
    starts, stops, picks = [], [], []

    def start():
        starts.append(1)
        raise RuntimeError("server exited with 1; log: no such flag")

    with pytest.raises(RuntimeError, match="no such flag"):
        start_on_free_ports(start, lambda: stops.append(1), lambda: picks.append(1))
    assert (len(starts), len(stops), len(picks)) == (1, 1, 0)


def test_a_taken_port_is_tried_again_at_most_port_attempts_times():
    starts, picks = [], []

    def start():
        starts.append(1)
        raise RuntimeError("listen tcp 127.0.0.1:60339: bind: address already in use")

    with pytest.raises(RuntimeError, match="address already in use"):
        start_on_free_ports(start, lambda: None, lambda: picks.append(1))
    assert (len(starts), len(picks)) == (PORT_ATTEMPTS, PORT_ATTEMPTS - 1)

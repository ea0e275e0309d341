"""The bench's systems start on ports of their own even when the free port they picked is taken
before the broker binds it (parallel test workers pick ports the same way)."""

from __future__ import annotations

import socket

import pytest

from bench.servers import Servers
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

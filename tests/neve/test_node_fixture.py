"""The fixture layer's NeveNode: a port another process took between its pick and the node's bind
is not mistaken for the node listening (a connection would reach that other process); the node
starts again on another port."""

from __future__ import annotations

import socket

from tests.fixtures import NeveNode


def test_a_node_whose_port_was_taken_starts_on_another(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node = NeveNode(data_dir=tmp_path / "data", log_path=tmp_path / "node.log", port=port)
        try:
            node.start()
            assert node.port != port
            assert node.process.poll() is None
            log = node.log_path.read_text()
            assert "address already in use" in log and f"neve listening on 127.0.0.1:{node.port};" in log
        finally:
            assert node.stop() == 0

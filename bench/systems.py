"""The systems a benchmark can run against, behind one interface, picked by name with `--system`.

Each system starts its own processes on free loopback ports with its own temporary directories,
and answers what the scenarios measure: the broker processes' CPU seconds, what its object store
holds, its Prometheus counters, and an object store of the same kind for the raw PUT ceiling.
Today: `neve-dev` (one `neve dev` process: embedded metadata, local-filesystem objects). The
etcd + SeaweedFS deployment and the tansu peer are further implementations of `System`.
"""

from __future__ import annotations

import abc
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from . import procstat

READY_TIMEOUT_S = 60.0


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class System(abc.ABC):
    name: str

    @property
    @abc.abstractmethod
    def bootstrap(self) -> str:
        """host:port for Kafka clients."""

    @property
    @abc.abstractmethod
    def started(self) -> bool: ...

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

    def metrics(self) -> dict[str, float]:
        """The broker's Prometheus samples (name{labels} -> value); empty when not exposed."""
        return {}

    @abc.abstractmethod
    def wal_settings(self) -> WalSettings: ...

    @abc.abstractmethod
    def ceiling_store(self):
        """A fresh wal.store.ObjectStore of the same kind and location as the system's, for the raw
        PUT ceiling; the caller closes it and calls `clear_ceiling_store` afterwards."""

    def clear_ceiling_store(self) -> None:  # noqa: B027 - optional hook
        """Remove whatever the ceiling measurement wrote."""

    @abc.abstractmethod
    def describe(self) -> dict: ...

    def check_alive(self) -> None:
        """Raise SystemError_ if a process of the system has exited."""


class NeveDev(System):
    """`python -m neve dev` with its own data dir and port; env overrides (NEVE_*) pass through."""

    name = "neve-dev"

    def __init__(self, work_dir: Path, log_path: Path, env: dict[str, str]) -> None:
        self.work_dir = work_dir
        self.data_dir = work_dir / "neve-data"
        self.log_path = log_path
        self.port = free_port()
        self.metrics_port = free_port()
        self.env = {"NEVE_BROKER_METRICS_PORT": str(self.metrics_port), **env}
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def started(self) -> bool:
        return self.process is not None

    @property
    def objects_dir(self) -> Path:
        return self.data_dir / "objects"

    def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "neve", "dev", "--data-dir", str(self.data_dir), "--port", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a Ctrl-C in the terminal reaches the bench, which stops us in order
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise SystemError_(f"neve dev not listening on {self.port} after {READY_TIMEOUT_S:.0f}s; log: {self.log_path}")

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise SystemError_(f"neve dev exited with {self.process.returncode}; log: {self.log_path}\n{tail}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def broker_pids(self) -> list[int]:
        return [self.process.pid] if self.process is not None else []

    def stored_objects(self) -> StoredObjects | None:
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

    def metrics(self) -> dict[str, float]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        return parse_prometheus(text)

    def wal_settings(self) -> WalSettings:
        from neve.config import load_config  # the broker's own defaults and env precedence

        wal = load_config(env={**os.environ, **self.env}).wal
        return WalSettings(wal.linger_ms, wal.flush_bytes, wal.max_inflight_uploads)

    def ceiling_store(self):
        from wal.store import FileObjectStore

        return FileObjectStore(str(self.work_dir / "ceiling-objects"))

    def clear_ceiling_store(self) -> None:
        import shutil

        shutil.rmtree(self.work_dir / "ceiling-objects", ignore_errors=True)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "object_store": f"file://{self.objects_dir}",
            "metadata": "embedded",
            "env": {k: v for k, v in sorted(self.env.items()) if k != "NEVE_BROKER_METRICS_PORT"},
            "wal": _settings_dict(self.wal_settings()),
            "log": str(self.log_path),
        }


def _settings_dict(s: WalSettings) -> dict:
    return {"linger_ms": s.linger_ms, "flush_bytes": s.flush_bytes, "max_inflight_uploads": s.max_inflight_uploads}


def parse_prometheus(text: str) -> dict[str, float]:
    """Samples of the text exposition format; comments and malformed lines are skipped."""
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


SYSTEMS = {NeveDev.name: NeveDev}

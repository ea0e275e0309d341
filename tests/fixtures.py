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

READY_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class NeveNode:
    """A `neve dev` process. `restart()` reuses the same data dir and port."""

    data_dir: Path
    log_path: Path
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None
    _starts: int = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> NeveNode:
        self._starts += 1
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        log.write(f"--- start #{self._starts}\n".encode())
        log.flush()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "neve", "dev", "--data-dir", str(self.data_dir), "--port", str(self.port), *self.extra_args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"neve dev exited with {self.process.returncode}; log: {self.log_path}\n{self.log_path.read_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"neve dev not listening on {self.port} after {READY_TIMEOUT}s; log: {self.log_path}")

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
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
                raise
        return self.process.returncode

    def restart(self) -> NeveNode:
        self.stop()
        return self.start()

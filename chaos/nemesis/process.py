"""The cluster's processes as the nemesis handles them: one `Node` per process (a broker, an etcd member, SeaweedFS,
PostgreSQL, a compactor), which it kills with SIGKILL, pauses with SIGSTOP, resumes and starts again."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Node:
    """One process of the cluster. `process()` gives its current Popen (the launcher owns it and makes a new one at
    each start); `start()` starts it again on the ports and data it had and returns once it serves; `stop()` stops
    it gracefully. `host` is its address, `netns` its namespace (None without namespaces)."""

    name: str
    kind: str  # "broker", "etcd", "s3", "postgres", "compactor"
    host: str
    process: Callable[[], subprocess.Popen | None]
    start: Callable[[], None]
    stop: Callable[[], None]
    netns: str | None = None
    paused: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def pid(self) -> int | None:
        """The process's pid while it runs, else None."""
        p = self.process()
        return p.pid if p is not None and p.poll() is None else None

    def alive(self) -> bool:
        return self.pid() is not None

    def _signal(self, sig: int) -> None:
        pid = self.pid()
        if pid is None:
            return
        # a server started in a session of its own (bench/servers.spawn) leads its process group: the signal reaches
        # its children too (PostgreSQL's backends keep serving while only the postmaster is stopped); a neve process
        # shares the harness's group, so only it is signalled
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)

    def kill9(self) -> None:
        """SIGKILL, then reap it."""
        with self._lock:
            self._signal(signal.SIGKILL)
            self.paused = False
            p = self.process()
            if p is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(10)

    def pause(self) -> None:
        with self._lock:
            self._signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        with self._lock:
            self._signal(signal.SIGCONT)
            self.paused = False

    def restart(self) -> None:
        """Kill it if it runs (SIGCONT first would let a paused one act again; SIGKILL needs none), then start it."""
        self.kill9()
        self.start()

    def ensure_running(self) -> bool:
        """Resume it and, if it is dead, start it again; True if it had to be started."""
        self.resume()
        if self.alive():
            return False
        self.start()
        return True

    def describe(self) -> dict:
        return {"kind": self.kind, "host": self.host, "netns": self.netns, "pid": self.pid(), "paused": self.paused}

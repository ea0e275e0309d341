"""A consumer-group member of any client, as a scenario test sees it.

Every client's member behaves the same way (the drivers implement it in their own language):
subscribe with auto-commit off; process at most `batch` records at a time and never more than its
quota in total (past it, every assigned partition is paused; records polled beyond it are sought
back to); commit each processed batch synchronously before polling again; report what it did as
events. The test raises quotas and stops members while watching the events, so members join and
leave at known points of the consumption, without sleeps.

Events (dicts, in the order the member produced them; the test adds "at", its monotonic clock):
    {"type": "started"}                         its consumer exists and is about to subscribe
    {"type": "assigned", "partitions": [...]}   its whole assignment after a rebalance
    {"type": "revoked", "partitions": [...]}    partitions taken away (clients that report it)
    {"type": "batch", "records": [[p, o, value], ...], "error": None | "..."}
        one processed batch, then committed; `error` says why the commit failed
        ("abandoned: ..." when told to close without committing it)
    {"type": "closed"}                          it closed and left the group
    {"type": "exited", "code": int, "log": str} its process or thread ended
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ABANDONED = "abandoned: closed before committing"


class MemberError(RuntimeError):
    """A member failed, or an awaited condition did not come true in time."""


@dataclass(frozen=True)
class Batch:
    member: str
    records: tuple[tuple[int, int, str], ...]  # (partition, offset, value)
    error: str | None  # why its commit failed; None when committed

    def next_offsets(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for p, o, _ in self.records:
            out[p] = max(out.get(p, 0), o + 1)
        return out


class Board:
    """Where every member of one test posts its events; tests wait on conditions over all of them."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.members: list[Member] = []

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not condition():
                failed = [m for m in self.members if m.failed()]
                if failed:
                    raise MemberError(f"while waiting for {what}: member {failed[0].name} ended: {failed[0].describe()}\n{self.timeline()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    states = "; ".join(m.describe() for m in self.members)
                    raise MemberError(f"timed out after {timeout}s waiting for {what}; {states}\n{self.timeline()}")
                self.cond.wait(min(left, 0.5))

    def timeline(self) -> str:
        """Every member's events in time order, one line each (batches summarised), for failures."""
        events = sorted(((e["at"], m.name, e) for m in self.members for e in m.events), key=lambda t: t[0])
        if not events:
            return "(no events)"
        t0 = events[0][0]
        lines = []
        for at, name, e in events:
            if e["type"] == "batch":
                detail = f"{len(e['records'])} records" + (f", commit failed: {e['error']}" if e["error"] else "")
            elif e["type"] in ("assigned", "revoked"):
                detail = str(e["partitions"])
            elif e["type"] == "exited":
                detail = f"code {e['code']}"
            else:
                detail = ""
            lines.append(f"{at - t0:8.3f} {name} {e['type']} {detail}")
        return "timeline:\n" + "\n".join(lines)

    def batches(self) -> list[Batch]:
        with self.cond:
            return [b for m in self.members for b in m.batches()]


class Member:
    """The test's side of one member: its events, its quota, and how to stop it."""

    def __init__(self, name: str, board: Board, quota: int | None) -> None:
        self.name = name
        self.board = board
        self.quota = quota
        self.events: list[dict] = []
        with board.cond:
            board.members.append(self)

    # -- what drivers call -------------------------------------------------------------------

    def post(self, event: dict) -> None:
        event["at"] = time.monotonic()
        with self.board.cond:
            self.events.append(event)
            self.board.cond.notify_all()

    def set_quota(self, quota: int | None) -> None:
        """Let it process `quota` records in all (None: no limit)."""
        with self.board.cond:
            self.quota = quota
        self._send_quota(quota)

    # -- what drivers implement --------------------------------------------------------------

    def _send_quota(self, quota: int | None) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 30.0) -> None:
        """Ask it to close (leaving the group) and wait until it has."""
        raise NotImplementedError

    def abandon(self) -> None:
        """Let it process one more batch (the quota must allow it), report it with an error
        starting "abandoned" and close without committing it: a consumer that dies between
        processing and committing."""
        raise NotImplementedError

    def kill(self) -> None:
        """Teardown: end it however it can be ended."""
        raise NotImplementedError

    # -- what tests read (call with board.cond held, or accept a snapshot) --------------------

    def batches(self) -> list[Batch]:
        return [Batch(self.name, tuple(map(tuple, e["records"])), e["error"]) for e in self.events if e["type"] == "batch"]

    def processed(self) -> int:
        return sum(len(e["records"]) for e in self.events if e["type"] == "batch")

    def assignment(self) -> frozenset[int]:
        current: set[int] = set()
        for e in self.events:
            if e["type"] == "assigned":
                current = set(e["partitions"])
            elif e["type"] == "revoked":
                current -= set(e["partitions"])
            elif e["type"] in ("closed", "exited"):
                current = set()
        return frozenset(current)

    def assigned_once(self) -> bool:
        return any(e["type"] == "assigned" and e["partitions"] for e in self.events)

    def started(self) -> bool:
        return any(e["type"] == "started" for e in self.events)

    def closed(self) -> bool:
        return any(e["type"] == "closed" for e in self.events)

    def failed(self) -> bool:
        return any(e["type"] == "exited" and e["code"] != 0 for e in self.events) or (
            any(e["type"] == "exited" for e in self.events) and not self.closed()
        )

    def describe(self) -> str:
        exited = [e for e in self.events if e["type"] == "exited"]
        tail = f", exited {exited[-1]['code']}: {exited[-1]['log'][-2000:]}" if exited else ""
        return f"{self.name}: processed {self.processed()}, assignment {sorted(self.assignment())}{tail}"


class ProcessMember(Member):
    """A member run by a subprocess driver (Java, kafkajs) that prints JSON event lines on stdout
    and reads "quota N" / "quota none" / "stop" lines on stdin; its stderr goes to `log_path`."""

    def __init__(self, name: str, board: Board, quota: int | None, argv: list[str], log_path: Path, cwd: Path | None = None) -> None:
        super().__init__(name, board, quota)
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed when the process ends
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, cwd=cwd, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, name=f"member-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            line = line.strip()
            if line.startswith("{"):
                self.post(json.loads(line))
        code = self.process.wait()
        self.process.stdout.close()
        self._log.close()
        self.post({"type": "exited", "code": code, "log": self.log_path.read_text(errors="replace")})

    def _send(self, line: str) -> None:
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # it has exited; the "exited" event tells the test

    def _send_quota(self, quota: int | None) -> None:
        self._send(f"quota {'none' if quota is None else quota}")

    def abandon(self) -> None:
        self._send("abandon")

    def stop(self, timeout: float = 30.0) -> None:
        self._send("stop")
        self.board.wait(lambda: any(e["type"] == "exited" for e in self.events), timeout, f"{self.name} to close")
        if not self.closed():
            raise MemberError(f"{self.name} did not close cleanly: {self.describe()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._reader.join(10)
        try:
            self.process.stdin.close()
        except BrokenPipeError:
            pass


@dataclass
class Control:
    """What an in-process (thread) member reads: its quota and whether to stop."""

    quota: int | None
    stop: threading.Event = field(default_factory=threading.Event)
    abandon: threading.Event = field(default_factory=threading.Event)

    def room(self, processed: int) -> int:
        quota = self.quota
        return 1 << 30 if quota is None else max(0, quota - processed)


class ThreadMember(Member):
    """A member run in a thread of the test process (librdkafka, aiokafka): `run(control, post)`
    is the driver's loop; it returns after closing its consumer."""

    def __init__(self, name: str, board: Board, run: Callable[[Control, Callable[[dict], None]], None], quota: int | None) -> None:
        super().__init__(name, board, quota)
        self.control = Control(quota)
        self._thread = threading.Thread(target=self._main, args=(run,), name=f"member-{name}", daemon=True)
        self._thread.start()

    def _main(self, run) -> None:
        try:
            run(self.control, self.post)
        except BaseException as e:  # noqa: BLE001 - reported to the waiting test
            self.post({"type": "exited", "code": 1, "log": f"{type(e).__name__}: {e}"})
            return
        self.post({"type": "exited", "code": 0, "log": ""})

    def _send_quota(self, quota: int | None) -> None:
        self.control.quota = quota

    def abandon(self) -> None:
        self.control.abandon.set()

    def stop(self, timeout: float = 30.0) -> None:
        self.control.stop.set()
        self.board.wait(lambda: any(e["type"] == "exited" for e in self.events), timeout, f"{self.name} to close")
        if not self.closed():
            raise MemberError(f"{self.name} did not close cleanly: {self.describe()}")

    def kill(self) -> None:
        self.control.stop.set()
        self._thread.join(30)

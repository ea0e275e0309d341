"""The history of a chaos run: every client operation and every fault, one JSON object per line,
as Jepsen records them. It is the only thing the checker reads, so it owns the format.

An operation is recorded twice by the process that runs it: an `invoke` line before it starts, and
one completion line after, of type `ok` (it happened), `fail` (it certainly did not happen: an
aborted transaction, a send refused with a non-retriable error) or `info` (unknown: a timeout, a
crash). The nemesis records its faults as `info` lines of process "nemesis".

Each line:

    {"index": 17, "time": 12.345, "process": 3, "type": "ok", "f": "txn", "value": [...], ...}

- `index`: position in the file, from 0. `time`: seconds since the run began (monotonic clock).
- `process`: the client that ran it (an int; a client that is closed and opened again takes a new
  number, as a Jepsen process that crashes does), or "nemesis".
- `f` and `value`, for clients. A key is a partition, written "topic/partition". Values are
  integers, unique in the whole run (the record's value is their decimal text).
  - "send": value `[["send", key, v], ...]` on invoke; on ok `[["send", key, [offset, v]], ...]`.
    A non-transactional (idempotent) send is one micro-op.
  - "poll": value `[["poll"]]` on invoke; on ok `[["poll", {key: [[offset, v], ...], ...}]]`, the
    records of each key in the order the consumer returned them.
  - "txn": a transaction, micro-ops of both kinds in the order they ran (a consume-transform-produce
    transaction polls, then sends, then commits its group's offsets: `"offsets"` below). ok: it
    committed; fail: it was aborted (by the workload, or refused); info: its outcome is unknown.
    The op carries `"commit_time"`: when commit_transaction was called (null if it never was).
  - "assign" (value: keys), "subscribe" (value: topics), "seek" (value `{key: offset}`), and the
    consumer's "rebalance" callbacks (`{"revoked": keys}` or `{"assigned": keys}`, type info): after
    any of them a consumer's next poll of a key may start anywhere.
  - "commit": a consumer's synchronous offset commit, value `{"group": g, "offsets": {key: offset}}`
    (ok once the broker acknowledged it). "offsets": a read of a group's committed offsets, same
    value shape (as the group's committed offsets, read with the admin client or a consumer).
  - "open": a client starts; value `{"role": "producer" | "consumer" | "txn-producer", ...}` with the
    consumer's `"isolation"` ("read_committed" / "read_uncommitted"), `"group"`, and `"mode"`
    ("assign", "classic", "consumer" for KIP-848); a transactional producer's `"transactional_id"`.
  - "close": a client ends (ok), or was abandoned (info).
  - "final-read": after the heal, every partition read from offset 0 by a fresh consumer; value
    `{"isolation": ..., "records": {key: [[offset, v], ...]}}`.
  - "table-read": each topic's Iceberg table after the compactor caught up; value
    `{"topic": t, "rows": {key: [[offset, v], ...]}, "complete": bool}` (`complete`: the table
    reached the Kafka view's last offset of every partition before the harness stopped waiting).
  - Compacted topics: a send micro-op may carry a fourth element, the record key (a string): on ok
    `["send", key, [offset, v], record_key]`; a tombstone has `v` null. Their final read and table
    read carry it too: `[offset, v, record_key]`.
- For the nemesis, `f` names the fault ("kill", "pause", "partition", "slow", "s3-stop", ...) and
  `value` says what it hit; a fault begins with an info line whose `"phase"` is "start" and ends
  with one whose `"phase"` is "stop" (the report shades the window between).
- As the checker reads them: a txn's offsets micro-op is `["offsets", {"group": g, "offsets": {key:
  offset}}]` (what it sent to the transaction, committed with it); a process's poll isolation is
  the `"isolation"` of its "open" (read_uncommitted, Kafka's default, when it has none); only ok
  final-reads and table-reads are judged; a completion may repeat the invoke's value when it has no
  more to say (a failed send), and a fail or info txn's completion may carry the offsets and polls
  it got before it ended.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
NEMESIS = "nemesis"

Op = dict[str, Any]


def key_of(topic: str, partition: int) -> str:
    """The history's name of a partition."""
    return f"{topic}/{partition}"


def split_key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition("/")
    return topic, int(partition)


class Recorder:
    """Appends ops to a history file, from any thread, each line flushed as it is written (a run
    that is killed keeps what happened up to then). Indexes and times are assigned here, so the
    file's order is the order the recorder saw."""

    def __init__(self, path: Path, start: float | None = None, id_base: int = 0) -> None:
        self.path = Path(path)
        self.start = time.monotonic() if start is None else start
        self.id_base = id_base  # where the process numbers and values of the clients recording here begin
        self._lock = threading.Lock()
        self._index = 0
        self.counts: dict[tuple[str, str], int] = {}  # (f, type) -> ops so far, for progress lines
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def now(self) -> float:
        return time.monotonic() - self.start

    def record(self, process: int | str, type: str, f: str, value: Any = None, **extra: Any) -> Op:
        with self._lock:
            op = {"index": self._index, "time": round(self.now(), 6), "process": process, "type": type, "f": f, "value": value, **extra}
            self._index += 1
            self.counts[(f, type)] = self.counts.get((f, type), 0) + 1
            self._file.write(json.dumps(op, separators=(",", ":")) + "\n")
            self._file.flush()
        return op

    def invoke(self, process: int | str, f: str, value: Any = None, **extra: Any) -> Op:
        return self.record(process, INVOKE, f, value, **extra)

    def complete(self, invocation: Op, type: str, value: Any = None, **extra: Any) -> Op:
        """The completion of `invocation`, as `type` (ok / fail / info)."""
        return self.record(invocation["process"], type, invocation["f"], value, **extra)

    def fault(self, f: str, phase: str, value: Any = None) -> Op:
        return self.record(NEMESIS, INFO, f, value, phase=phase)

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read(path: Path) -> list[Op]:
    """A history file's ops in order (a torn last line, from a killed run, is left out)."""
    ops = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                ops.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return ops


def write(path: Path, ops: Iterable[Op]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for op in ops:
            f.write(json.dumps(op, separators=(",", ":")) + "\n")


def pairs(ops: Iterable[Op]) -> Iterator[tuple[Op, Op | None]]:
    """(invoke, completion) for every client op, completion None if the history ended first; a
    process has at most one op outstanding at a time."""
    open_by_process: dict[Any, Op] = {}
    for op in ops:
        if op["process"] == NEMESIS:
            continue
        if op["type"] == INVOKE:
            if op["process"] in open_by_process:
                yield open_by_process.pop(op["process"]), None
            open_by_process[op["process"]] = op
        else:
            invocation = open_by_process.pop(op["process"], None)
            if invocation is not None:
                yield invocation, op
            else:
                yield op, op  # a completion with no invoke: an event (rebalance callbacks, reads)
    for invocation in open_by_process.values():
        yield invocation, None

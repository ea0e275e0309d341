"""Pure: a cycle's plan, from each partition's offset-index entries and its checkpoint (the next
offset not yet in the table) to Spark tasks. A task holds runs of consecutive WAL entries of one or
more partitions, sized in bytes to spread over the executors, and the object reads that fetch them:
every entry is in exactly one task, so each WAL byte range is read once per cycle.

A partition is due when one of its pending entries is old enough (its max timestamp at least
`freshness_ms` before `now_ms`) or its pending bytes reach `due_bytes`; then all its pending
entries are planned, in offset order, so a cycle takes about `freshness_ms` of records at once.

Pending stops at the partition's last stable offset: only entries wholly below it are planned, so
an open transaction holds its partition's table back (the records before it too, when they share
an entry with it) and every row a cycle writes is of a transaction that has ended. Each run carries
the aborted transactions its offsets meet, as plain tuples the task decodes with (job.py).

A transaction enters a table whole: `whole_transactions` finds where a plan's partitions must stop
so that no committed transaction is in on some of its partitions and not on others (whatever held
those back: freshness, another open transaction, a partition left out of the cycle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from metadata.model import IndexEntry, ObjectType

MiB = 1 << 20
TopicPartition = tuple[str, int]
# A transaction a producer aborted on the partition: (producer id, first offset, last offset), the
# last being its abort marker's. The producer's transactional batches in that range are not rows.
Aborted = tuple[int, int, int]
# A transaction's records on one partition: (producer id, generation, first offset, last offset),
# the last being its commit marker's, None while it is open there. Producer id and generation
# name the transaction on every partition (metadata.model.CommittedTransaction).
TxnPart = tuple[int, int, int, int | None]


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive WAL entries of one partition, to be decoded in order."""

    topic: str
    partition: int
    entries: tuple[IndexEntry, ...]
    first_offset: int  # the checkpoint, when it falls inside the first entry: records below it are skipped
    aborted: tuple[Aborted, ...] = ()  # the aborted transactions whose records lie in its offsets

    @property
    def last_offset(self) -> int:
        return self.entries[-1].last_offset

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)


@dataclass(frozen=True, slots=True)
class ObjectRead:
    """One ranged GET: bytes [start, end) of an object, covering one or more entries' ranges."""

    object_key: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Task:
    runs: tuple[Run, ...]
    reads: tuple[ObjectRead, ...]

    @property
    def size(self) -> int:
        return sum(run.size for run in self.runs)


@dataclass(frozen=True, slots=True)
class Plan:
    tasks: tuple[Task, ...]
    # Per partition, the offsets the cycle covers [first, last]: what the committer records in the
    # snapshot summary and the next checkpoint (last + 1).
    offsets: dict[TopicPartition, tuple[int, int]]

    @property
    def size(self) -> int:
        return sum(task.size for task in self.tasks)


def plan(
    entries: Mapping[TopicPartition, Sequence[IndexEntry]],
    checkpoints: Mapping[TopicPartition, int],
    *,
    now_ms: int,
    freshness_ms: int = 2_000,
    due_bytes: int = 64 * MiB,
    parallelism: int = 1,
    min_task_bytes: int = 4 * MiB,
    max_task_bytes: int = 128 * MiB,
    merge_gap: int = 0,
    stable: Mapping[TopicPartition, int] | None = None,
    aborted: Mapping[TopicPartition, Sequence[Aborted]] | None = None,
) -> Plan:
    """The cycle's tasks. `entries`: each partition's index entries in offset order (PARQUET ones
    are skipped); `checkpoints`: each partition's next offset not in the table (0 when absent);
    `stable`: each partition's last stable offset (absent: no limit), entries reaching it are not
    planned; `aborted`: each partition's aborted transactions over its entries (absent: none);
    `parallelism`: the executors' cores, tasks are sized to give each about as many bytes, within
    [min_task_bytes, max_task_bytes]. A task's ranges of one object that touch (or lie within
    `merge_gap` bytes: fewer GETs, but the bytes between may be another task's too) are one read."""
    runs: list[Run] = []
    offsets: dict[TopicPartition, tuple[int, int]] = {}
    for tp in sorted(entries):
        due = _due(entries[tp], checkpoints.get(tp, 0), now_ms - freshness_ms, due_bytes, stable.get(tp) if stable else None)
        if due:
            first = max(due[0].base_offset, checkpoints.get(tp, 0))
            runs.append(Run(tp[0], tp[1], tuple(due), first, tuple(aborted.get(tp, ())) if aborted else ()))
            offsets[tp] = (first, due[-1].last_offset)
    total = sum(run.size for run in runs)
    target = min(max_task_bytes, max(min_task_bytes, -(-total // max(1, parallelism))))
    pieces = [piece for run in runs for piece in _split(run, target)]
    # Partitions flushed together share WAL objects: packing by first object puts their ranges in
    # the same task, where adjacent sections are fetched by one read.
    pieces.sort(key=lambda r: (r.entries[0].object_key, r.topic, r.partition, r.entries[0].base_offset))
    tasks: list[Task] = []
    current: list[Run] = []
    size = 0
    for piece in pieces:
        if current and size + piece.size > target:
            tasks.append(_task(current, merge_gap))
            current, size = [], 0
        current.append(piece)
        size += piece.size
    if current:
        tasks.append(_task(current, merge_gap))
    return Plan(tuple(tasks), offsets)


def whole_transactions(ends: Mapping[TopicPartition, int], parts: Mapping[TopicPartition, Sequence[TxnPart]]) -> dict[TopicPartition, int]:
    """Where each partition's part of a cycle must stop (exclusive) for every transaction in
    `parts` to be in the table on all its partitions or on none, given where the plan stops
    (`ends`, exclusive; a partition absent takes nothing of the parts listed for it): only the
    partitions that must stop sooner, at the first offset of a transaction one of whose parts
    does not end before its partition's end (an open part never does). Lowering one end can leave
    another transaction in part, so this runs to a fixed point; ends only fall, so it stops."""
    by_txn: dict[tuple[int, int], list[tuple[TopicPartition, int, int | None]]] = {}
    for tp, txns in parts.items():
        for pid, generation, first, last in txns:
            by_txn.setdefault((pid, generation), []).append((tp, first, last))
    stops = {tp: ends.get(tp, -1) for tp in parts}
    lowered: dict[TopicPartition, int] = {}
    changed = True
    while changed:
        changed = False
        for txn in by_txn.values():
            if all(last is not None and last < stops[tp] for tp, _first, last in txn):
                continue  # in whole
            for tp, first, _last in txn:  # then in on none of its partitions
                if first < stops[tp]:
                    stops[tp] = lowered[tp] = first
                    changed = True
    return lowered


def _due(entries: Sequence[IndexEntry], checkpoint: int, old_before_ms: int, due_bytes: int, stable: int | None = None) -> list[IndexEntry]:
    """The WAL entries holding offsets from `checkpoint` on and wholly below `stable` (None: no
    limit), up to the last one that is due."""
    pending = [e for e in entries if e.object_type == ObjectType.WAL and e.last_offset >= checkpoint]
    # Consecutive from the checkpoint's side: a gap (an entry not yet visible) ends the run, so the
    # table never skips offsets it has not seen; so does an entry reaching an open transaction.
    run: list[IndexEntry] = []
    for entry in pending:
        if run and entry.base_offset != run[-1].last_offset + 1:
            break
        if stable is not None and entry.last_offset >= stable:
            break
        run.append(entry)
    # Once any of them is old enough, all are taken: a cycle takes about `freshness_ms` of a
    # partition's records at once, not the thin slice that just turned old (which made a snapshot
    # and a file per partition every few hundred milliseconds at a steady rate).
    if sum(e.size for e in run) >= due_bytes or any(e.max_timestamp <= old_before_ms for e in run):
        return run
    return []


def _split(run: Run, target: int) -> list[Run]:
    """A partition's run cut, between entries, into pieces of about `target` bytes (each with the
    aborted transactions its offsets meet)."""
    pieces: list[Run] = []
    chunk: list[IndexEntry] = []
    size = 0
    first = run.first_offset
    for entry in run.entries:
        if chunk and size + entry.size > target:
            pieces.append(_piece(run, chunk, first))
            first = entry.base_offset
            chunk, size = [], 0
        chunk.append(entry)
        size += entry.size
    pieces.append(_piece(run, chunk, first))
    return pieces


def _piece(run: Run, entries: list[IndexEntry], first: int) -> Run:
    last = entries[-1].last_offset
    aborted = tuple(a for a in run.aborted if a[1] <= last and a[2] >= first) if run.aborted else ()
    return Run(run.topic, run.partition, tuple(entries), first, aborted)


def _task(runs: list[Run], merge_gap: int) -> Task:
    ranges = sorted((e.object_key, e.start, e.start + e.size) for run in runs for e in run.entries)
    reads: list[ObjectRead] = []
    for key, start, end in ranges:
        last = reads[-1] if reads else None
        if last is not None and last.object_key == key and start <= last.end + merge_gap:
            reads[-1] = ObjectRead(key, last.start, max(last.end, end))
        else:
            reads.append(ObjectRead(key, start, end))
    return Task(tuple(runs), tuple(reads))

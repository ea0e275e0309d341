"""The planted bugs: deliberate, test-only faults in the broker and the compactor, each off unless
its environment variable turns it on, that a short run must catch (`python -m chaos run --plant
NAME`). A plant the checker does not catch is a blind spot of the harness, so each names the
anomaly classes that count as catching it and the workloads that exercise it.

The product reads these variables (neve/config.py: [faults] for the broker, [compactor]'s fault_*
for the compactor, both listed by `neve config`); this module knows them only by name, so the
harness stays independent of the product's code.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Plant:
    name: str
    description: str  # one line: what breaks, as a client would see it
    broker_env: dict[str, str] = field(default_factory=dict)  # set on every broker of the run
    compactor_env: dict[str, str] = field(default_factory=dict)  # set on every compactor of the run
    workloads: tuple[str, ...] = ()  # of "queue", "txn", "compacted": those that exercise it
    expect: frozenset[str] = frozenset()  # the anomaly classes that count as catching it


PLANTS: dict[str, Plant] = {
    p.name: p
    for p in (
        Plant(
            "marker-lost",
            "an aborted transaction's first partition gets a commit marker, not its abort marker: its aborted records become visible",
            broker_env={"NEVE_FAULTS_MARKER_LOST_EVERY": "1"},
            workloads=("txn",),
            expect=frozenset({"G1a", "torn-txn"}),
        ),
        Plant(
            "fetch-past-lso",
            "a read_committed fetch reads to the high watermark with no aborted transactions: open and aborted records are served",
            broker_env={"NEVE_FAULTS_FETCH_PAST_LSO": "true"},
            workloads=("txn",),
            expect=frozenset({"G1a", "G1b", "torn-txn"}),
        ),
        Plant(
            "batch-twice",
            "every 20th idempotent batch is stored twice, past the duplicate check, and acknowledged once",
            broker_env={"NEVE_FAULTS_BATCH_TWICE_EVERY": "20"},
            workloads=("queue",),
            expect=frozenset({"duplicate"}),
        ),
        Plant(
            "offset-commit-dropped",
            "every 5th accepted OffsetCommit is answered OK but not stored: the group keeps its previous offsets",
            broker_env={"NEVE_FAULTS_OFFSET_COMMIT_DROPPED_EVERY": "5"},
            workloads=("queue",),
            expect=frozenset({"offsets-backwards"}),
        ),
        Plant(
            "table-row-dropped",
            "every 5th compaction task leaves one record out of its Parquet file while the index swap still covers it",
            compactor_env={"NEVE_COMPACTOR_FAULT_DROP_ROW_EVERY": "5"},
            workloads=("queue",),
            expect=frozenset({"table-missing", "lost-write"}),
        ),
    )
}

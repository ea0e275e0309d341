"""The checker: reads a history (chaos/history.py) and names every anomaly it shows, each with the
ops that show it. It imports nothing of neve's: it judges what the clients saw, not the broker.

    result = check(history.read(path))
    result.count, result.anomalies["lost-write"], excerpt(ops, result.anomalies["lost-write"][0])

The checks, by concern: log.py (lost, duplicated, moved, invented records), order.py (each
client's offsets), txn.py (G1a, G1b, torn-txn), cycles.py (G0, G1c), groups.py (committed
offsets), table.py (the Iceberg tables, compacted topics); model.py indexes the history for them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from chaos.history import INVOKE, NEMESIS

from . import cycles, groups, log, order, table, txn
from .anomaly import CLASSES, Anomaly
from .model import Model

__all__ = ["CLASSES", "Anomaly", "Result", "check", "excerpt"]

CHECKS = (
    log.unexpected_value,
    log.duplicate,
    log.inconsistent_offsets,
    log.lost_write,
    order.int_nonmonotonic_send,
    order.ext_nonmonotonic_send,
    order.polls,
    txn.g1a,
    txn.g1b,
    txn.torn_txn,
    groups.offsets_backwards,
    table.table_rows,
    table.compacted,
)


@dataclass
class Result:
    anomalies: dict[str, list[Anomaly]]  # every class in CLASSES, most of them empty when all is well
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(found) for found in self.anomalies.values())

    @property
    def valid(self) -> bool:
        return self.count == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "count": self.count,
            "counts": {cls: len(found) for cls, found in self.anomalies.items() if found},
            "stats": self.stats,
            "anomalies": {cls: [a.to_json() for a in found] for cls, found in self.anomalies.items() if found},
        }


def check(ops: list[dict], ww_deps: bool = True) -> Result:
    """Every anomaly `ops` shows. `ww_deps=False` infers no write-write edges for G0/G1c (see cycles.py)."""
    model = Model(ops)
    anomalies: dict[str, list[Anomaly]] = {cls: [] for cls in CLASSES}
    for run in CHECKS:
        for anomaly in run(model):
            anomalies[anomaly.cls].append(anomaly)
    for anomaly in cycles.cycles(model, ww_deps):
        anomalies[anomaly.cls].append(anomaly)
    return Result(anomalies, _stats(model))


def _stats(model: Model) -> dict[str, Any]:
    by_f: dict[str, Counter] = {}
    for op in model.ops:
        if op.get("process") != NEMESIS:
            by_f.setdefault(op.get("f"), Counter())[op.get("type")] += 1
    kafka_reads = [r for r in model.reads if r.source != "table-read"]
    return {
        "ops": {f: dict(c) for f, c in sorted(by_f.items(), key=lambda item: str(item[0]))},
        "faults": sum(1 for op in model.ops if op.get("process") == NEMESIS and op.get("phase") == "start"),
        "keys": len({s.key for s in model.sends} | {r.key for r in model.reads}),
        "compacted_topics": sorted(model.compacted_topics),
        "values_sent": len(model.writer),
        "values_acked": sum(1 for s in model.writer.values() if model.acked(s) and s.offset is not None),
        "values_unknown": sum(1 for s in model.writer.values() if s.event.type not in ("ok", "fail")),
        "values_read": len({r.value for r in kafka_reads if r.value is not None}),
        "values_final_read": len({r.value for r in kafka_reads if r.source == "final-read" and r.value is not None}),
        "table_rows": sum(1 for r in model.reads if r.source == "table-read"),
        "records_read": len(kafka_reads),
        "invokes": sum(1 for op in model.ops if op.get("type") == INVOKE),
    }


def excerpt(ops: list[dict], anomaly: Anomaly, context: int = 2) -> list[dict]:
    """The ops `anomaly` names, with up to `context` ops of the same process on either side of each
    (its invoke and what it did just before and after), in history order."""
    by_index = {op.get("index", i): op for i, op in enumerate(ops)}
    named = [i for i in anomaly.ops if i in by_index]
    processes = {by_index[i].get("process") for i in named}
    own: dict[Any, list[int]] = {}
    for i, op in by_index.items():
        if op.get("process") in processes:
            own.setdefault(op.get("process"), []).append(i)
    wanted = set(named)
    for i in named:
        line = own[by_index[i].get("process")]
        at = line.index(i)
        wanted.update(line[max(0, at - context) : at + context + 1])
    return [by_index[i] for i in sorted(wanted)]

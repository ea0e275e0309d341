"""What a check reports: one Anomaly per thing the history shows, named by class, and the list of
classes the checker knows (Jepsen's Kafka workload names, plus the table's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CLASSES = (
    "lost-write",
    "duplicate",
    "inconsistent-offsets",
    "unexpected-value",
    "int-nonmonotonic-send",
    "ext-nonmonotonic-send",
    "int-nonmonotonic-poll",
    "ext-nonmonotonic-poll",
    "poll-skip",
    "G1a",
    "G1b",
    "torn-txn",
    "G0",
    "G1c",
    "offsets-backwards",
    "table-missing",
    "table-extra",
    "table-differs",
    "compacted-stale",
    "compacted-duplicate-key",
)


@dataclass
class Anomaly:
    cls: str
    message: str  # one line a person reads
    ops: list[int]  # history indexes of the operations that show it
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"cls": self.cls, "message": self.message, "ops": list(self.ops), "details": self.details}


def unique(indexes) -> list[int]:
    """Op indexes in first-seen order, each once (an anomaly names an op once)."""
    return list(dict.fromkeys(i for i in indexes if i is not None))

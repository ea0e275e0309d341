"""What one cycle does to a topic's table (TopicCycle, its report), and a topic due in a cycle
between its plan and its commit (Due)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from metadata.model import TopicInfo

from ..files import planner


@dataclass(slots=True)
class TopicCycle:
    """What one cycle did to one topic's table."""

    topic: str
    table: str
    cycle_id: str | None = None  # None: nothing was due
    snapshot_id: int | None = None
    rows: int = 0
    files: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    # a compacted topic's cycle: rows it deleted (older rows of its keys, and tombstones)
    rows_superseded: int = 0
    tombstones: int = 0
    delete_bytes: int = 0  # bytes of the position-delete files it wrote


@dataclass(slots=True)
class Due:
    """A topic with tasks in this cycle, between its plan and its commit."""

    info: TopicInfo
    cycle: TopicCycle
    table: Any  # pyiceberg Table
    context: Any  # job.TaskContext
    plan: planner.Plan
    started: float
    results: list | None = None  # job.TaskResult of each task, once the job ran

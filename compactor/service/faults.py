"""Test-only faults of a compaction service (the `fault_*` settings): this process killed, or an
error raised once, at a named step of a cycle; and the table-row-dropped plant."""

from __future__ import annotations

import logging
import os
import signal

from ..config import CompactorConfig

log = logging.getLogger("neve.compactor")


class InjectedFault(Exception):
    """A test's fault raised at a step of a cycle (`CompactorConfig.fault_raise_at`)."""


class Faults:
    def __init__(self, config: CompactorConfig) -> None:
        self.config = config
        self._to_raise = set(filter(None, config.fault_raise_at.split(",")))
        self._tasks_planned = 0  # counted for the table-row-dropped plant alone (`drop_row_tasks`)

    def at(self, point: str) -> None:
        """Test-only (config.fault_kill_after, fault_raise_at): kill this process, or raise once."""
        if self.config.fault_kill_after == point:
            log.warning("fault injection: killing this process", extra={"after": point})
            os.kill(os.getpid(), signal.SIGKILL)
        if point in self._to_raise:
            self._to_raise.discard(point)
            raise InjectedFault(point)

    def drop_row_tasks(self, tasks: int) -> frozenset[int]:
        """The table-row-dropped plant (a deliberate bug, test only: config.fault_drop_row_every):
        of a cycle's `tasks`, the indexes of those that are every Nth task this compactor planned,
        whose writers leave their first row out."""
        every, first = self.config.fault_drop_row_every, self._tasks_planned
        self._tasks_planned += tasks
        return frozenset(i for i in range(tasks) if (first + i + 1) % every == 0)

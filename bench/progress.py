"""Progress output: one line per second on stderr while a step runs, prefixed with the scenario and
step, so a long run shows it is alive and how it is going."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, scenario: str, stream=None) -> None:
        self.scenario = scenario
        self.step = ""
        self.stream = stream if stream is not None else sys.stderr
        self._started = time.monotonic()

    def begin(self, step: str) -> None:
        self.step = step
        self.line("start")

    def end(self) -> None:
        """Lines that follow are the scenario's, not the last step's."""
        self.step = ""

    def line(self, text: str) -> None:
        elapsed = time.monotonic() - self._started
        where = f"{self.scenario}/{self.step}" if self.step else self.scenario
        print(f"[{elapsed:6.1f}s {where}] {text}", file=self.stream, flush=True)

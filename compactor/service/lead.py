"""The lead a compaction service cycles under (the "compactor" leadership, or its own membership when
compactors share the topics) and the fence its index swaps carry: checked before each step of a
cycle, so that a deposed service stops where it stands."""

from __future__ import annotations

from metadata.store import Fenced


class Lead:
    def __init__(self) -> None:
        self.leadership = None  # metadata.store.Leadership this service cycles under; None: it cycles regardless
        self.fence = None  # the lead's fence this run's swaps carry

    def renew(self) -> bool:
        """The lead's fence as a run starts; True when it is a new lead (a compactor that led in
        between may have left a cycle unswapped)."""
        if self.leadership is None:
            return False
        fence = self.leadership.fence()
        new = self.fence is None or fence.epoch != self.fence.epoch
        self.fence = fence
        return new

    def check(self) -> None:
        """Fenced once this service's lead is lost (or taken again: another lead in between)."""
        if self.leadership is not None and (not self.leadership.is_leader() or self.leadership.epoch != self.fence.epoch):
            raise Fenced(f"compactor leadership lost (epoch {self.fence.epoch})")

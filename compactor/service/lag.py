"""How far each owned topic's table is behind its log, as the compactor's metrics export it: per
partition, the offsets and seconds not in the table yet, and the offsets an open transaction holds
back."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from metadata.model import IndexEntry, TopicInfo
from metadata.store import MetadataStore

from .. import metrics


class Lag:
    def __init__(self, metadata: MetadataStore, clock: Callable[[], float] = time.time) -> None:
        self.metadata = metadata
        self._clock = clock
        self._held: dict[str, set[int]] = {}  # by topic name: its partitions an open transaction has held back

    def export(self, info: TopicInfo, entries: Mapping[int, list[IndexEntry]]) -> None:
        now_ms = int(self._clock() * 1000)
        for p in range(info.partitions):
            wal = entries.get(p, ())
            lag = (self.metadata.high_watermark(info.topic_id, p) - wal[0].base_offset) if wal else 0
            oldest = min((e.max_timestamp for e in wal), default=None)
            metrics.set_lag(info.name, p, lag, 0.0 if oldest is None else max(0.0, (now_ms - oldest) / 1000))

    def export_held(self, info: TopicInfo, held: dict[int, int]) -> None:
        """The offsets of each partition an open transaction holds out of the table; a partition
        held before and no longer is exported as 0 (only partitions ever held are exported)."""
        before = self._held.get(info.name, set())
        for p in before - held.keys():
            metrics.set_held(info.name, p, 0)
        for p, n in held.items():
            metrics.set_held(info.name, p, n)
        if held:
            self._held[info.name] = before | held.keys()

    def forget(self, info: TopicInfo) -> None:
        """A topic this compactor no longer cycles: its lag is no longer exported here."""
        metrics.forget_lag(info.name, info.partitions)
        self._held.pop(info.name, None)

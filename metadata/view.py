"""The in-memory view of the offset index that every backend serves reads from: per partition,
the head (next offset, log start) and the index entries in offset order, with two parallel arrays
to bisect on: last offsets (offset lookups) and the running maximum of max_timestamp (entries'
timestamps are not monotonic; their running maximum is)."""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Sequence

from .model import IndexEntry

TopicPartition = tuple[uuid.UUID, int]


class PartitionView:
    __slots__ = ("next_offset", "log_start_offset", "entries", "last_offsets", "running_max")

    def __init__(self, next_offset: int = 0, log_start_offset: int = 0) -> None:
        self.next_offset = next_offset
        self.log_start_offset = log_start_offset
        self.entries: list[IndexEntry] = []
        self.last_offsets: list[int] = []
        self.running_max: list[int] = []

    def add(self, entry: IndexEntry) -> None:
        """Insert an entry; entries usually arrive in offset order (then this is an append), and
        one already present (same base offset) is replaced."""
        if not self.entries or entry.base_offset > self.entries[-1].base_offset:
            self.entries.append(entry)
            self.last_offsets.append(entry.last_offset)
            prev = self.running_max[-1] if self.running_max else entry.max_timestamp
            self.running_max.append(max(prev, entry.max_timestamp))
            return
        i = bisect.bisect_left(self.last_offsets, entry.base_offset)
        if i < len(self.entries) and self.entries[i].base_offset == entry.base_offset:
            self.entries[i] = entry
            self.last_offsets[i] = entry.last_offset
        else:
            self.entries.insert(i, entry)
            self.last_offsets.insert(i, entry.last_offset)
            self.running_max.insert(i, 0)
        self._recompute_running_max(i)

    def replace(self, entry: IndexEntry) -> list[IndexEntry]:
        """Compaction's swap: `entry` takes the place of every entry within its offsets
        [base_offset, last_offset] (which it must cover exactly, whole entries); returns them."""
        i = bisect.bisect_left(self.last_offsets, entry.base_offset)
        j = bisect.bisect_right(self.last_offsets, entry.last_offset)
        replaced = self.entries[i:j]
        self.entries[i:j] = [entry]
        self.last_offsets[i:j] = [entry.last_offset]
        self.running_max[i:j] = [0]
        self._recompute_running_max(i)
        return replaced

    def covering(self, first_offset: int, last_offset: int) -> list[IndexEntry]:
        """The entries holding any offset in [first_offset, last_offset], in offset order."""
        i = bisect.bisect_left(self.last_offsets, first_offset)
        j = bisect.bisect_left(self.last_offsets, last_offset)
        return self.entries[i : j + 1]

    def remove(self, base_offset: int) -> None:
        i = bisect.bisect_left(self.last_offsets, base_offset)
        if i < len(self.entries) and self.entries[i].base_offset == base_offset:
            del self.entries[i], self.last_offsets[i], self.running_max[i]
            self._recompute_running_max(i)

    def _recompute_running_max(self, start: int) -> None:
        prev = self.running_max[start - 1] if start > 0 else None
        for j in range(start, len(self.entries)):
            ts = self.entries[j].max_timestamp
            prev = ts if prev is None else max(prev, ts)
            self.running_max[j] = prev

    def from_offset(self, offset: int, max_entries: int) -> list[IndexEntry]:
        if max_entries <= 0:
            return []
        i = bisect.bisect_left(self.last_offsets, offset)
        return self.entries[i : i + max_entries]

    def for_timestamp(self, timestamp: int) -> IndexEntry | None:
        i = bisect.bisect_left(self.running_max, timestamp)
        return self.entries[i] if i < len(self.entries) else None


class IndexReads:
    """The synchronous index reads of MetadataStore, over `self._partitions`, and by topic over
    `self._topic_views` (the same views, a list per topic indexed by partition: a Fetch of 10,000
    partitions looks its topic up once, not a (topic id, partition) key per partition). Backends
    call `_view_added` and `_views_dropped` wherever they add or drop a partition's view."""

    _partitions: dict[TopicPartition, PartitionView]
    _topic_views: dict[uuid.UUID, list[PartitionView | None]]

    def _view_added(self, topic_id: uuid.UUID, partition: int, view: PartitionView) -> None:
        views = self._topic_views.setdefault(topic_id, [])
        if len(views) <= partition:
            views.extend([None] * (partition + 1 - len(views)))
        views[partition] = view

    def _views_dropped(self, topic_id: uuid.UUID) -> None:
        self._topic_views.pop(topic_id, None)

    def topic_views(self, topic_id: uuid.UUID) -> Sequence[PartitionView | None]:
        """The views of a topic's partitions, by partition index (empty for an unknown topic). They
        are live: read them, never change them."""
        return self._topic_views.get(topic_id, ())

    def high_watermark(self, topic_id: uuid.UUID, partition: int) -> int:
        part = self._partitions.get((topic_id, partition))
        return part.next_offset if part is not None else 0

    def log_start_offset(self, topic_id: uuid.UUID, partition: int) -> int:
        part = self._partitions.get((topic_id, partition))
        return part.log_start_offset if part is not None else 0

    def entries(self, topic_id: uuid.UUID, partition: int, offset: int, max_entries: int = 64) -> list[IndexEntry]:
        part = self._partitions.get((topic_id, partition))
        return part.from_offset(offset, max_entries) if part is not None else []

    def entry_for_timestamp(self, topic_id: uuid.UUID, partition: int, timestamp: int) -> IndexEntry | None:
        part = self._partitions.get((topic_id, partition))
        return part.for_timestamp(timestamp) if part is not None else None

    def referenced_objects(self) -> set[str]:
        return {e.object_key for part in self._partitions.values() for e in part.entries}

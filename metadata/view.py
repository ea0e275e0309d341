"""The in-memory view of the offset index that every backend serves reads from: per partition,
the head (next offset, log start) and the index entries in offset order. Entries are held as
columns (`array('q')` of offsets, byte ranges and timestamps, the object keys as references to
strings shared by every entry of one WAL object), 58 bytes an entry against 244 as
IndexEntry objects; IndexEntry values are made only for what a read returns. Two of the columns
are bisected: last offsets (offset lookups) and the running maximum of max_timestamp (entries'
timestamps are not monotonic; their running maximum is)."""

from __future__ import annotations

import bisect
import uuid
from array import array
from collections.abc import Sequence

from .model import AbortedTransaction, CommittedTransaction, IndexEntry, ObjectType

TopicPartition = tuple[uuid.UUID, int]

OBJECT_TYPES = tuple(ObjectType)  # by value (0, 1, ...): indexing is 15x cheaper than ObjectType(kind)
WAL = int(ObjectType.WAL)
ENTRY_BYTES = 6 * 8 + 8 + 1  # the columns' bytes per entry: six numbers, a key reference, a type


class PartitionView:
    __slots__ = ("next_offset", "log_start_offset", "_base", "_last", "_start", "_size", "_max_ts", "_running_max", "_keys", "_types", "txn_starts", "_aborted", "_committed")

    def __init__(self, next_offset: int = 0, log_start_offset: int = 0) -> None:
        self.next_offset = next_offset
        self.log_start_offset = log_start_offset
        self._base = array("q")
        self._last = array("q")
        self._start = array("q")
        self._size = array("q")
        self._max_ts = array("q")
        self._running_max = array("q")
        self._keys: list[str] = []
        self._types = bytearray()
        # Transactions, made when a partition first has one (most never do): the first offset of
        # each producer's open transaction here, the aborted and committed ones by marker offset (while
        # their marker is in a WAL entry). Public for
        # the hot paths: `txn_starts is None` (never had a transaction) is the cheapest test that
        # the last stable offset is the high watermark, cheaper than the property.
        self.txn_starts: dict[int, int] | None = None
        self._aborted: list[AbortedTransaction] | None = None
        self._committed: list[CommittedTransaction] | None = None

    # -- transactions ---------------------------------------------------------------------------

    @property
    def last_stable_offset(self) -> int:
        """Below it every transaction has ended: the first offset of the oldest open transaction,
        or the high watermark when none is open (read_committed readers stop there)."""
        starts = self.txn_starts
        return min(starts.values()) if starts else self.next_offset

    def open_transactions(self) -> dict[int, int]:
        """The first offset of each producer's open transaction here, by producer id."""
        return dict(self.txn_starts or {})

    def set_transaction_start(self, producer_id: int, first_offset: int) -> None:
        """A producer's open transaction starts at `first_offset` here; -1: it has none."""
        if first_offset >= 0:
            if self.txn_starts is None:
                self.txn_starts = {}
            self.txn_starts[producer_id] = first_offset
        elif self.txn_starts:
            self.txn_starts.pop(producer_id, None)

    def add_aborted(self, aborted: AbortedTransaction) -> None:
        if self._aborted is None:
            self._aborted = []
        _add_in_order(self._aborted, aborted)

    def add_committed(self, committed: CommittedTransaction) -> None:
        if self._committed is None:
            self._committed = []
        _add_in_order(self._committed, committed)

    def committed_from(self, offset: int) -> list[CommittedTransaction]:
        """The committed transactions whose marker is at `offset` or later (and in a WAL entry),
        by marker offset."""
        committed = self._committed
        if not committed:
            return []
        return committed[bisect.bisect_left(committed, (offset,), key=lambda c: (c.last_offset,)) :]

    def aborted_between(self, first_offset: int, last_offset: int) -> list[AbortedTransaction]:
        """The aborted transactions whose records meet [first_offset, last_offset], by marker
        offset."""
        aborted = self._aborted
        if not aborted:
            return []
        i = bisect.bisect_left(aborted, (first_offset,), key=lambda a: (a.last_offset,))
        return [a for a in aborted[i:] if a.first_offset <= last_offset]

    def __len__(self) -> int:
        return len(self._base)

    def _entry(self, i: int) -> IndexEntry:
        return IndexEntry(self._base[i], self._last[i], self._keys[i], OBJECT_TYPES[self._types[i]], self._start[i], self._size[i], self._max_ts[i])

    def _entries(self, i: int, j: int) -> list[IndexEntry]:
        """Entries i to j (exclusive) as values: one or two (a tailing reader's) one by one, more
        column by column (a slice of each)."""
        j = min(j, len(self._base))
        if j - i <= 2:
            return [self._entry(k) for k in range(i, j)]
        return list(map(IndexEntry, self._base[i:j], self._last[i:j], self._keys[i:j], map(OBJECT_TYPES.__getitem__, self._types[i:j]), self._start[i:j], self._size[i:j], self._max_ts[i:j]))

    def add(self, entry: IndexEntry) -> None:
        """Insert an entry; entries usually arrive in offset order (then this is an append), and
        one already present (same base offset) is replaced."""
        self.add_fields(entry.base_offset, entry.last_offset, entry.object_key, int(entry.object_type), entry.start, entry.size, entry.max_timestamp)

    def add_fields(self, base: int, last: int, key: str, kind: int, start: int, size: int, max_ts: int) -> None:
        """`add` without an IndexEntry: what a follower calls per entry of a wal-index record."""
        bases = self._base
        if not bases or base > bases[-1]:
            bases.append(base)
            self._last.append(last)
            self._keys.append(key)
            self._types.append(kind)
            self._start.append(start)
            self._size.append(size)
            self._max_ts.append(max_ts)
            running = self._running_max
            running.append(max(running[-1], max_ts) if running else max_ts)
            return
        i = bisect.bisect_left(self._last, base)
        if i < len(bases) and bases[i] == base:
            self._last[i], self._keys[i], self._types[i] = last, key, kind
            self._start[i], self._size[i], self._max_ts[i] = start, size, max_ts
        else:
            for column, value in ((bases, base), (self._last, last), (self._keys, key), (self._start, start), (self._size, size), (self._max_ts, max_ts), (self._running_max, 0)):
                column.insert(i, value)
            self._types.insert(i, kind)
        self._recompute_running_max(i)

    def replace(self, entry: IndexEntry) -> list[IndexEntry]:
        """Compaction's swap: `entry` takes the place of every entry within its offsets
        [base_offset, last_offset] (which it must cover exactly, whole entries); returns them."""
        i = bisect.bisect_left(self._last, entry.base_offset)
        j = bisect.bisect_right(self._last, entry.last_offset)
        replaced = self._entries(i, j)
        if self._aborted and entry.object_type != ObjectType.WAL:
            # the table holds no aborted record, and a fetch lists an aborted transaction only
            # while its marker is in a WAL entry: those whose marker this entry now covers go
            self._aborted = [a for a in self._aborted if not entry.base_offset <= a.last_offset <= entry.last_offset]
        if self._committed and entry.object_type != ObjectType.WAL:  # in the table now, whole
            self._committed = [c for c in self._committed if not entry.base_offset <= c.last_offset <= entry.last_offset]
        for column, value in ((self._base, entry.base_offset), (self._last, entry.last_offset), (self._start, entry.start), (self._size, entry.size), (self._max_ts, entry.max_timestamp), (self._running_max, 0)):
            column[i:j] = array("q", (value,))
        self._keys[i:j] = [entry.object_key]
        self._types[i:j] = bytes((int(entry.object_type),))
        self._recompute_running_max(i)
        return replaced

    def covering(self, first_offset: int, last_offset: int) -> list[IndexEntry]:
        """The entries holding any offset in [first_offset, last_offset], in offset order."""
        i = bisect.bisect_left(self._last, first_offset)
        j = bisect.bisect_left(self._last, last_offset)
        return self._entries(i, j + 1)

    def remove(self, base_offset: int) -> None:
        i = bisect.bisect_left(self._last, base_offset)
        if i < len(self._base) and self._base[i] == base_offset:
            for column in (self._base, self._last, self._keys, self._types, self._start, self._size, self._max_ts, self._running_max):
                del column[i]
            self._recompute_running_max(i)

    def _recompute_running_max(self, start: int) -> None:
        running, max_ts = self._running_max, self._max_ts
        prev = running[start - 1] if start > 0 else None
        for j in range(start, len(max_ts)):
            ts = max_ts[j]
            prev = ts if prev is None else max(prev, ts)
            running[j] = prev

    def from_offset(self, offset: int, max_entries: int) -> list[IndexEntry]:
        if max_entries <= 0:
            return []
        i = bisect.bisect_left(self._last, offset)
        return self._entries(i, i + max_entries)

    def for_timestamp(self, timestamp: int) -> IndexEntry | None:
        i = bisect.bisect_left(self._running_max, timestamp)
        return self._entry(i) if i < len(self._base) else None

    def object_keys(self) -> set[str]:
        """The objects this partition's entries name."""
        return set(self._keys)

    def index_bytes(self) -> int:
        """The columns' size in memory (the object keys' strings, shared, not counted; nor the
        arrays' spare room)."""
        return ENTRY_BYTES * len(self._base)


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

    def index_size(self) -> tuple[int, int]:
        """The view's index entries and the bytes their columns take (`PartitionView.index_bytes`).
        Safe from another thread (a metrics scrape): the partitions are copied in one C call."""
        parts = list(self._partitions.values())
        return sum(len(p) for p in parts), sum(p.index_bytes() for p in parts)

    def referenced_objects(self) -> set[str]:
        keys = {key for part in self._partitions.values() for key in part.object_keys()}
        keys.discard("")  # EXPIRED entries name no object
        return keys


def _add_in_order(transactions: list, transaction) -> None:
    """Into a list by marker offset: an append, but for a load's records (in no particular order)."""
    if not transactions or transaction > transactions[-1]:
        transactions.append(transaction)
    elif transaction not in transactions:
        bisect.insort(transactions, transaction)

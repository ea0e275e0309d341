"""Recently written WAL objects kept in memory by the broker that wrote them, so tail-reading
consumers are served without an object-store GET. Bounded by bytes; evicts least recently used.

An object is held as the parts it was stored from (its header, each produce chunk's own bytes, its
footer): the writer never joins them into one buffer (wal.format.EncodedObject), so neither does
the cache. A range within one part is served as a view of it; a range across parts (a reader's own
merged span) is joined."""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from itertools import accumulate


class RecentObjects:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        # key -> (starts, parts): parts[i] holds the object's bytes from starts[i] to starts[i + 1]
        self._objects: OrderedDict[str, tuple[list[int], tuple[bytes, ...]]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def add(self, key: str, parts: Sequence[bytes]) -> None:
        """Hold the object whose bytes are `parts` joined."""
        starts = list(accumulate((len(p) for p in parts), initial=0))
        size = starts[-1]
        if size > self.max_bytes:
            return
        old = self._objects.pop(key, None)
        if old is not None:
            self._bytes -= old[0][-1]
        self._objects[key] = (starts, tuple(parts))
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (evicted_starts, _) = self._objects.popitem(last=False)
            self._bytes -= evicted_starts[-1]

    def get(self, key: str, start: int, end: int) -> memoryview | bytes | None:
        """The object's bytes [start, end) (cut at its end, as a slice is), or None if not held."""
        held = self._objects.get(key)
        if held is None:
            self.misses += 1
            return None
        self._objects.move_to_end(key)
        self.hits += 1
        starts, parts = held
        start, end = max(start, 0), min(end, starts[-1])
        if start >= end:
            return b""
        i = bisect_right(starts, start) - 1
        if end <= starts[i + 1]:
            return memoryview(parts[i])[start - starts[i] : end - starts[i]]
        pieces = []
        while i < len(parts) and starts[i] < end:
            pieces.append(memoryview(parts[i])[max(start - starts[i], 0) : end - starts[i]])
            i += 1
        return b"".join(pieces)

    def has(self, key: str) -> bool:
        """Whether `key` is held (counts neither a hit nor a miss, and keeps the LRU order)."""
        return key in self._objects

    @property
    def size(self) -> int:
        return self._bytes

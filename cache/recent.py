"""Recently written WAL objects kept in memory by the broker that wrote them, so tail-reading
consumers are served without an object-store GET. Bounded by bytes; evicts least recently used."""

from __future__ import annotations

from collections import OrderedDict


class RecentObjects:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._objects: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def add(self, key: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        old = self._objects.pop(key, None)
        if old is not None:
            self._bytes -= len(old)
        self._objects[key] = data
        self._bytes += len(data)
        while self._bytes > self.max_bytes:
            _, evicted = self._objects.popitem(last=False)
            self._bytes -= len(evicted)

    def get(self, key: str, start: int, end: int) -> memoryview | None:
        data = self._objects.get(key)
        if data is None:
            self.misses += 1
            return None
        self._objects.move_to_end(key)
        self.hits += 1
        return memoryview(data)[start:end]

    def has(self, key: str) -> bool:
        """Whether `key` is held (counts neither a hit nor a miss, and keeps the LRU order)."""
        return key in self._objects

    @property
    def size(self) -> int:
        return self._bytes

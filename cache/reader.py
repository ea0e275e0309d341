"""Reads byte ranges of objects for fetches: from the recent-objects cache when it has them, else
from the object store, with concurrent reads of the same range sharing one GET (single flight).

A fetch that needs several ranges (many partitions, or several index entries of one) asks for
them together (`read_many`): ranges of one object that lie close together are read with one
ranged GET, and the GETs run concurrently instead of one after another.

A compacted index entry names a cycle manifest (wal/manifest.py) and a range of the WAL bytes it
replaced: the reader maps that range back to the WAL objects (manifests cached, each read once).

With the per-zone chunk cache (`chunks`, cache/chunks.py), what the recent objects do not hold is
read through the zone's chunk owners instead of one GET per range: a range is the chunks it covers."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable

from wal.manifest import CycleManifest, is_manifest
from wal.store import ObjectStore, ObjectStoreError

from . import metrics
from .chunks import ZoneChunks
from .flight import SingleFlight
from .recent import RecentObjects

Range = tuple[str, int, int]  # object key, start, size

log = logging.getLogger("neve.cache.reader")

MANIFESTS_CACHED = 1024  # decoded cycle manifests kept (a few KB each for a cycle of ten partitions)

MERGE_GAP_BYTES = 256 * 1024
"""Ranges of one object at most this far apart are read with one GET: the gap's bytes cost less
than another request's round trip (and, on S3, its price)."""


class ObjectReader:
    def __init__(self, store: ObjectStore, recent: RecentObjects, on_get: Callable[[int], None] | None = None, chunks: ZoneChunks | None = None) -> None:
        self.store = store
        self.recent = recent
        self._on_get = on_get  # called with the size of every GET this reader makes (`chunks` is given its own)
        self.chunks = chunks
        self._inflight = SingleFlight()
        self._manifests: OrderedDict[str, CycleManifest] = OrderedDict()

    async def manifest(self, key: str) -> CycleManifest:
        """The cycle manifest stored under `key` (read once, then cached: manifests never change)."""
        found = self._manifests.get(key)
        if found is not None:
            self._manifests.move_to_end(key)
            return found
        data = await self._get(key, 0, None)
        try:
            found = CycleManifest.decode(data) if len(data) < 65536 else await asyncio.to_thread(CycleManifest.decode, data)
        except (ValueError, KeyError, TypeError) as e:  # the fetch answers KAFKA_STORAGE_ERROR for it, as for a failed GET
            raise ObjectStoreError(f"cycle manifest {key} does not decode: {e!r}") from e
        self._manifests[key] = found
        if len(self._manifests) > MANIFESTS_CACHED:
            self._manifests.popitem(last=False)
        return found

    async def _read_compacted(self, key: str, start: int, size: int) -> bytes | memoryview:
        try:
            ranges = (await self.manifest(key)).resolve(start, size)
        except ValueError as e:
            raise ObjectStoreError(str(e)) from e
        if len(ranges) == 1:
            return await self.read(*ranges[0])
        parts = await self.read_many(ranges)
        return b"".join([parts[r] if r in parts else await self.read(*r) for r in ranges])

    async def whole(self, key: str) -> bytes | memoryview:
        """Every byte of a small object that never changes (a compacted topic's removal object)."""
        return await self._get(key, 0, None)

    async def read(self, key: str, start: int, size: int, ahead: int = 0) -> bytes | memoryview:
        """Bytes [start, start + size) of `key`. `ahead`: bytes past them that the object holds
        and the caller expects to read next, which the chunk cache may read with them."""
        if is_manifest(key):
            return await self._read_compacted(key, start, size)
        return await self._get(key, start, start + size, ahead)

    async def _get(self, key: str, start: int, end: int | None, ahead: int = 0) -> bytes | memoryview:
        """Bytes [start, end) of `key` (to its end when `end` is None), single flight."""
        cached = self.recent.get(key, start, end) if end is not None else None
        if cached is not None:
            metrics.RECENT_HIT.inc()
            return cached
        if end is not None:
            metrics.RECENT_MISS.inc()
        return await self._inflight.run((key, start, end), lambda: self._read_store(key, start, end, ahead))

    async def _read_store(self, key: str, start: int, end: int | None, ahead: int = 0) -> bytes | memoryview:
        if self.chunks is not None and end is not None:
            return await self.chunks.get(key, start, end, ahead)
        data = await self.store.get(key, start, end)
        if self._on_get is not None:
            self._on_get(len(data))
        return data

    async def read_many(self, ranges: Iterable[Range], failures: dict[Range, ObjectStoreError] | None = None, ahead: int = 0) -> dict[Range, bytes | memoryview]:
        """The bytes of every range that could be read, by range. Ranges of objects in the
        recent-objects cache are taken from it now (so that the object leaving the cache while
        the caller works does not cost it a GET per range later); the others are merged per object
        (see MERGE_GAP_BYTES) and read concurrently. A range whose GET failed is left out: its
        caller's own `read` of it then fails (or succeeds) as it would have without this call.
        If the object store failed it (ObjectStoreError), the range and its error are also put in
        `failures` when one is given: a caller answering an error for it need not read it again
        (during an outage, each read is the store's whole retry schedule again). `ahead`, as for
        `read`, past each merged read: every object's ranges must lie that far before its end."""
        by_key: dict[str, list[tuple[int, int]]] = {}
        out: dict[Range, bytes | memoryview] = {}
        compacted: list[Range] = []
        recent = self.recent
        for key, start, size in ranges:
            if size <= 0:
                continue
            if is_manifest(key):
                compacted.append((key, start, size))
                continue
            if recent.has(key):
                cached = recent.get(key, start, start + size)
                if cached is not None:
                    metrics.RECENT_HIT.inc()
                    out[(key, start, size)] = cached
                    continue
            by_key.setdefault(key, []).append((start, size))
        spans: list[tuple[str, int, int, list[tuple[int, int]]]] = []  # key, start, end, wanted
        for key, wanted in by_key.items():
            wanted.sort()
            span_start, span_end, members = wanted[0][0], wanted[0][0] + wanted[0][1], []
            for start, size in wanted:
                if start - span_end > MERGE_GAP_BYTES:
                    spans.append((key, span_start, span_end, members))
                    span_start, span_end, members = start, start + size, []
                span_end = max(span_end, start + size)
                members.append((start, size))
            spans.append((key, span_start, span_end, members))
        if compacted:  # each maps to WAL ranges of its own (read_many again, inside)
            results = await asyncio.gather(*(self.read(*r) for r in compacted), return_exceptions=True)
            for r, data in zip(compacted, results, strict=True):
                if isinstance(data, asyncio.CancelledError):
                    raise data
                if not isinstance(data, BaseException):
                    out[r] = data
                elif failures is not None and isinstance(data, ObjectStoreError):
                    failures[r] = data
        if not spans:
            return out
        results = await asyncio.gather(*(self.read(key, start, end - start, ahead) for key, start, end, _ in spans), return_exceptions=True)
        for (key, span_start, _, members), data in zip(spans, results, strict=True):
            if isinstance(data, BaseException):
                if isinstance(data, asyncio.CancelledError):
                    raise data
                log.warning("merged_get_failed", extra={"key": key, "start": span_start, "ranges": len(members), "error": repr(data)})
                if failures is not None and isinstance(data, ObjectStoreError):
                    for start, size in members:
                        failures[(key, start, size)] = data
                continue
            view = memoryview(data)
            for start, size in members:
                out[(key, start, size)] = view[start - span_start : start - span_start + size]
        return out

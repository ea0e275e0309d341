"""Compacted offsets served as Kafka record batches, rebuilt from the table's rows.

A PARQUET index entry names a cycle manifest (wal/manifest.py), whose slices name the data files
that hold the partition's rows. A read from an offset takes, across those files, the rows from
the batch holding that offset up to the end of the first row group (the smallest window any file
can be read in), groups them by their original batch (kafka.batch_base_offset) and rebuilds each
batch: its base offset, producer id, epoch and base sequence, timestamp type and timestamps,
control and transactional flags, every record's key, headers and value bytes (value_raw where the
table kept it; otherwise the Avro value re-encoded with its writer schema behind the Confluent
header, which the compactor's byte-exact rule made identical to what was produced), compressed
with the topic's compression.type (`producer`: the original batch's codec), CRC computed.

Offsets that hold no row (a transaction's markers and aborted records, never rows; rows table
retention deleted) leave gaps between the rebuilt batches; those at an entry's end are served as
one empty batch (as Kafka's log cleaner leaves one), so a consumer moves past them to the next
entry or the high watermark.

The batches rebuilt from one window are kept (a run; a byte-bounded LRU of runs by partition and
codec), so every consumer of the same range is served without reading or decoding the rows again;
while a consumer is served from one run, the next is rebuilt (read ahead), so that a consumer
reading on finds it ready. Decoding and encoding run off the event loop.

A cycle writes all of a topic's partitions into one file, so one row group holds the whole
cycle of many partitions (a few rows each when there are many). When a partition's rows of the
cycle all lie in one row group, that row group's batches are rebuilt for every partition whose
rows it holds whole, in one pass (a handful of Arrow calls for the row group, not for each
partition), and kept as one run per partition over its whole cycle: the fetches of the others
find them ready. The partitions at a row group's edges (their rows go on in the next) and files
not laid out partition by partition take the window's way."""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cache.flight import SingleFlight
from cache.reader import ObjectReader
from wal.batch_builder import build_batch
from wal.manifest import CycleManifest, PartitionCompaction
from wal.store import ObjectStoreError

from . import removals
from .avro_values import ValueEncoder
from .config import TableReadConfig
from .layout import BATCH_BASE_OFFSET, BATCH_MAX_TIMESTAMP_MS, HEADERS, KAFKA, KEY_RAW, OFFSET, TIMESTAMP, TIMESTAMP_MS, TIMESTAMP_TYPE, VALUE, VALUE_RAW, VALUE_SCHEMA_ID
from .parquet import Footer, ParquetRows, RowGroup
from .rebuild import Batches, rebuild_partitions, rebuild_run
from .removals import Removed

log = logging.getLogger("neve.table.serve")

ROW_COLUMNS = (HEADERS, KEY_RAW, VALUE_RAW, VALUE_SCHEMA_ID, VALUE)
GROUP_COLUMNS = (KAFKA, *ROW_COLUMNS)  # as ParquetRows.read asks for them: one decode serves both ways
MANIFESTS_INDEXED = 256  # cycle manifests whose partitions are kept by number
GROUPS_REMEMBERED = 4096
ROOM_LOOKS = 64  # least recently used runs a read ahead looks through for room  # row groups rebuilt whole, remembered so that each is rebuilt whole once


@dataclass(slots=True)
class Run:
    """Rebuilt batches of one partition covering offsets [lo, hi] (rows deleted from the table
    leave gaps: no batch holds them)."""

    lo: int
    hi: int
    # in offset order, in one buffer or two: a batch carried from the last window is rebuilt on
    # its own, so that the rest of the window's rows (one row group's) are not copied to join it
    parts: list[Batches]
    size: int
    # The rows of the batch the window cut (rows up to `read_to` are all read), carried into the
    # next window so that no row group is decoded twice by a consumer reading on; None when the
    # window reached the entry's end.
    carry: pa.Table | None = None
    read_to: int = -1
    owner: tuple | None = None  # the key its memory is kept under when it shares it (_Shared)
    # a compacted topic's run holding tombstones: the time (ms) from which one of them is no
    # longer served (delete.retention.ms passed), when the run is rebuilt without it
    expires_ms: int | None = None


@dataclass(slots=True)
class _Shared:
    """The runs of partitions rebuilt from one row group in one pass: slices of one buffer, kept
    and evicted together (its bytes counted once, and never kept for one run alone)."""

    runs: dict[tuple, Run]  # by run key
    size: int


Schemas = Callable[[int], Any]  # schema id -> awaitable registry Schema (or None)
REMOVALS_KEPT = 1024  # partitions' removed offsets kept (a compacted topic's, per manifest)


def _now_ms() -> int:
    return int(time.time() * 1000)


class CompactedReader:
    def __init__(self, manifests: ObjectReader, rows: ParquetRows, schema_of: Schemas, cache_bytes: int = TableReadConfig.rebuilt_bytes, clock: Callable[[], int] = _now_ms) -> None:
        self._manifests = manifests
        self.rows = rows
        self._schema_of = schema_of
        self._encoders: dict[int, ValueEncoder | None] = {}
        # (topic id, partition, compression, lo) -> Run, least recently used first; and the same
        # runs by (topic id, partition, compression), to find the one holding an offset
        self._runs: OrderedDict[tuple, Run | _Shared] = OrderedDict()
        self._of_partition: dict[tuple, dict[int, Run]] = {}
        self._cache_bytes = cache_bytes
        self._cached = 0
        # each partition's run last served (by its run key): the runs consumers are on, which
        # reads ahead and evictions spare while runs already read past can go
        self._serving: dict[tuple, tuple] = {}
        self._loading = SingleFlight()
        self._ahead: set[asyncio.Task] = set()
        self._parts: OrderedDict[str, dict[int, PartitionCompaction]] = OrderedDict()
        self._grouping = SingleFlight()
        # row groups already rebuilt whole: a partition whose run was evicted since rebuilds its
        # own rows (the window's way), not the whole row group again for it
        self._rebuilt: OrderedDict[tuple, None] = OrderedDict()
        # (manifest key, partition) -> the offsets a compacted topic's readers skip there
        self._removals: OrderedDict[tuple, Removed] = OrderedDict()
        self._loading_removed = SingleFlight()
        self._clock = clock

    async def read(self, topic_id, partition: int, entry, fetch_offset: int, budget: int, first: bool, compression: str = "producer") -> tuple[bytes | memoryview | None, bool]:
        """Batches of `entry` (a PARQUET index entry of the partition) from the one holding
        `fetch_offset`, within `budget` bytes (at least one batch when `first`); and whether the
        entry was read to its end. A run's batches go out as one slice of its buffer (not a copy;
        nothing writes to it once built). Raises ObjectStoreError when the files cannot be read."""
        # runs are kept by the manifest too: a compacted topic's next manifest removes more rows
        topic_id = (topic_id, entry.object_key)
        pieces: list[memoryview] = []
        used = 0
        offset = max(fetch_offset, entry.base_offset)
        served_to = offset - 1  # the last offset of the last batch served
        while offset <= entry.last_offset:
            run = await self._run(topic_id, partition, entry, offset, compression)
            if run is None:
                break
            self._mark_served(topic_id, partition, compression, run)
            self._read_next(topic_id, partition, entry, run, compression)
            last = None  # of the last batch served from this run
            for part in run.parts:
                lasts, bounds = part.lasts, part.bounds
                i = start = bisect_left(lasts, offset)
                # a run rebuilt whole for its cycle may reach past an entry that covers less of it
                while i < len(lasts) and (last is None or last < entry.last_offset):
                    size = bounds[i + 1] - bounds[i]
                    if used + size > budget and (pieces or i > start or not first):
                        if i > start:
                            pieces.append(part.data[bounds[start] : bounds[i]])
                        return _joined(pieces), False
                    used += size
                    last = lasts[i]
                    i += 1
                if i > start:
                    pieces.append(part.data[bounds[start] : bounds[i]])
            if last is not None:
                served_to = last
            offset = run.hi + 1
        if served_to < entry.last_offset and (used + EMPTY_BATCH_SIZE <= budget or (first and not pieces)):
            # The entry's last offsets hold no row (a transaction's marker, aborted records): an
            # empty batch over them, as Kafka's log cleaner leaves one, moves a consumer past them
            # (otherwise one at the partition's end would stay below its high watermark).
            pieces.append(memoryview(empty_batch(served_to + 1, entry.last_offset)))
        return _joined(pieces), True

    async def close(self) -> None:
        """Stop the reads ahead under way (nobody waits for them)."""
        for task in list(self._ahead):
            task.cancel()
        await asyncio.gather(*self._ahead, return_exceptions=True)

    async def offset_for_timestamp(self, topic_id, partition: int, entry, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record of `entry` at or after `timestamp` (ms), in
        offset order; None if it has none."""
        offset = entry.base_offset
        while offset <= entry.last_offset:
            window = await self._window(partition, entry, offset, ())
            if window is None:
                return None
            rows, hi, _ = window
            kafka = rows.column(KAFKA)
            ts = _timestamps(kafka)
            hits = pc.indices_nonzero(pc.greater_equal(ts, timestamp))
            if len(hits):
                i = hits[0].as_py()
                return pc.struct_field(kafka, OFFSET)[i].as_py(), ts[i].as_py()
            offset = hi + 1
        return None

    async def max_timestamp(self, topic_id, partition: int, entry) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record of `entry` with the largest timestamp of the
        records still there (a compacted topic's removed records left out, as Kafka's cleaner
        leaves a rebuilt batch the largest timestamp of the records it keeps); None if it has
        none. Reads the whole entry: asked only when its record with the entry's largest
        timestamp is gone."""
        best = None
        offset = entry.base_offset
        while offset <= entry.last_offset:
            window = await self._window(partition, entry, offset, ())
            if window is None:
                break
            rows, hi, _ = window
            kafka = rows.column(KAFKA)
            ts = _timestamps(kafka)
            top = pc.max(ts).as_py()
            if top is not None and (best is None or top > best[1]):
                best = (pc.struct_field(kafka, OFFSET)[pc.index(ts, top).as_py()].as_py(), top)
            offset = hi + 1
        return best

    async def _run(self, topic_id, partition: int, entry, offset: int, compression: str) -> Run | None:
        key = (topic_id, partition, compression)
        before = None  # the run that ends just before `offset`: its cut batch's rows carry on
        now = None
        for run in list(self._of_partition.get(key, {}).values()):
            if run.expires_ms is not None and run.expires_ms <= (now := now or self._clock()):
                self._forget(run.owner or (*key, run.lo))  # a tombstone it holds is no longer served
                continue
            if run.lo <= offset <= run.hi:
                self._runs.move_to_end(run.owner or (*key, run.lo))
                return run
            if run.hi + 1 == offset:
                before = run
        carry = (before.carry, before.read_to) if before is not None and before.carry is not None else None
        if carry is None:
            run = await self._grouped(topic_id, partition, entry, compression)
            if run is not None and run.lo <= offset <= run.hi:
                return run
        # another consumer rebuilding the same batches shares them (and so does a read ahead)
        return await self._loading.run((*key, entry.object_key, offset), lambda: self._load_and_keep(key, partition, entry, offset, compression, carry))

    def _read_next(self, topic_id, partition: int, entry, run: Run, compression: str) -> None:
        """Start rebuilding the run after `run` while its batches are served: a consumer reading
        on finds it ready (one run ahead, at most; kept in the same LRU). Not when the cache has
        no room for it (a run about the size of this one) but by evicting runs that consumers are
        on: a read ahead must not push those out (runs already read past may go)."""
        offset = run.hi + 1
        key = (topic_id, partition, compression)
        if offset > entry.last_offset or (*key, entry.object_key, offset) in self._loading or not self._room_for(run.size):
            return
        if any(r.lo <= offset <= r.hi for r in self._of_partition.get(key, {}).values()):
            return
        task = asyncio.create_task(self._ahead_of(topic_id, partition, entry, offset, compression))
        self._ahead.add(task)
        task.add_done_callback(self._ahead.discard)

    async def _ahead_of(self, topic_id, partition: int, entry, offset: int, compression: str) -> None:
        try:
            await self._run(topic_id, partition, entry, offset, compression)
        except ObjectStoreError as e:  # the consumer's own read meets it again, and answers it
            log.debug("read ahead failed", extra={"partition": partition, "offset": offset, "error": repr(e)})

    async def _load_and_keep(self, key: tuple, partition: int, entry, offset: int, compression: str, carry) -> Run | None:
        run = await self._load(partition, entry, offset, compression, carry)
        if run is not None:
            self._keep(key, run)
            self._evict()
        return run

    def _keep(self, key: tuple, run: Run) -> None:
        run_key = (*key, run.lo)
        self._forget(run_key)
        self._runs[run_key] = run
        self._index(run_key, run)
        self._cached += run.size

    def _keep_shared(self, owner: tuple, runs: dict[tuple, Run], size: int) -> None:
        self._forget(owner)
        for run_key in runs:
            self._forget(run_key)  # a run of the same offsets rebuilt alone
        self._runs[owner] = _Shared(runs, size)
        for run_key, run in runs.items():
            self._index(run_key, run)
        self._cached += size

    def _index(self, run_key: tuple, run: Run) -> None:
        self._of_partition.setdefault(run_key[:3], {})[run_key[3]] = run

    def _mark_served(self, topic_id, partition: int, compression: str, run: Run) -> None:
        """Note the run a consumer of the partition is on, when it is kept (only kept runs are
        spared or evicted): so `_serving` holds no more partitions than there are runs kept."""
        partition_key = (topic_id, partition, compression)
        kept = self._of_partition.get(partition_key)
        if kept is not None and kept.get(run.lo) is run:
            self._serving[partition_key] = (*partition_key, run.lo)
        else:
            self._serving.pop(partition_key, None)

    def _forget(self, key: tuple) -> None:
        kept = self._runs.pop(key, None)
        if kept is None:
            return
        self._cached -= kept.size
        for run_key, run in kept.runs.items() if isinstance(kept, _Shared) else ((key, kept),):
            runs = self._of_partition.get(run_key[:3])
            if runs is not None and runs.get(run_key[3]) is run:  # not a later run of the same offsets
                del runs[run_key[3]]
                if not runs:
                    del self._of_partition[run_key[:3]]
                if self._serving.get(run_key[:3]) == run_key:
                    del self._serving[run_key[:3]]

    def _room_for(self, size: int) -> bool:
        """Whether `size` more bytes fit, evicting only runs no consumer is on (among the
        ROOM_LOOKS least recently used)."""
        free = self._cache_bytes - self._cached
        if free >= size:
            return True
        for n, (key, kept) in enumerate(self._runs.items()):
            if n >= ROOM_LOOKS:
                break
            if not self._served(key, kept):
                free += kept.size
                if free >= size:
                    return True
        return False

    def _served(self, key: tuple, kept: Run | _Shared) -> bool:
        """Whether a consumer is on the run (its partition's run last served), or on one of them."""
        if isinstance(kept, _Shared):
            return any(self._serving.get(run_key[:3]) == run_key for run_key in kept.runs)
        return self._serving.get(key[:3]) == key

    def _evict(self) -> None:
        """Least recently used runs first, those no consumer is on before those one is."""
        if self._cached <= self._cache_bytes or len(self._runs) <= 1:
            return
        victims, over = [], self._cached - self._cache_bytes
        for key, kept in self._runs.items():
            if over <= 0 or len(victims) >= len(self._runs) - 1:
                break
            if not self._served(key, kept):
                victims.append(key)
                over -= kept.size
        for key in victims:
            self._forget(key)
        while self._cached > self._cache_bytes and len(self._runs) > 1:
            self._forget(next(iter(self._runs)))

    async def _grouped(self, topic_id, partition: int, entry, compression: str) -> Run | None:
        """The partition's run over its whole cycle, when its rows of the cycle all lie in one row
        group of one file: rebuilt with those of every other partition the row group holds whole
        (and kept for them). None when they do not, or when that row group was rebuilt whole
        before (this partition's run since evicted)."""
        parts = await self._parts_of(entry.object_key)
        part = parts.get(partition)
        path = _one_file(part) if part is not None and not part.removed else None
        if path is None:
            return None
        try:
            footer = await self.rows.footer(path)
        except ObjectStoreError:
            raise
        except (OSError, ValueError, KeyError, pa.ArrowException) as e:
            raise ObjectStoreError(f"table file {path} of {entry.object_key}: {e!r}") from e
        group = _only_group(footer, part)
        if group is None:
            return None
        key = (path, group.index, compression)
        if key in self._rebuilt and key not in self._grouping:
            return None
        runs = await self._grouping.run(key, lambda: self._rebuild_group(topic_id, entry.object_key, parts, footer, group, compression))
        return runs.get(partition)

    async def _rebuild_group(self, topic_id, manifest_key: str, parts: dict[int, PartitionCompaction], footer: Footer, group: RowGroup, compression: str) -> dict[int, Run]:
        """Runs of every partition whose cycle's rows `group` holds whole, kept in the LRU."""
        try:
            decoded = await self.rows.group(footer, group.index, GROUP_COLUMNS)
        except ObjectStoreError:
            raise
        except (OSError, ValueError, KeyError, pa.ArrowException) as e:
            raise ObjectStoreError(f"table file {footer.path} of {manifest_key}: {e!r}") from e
        self._rebuilt[(footer.path, group.index, compression)] = None
        if len(self._rebuilt) > GROUPS_REMEMBERED:
            self._rebuilt.popitem(last=False)
        if decoded.partitions is None:  # not laid out partition by partition: the window's way
            return {}
        held = {}
        for p in np.unique(decoded.partitions).tolist():
            part = parts.get(p)
            if part is not None and not part.removed and _one_file(part) == footer.path and _only_group(footer, part) == group:
                held[p] = (part.first_offset, part.last_offset)
        if not held:
            return {}
        encoders = await self._encoders_for(decoded.rows)
        owner = ("row group", footer.path, group.index, compression)
        try:
            built, size = await asyncio.to_thread(_rebuild_held, decoded.rows, decoded.partitions, held, compression, encoders, owner)
        except (ValueError, TypeError, KeyError, OverflowError, pa.ArrowException) as e:
            raise ObjectStoreError(f"rows of {footer.path} row group {group.index} ({manifest_key}) do not rebuild: {e!r}") from e
        if built:
            self._keep_shared(owner, {(topic_id, p, compression, run.lo): run for p, run in built.items()}, size)
            self._evict()
        return built

    async def _parts_of(self, manifest_key: str) -> dict[int, PartitionCompaction]:
        found = self._parts.get(manifest_key)
        if found is None:
            manifest: CycleManifest = await self._manifests.manifest(manifest_key)
            found = self._parts[manifest_key] = {part.partition: part for part in manifest.partitions}
            if len(self._parts) > MANIFESTS_INDEXED:
                self._parts.popitem(last=False)
        else:
            self._parts.move_to_end(manifest_key)
        return found

    async def _load(self, partition: int, entry, offset: int, compression: str, carry: tuple[pa.Table, int] | None = None) -> Run | None:
        started = self._clock()  # the removals the rows are read with apply from then on, at least
        window = await self._window(partition, entry, offset, ROW_COLUMNS, carry)
        if window is None:
            return None
        rows, hi, complete = window
        encoders = await self._encoders_for(rows)
        bases = pc.struct_field(rows.column(KAFKA), BATCH_BASE_OFFSET).to_numpy(zero_copy_only=False)
        # the carried batch's rows (two row groups' pieces) apart from the rest (one row group's
        # slice, as decoded) when more batches follow it
        carried = int(np.searchsorted(bases, bases[0], side="right")) if carry is not None and len(rows) else 0
        pieces = [rows] if not 0 < carried < len(rows) else [rows.slice(0, carried), rows.slice(carried)]
        try:
            parts = await asyncio.to_thread(lambda: [rebuild_run(p, compression, encoders, complete or p is not pieces[-1]) for p in pieces])
        except (ValueError, TypeError, KeyError, OverflowError, pa.ArrowException) as e:
            raise ObjectStoreError(f"rows of {entry.object_key} partition {partition} from offset {offset} do not rebuild: {e!r}") from e
        run = Run(offset, hi, parts, sum(len(p.data) for p in parts))
        removed = await self._removed(entry.object_key, await self._partition(entry, partition))
        if removed:
            run.expires_ms = removed.changes_after(started)
        if not complete and len(rows):
            # the window's last batch may go on past it: its rows are carried into the next window
            cut = int(np.searchsorted(bases, bases[-1], side="left"))
            run.carry, run.read_to = rows.slice(cut), hi
            lasts = [last for p in parts for last in p.lasts[-1:]]
            run.hi = lasts[-1] if lasts else hi
        return run

    async def _window(self, partition: int, entry, offset: int, columns: Sequence[str], carry: tuple[pa.Table, int] | None = None) -> tuple[pa.Table, int, bool] | None:
        """The partition's rows from the batch holding `offset` to `hi` (the end of the smallest
        row group that holds rows at `offset` or after, or further if one batch needs it), `hi`,
        and whether `hi` is the end of the entry (so the last batch read is whole). `carry`: the
        rows of the batch at `offset` already read, up to an offset (the last window's cut)."""
        part = await self._partition(entry, partition)
        end = min(entry.last_offset, part.last_offset)
        tables: list[pa.Table] = []
        start = offset
        if carry is not None:
            tables.append(carry[0])
            start = carry[1] + 1
        slices = [s for s in part.slices if s.last_offset >= start and s.first_offset <= end]
        if not slices:
            return (tables[0], end, True) if tables else None
        paths = list(dict.fromkeys(s.path for s in slices))
        try:
            removed = await self._removed(entry.object_key, part)
            footers = await asyncio.gather(*(self.rows.footer(p) for p in paths))
            hi = _window_end(footers, partition, start, end)

            async def rows_of(lo: int, hi: int) -> list[pa.Table]:
                found = [t for t in await asyncio.gather(*(self.rows.read(p, partition, lo, hi, columns) for p in paths)) if t is not None and len(t)]
                return [t for t in (_without(t, removed, self._clock(), entry.last_offset) for t in found) if len(t)] if removed else found

            while True:
                tables += await rows_of(start, hi)
                rows = await _joined_rows(tables)
                if rows is not None and carry is None and start == offset:
                    first = rows.column(KAFKA)[0][BATCH_BASE_OFFSET].as_py()
                    if first < offset:  # the offset is mid-batch: read the batch's rows before it too
                        tables += await rows_of(first, offset - 1)
                        rows = await _joined_rows(tables)
                complete = hi >= end
                if complete:
                    return (rows, hi, True) if rows is not None else None
                if rows is not None and _batches_in(rows) > 1:
                    return rows, hi, False
                start, hi = hi + 1, _window_end(footers, partition, hi + 1, end)  # one batch wider than the window, or no rows in it
        except ObjectStoreError:
            raise
        except (OSError, ValueError, KeyError, pa.ArrowException) as e:
            raise ObjectStoreError(f"table files of {entry.object_key} partition {partition}: {e!r}") from e

    async def _removed(self, manifest_key: str, part: PartitionCompaction) -> Removed | None:
        """The offsets readers of a compacted topic's `part` skip (table/removals.py), read once
        per manifest and partition; None for a part that names none."""
        if not part.removed:
            return None
        key = (manifest_key, part.partition)
        found = self._removals.get(key)
        if found is None:
            found = await self._loading_removed.run(key, lambda: self._read_removed(key, part))
        else:
            self._removals.move_to_end(key)
        return found

    async def _read_removed(self, key: tuple, part: PartitionCompaction) -> Removed:
        pieces = []
        for ref in part.removed:
            data = await self._manifests.whole(ref.key)
            try:
                pieces.append(removals.decode(data).slice(ref.first_row, ref.rows))
            except (pa.ArrowException, ValueError) as e:  # the fetch answers KAFKA_STORAGE_ERROR, as for a failed GET
                raise ObjectStoreError(f"removal object {ref.key} does not decode: {e!r}") from e
        found = await asyncio.to_thread(Removed, pieces)
        self._removals[key] = found
        while len(self._removals) > REMOVALS_KEPT:
            self._removals.popitem(last=False)
        return found

    async def _partition(self, entry, partition: int) -> PartitionCompaction:
        part = (await self._parts_of(entry.object_key)).get(partition)
        if part is not None:
            return part
        raise ObjectStoreError(f"cycle manifest {entry.object_key} holds no partition {partition}")

    async def _encoders_for(self, rows: pa.Table) -> dict[int, ValueEncoder | None]:
        if VALUE_SCHEMA_ID not in rows.column_names:
            return {}
        ids = {i for i in pc.unique(rows.column(VALUE_SCHEMA_ID)).to_pylist() if i is not None}
        out = {}
        for schema_id in ids:
            if schema_id not in self._encoders:
                schema = await self._schema_of(schema_id)
                self._encoders[schema_id] = ValueEncoder(schema_id, schema.text) if schema is not None else None
            out[schema_id] = self._encoders[schema_id]
        return out


def _without(rows: pa.Table, removed: Removed, now_ms: int, last: int) -> pa.Table:
    """`rows` but those whose offsets readers skip at `now_ms`, except the record at `last` (the
    compacted range's end). Like the newest record of a Kafka log, which its cleaner never takes
    (it is in the active segment), it stays until a later record is compacted: a tombstone there
    outlives its delete.retention.ms. A gap at the very end of a partition would hold consumers
    that do not move past an empty batch (kafkajs) below the high watermark for good."""
    offsets = pc.struct_field(rows.column(KAFKA), OFFSET).to_numpy(zero_copy_only=False)
    hidden = removed.hidden(offsets, now_ms)
    hidden[offsets == last] = False
    return rows.filter(pa.array(~hidden)) if hidden.any() else rows


def empty_batch(first: int, last: int) -> bytes:
    """A batch of no record over offsets [first, last]."""
    return build_batch([], last_offset_delta=last - first, base_offset=first)


EMPTY_BATCH_SIZE = len(empty_batch(0, 0))


def _timestamps(kafka: pa.ChunkedArray) -> pa.Array:
    """Each row's timestamp as Kafka has it, in ms: exact where the timestamp column holds it
    clamped (a LogAppendTime batch's records have its maxTimestamp)."""
    ts = pc.divide(pc.struct_field(kafka, TIMESTAMP).cast(pa.int64()), 1000)
    names = {kafka.type.field(i).name for i in range(kafka.type.num_fields)}
    if TIMESTAMP_MS not in names:  # rows from before the exact fields
        return ts
    log_append = pc.equal(pc.struct_field(kafka, TIMESTAMP_TYPE), 1)
    return pc.if_else(log_append, pc.coalesce(pc.struct_field(kafka, BATCH_MAX_TIMESTAMP_MS), ts), pc.coalesce(pc.struct_field(kafka, TIMESTAMP_MS), ts))


def _one_file(part: PartitionCompaction) -> str | None:
    """The one file holding the partition's rows of the cycle, if one does."""
    paths = {s.path for s in part.slices}
    return paths.pop() if len(paths) == 1 else None


def _only_group(footer: Footer, part: PartitionCompaction) -> RowGroup | None:
    """The one row group of `footer`'s file that may hold the partition's rows of the cycle (by
    its statistics), if one does."""
    found = None
    for group in footer.row_groups:
        if group.may_hold(part.partition, part.first_offset, part.last_offset):
            if found is not None:
                return None
            found = group
    return found


def _rebuild_held(rows: pa.Table, partitions: np.ndarray, held: dict[int, tuple[int, int]], compression: str, encoders, owner: tuple) -> tuple[dict[int, Run], int]:
    """A run per partition of `held` (partition -> its cycle's first and last offset) from a row
    group's rows (partition by partition), and the bytes of the one buffer they are slices of:
    the rows of the held partitions are rebuilt in one pass. A partition whose rows are not in
    offset order, or hold a batch reaching outside its cycle's offsets, is left out (the
    window's way sorts or cuts them)."""
    kafka = rows.column(KAFKA)
    offsets = pc.struct_field(kafka, OFFSET).to_numpy(zero_copy_only=False)
    bases = pc.struct_field(kafka, BATCH_BASE_OFFSET).to_numpy(zero_copy_only=False)
    unordered = set(np.unique(partitions[1:][(partitions[1:] == partitions[:-1]) & (offsets[1:] <= offsets[:-1])]).tolist())
    wanted = sorted(p for p in held if p not in unordered)
    if not wanted:
        return {}, 0
    start, stop = (int(i) for i in np.searchsorted(partitions, [wanted[0], wanted[-1] + 1]))
    rows, bases = rows.slice(start, stop - start), bases[start:stop]
    starts, batches = rebuild_partitions(rows, compression, encoders)
    of_batch, batch_bases, batch_lasts = partitions[start:stop][starts], bases[starts], np.asarray(batches.lasts, dtype=np.int64)
    out = {}
    for p, lo, hi in zip(wanted, *np.searchsorted(of_batch, [wanted, [q + 1 for q in wanted]]), strict=True):
        first, last = held[p]
        mine = np.arange(lo, hi)[(batch_lasts[lo:hi] >= first) & (batch_bases[lo:hi] <= last)]
        if not len(mine) or batch_bases[mine[0]] < first or batch_lasts[mine[-1]] > last:
            continue
        taken = batches.part(int(mine[0]), int(mine[-1]) + 1)
        out[p] = Run(first, last, [taken], len(taken.data), owner=owner)
    return out, len(batches.data)


def _window_end(footers, partition: int, lo: int, end: int) -> int:
    """The smallest last offset of any row group of the files that may hold the partition's rows
    from `lo` (at least lo, at most end)."""
    hi = end
    for footer in footers:
        for group in footer.row_groups:
            if group.may_hold(partition, lo, end) and group.offsets is not None:
                hi = min(hi, max(group.offsets[1], lo))
    return hi


async def _joined_rows(tables: list[pa.Table]) -> pa.Table | None:
    """The tables' rows in offset order, joined off the event loop (one table is as it is)."""
    if len(tables) <= 1:
        return tables[0] if tables else None
    return await asyncio.to_thread(_concat_sorted, tables)


def _concat_sorted(tables: list[pa.Table]) -> pa.Table:
    """The tables' rows in offset order (each table is): copied only when they interleave (two
    files' rows of the partition), not when one follows another (a window's carried rows and the
    next row groups)."""
    if len(tables) == 1:
        return tables[0]
    rows = pa.concat_tables(tables, promote_options="permissive")
    offsets = pc.struct_field(rows.column(KAFKA), OFFSET).to_numpy(zero_copy_only=False)
    if (offsets[1:] > offsets[:-1]).all():
        return rows
    return rows.take(np.argsort(offsets, kind="stable"))


def _batches_in(rows: pa.Table) -> int:
    return len(pc.unique(pc.struct_field(rows.column(KAFKA), BATCH_BASE_OFFSET)))


def _joined(pieces: list[memoryview]) -> bytes | memoryview | None:
    if not pieces:
        return None
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)

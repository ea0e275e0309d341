"""Re-indexing after a rewrite: when the table's current snapshot no longer holds files that the
cycle manifests of a topic's PARQUET index entries name (neve's merge, an outside engine's
`rewrite_data_files`, any engine's compaction), each run of such consecutive entries of a Kafka
partition becomes one entry naming a new manifest whose slices are the current files holding the
run's offsets, found from the data files' statistics for `kafka.partition` and `kafka.offset`
(the two columns are read only where the bounds cannot tell).

The new manifest is the cycle manifest format (wal/manifest.py): its `replaced` are the old
manifests' WAL ranges laid end to end, so the entry's byte size, the sum of the old ones, and the
manifest's byte ranges keep meaning the produced bytes. The manifest is written before the index
swap (`MetadataStore.replace_entries`, atomic per partition): a crash leaves either the old entries,
which the next pass finds stale again and redoes, or the new ones; never an entry naming a file the
pass did not find in the current snapshot.

Gaps: rows an outside engine deleted are in no current file. The entries still cover their whole
offset range (the index never shrinks under consumers), and the read path serves the rows that
exist: a consumer reading across the gap gets the next offset that exists, as after Kafka's
compaction of a topic. A range whose rows are all gone is an entry whose manifest has no slice
for it. Delete files (merge-on-read deletes) are not read here: a data file with deletes attached
stays named, and the read path must apply them. A compacted topic's tombstones a rewrite took
while its Kafka readers are still served them are kept in a file of their own (kept_tombstones.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from metadata.model import IndexEntry, ObjectType, TopicInfo
from metadata.store import MetadataStore, UnknownTopic
from table.layout import KAFKA, OFFSET, PARTITION
from wal.manifest import CycleManifest, FileSlice, PartitionCompaction, new_cycle_id
from wal.store import ObjectStore

from . import binding, kept_tombstones

log = logging.getLogger("neve.compactor.rewrites")

PARTITION_COLUMN = f"{KAFKA}.{PARTITION}"
OFFSET_COLUMN = f"{KAFKA}.{OFFSET}"
PAGE = 4096


@dataclass(frozen=True, slots=True)
class CurrentFile:
    """A data file of the current snapshot, with its bounds of the two Kafka columns (None: unknown)."""

    path: str
    record_count: int
    size: int
    partitions: tuple[int, int] | None
    offsets: tuple[int, int] | None


@dataclass(slots=True)
class Stale:
    """A run of consecutive PARQUET entries of one Kafka partition naming files the table no longer has."""

    partition: int
    entries: list[IndexEntry]
    parts: list[PartitionCompaction]

    @property
    def first_offset(self) -> int:
        return self.entries[0].base_offset

    @property
    def last_offset(self) -> int:
        return self.entries[-1].last_offset


@dataclass(slots=True)
class ReindexOutcome:
    partitions: set[int] = field(default_factory=set)  # Kafka partitions some entry of which was swapped
    entries_replaced: int = 0
    manifests: list[str] = field(default_factory=list)
    conflicts: int = 0
    snapshot_id: int = 0  # the snapshot the pass read (0: none)


# -- the table's current files ----------------------------------------------------------------------


def live_data_files(table) -> Iterator:
    """The DataFiles of `table`'s current snapshot (delete files left out)."""
    from pyiceberg.manifest import ManifestContent

    snapshot = table.current_snapshot()
    if snapshot is None:
        return
    for manifest in snapshot.manifests(table.io):
        if manifest.content == ManifestContent.DATA:
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                yield entry.data_file


def bounds(data_file, field) -> tuple[int, int] | None:
    """A DataFile's (lower, upper) bound of an integer column (a NestedField), None if it has none."""
    from pyiceberg.conversions import from_bytes

    lo, hi = (data_file.lower_bounds or {}).get(field.field_id), (data_file.upper_bounds or {}).get(field.field_id)
    if lo is None or hi is None:
        return None
    return int(from_bytes(field.field_type, lo)), int(from_bytes(field.field_type, hi))


def current_files(table) -> dict[str, CurrentFile]:
    """The data files of `table`'s current snapshot, by path, with their Kafka bounds."""
    schema = table.schema()
    pfield, ofield = schema.find_field(PARTITION_COLUMN), schema.find_field(OFFSET_COLUMN)
    return {f.file_path: CurrentFile(f.file_path, f.record_count, f.file_size_in_bytes, bounds(f, pfield), bounds(f, ofield)) for f in live_data_files(table)}


def kafka_columns(io, path: str):
    """(partition, offset) of every row of the Parquet file at `path`, as two numpy arrays: only
    the two columns are read."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    with io.new_input(path).open() as f:
        kafka = pq.ParquetFile(f).read(columns=[PARTITION_COLUMN, OFFSET_COLUMN]).column(KAFKA).combine_chunks()
    return pc.struct_field(kafka, PARTITION).to_numpy(zero_copy_only=False), pc.struct_field(kafka, OFFSET).to_numpy(zero_copy_only=False)


def slices_for(io, files: Iterable[CurrentFile], partition: int, first: int, last: int, columns: dict) -> list[FileSlice]:
    """The slices of the current `files` holding offsets first..last of Kafka `partition`, in offset
    order. A file the bounds show to hold only this partition's offsets within the range is taken
    whole; one they cannot rule in or out is read (`columns` caches reads for the pass). The row
    range of a slice spans its rows (a file another engine wrote need not keep them together:
    the read path selects by partition and offset, the rows are a hint)."""
    import numpy as np

    out = []
    for f in files:
        if f.partitions is not None and not f.partitions[0] <= partition <= f.partitions[1]:
            continue
        if f.offsets is not None and (f.offsets[1] < first or f.offsets[0] > last):
            continue
        if f.partitions == (partition, partition) and f.offsets is not None and first <= f.offsets[0] and f.offsets[1] <= last:
            out.append(FileSlice(f.path, 0, f.record_count, f.offsets[0], f.offsets[1]))
            continue
        partitions, offsets = cached_kafka_columns(io, f.path, columns)
        rows = np.flatnonzero((partitions == partition) & (offsets >= first) & (offsets <= last))
        if len(rows):
            held = offsets[rows]
            out.append(FileSlice(f.path, int(rows[0]), int(rows[-1] - rows[0] + 1), int(held.min()), int(held.max())))
    return sorted(out, key=lambda s: (s.first_offset, s.path))


# -- the index ----------------------------------------------------------------------------------------


class ManifestCache:
    """Cycle manifests by key, read once (a manifest is never overwritten)."""

    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects
        self._manifests: dict[str, CycleManifest] = {}

    async def get(self, key: str) -> CycleManifest:
        manifest = self._manifests.get(key)
        if manifest is None:
            manifest = self._manifests[key] = CycleManifest.decode(await self.objects.get(key))
        return manifest

    def put(self, manifest: CycleManifest) -> None:
        self._manifests[manifest.key] = manifest


def partition_entries(store: MetadataStore, info: TopicInfo, partition: int) -> list[IndexEntry]:
    out: list[IndexEntry] = []
    offset = 0
    while page := store.entries(info.topic_id, partition, offset, max_entries=PAGE):
        out.extend(page)
        offset = page[-1].last_offset + 1
    return out


def find_part(manifest: CycleManifest, partition: int) -> PartitionCompaction | None:
    return next((p for p in manifest.partitions if p.partition == partition), None)


async def named_files(store: MetadataStore, manifests: ManifestCache, info: TopicInfo) -> set[str]:
    """Every data file the manifests of `info`'s PARQUET entries name: files a Kafka read may open."""
    named: set[str] = set()
    for p in range(info.partitions):
        for e in partition_entries(store, info, p):
            if e.object_type == ObjectType.PARQUET:
                part = find_part(await manifests.get(e.object_key), p)
                if part is not None:
                    named.update(s.path for s in part.slices)
    return named


async def stale_runs(store: MetadataStore, manifests: ManifestCache, info: TopicInfo, files: dict[str, CurrentFile]) -> list[Stale]:
    """Every run of consecutive PARQUET entries of `info`'s partitions whose manifest names a file
    not in `files`."""
    runs: list[Stale] = []
    for p in range(info.partitions):
        run: Stale | None = None
        for e in partition_entries(store, info, p):
            part = None
            if e.object_type == ObjectType.PARQUET:
                part = find_part(await manifests.get(e.object_key), p)
                if part is None or (e.start, e.size) != (await manifests.get(e.object_key)).partition_range(p):
                    log.error("a PARQUET entry does not match its manifest; left as it is", extra={"topic": info.name, "partition": p, "manifest": e.object_key})
                    part = None
            if part is None or all(s.path in files or kept_tombstones.is_kept(s.path) for s in part.slices):
                run = None
                continue
            if run is None:
                run = Stale(p, [], [])
                runs.append(run)
            run.entries.append(e)
            run.parts.append(part)
    return runs


def rounds(runs: list[Stale]) -> list[list[Stale]]:
    """Runs grouped so that a group holds at most one run per Kafka partition (a manifest holds one
    PartitionCompaction per partition): the i-th run of each partition goes in group i."""
    out: list[list[Stale]] = []
    seen: dict[int, int] = {}
    for run in runs:
        i = seen.get(run.partition, 0)
        seen[run.partition] = i + 1
        if i == len(out):
            out.append([])
        out[i].append(run)
    return out


async def reindex(store: MetadataStore, objects: ObjectStore, manifests: ManifestCache, table, info: TopicInfo, identifier: str, now_ms: int | None = None) -> ReindexOutcome:
    """One pass over `info`'s index against `table`'s current snapshot (refreshed here): every
    stale run swapped to a new manifest over the current files, and the tombstones its Kafka
    readers are still served (at `now_ms`, by default now) kept where the rewrite took them
    (kept_tombstones.py)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    table = await asyncio.to_thread(table.refresh)
    binding.require(table, info.topic_id, info.name)  # rows are found by (partition, offset) alone: only this topic's table may be read so
    files = await asyncio.to_thread(current_files, table)
    current = table.current_snapshot()
    outcome = ReindexOutcome(snapshot_id=current.snapshot_id if current is not None else 0)
    runs = await stale_runs(store, manifests, info, files)
    columns: dict = {}
    listed = sorted(files.values(), key=lambda f: f.path)
    for group in rounds(runs):
        parts = []
        found = {}
        for run in group:
            found[run.partition] = await asyncio.to_thread(slices_for, table.io, listed, run.partition, run.first_offset, run.last_offset, columns)
        kept = await _keep_tombstones(objects, table, group, found, columns, now_ms)
        for run in group:
            slices = sorted(found[run.partition] + kept.get(run.partition, []), key=lambda s: (s.first_offset, s.path))
            replaced = tuple(r for part in run.parts for r in part.replaced)
            # a compacted topic's removals apply to the rows wherever they now are
            removed = tuple(dict.fromkeys(r for part in run.parts for r in part.removed))
            parts.append(PartitionCompaction(run.partition, replaced, tuple(slices), removed))
        manifest = CycleManifest(new_cycle_id(), info.topic_id, info.name, identifier, tuple(sorted(parts, key=lambda p: p.partition)))
        await objects.put(manifest.key, await asyncio.to_thread(manifest.encode))
        manifests.put(manifest)
        outcome.manifests.append(manifest.key)
        for run, part in zip(sorted(group, key=lambda r: r.partition), manifest.partitions, strict=True):
            start, size = manifest.partition_range(part.partition)
            new = IndexEntry(run.first_offset, run.last_offset, manifest.key, ObjectType.PARQUET, start, size, max(e.max_timestamp for e in run.entries))
            try:
                swapped = await store.replace_entries(info.topic_id, run.partition, run.entries, new)
            except UnknownTopic:
                return outcome  # a deleted topic's index is gone: nothing names anything
            if swapped:
                outcome.partitions.add(run.partition)
                outcome.entries_replaced += len(run.entries)
            else:  # another pass (a second compactor) changed them: the next pass looks again
                outcome.conflicts += 1
                log.warning("index entries changed under the re-index; left as they are", extra={"topic": info.name, "partition": run.partition})
    if runs:
        log.info(
            "re-indexed offsets the table's files moved",
            extra={"topic": info.name, "table": identifier, "partitions": len(outcome.partitions), "entries": outcome.entries_replaced, "manifests": len(outcome.manifests)},
        )
    return outcome


async def _keep_tombstones(objects: ObjectStore, table, group: list[Stale], found: dict[int, list[FileSlice]], columns: dict, now_ms: int) -> dict[int, list[FileSlice]]:
    """The slices of kept tombstones (kept_tombstones.py) each run of `group` adds to the current
    files' slices `found` for it: none but a compacted topic's where a rewrite took tombstones
    still served."""
    wanted = []
    for run in group:
        refs = [r for part in run.parts for r in part.removed]
        if not refs:
            continue
        served = await kept_tombstones.served(objects, refs, run.first_offset, run.last_offset, now_ms)
        if not len(served):
            continue
        missing = await asyncio.to_thread(kept_tombstones.missing, run.partition, served, found[run.partition], lambda path: cached_kafka_columns(table.io, path, columns))
        if len(missing):
            wanted.append(kept_tombstones.Wanted(run.partition, missing, [s for part in run.parts for s in part.slices]))
    if not wanted:
        return {}
    data = table.metadata.properties.get("write.data.path") or f"{table.location().rstrip('/')}/data"
    return await asyncio.to_thread(kept_tombstones.keep, table.io, data, wanted)


def cached_kafka_columns(io, path: str, columns: dict):
    """`kafka_columns` of `path`, read once per pass (`columns` holds them)."""
    if path not in columns:
        columns[path] = kafka_columns(io, path)
    return columns[path]

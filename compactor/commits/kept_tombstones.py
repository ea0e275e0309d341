"""Tombstones kept for Kafka readers when a rewrite takes them out of the table's files.

A compacted topic's cycle deletes the tombstones it writes from the table (a deleted key has no
row), but its Kafka readers are served each tombstone until `delete.retention.ms` has passed since
that cycle (table/removals.py), and a partition's last record whatever its age (table/serve.py).
neve's own merge leaves the files holding such tombstones alone (upsert.held_by_tombstones); an
outside engine's `rewrite_data_files`, or any engine's compaction, applies the deletes and leaves
them in no file. So the re-index after a rewrite (rewrites.py) finds, for each run of entries it
re-points, the tombstones still served that the current files no longer hold, reads their rows
from the files the run's manifests named (still there: the snapshots before the rewrite hold them
until expired, which an outside engine may do only well past a cycle: docs/GAPS.md) and writes
them to a Parquet file of neve's under the table's data directory (KEPT), one file per re-index
round, its rows in (partition, offset) order. The file is not in the table: table readers never
see it; Kafka readers read it as one more file of the run. A later re-index carries the file on
while a tombstone of it is still served. Once no entry names it, the orphan sweep deletes it
(maintenance/rounds.py)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from table import removals
from table.layout import KAFKA, OFFSET, PARTITION
from wal.manifest import FileSlice, Removal
from wal.store import ObjectStore

log = logging.getLogger("neve.compactor.kept_tombstones")

KEPT = "neve-kept-tombstones"  # the folder under the table's data directory


def is_kept(path: str) -> bool:
    """Whether `path` is a file of kept tombstones (not a table file)."""
    return f"/{KEPT}/" in path


async def served(objects: ObjectStore, refs: Sequence[Removal], first: int, last: int, now_ms: int) -> np.ndarray:
    """The offsets in [first, last] that the removals `refs` name as tombstones still served at
    `now_ms` (sorted): those whose retention has not ended, and `last` if it is one (the compacted
    range's end is never hidden)."""
    pieces = [removals.decode(await objects.get(ref.key)).slice(ref.first_row, ref.rows) for ref in dict.fromkeys(refs)]
    removed = removals.Removed(pieces)
    timed = removed.timed[(removed.timed >= first) & (removed.timed <= last)]
    timed_from = removed.timed_from[(removed.timed >= first) & (removed.timed <= last)]
    candidates = np.unique(timed[(timed_from > now_ms) | (timed == last)])
    if not len(candidates):
        return candidates
    at_once = removed.hidden(candidates, now_ms=-1)  # superseded by a later record of their key: hidden at once
    return candidates[~at_once]


@dataclass(slots=True)
class Wanted:
    """One run's tombstones to keep: `missing`, still served and in no current file."""

    partition: int
    missing: np.ndarray
    old: list[FileSlice]  # the slices the run's manifests named


def missing(partition: int, served_offsets: np.ndarray, current: Sequence[FileSlice], offsets_of: Callable[[str], tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Which of `served_offsets` of `partition` no slice of the current files holds
    (`offsets_of(path)`: a file's (partition, offset) columns)."""
    if not len(served_offsets):
        return served_offsets
    held = [offsets[partitions == partition] for partitions, offsets in (offsets_of(s.path) for s in dict.fromkeys(current))]
    present = np.unique(np.concatenate(held)) if held else np.empty(0, dtype=np.int64)
    return np.setdiff1d(served_offsets, present)


def keep(io, data_path: str, wanted: Sequence[Wanted]) -> dict[int, list[FileSlice]]:
    """The slices serving each of `wanted`'s missing tombstones, by partition: the run's kept
    slices of an earlier re-index where they hold them all, else slices of one new file written
    here (one per row layout the old files have). Tombstones found in no old file are logged:
    their files were deleted before the re-index."""
    out: dict[int, list[FileSlice]] = {}
    found: list[pa.Table] = []
    for w in wanted:
        rows, sources = _rows_of(io, w)
        got = pa.concat_tables(rows, promote_options="permissive") if rows else None
        offsets = np.unique(_column(got, OFFSET)) if got is not None else np.empty(0, dtype=np.int64)
        lost = np.setdiff1d(w.missing, offsets)
        if len(lost):
            log.error(
                "tombstones still served to Kafka readers are in no file: a rewrite took them and the files before it were deleted before the re-index",
                extra={"partition": w.partition, "tombstones": len(lost), "first": int(lost[0])},
            )
        if got is None or not got.num_rows:
            continue
        if sources and all(is_kept(s.path) for s in sources):
            out[w.partition] = list(dict.fromkeys(sources))  # already kept: carried on
        else:
            found.append(_first_per_offset(got))
    for table in _by_layout(found):
        path = f"{data_path.rstrip('/')}/{KEPT}/{uuid.uuid4().hex}.parquet"
        _write(io, path, table)
        partitions, offsets = _column(table, PARTITION), _column(table, OFFSET)
        for p in np.unique(partitions):
            rows = np.flatnonzero(partitions == p)
            held = offsets[rows]
            out.setdefault(int(p), []).append(FileSlice(path, int(rows[0]), len(rows), int(held[0]), int(held[-1])))
        log.info("kept tombstones a rewrite took from the table's files", extra={"file": path, "tombstones": table.num_rows})
    return out


def _rows_of(io, w: Wanted) -> tuple[list[pa.Table], list[FileSlice]]:
    """The rows of `w.missing` in the old slices' files, and the slices they were found in."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    lo, hi = int(w.missing[0]), int(w.missing[-1])
    wanted = pa.array(w.missing)
    rows, sources = [], []
    for s in dict.fromkeys(w.old):
        if s.last_offset < lo or s.first_offset > hi:
            continue
        try:
            with io.new_input(s.path).open() as f:
                for batch in pq.ParquetFile(f).iter_batches(batch_size=65536):
                    kafka = batch.column(KAFKA)
                    mask = pc.and_(pc.equal(pc.struct_field(kafka, PARTITION), w.partition), pc.is_in(pc.struct_field(kafka, OFFSET), value_set=wanted))
                    if pc.any(mask).as_py():
                        rows.append(pa.Table.from_batches([batch.filter(mask)]))
                        if not sources or sources[-1] is not s:
                            sources.append(s)
        except FileNotFoundError:
            continue  # deleted already: what it held is logged as lost if no other file has it
    return rows, sources


def _column(table: pa.Table, name: str) -> np.ndarray:
    import pyarrow.compute as pc

    return pc.struct_field(table.column(KAFKA), name).to_numpy(zero_copy_only=False)


def _first_per_offset(table: pa.Table) -> pa.Table:
    """`table` sorted by offset, one row per offset (the same row may be in two old files)."""
    import pyarrow.compute as pc

    offsets = _column(table, OFFSET)
    order = np.argsort(offsets, kind="stable")
    first = np.ones(len(order), dtype=bool)
    first[1:] = offsets[order][1:] != offsets[order][:-1]
    return pc.take(table, pa.array(order[first]))


def _by_layout(tables: Sequence[pa.Table]) -> list[pa.Table]:
    """`tables` joined where their columns are the same, rows in (partition, offset) order."""
    import pyarrow.compute as pc

    groups: dict[pa.Schema, list[pa.Table]] = {}
    for t in tables:
        t = t.replace_schema_metadata(None)
        groups.setdefault(t.schema, []).append(t)
    out = []
    for same in groups.values():
        joined = pa.concat_tables(same)
        order = np.lexsort((_column(joined, OFFSET), _column(joined, PARTITION)))
        out.append(pc.take(joined, pa.array(order)))
    return out


def _write(io, path: str, table: pa.Table) -> None:
    import pyarrow.parquet as pq

    with io.new_output(path).create(overwrite=False) as f:
        pq.write_table(table, f, compression="zstd")

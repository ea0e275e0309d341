"""Reads one Kafka partition's rows from a table's Parquet data file, a few row groups at a time.

A file's footer is read once (one ranged GET of its tail) and kept; it says, per row group, which
Kafka partitions and offsets the row group holds (the kafka.partition and kafka.offset column
statistics), so a read fetches only the row groups that can hold the offsets asked for, and of
them only the column chunks asked for: their byte ranges are read together (close ranges of a file
in one GET, cache/reader.py), and pyarrow decodes them off the event loop from those bytes alone.
Any engine's files are read this way, sorted or not: rows are selected by their kafka columns, not
by position."""

from __future__ import annotations

import asyncio
import io
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cache.flight import SingleFlight
from wal.store import ObjectStoreError

from .config import TableReadConfig
from .files import TableFiles
from .layout import KAFKA, OFFSET, PARTITION

FOOTERS_KEPT = 4096
TAIL_GUESS = 64 * 1024  # most footers fit; a larger one costs a second GET
READ_AHEAD = 32 * 1024 * 1024
"""Bytes of the file past a row group's column chunks that the zone's chunk cache may read with
them: the next row groups, read next by a catch-up, then lie in the same GET's bytes and are
decoded from views of it instead of from chunks joined (cache/chunks.py)."""
PARTITION_PATH, OFFSET_PATH = f"{KAFKA}.{PARTITION}", f"{KAFKA}.{OFFSET}"  # their Parquet column paths


@dataclass(frozen=True, slots=True)
class RowGroup:
    index: int
    partitions: tuple[int, int] | None  # min, max; None without statistics
    offsets: tuple[int, int] | None

    def may_hold(self, partition: int, lo: int, hi: int) -> bool:
        if self.partitions is not None and not self.partitions[0] <= partition <= self.partitions[1]:
            return False
        return self.offsets is None or (self.offsets[0] <= hi and self.offsets[1] >= lo)


@dataclass(frozen=True, slots=True)
class Footer:
    path: str
    size: int
    metadata: pq.FileMetaData
    tail_start: int
    tail: bytes
    row_groups: tuple[RowGroup, ...]

    def chunk_ranges(self, row_group: int, columns: Sequence[str]) -> list[tuple[int, int]]:
        """(start, size) of the column chunks of `row_group` under the top-level `columns`."""
        rg = self.metadata.row_group(row_group)
        out = []
        for i in range(rg.num_columns):
            col = rg.column(i)
            if col.path_in_schema.split(".", 1)[0] not in columns:
                continue
            start = col.data_page_offset
            if col.dictionary_page_offset is not None and 0 < col.dictionary_page_offset < start:
                start = col.dictionary_page_offset
            out.append((start, col.total_compressed_size))
        return out


@dataclass(slots=True)
class Decoded:
    """Every row of one row group (the columns read), as pyarrow decoded them."""

    rows: pa.Table
    partitions: np.ndarray | None  # kafka.partition when non-decreasing (neve's files): sliced, not filtered
    size: int


class ParquetRows:
    def __init__(self, files: TableFiles, decoded_bytes: int = TableReadConfig.decoded_bytes) -> None:
        self.files = files
        self._footers: OrderedDict[str, Footer] = OrderedDict()
        self._reading = SingleFlight()  # concurrent readers of one footer share its GET
        # decoded row groups, least recently used first: a row group holds the rows of many
        # partitions (a cycle writes every partition's rows into one file), and each of their
        # readers takes its own from one decode
        self._decoded: OrderedDict[tuple, Decoded] = OrderedDict()
        self._decoded_bytes = decoded_bytes
        self._kept = 0
        self._decoding = SingleFlight()

    async def footer(self, path: str) -> Footer:
        found = self._footers.get(path)
        if found is not None:
            self._footers.move_to_end(path)
            return found
        return await self._reading.run(path, lambda: self._read_and_keep(path))

    async def _read_and_keep(self, path: str) -> Footer:
        found = await self._read_footer(path)
        self._footers[path] = found
        if len(self._footers) > FOOTERS_KEPT:
            self._footers.popitem(last=False)
        return found

    async def _read_footer(self, path: str) -> Footer:
        reader, key = self.files.locate(path)
        size = await self.files.size(path)
        start = max(0, size - TAIL_GUESS)
        tail = bytes(await reader.read(key, start, size - start))
        if len(tail) < 12 or tail[-4:] != b"PAR1":
            raise ObjectStoreError(f"{path} is not a Parquet file")
        (length,) = struct.unpack("<I", tail[-8:-4])
        if length + 8 > len(tail):
            start = max(0, size - length - 8)
            tail = bytes(await reader.read(key, start, size - start))
        return await asyncio.to_thread(_parse_footer, path, size, start, tail)

    async def read(self, path: str, partition: int, lo: int, hi: int, columns: Sequence[str]) -> pa.Table | None:
        """Every row of `partition` in `path` with an offset in [lo, hi], in offset order: the kafka
        struct and `columns` (those the file has), from the row groups that may hold such rows.
        None when no row group may."""
        footer = await self.footer(path)
        groups = [g.index for g in footer.row_groups if g.may_hold(partition, lo, hi)]
        if not groups:
            return None
        wanted = (KAFKA, *[c for c in columns if c != KAFKA])
        decoded = await asyncio.gather(*(self.group(footer, g, wanted) for g in groups))
        return _select(decoded, partition, lo, hi)

    async def group(self, footer: Footer, group: int, wanted: tuple[str, ...]) -> Decoded:
        """Every row of row group `group` (the kafka struct first in `wanted`, then the columns
        the file has), decoded once while it is kept."""
        key = (footer.path, group, wanted)
        found = self._decoded.get(key)
        if found is not None:
            self._decoded.move_to_end(key)
            return found
        return await self._decoding.run(key, lambda: self._decode_and_keep(footer, group, wanted))

    async def _decode_and_keep(self, footer: Footer, group: int, wanted: tuple[str, ...]) -> Decoded:
        ranges = footer.chunk_ranges(group, wanted)
        reader, key = self.files.locate(footer.path)
        ahead = max(0, min(READ_AHEAD, footer.size - max((s + n for s, n in ranges), default=footer.size)))
        got = await reader.read_many([(key, s, n) for s, n in ranges], ahead=ahead)
        pieces = {s: got[(key, s, n)] for s, n in ranges if (key, s, n) in got}
        for s, n in ranges:
            if s not in pieces:  # its merged GET failed: read it alone (raises if that fails too)
                pieces[s] = await reader.read(key, s, n)
        decoded = await asyncio.to_thread(_decode, footer, pieces, group, wanted)
        cache_key = (footer.path, group, wanted)
        self._decoded[cache_key] = decoded
        self._kept += decoded.size
        while self._kept > self._decoded_bytes and len(self._decoded) > 1:
            _, evicted = self._decoded.popitem(last=False)
            self._kept -= evicted.size
        return decoded


def _parse_footer(path: str, size: int, tail_start: int, tail: bytes) -> Footer:
    metadata = pq.read_metadata(io.BytesIO(b"PAR1" + tail))
    names = {metadata.row_group(0).column(i).path_in_schema: i for i in range(metadata.num_columns)} if metadata.num_row_groups else {}
    groups = []
    for index in range(metadata.num_row_groups):
        rg = metadata.row_group(index)
        groups.append(RowGroup(index, _bounds(rg, names.get(PARTITION_PATH)), _bounds(rg, names.get(OFFSET_PATH))))
    return Footer(path, size, metadata, tail_start, tail, tuple(groups))


def _bounds(rg, column: int | None) -> tuple[int, int] | None:
    if column is None:
        return None
    stats = rg.column(column).statistics
    if stats is None or not stats.has_min_max:
        return None
    return int(stats.min), int(stats.max)


class _Sparse(io.RawIOBase):
    """The bytes of a file pyarrow will read (the footer and the chunks fetched), at their places."""

    def __init__(self, size: int, pieces: dict[int, bytes | memoryview]) -> None:
        self._size = size
        self._starts = sorted(pieces)
        self._pieces = pieces
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else self._pos + pos if whence == 1 else self._size + pos
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, n: int = -1) -> memoryview:
        """The bytes asked for as a view of the piece holding them (pyarrow takes any buffer: a
        column chunk is not copied before it is decompressed)."""
        end = self._size if n < 0 else min(self._size, self._pos + n)
        for start in reversed(self._starts):
            if start <= self._pos:
                piece = self._pieces[start]
                if self._pos + (end - self._pos) <= start + len(piece):
                    out = memoryview(piece).cast("B")[self._pos - start : end - start]  # as bytes, whatever the store's view
                    self._pos = end
                    return out
                break
        raise OSError(f"bytes {self._pos}-{end} of a Parquet file were not fetched")

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def _decode(footer: Footer, pieces: dict[int, bytes | memoryview], group: int, columns: Sequence[str]) -> Decoded:
    pieces = dict(pieces)
    pieces[footer.tail_start] = footer.tail
    parquet = pq.ParquetFile(_Sparse(footer.size, pieces), metadata=footer.metadata)
    present = [c for c in columns if c in parquet.schema_arrow.names]
    rows = parquet.read_row_groups([group], columns=present, use_threads=False)
    partitions = pc.struct_field(rows.column(KAFKA), PARTITION).to_numpy(zero_copy_only=False)
    ordered = len(partitions) < 2 or bool((partitions[1:] >= partitions[:-1]).all())
    return Decoded(rows, partitions if ordered else None, rows.nbytes)


def _select(decoded: Sequence[Decoded], partition: int, lo: int, hi: int) -> pa.Table:
    """The rows of `partition` with offsets in [lo, hi] from decoded row groups, in offset order.
    In neve's own files a row group's rows run partition by partition, each in offset order: the
    rows are a slice (no copy); another engine's files are filtered and sorted."""
    tables = []
    for group in decoded:
        rows = group.rows
        if group.partitions is not None:
            start, stop = np.searchsorted(group.partitions, [partition, partition + 1])
            rows = rows.slice(start, stop - start)
        else:
            rows = rows.filter(pc.equal(pc.struct_field(rows.column(KAFKA), PARTITION), partition))
        offsets = pc.struct_field(rows.column(KAFKA), OFFSET).to_numpy(zero_copy_only=False)
        if len(offsets) > 1 and not (offsets[1:] > offsets[:-1]).all():
            order = np.argsort(offsets, kind="stable")
            rows, offsets = rows.take(order), offsets[order]
        start, stop = np.searchsorted(offsets, [lo, hi + 1])
        if stop > start:
            tables.append(rows.slice(start, stop - start))
    if not tables:
        return rows.slice(0, 0)
    rows = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    offsets = pc.struct_field(rows.column(KAFKA), OFFSET).to_numpy(zero_copy_only=False)
    if len(tables) > 1 and not (offsets[1:] > offsets[:-1]).all():
        rows = rows.take(np.argsort(offsets, kind="stable"))
    return rows

"""Rows → Arrow record batches → Parquet files (zstd, Iceberg field ids, timestamps as
TIMESTAMP_MICROS): one file per (value schema id, partition-spec value), and for each file what a
committer needs to register it as an Iceberg DataFile (statistics by pyiceberg, from the footer).

A decoded value its column cannot take (a decimal wider than its precision, an int beyond 32 bits)
is found when its batch does not convert: that row alone is stored raw instead, never dropped.
"""

from __future__ import annotations

import datetime
import math
import operator
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import compute_statistics_plan, data_file_statistics_from_parquet_metadata, parquet_path_to_id_mapping
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, HourTransform
from pyiceberg.typedef import Record as PartitionRecord
from pyiceberg.types import TimestampType, TimestamptzType
from pyiceberg.utils.datetime import date_to_days, datetime_to_micros, time_to_micros

from table.layout import KAFKA, OFFSET, PARTITION, TIMESTAMP, VALUE, VALUE_ERROR, VALUE_RAW, VALUE_SCHEMA_ID

from ..rows.columns import RawRows, records_to_rows
from ..rows.records import Record
from ..rows.translator import COLUMNS, OUTCOMES, PRODUCED_VALUE, RAW, TOMBSTONE
from .layout import arrow_schema, rows_to_arrow

MICROS_PER_DAY = 86_400_000_000
MICROS_PER_HOUR = 3_600_000_000
BATCH_ROWS = 8192  # rows converted to Arrow at a time, per open file
# A value column gets a dictionary when, in its file's first DICTIONARY_SAMPLE_ROWS rows, it holds at most
# one distinct value in DICTIONARY_DISTINCT, or fewer than DICTIONARY_SAMPLE_MIN values (too few to tell).
DICTIONARY_DISTINCT, DICTIONARY_SAMPLE_MIN, DICTIONARY_SAMPLE_ROWS = 2, 1024, 8192
# A file's row groups, unless the table's properties say otherwise (tables.TABLE_PROPERTIES sets
# both on the tables neve creates): the broker serves compacted offsets a row group at a time, so
# a row group is a read's smallest window; and each row group costs the write and the statistics.
ROW_GROUP_ROWS_PROPERTY, ROW_GROUP_BYTES_PROPERTY = "write.parquet.row-group-limit", "write.parquet.row-group-size-bytes"
DEFAULT_ROW_GROUP_ROWS, DEFAULT_ROW_GROUP_BYTES = 65_536, 8 * 1024 * 1024


@dataclass(slots=True)
class OffsetSpan:
    """The rows of one Kafka partition in one file: rows [first_row, first_row + rows), holding
    offsets first..last in order (a partition's offsets can spread over files of different
    partition values or schema ids, so not every offset between them need be in this file)."""

    first_row: int
    rows: int
    first: int
    last: int


@dataclass(slots=True)
class WrittenFile:
    path: str
    record_count: int
    file_size: int
    schema_id: int | None  # the value schema id of its rows (None: no schema)
    partition: tuple  # one value per partition-spec field, in spec order
    offsets: dict[int, OffsetSpan]  # Kafka partition → the offsets the file holds
    outcomes: dict[str, int]  # rows per translator outcome (after any fallback to raw)
    statistics: dict[str, Any]  # pyiceberg's DataFileStatistics.to_serialized_dict(): plain, picklable

    def data_file(self, spec: PartitionSpec, format_version: int = 2) -> DataFile:
        """The Iceberg DataFile to append (table.transaction().update_snapshot().fast_append())."""
        data_file = DataFile.from_args(
            _table_format_version=format_version,
            content=DataFileContent.DATA,
            file_path=self.path,
            file_format=FileFormat.PARQUET,
            partition=PartitionRecord(*self.partition),
            file_size_in_bytes=self.file_size,
            sort_order_id=None,
            spec_id=spec.spec_id,
            equality_ids=None,
            key_metadata=None,
            **self.statistics,
        )
        data_file.spec_id = spec.spec_id  # from_args does not take it (pyiceberg 0.12)
        return data_file


@dataclass(slots=True)
class _OpenFile:
    path: str
    schema_id: int | None
    partition: tuple
    sink: Any
    writer: pq.ParquetWriter | None  # made with the first row group, which picks its dictionary columns
    rows: list[dict] = field(default_factory=list)
    row_outcomes: list[str] = field(default_factory=list)
    record_count: int = 0
    offsets: dict[int, OffsetSpan] = field(default_factory=dict)
    last_partition: int | None = None
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    # add_raw's rows not yet written (never beside `rows`): Arrow pieces, their rows and tombstones
    raw: list[pa.RecordBatch] = field(default_factory=list)
    raw_count: int = 0
    raw_tombstones: int = 0
    # rows converted to Arrow (and counted in record_count), not yet written: the next row group
    group: list[pa.RecordBatch] = field(default_factory=list)
    group_rows: int = 0
    group_bytes: int = 0

    @property
    def pending(self) -> int:
        return len(self.rows) + self.raw_count


class TableWriter:
    """Writes one task's rows of one table. `filesystem` is a pyarrow.fs.FileSystem (wrap fsspec
    with pyarrow.fs.PyFileSystem(FSSpecHandler(fs))) or a pyiceberg FileIO (table.io); files go to
    `location`/<partition path>/<file_prefix>-<n>.parquet, so `file_prefix` must be unique per
    task attempt (a uuid) for a retried task never to overwrite a committed file."""

    def __init__(
        self,
        schema: Schema,
        spec: PartitionSpec,
        location: str,
        filesystem: Any,
        file_prefix: str | None = None,
        table_properties: dict[str, str] | None = None,
        drop_first_row: bool = False,
    ) -> None:
        self.schema = schema
        self.spec = spec
        self.location = location.rstrip("/")
        self.filesystem = filesystem
        self.file_prefix = file_prefix or uuid.uuid4().hex
        self.table_properties = table_properties or {}
        self.row_group_rows = int(self.table_properties.get(ROW_GROUP_ROWS_PROPERTY, DEFAULT_ROW_GROUP_ROWS))
        self.row_group_bytes = int(self.table_properties.get(ROW_GROUP_BYTES_PROPERTY, DEFAULT_ROW_GROUP_BYTES))
        self.arrow = arrow_schema(schema)
        self._dictionary = _dictionary_columns(self.arrow)  # the columns that may have a dictionary
        self._partition_of = _partitioner(schema, spec)
        self._raw_partition = _raw_partitioner(schema, spec)
        self._files: dict[tuple, _OpenFile] = {}
        self._written: list[WrittenFile] = []
        # The table-row-dropped plant (a deliberate bug, test only: job.TaskContext.drop_row_tasks):
        # the first row given is never written, though the task's offsets still name it.
        self._drop_first_row = drop_first_row

    def add(self, row: dict[str, Any], outcome: str) -> None:
        """One row from the translator. A partition's rows come in offset order and together (all
        of one partition's rows, then the next's), so that they are one run of rows in each file."""
        if self._drop_first_row:  # the plant: this row never reaches a file
            self._drop_first_row = False
            return
        spec_value = self._partition_of(row)
        key = (row[VALUE_SCHEMA_ID], spec_value)
        open_file = self._files.get(key)
        if open_file is None:
            open_file = self._files[key] = self._open(row[VALUE_SCHEMA_ID], spec_value)
        elif open_file.raw:
            self._flush(open_file)  # add_raw's rows first: the file keeps the order rows came in
        kafka = row[KAFKA]
        partition, offset = kafka[PARTITION], kafka[OFFSET]
        span = open_file.offsets.get(partition)
        if span is None:
            open_file.offsets[partition] = OffsetSpan(open_file.record_count + len(open_file.rows), 1, offset, offset)
        elif partition != open_file.last_partition or offset <= span.last:
            raise ValueError(f"partition {partition} offset {offset} comes after other rows or offsets in {open_file.path}: add each partition's rows together, in offset order")
        else:
            span.last = offset
            span.rows += 1
        open_file.last_partition = partition
        open_file.rows.append(row)
        open_file.row_outcomes.append(outcome)
        if len(open_file.rows) >= BATCH_ROWS:
            self._flush(open_file)

    @property
    def takes_raw(self) -> bool:
        """Whether add_raw and add_raw_rows can take rows of a topic without a schema (a table
        without a value column, and a spec on kafka.timestamp alone or none)."""
        return self._raw_partition is not None and VALUE not in self.arrow.names

    @property
    def takes_columns(self) -> bool:
        """Whether add_raw_rows can take rows whose values are in the value column (rows/avro_columns.py:
        a spec on kafka.timestamp alone or none)."""
        return self._raw_partition is not None and VALUE in self.arrow.names

    def add_raw(self, kafka: dict[str, Any], records: Sequence[Record]) -> bool:
        """The rows `translate(record, kafka, None)` makes of each of `records` (one decoded
        batch's, of a topic without a value schema, in offset order), added as add() would add
        them, held as columns instead of a dict a row (a quarter of the time at 100-byte values).
        False, having added nothing, when they must go through add() one by one instead: a table
        with a value column or a spec on another column, or offsets add() would refuse."""
        if not self.takes_raw or not records:
            return False
        offsets = [r[0] for r in records]
        if not all(map(operator.lt, offsets, offsets[1:])):
            return False
        return self.add_raw_rows(kafka[PARTITION], records_to_rows(kafka, records, self.arrow))

    def add_raw_rows(self, partition: int, rows: RawRows) -> bool:
        """add_raw's rows as columns already (columns.decode_batches: consecutive batches of
        Kafka partition `partition`), or rows with their values in the value column alone
        (rows/avro_columns.py; `rows.schema_id` set), which add() would key by that schema id, and
        their tombstones by none. False, having added nothing, as for add_raw."""
        if rows.values is not None:
            raise ValueError("rows whose values were left apart (decode_batches(values_apart=True)) have no value_raw to write")
        if self._raw_partition is None or not len(rows):
            return False
        offsets = rows.offsets
        if not (offsets[1:] > offsets[:-1]).all():
            return False
        # (file key, its rows), in the order add() would open the files: by each one's first row
        groups = [((kind.schema_id, spec_value), kind) for spec_value, group in self._raw_partition(rows) for kind in group.by_outcome()]
        groups.sort(key=lambda g: int(g[1].offsets[0]))
        for key, group in groups:  # every file must take its rows before any is added
            open_file = self._files.get(key)
            span = open_file.offsets.get(partition) if open_file is not None else None
            if span is not None and (partition != open_file.last_partition or group.offsets[0] <= span.last):
                return False
        for (_, spec_value), group in groups:
            self._add_raw_group(partition, spec_value, group)
        return True

    def _add_raw_group(self, partition: int, spec_value: tuple, rows: RawRows) -> None:
        if self._drop_first_row:  # the plant: the group's first row never reaches a file
            self._drop_first_row = False
            if len(rows) == 1:
                return
            rows = rows.slice(1, len(rows))
        key = (rows.schema_id, spec_value)
        open_file = self._files.get(key)
        if open_file is None:
            open_file = self._files[key] = self._open(rows.schema_id, spec_value)
        elif open_file.rows:
            self._flush(open_file)  # add()'s rows first: the file keeps the order rows came in
        n = len(rows)
        first, last = int(rows.offsets[0]), int(rows.offsets[-1])
        span = open_file.offsets.get(partition)
        if span is None:
            open_file.offsets[partition] = OffsetSpan(open_file.record_count + open_file.pending, n, first, last)
        else:
            span.last = last
            span.rows += n
        open_file.last_partition = partition
        # In slices that fill BATCH_ROWS exactly, so that the file's batches are add()'s.
        at = 0
        while at < n:
            take = min(n - at, BATCH_ROWS - open_file.raw_count)
            piece = rows if take == n else rows.slice(at, at + take)
            open_file.raw.append(piece.rows)
            open_file.raw_count += take
            open_file.raw_tombstones += piece.tombstones
            at += take
            if open_file.raw_count >= BATCH_ROWS:
                self._flush(open_file)

    def close(self) -> list[WrittenFile]:
        """Finish every file; the files written by this writer, in the order they were opened."""
        for open_file in self._files.values():
            self._flush(open_file)
            self._write_group(open_file)
            open_file.writer.close()
            size = open_file.sink.tell()
            open_file.sink.close()
            metadata = open_file.writer.writer.metadata
            statistics = data_file_statistics_from_parquet_metadata(
                parquet_metadata=metadata,
                stats_columns=compute_statistics_plan(self.schema, self.table_properties),
                parquet_column_mapping=parquet_path_to_id_mapping(self.schema),
            )
            self._written.append(WrittenFile(
                path=open_file.path,
                record_count=open_file.record_count,
                file_size=size,
                schema_id=open_file.schema_id,
                partition=open_file.partition,
                offsets=open_file.offsets,
                outcomes={k: v for k, v in open_file.outcomes.items() if v},
                statistics=statistics.to_serialized_dict(),
            ))
        self._files.clear()
        return self._written

    def abort(self) -> None:
        """Close the open files without finishing them (a failed task: its files are never committed)."""
        for open_file in self._files.values():
            closes = [open_file.sink.close] if open_file.writer is None else [open_file.writer.close, open_file.sink.close]
            for close in closes:
                try:
                    close()
                except Exception:  # closing what failed must not hide why it failed
                    pass
        self._files.clear()

    def _open(self, schema_id: int | None, partition: tuple) -> _OpenFile:
        n = len(self._written) + len(self._files)
        directory = self.location
        if self.spec.fields:
            directory += "/" + self.spec.partition_to_path(PartitionRecord(*partition), self.schema)
        path = f"{directory}/{self.file_prefix}-{n:05d}.parquet"
        return _OpenFile(path, schema_id, partition, _open_output(self.filesystem, path), None)

    def _parquet_writer(self, open_file: _OpenFile, first_group: pa.Table) -> pq.ParquetWriter:
        return pq.ParquetWriter(
            open_file.sink,
            self.arrow,
            compression="zstd",
            coerce_timestamps="us",
            allow_truncated_timestamps=False,
            store_decimal_as_integer=True,  # as pyiceberg writes decimals
            use_dictionary=_repeating_columns(first_group, self._dictionary),
        )

    def _flush(self, open_file: _OpenFile) -> None:
        """The rows held as dicts or raw pieces converted to Arrow, into the next row group
        (written once it holds the table's row-group rows or bytes)."""
        if open_file.raw:
            self._stage(open_file, pa.Table.from_batches(open_file.raw, schema=self.arrow))
            # a file's raw pieces are of its schema id: values in columns alone, or none
            open_file.outcomes[TOMBSTONE] += open_file.raw_tombstones
            open_file.outcomes[RAW if open_file.schema_id is None else COLUMNS] += open_file.raw_count - open_file.raw_tombstones
            open_file.raw, open_file.raw_count, open_file.raw_tombstones = [], 0, 0
        if not open_file.rows:
            return
        self._stage(open_file, self._to_arrow(open_file.rows, open_file.row_outcomes))
        for outcome in open_file.row_outcomes:
            open_file.outcomes[outcome] += 1
        open_file.rows = []
        open_file.row_outcomes = []

    def _stage(self, open_file: _OpenFile, rows: pa.Table | pa.RecordBatch) -> None:
        open_file.record_count += rows.num_rows
        while rows.num_rows:
            # cut at the row limit, or where the byte limit falls (by the rows' mean size), so that
            # every row group but a file's last reaches one of them
            room = self.row_group_rows - open_file.group_rows
            if rows.nbytes:
                room = min(room, max(1, math.ceil((self.row_group_bytes - open_file.group_bytes) * rows.num_rows / rows.nbytes)))
            piece = rows.slice(0, room)
            rows = rows.slice(piece.num_rows)
            open_file.group += piece.to_batches() if isinstance(piece, pa.Table) else [piece]
            open_file.group_rows += piece.num_rows
            open_file.group_bytes += piece.nbytes
            if open_file.group_rows >= self.row_group_rows or open_file.group_bytes >= self.row_group_bytes:
                self._write_group(open_file)

    def _write_group(self, open_file: _OpenFile) -> None:
        if open_file.group:
            group = pa.Table.from_batches(open_file.group, schema=self.arrow)
            if open_file.writer is None:
                open_file.writer = self._parquet_writer(open_file, group)
            open_file.writer.write_table(group, row_group_size=self.row_group_rows)
            open_file.group, open_file.group_rows, open_file.group_bytes = [], 0, 0

    def _to_arrow(self, rows: list[dict], outcomes: list[str]) -> pa.RecordBatch:
        try:
            return rows_to_arrow(rows, self.arrow)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            pass
        # Some value does not fit its column: find the rows, one at a time, and keep them raw.
        for i, row in enumerate(rows):
            try:
                rows_to_arrow([row], self.arrow)
            except (pa.ArrowException, ValueError, TypeError, OverflowError) as e:
                rows[i] = _as_raw(row, f"value does not fit its column: {e}")
                outcomes[i] = RAW
        return rows_to_arrow(rows, self.arrow)


def _as_raw(row: dict[str, Any], reason: str) -> dict[str, Any]:
    raw = dict(row)
    if raw.get(VALUE_RAW) is None:
        raw[VALUE_RAW] = raw.pop(PRODUCED_VALUE)
    raw[VALUE] = None
    raw[VALUE_ERROR] = reason
    return raw


def _dictionary_columns(arrow: pa.Schema) -> list[str]:
    """The Parquet columns that may be written with a dictionary (_repeating_columns picks, per
    file): the value's, where a topic's own fields (a country, a status) repeat and readers filter. The kafka struct, headers, key_raw and
    value_raw are plain (and zstd): offsets and timestamps never repeat, raw values seldom, and a
    batch field repeated row after row zstd takes as well; a dictionary cost a quarter of the
    write of 100-byte raw values and made the file larger."""
    if VALUE not in arrow.names:
        return []
    sink = pa.BufferOutputStream()
    pq.ParquetWriter(sink, arrow, store_decimal_as_integer=True).close()  # a file of no rows: its schema
    parquet = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema
    return [parquet.column(i).path for i in range(len(parquet)) if parquet.column(i).path.split(".")[0] == VALUE]


def _repeating_columns(rows: pa.Table, candidates: list[str]) -> list[str]:
    """Of `candidates` (Parquet column paths), those whose values in `rows` (a file's first row
    group; its first DICTIONARY_SAMPLE_ROWS rows) repeat enough for a dictionary to pay: at most
    one distinct value in DICTIONARY_DISTINCT of them, or too few values to tell. A column of values that seldom repeat (an id, a creation
    time, an amount, a free-text note) would have Parquet build a dictionary at every row group
    only to drop it once it outgrows its page: that cost a third of the write of 100-byte Avro
    values (bench/RESULTS.md, 2026-11-26)."""
    wanted = set(candidates)
    repeating = []
    for path, values in _leaf_arrays(rows.slice(0, DICTIONARY_SAMPLE_ROWS), wanted):
        present = len(values) - values.null_count
        if present < DICTIONARY_SAMPLE_MIN or pc.count_distinct(values).as_py() * DICTIONARY_DISTINCT <= present:
            repeating.append(path)
    return repeating


def _leaf_arrays(rows: pa.Table, wanted: set[str]) -> Iterator[tuple[str, pa.Array]]:
    """(Parquet column path, the values of that leaf column) for each leaf column of `rows` whose
    path is in `wanted` (nested lists, maps and structs walked as Parquet names their parts)."""

    def walk(path: str, array: pa.Array) -> Iterator[tuple[str, pa.Array]]:
        kind = array.type
        if pa.types.is_struct(kind):
            for i in range(kind.num_fields):
                yield from walk(f"{path}.{kind.field(i).name}", array.field(i))
        elif pa.types.is_map(kind):
            yield from walk(f"{path}.key_value.key", array.keys)
            yield from walk(f"{path}.key_value.value", array.items)
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            yield from walk(f"{path}.list.element", array.flatten())
        elif path in wanted:
            yield path, array.storage if isinstance(array, pa.ExtensionArray) else array  # a uuid: its 16 bytes

    prefixes = {path.split(".")[0] for path in wanted}
    for name in rows.column_names:
        if name in prefixes:
            yield from walk(name, rows.column(name).combine_chunks())


def _open_output(filesystem: Any, path: str) -> Any:
    if hasattr(filesystem, "open_output_stream"):  # pyarrow.fs.FileSystem
        parent = path.rsplit("/", 1)[0]
        filesystem.create_dir(parent, recursive=True)
        return filesystem.open_output_stream(path)
    return filesystem.new_output(path).create(overwrite=False)  # pyiceberg FileIO


def _partitioner(schema: Schema, spec: PartitionSpec) -> Callable[[dict], tuple]:
    """row → its partition value (a tuple in spec order), through pyiceberg's transforms."""
    if not spec.fields:
        return lambda row: ()
    parts = []
    for pf in spec.fields:
        path = schema.find_column_name(pf.source_id)
        assert path is not None
        source_type = schema.find_type(pf.source_id)
        parts.append((tuple(path.split(".")), _fast_transform(pf.transform, source_type) or pf.transform.transform(source_type)))
    if len(parts) == 1 and len(parts[0][0]) == 2:
        # The default spec, day(kafka.timestamp): one lookup and one division a row.
        (outer, inner), transform = parts[0]

        def partition_of_one(row: dict) -> tuple:
            value = row.get(outer)
            value = value.get(inner) if value is not None else None
            return (None if value is None else transform(value if type(value) is int else _iceberg_value(value)),)

        return partition_of_one

    def partition_of(row: dict) -> tuple:
        values = []
        for path, transform in parts:
            value: Any = row
            for name in path:
                value = value.get(name) if value is not None else None
            values.append(None if value is None else transform(_iceberg_value(value)))
        return tuple(values)

    return partition_of


def _raw_partitioner(schema: Schema, spec: PartitionSpec) -> Callable[[RawRows], list[tuple[tuple, RawRows]]] | None:
    """rows → [(partition value, its rows in order)], values in the order their first row comes
    (the order add() opens files in), for add_raw_rows; None when it cannot serve this table (a
    spec on anything but kafka.timestamp)."""
    if not spec.fields:
        return lambda rows: [((), rows)]
    if len(spec.fields) != 1 or schema.find_column_name(spec.fields[0].source_id) != f"{KAFKA}.{TIMESTAMP}":
        return None
    pf = spec.fields[0]
    source_type = schema.find_type(pf.source_id)
    per = _fast_divisor(pf.transform, source_type)
    transform = pf.transform.transform(source_type)

    def groups(rows: RawRows) -> list[tuple[tuple, RawRows]]:
        micros = rows.timestamps * 1000  # clamped to years 1-9999 (table/layout.py)
        if per is not None:
            keys = micros // per  # numpy's // floors, as Python's does
            value_of: Callable[[Any], Any] = int
        else:  # any other transform: once per distinct timestamp
            distinct, inverse = np.unique(micros, return_inverse=True)
            values = [transform(int(m)) for m in distinct.tolist()]
            ids: dict[Any, int] = {}
            keys = np.array([ids.setdefault(v, len(ids)) for v in values], dtype=np.int64)[inverse]
            by_id = list(ids)
            value_of = by_id.__getitem__
        if (keys == keys[0]).all():  # rows within one day: the common case
            return [((value_of(keys[0]),), rows)]
        distinct, first_at = np.unique(keys, return_index=True)
        return [((value_of(key),), rows.take(np.flatnonzero(keys == key))) for key in distinct[np.argsort(first_at)]]

    return groups


def _fast_divisor(transform: Any, source_type: Any) -> int | None:
    """The microseconds a day or an hour partition spans, for a day or hour of a timestamp."""
    if not isinstance(source_type, (TimestampType, TimestamptzType)) or not isinstance(transform, (DayTransform, HourTransform)):
        return None
    return MICROS_PER_DAY if isinstance(transform, DayTransform) else MICROS_PER_HOUR


def _fast_transform(transform: Any, source_type: Any) -> Callable[[Any], Any] | None:
    """pyiceberg's day or hour of a timestamp as one floor division of its microseconds (what its
    micros_to_days and micros_to_hours compute, without a timedelta and three calls a row); None
    for any other transform. Values that are not ints (datetimes) go through pyiceberg's."""
    per = _fast_divisor(transform, source_type)
    if per is None:
        return None
    slow = transform.transform(source_type)
    return lambda v: v // per if type(v) is int else slow(v)


def _iceberg_value(value: Any) -> Any:
    """Python values as pyiceberg's transforms take them (the kafka columns already are: micros)."""
    if isinstance(value, datetime.datetime):
        return datetime_to_micros(value)
    if isinstance(value, datetime.date):
        return date_to_days(value)
    if isinstance(value, datetime.time):
        return time_to_micros(value)
    return value

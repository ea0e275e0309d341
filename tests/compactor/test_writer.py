"""compactor/files/writer.py: rows of every type to Parquet files (zstd, Iceberg field ids, timestamps
as TIMESTAMP_MICROS) read back by pyarrow with the exact values; one file per (schema id,
partition value); the offsets and row ranges each file holds; a value its column cannot take kept
raw; the DataFile a committer appends."""

from __future__ import annotations

import datetime
import decimal
import io
import json
import uuid

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from fastavro import parse_schema, schemaless_writer

from compactor.files.layout import partition_spec, rows_to_arrow, table_schema
from compactor.files.writer import OffsetSpan, TableWriter
from compactor.rows.columns import RawRows
from compactor.rows.records import Batch, Record
from compactor.rows.translator import COLUMNS, RAW, TOMBSTONE, kafka_columns, translate, writer_schema
from registry.wire import frame

UTC = datetime.UTC
DAY_MS = 86_400_000
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z
SCHEMA = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "ok", "type": "boolean"},
        {"name": "qty", "type": "int"},
        {"name": "ratio", "type": "float"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 3}},
        {"name": "big", "type": {"type": "fixed", "name": "Big", "size": 9, "logicalType": "decimal", "precision": 20, "scale": 4}},
        {"name": "note", "type": ["null", "string"]},
        {"name": "blob", "type": "bytes"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "double"]}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [{"name": "sku", "type": "string"}, {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}}]}}},
    ],
}


def order(i: int) -> dict:
    return {
        "id": 2**40 + i, "ok": i % 2 == 0, "qty": -i, "ratio": 0.5, "price": decimal.Decimal("1234567.89"),
        "code": b"abc", "big": decimal.Decimal("-1234567890123456.7890"), "note": None if i % 2 else f"n{i}", "blob": bytes([i % 256]) * 3,
        "kind": "B", "tags": ["x", "y"], "attrs": {"w": 1.5, "z": None}, "day": datetime.date(2024, 2, 29),
        "at": datetime.time(23, 59, 59, 999000), "at_us": datetime.time(0, 0, 0, 1),
        "ts": datetime.datetime(2024, 1, 1, 12, 0, 0, 123000, tzinfo=UTC), "ts_us": datetime.datetime(1969, 7, 20, 20, 17, 40, 1, tzinfo=UTC),
        "local": datetime.datetime(2030, 5, 6, 7, 8, 9, 10), "uid": uuid.UUID(int=i + 1),
        "lines": [{"sku": "s1", "uid": uuid.UUID(int=99)}],
    }


def encoded(parsed, value: dict, schema_id: int) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parsed, value)
    return frame(schema_id, out.getvalue())


def batch(base_offset: int) -> Batch:
    return Batch(0, 0, 100, base_offset, 0, 2, 0x03, 99, T0, T0 + 2 * DAY_MS, -1, -1, -1, 100)


@pytest.fixture
def writer_setup(tmp_path):
    ws = writer_schema(21, json.dumps(SCHEMA))
    schema = table_schema(ws.layout.iceberg)
    spec = partition_spec(schema)
    writer = TableWriter(schema, spec, str(tmp_path / "data"), pafs.LocalFileSystem(), file_prefix="task0")
    return ws, schema, spec, writer


def test_rows_of_every_type_read_back_exactly_with_field_ids(writer_setup):
    ws, schema, spec, writer = writer_setup
    kafka = kafka_columns(4, batch(10))
    rows = []
    for i in range(5):
        row, outcome = translate(Record(10 + i, T0 + i, f"k{i}".encode(), encoded(ws.parsed, order(i), 21), (("h", b"v"),)), kafka, {21: ws}.get)
        assert outcome == COLUMNS
        writer.add(row, outcome)
        rows.append(row)
    (written,) = writer.close()
    assert written.path == f"{writer.location}/timestamp_day=2023-11-14/task0-00000.parquet"
    assert (written.record_count, written.schema_id, written.partition, written.outcomes) == (5, 21, (19675,), {COLUMNS: 5})
    assert written.offsets == {4: OffsetSpan(first_row=0, rows=5, first=10, last=14)}
    table = pq.read_table(written.path, partitioning=None)
    got = table.to_pylist()
    for i, row in enumerate(got):
        value = row["value"]
        assert value["attrs"] == [("w", 1.5), ("z", None)]  # Arrow gives maps back as pairs
        value["attrs"] = dict(value["attrs"])
        # uuids stored as UUID columns come back as UUIDs; times of day are microseconds since midnight
        assert value == {**order(i), "at": 86_399_999_000, "at_us": 1}, i
        assert row["kafka"]["offset"] == 10 + i and row["kafka"]["timestamp"] == datetime.datetime.fromtimestamp((T0 + i) / 1000, UTC)
        assert row["kafka"]["batch_max_timestamp"] == datetime.datetime.fromtimestamp((T0 + 2 * DAY_MS) / 1000, UTC)
        assert (row["key_raw"], row["headers"], row["value_raw"], row["value_schema_id"], row["value_error"]) == (f"k{i}".encode(), [{"key": "h", "value": b"v", "key_bytes": None}], None, 21, None)
    # Field ids as the table schema has them, on every column, and timestamps as TIMESTAMP_MICROS.
    parquet = pq.read_metadata(written.path)
    ids = {parquet.schema.column(i).path: parquet.schema.column(i) for i in range(parquet.num_columns)}
    from pyiceberg.io.pyarrow import parquet_path_to_id_mapping

    assert set(ids) == set(parquet_path_to_id_mapping(schema))
    arrow_ids = {f.name: int(f.metadata[b"PARQUET:field_id"]) for f in table.schema}
    assert arrow_ids == {f.name: f.field_id for f in schema.fields}
    timestamp = ids["kafka.timestamp"]
    assert (timestamp.physical_type, timestamp.logical_type.type) == ("INT64", "TIMESTAMP")
    assert json.loads(timestamp.logical_type.to_json())["timeUnit"] == "microseconds"
    assert timestamp.converted_type == "TIMESTAMP_MICROS"
    assert ids["value.uid"].logical_type.type == "UUID"
    assert parquet.row_group(0).column(0).compression == "ZSTD"
    # A dictionary for the value's columns alone: neve's own columns are plain (and zstd).
    group = parquet.row_group(0)
    dictionary = {group.column(i).path_in_schema for i in range(group.num_columns) if group.column(i).has_dictionary_page}
    assert dictionary == {path for path, column in ids.items() if path.startswith("value.") and column.physical_type != "BOOLEAN"}  # Parquet has no dictionary of booleans


def test_a_dictionary_for_the_value_columns_that_repeat_in_the_first_row_group(writer_setup):
    # 2,048 rows: id, qty, the notes present and uid differ row by row; every other value column
    # repeats (blob takes 256 values, the rest one or two). Parquet has no dictionary of booleans.
    ws, schema, spec, writer = writer_setup
    kafka = kafka_columns(0, batch(0))
    for i in range(2048):
        row, outcome = translate(Record(i, T0, None, encoded(ws.parsed, order(i), 21), ()), kafka, {21: ws}.get)
        writer.add(row, outcome)
    (written,) = writer.close()
    parquet = pq.read_metadata(written.path)
    values = {parquet.schema.column(i).path: parquet.schema.column(i).physical_type for i in range(parquet.num_columns)}
    values = {path for path, kind in values.items() if path.startswith("value.") and kind != "BOOLEAN"}
    assert parquet.num_row_groups == 1 and parquet.num_rows == 2048
    group = parquet.row_group(0)
    dictionary = {group.column(i).path_in_schema for i in range(group.num_columns) if group.column(i).has_dictionary_page}
    assert dictionary == values - {"value.id", "value.qty", "value.note", "value.uid"}
    assert {"value.blob", "value.tags.list.element", "value.attrs.key_value.key", "value.lines.list.element.uid"} <= dictionary
    assert [row["value"]["id"] for row in pq.read_table(written.path, columns=["value"]).to_pylist()] == [2**40 + i for i in range(2048)]


def test_one_file_per_schema_id_and_partition_value_with_row_ranges(writer_setup):
    ws, schema, spec, writer = writer_setup
    resolve = {21: ws}.get
    # Partition 0: offsets 0..5 over two days and three value kinds; then partition 1.
    plan = [(0, 0, 0, "avro"), (0, 1, 0, "raw"), (0, 2, 1, "avro"), (0, 3, 0, None), (0, 4, 0, "avro"), (0, 5, 1, "avro"), (1, 0, 0, "avro"), (1, 1, 1, "raw")]
    for partition, offset, day, kind in plan:
        value = {"avro": encoded(ws.parsed, order(offset), 21), "raw": b"plain", None: None}[kind]
        row, outcome = translate(Record(offset, T0 + day * DAY_MS, None, value, ()), kafka_columns(partition, batch(0)), resolve)
        writer.add(row, outcome)
    files = writer.close()
    summary = {(f.schema_id, f.partition[0] - 19675): (f.record_count, f.outcomes, f.offsets) for f in files}
    assert summary == {
        (21, 0): (3, {COLUMNS: 3}, {0: OffsetSpan(0, 2, 0, 4), 1: OffsetSpan(2, 1, 0, 0)}),
        (None, 0): (2, {RAW: 1, TOMBSTONE: 1}, {0: OffsetSpan(0, 2, 1, 3)}),
        (21, 1): (2, {COLUMNS: 2}, {0: OffsetSpan(0, 2, 2, 5)}),
        (None, 1): (1, {RAW: 1}, {1: OffsetSpan(0, 1, 1, 1)}),
    }
    for f in files:
        want = [(p, o) for p, o, day, kind in plan if (21 if kind == "avro" else None, 19675 + day) == (f.schema_id, f.partition[0])]
        got = [(r["partition"], r["offset"]) for r in pq.read_table(f.path, partitioning=None).column("kafka").to_pylist()]
        assert got == want


def test_rows_of_a_schema_id_with_tombstones_among_them_make_the_files_add_makes(writer_setup, tmp_path):
    # The same rows, one by one through add() and at once as columns (a schema id's values and
    # tombstones among them, as avro_columns.py makes them): the same files, named and opened in
    # the same order, holding the same rows, spans and outcomes.
    ws, schema, spec, one_by_one = writer_setup
    at_once = TableWriter(schema, spec, str(tmp_path / "at-once"), pafs.LocalFileSystem(), file_prefix="task0")
    tombstones, next_day = {0, 4, 5, 9}, 6  # the first row a tombstone; a day begins at offset 6
    rows = []
    for partition, offsets in ((2, range(10)), (3, range(100, 103))):
        kafka = kafka_columns(partition, batch(offsets[0]))
        for offset in offsets:
            value = None if offset in tombstones else encoded(ws.parsed, order(offset), 21)
            row, outcome = translate(Record(offset, T0 + (DAY_MS if next_day <= offset < 100 else 0), None, value, ()), kafka, {21: ws}.get)
            assert outcome == (TOMBSTONE if value is None else COLUMNS)
            one_by_one.add(row, outcome)
            rows.append(row)
        part = [r for r in rows if r["kafka"]["partition"] == partition]
        batch_rows = rows_to_arrow(part, one_by_one.arrow)
        offsets_of = np.array([r["kafka"]["offset"] for r in part], dtype=np.int64)
        timestamps = np.array([r["kafka"]["timestamp"] // 1000 for r in part], dtype=np.int64)
        dead = sum(r["value"] is None for r in part)
        assert at_once.add_raw_rows(partition, RawRows(batch_rows, offsets_of, timestamps, dead, 21))
    want, got = one_by_one.close(), at_once.close()
    assert [(f.path.rsplit("/", 2)[-2:], f.record_count, f.schema_id, f.partition, f.offsets, f.outcomes) for f in got] == [
        (f.path.rsplit("/", 2)[-2:], f.record_count, f.schema_id, f.partition, f.offsets, f.outcomes) for f in want
    ]
    assert [f.outcomes for f in got] == [{TOMBSTONE: 3}, {COLUMNS: 3 + 3}, {COLUMNS: 3}, {TOMBSTONE: 1}]
    for a, b in zip(got, want, strict=True):
        assert pq.read_table(a.path, partitioning=None).equals(pq.read_table(b.path, partitioning=None))


def test_rows_of_a_partition_must_come_together_in_offset_order(writer_setup):
    ws, schema, spec, writer = writer_setup
    for partition, offset in [(0, 5), (1, 0)]:
        writer.add(*translate(Record(offset, T0, None, b"x", ()), kafka_columns(partition, batch(0)), None))
    with pytest.raises(ValueError, match="add each partition's rows together"):
        writer.add(*translate(Record(6, T0, None, b"x", ()), kafka_columns(0, batch(0)), None))
    writer.abort()


def test_a_value_its_column_cannot_take_is_kept_raw(writer_setup):
    ws, schema, spec, writer = writer_setup
    wide = dict(SCHEMA, fields=[dict(f, type=dict(f["type"], precision=12)) if f["name"] == "price" else f for f in SCHEMA["fields"]])
    too_wide = encoded(parse_schema(wide), dict(order(1), price=decimal.Decimal("9999999999.99")), 21)
    fine = encoded(ws.parsed, order(2), 21)
    for offset, value in enumerate([fine, too_wide, fine]):
        writer.add(*translate(Record(offset, T0, None, value, ()), kafka_columns(0, batch(0)), {21: ws}.get))
    (written,) = writer.close()
    assert written.outcomes == {COLUMNS: 2, RAW: 1}
    rows = pq.read_table(written.path, partitioning=None).to_pylist()
    assert [r["value_raw"] for r in rows] == [None, too_wide, None]
    assert rows[1]["value"] is None and rows[1]["value_error"].startswith("value does not fit its column")
    assert rows[2]["value"]["price"] == decimal.Decimal("1234567.89")


def test_the_data_file_for_the_committer(writer_setup):
    ws, schema, spec, writer = writer_setup
    for offset in range(3):
        writer.add(*translate(Record(offset, T0, None, encoded(ws.parsed, order(offset), 21), ()), kafka_columns(0, batch(0)), {21: ws}.get))
    (written,) = writer.close()
    data_file = written.data_file(spec)
    assert (data_file.file_path, data_file.record_count, data_file.file_size_in_bytes) == (written.path, 3, pafs.LocalFileSystem().get_file_info(written.path).size)
    assert data_file.partition[0] == 19675 and data_file.spec_id == spec.spec_id
    # pyiceberg keeps bounds of top-level columns only (nested ones get counts).
    schema_id = schema.find_field("value_schema_id").field_id
    assert (data_file.lower_bounds[schema_id], data_file.upper_bounds[schema_id]) == ((21).to_bytes(4, "little"), (21).to_bytes(4, "little"))
    assert data_file.value_counts[schema.find_field("kafka.offset").field_id] == 3
    assert data_file.null_value_counts[schema.find_field("value_raw").field_id] == 3


@pytest.mark.parametrize("value_bytes, properties, groups", [
    (10, {"write.parquet.row-group-size-bytes": str(1 << 30)}, [65_536, 65_536, 18_928]),  # the default row limit
    (10, {"write.parquet.row-group-limit": "50000", "write.parquet.row-group-size-bytes": str(1 << 30)}, [50_000, 50_000, 50_000]),
    (1000, {"write.parquet.row-group-size-bytes": str(2 << 20)}, None),  # the byte limit: about 2 MiB each
])  # fmt: skip
def test_row_groups_fill_to_the_tables_limits_whoever_adds_the_rows(tmp_path, value_bytes, properties, groups):
    """A file's row groups hold up to the table's row-group rows or bytes (the broker serves a
    row group at a time), with rows by add_raw and by add() in one group, in the order added."""
    schema = table_schema()
    writer = TableWriter(schema, partition_spec(schema, "none"), str(tmp_path / "data"), pafs.LocalFileSystem(), file_prefix="t", table_properties=properties)
    total, offset = 150_000, 0
    while offset < total:
        n = min(1000, total - offset)
        b = Batch(0, 0, 0, offset, 0, 2, 0, n - 1, T0, T0, -1, -1, -1, n)
        records = [Record(offset + i, T0, None, b"%0*d" % (value_bytes, offset + i), ()) for i in range(n)]
        if (offset // 1000) % 7 == 3:  # now and then a batch the row way
            for r in records:
                writer.add(*translate(r, kafka_columns(0, b), None))
        else:
            assert writer.add_raw(kafka_columns(0, b), records)
        offset += n
    (written,) = writer.close()
    parquet = pq.ParquetFile(written.path)
    sizes = [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)]
    if groups is not None:
        assert sizes == groups
    else:
        assert sum(sizes) == total and len(sizes) > 1
        stored = [parquet.metadata.row_group(i).total_byte_size for i in range(parquet.num_row_groups)]
        assert all(0.75 * (2 << 20) <= n <= 1.25 * (2 << 20) for n in stored[:-1]), stored
    values = parquet.read(columns=["value_raw"]).column("value_raw").to_pylist()
    assert values == [b"%0*d" % (value_bytes, i) for i in range(total)]

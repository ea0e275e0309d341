"""table/avro_values.py: every value the compactor keeps as columns alone comes back from its Parquet
file as the produced bytes (frame and Avro binary) with its own writer schema, also from a table
that later schema versions widened; schemas whose values are never columns alone are refused."""

from __future__ import annotations

import datetime
import decimal
import io
import json
import struct
import time
import uuid

import pyarrow.parquet as pq
import pytest
from fastavro import schemaless_writer
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pyiceberg.schema import Schema

from compactor.files.layout import arrow_schema, rows_to_arrow, table_schema
from compactor.rows.avro_types import evolve
from compactor.rows.records import Batch, Record
from compactor.rows.translator import COLUMNS, kafka_columns, translate, writer_schema
from registry.wire import frame
from table.avro_values import ValueEncoder, encoder
from tests.compactor.avro_strategies import record_schema, values

BATCH = Batch(0, 0, 100, 40, 0, 2, 0x04, 9, 1_700_000_000_000, 1_700_000_000_900, 7, 1, 12, 10)
KAFKA = kafka_columns(3, BATCH)
SETTINGS = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
UTC = datetime.UTC


def produced(schema_id: int, schema, value, kept_as_columns=None) -> tuple[bytes, dict]:
    """(the produced value bytes, the row the compactor makes of them), for a value the compactor
    keeps as columns alone: `kept_as_columns` is told whether it does (assume, in a property: the
    translator's own tests say every generated value is)."""
    ws = writer_schema(schema_id, json.dumps(schema))
    out = io.BytesIO()
    schemaless_writer(out, ws.parsed, value)
    value_bytes = frame(schema_id, out.getvalue())
    row, outcome = translate(Record(40, 1_700_000_000_123, b"k", value_bytes, ()), KAFKA, {schema_id: ws}.get)
    if kept_as_columns is None:
        assert outcome == COLUMNS, row["value_error"]
    else:
        kept_as_columns(outcome == COLUMNS)
    return value_bytes, row


def parquet_rows(rows: list[dict], schema: Schema) -> list[dict]:
    """`rows` through a Parquet file of the table schema `schema` written as compactor/files/writer.py's
    TableWriter writes one (its Arrow schema, rows_to_arrow, its ParquetWriter options), read back
    by pyarrow."""
    arrow = arrow_schema(schema)
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, arrow, compression="zstd", coerce_timestamps="us", allow_truncated_timestamps=False, store_decimal_as_integer=True) as writer:
        writer.write_batch(rows_to_arrow(rows, arrow))
    return pq.read_table(io.BytesIO(sink.getvalue())).to_pylist()


def value_table(schema_id: int, schema) -> Schema:
    """The table schema of a topic whose values have one writer schema."""
    return table_schema(writer_schema(schema_id, json.dumps(schema)).layout.iceberg)


@st.composite
def schema_and_values(draw):
    schema = draw(record_schema())
    return schema, draw(st.lists(values(schema), min_size=1, max_size=3))


@SETTINGS
@given(schema_and_values())
def test_every_value_kept_as_columns_encodes_back_to_its_produced_bytes(case):
    schema, generated = case
    produced_rows = [produced(17, schema, value, assume) for value in generated]
    read = parquet_rows([row for _, row in produced_rows], value_table(17, schema))
    value_encoder = ValueEncoder(17, json.dumps(schema))
    assert [value_encoder.encode(row["value"]) for row in read] == [value_bytes for value_bytes, _ in produced_rows]


def test_maps_read_as_dicts_and_uuids_read_as_their_bytes_encode_the_same():
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "tags", "type": {"type": "map", "values": ["null", {"type": "int", "logicalType": "time-millis"}]}},
    ]}
    value = {"id": uuid.UUID(int=7), "tags": {"b": datetime.time(1, 2, 3, 4000), "a": None, "c": datetime.time(0)}}
    value_bytes, row = produced(5, schema, value)
    (read,) = parquet_rows([row], value_table(5, schema))
    assert read["value"]["tags"] == [("b", 3_723_004_000), ("a", None), ("c", 0)]  # pairs, in order
    value_encoder = ValueEncoder(5, json.dumps(schema))
    as_dicts = {"id": uuid.UUID(int=7).bytes, "tags": dict(read["value"]["tags"])}  # to_pylist(maps_as_pydicts=...), UUIDs as storage
    assert value_encoder.encode(read["value"]) == value_encoder.encode(as_dicts) == value_bytes
    assert read["value"]["tags"] == [("b", 3_723_004_000), ("a", None), ("c", 0)]  # the column value is left as it was


@pytest.mark.parametrize(("schema", "value"), [
    ("string", "héllo"),
    ({"type": "long", "logicalType": "timestamp-micros"}, datetime.datetime(2024, 2, 29, 1, 2, 3, 456789, tzinfo=UTC)),
    ({"type": "map", "values": {"type": "fixed", "name": "U", "size": 16, "logicalType": "uuid"}}, {"x": uuid.UUID(int=1).bytes, "": b"\xff" * 16}),
    ({"type": "array", "items": {"type": "long", "logicalType": "time-micros"}}, [datetime.time(23, 59, 59, 999999), datetime.time(0)]),
    (["null", {"type": "string", "logicalType": "uuid"}], None),
    (["null", {"type": "string", "logicalType": "uuid"}], uuid.UUID(int=2**128 - 1)),
])
def test_a_value_that_is_not_a_record_encodes_back(schema, value):
    value_bytes, row = produced(9, schema, value)
    (read,) = parquet_rows([row], value_table(9, schema))
    assert ValueEncoder(9, json.dumps(schema)).encode(read["value"]) == value_bytes


@pytest.mark.parametrize(("logical", "raw"), [
    # Logical types fastavro does not decode on this Avro type: the columns hold the raw number as
    # the Iceberg type reads it (days, microseconds), and it is written back as the number.
    ({"type": "long", "logicalType": "date"}, -719_162),
    ({"type": "int", "logicalType": "timestamp-millis"}, -(2**31)),
    ({"type": "int", "logicalType": "local-timestamp-micros"}, 2**31 - 1),
    ({"type": "long", "logicalType": "time-millis"}, 86_399_999),
    ({"type": "int", "logicalType": "time-micros"}, 12),
])
def test_a_logical_type_fastavro_does_not_decode_encodes_back_as_its_number(logical, raw):
    schema = {"type": "record", "name": "R", "fields": [{"name": "f", "type": logical}, {"name": "g", "type": ["null", logical]}]}
    value_bytes, row = produced(3, schema, {"f": raw, "g": raw})
    (read,) = parquet_rows([row], value_table(3, schema))
    assert ValueEncoder(3, json.dumps(schema)).encode(read["value"]) == value_bytes


def test_column_values_of_a_schema_without_uuids_times_of_day_or_maps_are_written_as_they_are():
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "I", "fields": [{"name": "n", "type": ["null", "long"]}]}}},
        {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["A"]}},
    ]}
    column_value = {"at": datetime.datetime(2024, 1, 1, tzinfo=UTC), "price": decimal.Decimal("1.50"), "items": [{"n": None}], "kind": "A"}
    value_encoder = ValueEncoder(1, json.dumps(schema))
    assert value_encoder.datum(column_value) is column_value
    with_map = ValueEncoder(2, json.dumps({**schema, "fields": [*schema["fields"], {"name": "m", "type": {"type": "map", "values": "int"}}]}))
    assert with_map.datum({**column_value, "m": [("k", 1)]}) == {**column_value, "m": {"k": 1}}


@pytest.mark.parametrize(("schema", "why"), [
    ({"type": "record", "name": "R", "fields": [{"name": "f", "type": ["null", "int", "string"]}]}, "2 non-null branches"),
    ({"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}, "Node contains itself"),
    ({"type": "record", "name": "R", "fields": [{"name": "f", "type": "null"}]}, "null-only"),
    ({"type": "record", "name": "R", "fields": [{"name": "f", "type": {"type": "record", "name": "E", "fields": []}}]}, "E has no fields"),
    ('syntax = "proto3"; message M { int32 a = 1; }', "does not parse as Avro"),
    ({"type": "record", "name": "R", "fields": [{"name": "f", "type": "Nowhere"}]}, "does not parse as Avro"),
])
def test_a_schema_whose_values_are_never_columns_alone_makes_an_encoder_that_refuses_to_encode(schema, why):
    # Rows of such a schema keep value_raw, but their schema id is in the table all the same.
    value_encoder = ValueEncoder(1, schema if isinstance(schema, str) else json.dumps(schema))
    assert why in value_encoder.unusable
    with pytest.raises(ValueError, match=why):
        value_encoder.encode({"f": None})


def test_encoders_are_made_once_per_schema():
    text = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})
    assert encoder(4, text) is encoder(4, text)
    assert encoder(4, text).unusable is None
    assert encoder(4, text).encode({"a": -1}) == frame(4, b"\x01")


# -- a table widened by a later schema version ---------------------------------------------------------

def order(integer: str, real: str, precision: int, added: bool) -> dict:
    """An Order schema: version 1 (int, float, decimal(9, 2)), or version 2, which promotes each of
    those (long, double, decimal(14, 2)) and adds an optional field to Order and to Line."""
    note = [{"name": "note", "type": ["null", "string"], "default": None}] if added else []
    line = {"type": "record", "name": "Line", "fields": [
        {"name": "qty", "type": integer},
        {"name": "at", "type": {"type": "int", "logicalType": "time-millis"}},
        *note,
    ]}
    return {"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": integer},
        {"name": "ratio", "type": real},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": 2}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "lines", "type": {"type": "array", "items": line}},
        {"name": "attrs", "type": {"type": "map", "values": real}},
        *note,
    ]}


V1 = order("int", "float", 9, added=False)
V2 = order("long", "double", 14, added=True)


def evolved_table():
    v1, v2 = (writer_schema(i, json.dumps(s)).layout.iceberg for i, s in ((1, V1), (2, V2)))
    evolution = evolve(table_schema(v1), v2)
    assert evolution.changed and evolution.incompatible is None
    value = evolution.schema.find_field("value").field_type
    assert [(f.name, str(f.field_type)) for f in value.fields][:3] == [("id", "long"), ("ratio", "double"), ("price", "decimal(14, 2)")]
    return evolution.schema


@settings(deadline=None, max_examples=50, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.one_of(st.tuples(st.just(1), values(V1)), st.tuples(st.just(2), values(V2))), min_size=1, max_size=6))
def test_rows_of_two_versions_in_one_widened_file_encode_back_each_with_its_own_schema(versions_and_values):
    schemas = {1: V1, 2: V2}
    made = [(schema_id, *produced(schema_id, schemas[schema_id], value, assume)) for schema_id, value in versions_and_values]
    read = parquet_rows([row for _, _, row in made], evolved_table())
    encoders = {schema_id: ValueEncoder(schema_id, json.dumps(schema)) for schema_id, schema in schemas.items()}
    assert [encoders[row["value_schema_id"]].encode(row["value"]) for row in read] == [value_bytes for _, value_bytes, _ in made]


def test_extreme_v1_values_in_promoted_columns_encode_back_in_v1_types():
    value = {
        "id": -(2**31), "ratio": 3.4028234663852886e38, "price": decimal.Decimal("-9999999.99"), "ref": uuid.UUID(int=0),
        "lines": [{"qty": 2**31 - 1, "at": datetime.time(23, 59, 59, 999000)}], "attrs": {"tiny": 1.401298464324817e-45, "neg": -0.0},
    }
    value_bytes, row = produced(1, V1, value)
    (read,) = parquet_rows([row], evolved_table())
    assert read["value"]["note"] is None and read["value"]["lines"][0]["note"] is None  # v2's fields, null in a v1 row
    assert ValueEncoder(1, json.dumps(V1)).encode(read["value"]) == value_bytes


def float32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


@pytest.mark.parametrize("bits", [0x7FC00000, 0xFFC00001, 0x7FC12345, 0x7F800000, 0x00000001])
def test_nans_infinities_and_subnormals_come_back_bit_for_bit_also_from_promoted_columns(bits):
    value = {
        "id": 1, "ratio": float32(bits), "price": decimal.Decimal("0.00"), "ref": uuid.UUID(int=3),
        "lines": [], "attrs": {"x": float32(bits), "y": float32(bits ^ 0x80000000)},
    }
    value_bytes, row = produced(1, V1, value)
    (read,) = parquet_rows([row], evolved_table())  # ratio and attrs are doubles in this table
    assert ValueEncoder(1, json.dumps(V1)).encode(read["value"]) == value_bytes
    doubles = {"type": "record", "name": "D", "fields": [{"name": "d", "type": "double"}]}
    nan = struct.unpack("<d", struct.pack("<Q", 0x7FF800000000BEEF | (bits & 0x80000000) << 32))[0]
    value_bytes, row = produced(2, doubles, {"d": nan})
    (read,) = parquet_rows([row], value_table(2, doubles))
    assert ValueEncoder(2, json.dumps(doubles)).encode(read["value"]) == value_bytes


# -- how fast -------------------------------------------------------------------------------------------

TEN_FIELDS = {"type": "record", "name": "Event", "fields": [
    {"name": "id", "type": "long"},
    {"name": "user", "type": "string"},
    {"name": "count", "type": "int"},
    {"name": "score", "type": "double"},
    {"name": "ok", "type": "boolean"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "note", "type": ["null", "string"]},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["VIEW", "CLICK", "BUY"]}},
    {"name": "payload", "type": "bytes"},
]}
# The same with two fields that need rebuilding: a uuid and a map.
TEN_FIELDS_REBUILT = {**TEN_FIELDS, "name": "Event2", "fields": [
    *TEN_FIELDS["fields"][:8],
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "attrs", "type": {"type": "map", "values": "string"}},
]}


def event(i: int, rebuilt: bool) -> dict:
    value = {
        "id": i, "user": f"user-{i % 977}", "count": i % 1000, "score": i / 7, "ok": i % 2 == 0,
        "at": datetime.datetime(2026, 1, 1, tzinfo=UTC) + datetime.timedelta(milliseconds=i), "amount": decimal.Decimal(i).scaleb(-2),
        "note": None if i % 3 else "n", "kind": "CLICK", "payload": b"x" * 32,
    }
    if rebuilt:
        del value["kind"], value["payload"]
        value |= {"ref": uuid.UUID(int=i), "attrs": {"a": "1", "b": str(i)}}
    return value


@pytest.mark.parametrize("rebuilt", [False, True], ids=["as-read", "rebuilt"])
def test_encodes_per_second_of_a_ten_field_record(rebuilt):
    schema = TEN_FIELDS_REBUILT if rebuilt else TEN_FIELDS
    made = [produced(8, schema, event(i, rebuilt)) for i in range(2000)]
    read = [row["value"] for row in parquet_rows([row for _, row in made], value_table(8, schema))]
    value_encoder = ValueEncoder(8, json.dumps(schema))
    start = time.perf_counter()
    encoded = [value_encoder.encode(value) for value in read]
    took = time.perf_counter() - start
    assert encoded == [value_bytes for value_bytes, _ in made]
    print(f"\nValueEncoder, 10-field record ({'uuid and map rebuilt' if rebuilt else 'column values as read'}): {len(read) / took:,.0f} encodes/s")

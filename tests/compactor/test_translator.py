"""compactor/rows/translator.py: any Avro value of any generated schema becomes columns that give the
value back; mutated bytes become raw (or columns+raw) with a reason, never an exception; values
without a schema, unframed, of unknown schema ids, and tombstones are rows too."""

from __future__ import annotations

import datetime
import io
import json
import uuid

import pytest
from fastavro import schemaless_reader, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactor.files.layout import arrow_schema, rows_to_arrow, table_schema
from compactor.rows.records import Batch, Record
from compactor.rows.translator import COLUMNS, COLUMNS_RAW, PRODUCED_VALUE, RAW, TOMBSTONE, kafka_columns, translate, writer_schema
from registry.wire import frame
from tests.compactor.avro_strategies import record_schema, values

BATCH = Batch(0, 0, 100, 40, 0, 2, 0x04, 9, 1_700_000_000_000, 1_700_000_000_900, 7, 1, 12, 10)
KAFKA = kafka_columns(3, BATCH)
SETTINGS = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def encode(parsed, value) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parsed, value)
    return out.getvalue()


def record(value: bytes | None, offset: int = 44) -> Record:
    return Record(offset, 1_700_000_000_123, b"key", value, (("h", b"1"), ("n", None)))


def uuids_as_bytes(value):
    """A decoded value as its columns hold it: UUIDs as their 16 bytes, times of day as
    microseconds since midnight."""
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, datetime.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    if isinstance(value, dict):
        return {k: uuids_as_bytes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [uuids_as_bytes(v) for v in value]
    return value


@st.composite
def schema_and_value(draw):
    schema = draw(record_schema())
    return schema, draw(values(schema))


@SETTINGS
@given(schema_and_value())
def test_any_value_of_any_schema_becomes_columns_alone(case):
    schema, value = case
    ws = writer_schema(17, json.dumps(schema))
    payload = encode(ws.parsed, value)
    row, outcome = translate(record(frame(17, payload)), KAFKA, {17: ws}.get)
    assert outcome == COLUMNS, row["value_error"]
    assert (row["value_raw"], row["value_error"], row["value_schema_id"]) == (None, None, 17)
    assert row["value"] == uuids_as_bytes(schemaless_reader(io.BytesIO(payload), ws.parsed, None))
    # The row fits the table's Arrow schema as it is.
    batch = rows_to_arrow([row], arrow_schema(table_schema(ws.layout.iceberg)))
    assert batch.num_rows == 1


_MUTATIONS = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("append"), st.integers(0, 255), st.integers(1, 4)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
)


def mutate(payload: bytes, how) -> bytes:
    kind, a, b = how
    if kind == "flip" and payload:
        i = a % len(payload)
        return payload[:i] + bytes([payload[i] ^ b]) + payload[i + 1 :]
    if kind == "cut":
        return payload[: a % (len(payload) + 1)]
    if kind == "append":
        return payload + bytes([a]) * b
    i = a % (len(payload) + 1)
    return payload[:i] + bytes([b]) + payload[i:]


@SETTINGS
@given(schema_and_value(), st.lists(_MUTATIONS, min_size=1, max_size=3))
def test_mutated_bytes_are_kept_with_a_reason_never_raised(case, mutations):
    schema, value = case
    ws = writer_schema(5, json.dumps(schema))
    payload = encode(ws.parsed, value)
    for how in mutations:
        payload = mutate(payload, how)
    produced = frame(5, payload)
    row, outcome = translate(record(produced), KAFKA, {5: ws}.get)
    if outcome == COLUMNS:
        # Still a valid encoding of some value, reproduced exactly by re-encoding it.
        assert encode(ws.parsed, schemaless_reader(io.BytesIO(payload), ws.parsed, None)) == payload
        assert row[PRODUCED_VALUE] == produced and row["value_raw"] is None
    else:
        assert outcome in (COLUMNS_RAW, RAW)
        assert row["value_raw"] == produced and row["value_error"]
        assert (row["value"] is None) == (outcome == RAW)


def test_rows_without_columns_say_why():
    ws = writer_schema(1, '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}')
    resolve = {1: ws, 2: writer_schema(2, "{}", schema_type="PROTOBUF")}.get
    cases = {
        b"plain text": (RAW, None, "not framed: magic byte 112, not 0"),
        frame(9, b"\x02"): (RAW, 9, "unknown schema id 9"),
        frame(2, b"\x02"): (RAW, 2, "schema 2 is PROTOBUF, columns are laid out for Avro only"),
        frame(1, b"\x80"): (RAW, 1, "does not decode with schema 1"),
        frame(1, b"\x02\x00"): (COLUMNS_RAW, 1, "1 bytes after the value of schema 1"),
        # 1 as a two-byte varint: decodes, but fastavro writes it in one byte
        frame(1, b"\x82\x00"): (COLUMNS_RAW, 1, "re-encoding with schema 1 differs from the produced bytes"),
    }
    for value, (outcome, schema_id, why) in cases.items():
        row, got = translate(record(value), KAFKA, resolve)
        assert (got, row["value_schema_id"], row["value_raw"]) == (outcome, schema_id, value)
        assert row["value_error"].startswith(why), row["value_error"]
        assert row["value"] == ({"a": 1} if outcome == COLUMNS_RAW else None)


def test_a_topic_without_a_schema_and_tombstones():
    row, outcome = translate(record(b"\x00\x00\x00\x00\x01\x02"), KAFKA, None)
    assert (outcome, row["value_raw"], row["value_error"], row["value_schema_id"], row["value"]) == (RAW, b"\x00\x00\x00\x00\x01\x02", None, None, None)
    row, outcome = translate(record(None), KAFKA, None)
    assert (outcome, row["value_raw"], row["value_error"], row["value"]) == (TOMBSTONE, None, None, None)


def test_the_kafka_columns_of_a_row():
    row, _ = translate(record(None, offset=45), KAFKA, None)
    assert row["kafka"] == {
        "partition": 3, "offset": 45, "timestamp": 1_700_000_000_123_000, "timestamp_type": 0,
        "batch_base_offset": 40, "batch_leader_epoch": 0, "batch_magic": 2, "batch_compression": "zstd",
        "batch_base_timestamp": 1_700_000_000_000_000, "batch_max_timestamp": 1_700_000_000_900_000,
        "producer_id": 7, "producer_epoch": 1, "base_sequence": 12, "is_control": False, "is_transactional": False,
        "batch_attributes": None, "batch_base_timestamp_ms": None, "batch_max_timestamp_ms": None, "record_attributes": None, "timestamp_ms": None,
    }
    assert row["headers"] == [{"key": "h", "value": b"1", "key_bytes": None}, {"key": "n", "value": None, "key_bytes": None}]
    assert row["key_raw"] == b"key"


def test_a_header_key_that_is_not_utf8_is_kept_as_its_bytes():
    row, _ = translate(record(b"v")._replace(headers=((b"\xc3\x28", b"1"), ("k", None))), KAFKA, None)
    assert row["headers"] == [{"key": "\ufffd(", "value": b"1", "key_bytes": b"\xc3\x28"}, {"key": "k", "value": None, "key_bytes": None}]


@pytest.mark.parametrize("ms", [1_700_000_000_000_000_000, 253_402_300_800_000, -62_135_596_800_001, -(2**63), 2**63 - 1])
def test_a_timestamp_outside_the_columns_range_is_clamped_and_kept_exact(ms):
    batch = Batch(0, 0, 100, 40, 0, 2, 0x44, 0, ms, ms, 7, 1, 12, 1)
    row, _ = translate(Record(40, ms, None, b"v", (), 0x81), kafka_columns(3, batch), None)
    clamped = max(-62_135_596_800_000, min(ms, 253_402_300_799_999)) * 1000
    kafka = row["kafka"]
    assert (kafka["timestamp"], kafka["batch_base_timestamp"], kafka["batch_max_timestamp"]) == (clamped, clamped, clamped)
    assert (kafka["timestamp_ms"], kafka["batch_base_timestamp_ms"], kafka["batch_max_timestamp_ms"]) == (ms, ms, ms)
    assert (kafka["record_attributes"], kafka["batch_attributes"]) == (0x81, 0x44)


def test_fields_with_no_iceberg_type_keep_the_bytes_and_the_rest_as_columns():
    schema = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}, {"name": "either", "type": ["int", "string"]}]}
    ws = writer_schema(3, json.dumps(schema))
    payload = frame(3, encode(ws.parsed, {"a": 4, "either": "x"}))
    row, outcome = translate(record(payload), KAFKA, {3: ws}.get)
    assert (outcome, row["value"], row["value_raw"]) == (COLUMNS_RAW, {"a": 4}, payload)
    assert row["value_error"] == "no Iceberg type for value.either: a union of 2 non-null branches (int, string) has no Iceberg type"

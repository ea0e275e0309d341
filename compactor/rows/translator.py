"""Pure: one decoded Kafka record (and its writer schema, if its value has one) → one table row, with
the outcome that says how its value was kept. Nothing is dropped: a value that is not columns alone
keeps its exact bytes in value_raw, and value_error says why.

Outcomes:
    columns      decoded, and re-encoding the decoded value reproduces the produced bytes exactly,
                 so the columns alone give the value back byte for byte
    columns+raw  decoded, but the columns cannot give the bytes back (re-encoding differs, bytes
                 after the value, or fields with no Iceberg type): value_raw keeps them too
    raw          no usable schema: not framed, unknown schema id, a schema the table cannot take,
                 or bytes that do not decode (a topic without a schema: raw, value_error null)
    tombstone    a null value: value, value_raw and value_error null
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastavro import schemaless_reader, schemaless_writer

from registry.wire import NotFramed, unframe
from table.layout import (
    BASE_SEQUENCE,
    BATCH_ATTRIBUTES,
    BATCH_BASE_OFFSET,
    BATCH_BASE_TIMESTAMP,
    BATCH_BASE_TIMESTAMP_MS,
    BATCH_COMPRESSION,
    BATCH_LEADER_EPOCH,
    BATCH_MAGIC,
    BATCH_MAX_TIMESTAMP,
    BATCH_MAX_TIMESTAMP_MS,
    FLAGGED_ATTRIBUTES,
    HEADER_KEY,
    HEADER_KEY_BYTES,
    HEADER_VALUE,
    HEADERS,
    IS_CONTROL,
    IS_TRANSACTIONAL,
    KAFKA,
    KEY_RAW,
    OFFSET,
    PARTITION,
    PRODUCER_EPOCH,
    PRODUCER_ID,
    RECORD_ATTRIBUTES,
    TIMESTAMP,
    TIMESTAMP_MS,
    TIMESTAMP_TYPE,
    VALUE,
    VALUE_ERROR,
    VALUE_RAW,
    VALUE_SCHEMA_ID,
    clamp_ms,
    exact_ms,
)

from .avro_types import ValueLayout, parse, value_layout
from .records import Batch, Record

COLUMNS = "columns"
COLUMNS_RAW = "columns+raw"
RAW = "raw"
TOMBSTONE = "tombstone"
OUTCOMES = (COLUMNS, COLUMNS_RAW, RAW, TOMBSTONE)

# A row kept as columns alone also carries the produced bytes under this key, which no column has
# (Arrow ignores it): the writer falls back to them for a decoded value its column cannot take
# (a decimal wider than its precision, an int beyond 32 bits).
PRODUCED_VALUE = "_produced_value"


@dataclass(frozen=True, slots=True)
class WriterSchema:
    """A registered schema as the translator uses it (one per schema id, made once)."""

    schema_id: int
    parsed: Any  # fastavro's parsed form; None when raw_reason says why there is none
    layout: ValueLayout | None
    # Set when values of this schema must stay raw although they may decode: a schema the table
    # could not be evolved to take (incompatible), or one that is not Avro.
    raw_reason: str | None = None


# Maps a framed value's schema id to its writer schema; None for an id the registry does not know.
# A registry that cannot be reached should raise: that is a reason to retry, not to store raw.
Resolver = Callable[[int], WriterSchema | None]


def writer_schema(schema_id: int, schema: str | dict | list, schema_type: str = "AVRO", raw_reason: str | None = None) -> WriterSchema:
    """Parse a registered schema once. A schema that is not Avro, or not valid Avro, gives a
    WriterSchema whose values stay raw, saying why."""
    if schema_type.upper() != "AVRO":
        return WriterSchema(schema_id, None, None, f"schema {schema_id} is {schema_type}, columns are laid out for Avro only")
    try:
        parsed = parse(schema)
    except Exception as e:  # fastavro's SchemaParseException, json errors, unknown types
        return WriterSchema(schema_id, None, None, f"schema {schema_id} does not parse as Avro: {e}")
    return WriterSchema(schema_id, parsed, value_layout(parsed), raw_reason)


def kafka_columns(partition: int, batch: Batch) -> dict[str, Any]:
    """The kafka struct's batch-level fields (shared by the batch's rows; translate copies it)."""
    return {
        PARTITION: partition,
        OFFSET: None,
        TIMESTAMP: None,
        TIMESTAMP_TYPE: batch.timestamp_type,
        BATCH_BASE_OFFSET: batch.base_offset,
        BATCH_LEADER_EPOCH: batch.partition_leader_epoch,
        BATCH_MAGIC: batch.magic,
        BATCH_COMPRESSION: batch.codec_name,
        BATCH_BASE_TIMESTAMP: clamp_ms(batch.base_timestamp) * 1000,
        BATCH_MAX_TIMESTAMP: clamp_ms(batch.max_timestamp) * 1000,
        PRODUCER_ID: batch.producer_id,
        PRODUCER_EPOCH: batch.producer_epoch,
        BASE_SEQUENCE: batch.base_sequence,
        IS_CONTROL: batch.is_control,
        IS_TRANSACTIONAL: batch.is_transactional,
        BATCH_ATTRIBUTES: batch.attributes if batch.attributes & ~FLAGGED_ATTRIBUTES else None,
        BATCH_BASE_TIMESTAMP_MS: exact_ms(batch.base_timestamp),
        BATCH_MAX_TIMESTAMP_MS: exact_ms(batch.max_timestamp),
    }


def translate(record: Record, kafka: dict[str, Any], resolve: Resolver | None) -> tuple[dict[str, Any], str]:
    """(row, outcome) for one record; `kafka` from kafka_columns for its batch; `resolve` None for
    a topic without a value schema. Raises only what `resolve` raises."""
    offset, timestamp, key, value, headers, attributes, stored_timestamp = record
    row_kafka = kafka.copy()
    row_kafka[OFFSET] = offset
    row_kafka[TIMESTAMP] = clamp_ms(timestamp) * 1000  # Kafka's ms as timestamptz micros
    row_kafka[RECORD_ATTRIBUTES] = attributes or None
    row_kafka[TIMESTAMP_MS] = timestamp_ms(timestamp, stored_timestamp)
    row_headers = header_rows(headers) if headers else []
    if value is None:
        return {KAFKA: row_kafka, HEADERS: row_headers, KEY_RAW: key, VALUE_RAW: None, VALUE_SCHEMA_ID: None, VALUE_ERROR: None, VALUE: None}, TOMBSTONE
    if resolve is None:  # a topic without a schema: what _value answers, without the call
        return {KAFKA: row_kafka, HEADERS: row_headers, KEY_RAW: key, VALUE_RAW: value, VALUE_SCHEMA_ID: None, VALUE_ERROR: None, VALUE: None}, RAW
    outcome, columns, error, schema_id = _value(value, resolve)
    row = {KAFKA: row_kafka, HEADERS: row_headers, KEY_RAW: key, VALUE_RAW: None, VALUE_SCHEMA_ID: schema_id, VALUE_ERROR: error, VALUE: columns}
    if outcome == COLUMNS:
        row[PRODUCED_VALUE] = value
    else:
        row[VALUE_RAW] = value
    return row, outcome


def timestamp_ms(timestamp: int, stored_timestamp: int | None) -> int | None:
    """The kafka.timestamp_ms of a record (records.Record's two timestamps): the timestamp its
    batch holds for it, when the timestamp column (clamped) does not say it."""
    own = timestamp if stored_timestamp is None else stored_timestamp
    return None if own == clamp_ms(timestamp) else own


def header_rows(headers: Sequence[tuple[str | bytes, bytes | None]]) -> list[dict[str, Any]]:
    """A record's headers as the headers column's elements: a key that is not UTF-8 (bytes) kept
    exact in key_bytes, its text then lossy."""
    return [
        {HEADER_KEY: k, HEADER_VALUE: v, HEADER_KEY_BYTES: None} if type(k) is str else {HEADER_KEY: k.decode(errors="replace"), HEADER_VALUE: v, HEADER_KEY_BYTES: k}
        for k, v in headers
    ]


def translate_batch(partition: int, batch: Batch, resolve: Resolver | None) -> Iterator[tuple[dict[str, Any], str]]:
    """(row, outcome) for each of a decoded batch's records."""
    kafka = kafka_columns(partition, batch)
    for record in batch.records:
        yield translate(record, kafka, resolve)


def _value(value: bytes, resolve: Resolver | None) -> tuple[str, Any, str | None, int | None]:
    """(outcome, value column, value_error, schema id) of a non-null value."""
    if resolve is None:
        return RAW, None, None, None
    try:
        schema_id, payload = unframe(value)
    except NotFramed as e:
        return RAW, None, f"not framed: {e}", None
    writer = resolve(schema_id)
    if writer is None:
        return RAW, None, f"unknown schema id {schema_id}", schema_id
    if writer.raw_reason is not None:
        return RAW, None, writer.raw_reason, schema_id
    layout = writer.layout
    assert layout is not None
    if layout.iceberg is None:
        return RAW, None, _unrepresentable(layout), schema_id
    payload = bytes(payload)  # compared with the re-encoding below: bytes compare in one memcmp, memoryviews item by item
    source = io.BytesIO(payload)
    try:
        decoded = schemaless_reader(source, writer.parsed, None)
    except Exception as e:  # anything a producer's bytes make fastavro raise means "does not decode"
        return RAW, None, f"does not decode with schema {schema_id}: {type(e).__name__}: {e}", schema_id
    columns = decoded if layout.fix is None else layout.fix(decoded)
    if source.tell() != len(payload):
        return COLUMNS_RAW, columns, f"{len(payload) - source.tell()} bytes after the value of schema {schema_id}", schema_id
    if layout.unrepresentable:
        return COLUMNS_RAW, columns, _unrepresentable(layout), schema_id
    again = io.BytesIO()
    try:
        schemaless_writer(again, writer.parsed, decoded)
    except Exception as e:  # a decoded value fastavro cannot write back
        return COLUMNS_RAW, columns, f"does not re-encode with schema {schema_id}: {type(e).__name__}: {e}", schema_id
    if again.getvalue() != payload:
        return COLUMNS_RAW, columns, f"re-encoding with schema {schema_id} differs from the produced bytes", schema_id
    return COLUMNS, columns, None, schema_id


def _unrepresentable(layout: ValueLayout) -> str:
    return "no Iceberg type for " + "; ".join(f"{u.path}: {u.reason}" for u in layout.unrepresentable)

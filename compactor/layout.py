"""The table layout of a topic (seed 000): the `kafka` struct, headers, key and value columns as a
pyiceberg Schema with explicit field ids and the matching Arrow schema, and the partition spec a
topic's `neve.iceberg.partition.by` config names (day of the Kafka timestamp by default).

Columns, in order: kafka, headers, key_raw, value_raw, value_schema_id, value_error, then `value`
only when the topic has a registered schema. The raw columns' ids are the ones pyiceberg gives a
new table of them (assign_fresh_schema_ids), and `value` is added to them by union, as evolution
adds it to a table created raw: so every table has the same ids for the raw columns, 1-24, whether
it had a schema from the start or gained one. (catalog.create_table renumbers a schema it is given
breadth first, `value` included: create the raw table and union `value` in the same transaction to
keep these ids.)
"""

from __future__ import annotations

import itertools

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import PARTITION_FIELD_ID_START, UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.transforms import IdentityTransform, parse_transform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from table import names

from .avro_types import evolve

PARTITION_BY_CONFIG = "neve.iceberg.partition.by"
DEFAULT_PARTITION_BY = "day(timestamp)"

# (name, type, required): the fields of the `kafka` struct. Timestamps are Kafka's milliseconds as
# Iceberg timestamptz (microseconds). batch_base_timestamp is not in seed 000 but a batch cannot be
# rebuilt without it (a LogAppendTime batch's records do not carry it).
KAFKA_FIELDS: tuple[tuple[str, IcebergType, bool], ...] = (
    ("partition", IntegerType(), True),
    ("offset", LongType(), True),
    ("timestamp", TimestamptzType(), True),
    ("timestamp_type", IntegerType(), True),  # Kafka's TimestampType: 0 CreateTime, 1 LogAppendTime
    ("batch_base_offset", LongType(), True),
    ("batch_leader_epoch", IntegerType(), True),
    ("batch_magic", IntegerType(), True),
    ("batch_compression", StringType(), True),  # none, gzip, snappy, lz4, zstd
    ("batch_base_timestamp", TimestamptzType(), True),
    ("batch_max_timestamp", TimestamptzType(), True),
    ("producer_id", LongType(), True),
    ("producer_epoch", IntegerType(), True),
    ("base_sequence", IntegerType(), True),
    ("is_control", BooleanType(), True),
    ("is_transactional", BooleanType(), True),
)


def table_schema(value_type: IcebergType | None = None) -> Schema:
    """The schema of a topic's table: the raw columns, and `value` when `value_type` is given (the
    iceberg type of avro_types.value_layout), added by union after them."""
    ids = itertools.count(1)  # placeholders: assign_fresh_schema_ids numbers the columns for real
    kafka = StructType(*(NestedField(next(ids), name, t, required=req) for name, t, req in KAFKA_FIELDS))
    header = StructType(NestedField(next(ids), "key", StringType(), required=True), NestedField(next(ids), "value", BinaryType(), required=False))
    columns = [
        NestedField(next(ids), "kafka", kafka, required=True),
        NestedField(next(ids), "headers", ListType(next(ids), header, element_required=True), required=True),
        NestedField(next(ids), "key_raw", BinaryType(), required=False),
        NestedField(next(ids), "value_raw", BinaryType(), required=False),
        NestedField(next(ids), "value_schema_id", IntegerType(), required=False),
        NestedField(next(ids), "value_error", StringType(), required=False, doc="why the value is (also) kept raw"),
    ]
    raw = assign_fresh_schema_ids(Schema(*columns))
    if value_type is None:
        return raw
    evolved = evolve(raw, value_type).schema
    assert evolved is not None  # a value column added to the raw columns cannot conflict
    return evolved


def arrow_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema of `schema`, each field carrying its PARQUET:field_id."""
    return schema_to_pyarrow(schema, include_field_ids=True)


def rows_to_arrow(rows: list[dict], schema: pa.Schema) -> pa.RecordBatch:
    """Rows (dicts as the translator makes them) as a record batch of `schema`. Arrow cannot build
    an extension type (a uuid) nested in a struct or list from Python values, so such a schema is
    built on its storage types (uuids as 16 bytes) and cast: Parquet still gets UUID columns."""
    storage = _storage_schema(schema)
    if storage is schema:
        return pa.RecordBatch.from_pylist(rows, schema=schema)
    return pa.RecordBatch.from_pylist(rows, schema=storage).cast(schema)


def _storage_schema(schema: pa.Schema) -> pa.Schema:
    fields = [_storage_field(f) for f in schema]
    if all(a is b for a, b in zip(fields, schema, strict=True)):
        return schema
    return pa.schema(fields, metadata=schema.metadata)


def _storage_field(f: pa.Field) -> pa.Field:
    storage = _storage_type(f.type)
    return f if storage is f.type else f.with_type(storage)


def _storage_type(t: pa.DataType) -> pa.DataType:
    if isinstance(t, pa.BaseExtensionType):
        return t.storage_type
    if pa.types.is_struct(t):
        fields = [_storage_field(t.field(i)) for i in range(t.num_fields)]
        return t if all(a is b for a, b in zip(fields, (t.field(i) for i in range(t.num_fields)), strict=True)) else pa.struct(fields)
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        value = _storage_field(t.value_field)
        if value is t.value_field:
            return t
        return pa.large_list(value) if pa.types.is_large_list(t) else pa.list_(value)
    if pa.types.is_map(t):
        key, item = _storage_field(t.key_field), _storage_field(t.item_field)
        return t if key is t.key_field and item is t.item_field else pa.map_(key, item)
    return t


def partition_spec(schema: Schema, partition_by: str | None = DEFAULT_PARTITION_BY) -> PartitionSpec:
    """The spec a `neve.iceberg.partition.by` value names: comma-separated terms
    `transform(column)` (year, month, day, hour, identity, bucket[N], truncate[W]) or `none`, parsed
    as the broker parses it before accepting it (table/names.py). A bare column name is one of the
    kafka struct's (`timestamp`, `partition`); dotted names reach any column (`value.country`).
    Raises ValueError saying what is wrong."""
    fields = []
    for i, term in enumerate(names.parse_partition_by(partition_by)):
        transform = parse_transform(term.transform)
        source = _find(schema, term.column)
        if not transform.can_transform(source.field_type):
            raise ValueError(f"{PARTITION_BY_CONFIG}: {term.transform} does not apply to {term.column} ({source.field_type})")
        leaf = term.column.rsplit(".", 1)[-1]
        name = leaf if isinstance(transform, IdentityTransform) else f"{leaf}_{term.transform.split('[')[0]}"
        fields.append(PartitionField(source_id=source.field_id, field_id=PARTITION_FIELD_ID_START + i, transform=transform, name=name))
    return PartitionSpec(*fields) if fields else UNPARTITIONED_PARTITION_SPEC


def _find(schema: Schema, column: str) -> NestedField:
    for candidate in (column, f"kafka.{column}") if "." not in column else (column,):
        try:
            return schema.find_field(candidate)
        except ValueError:
            continue
    raise ValueError(f"{PARTITION_BY_CONFIG}: no column {column!r} (a kafka field such as timestamp or partition, or a dotted path)")

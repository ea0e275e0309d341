"""The table layout of a topic (seed 000) as Iceberg has it: the columns table/layout.py names, with
their Iceberg types and field ids, the matching Arrow schema, and the partition spec a topic's
`neve.iceberg.partition.by` config names (day of the Kafka timestamp by default).

Columns, in order: kafka, headers, key_raw, value_raw, value_schema_id, value_error, then `value`
only when the topic has a registered schema. The raw columns' ids are the ones pyiceberg gives a
new table of them (assign_fresh_schema_ids), and `value` is added to them by union, as evolution
adds it to a table created raw: so a table has the same ids for its raw columns whether it had a
schema from the start or gained one. (catalog.create_table renumbers a schema it is given
breadth first, `value` included: create the raw table and union `value` in the same transaction to
keep these ids.) A table made before the kafka struct's optional fields and the header's key_bytes
gains them by union (upgrade_raw_columns), its other ids unchanged; one made since has them from
the start, numbered by the catalog: the two read the same by name.
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

from table import layout as table_layout
from table import names

from ..rows.avro_types import evolve

PARTITION_BY_CONFIG = "neve.iceberg.partition.by"
DEFAULT_PARTITION_BY = "day(timestamp)"

# The Iceberg type of each field of the `kafka` struct (table/layout.py names them and orders them),
# and whether it is required. Timestamps are Kafka's milliseconds as Iceberg timestamptz
# (microseconds). batch_base_timestamp is not in seed 000 but a batch cannot be rebuilt without it
# (a LogAppendTime batch's records do not carry it).
_KAFKA_TYPES: dict[str, tuple[IcebergType, bool]] = {
    table_layout.PARTITION: (IntegerType(), True),
    table_layout.OFFSET: (LongType(), True),
    table_layout.TIMESTAMP: (TimestamptzType(), True),
    table_layout.TIMESTAMP_TYPE: (IntegerType(), True),
    table_layout.BATCH_BASE_OFFSET: (LongType(), True),
    table_layout.BATCH_LEADER_EPOCH: (IntegerType(), True),
    table_layout.BATCH_MAGIC: (IntegerType(), True),
    table_layout.BATCH_COMPRESSION: (StringType(), True),
    table_layout.BATCH_BASE_TIMESTAMP: (TimestamptzType(), True),
    table_layout.BATCH_MAX_TIMESTAMP: (TimestamptzType(), True),
    table_layout.PRODUCER_ID: (LongType(), True),
    table_layout.PRODUCER_EPOCH: (IntegerType(), True),
    table_layout.BASE_SEQUENCE: (IntegerType(), True),
    table_layout.IS_CONTROL: (BooleanType(), True),
    table_layout.IS_TRANSACTIONAL: (BooleanType(), True),
    table_layout.RECORD_ATTRIBUTES: (IntegerType(), False),
    table_layout.BATCH_ATTRIBUTES: (IntegerType(), False),
    table_layout.TIMESTAMP_MS: (LongType(), False),
    table_layout.BATCH_BASE_TIMESTAMP_MS: (LongType(), False),
    table_layout.BATCH_MAX_TIMESTAMP_MS: (LongType(), False),
    table_layout.STORED_BATCH: (BooleanType(), False),
}
# (name, type, required), in the struct's order
KAFKA_FIELDS: tuple[tuple[str, IcebergType, bool], ...] = tuple((name, *_KAFKA_TYPES[name]) for name in table_layout.KAFKA_FIELDS)
_HEADER_TYPES: dict[str, tuple[IcebergType, bool]] = {
    table_layout.HEADER_KEY: (StringType(), True),
    table_layout.HEADER_VALUE: (BinaryType(), False),
    table_layout.HEADER_KEY_BYTES: (BinaryType(), False),
}


def table_schema(value_type: IcebergType | None = None) -> Schema:
    """The schema of a topic's table: the raw columns, and `value` when `value_type` is given (the
    iceberg type of avro_types.value_layout), added by union after them."""
    raw = assign_fresh_schema_ids(_raw_columns(table_layout.KAFKA_FIELDS, table_layout.HEADER_FIELDS))
    if value_type is None:
        return raw
    evolved = evolve(raw, value_type).schema
    assert evolved is not None  # a value column added to the raw columns cannot conflict
    return evolved


def _raw_columns(kafka_fields: tuple[str, ...], header_fields: tuple[str, ...]) -> Schema:
    """The raw columns with the kafka and header fields named, ids placeholders."""
    ids = itertools.count(1)  # placeholders: assign_fresh_schema_ids (or the union) numbers them for real
    kafka = StructType(*(NestedField(next(ids), name, t, required=req) for name, t, req in ((n, *_KAFKA_TYPES[n]) for n in kafka_fields)))
    header = StructType(*(NestedField(next(ids), name, t, required=req) for name, t, req in ((n, *_HEADER_TYPES[n]) for n in header_fields)))
    columns = [
        NestedField(next(ids), table_layout.KAFKA, kafka, required=True),
        NestedField(next(ids), table_layout.HEADERS, ListType(next(ids), header, element_required=True), required=True),
        NestedField(next(ids), table_layout.KEY_RAW, BinaryType(), required=False),
        NestedField(next(ids), table_layout.VALUE_RAW, BinaryType(), required=False),
        NestedField(next(ids), table_layout.VALUE_SCHEMA_ID, IntegerType(), required=False),
        NestedField(next(ids), table_layout.VALUE_ERROR, StringType(), required=False, doc="why the value is (also) kept raw"),
    ]
    return Schema(*columns)


def first_raw_schema() -> Schema:
    """The raw columns of a table made before the kafka struct's optional fields and the header's
    key_bytes (what upgrade_raw_columns brings up to date; kept for its tests)."""
    return assign_fresh_schema_ids(_raw_columns(table_layout.KAFKA_FIELDS_FIRST, (table_layout.HEADER_KEY, table_layout.HEADER_VALUE)))


def upgrade_raw_columns(table):
    """`table` (a pyiceberg Table) with every raw column and field of table_schema(), those it
    lacks added by union (optional, new ids: the others keep theirs); the same table when it has
    them all. Rows written before read the added fields as null."""
    current = table.schema()
    wanted = table_schema()
    if all(_has(current, wanted.find_column_name(i)) for i in wanted._lazy_id_to_field):
        return table
    with table.update_schema() as update:
        update.union_by_name(Schema(*(f for f in wanted.fields)))
    return table.refresh()


def _has(schema: Schema, column: str | None) -> bool:
    try:
        schema.find_field(column)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


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
    for candidate in (column, f"{table_layout.KAFKA}.{column}") if "." not in column else (column,):
        try:
            return schema.find_field(candidate)
        except ValueError:
            continue
    raise ValueError(f"{PARTITION_BY_CONFIG}: no column {column!r} (a kafka field such as timestamp or partition, or a dotted path)")

"""compactor/files/layout.py: the table's field ids (the same raw-column ids with or without a value
column, and what a new table keeps), the Arrow schema's PARQUET:field_id, and partition specs."""

from __future__ import annotations

import uuid

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import assign_fresh_schema_ids
from pyiceberg.transforms import BucketTransform, DayTransform, HourTransform, IdentityTransform

from compactor.files.layout import arrow_schema, first_raw_schema, partition_spec, table_schema
from compactor.files.writer import TableWriter
from compactor.rows.avro_types import parse, value_layout
from compactor.rows.records import Batch, Record
from compactor.rows.translator import kafka_columns, translate
from compactor.service.tables import load_or_create

# The ids of a table made before the kafka struct's optional fields and the header's key_bytes
FIRST_IDS = {
    "kafka": 1, "headers": 2, "key_raw": 3, "value_raw": 4, "value_schema_id": 5, "value_error": 6,
    "kafka.partition": 7, "kafka.offset": 8, "kafka.timestamp": 9, "kafka.timestamp_type": 10, "kafka.batch_base_offset": 11,
    "kafka.batch_leader_epoch": 12, "kafka.batch_magic": 13, "kafka.batch_compression": 14, "kafka.batch_base_timestamp": 15,
    "kafka.batch_max_timestamp": 16, "kafka.producer_id": 17, "kafka.producer_epoch": 18, "kafka.base_sequence": 19,
    "kafka.is_control": 20, "kafka.is_transactional": 21, "headers.element": 22, "headers.element.key": 23, "headers.element.value": 24,
}
NEW_KAFKA = ("record_attributes", "batch_attributes", "timestamp_ms", "batch_base_timestamp_ms", "batch_max_timestamp_ms", "stored_batch")
# and of a table made since: the kafka struct's fields first (breadth first, as a catalog numbers them)
RAW_IDS = {
    **{k: v for k, v in FIRST_IDS.items() if not k.startswith("headers.")},
    **{f"kafka.{name}": 22 + i for i, name in enumerate(NEW_KAFKA)},
    "headers.element": 28, "headers.element.key": 29, "headers.element.value": 30, "headers.element.key_bytes": 31,
}
VALUE = parse('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}, {"name": "b", "type": {"type": "array", "items": "string"}}]}')


def ids(schema) -> dict[str, int]:
    return {schema.find_column_name(i): i for i in schema._lazy_id_to_field}


def test_a_topic_without_a_schema_gets_the_raw_columns_only():
    schema = table_schema()
    assert ids(schema) == RAW_IDS
    assert [f.name for f in schema.fields] == ["kafka", "headers", "key_raw", "value_raw", "value_schema_id", "value_error"]
    assert assign_fresh_schema_ids(schema) == schema  # a table created from it keeps these ids


def test_the_value_column_comes_after_with_the_raw_ids_unchanged():
    schema = table_schema(value_layout(VALUE).iceberg)
    assert ids(schema) == {**RAW_IDS, "value": 32, "value.a": 33, "value.b": 34, "value.b.element": 35}
    assert str(schema.find_type("kafka.timestamp")) == "timestamptz"


def test_the_arrow_schema_carries_every_field_id():
    schema = table_schema(value_layout(VALUE).iceberg)
    found = {}

    def walk(field, path):
        found[path] = int(field.metadata[b"PARQUET:field_id"])
        t = field.type
        children = [t.field(i) for i in range(t.num_fields)] if hasattr(t, "num_fields") and t.num_fields and not hasattr(t, "value_field") else []
        if hasattr(t, "value_field"):
            children = [t.value_field]
        for child in children:
            walk(child, f"{path}.{'element' if child.name in ('element', 'item') else child.name}")

    for field in arrow_schema(schema):
        walk(field, field.name)
    assert found == ids(schema)
    assert str(arrow_schema(schema).field("kafka").type.field("timestamp").type) == "timestamp[us, tz=UTC]"


def test_partition_specs_from_the_topic_config():
    schema = table_schema(value_layout(VALUE).iceberg)
    default = partition_spec(schema)
    assert [(f.name, f.source_id, f.transform) for f in default.fields] == [("timestamp_day", 9, DayTransform())]
    assert partition_spec(schema, None) == default
    spec = partition_spec(schema, "hour(timestamp), identity(partition), bucket[8](key_raw), identity(value.a)")
    assert [(f.name, f.source_id, f.transform, f.field_id) for f in spec.fields] == [
        ("timestamp_hour", 9, HourTransform(), 1000), ("partition", 7, IdentityTransform(), 1001),
        ("key_raw_bucket", 3, BucketTransform(8), 1002), ("a", 33, IdentityTransform(), 1003),
    ]
    assert partition_spec(schema, "none").fields == () and partition_spec(schema, " NONE ").is_unpartitioned()


@pytest.mark.parametrize(
    "text, error",
    [
        ("day(partition)", "day does not apply to partition (int)"),
        ("week(timestamp)", "unknown transform 'week'"),
        ("day(nope)", "no column 'nope'"),
        ("day timestamp", "'day timestamp' is not transform(column)"),
    ],
)
def test_bad_partition_configs_say_what_is_wrong(text, error):
    with pytest.raises(ValueError, match="neve.iceberg.partition.by") as caught:
        partition_spec(table_schema(), text)
    assert error in str(caught.value)


def test_the_first_raw_schema_is_the_one_tables_were_made_with():
    assert ids(first_raw_schema()) == FIRST_IDS


def test_a_table_made_before_the_optional_fields_gains_them_and_reads_as_a_new_one(tmp_path):
    """An old table is upgraded by union (its ids kept, the new fields optional, once); rows written
    to it and to a table made new read back the same, the old rows with the new fields null."""
    catalog = SqlCatalog("neve", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("neve")
    first = first_raw_schema()
    old = catalog.create_table("neve.old", first, partition_spec=partition_spec(first))
    batch = Batch(0, 0, 100, 0, 0, 2, 0x40, 1, 1_700_000_000_000, 1_700_000_000_000_000_000, 7, 1, 0, 2)
    kafka = kafka_columns(0, batch)
    before = [translate(Record(0, 1_700_000_000_000, b"k", b"v", (("h", b"1"),)), kafka, None)[0]]
    _append(old, before)
    topic_id = str(uuid.uuid4())  # the old table has no binding and no cycle: adopted, then upgraded
    upgraded = load_or_create(catalog, "neve.old", None, topic_id)
    assert {k: v for k, v in ids(upgraded.schema()).items() if k in FIRST_IDS} == FIRST_IDS
    assert set(ids(upgraded.schema())) == set(RAW_IDS)
    assert load_or_create(catalog, "neve.old", None, topic_id).schema().schema_id == upgraded.schema().schema_id  # once
    new = load_or_create(catalog, "neve.new", None, str(uuid.uuid4()))
    assert ids(new.schema()) == RAW_IDS
    assert schema_to_pyarrow(new.schema(), include_field_ids=False) == schema_to_pyarrow(upgraded.schema(), include_field_ids=False)
    after = [translate(Record(1, 1_700_000_000_000_000_000, None, b"w", ((b"\xff", None),), 0x81, None), kafka, None)[0]]
    _append(new, before)
    for table in (new, upgraded):
        _append(table, after)
    rows = [sorted(t.scan().to_arrow().to_pylist(), key=lambda r: r["kafka"]["offset"]) for t in (upgraded.refresh(), new.refresh())]
    assert rows[0][1] == rows[1][1]
    got = rows[0]
    # the row written before the upgrade: the new fields null, the others as the new table has them
    assert {k: v for k, v in got[0]["kafka"].items() if k in NEW_KAFKA or k == "batch_attributes"} == dict.fromkeys(NEW_KAFKA, None)
    assert {k: v for k, v in got[0]["kafka"].items() if k not in NEW_KAFKA} == {k: v for k, v in rows[1][0]["kafka"].items() if k not in NEW_KAFKA}
    assert got[0]["headers"] == [{"key": "h", "value": b"1", "key_bytes": None}]
    assert got[1]["kafka"]["record_attributes"] == 0x81
    assert (got[1]["kafka"]["timestamp_ms"], got[1]["kafka"]["batch_max_timestamp_ms"], got[1]["headers"][0]["key_bytes"]) == (1_700_000_000_000_000_000, 1_700_000_000_000_000_000, b"\xff")
    assert got[1]["kafka"]["batch_attributes"] == 0x40


def _append(table, rows) -> None:
    writer = TableWriter(table.schema(), table.spec(), table.location() + "/data", table.io)
    for row in rows:
        writer.add(row, "raw")
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        for written in writer.close():
            append.append_data_file(written.data_file(table.spec()))

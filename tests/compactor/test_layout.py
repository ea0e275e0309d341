"""compactor/layout.py: the table's field ids (the same raw-column ids with or without a value
column, and what a new table keeps), the Arrow schema's PARQUET:field_id, and partition specs."""

from __future__ import annotations

import pytest
from pyiceberg.schema import assign_fresh_schema_ids
from pyiceberg.transforms import BucketTransform, DayTransform, HourTransform, IdentityTransform

from compactor.avro_types import parse, value_layout
from compactor.layout import arrow_schema, partition_spec, table_schema

RAW_IDS = {
    "kafka": 1, "headers": 2, "key_raw": 3, "value_raw": 4, "value_schema_id": 5, "value_error": 6,
    "kafka.partition": 7, "kafka.offset": 8, "kafka.timestamp": 9, "kafka.timestamp_type": 10, "kafka.batch_base_offset": 11,
    "kafka.batch_leader_epoch": 12, "kafka.batch_magic": 13, "kafka.batch_compression": 14, "kafka.batch_base_timestamp": 15,
    "kafka.batch_max_timestamp": 16, "kafka.producer_id": 17, "kafka.producer_epoch": 18, "kafka.base_sequence": 19,
    "kafka.is_control": 20, "kafka.is_transactional": 21, "headers.element": 22, "headers.element.key": 23, "headers.element.value": 24,
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
    assert ids(schema) == {**RAW_IDS, "value": 25, "value.a": 26, "value.b": 27, "value.b.element": 28}
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
        ("key_raw_bucket", 3, BucketTransform(8), 1002), ("a", 26, IdentityTransform(), 1003),
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

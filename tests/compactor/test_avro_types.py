"""compactor/rows/avro_types.py: every Avro type's Iceberg type, what Iceberg cannot hold reported (not
raised), and a table's evolution by union with a new writer schema: new fields optional, the
promotions Iceberg allows, anything else reported incompatible."""

from __future__ import annotations

import pytest
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)

from compactor.files.layout import table_schema
from compactor.rows.avro_types import Unrepresentable, evolve, parse, value_layout


def record(*fields) -> dict:
    return {"type": "record", "name": "R", "namespace": "ns", "fields": [{"name": n, "type": t} for n, t in fields]}


@pytest.mark.parametrize(
    "avro, iceberg",
    [
        ("boolean", BooleanType()), ("int", IntegerType()), ("long", LongType()), ("float", FloatType()), ("double", DoubleType()),
        ("bytes", BinaryType()), ("string", StringType()),
        ({"type": "enum", "name": "E", "symbols": ["A"]}, StringType()),
        ({"type": "fixed", "name": "F", "size": 5}, FixedType(5)),
        ({"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}, DecimalType(12, 3)),
        ({"type": "fixed", "name": "D", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 0}, DecimalType(18, 0)),
        ({"type": "int", "logicalType": "date"}, DateType()),
        # microseconds since midnight: Spark reads no table with an Iceberg time column
        ({"type": "int", "logicalType": "time-millis"}, LongType()),
        ({"type": "long", "logicalType": "time-micros"}, LongType()),
        ({"type": "long", "logicalType": "timestamp-millis"}, TimestamptzType()),
        ({"type": "long", "logicalType": "timestamp-micros"}, TimestamptzType()),
        ({"type": "long", "logicalType": "local-timestamp-millis"}, TimestampType()),
        ({"type": "long", "logicalType": "local-timestamp-micros"}, TimestampType()),
        ({"type": "string", "logicalType": "uuid"}, UUIDType()),
        ({"type": "string", "logicalType": "no-such-type"}, StringType()),  # unknown logical types are ignored, as Avro says
        (["null", "long"], LongType()),
    ],
)
def test_each_avro_type(avro, iceberg):
    layout = value_layout(parse(record(("f", avro))))
    assert layout.iceberg.fields[0].field_type == iceberg and layout.unrepresentable == ()


def test_nested_types_and_nullability():
    avro = record(
        ("tags", {"type": "array", "items": ["null", "string"]}),
        ("m", {"type": "map", "values": "long"}),
        ("inner", ["null", {"type": "record", "name": "In", "fields": [{"name": "x", "type": "int"}]}]),
        ("again", "ns.In"),
    )
    layout = value_layout(parse(avro))
    by_name = {f.name: f for f in layout.iceberg.fields}
    assert all(not f.required for f in by_name.values())  # a later version may drop any field
    tags, m = by_name["tags"].field_type, by_name["m"].field_type
    assert isinstance(tags, ListType) and tags.element_type == StringType() and not tags.element_required
    assert isinstance(m, MapType) and (m.key_type, m.value_type, m.value_required) == (StringType(), LongType(), True)
    # A named type used twice is laid out twice, each with ids of its own.
    inner, again = by_name["inner"].field_type, by_name["again"].field_type
    assert isinstance(inner, StructType) and [(f.name, f.field_type) for f in inner.fields] == [(f.name, f.field_type) for f in again.fields] == [("x", IntegerType())]
    assert str(layout.arrow) == "struct<tags: large_list<element: large_string>, m: map<large_string, int64>, inner: struct<x: int32>, again: struct<x: int32>>"


def test_primitive_value_schemas():
    assert value_layout(parse('"string"')).iceberg == StringType()
    assert value_layout(parse("string")).iceberg == StringType()


def test_what_iceberg_cannot_hold_is_reported_not_raised():
    avro = record(
        ("ok", "int"),
        ("either", ["int", "string", "null"]),
        ("nothing", "null"),
        ("wide", {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}),
        ("node", {"type": "record", "name": "Node", "fields": [{"name": "v", "type": "int"}, {"name": "next", "type": ["null", "ns.Node"]}]}),
        ("list_of_either", {"type": "array", "items": ["int", "string"]}),
    )
    layout = value_layout(parse(avro))
    assert [f.name for f in layout.iceberg.fields] == ["ok", "node"]
    assert layout.unrepresentable == (
        Unrepresentable("value.either", "a union of 2 non-null branches (int, string) has no Iceberg type"),
        Unrepresentable("value.nothing", "a null-only type holds no value"),
        Unrepresentable("value.wide", "decimal precision 40 is outside Iceberg's 1-38"),
        Unrepresentable("value.node.next", "record ns.Node contains itself; Iceberg types are finite"),
        Unrepresentable("value.list_of_either.element", "a union of 2 non-null branches (int, string) has no Iceberg type"),
    )
    assert layout.fix({"ok": 1, "either": "x", "nothing": None, "wide": 1, "node": {"v": 2, "next": None}, "list_of_either": [1]}) == {"ok": 1, "node": {"v": 2}}
    assert value_layout(parse(["int", "string"])).iceberg is None


def test_field_ids_are_deterministic():
    avro = record(("a", {"type": "array", "items": {"type": "record", "name": "X", "fields": [{"name": "b", "type": "int"}]}}), ("c", "long"))
    assert value_layout(parse(avro)).iceberg == value_layout(parse(avro)).iceberg
    assert table_schema(value_layout(parse(avro)).iceberg) == table_schema(value_layout(parse(avro)).iceberg)


def _table(*fields):
    return table_schema(value_layout(parse(record(*fields))).iceberg)


def _value_type(*fields):
    return value_layout(parse(record(*fields))).iceberg


def test_evolution_adds_optional_fields_and_promotes():
    table = _table(("a", "int"), ("f", "float"), ("d", {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}))
    evolution = evolve(table, _value_type(("a", "long"), ("f", "double"), ("d", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}), ("new", "string")))
    assert evolution.changed and evolution.incompatible is None
    value = evolution.schema.find_field("value").field_type
    first = table.find_field("value.a").field_id  # the value fields' ids follow the raw columns'
    assert [(f.field_id, f.name, f.field_type, f.required) for f in value.fields] == [
        (first, "a", LongType(), False), (first + 1, "f", DoubleType(), False), (first + 2, "d", DecimalType(12, 2), False), (first + 3, "new", StringType(), False),
    ]
    # Old columns keep their ids; the raw columns are untouched.
    assert evolution.schema.find_field("kafka.offset") == table.find_field("kafka.offset")


def test_evolution_by_an_older_or_the_same_schema_changes_nothing():
    table = _table(("a", "long"), ("b", "double"))
    for fields in ([("a", "long"), ("b", "double")], [("a", "int")], [("b", "float")]):
        evolution = evolve(table, _value_type(*fields))
        assert (evolution.changed, evolution.incompatible) == (False, None)


def test_a_table_without_a_value_column_gains_one():
    evolution = evolve(table_schema(), _value_type(("a", "int")))
    assert evolution.changed and evolution.schema == _table(("a", "int"))


@pytest.mark.parametrize(
    "new, why",
    [
        (("a", "string"), "value.a: int cannot become string"),
        (("a", "double"), "value.a: int cannot become double"),
        (("d", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}), "value.d: decimal(9, 2) cannot become decimal(12, 3)"),
        (("s", "int"), "value.s: struct<"),
        (("l", {"type": "array", "items": "string"}), "value.l.element: long cannot become string"),
    ],
)
def test_incompatible_changes_are_reported_not_raised(new, why):
    table = _table(
        ("a", "int"),
        ("d", {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}),
        ("s", {"type": "record", "name": "S", "fields": [{"name": "x", "type": "int"}]}),
        ("l", {"type": "array", "items": "long"}),
    )
    evolution = evolve(table, _value_type(new))
    assert evolution.schema is None and not evolution.changed
    assert evolution.incompatible.startswith(why), evolution.incompatible


def test_evolving_by_a_whole_schema_of_another_kind_is_incompatible():
    table = table_schema(StringType())
    evolution = evolve(table, StructType(NestedField(1, "a", IntegerType(), required=False)))
    assert evolution.incompatible == "value: string cannot become struct<1: a: optional int>"

"""Avro compatibility (registry/compatibility.py), pure: the resolution rules one by one, the
levels, and a property against fastavro's own schema resolution: whatever the check calls
readable, fastavro reads back."""

from __future__ import annotations

import io
import json

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.compatibility import can_read, check
from registry.formats import parse
from registry.model import Compatibility, Schema, SchemaType


def avro(schema) -> object:
    return parse(Schema(SchemaType.AVRO, json.dumps(schema)))


def record(*fields, name="R", **extra) -> dict:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def field(name, type_, **extra) -> dict:
    return {"name": name, "type": type_, **extra}


def kinds(reader, writer) -> list[str]:
    return [i.kind for i in can_read(avro(reader), avro(writer))]


@pytest.mark.parametrize(
    ("writer", "reader"),
    [("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"), ("long", "double"), ("float", "double"), ("string", "bytes"), ("bytes", "string")],
)
def test_promotions_read_one_way_only(writer, reader):
    assert kinds(reader, writer) == []
    if {writer, reader} != {"string", "bytes"}:
        assert kinds(writer, reader) == ["TYPE_MISMATCH"]


def test_added_field_needs_a_default_to_read_old_data():
    old = record(field("a", "int"))
    assert kinds(record(field("a", "int"), field("b", "string", default="")), old) == []
    assert kinds(record(field("a", "int"), field("b", "string")), old) == ["READER_FIELD_MISSING_DEFAULT_VALUE"]
    # a removed field: the old schema reading new data misses it unless it has a default
    assert kinds(old, record()) == ["READER_FIELD_MISSING_DEFAULT_VALUE"]
    assert kinds(record(), old) == []


def test_field_found_by_alias():
    assert kinds(record(field("new", "int", aliases=["old"])), record(field("old", "int"))) == []


def test_enum_symbols():
    def e(*symbols, **extra):
        return {"type": "enum", "name": "E", "symbols": list(symbols), **extra}

    assert kinds(e("A", "B", "C"), e("A", "B")) == []
    assert kinds(e("A"), e("A", "B")) == ["MISSING_ENUM_SYMBOLS"]
    assert kinds(e("A", default="A"), e("A", "B")) == []


def test_unions():
    assert kinds(["null", "int"], "int") == []
    assert kinds(["null", "long"], "int") == [], "a promotion into a union branch"
    assert kinds(["null", "string"], "int") == ["MISSING_UNION_BRANCH"]
    assert kinds("long", ["int", "long"]) == []
    assert kinds("int", ["null", "int"]) == ["TYPE_MISMATCH"], "the writer's null branch cannot be read"
    assert kinds(["null", "int", "string"], ["null", "int"]) == []


def test_named_types_fixed_arrays_maps():
    assert kinds(record(name="A"), record(name="B")) == ["NAME_MISMATCH"]
    assert kinds(record(name="B", aliases=["A"]), record(name="A")) == []
    assert kinds({"type": "fixed", "name": "F", "size": 4}, {"type": "fixed", "name": "F", "size": 8}) == ["FIXED_SIZE_MISMATCH"]
    assert kinds({"type": "array", "items": "long"}, {"type": "array", "items": "int"}) == []
    assert kinds({"type": "map", "values": "int"}, {"type": "map", "values": "long"}) == ["TYPE_MISMATCH"]
    # a logical type resolves as its underlying type
    assert kinds({"type": "long", "logicalType": "timestamp-millis"}, {"type": "int", "logicalType": "date"}) == []


def test_recursive_and_referenced_named_types():
    node = record(field("value", "int"), field("next", ["null", "Node"], default=None), name="Node")
    node2 = record(field("value", "long"), field("next", ["null", "Node"], default=None), field("tag", "string", default=""), name="Node")
    assert kinds(node2, node) == []
    assert kinds(node, node2) == ["TYPE_MISMATCH"]


OLD = avro(record(field("a", "int")))
ADDED_DEFAULT = avro(record(field("a", "int"), field("b", "string", default="")))
ADDED_NO_DEFAULT = avro(record(field("a", "int"), field("b", "string")))
DROPPED_A = avro(record(field("b", "string", default="")))


@pytest.mark.parametrize(
    ("level", "new", "ok"),
    [
        (Compatibility.BACKWARD, ADDED_DEFAULT, True),
        (Compatibility.BACKWARD, ADDED_NO_DEFAULT, False),
        (Compatibility.FORWARD, ADDED_NO_DEFAULT, True),
        (Compatibility.FORWARD, DROPPED_A, False),
        (Compatibility.FULL, ADDED_DEFAULT, True),
        (Compatibility.FULL, ADDED_NO_DEFAULT, False),
        (Compatibility.NONE, avro("string"), True),
    ],
)
def test_levels_against_one_previous(level, new, ok):
    assert (check(level, new, [OLD]) == []) is ok


def test_transitive_levels_look_at_every_previous_version():
    # v1 {a}; v2 {a, b=""}; v3 {b=""} drops a: backward from v2 it is fine (a is ignored), and
    # from v1 too; forward-transitive fails against v1 and v2 (they need a, which has no default)
    v1, v2, v3 = OLD, ADDED_DEFAULT, DROPPED_A
    assert check(Compatibility.BACKWARD_TRANSITIVE, v3, [v1, v2]) == []
    assert check(Compatibility.FORWARD, v3, [v1, v2]) != []
    # int -> long -> int: each step alone is fine backward from its neighbour only one way
    i, lng = avro(record(field("x", "int"))), avro(record(field("x", "long")))
    assert check(Compatibility.BACKWARD, lng, [i]) == []
    assert check(Compatibility.FORWARD, i, [lng]) == []
    b = avro(record(field("x", "long"), field("y", "int", default=0)))
    assert check(Compatibility.FORWARD, b, [lng]) == []
    assert check(Compatibility.FORWARD_TRANSITIVE, b, [i, lng]) != [], "an int reader cannot read the long"
    messages = check(Compatibility.FORWARD_TRANSITIVE, b, [i, lng])
    assert any("TYPE_MISMATCH" in m for m in messages) and "{compatibility: 'FORWARD_TRANSITIVE'}" in messages


def test_schema_types_must_match():
    j = parse(Schema(SchemaType.JSON, '{"type": "object"}'))
    assert [i.kind for i in can_read(j, OLD)] == ["TYPE_MISMATCH"]
    assert can_read(j, parse(Schema(SchemaType.JSON, '{"type": "string"}'))) == [], "JSON Schema is not checked yet"


# -- against fastavro's own resolution ------------------------------------------------------------

# each primitive: (a default, values of it; small ones will do, resolution does not look at them)
PRIMITIVES = {
    "int": (0, st.integers(-1000, 1000)),
    "long": (0, st.integers(-(2**40), 2**40)),
    "float": (0.0, st.integers(-1000, 1000).map(float)),
    "double": (0.0, st.floats(-1e9, 1e9)),
    "string": ("", st.text(max_size=4)),
    # UTF-8 bytes: Avro lets a string reader read bytes (and the check says so), but what it reads
    # must then be text; bytes that are not fail the datum, not the schemas
    "bytes": ("", st.text(max_size=4).map(str.encode)),
    "boolean": (False, st.booleans()),
}
PRIMS = list(PRIMITIVES)


@st.composite
def field_types(draw):
    base = draw(st.sampled_from(PRIMS))
    return draw(st.sampled_from([base, ["null", base]]))


@st.composite
def records(draw):
    names = draw(st.lists(st.sampled_from("abcde"), unique=True, max_size=5))
    fields = []
    for n in names:
        t = draw(field_types())
        f = field(n, t)
        if draw(st.booleans()):
            f["default"] = None if isinstance(t, list) else PRIMITIVES[t][0]
        fields.append(f)
    return record(*fields)


@st.composite
def datum_for(draw, schema):
    out = {}
    for f in schema["fields"]:
        t = f["type"]
        if isinstance(t, list):
            out[f["name"]] = draw(st.one_of(st.none(), PRIMITIVES[t[1]][1]))
        else:
            out[f["name"]] = draw(PRIMITIVES[t][1])
    return out


@settings(deadline=None, max_examples=300)
@given(st.data())
def test_what_the_check_calls_readable_fastavro_reads(data):
    writer, reader = data.draw(records()), data.draw(records())
    incompatible = can_read(avro(reader), avro(writer))
    assert can_read(avro(writer), avro(writer)) == [], "every schema reads itself"
    if incompatible:
        return
    value = data.draw(datum_for(writer))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(writer), value)
    buf.seek(0)
    got = fastavro.schemaless_reader(buf, fastavro.parse_schema(writer), fastavro.parse_schema(reader))
    assert set(got) == {f["name"] for f in reader["fields"]}

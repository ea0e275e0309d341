"""Avro writer schemas as Iceberg (and Arrow) types for the table's `value` column, and the evolution
of a table's schema by union with a new writer schema.

What Iceberg cannot hold (a union of two non-null branches, a recursive record, a decimal wider than
38 digits) is left out of the columns and reported as unrepresentable, with its path and why: such
values keep their bytes in value_raw. A table change Iceberg does not allow is reported as
incompatible, never raised: the topic's values then stay raw and the topic never stalls.
"""

from __future__ import annotations

import datetime
import itertools
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import fastavro
import pyarrow as pa
from pyiceberg.exceptions import ResolveError, ValidationError
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table.update.schema import UpdateSchema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
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

VALUE = "value"  # the table column the value's type is laid out in
MAX_DECIMAL_PRECISION = 38  # Iceberg's

_PRIMITIVES: dict[str, IcebergType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "bytes": BinaryType(),
    "string": StringType(),
}
# Avro's timestamps are instants (UTC), its local timestamps wall-clock times. Its times of day are
# kept as microseconds since midnight (long), not Iceberg `time`: Spark 3.5's Iceberg runtime
# refuses to read any table with a time column at all ("Spark does not support time fields").
_TIMES_OF_DAY = ("time-millis", "time-micros")
_LOGICAL: dict[str, IcebergType] = {
    "date": DateType(),
    "timestamp-millis": TimestamptzType(),
    "timestamp-micros": TimestamptzType(),
    "local-timestamp-millis": TimestampType(),
    "local-timestamp-micros": TimestampType(),
    "uuid": UUIDType(),
}


@dataclass(frozen=True, slots=True)
class Unrepresentable:
    path: str  # dotted, from the value column: "value.address.geo"
    reason: str


@dataclass(frozen=True, slots=True)
class ValueLayout:
    """How one writer schema's values become the `value` column."""

    iceberg: IcebergType | None  # None: nothing representable, every value stays raw
    unrepresentable: tuple[Unrepresentable, ...]
    # Applied to a decoded value before it becomes a row: drops what is unrepresentable, turns
    # UUIDs into their 16 bytes. None when the decoded value can be used as it is (the usual case).
    fix: Callable[[Any], Any] | None

    @property
    def arrow(self) -> pa.DataType | None:
        if self.iceberg is None:
            return None
        return schema_to_pyarrow(Schema(NestedField(1, VALUE, self.iceberg, required=False))).field(VALUE).type


def parse(schema: str | dict | list) -> Any:
    """A writer schema (the registry's JSON text, or JSON already loaded) as fastavro's parsed form."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError:
            pass  # a bare primitive name: int, string
    return fastavro.parse_schema(schema)


def value_layout(parsed: Any, first_id: int = 1) -> ValueLayout:
    """The Iceberg type of values written with `parsed` (a fastavro-parsed schema), field ids
    counted depth-first from `first_id` (files/layout.py gives the table's own ids to the whole schema).
    Record fields are all optional: a later schema version may drop one, and a union never does."""
    names = dict(parsed.get("__named_schemas", {})) if isinstance(parsed, dict) else {}
    converter = _Converter(names, itertools.count(first_id))
    iceberg, fix = converter.convert(parsed, VALUE, ())
    return ValueLayout(iceberg, tuple(converter.lost), fix)


class _Converter:
    def __init__(self, names: dict[str, Any], ids: itertools.count) -> None:
        self.names = names
        self.ids = ids
        self.lost: list[Unrepresentable] = []

    def _lose(self, path: str, reason: str) -> tuple[None, None]:
        self.lost.append(Unrepresentable(path, reason))
        return None, None

    def convert(self, avro: Any, path: str, records: tuple[str, ...]) -> tuple[IcebergType | None, Callable | None]:
        """(type, fix) of one Avro type; (None, None) when it is left out (and reported)."""
        if isinstance(avro, list):
            return self._union(avro, path, records)
        if isinstance(avro, str):
            if avro in _PRIMITIVES:
                return _PRIMITIVES[avro], None
            if avro == "null":
                return self._lose(path, "a null-only type holds no value")
            if avro in self.names:
                return self.convert(self.names[avro], path, records)
            return self._lose(path, f"unknown type {avro!r}")
        kind = avro["type"]
        logical = avro.get("logicalType")
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision, scale = avro.get("precision", 0), avro.get("scale", 0)
            if not 0 < precision <= MAX_DECIMAL_PRECISION:
                return self._lose(path, f"decimal precision {precision} is outside Iceberg's 1-{MAX_DECIMAL_PRECISION}")
            return DecimalType(precision, scale), None
        if logical in _TIMES_OF_DAY and kind in ("int", "long"):
            return LongType(), _time_micros
        if logical in _LOGICAL and (logical != "uuid" or kind == "string" or avro.get("size") == 16):
            return _LOGICAL[logical], _uuid_bytes if logical == "uuid" else None
        if kind == "record":
            return self._record(avro, path, records)
        if kind == "enum":
            return StringType(), None
        if kind == "fixed":
            return FixedType(avro["size"]), None
        if kind == "array":
            element, fix = self._element(avro["items"], f"{path}.element", records)
            if element is None:
                return None, None
            element_type, required = element
            return ListType(next(self.ids), element_type, element_required=required), _each(fix)
        if kind == "map":
            element, fix = self._element(avro["values"], f"{path}.value", records)
            if element is None:
                return None, None
            value_type, required = element
            key_id = next(self.ids)
            return MapType(key_id, StringType(), next(self.ids), value_type, value_required=required), _each_value(fix)
        # A primitive written as {"type": "long", ...} with a logical type Iceberg has no use for:
        # Avro readers ignore unknown logical types, and so does the table.
        return self.convert(kind, path, records)

    def _element(self, avro: Any, path: str, records: tuple[str, ...]):
        nullable = isinstance(avro, list) and "null" in avro
        converted, fix = self.convert(avro, path, records)
        if converted is None:
            return None, None
        return (converted, not nullable), fix

    def _union(self, branches: list, path: str, records: tuple[str, ...]):
        others = [b for b in branches if b != "null"]
        if len(others) == 1:
            return self.convert(others[0], path, records)
        if not others:
            return self._lose(path, "a null-only union holds no value")
        shown = ", ".join(b if isinstance(b, str) else b.get("name", b["type"]) for b in others)
        return self._lose(path, f"a union of {len(others)} non-null branches ({shown}) has no Iceberg type")

    def _record(self, avro: dict, path: str, records: tuple[str, ...]):
        name = avro["name"]
        if name in records:
            return self._lose(path, f"record {name} contains itself; Iceberg types are finite")
        fields: list[NestedField] = []
        fixes: dict[str, Callable | None] = {}
        dropped: list[str] = []
        for f in avro["fields"]:
            field_id = next(self.ids)
            field_type, fix = self.convert(f["type"], f"{path}.{f['name']}", (*records, name))
            if field_type is None:
                dropped.append(f["name"])
                continue
            fields.append(NestedField(field_id, f["name"], field_type, required=False, doc=f.get("doc")))
            if fix is not None:
                fixes[f["name"]] = fix
        if not fields:
            if not dropped:  # an empty record: Parquet has no empty group
                return self._lose(path, f"record {name} has no fields")
            return None, None
        return StructType(*fields), _record_fix(dropped, fixes)


def _time_micros(value: Any) -> Any:
    """A time of day as fastavro decodes it (datetime.time) in microseconds since midnight."""
    if isinstance(value, datetime.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    return value


def _uuid_bytes(value: Any) -> Any:
    return value.bytes if isinstance(value, uuid.UUID) else value


def _each(fix: Callable | None) -> Callable | None:
    if fix is None:
        return None
    return lambda items: None if items is None else [fix(item) for item in items]


def _each_value(fix: Callable | None) -> Callable | None:
    if fix is None:
        return None
    return lambda entries: None if entries is None else {k: fix(v) for k, v in entries.items()}


def _record_fix(dropped: list[str], fixes: dict[str, Callable]) -> Callable | None:
    if not dropped and not fixes:
        return None
    drop = frozenset(dropped)

    def fix(record: dict | None) -> dict | None:
        if record is None:
            return None
        out = {k: v for k, v in record.items() if k not in drop} if drop else dict(record)
        for name, inner in fixes.items():
            out[name] = inner(out.get(name))
        return out

    return fix


# -- evolution ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Evolution:
    """The table schema after a union with one writer schema's value type."""

    schema: Schema | None  # None when incompatible
    changed: bool
    incompatible: str | None = None


def union_schema(value_type: IcebergType) -> Schema:
    """What to give pyiceberg's union_by_name (table.update_schema().union_by_name(...)): the value
    column alone, so the table's other columns are never touched."""
    return Schema(NestedField(1, VALUE, value_type, required=False))


def evolve(table_schema: Schema, value_type: IcebergType) -> Evolution:
    """The table schema unioned with `value_type` (new fields optional; int→long, float→double and
    a wider decimal of the same scale promoted), computed by pyiceberg's union_by_name without a
    table; or why not. The committer makes the same change on the table with union_schema()."""
    if any(f.name == VALUE for f in table_schema.fields):
        why = _incompatibility(table_schema.find_field(VALUE).field_type, value_type, VALUE)
        if why:
            return Evolution(None, False, why)
    # union_by_name wants a transaction only to check partition fields against the new schema and
    # to number it: a value column change cannot affect a partition field on the kafka columns.
    stand_in = SimpleNamespace(table_metadata=SimpleNamespace(partition_specs=[], schemas=[table_schema]))
    try:
        update = UpdateSchema(stand_in, schema=table_schema).union_by_name(union_schema(value_type))  # type: ignore[arg-type]
        evolved = update._apply()
    except (ValidationError, ResolveError, ValueError) as e:
        return Evolution(None, False, str(e))
    return Evolution(evolved, evolved.as_struct() != table_schema.as_struct())


def _incompatibility(old: IcebergType, new: IcebergType, path: str) -> str | None:
    """Why `new` cannot be unioned into `old`, for what pyiceberg 0.12 lets through (it widens a
    decimal whatever the scale); None if it can."""
    if isinstance(old, StructType) and isinstance(new, StructType):
        for field in new.fields:
            match = next((f for f in old.fields if f.name == field.name), None)
            if match is not None and (why := _incompatibility(match.field_type, field.field_type, f"{path}.{field.name}")):
                return why
        return None
    if isinstance(old, ListType) and isinstance(new, ListType):
        return _incompatibility(old.element_type, new.element_type, f"{path}.element")
    if isinstance(old, MapType) and isinstance(new, MapType):
        return _incompatibility(old.value_type, new.value_type, f"{path}.value")
    if old == new or (old, new) in ((LongType(), IntegerType()), (IntegerType(), LongType()), (DoubleType(), FloatType()), (FloatType(), DoubleType())):
        return None
    if isinstance(old, DecimalType) and isinstance(new, DecimalType) and old.scale == new.scale:
        return None
    return f"{path}: {old} cannot become {new}"

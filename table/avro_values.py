"""Avro values back from the table's `value` column: the produced bytes (Confluent frame, then the
Avro binary) of a row the compactor kept as columns alone, re-encoded with its writer schema.

The compactor keeps a value as columns alone only when re-encoding the datum fastavro decoded gives
the produced bytes (compactor/rows/translator.py), and stores that datum with a few types changed for
Iceberg (compactor/rows/avro_types.py). Here each change is undone from the writer schema alone, worked
out once per schema: UUIDs (read back as uuid.UUID, or as their 16 bytes by a reader without
Arrow's uuid type; fastavro's datum is a UUID on a string, the bytes on a fixed), times of day
(microseconds since midnight; fastavro writes the int), maps (read back as (key, value) pairs in
their Avro order), and the raw number of a logical type fastavro does not decode (a date on a long,
a timestamp on an int), read back as a date or a datetime. Most schemas need none of it: their
column values are written as they are.
"""

from __future__ import annotations

import datetime
import functools
import io
import json
import uuid
from collections.abc import Callable
from typing import Any

import fastavro
from fastavro import schemaless_writer

from registry.wire import frame

Rebuild = Callable[[Any], Any]

_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_EPOCH_NAIVE = datetime.datetime(1970, 1, 1)
_MICROSECOND = datetime.timedelta(microseconds=1)
# What the compactor gives an Iceberg type (avro_types._LOGICAL), whatever the Avro type under it.
_TIMESTAMPS = ("timestamp-millis", "timestamp-micros", "local-timestamp-millis", "local-timestamp-micros")


class ValueEncoder:
    """The produced value bytes of rows written with one registered schema: make one per schema id
    and keep it (encoder() does), then encode() each row's `value` column value as pyarrow gives it
    back (to_pylist: structs as dicts, maps as (key, value) pairs or dicts, UUIDs as uuid.UUID or
    their 16 bytes).

    Any schema text makes an encoder, as any schema id can be in a table's rows; one whose values
    are never kept as columns alone (not Avro, a union of two non-null branches, a null-only type,
    a recursive or empty record) says why in `unusable`, and its encode() raises ValueError."""

    __slots__ = ("schema_id", "parsed", "unusable", "_header", "_rebuild")

    def __init__(self, schema_id: int, schema_text: str) -> None:
        self.schema_id = schema_id
        self._header = frame(schema_id, b"")
        self.parsed: Any = None
        self.unusable: str | None = None
        self._rebuild: Rebuild | None = None
        try:
            self.parsed = _parse(schema_text)
        except Exception as e:  # fastavro's SchemaParseException, unknown types: the compactor kept these raw
            self.unusable = f"schema {schema_id} does not parse as Avro: {e}"
            return
        names = self.parsed.get("__named_schemas", {}) if isinstance(self.parsed, dict) else {}
        try:
            self._rebuild = _Compiler(names).compile(self.parsed, ())
        except _NeverColumns as e:
            self.unusable = f"schema {schema_id}: {e}"

    def datum(self, column_value: Any) -> Any:
        """What fastavro writes for `column_value`: the column value itself when this schema's
        column values already are its datums (no work), else a rebuilt copy (never changed in
        place: a decoded batch may be encoded again for another consumer)."""
        if self.unusable is not None:
            raise ValueError(self.unusable)
        return column_value if self._rebuild is None else self._rebuild(column_value)

    def encode(self, column_value: Any) -> bytes:
        """The value bytes a producer sent: the Confluent frame, then the Avro binary."""
        if self.unusable is not None:
            raise ValueError(self.unusable)
        out = io.BytesIO()
        out.write(self._header)
        schemaless_writer(out, self.parsed, column_value if self._rebuild is None else self._rebuild(column_value))
        return out.getvalue()


@functools.lru_cache(maxsize=1024)
def encoder(schema_id: int, schema_text: str) -> ValueEncoder:
    """The ValueEncoder of a schema, made once (a schema id's text never changes in a registry)."""
    return ValueEncoder(schema_id, schema_text)


class _NeverColumns(Exception):
    """A part of a schema that has no column, so its values are never kept as columns alone."""


def _parse(schema_text: str) -> Any:
    try:
        schema = json.loads(schema_text)
    except json.JSONDecodeError:
        schema = schema_text  # a bare primitive name: int, string
    return fastavro.parse_schema(schema)


class _Compiler:
    """One Avro type (fastavro-parsed) → how to rebuild its datum from its column value, or None
    where the column value already is the datum. Follows avro_types._Converter's choices."""

    def __init__(self, names: dict[str, Any]) -> None:
        self.names = names

    def compile(self, avro: Any, records: tuple[str, ...]) -> Rebuild | None:
        if isinstance(avro, list):
            return self._union(avro, records)
        if isinstance(avro, str):
            if avro in self.names:
                return self.compile(self.names[avro], records)
            if avro == "null":
                raise _NeverColumns("a null-only type holds no value")
            return None  # a primitive (fastavro has refused unknown names)
        kind, logical = avro["type"], avro.get("logicalType")
        if logical == "decimal" and kind in ("bytes", "fixed"):
            return None  # Decimal either way, precision widened or not
        if logical in ("time-millis", "time-micros") and kind in ("int", "long"):
            # fastavro writes an int where it would take a time: no datetime.time in between.
            return _micros_to_millis if (kind, logical) == ("int", "time-millis") else None
        if logical == "uuid" and (kind == "string" or avro.get("size") == 16):
            return _to_uuid if kind == "string" else _to_uuid_bytes
        if logical == "date":
            return None if kind == "int" else _days  # fastavro decodes only int dates
        if logical in _TIMESTAMPS:
            return None if kind == "long" else _micros  # fastavro decodes only long timestamps
        if kind == "record":
            return self._record(avro, records)
        if kind in ("enum", "fixed"):
            return None
        if kind == "array":
            return _each(self.compile(avro["items"], records))
        if kind == "map":
            return _each_value(self.compile(avro["values"], records))
        return self.compile(kind, records)  # a primitive with a logical type nobody decodes

    def _union(self, branches: list, records: tuple[str, ...]) -> Rebuild | None:
        others = [b for b in branches if b != "null"]
        if len(others) != 1:
            raise _NeverColumns(f"a union of {len(others)} non-null branches has no column")
        rebuild = self.compile(others[0], records)
        if rebuild is None:
            return None
        return lambda value: None if value is None else rebuild(value)

    def _record(self, avro: dict, records: tuple[str, ...]) -> Rebuild | None:
        name = avro["name"]
        if name in records:
            raise _NeverColumns(f"record {name} contains itself")
        if not avro["fields"]:
            raise _NeverColumns(f"record {name} has no fields")
        rebuilds = [(f["name"], r) for f in avro["fields"] if (r := self.compile(f["type"], (*records, name))) is not None]
        if not rebuilds:
            return None

        def rebuild(value: dict) -> dict:
            # A copy with the writer's fields rebuilt; fields other schema versions added to the
            # table are kept and ignored by fastavro.
            out = dict(value)
            for field, inner in rebuilds:
                out[field] = inner(out[field])
            return out

        return rebuild


def _micros_to_millis(value: int) -> int:
    return value // 1000


def _to_uuid(value: Any) -> Any:
    return uuid.UUID(bytes=value) if isinstance(value, bytes) else value


def _to_uuid_bytes(value: Any) -> Any:
    # fastavro decodes a uuid on fixed(16) as its bytes; Arrow gives the column back as uuid.UUID.
    return value.bytes if isinstance(value, uuid.UUID) else value


def _days(value: Any) -> Any:
    return (value - _EPOCH_DATE).days if isinstance(value, datetime.date) else value


def _micros(value: Any) -> Any:
    if not isinstance(value, datetime.datetime):
        return value
    delta = value - (_EPOCH if value.tzinfo is not None else _EPOCH_NAIVE)
    return delta // _MICROSECOND


def _each(rebuild: Rebuild | None) -> Rebuild | None:
    if rebuild is None:
        return None
    return lambda items: [rebuild(item) for item in items]


def _each_value(rebuild: Rebuild | None) -> Rebuild:
    """Maps come back from Arrow as (key, value) pairs in the order they were written, which is the
    order fastavro decoded them in (and writes a dict in)."""
    if rebuild is None:
        return dict
    return lambda entries: {k: rebuild(v) for k, v in (entries.items() if isinstance(entries, dict) else entries)}

"""Avro schemas: parsed and validated by fastavro (its errors become InvalidSchema), stored as
compact JSON; whitespace and the order of an object's keys do not make a new schema, while
defaults, docs and aliases do (as in Confluent's registry)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import fastavro.schema

from ..model import InvalidSchema, Schema
from . import Parsed


def parse(schema: Schema, referenced: Mapping[str, Any]) -> Parsed:
    """`referenced`: the named types the schema's references define, by full name."""
    try:
        value = json.loads(schema.text)
    except (ValueError, TypeError) as e:
        raise InvalidSchema(f"Invalid schema {schema.text!r}: not JSON ({e})") from None
    _check_records(value)
    named = dict(referenced)
    try:
        parsed = fastavro.schema.parse_schema(value, named_schemas=named)
    except Exception as e:  # noqa: BLE001 - fastavro raises SchemaParseException, UnknownType, ValueError, KeyError, TypeError...
        raise InvalidSchema(f"Invalid schema {schema.text!r}: {type(e).__name__} {e}") from None
    compact = json.dumps(value, separators=(",", ":"))
    return Parsed(schema, compact, parsed, named, identity=json.dumps(value, separators=(",", ":"), sort_keys=True))


def _check_records(value: Any) -> None:
    """What fastavro lets through and Avro does not: a record without a list of fields."""
    if isinstance(value, list):
        for branch in value:
            _check_records(branch)
    elif isinstance(value, dict):
        kind = value.get("type")
        if kind in ("record", "error"):
            if not isinstance(value.get("fields"), list):
                raise InvalidSchema(f"Invalid schema: record {value.get('name')!r} has no fields list")
            for f in value["fields"]:
                if isinstance(f, dict):
                    _check_records(f.get("type"))
        elif kind in ("array", "map"):
            _check_records(value.get("items" if kind == "array" else "values"))
        else:
            _check_records(kind)


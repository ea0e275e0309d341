"""JSON Schema: stored as text once it parses as JSON (no meta-schema validation, no compatibility
check yet: docs/GAPS.md)."""

from __future__ import annotations

import json

from ..model import InvalidSchema, Schema
from . import Parsed


def parse(schema: Schema) -> Parsed:
    try:
        value = json.loads(schema.text)
    except ValueError as e:
        raise InvalidSchema(f"Invalid schema: not JSON ({e})") from None
    if not isinstance(value, (dict, bool)):
        raise InvalidSchema("Invalid schema: a JSON Schema is an object or a boolean")
    return Parsed(schema, json.dumps(value, separators=(",", ":")), value, identity=json.dumps(value, separators=(",", ":"), sort_keys=True))

"""Protobuf: stored as the text given, when it is not blank (no .proto parsing, no compatibility
check yet: docs/GAPS.md)."""

from __future__ import annotations

from ..model import InvalidSchema, Schema
from . import Parsed


def parse(schema: Schema) -> Parsed:
    if not schema.text.strip():
        raise InvalidSchema("Invalid schema: empty Protobuf schema")
    return Parsed(schema, schema.text)

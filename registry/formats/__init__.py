"""The schema formats the registry takes: each parses and validates a schema's text (InvalidSchema,
42201, if it cannot), gives the normalised text stored and answered, and the fingerprint that makes
registering the same schema again idempotent. Only Avro has a compatibility check; JSON Schema and
Protobuf are stored as text and every change to them passes (docs/GAPS.md)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..model import Schema, SchemaType


@dataclass(frozen=True)
class Parsed:
    """A schema as its format understands it: `normalised` is the text stored and served, and
    `parsed` whatever the format's compatibility check reads (Avro: fastavro's parsed form)."""

    schema: Schema
    normalised: str
    parsed: Any = None
    names: Mapping[str, Any] | None = None  # Avro: every named type the schema can use, by full name
    identity: str = ""  # what the fingerprint reads, when not `normalised` (keys sorted, for JSON formats)

    @property
    def stored(self) -> Schema:
        """The schema as the registry keeps and serves it: its normalised text."""
        return replace(self.schema, text=self.normalised)

    @property
    def fingerprint(self) -> str:
        """Equal for schemas the registry treats as the same: format, normalised text, references."""
        refs = [[r.name, r.subject, r.version] for r in self.schema.references]
        return hashlib.sha256(json.dumps([self.schema.type.value, self.identity or self.normalised, refs], separators=(",", ":")).encode()).hexdigest()


def parse(schema: Schema, referenced: Mapping[str, Any] | None = None) -> Parsed:
    """`referenced`: for Avro, the named types the schema's references define (by full name)."""
    if schema.type == SchemaType.AVRO:
        from . import avro

        return avro.parse(schema, referenced or {})
    if schema.type == SchemaType.JSON:
        from . import json_schema

        return json_schema.parse(schema)
    from . import protobuf

    return protobuf.parse(schema)

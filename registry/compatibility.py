"""Avro schema compatibility, pure: whether a reader schema can read what a writer schema wrote,
by the Avro specification's schema resolution rules, and the levels (BACKWARD, FORWARD, FULL, their
transitive variants, NONE) built on it. Works on fastavro's parsed form (named types spelled out
once, then referred to by full name). JSON Schema and Protobuf changes always pass (docs/GAPS.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .formats import Parsed
from .model import Compatibility, SchemaType

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED = frozenset({"record", "error", "enum", "fixed"})
# writer type -> the reader types it is promoted to (the spec's "the writer's schema may be promoted")
PROMOTIONS = {"int": {"long", "float", "double"}, "long": {"float", "double"}, "float": {"double"}, "string": {"bytes"}, "bytes": {"string"}}


@dataclass(frozen=True)
class Incompatibility:
    """Why a reader cannot read a writer: Avro's own error types (as Confluent reports them) and
    the path in the reader schema where it was found."""

    kind: str  # TYPE_MISMATCH, NAME_MISMATCH, FIXED_SIZE_MISMATCH, MISSING_ENUM_SYMBOLS, READER_FIELD_MISSING_DEFAULT_VALUE, MISSING_UNION_BRANCH
    path: str
    detail: str

    def __str__(self) -> str:
        return f"{{errorType:'{self.kind}', description:'{self.detail}', path:'{self.path}'}}"


class _Checker:
    def __init__(self, reader_names: Mapping[str, Any], writer_names: Mapping[str, Any]) -> None:
        self.reader_names, self.writer_names = reader_names, writer_names
        self.assumed: set[tuple[str, str]] = set()  # named pairs under check: a recursive type meets itself

    def resolve(self, schema: Any, names: Mapping[str, Any]) -> Any:
        if isinstance(schema, str) and schema not in PRIMITIVES:
            return names.get(schema, schema)
        if isinstance(schema, dict) and schema.get("type") in PRIMITIVES:
            return schema["type"]  # {"type": "int", "logicalType": "date"}: resolution ignores logical types
        return schema

    def check(self, reader: Any, writer: Any, path: str) -> list[Incompatibility]:
        reader, writer = self.resolve(reader, self.reader_names), self.resolve(writer, self.writer_names)
        if isinstance(writer, list):  # every branch the writer may have written must be readable
            out: list[Incompatibility] = []
            for branch in writer:
                out += self.check(reader, branch, path)
            return out
        if isinstance(reader, list):  # the first branch that matches the writer takes it
            for branch in reader:
                if not self.check(branch, writer, path):
                    return []
            return [Incompatibility("MISSING_UNION_BRANCH", path, f"reader union lacking writer type: {_kind(writer)}")]
        rk, wk = _kind(reader), _kind(writer)
        if rk != wk:
            if rk in PROMOTIONS.get(wk, ()):
                return []
            return [Incompatibility("TYPE_MISMATCH", path, f"reader type: {rk} not compatible with writer type: {wk}")]
        if rk in PRIMITIVES:
            return []
        if rk in NAMED and _short(reader["name"]) != _short(writer["name"]) and _short(writer["name"]) not in {_short(a) for a in reader.get("aliases", ())}:
            return [Incompatibility("NAME_MISMATCH", f"{path}/name", f"expected: {writer['name']}")]
        if rk == "fixed":
            if reader["size"] != writer["size"]:
                return [Incompatibility("FIXED_SIZE_MISMATCH", f"{path}/size", f"expected: {writer['size']}, found: {reader['size']}")]
            return []
        if rk == "enum":
            missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
            if missing and "default" not in reader:
                return [Incompatibility("MISSING_ENUM_SYMBOLS", f"{path}/symbols", f"[{', '.join(missing)}]")]
            return []
        if rk == "array":
            return self.check(reader["items"], writer["items"], f"{path}/items")
        if rk == "map":
            return self.check(reader["values"], writer["values"], f"{path}/values")
        return self.record(reader, writer, path)

    def record(self, reader: dict, writer: dict, path: str) -> list[Incompatibility]:
        pair = (reader["name"], writer["name"])
        if pair in self.assumed:
            return []
        self.assumed.add(pair)
        by_name = {f["name"]: f for f in writer["fields"]}
        out: list[Incompatibility] = []
        for i, field in enumerate(reader["fields"]):
            written = next((by_name[n] for n in (field["name"], *field.get("aliases", ())) if n in by_name), None)
            if written is None:
                if "default" not in field:
                    out.append(Incompatibility("READER_FIELD_MISSING_DEFAULT_VALUE", f"{path}/fields/{i}", field["name"]))
            else:
                out += self.check(field["type"], written["type"], f"{path}/fields/{i}/type")
        return out


def _kind(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, list):
        return "union"
    return "record" if schema["type"] == "error" else schema["type"]


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def can_read(reader: Parsed, writer: Parsed) -> list[Incompatibility]:
    """Why data written with `writer` cannot be read with `reader`; empty if it can. Only Avro is
    checked: other formats always can (docs/GAPS.md)."""
    if reader.schema.type != writer.schema.type:
        return [Incompatibility("TYPE_MISMATCH", "", f"reader schema type: {reader.schema.type} not compatible with writer schema type: {writer.schema.type}")]
    if reader.schema.type != SchemaType.AVRO:
        return []
    return _Checker(reader.names or {}, writer.names or {}).check(reader.parsed, writer.parsed, "")


def check(level: Compatibility, new: Parsed, previous: Sequence[Parsed]) -> list[str]:
    """Messages saying why `new` may not follow `previous` (oldest first) at `level`; empty if it
    may. Non-transitive levels look at the latest previous schema only."""
    if level == Compatibility.NONE or not previous:
        return []
    against = previous if level.transitive else previous[-1:]
    messages: list[str] = []
    for old in reversed(against):
        found = []
        if level.backward:
            found += can_read(new, old)
        if level.forward:
            found += can_read(old, new)
        if found:
            messages += [str(f) for f in found]
            messages.append(f"{{oldSchema: '{old.normalised}'}}")
            messages.append(f"{{compatibility: '{level.value}'}}")
            break  # Confluent reports the first old schema that fails
    return messages

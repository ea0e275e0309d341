"""Hypothesis strategies: Avro writer schemas of every type the table maps (records, arrays, maps,
unions with null, enums, fixed, bytes, decimals, dates, times, timestamps, uuids), and values of a
given schema as fastavro writes them."""

from __future__ import annotations

import datetime
import decimal

from hypothesis import strategies as st

UTC = datetime.UTC
LEAVES = [
    "boolean", "int", "long", "float", "double", "bytes", "string",
    {"type": "int", "logicalType": "date"},
    {"type": "int", "logicalType": "time-millis"},
    {"type": "long", "logicalType": "time-micros"},
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "long", "logicalType": "local-timestamp-millis"},
    {"type": "long", "logicalType": "local-timestamp-micros"},
    {"type": "string", "logicalType": "uuid"},
    {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
    {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10},
]


def _named(path: str):
    return st.one_of(
        st.lists(st.sampled_from("ABCDE"), min_size=1, max_size=4, unique=True).map(lambda s: {"type": "enum", "name": f"E{path}", "symbols": s}),
        st.integers(1, 8).map(lambda n: {"type": "fixed", "name": f"F{path}", "size": n}),
        st.integers(1, 8).map(lambda n: {"type": "fixed", "name": f"D{path}", "size": n, "logicalType": "decimal", "precision": min(38, 2 * n), "scale": 1}),
    )


def field_type(path: str, depth: int):
    leaf = st.one_of(st.sampled_from(LEAVES), _named(path))
    if depth >= 2:
        return st.one_of(leaf, leaf.map(lambda t: ["null", t]))
    inner = field_type(f"{path}x", depth + 1)
    return st.one_of(
        leaf,
        inner.map(lambda t: ["null", t] if not isinstance(t, list) else t),
        inner.map(lambda t: {"type": "array", "items": t}),
        inner.map(lambda t: {"type": "map", "values": t}),
        record_schema(f"{path}r", depth + 1),
    )


@st.composite
def record_schema(draw, name: str = "R", depth: int = 0):
    count = draw(st.integers(1, 4))
    return {"type": "record", "name": name, "fields": [{"name": f"f{i}", "type": draw(field_type(f"{name}_{i}", depth))} for i in range(count)]}


def _millis(dt: datetime.datetime) -> datetime.datetime:
    return dt.replace(microsecond=dt.microsecond // 1000 * 1000)


def _decimal(precision: int, scale: int):
    """Decimals that fit (precision, scale). Scaled exactly: the default context's 28 digits would
    round 38 nines up to a 39-digit unscaled value that the column cannot hold."""
    bound = 10**precision - 1
    exact = decimal.Context(prec=precision)
    return st.integers(-bound, bound).map(lambda u: decimal.Decimal(u).scaleb(-scale, exact))


_DATETIMES = st.datetimes(min_value=datetime.datetime(1900, 1, 1), max_value=datetime.datetime(2200, 1, 1))


def values(schema):
    """Values of `schema` (a schema as written, not parsed) as fastavro takes and gives them back."""
    if isinstance(schema, list):
        (other,) = [b for b in schema if b != "null"]
        return st.one_of(st.none(), values(other))
    if isinstance(schema, str):
        return {
            "boolean": st.booleans(),
            "int": st.integers(-(2**31), 2**31 - 1),
            "long": st.integers(-(2**63), 2**63 - 1),
            "float": st.floats(width=32, allow_nan=False),
            "double": st.floats(allow_nan=False),
            "bytes": st.binary(max_size=16),
            "string": st.text(max_size=16),
        }[schema]
    logical, kind = schema.get("logicalType"), schema["type"]
    if logical == "decimal":
        return _decimal(schema["precision"], schema["scale"])
    if kind == "fixed":  # a uuid fixed too: fastavro reads and writes its bytes
        return st.binary(min_size=schema["size"], max_size=schema["size"])
    if logical in ("date", "time-millis", "time-micros", "uuid") or "timestamp" in (logical or ""):
        return {
            "date": st.dates(),
            "time-millis": st.times().map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000)),
            "time-micros": st.times(),
            "timestamp-millis": _DATETIMES.map(lambda d: _millis(d).replace(tzinfo=UTC)),
            "timestamp-micros": _DATETIMES.map(lambda d: d.replace(tzinfo=UTC)),
            "local-timestamp-millis": _DATETIMES.map(_millis),
            "local-timestamp-micros": _DATETIMES,
            "uuid": st.uuids(),
        }[logical]
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "array":
        return st.lists(values(schema["items"]), max_size=3)
    if kind == "map":
        return st.dictionaries(st.text(max_size=6), values(schema["values"]), max_size=3)
    if kind == "record":
        return st.fixed_dictionaries({f["name"]: values(f["type"]) for f in schema["fields"]})
    return values(kind)

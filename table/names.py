"""What a topic's table is called, and the syntax of the two topic configs that shape it: pure
rules the broker (refusing a name or a config at CreateTopics and AlterConfigs), the compactor
(naming and creating the table) and `neve sql` share. No pyarrow or pyiceberg here: a broker
without the table extra checks names too.

A table's name is its topic's name with every character outside [A-Za-z0-9_] made `_`, so SQL
users need no quoting and catalogs that allow only such names work; `neve.iceberg.table` may name
another table, one identifier optionally after one namespace. Two topics whose tables would have
one name (`orders.eu` beside `orders_eu`, or a table config naming another topic's table) are
refused: a table belongs to one topic. Names are compared without case, as Spark, Trino and DuckDB
resolve unquoted identifiers."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

TABLE_CONFIG = "neve.iceberg.table"
PARTITION_BY_CONFIG = "neve.iceberg.partition.by"
DEFAULT_PARTITION_BY = "day(timestamp)"

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_TABLE = re.compile(rf"(?:({_IDENTIFIER})\.)?({_IDENTIFIER})")
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")

TRANSFORMS = ("year", "month", "day", "hour", "identity", "bucket[N]", "truncate[W]")
_TRANSFORM = re.compile(r"(year|month|day|hour|identity)|(bucket|truncate)\[\s*([1-9]\d{0,8})\s*\]")
_TERM = re.compile(r"\s*([A-Za-z]\w*(?:\[[^\]]*\])?)\s*\(\s*(" + _IDENTIFIER + r"(?:\." + _IDENTIFIER + r")*)\s*\)\s*")


class InvalidName(ValueError):
    """A table name or partition config that cannot be used; says why."""


def default_table_name(topic: str) -> str:
    """The table name of a topic that sets no `neve.iceberg.table`."""
    return _UNSAFE.sub("_", topic)


def parse_table_config(value: str) -> tuple[str | None, str]:
    """(namespace or None, table name) of a `neve.iceberg.table` value, or InvalidName."""
    match = _TABLE.fullmatch(value.strip())
    if match is None:
        raise InvalidName(f"{TABLE_CONFIG}: {value!r} is not a table name: an identifier ([A-Za-z_][A-Za-z0-9_]*), optionally after one namespace and a dot (ns.table)")
    return match.group(1), match.group(2)


def table_of(topic: str, configs: Mapping[str, str]) -> tuple[str | None, str]:
    """(namespace or None for the compactor's, table name) of a topic's table."""
    value = configs.get(TABLE_CONFIG, "").strip()
    return parse_table_config(value) if value else (None, default_table_name(topic))


def table_identifier(namespace: str, topic: str, configs: Mapping[str, str]) -> str:
    """`namespace.name` of a topic's table, the compactor's `namespace` unless its config names one."""
    ns, name = table_of(topic, configs)
    return f"{ns or namespace}.{name}"


def same_table(a: tuple[str | None, str], b: tuple[str | None, str]) -> bool:
    """Whether two (namespace, name) may be one table. The broker does not know the compactor's
    namespace, so a name without one matches that name in any namespace."""
    if a[1].lower() != b[1].lower():
        return False
    return a[0] is None or b[0] is None or a[0].lower() == b[0].lower()


@dataclass(frozen=True, slots=True)
class Topic:
    """A live topic as the collision check needs it."""

    name: str
    configs: Mapping[str, str]


def table_collision(topic: str, configs: Mapping[str, str], others: Iterable[Topic]) -> str | None:
    """The name of another topic whose table would be `topic`'s (with `configs`), else None."""
    mine = table_of(topic, configs)
    for other in others:
        if other.name == topic:
            continue
        try:
            theirs = table_of(other.name, other.configs)
        except InvalidName:  # a config stored before names were checked: its default name is still taken
            theirs = (None, default_table_name(other.name))
        if same_table(mine, theirs):
            return other.name
    return None


def collision_message(topic: str, configs: Mapping[str, str], other: str) -> str:
    ns, name = table_of(topic, configs)
    shown = f"{ns}.{name}" if ns else name
    return f"topic {topic!r} would share the Iceberg table {shown!r} with topic {other!r}: a table belongs to one topic (set {TABLE_CONFIG} to another name)"


# -- neve.iceberg.partition.by ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionTerm:
    transform: str  # as Iceberg spells it: day, bucket[8], truncate[4]
    column: str  # a kafka struct field (timestamp, partition) or a dotted path (value.country)


def parse_partition_by(text: str | None) -> list[PartitionTerm]:
    """The terms of a `neve.iceberg.partition.by` value (none: []), or InvalidName saying what is
    wrong with its syntax. Whether each column exists and takes its transform is the table's to
    say (the compactor's, which knows the schema)."""
    text = (text if text is not None else DEFAULT_PARTITION_BY).strip()
    if text.lower() in ("none", ""):
        return []
    terms = []
    for term in text.split(","):
        match = _TERM.fullmatch(term)
        if match is None:
            raise InvalidName(f"{PARTITION_BY_CONFIG}: {term.strip()!r} is not transform(column), e.g. {DEFAULT_PARTITION_BY}")
        spelled = match.group(1).replace(" ", "")
        transform = _TRANSFORM.fullmatch(spelled.lower())
        if transform is None:
            name = spelled.split("[")[0]
            raise InvalidName(f"{PARTITION_BY_CONFIG}: unknown transform {name!r} ({', '.join(TRANSFORMS)})")
        canonical = transform.group(1) or f"{transform.group(2)}[{int(transform.group(3))}]"
        terms.append(PartitionTerm(canonical, match.group(2)))
    return terms

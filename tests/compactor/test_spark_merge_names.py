"""The merge on Spark (compactor/maintenance/rounds.py merge_on_spark) with tables whose names SQL text
would misread: quotes, backticks, backslashes, semicolons, `-`, a `.` inside a name, a name
that spells out SQL of its own, and a namespace that has the Spark catalog's name (`neve dev`'s
layout: catalog `neve`, namespace `neve`, where the text `neve.orders` names table `orders` of
catalog `neve`). Each such table, made with pyiceberg in a SQL catalog the compactor's Spark
session sees, gets its small files merged into one file of the same rows in Kafka order, and
nothing else in the catalog changes: the tables those names would be misread as keep their
snapshots, and no table or namespace appears or goes."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import BinaryType, IntegerType, LongType, NestedField, StructType

from compactor.files.spark import register_catalog
from compactor.maintenance.rounds import merge_on_spark

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("spark")]

SCHEMA = Schema(
    NestedField(1, "kafka", StructType(NestedField(2, "partition", IntegerType(), required=False), NestedField(3, "offset", LongType(), required=False)), required=False),
    NestedField(4, "value", BinaryType(), required=False),
)
ARROW = pa.schema([pa.field("kafka", pa.struct([("partition", pa.int32()), ("offset", pa.int64())])), pa.field("value", pa.binary())])
FILES = 3  # appends, a file each
TARGET = 128 * 1024 * 1024

HOSTILE = [
    "orders-eu",
    "it's",
    "back`tick",
    "semi;colon",
    "back\\slash\\'",
    "orders.eu",  # a dot in the name: not namespace `orders`, table `eu`
    "victim",  # in a namespace named like the catalog
    "x'), where => 'false'); CALL system.rollback_to_snapshot('victim', 1); --",
    "`victim`; DROP TABLE victim; --",
]


def small_files(table, salt: int) -> list[tuple[int, int, bytes]]:
    """FILES appends, offsets interleaved across them (a merge must sort them): the rows."""
    rows = []
    for f in range(FILES):
        batch = [(p, o, b"%d-%d-%d" % (salt, p, o)) for p in (1, 0) for o in range(f, 12, FILES)]
        table.append(pa.Table.from_pylist([{"kafka": {"partition": p, "offset": o}, "value": v} for p, o, v in batch], schema=ARROW))
        rows += batch
    return sorted(rows)


def rows_in_file_order(table) -> list[tuple[int, int, bytes]]:
    out = table.scan().to_arrow().to_pylist()
    return [(r["kafka"]["partition"], r["kafka"]["offset"], r["value"]) for r in out]


def snapshots(catalog, namespace: tuple[str, ...]) -> dict[tuple[str, ...], list[int]]:
    return {name: [s.snapshot_id for s in catalog.load_table(name).snapshots()] for name in catalog.list_tables(namespace)}


def test_the_merge_on_spark_names_its_table_by_value_whatever_the_name_holds(sqlite_catalog, spark_session):
    catalog, spark_name = sqlite_catalog.catalog, register_catalog(spark_session, sqlite_catalog.target)
    ns = f"h{uuid.uuid4().hex[:8]}"
    like_catalog = spark_name  # a namespace named like the Spark catalog, as neve dev's `neve.neve`
    namespaces = [(ns,), (ns, "orders"), (like_catalog,)]
    for namespace in namespaces:
        catalog.create_namespace_if_not_exists(namespace)
    # what the hostile names would be misread as: each with small files the merge must not touch
    bystanders = [(ns, "victim"), (ns, "orders", "eu"), (ns, "x"), (like_catalog, f"bystander_{ns}")]
    for i, name in enumerate(bystanders):
        small_files(catalog.create_table(name, SCHEMA), salt=100 + i)
    before = {n: snapshots(catalog, n) for n in namespaces}

    hostile = [(ns, name) for name in HOSTILE if name != "victim"] + [(like_catalog, f"victim_{ns}")]
    for i, name in enumerate(hostile):
        table = catalog.create_table(name, SCHEMA)
        want = small_files(table, salt=i)
        assert table.name() == name
        assert merge_on_spark(spark_session, spark_name, table.name(), TARGET, 2) == FILES, name
        table = table.refresh()
        assert len(table.inspect.files()) == 1, name
        assert rows_in_file_order(table) == want, name  # the same rows, in Kafka order
        assert table.snapshots()[-1].summary.operation.value == "replace"
        assert len(table.snapshots()) == FILES + 1

    after = {n: snapshots(catalog, n) for n in namespaces}
    for namespace in namespaces:  # the bystanders as they were; no table made or dropped
        assert {t: s for t, s in after[namespace].items() if t in bystanders} == {t: s for t, s in before[namespace].items() if t in bystanders}
        assert set(after[namespace]) == set(before[namespace]) | {h for h in hostile if h[:-1] == namespace}
    assert {n for n in catalog.list_namespaces() if n[0] in (ns, like_catalog)} >= {(ns,), (like_catalog,)}

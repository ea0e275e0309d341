"""Issue 42, finding 6: an outside engine's rewrite_data_files applies a compacted topic's deletes,
its tombstones' among them, so the tombstones its Kafka readers are still served (within
`delete.retention.ms`) were left in no file. Records librdkafka produced to a compacted topic
(`neve dev`, its compactor off) are compacted in cycles; Spark rewrites every file and expires the
snapshots before it (deleting the old files) after neve's re-index; the Kafka view (raw fetches
from offset 0) is still each key's latest record and the tombstones, at their offsets, and the
table holds no row of a deleted key. A second rewrite carries the kept file on."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid
from pathlib import Path

import numpy as np
import pytest

from compactor.commits import kept_tombstones
from compactor.commits.rewrites import current_files, kafka_columns
from compactor.service import planning
from table import removals
from tests.compactor.test_compacted_topics import PARTITIONS, Record, create, key, latest_per_key, produce
from tests.compactor.test_maintenance import compact_in_cycles, local, maintain
from tests.fixtures import NeveNode
from tests.readers import collect, rows_pyiceberg
from wal.manifest import Removal
from wal.store import load_object_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

TOPIC = "kept"
KEYS, UPDATES, DELETED = 24, 3, 8


def kafka_view(data_dir: Path, log_path: Path) -> list[Record]:
    """What a node over `data_dir` serves from offset 0 of every partition, in (partition, offset) order."""
    from tests.table.test_fetch_from_table import fetch_batches

    node = NeveNode(data_dir=data_dir, log_path=log_path, env={"NEVE_COMPACTOR_IN_NODE": "false"}).start()
    try:
        fetched = fetch_batches(node.port, TOPIC, partitions=range(PARTITIONS))
    finally:
        assert node.stop() == 0
    return sorted((p, r.offset, r.key, r.value) for p, batches in fetched.items() for b in batches for r in b.records)


def rewrite_all(spark, catalog: str, identifier: str) -> None:
    """Spark rewrites every data file of the table (applying its delete files), as an outside engine."""
    (done,) = collect(spark.sql(f"CALL {catalog}.system.rewrite_data_files(table => '{identifier}', options => map('rewrite-all', 'true'))"))
    assert done["rewritten_data_files_count"] > 0


def expire_all_but_current(spark, catalog: str, identifier: str) -> None:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    collect(spark.sql(f"CALL {catalog}.system.expire_snapshots(table => '{identifier}', older_than => TIMESTAMP '{now}', retain_last => 1)"))


def offsets_in_files(table) -> set[tuple[int, int]]:
    held = set()
    for path in current_files(table):
        partitions, offsets = kafka_columns(table.io, path)
        held.update(zip(partitions.tolist(), offsets.tolist(), strict=True))
    return held


@pytest.mark.xdist_group("spark")
def test_tombstones_an_outside_rewrite_takes_are_still_served_to_kafka_readers(sqlite_catalog, spark_session, tmp_path, monkeypatch):
    from compactor.catalog import load_catalog
    from compactor.files.spark import register_catalog

    monkeypatch.setattr(planning, "MAX_ENTRIES_PER_PARTITION", 1)  # a cycle per WAL entry: many files
    data_dir = tmp_path / "node"
    data_dir.mkdir()
    node = NeveNode(data_dir=data_dir, log_path=tmp_path / "node.log", env={"NEVE_WAL_LINGER_MS": "5", "NEVE_COMPACTOR_IN_NODE": "false"}).start()
    try:
        create(node.bootstrap, TOPIC, **{"delete.retention.ms": "3600000"})  # tombstones served for an hour
        acked = []
        for u in range(UPDATES):
            acked += produce(node.bootstrap, TOPIC, [(key(k), b"v%d-%03d" % (u, k)) for k in range(KEYS)])
        acked += produce(node.bootstrap, TOPIC, [(key(k), None) for k in range(DELETED)])
    finally:
        assert node.stop() == 0
    want = latest_per_key(acked)
    tombstones = {(p, o) for p, o, _, v in want if v is None}
    assert len(tombstones) == DELETED

    config = dataclasses.replace(sqlite_catalog.config, namespace=f"k{uuid.uuid4().hex[:8]}", maintenance_interval_ms=0)
    assert compact_in_cycles(data_dir, config, TOPIC) >= UPDATES + 1
    identifier = f"{config.namespace}.{TOPIC}"
    table = load_catalog(config).load_table(identifier)
    live = sorted((p, o, k, v) for p, o, k, v in want if v is not None)
    assert sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["key_raw"], r["value_raw"]) for r in rows_pyiceberg(table)) == live
    assert kafka_view(data_dir, tmp_path / "compacted.log") == want  # the tombstones are served

    catalog = register_catalog(spark_session, sqlite_catalog.target)
    rewrite_all(spark_session, catalog, identifier)
    table = table.refresh()
    assert not tombstones & offsets_in_files(table), "the rewrite applied the deletes: the tombstones are in no table file"
    assert maintain(data_dir, config, TOPIC).reindexed_partitions == PARTITIONS
    expire_all_but_current(spark_session, catalog, identifier)  # the files before the rewrite are deleted
    assert kafka_view(data_dir, tmp_path / "rewritten.log") == want  # the tombstones are still served, at their offsets

    table = table.refresh()
    assert sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["key_raw"], r["value_raw"]) for r in rows_pyiceberg(table)) == live  # no row of a deleted key
    kept_dir = local(f"{table.location()}/data/{kept_tombstones.KEPT}")
    (kept,) = list(kept_dir.iterdir())  # one file for the re-index's round

    # a second rewrite: the kept file is carried on, not written again
    rewrite_all(spark_session, catalog, identifier)
    assert maintain(data_dir, config, TOPIC).reindexed_partitions == PARTITIONS
    expire_all_but_current(spark_session, catalog, identifier)
    assert list(kept_dir.iterdir()) == [kept]
    assert kafka_view(data_dir, tmp_path / "rewritten-twice.log") == want


def test_the_tombstones_still_served_are_those_within_retention_and_the_ranges_last_record(tmp_path):
    """kept_tombstones.served over one removal object: offsets 10 and 11 superseded (hidden at
    once), 12-14 tombstones whose retention ends at 1000, 20 a tombstone superseded later, 30 a
    tombstone at the compacted range's end."""
    rows = {0: (np.array([10, 11, 12, 13, 14, 20, 20, 30]), np.array([0, 0, 1000, 1000, 2000, 1000, 0, 1000]))}
    data, at = removals.encode(rows)

    (tmp_path / "removed.arrow").write_bytes(data)

    async def served(now_ms: int, first: int = 0, last: int = 30) -> list[int]:
        objects = load_object_store(f"file://{tmp_path}")
        try:
            return (await kept_tombstones.served(objects, [Removal("removed.arrow", *at[0])], first, last, now_ms)).tolist()
        finally:
            await objects.close()

    assert asyncio.run(served(999)) == [12, 13, 14, 30]
    assert asyncio.run(served(1000)) == [14, 30]  # retention ends at 1000: no longer served from then
    assert asyncio.run(served(5000)) == [30]  # the range's last record stays
    assert asyncio.run(served(999, first=13, last=20)) == [13, 14]  # within the run only; 20 was superseded

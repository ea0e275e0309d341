"""A compacted topic's table is an upsert table: through the compaction service over a metadata
store and a WAL written here batch by batch, each snapshot holds one row per live key (its latest
value), a key deleted by a tombstone has no row, keys are per Kafka partition, and records younger
than min.compaction.lag.ms stay out of the table until they are old enough. Readers: pyiceberg,
DuckDB and (on the Spark runner) Spark 3.5, through the position deletes each cycle commits."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from compactor.commits.rewrites import live_data_files
from compactor.files.spark import register_catalog
from compactor.maintenance.rounds import rewrite_groups
from metadata.model import ObjectType
from tests.compactor.test_transactions_table import Wal, compaction
from tests.readers import rows_duckdb, rows_pyiceberg, rows_spark
from wal.batch_builder import build_batch

T0 = 1_700_000_000_000
COMPACT = {"cleanup.policy": "compact"}


async def produce(wal: Wal, partition: int, records: list[tuple[bytes | None, bytes | None]], timestamp: int = T0) -> int:
    """One batch of (key, value) records (a None value is a tombstone): its base offset."""
    data = build_batch([(i, timestamp, k, v, ()) for i, (k, v) in enumerate(records)])
    return await wal.write(partition, data, len(records), max_timestamp=timestamp)


def latest(rows: list[dict]) -> list[tuple[int, bytes, int, bytes]]:
    """(partition, key, offset, value) of each row, sorted."""
    return sorted((r["kafka"]["partition"], r["key_raw"], r["kafka"]["offset"], r["value_raw"]) for r in rows)


def deleted_rows(topic: str, why: str) -> float:
    return REGISTRY.get_sample_value("neve_compactor_upsert_deleted_rows_total", {"topic": topic, "why": why}) or 0.0


@pytest.mark.parametrize("runner", ["in-process", "spark"])
async def test_each_snapshot_holds_one_row_per_live_key(tmp_path: Path, runner, request):
    spark = request.getfixturevalue("spark_session") if runner == "spark" else None
    async with contextlib.AsyncExitStack() as stack:
        metadata, objects, service = await compaction(stack, tmp_path, runner, spark)
        info = await metadata.create_topic(f"kv_{runner.replace('-', '_')}", 2, COMPACT)
        wal = Wal(metadata, objects, info.topic_id)

        # cycle 1: k1 updated within the cycle, in one batch and across two; the same key bytes in
        # partition 1 are another key
        assert await produce(wal, 0, [(b"k1", b"v1"), (b"k2", b"v1"), (b"k1", b"v2")]) == 0
        assert await produce(wal, 0, [(b"k3", b"v1"), (b"k1", b"v3")]) == 3
        assert await produce(wal, 1, [(b"k1", b"p1")]) == 0
        first = await service.compact_topic(metadata.topics()[info.name])
        assert (first.rows, first.rows_superseded, first.tombstones) == (6, 2, 0)
        table = (await service.resources.catalog()).load_table(f"neve.{info.name}")
        want = [(0, b"k1", 4, b"v3"), (0, b"k2", 1, b"v1"), (0, b"k3", 3, b"v1"), (1, b"k1", 0, b"p1")]
        assert latest(rows_pyiceberg(table)) == want
        assert latest(rows_duckdb(table)) == want

        # cycle 2: k2 deleted, k3 updated, a new key in partition 1
        assert await produce(wal, 0, [(b"k2", None), (b"k3", b"v2")]) == 5
        assert await produce(wal, 1, [(b"k5", b"p1")]) == 1
        second = await service.compact_topic(metadata.topics()[info.name])
        assert (second.rows, second.rows_superseded, second.tombstones) == (3, 2, 1)  # k2@1 and k3@3 superseded, k2's tombstone
        table = table.refresh()
        want = [(0, b"k1", 4, b"v3"), (0, b"k3", 6, b"v2"), (1, b"k1", 0, b"p1"), (1, b"k5", 1, b"p1")]
        assert latest(rows_pyiceberg(table)) == want
        assert latest(rows_duckdb(table)) == want
        assert latest(rows_pyiceberg(table, first.snapshot_id)) == [(0, b"k1", 4, b"v3"), (0, b"k2", 1, b"v1"), (0, b"k3", 3, b"v1"), (1, b"k1", 0, b"p1")]

        # cycle 3: a deleted key comes back; a key deleted and written again within one batch
        assert await produce(wal, 0, [(b"k2", b"v3"), (b"k6", b"v1"), (b"k6", None), (b"k6", b"v2")]) == 7
        third = await service.compact_topic(metadata.topics()[info.name])
        # k6@8 and its tombstone @9, and k2's tombstone @5 (no row, but served to Kafka readers until
        # then): k2@1 is gone already
        assert (third.rows_superseded, third.tombstones) == (3, 0)
        table = table.refresh()
        want = [(0, b"k1", 4, b"v3"), (0, b"k2", 7, b"v3"), (0, b"k3", 6, b"v2"), (0, b"k6", 10, b"v2"), (1, b"k1", 0, b"p1"), (1, b"k5", 1, b"p1")]
        assert latest(rows_pyiceberg(table)) == want
        assert latest(rows_duckdb(table)) == want
        if spark is not None:
            catalog = register_catalog(spark, service_target(service))
            assert latest(rows_spark(spark, catalog, f"neve.{info.name}")) == want
        assert {e.object_type for p in (0, 1) for e in metadata.entries(info.topic_id, p, 0, 100)} == {ObjectType.PARQUET}
        assert (deleted_rows(info.name, "superseded"), deleted_rows(info.name, "tombstone")) == (7, 1)


def service_target(service):
    from compactor.catalog import catalog_target

    return catalog_target(service.config)


async def test_a_rewrite_between_read_and_commit_makes_the_cycle_compute_its_deletes_again(tmp_path: Path):
    """The table's files are merged after the service last read the table: the deletes it would
    compute name files no longer in the table, so its commit is refused and it computes them
    again against the merged file, leaving one row per key."""
    async with contextlib.AsyncExitStack() as stack:
        metadata, objects, service = await compaction(stack, tmp_path, "in-process")
        info = await metadata.create_topic("merged", 1, COMPACT)
        wal = Wal(metadata, objects, info.topic_id)
        assert await produce(wal, 0, [(b"a", b"1"), (b"b", b"1")]) == 0
        await service.compact_topic(metadata.topics()["merged"])
        assert await produce(wal, 0, [(b"c", b"1")]) == 2
        await service.compact_topic(metadata.topics()["merged"])
        # another process merges the two files (the service keeps the table as its commit left it)
        outside = (await service.resources.catalog()).load_table("neve.merged")
        assert rewrite_groups(outside, [list(live_data_files(outside))], 1 << 30, "merge") == 2
        assert await produce(wal, 0, [(b"a", b"2"), (b"c", b"2")]) == 3
        cycle = await service.compact_topic(metadata.topics()["merged"])
        assert cycle.rows_superseded == 2
        table = outside.refresh()
        want = [(0, b"a", 3, b"2"), (0, b"b", 1, b"1"), (0, b"c", 4, b"2")]
        assert latest(rows_pyiceberg(table)) == want
        assert latest(rows_duckdb(table)) == want


async def test_records_younger_than_min_compaction_lag_wait_in_the_wal(tmp_path: Path):
    async with contextlib.AsyncExitStack() as stack:
        metadata, objects, service = await compaction(stack, tmp_path, "in-process")
        now = [T0 / 1000 + 10]  # the service's clock: 10 s after the first records
        service.planning._clock = service.lag._clock = service.commits._clock = lambda: now[0]  # where the service's parts read it
        info = await metadata.create_topic("lagged", 1, {**COMPACT, "min.compaction.lag.ms": "60000"})
        wal = Wal(metadata, objects, info.topic_id)
        assert await produce(wal, 0, [(b"a", b"1"), (b"b", b"1")], timestamp=T0 - 120_000) == 0  # 2 min old
        assert await produce(wal, 0, [(b"a", b"2")], timestamp=T0) == 2  # 10 s old: waits
        cycle = await service.compact_topic(metadata.topics()["lagged"])
        assert cycle.offsets == {0: (0, 1)}
        table = (await service.resources.catalog()).load_table("neve.lagged")
        assert latest(rows_pyiceberg(table)) == [(0, b"a", 0, b"1"), (0, b"b", 1, b"1")]
        assert [(e.base_offset, e.object_type) for e in metadata.entries(info.topic_id, 0, 0, 100)] == [(0, ObjectType.PARQUET), (2, ObjectType.WAL)]
        assert (await service.compact_topic(metadata.topics()["lagged"])).cycle_id is None
        now[0] += 60  # a minute later the second batch is old enough
        assert (await service.compact_topic(metadata.topics()["lagged"])).offsets == {0: (2, 2)}
        assert latest(rows_pyiceberg(table.refresh())) == [(0, b"a", 2, b"2"), (0, b"b", 1, b"1")]


async def test_a_merge_leaves_the_files_holding_tombstones_until_their_retention_has_passed(tmp_path: Path):
    """Table maintenance merges small files by rewriting their live rows: a tombstone's row is not
    live, so a merge would take it from the Kafka readers it is still served to. Files holding one
    wait until delete.retention.ms has passed since its cycle; the rest merge; the rows stay one
    per live key."""
    import time

    async with contextlib.AsyncExitStack() as stack:
        metadata, objects, service = await compaction(stack, tmp_path, "in-process")
        info = await metadata.create_topic("merging", 1, {**COMPACT, "delete.retention.ms": "60000"})
        wal = Wal(metadata, objects, info.topic_id)
        for records in ([(b"a", b"1"), (b"b", b"1")], [(b"c", b"1")], [(b"b", None)], [(b"d", b"1")]):
            await produce(wal, 0, records)
            await service.compact_topic(metadata.topics()["merging"])
        table = (await service.resources.catalog()).load_table("neve.merging")
        files = sorted(live_data_files(table), key=lambda f: f.file_path)
        assert len(files) == 4
        with_tombstone = _tombstone_files(table)
        assert len(with_tombstone) == 1
        want = [(0, b"a", 0, b"1"), (0, b"c", 2, b"1"), (0, b"d", 4, b"1")]
        assert latest(rows_pyiceberg(table)) == want

        service.maintenance.config = dataclasses.replace(service.maintenance.config, merge_min_files=2)
        assert await service.maintenance.merge(table, "neve.merging", metadata.topics()["merging"]) == 3
        table = table.refresh()
        assert with_tombstone <= {f.file_path for f in live_data_files(table)}  # left as it was
        assert latest(rows_pyiceberg(table)) == want
        assert latest(rows_duckdb(table)) == want

        service.maintenance._clock = lambda: time.time() + 61  # the tombstone's retention has passed
        assert await service.maintenance.merge(table, "neve.merging", metadata.topics()["merging"]) == 2
        table = table.refresh()
        assert not with_tombstone & {f.file_path for f in live_data_files(table)}
        assert latest(rows_pyiceberg(table)) == want
        assert latest(rows_duckdb(table)) == want


def _tombstone_files(table) -> set[str]:
    """The data files a tombstone delete file applies to."""
    from compactor.commits.upsert import TOMBSTONES

    return {t.file.file_path for t in table.scan().plan_files() if any(TOMBSTONES in d.file_path for d in t.delete_files)}

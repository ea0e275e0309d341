"""One cycle, many topics: the tasks of every topic with something due run in one job, a topic that
fails fails alone, and each table holds exactly its topic's acknowledged offsets once. Over what a
stopped `neve dev` node stored for several topics, with the service in this process (runner
in-process: tests/compactor/test_spark_standalone.py runs the same cycle on a Spark cluster)."""

from __future__ import annotations

import asyncio
import functools
import shutil
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from pyiceberg.catalog.sql import SqlCatalog

from compactor.config import CompactorConfig
from compactor.files import job, planner
from compactor.files.planner import ObjectRead, Run, Task
from metadata.model import IndexEntry, ObjectType
from tests.compactor.produced import PARTITIONS, Produced, produce_raw
from tests.compactor.test_maintenance import with_service
from tests.compactor.test_recovery import wal_entries
from tests.compactor.test_service import table_offsets
from tests.fixtures import NeveNode

pytestmark = pytest.mark.integration

TOPICS = 6


@pytest.fixture(scope="module")
def produced(tmp_path_factory) -> tuple[Path, list[Produced]]:
    data_dir = tmp_path_factory.mktemp("many") / "node"
    data_dir.mkdir()
    node = NeveNode(data_dir=data_dir, log_path=data_dir.parent / "node.log", env={"NEVE_WAL_LINGER_MS": "5", "NEVE_COMPACTOR_IN_NODE": "false"}).start()
    try:
        topics = [produce_raw(node.bootstrap, per_codec=3 + i) for i in range(TOPICS)]
    finally:
        assert node.stop() == 0
    return data_dir, topics


def copy_of(produced, tmp_path: Path, **settings) -> tuple[Path, CompactorConfig]:
    copy = tmp_path / "node"
    shutil.copytree(produced[0], copy)
    config = CompactorConfig(
        catalog_url=f"sqlite://{copy / 'catalog.db'}", warehouse=f"file://{copy / 'warehouse'}", runner="in-process", freshness_ms=0, maintenance_interval_ms=0, **settings
    )
    return copy, config


def test_one_cycle_runs_the_tasks_of_every_due_topic_in_one_job_and_each_table_holds_its_own_offsets_once(produced, tmp_path, monkeypatch):
    data_dir, config = copy_of(produced, tmp_path, tables_in_parallel=3)
    jobs = []
    run_cycle = job.run_cycle_in_process

    def counted(work, threads):
        jobs.append(sorted(context.topic for context, _ in work))
        return run_cycle(work, threads)

    monkeypatch.setattr(job, "run_cycle_in_process", counted)

    async def work(service, metadata, _objects):
        cycles = await service.run_once()
        return cycles, [wal_entries(metadata, p.topic) for p in produced[1]], await service.run_once()

    cycles, wal_left, again = asyncio.run(with_service(data_dir, config, None, work))
    topics = sorted(p.topic for p in produced[1])
    assert jobs == [topics]  # one job for the cycle of every topic; the next cycle had nothing due
    assert sorted(c.topic for c in cycles if c.cycle_id is not None) == topics
    assert {c.topic: c.rows for c in cycles} == {p.topic: len(p.want) for p in produced[1]}
    assert wal_left == [0] * TOPICS and [c.cycle_id for c in again] == [None] * TOPICS
    for p in produced[1]:
        assert table_offsets(data_dir, p.topic) == sorted(p.want)


def test_a_topic_whose_task_fails_fails_alone_and_leaves_no_file_and_its_next_cycle_commits_it(produced, tmp_path, monkeypatch):
    data_dir, config = copy_of(produced, tmp_path)
    victim = produced[1][2]
    run_task, plan, raised = job.run_task, planner.plan, []

    def fails_once(context, task, index=0, attempt=0):
        if context.topic == victim.topic and index == 1 and not raised:
            raised.append(task)  # the topic's other task has written its files, or will
            raise OSError("the store refused the task's reads")
        return run_task(context, task, index, attempt)

    monkeypatch.setattr(job, "run_task", fails_once)
    monkeypatch.setattr(planner, "plan", functools.partial(plan, min_task_bytes=1))  # a task per partition

    async def work(service, metadata, _objects):
        first = await service.run_once()
        failed = list(service.failed)
        left = wal_entries(metadata, victim.topic)
        second = await service.run_once()
        return first, failed, left, second

    first, failed, left, second = asyncio.run(with_service(data_dir, config, None, work))
    assert failed == [victim.topic] and left > 0 and len(raised) == 1
    others = sorted(p.topic for p in produced[1] if p is not victim)
    assert sorted(c.topic for c in first if c.cycle_id is not None) == others
    assert [c.topic for c in second if c.cycle_id is not None] == [victim.topic]
    for p in produced[1]:
        assert table_offsets(data_dir, p.topic) == sorted(p.want)
    # the failed attempt's files were deleted: the table's data directory holds only committed files
    warehouse = data_dir / "warehouse"
    on_disk = {str(f) for f in warehouse.rglob("*.parquet")}
    catalog = SqlCatalog("neve", uri=f"sqlite:///{data_dir / 'catalog.db'}", warehouse=f"file://{warehouse}")
    committed = {path.removeprefix("file://") for p in produced[1] for path in catalog.load_table("neve." + p.topic.replace("-", "_")).inspect.files().column("file_path").to_pylist()}
    assert on_disk == committed


def test_the_lag_of_every_topic_is_exported_at_every_cycle(produced, tmp_path):
    """The lag each topic had when the cycle planned it, then (all compacted) none, at the next."""
    data_dir, config = copy_of(produced, tmp_path)

    def lags() -> list[float]:
        return [sum(REGISTRY.get_sample_value("neve_compactor_table_lag_offsets", {"topic": p.topic, "partition": str(part)}) for part in range(PARTITIONS)) for p in produced[1]]

    async def work(service, _metadata, _objects):
        await service.run_once()
        planned = lags()
        await service.run_once()
        return planned, lags()

    planned, after = asyncio.run(with_service(data_dir, config, None, work))
    assert planned == [len(p.want) for p in produced[1]] and after == [0] * TOPICS


def _task(topic: str, size: int) -> Task:
    entry = IndexEntry(0, 0, f"{topic}-obj", ObjectType.WAL, 0, size, 0)
    return Task((Run(topic, 0, (entry,), 0),), (ObjectRead(entry.object_key, 0, size),))


def test_a_jobs_bundles_are_about_as_many_bytes_whatever_the_number_of_topics():
    sizes = [900, 10, 10, 10, 500, 400, 10, 10, *([1] * 1000)]
    items = [(w, None, 0, _task(f"t{w}", size)) for w, size in enumerate(sizes)]
    bundles = job.bundle(items, 2)
    assert len(bundles) == 2
    assert sorted(item[0] for b in bundles for item in b) == list(range(len(sizes)))  # each task once
    loads = sorted(sum(item[3].size for item in b) for b in bundles)
    assert loads[1] - loads[0] <= max(sizes)  # the largest first, each to the lighter bundle
    assert all([item[0] for item in b] == sorted(item[0] for item in b) for b in bundles)
    assert len(job.bundle(items[:1], 8)) == 1 and job.bundle(items[:3], 8) == [[items[0]], [items[1]], [items[2]]]


def test_the_first_maintenance_rounds_of_many_tables_are_spread_over_the_interval():
    """A compactor starting with a thousand tables does not merge and expire all of them in its
    first cycle (which the freshness of every topic waits for): each table's first round comes at a
    phase of its own within the interval."""
    from compactor.maintenance.rounds import TableMaintenance

    now = [1_000.0]
    maintenance = TableMaintenance(CompactorConfig(maintenance_interval_ms=600_000), None, None, spark=None, clock=lambda: now[0])
    first = sorted(maintenance._first_phase(f"neve.topic_{i}", now[0], 600.0) + 600.0 for i in range(1_000))
    assert now[0] <= first[0] and first[-1] < now[0] + 600.0
    per_minute = [sum(1 for t in first if now[0] + 60 * m <= t < now[0] + 60 * (m + 1)) for m in range(10)]
    assert all(60 <= n <= 140 for n in per_minute), per_minute

"""A topic whose cycle fails recovers without a restart, and a failing topic is reported: records
confluent-kafka produced to `neve dev` (its compactor off) are compacted by a compaction service in
this process over the stopped node's data dir, one WAL entry of a partition a cycle, while the
service's metadata store, tasks or maintenance fail, or its lead is lost, as a test makes them."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from compactor.config import CompactorConfig
from compactor.service import failures, planning
from metadata.model import ObjectType
from metadata.store import MetadataUnavailable
from tests.compactor.produced import Produced, produce_raw
from tests.compactor.test_maintenance import with_service
from tests.compactor.test_service import table_offsets
from tests.fixtures import NeveNode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROUNDS = 60  # run_once rounds a test allows: many more than the cycles its records need


@pytest.fixture(scope="module")
def produced(tmp_path_factory) -> tuple[Path, Produced]:
    data_dir = tmp_path_factory.mktemp("recovery") / "node"
    data_dir.mkdir()
    node = NeveNode(data_dir=data_dir, log_path=data_dir.parent / "node.log", env={"NEVE_WAL_LINGER_MS": "5", "NEVE_COMPACTOR_IN_NODE": "false"}).start()
    try:
        p = produce_raw(node.bootstrap, per_codec=6)
    finally:
        assert node.stop() == 0
    return data_dir, p


@pytest.fixture
def one_entry_a_cycle(monkeypatch):
    monkeypatch.setattr(planning, "MAX_ENTRIES_PER_PARTITION", 1)


def copy_of(produced, tmp_path: Path) -> tuple[Path, CompactorConfig]:
    copy = tmp_path / "node"
    shutil.copytree(produced[0], copy)
    config = CompactorConfig(
        catalog_url=f"sqlite://{copy / 'catalog.db'}", warehouse=f"file://{copy / 'warehouse'}", runner="in-process", freshness_ms=0, maintenance_interval_ms=0
    )
    return copy, config


def wal_entries(metadata, topic: str) -> int:
    info = metadata.topics()[topic]
    return sum(e.object_type == ObjectType.WAL for p in range(info.partitions) for e in metadata.entries(info.topic_id, p, 0, max_entries=10_000))


async def run_until_compacted(service, metadata, topic: str) -> int:
    """run_once until the topic has no WAL entry left (at most ROUNDS): the rounds it took."""
    for rounds in range(1, ROUNDS + 1):
        await service.run_once()
        if wal_entries(metadata, topic) == 0:
            return rounds
    raise AssertionError(f"{wal_entries(metadata, topic)} WAL entries of {topic} left after {ROUNDS} cycles")


def failing(topic: str, reason: str) -> float | None:
    return REGISTRY.get_sample_value("neve_compactor_topic_failing", {"topic": topic, "reason": reason})


def test_a_swap_failed_after_its_commit_is_finished_by_the_next_cycle_without_a_restart(produced, tmp_path, one_entry_a_cycle):
    data_dir, config = copy_of(produced, tmp_path)
    p = produced[1]

    async def work(service, metadata, _objects):
        replace, calls = metadata.replace_entries, []

        async def times_out_once(*args, **kwargs):  # etcd timing out on the first swap, after its commit
            calls.append(args[:2])
            if len(calls) == 1:
                raise MetadataUnavailable("etcd transaction timed out")
            return await replace(*args, **kwargs)

        metadata.replace_entries = times_out_once
        await run_until_compacted(service, metadata, p.topic)
        return len(calls)

    swaps = asyncio.run(with_service(data_dir, config, None, work))
    assert swaps > 2
    assert table_offsets(data_dir, p.topic) == sorted(p.want)  # every offset once


def test_a_topic_failing_in_a_row_is_reported_and_a_failed_maintenance_apart(produced, tmp_path, one_entry_a_cycle, caplog):
    caplog.set_level(logging.INFO, logger="neve")
    data_dir, config = copy_of(produced, tmp_path)
    p = produced[1]

    async def work(service, metadata, _objects):
        run_job, maintain = service._run_job, service.maintenance.maintain
        poisoned = []

        async def poison(due):
            if len(poisoned) < failures.FAILING_AFTER:
                poisoned.append(due)
                raise ValueError("a batch that cannot become rows")
            return await run_job(due)

        service._run_job = poison
        seen = []
        for _ in range(failures.FAILING_AFTER):
            assert [c.cycle_id for c in await service.run_once()] == []
            seen.append(failing(p.topic, "ValueError"))
            assert service.failed == [p.topic]
        lag = [REGISTRY.get_sample_value("neve_compactor_table_lag_offsets", {"topic": p.topic, "partition": str(part)}) for part in range(2)]

        maintained = []

        async def fails_once(*args, **kwargs):
            maintained.append(args)
            if len(maintained) == 1:
                raise RuntimeError("the catalog refused the merge")
            return await maintain(*args, **kwargs)

        service.maintenance.maintain = fails_once
        first = await service.run_once()  # the topic's tasks run again: it recovers; its maintenance fails
        assert [c.cycle_id is not None for c in first] == [True] and service.failed == []
        recovered = failing(p.topic, "ValueError")
        maintenance_failures = REGISTRY.get_sample_value("neve_compactor_maintenance_failures_total", {"topic": p.topic, "reason": "RuntimeError"})
        second = await service.run_once()  # the next cycle is not stopped by it
        assert [c.cycle_id is not None for c in second] == [True] and len(maintained) == 2
        assert failing(p.topic, "RuntimeError") is None
        return seen, lag, recovered, maintenance_failures

    seen, lag, recovered, maintenance_failures = asyncio.run(with_service(data_dir, config, None, work))
    assert seen == [None, None, float(failures.FAILING_AFTER)]
    assert all(n and n > 0 for n in lag)  # the lag is there to see while the topic fails
    assert (recovered, maintenance_failures) == (0.0, 1.0)
    failed = [r for r in caplog.records if r.getMessage() == "topic's compaction failed; it is retried next cycle"]
    assert [(r.reason, r.failures, r.exc_info is not None) for r in failed] == [("ValueError", 1, True), ("ValueError", 2, False), ("ValueError", 3, False)]
    assert [r.levelno for r in failed] == [logging.WARNING, logging.WARNING, logging.ERROR]
    assert [r.topic for r in caplog.records if r.getMessage() == "topic's compaction recovered"] == [p.topic]
    assert [r.reason for r in caplog.records if r.getMessage() == "table maintenance failed; retried at its next round"] == ["RuntimeError"]


def test_a_compactor_that_loses_its_lead_mid_cycle_stops_before_its_commit_and_the_next_leader_compacts_all(produced, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="neve")
    data_dir, config = copy_of(produced, tmp_path)
    p = produced[1]

    async def work(service, metadata, _objects):
        service.leadership = await metadata.campaign("compactor", "first")
        successor = await metadata.campaign("compactor", "second")
        run_job = service._run_job

        async def deposed_meanwhile(due):
            await service.leadership.resign()  # as a lease lapsing would: the other holder leads
            return await run_job(due)

        service._run_job = deposed_meanwhile
        assert await service.run_once() == []
        nothing = table_offsets(data_dir, p.topic)
        service._run_job, service.leadership = run_job, successor
        assert successor.is_leader()
        await run_until_compacted(service, metadata, p.topic)
        return nothing

    assert asyncio.run(with_service(data_dir, config, None, work)) == []  # no commit after the lead was lost
    assert table_offsets(data_dir, p.topic) == sorted(p.want)
    assert [r.getMessage() for r in caplog.records if "leadership lost" in r.getMessage()] == ["compactor leadership lost; this run stops"]

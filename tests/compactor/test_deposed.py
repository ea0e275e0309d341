"""A deposed compactor cannot duplicate or lose a row: two compaction services over one real etcd
(each its own metadata store, so its own lease), the WAL of a running `neve dev` node on that etcd.
The first leads and plans every WAL entry; while its task runs its lease is revoked and the second
takes the lead. The first has not noticed (a paused process: its clock still says it leads), so it
goes on: its Iceberg commit, which etcd cannot fence, lands before or after the new leader's over
the same offsets, and its index swap is refused (Fenced). Either way the table holds each offset
once, the new leader's cycles go on, and the Kafka view is what was produced."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from pathlib import Path

import pytest

from compactor.config import CompactorConfig
from compactor.service.loop import CompactionService
from metadata.model import ObjectType
from metadata.store import load_metadata_store
from registry.client import StoreLookup
from tests.compactor.produced import produce_raw
from tests.compactor.test_service import consume_all, counts_of, table_offsets, wait_for_table
from tests.fixtures import NeveNode
from wal.store import load_object_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

LEAD_S = 60.0  # generous bound for a lead to change hands


@pytest.mark.parametrize("first_to_commit", ["deposed", "leader"])
def test_a_compactor_deposed_mid_cycle_duplicates_no_row_and_the_new_leader_goes_on(etcd_server, tmp_path, caplog, first_to_commit):
    caplog.set_level(logging.INFO, logger="neve")
    metadata_url = f"{etcd_server.url}/deposed-{uuid.uuid4().hex[:8]}"
    data_dir = (tmp_path / "node").resolve()
    data_dir.mkdir()
    node = NeveNode(data_dir=data_dir, log_path=tmp_path / "node.log", env={"NEVE_WAL_LINGER_MS": "5", "NEVE_COMPACTOR_IN_NODE": "false", "NEVE_METADATA_URL": metadata_url}).start()
    try:
        p = produce_raw(node.bootstrap, per_codec=6)
        before = consume_all(node.bootstrap, p.topic, counts_of(p))
        config = CompactorConfig(
            catalog_url=f"sqlite://{data_dir / 'catalog.db'}", warehouse=f"file://{data_dir / 'warehouse'}", runner="in-process", freshness_ms=0, maintenance_interval_ms=0
        )
        outcome = asyncio.run(two_compactors(metadata_url, data_dir, config, p.topic, first_to_commit))
        assert outcome["deposed_cycles"] == [] and outcome["wal_left"] == 0
        assert table_offsets(data_dir, p.topic) == sorted(p.want)  # each offset once
        assert consume_all(node.bootstrap, p.topic, counts_of(p)) == before
        # the new leader's cycles go on: a later produce is compacted too
        later = produce_raw(node.bootstrap, per_codec=1)
        asyncio.run(leader_compacts(metadata_url, data_dir, config))
        wait_for_table(data_dir, later)
        assert consume_all(node.bootstrap, later.topic, counts_of(later)) and table_offsets(data_dir, p.topic) == sorted(p.want)
    finally:
        assert node.stop() == 0
    lost = [r for r in caplog.records if r.getMessage() == "compactor leadership lost; this run stops"]
    refused = [r for r in caplog.records if r.getMessage() == "cycle not committed: another cycle holds its offsets"]
    finished = [r for r in caplog.records if r.getMessage() == "finished the index swap of a committed cycle"]
    if first_to_commit == "deposed":  # its commit landed, its swap was fenced; the leader swapped that cycle instead of compacting it again
        assert len(lost) == 1 and "no longer held" in lost[0].reason
        assert (outcome["leader_cycles"], refused, len(finished)) == ([], [], 1)
    else:  # the leader's cycle went first: the deposed one's commit is refused and its files deleted
        assert (lost, len(refused), finished) == ([], 1, [])
        assert outcome["leader_cycles"]


async def service_on(stack: contextlib.AsyncExitStack, metadata_url: str, objects_url: str, config: CompactorConfig, lease_ttl_s: int) -> CompactionService:
    """A compaction service on a metadata store of its own (its own lease, as another process's
    would be), closed with `stack`."""
    metadata = load_metadata_store(metadata_url, lease_ttl_s=lease_ttl_s)
    await metadata.start()
    stack.push_async_callback(metadata.close)
    objects = load_object_store(objects_url)
    stack.push_async_callback(objects.close)
    lookup = StoreLookup(metadata)
    stack.push_async_callback(lookup.close)
    service = CompactionService(config, metadata, objects, objects_url, lookup)
    stack.push_async_callback(service.close)
    return service


async def two_compactors(metadata_url: str, data_dir: Path, config: CompactorConfig, topic: str, first_to_commit: str) -> dict:
    objects_url = f"file://{data_dir / 'objects'}"
    async with contextlib.AsyncExitStack() as stack:

        async def compactor(name: str, lease_ttl_s: int) -> CompactionService:
            service = await service_on(stack, metadata_url, objects_url, config, lease_ttl_s)
            service.leadership = await service.metadata.campaign("compactor", name)
            return service

        deposed = await compactor("deposed", 30)
        assert await deposed.leadership.wait_leading(LEAD_S)
        leader = await compactor("leader", 2)
        assert not leader.leadership.is_leader()

        in_task, go_on = asyncio.Event(), asyncio.Event()
        run_job = deposed._run_job

        async def paused(due):
            in_task.set()
            await go_on.wait()
            return await run_job(due)

        deposed._run_job = paused
        deposed_run = asyncio.create_task(deposed.run_once())
        await asyncio.wait_for(in_task.wait(), LEAD_S)

        # Its lease revoked while its task runs: its key goes, the other compactor takes the lead.
        key = deposed.metadata.keys.leader("compactor")
        held = await leader.metadata._client.get(key)
        await leader.metadata._client.revoke_lease(held.lease)
        deposed.leadership.is_leader = lambda: True  # paused: it has not noticed
        assert await leader.leadership.wait_leading(LEAD_S)
        assert leader.leadership.fence() != deposed.leadership.fence()

        leader_cycles = []
        if first_to_commit == "leader":
            leader_cycles += [c for c in await leader.run_once() if c.cycle_id is not None]
        go_on.set()
        deposed_cycles = [c for c in await deposed_run if c.cycle_id is not None]
        for _ in range(5):  # a run finishes what the deposed compactor left, the next finds nothing due
            cycles = [c for c in await leader.run_once() if c.cycle_id is not None]
            leader_cycles += cycles
            if not cycles and wal_entries(leader.metadata, topic) == 0:
                break
        return {"deposed_cycles": deposed_cycles, "leader_cycles": leader_cycles, "wal_left": wal_entries(leader.metadata, topic)}


async def leader_compacts(metadata_url: str, data_dir: Path, config: CompactorConfig) -> None:
    """One compactor (the new leader) cycling until nothing is due."""
    async with contextlib.AsyncExitStack() as stack:
        service = await service_on(stack, metadata_url, f"file://{data_dir / 'objects'}", config, lease_ttl_s=2)
        service.leadership = await service.metadata.campaign("compactor", "leader")
        assert await service.leadership.wait_leading(LEAD_S)
        for _ in range(20):
            if not [c for c in await service.run_once() if c.cycle_id is not None]:
                break


def wal_entries(metadata, topic: str) -> int:
    info = metadata.topics()[topic]
    return sum(e.object_type == ObjectType.WAL for p in range(info.partitions) for e in metadata.entries(info.topic_id, p, 0, max_entries=10_000))

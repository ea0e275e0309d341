"""Compactors sharing the topics (sharing.py): the rendezvous assignment (pure), and the membership
over a metadata store: each live compactor takes its own share, one that leaves gives its topics
to the others, and one compactor of them drops deleted topics' tables."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from compactor import metrics
from compactor.config import CompactorConfig
from compactor.maintenance.retention import TopicDrops
from compactor.service.loop import CompactionService
from compactor.service.sharing import MEMBERS, Sharing, owner, weight
from metadata.embedded import EmbeddedMetadataStore
from tests.compactor.produced import produce_raw
from tests.compactor.test_deposed import service_on, wal_entries
from tests.compactor.test_service import consume_all, counts_of, table_offsets
from tests.fixtures import NeveNode

TOPICS = [uuid.uuid5(uuid.NAMESPACE_URL, f"topic-{i}") for i in range(1000)]  # fixed: the assertions are exact
EVEN_WITHIN = 0.15  # a share of n topics over m members is within 15% of n/m (binomial: about 3 standard deviations at 1,000 over 3)


def assignment(members: list[str]) -> dict[uuid.UUID, str]:
    return {t: owner(members, t) for t in TOPICS}


def test_the_weight_is_the_same_in_every_process():
    # blake2b of the member's name and the topic id's bytes; Python's hash() would differ per process
    assert weight("compactor-members/a", uuid.UUID(int=0)) == 17379668115803592087
    assert owner([], TOPICS[0]) is None
    assert owner(["only"], TOPICS[0]) == "only"


def test_topics_divide_within_a_bound_of_even():
    members = [f"{MEMBERS}host-{i}:{100 + i}" for i in range(3)]
    shares = Counter(assignment(members).values())
    assert set(shares) == set(members) and sum(shares.values()) == len(TOPICS)
    for member, n in shares.items():
        assert abs(n - len(TOPICS) / 3) <= EVEN_WITHIN * len(TOPICS) / 3, (member, n)
    # the order the members are listed in changes nothing
    assert assignment(list(reversed(members))) == assignment(members)


def test_a_member_that_joins_takes_only_the_topics_it_now_wins():
    members = [f"{MEMBERS}host-{i}:1" for i in range(3)]
    before = assignment(members)
    newcomer = f"{MEMBERS}host-new:1"
    after = assignment([*members, newcomer])
    moved = {t for t in TOPICS if before[t] != after[t]}
    assert moved and {after[t] for t in moved} == {newcomer}  # every topic that moves, moves to the newcomer
    assert moved == {t for t in TOPICS if after[t] == newcomer}
    assert abs(len(moved) - len(TOPICS) / 4) <= EVEN_WITHIN * len(TOPICS) / 4


def test_a_member_that_leaves_gives_up_only_its_own_topics():
    members = [f"{MEMBERS}host-{i}:1" for i in range(4)]
    before = assignment(members)
    leaver = members[1]
    after = assignment([m for m in members if m != leaver])
    moved = {t for t in TOPICS if before[t] != after[t]}
    assert moved == {t for t in TOPICS if before[t] == leaver}
    assert leaver not in after.values()
    assert len({after[t] for t in moved}) == 3  # spread over the others, not dumped on one


async def test_compactors_on_one_store_divide_the_topics_and_one_that_leaves_gives_its_share_to_the_others():
    store = EmbeddedMetadataStore(None)
    await store.start()
    try:
        ids = [(await store.create_topic(f"t{i}", 2)).topic_id for i in range(30)]
        a, b = Sharing(store, "a:1"), Sharing(store, "b:2")
        await a.start()
        assert await a.refresh() is True  # alone: every topic, gained
        assert all(a.owns(t) for t in ids)
        for i in range(30):  # a's lag gauges, as its cycles export them
            metrics.set_lag(f"t{i}", 1, 5, 2.0)
        cycling = CompactionService(CompactorConfig(), store, None, "", None)  # a's service, over its share
        cycling._owning([info for info in store.topics().values() if a.owns(info.topic_id)])
        await b.start()
        assert await b.refresh() is True
        assert await a.refresh() is False  # a gained nothing: it only lost b's share
        cycling._owning([info for info in store.topics().values() if a.owns(info.topic_id)])
        # a reports the lag of its own topics only: b's are b's to report
        reported = [REGISTRY.get_sample_value("neve_compactor_table_lag_seconds", {"topic": f"t{i}", "partition": "1"}) for i in range(30)]
        assert reported == [2.0 if a.owns(t) else None for t in ids]
        assert a.members == b.members == (MEMBERS + "a:1", MEMBERS + "b:2")
        owners = [(a.owns(t), b.owns(t)) for t in ids]
        assert all(x != y for x, y in owners)  # each topic exactly one owner
        assert [b.owns(t) for t in ids] == [owner(b.members, t) == b.name for t in ids]
        assert 0 < sum(y for _, y in owners) < len(ids)

        # one compactor of them drops deleted topics' tables: the first to hold "compactor"
        drops_a, drops_b = TopicDrops(store, "neve", str), TopicDrops(store, "neve", str)
        assert a.drops_tables(drops_a) and not b.drops_tables(drops_b)

        await a.stop()
        assert await b.refresh() is True and all(b.owns(t) for t in ids)
        assert await a.refresh() is False and not any(a.owns(t) for t in ids) and a.members == (b.name,)
        drops_b._started = True  # as if it had checked under a lead it lost since: it starts afresh
        assert b.drops_tables(drops_b) and not drops_b._started
    finally:
        await store.close()


# -- the handover window, on real etcd ---------------------------------------------------------------

LEAD_S = 60.0  # generous bound for a membership to be taken


@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize("first_to_commit", ["old owner", "new owner"])
def test_two_owners_of_a_topic_in_the_handover_window_commit_each_offset_once(etcd_server, tmp_path, caplog, first_to_commit):
    """A compactor alone plans a topic's entries; a second one joins and wins the topic, and plans
    the same entries before the first has read the new member list. Both commit: the second to
    commit is refused (the table holds those offsets). When the old owner went first, its
    membership lapses before its index swap: the new owner's next cycle finishes that swap. Each
    offset is in the table once, the WAL entries are all swapped, the Kafka view is unchanged."""
    caplog.set_level(logging.INFO, logger="neve")
    metadata_url = f"{etcd_server.url}/sharing-{uuid.uuid4().hex[:8]}"
    data_dir = (tmp_path / "node").resolve()
    data_dir.mkdir()
    node = NeveNode(data_dir=data_dir, log_path=tmp_path / "node.log", env={"NEVE_WAL_LINGER_MS": "5", "NEVE_COMPACTOR_IN_NODE": "false", "NEVE_METADATA_URL": metadata_url}).start()
    try:
        p = produce_raw(node.bootstrap, per_codec=6)
        before = consume_all(node.bootstrap, p.topic, counts_of(p))
        config = CompactorConfig(
            catalog_url=f"sqlite://{data_dir / 'catalog.db'}", warehouse=f"file://{data_dir / 'warehouse'}", runner="in-process", freshness_ms=0, maintenance_interval_ms=0
        )
        outcome = asyncio.run(two_owners(metadata_url, data_dir, config, p.topic, first_to_commit))
        assert outcome["wal_left"] == 0
        assert table_offsets(data_dir, p.topic) == sorted(p.want)  # each offset once
        assert consume_all(node.bootstrap, p.topic, counts_of(p)) == before
    finally:
        assert node.stop() == 0
    refused = [r for r in caplog.records if r.getMessage() == "cycle not committed: another cycle holds its offsets"]
    finished = [r for r in caplog.records if r.getMessage() == "finished the index swap of a committed cycle"]
    lost = [r for r in caplog.records if r.getMessage() == "compactor leadership lost; this run stops"]
    assert outcome["old_cycles"] == [] and len(refused) == 1
    if first_to_commit == "old owner":  # its commit landed, its swap did not: the new owner swapped its cycle
        # (its run stopped after the commit; its next run, membership still lost, stopped at once)
        assert (len(lost), len(finished), outcome["new_cycles"]) == (2, 1, [])
    else:  # the new owner's cycle went first, swapped; the old owner's commit was refused
        assert (lost, finished, len(outcome["new_cycles"])) == ([], [], 1)


async def two_owners(metadata_url: str, data_dir: Path, config: CompactorConfig, topic: str, first_to_commit: str) -> dict:
    objects_url = f"file://{data_dir / 'objects'}"
    async with contextlib.AsyncExitStack() as stack:

        async def compactor(member_id: str) -> CompactionService:
            service = await service_on(stack, metadata_url, objects_url, config, lease_ttl_s=2)
            service.sharing = Sharing(service.metadata, member_id)
            service.leadership = await service.sharing.start()
            assert await service.leadership.wait_leading(LEAD_S)
            return service

        def paused(service: CompactionService) -> tuple[asyncio.Event, asyncio.Event]:
            in_task, go_on = asyncio.Event(), asyncio.Event()
            run_job = service._run_job

            async def run(due):
                in_task.set()
                await go_on.wait()
                return await run_job(due)

            service._run_job = run
            return in_task, go_on

        old = await compactor("old:1")
        topic_id = old.metadata.topics()[topic].topic_id
        newcomer = next(f"new:{i}" for i in range(100) if owner([old.sharing.name, MEMBERS + f"new:{i}"], topic_id) == MEMBERS + f"new:{i}")
        old_in_task, old_go_on = paused(old)
        old_run = asyncio.create_task(old.run_once())  # alone: it owns the topic, and plans its entries
        await asyncio.wait_for(old_in_task.wait(), LEAD_S)

        new = await compactor(newcomer)  # joins, and wins the topic
        new_in_task, new_go_on = paused(new)
        new_run = asyncio.create_task(new.run_once())
        await asyncio.wait_for(new_in_task.wait(), LEAD_S)  # the same entries planned by both
        assert new.sharing.owns(topic_id) and old.sharing.owns(topic_id)

        if first_to_commit == "old owner":
            lapse = old.faults.at

            def lapse_after_commit(point: str) -> None:  # its lease lapses between its commit and its swap
                if point == "committed":
                    old.leadership.is_leader = lambda: False
                lapse(point)

            old.faults.at = lapse_after_commit
            old_go_on.set()
            old_cycles = [c for c in await old_run if c.cycle_id is not None]  # committed, then stopped at the lost membership
            new_go_on.set()
            new_cycles = [c for c in await new_run if c.cycle_id is not None]  # refused: the table holds them
        else:
            new_go_on.set()
            new_cycles = [c for c in await new_run if c.cycle_id is not None]
            old_go_on.set()
            old_cycles = [c for c in await old_run if c.cycle_id is not None]  # refused
        assert await old.run_once() == [] and not old.sharing.owns(topic_id)  # its next run: the topic is not its own
        for _ in range(5):  # the new owner finishes what is left, then finds nothing due
            if not [c for c in await new.run_once() if c.cycle_id is not None] and wal_entries(new.metadata, topic) == 0:
                break
        return {"old_cycles": old_cycles, "new_cycles": new_cycles, "wal_left": wal_entries(new.metadata, topic)}

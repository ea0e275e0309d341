"""The etcd store's range replace across brokers, against a real etcd: stores racing to replace
one range, a replace while other stores keep committing to the partition, followers and fresh
loads seeing it, and a wal-index record shared by partitions going exactly when its last
partition's entries are replaced."""

from __future__ import annotations

import asyncio

import pytest

from metadata.model import IndexEntry, ObjectType
from tests.metadata.helpers import append, commit, open_etcd_store

PARQUET = ObjectType.PARQUET
pytestmark = pytest.mark.integration


async def until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def wal_index_keys(store, object_key: str) -> list[bytes]:
    return [kv.key for kv in await store._client.get_prefix(store.keys.wal_indexes(object_key))]


async def test_stores_racing_to_replace_one_range_one_wins(etcd_server):
    stores = [await open_etcd_store(etcd_server, "race-replace") for _ in range(3)]
    try:
        t = (await stores[0].create_topic("t", 1)).topic_id
        for n in range(4):
            await stores[0].commit(commit(append(t, 0, 0, 10, 5), key=f"wal/{n}"))
        await until(lambda: all(len(s.entries(t, 0, 0)) == 4 for s in stores), "every store to see four entries")
        replaced = stores[0].entries(t, 0, 0)[:3]
        won = await asyncio.gather(*(s.replace_entries(t, 0, replaced, IndexEntry(0, 14, f"table/by-{i}", PARQUET, 0, 15, 0)) for i, s in enumerate(stores)))
        assert sorted(won) == [False, False, True]
        winner = f"table/by-{won.index(True)}"
        await until(lambda: all(s.entries(t, 0, 0)[0].object_key == winner for s in stores), "every store to see the winner's entry")
        for s in stores:
            assert [(e.base_offset, e.last_offset, e.object_key) for e in s.entries(t, 0, 0)] == [(0, 14, winner), (15, 19, "wal/3")]
    finally:
        for s in stores:
            await s.close()


async def test_replaces_while_other_stores_commit_to_the_partition(etcd_server):
    """Two brokers keep committing to the partition while a third replaces its oldest WAL
    entries, round after round; a fresh store loading at the end sees the same entries."""
    writers = [await open_etcd_store(etcd_server, "busy-replace") for _ in range(2)]
    compactor = await open_etcd_store(etcd_server, "busy-replace")
    stop = asyncio.Event()
    try:
        t = (await compactor.create_topic("t", 2)).topic_id
        await until(lambda: all("t" in w.topics() for w in writers), "the writers to see the topic")

        async def produce(i, writer) -> None:
            n = 0
            while not stop.is_set():
                results = await writer.commit(commit(append(t, 0, 0, 10, 3), append(t, 1, 10, 10, 1), key=f"wal/{i}-{n:04d}"))
                assert {r.error_code for r in results} == {0}
                n += 1

        producing = [asyncio.create_task(produce(i, w)) for i, w in enumerate(writers)]
        rounds = 0
        while rounds < 8:
            wal = [e for e in compactor.entries(t, 0, 0, max_entries=100_000) if e.object_type is ObjectType.WAL]
            if len(wal) < 4:
                await asyncio.sleep(0.01)
                continue
            chosen = wal[:4]
            if await compactor.replace_entries(t, 0, chosen, IndexEntry(chosen[0].base_offset, chosen[-1].last_offset, f"table/{rounds}", PARQUET, 0, 12, 0)):
                rounds += 1
        stop.set()
        await asyncio.gather(*producing)
        high = max(w.high_watermark(t, 0) for w in writers)
        await until(lambda: compactor.high_watermark(t, 0) == high, "the compactor's view to reach the writers'")
        entries = compactor.entries(t, 0, 0, max_entries=100_000)
        assert [e.base_offset for e in entries] == [0] + [e.last_offset + 1 for e in entries[:-1]] and entries[-1].last_offset + 1 == high
        assert [e.object_key for e in entries if e.object_type is PARQUET] == [f"table/{r}" for r in range(8)]
        fresh = await open_etcd_store(etcd_server, "busy-replace")
        try:
            assert fresh.entries(t, 0, 0, max_entries=100_000) == entries
            assert fresh.entries(t, 1, 0, max_entries=100_000) == compactor.entries(t, 1, 0, max_entries=100_000)
        finally:
            await fresh.close()
        for w in writers:
            await until(lambda w=w: w.entries(t, 0, 0, max_entries=100_000) == entries, "a writer's view to match")
    finally:
        stop.set()
        for s in (*writers, compactor):
            await s.close()


async def test_a_shared_wal_index_record_goes_when_its_last_partition_is_replaced(etcd_server):
    store = await open_etcd_store(etcd_server, "shared-record")
    try:
        t = (await store.create_topic("t", 3)).topic_id
        await store.commit(commit(append(t, 0, 0, 10, 2), append(t, 1, 10, 10, 2), append(t, 2, 20, 10, 2), key="wal/shared"))
        await store.commit(commit(append(t, 0, 0, 10, 2), key="wal/next"))
        assert len(await wal_index_keys(store, "wal/shared")) == 1
        for p in (0, 1):
            [shared] = store.entries(t, p, 0, max_entries=1)
            assert await store.replace_entries(t, p, [shared], IndexEntry(0, 1, f"table/p{p}", PARQUET, 0, 2, 0))
            assert len(await wal_index_keys(store, "wal/shared")) == 1  # partition 2 still refers to it
            assert "wal/shared" in store.referenced_objects()
        [shared] = store.entries(t, 2, 0)
        assert await store.replace_entries(t, 2, [shared], IndexEntry(0, 1, "table/p2", PARQUET, 0, 2, 0))
        assert await wal_index_keys(store, "wal/shared") == []
        assert "wal/shared" not in store.referenced_objects()
        assert len(await wal_index_keys(store, "wal/next")) == 1  # untouched
        fresh = await open_etcd_store(etcd_server, "shared-record")
        try:
            assert [e.object_key for e in fresh.entries(t, 0, 0)] == ["table/p0", "wal/next"]
            assert [e.object_key for e in fresh.entries(t, 2, 0)] == ["table/p2"]
        finally:
            await fresh.close()
    finally:
        await store.close()


async def test_a_replace_answered_after_the_view_moved_past_it_does_not_undo_a_later_merge(etcd_server):
    """Store a's replace succeeds, but before its answer is taken the watch has brought it and a
    later replace by store b merging over it: a must not put its own, older entry back."""
    a = await open_etcd_store(etcd_server, "late-answer")
    b = await open_etcd_store(etcd_server, "late-answer")
    try:
        t = (await a.create_topic("t", 1)).topic_id
        for n in range(3):
            await a.commit(commit(append(t, 0, 0, 10, 5), key=f"wal/{n}"))
        await until(lambda: len(b.entries(t, 0, 0)) == 3, "b to see three entries")
        e1, e2, e3 = a.entries(t, 0, 0)
        mine = IndexEntry(0, 9, "table/a", PARQUET, 0, 10, 0)
        merged = IndexEntry(0, 14, "table/b", PARQUET, 0, 15, 0)
        real, held = a._commit_txn, []

        async def answer_late(request):
            response = await real(request)
            if not held:  # a's replace: b merges over it, and a's watch brings both, before a goes on
                held.append(response)
                await until(lambda: b.entries(t, 0, 0)[0] == mine, "b to see a's replace")
                assert await b.replace_entries(t, 0, [mine, e3], merged)
                await until(lambda: a.entries(t, 0, 0) == [merged], "a's watch to bring b's merge")
            return response

        a._commit_txn = answer_late
        assert await a.replace_entries(t, 0, [e1, e2], mine) is True
        assert a.entries(t, 0, 0) == [merged]
    finally:
        await a.close()
        await b.close()

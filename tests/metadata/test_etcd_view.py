"""The etcd store's local view against a real etcd: what it must still show after its watch breaks
and it reloads, whatever lands in between."""

from __future__ import annotations

import asyncio

import pytest

from tests.metadata.helpers import append, commit, open_etcd_store


@pytest.mark.integration
async def test_own_commit_racing_a_reload_stays_in_the_view(private_etcd):
    """etcd restarts; while the store reloads, its range read answers first (revision X), then
    one of its own commits lands (revision R > X) before the reloaded view replaces the old one.
    The reloaded view lacks R, so the watch from X + 1 must still apply R's events: the store may
    skip watch events of its own commits only if they were applied to the view it still holds."""
    store = await open_etcd_store(private_etcd, "race")
    other = await open_etcd_store(private_etcd, "race")
    try:
        t = (await store.create_topic("t", 2)).topic_id
        await store.commit(commit(append(t, 0, 0, 100, 5)))
        # `other` must know the topic before the restart, or its commit below is refused unseen.
        while other.high_watermark(t, 0) < 5:
            assert await other.wait_for_commit([(t, 0)], timeout=30), "the other store never saw the first commit"

        range_read, release = asyncio.Event(), asyncio.Event()
        real_get_prefix = store._client.get_prefix

        async def held_get_prefix(*args, **kwargs):
            result = await real_get_prefix(*args, **kwargs)
            if not range_read.is_set():
                range_read.set()
                await release.wait()
            return result

        store._client.get_prefix = held_get_prefix
        await asyncio.to_thread(private_etcd.stop)
        await asyncio.to_thread(private_etcd.start)
        await asyncio.wait_for(range_read.wait(), 30)  # the reload has read revision X and is held

        results = await asyncio.wait_for(store.commit(commit(append(t, 0, 0, 100, 3))), 30)
        assert [r.base_offset for r in results] == [5]
        release.set()  # the reload now replaces the view with revision X's

        # Another broker's later commit: once the store sees it, it has seen every earlier event.
        results = await asyncio.wait_for(other.commit(commit(append(t, 1, 0, 100, 2))), 30)
        assert [(r.error_code, r.base_offset) for r in results] == [(0, 0)]
        while store.high_watermark(t, 1) < 2:
            assert await store.wait_for_commit([(t, 1)], timeout=30), "the store never saw the other store's commit"

        assert store.high_watermark(t, 0) == 8
        assert [(e.base_offset, e.last_offset) for e in store.entries(t, 0, 0)] == [(0, 4), (5, 7)]
    finally:
        await store.close()
        await other.close()

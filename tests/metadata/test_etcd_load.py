"""Loading the etcd store's view when the metadata is large, and reloading it after the watch fell
behind etcd's compacted history, against a real etcd. Everything is written through the store's
own commit path."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from metadata.etcd import EtcdSettings
from metadata.etcd import store as etcd_store

from tests.metadata.helpers import append, commit, open_etcd_store

PARTITIONS = 100
WRITERS = 4
COMMITS_PER_WRITER = 300  # 1,200 wal-index records of 100 partitions: 5.3 MB, over gRPC's 4 MiB default
PATIENT = EtcdSettings(timeout=60.0)  # a slow disk takes its time over 1,200 transactions


async def write_index(etcd_server, root: str) -> dict:
    """Each writer its own topic of PARTITIONS partitions, COMMITS_PER_WRITER commits of one
    10-record append per partition: returns {topic id: high watermark per partition}."""
    writers = [await open_etcd_store(etcd_server, root, PATIENT) for _ in range(WRITERS)]
    try:
        topics = [(await w.create_topic(f"t{i}", PARTITIONS)).topic_id for i, w in enumerate(writers)]

        async def run(writer, t) -> None:
            for n in range(COMMITS_PER_WRITER):
                results = await writer.commit(commit(*(append(t, p, p * 100, 100, 10, max_ts=n) for p in range(PARTITIONS))))
                assert {r.error_code for r in results} == {0}

        await asyncio.gather(*(run(w, t) for w, t in zip(writers, topics, strict=True)))
        return {t: COMMITS_PER_WRITER * 10 for t in topics}
    finally:
        for w in writers:
            await w.close()


@pytest.mark.integration
@pytest.mark.timeout(600)
async def test_a_store_starts_on_metadata_larger_than_a_grpc_message(etcd_server, monkeypatch):
    """A single range read of the root failed here with 'Received message larger than max'. The
    paged read also shrinks a page that gRPC refuses: its limit is set below the pages' size."""
    expected = await write_index(etcd_server, "large")
    records = await _count(etcd_server, "/large/wal-index/")
    assert records == WRITERS * COMMITS_PER_WRITER
    for grpc_limit in (etcd_store.GRPC_MAX_MESSAGE_BYTES, 1024 * 1024):  # then pages of 4 MiB refused
        monkeypatch.setattr(etcd_store, "GRPC_MAX_MESSAGE_BYTES", grpc_limit)
        store = await open_etcd_store(etcd_server, "large", PATIENT)
        try:
            for t, hw in expected.items():
                for p in range(PARTITIONS):
                    assert store.high_watermark(t, p) == hw
                entries = store.entries(t, 7, 0, max_entries=10_000)
                assert [(e.base_offset, e.last_offset, e.max_timestamp) for e in entries] == [(n * 10, n * 10 + 9, n) for n in range(COMMITS_PER_WRITER)]
        finally:
            await store.close()


async def _count(etcd_server, prefix: str) -> int:
    store = await open_etcd_store(etcd_server, "count-helper")
    try:
        return sum(1 for _ in await store._client.get_prefix(prefix.encode(), keys_only=True))
    finally:
        await store.close()


@pytest.mark.integration
@pytest.mark.timeout(300)
async def test_a_watch_behind_a_compacted_revision_reloads_and_catches_up_while_commits_continue(etcd_server):
    writer = await open_etcd_store(etcd_server, "behind")
    follower = await open_etcd_store(etcd_server, "behind")
    try:
        t = (await writer.create_topic("t", 3)).topic_id
        assert await writer.commit(commit(append(t, 0, 0, 10, 5)))
        while follower.high_watermark(t, 0) < 5:
            assert await follower.wait_for_commit([(t, 0)], timeout=30), "the follower never saw the first commit"
        watch = follower._tasks[0]  # the follower's watch stops here, at revision `behind`
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        behind = follower._revision

        stop = asyncio.Event()
        committed = {0: 5, 1: 0, 2: 0}

        async def keep_committing() -> None:
            n = 0
            while not stop.is_set():
                p = n % 3
                await writer.commit(commit(append(t, p, 0, 10, 2)))
                committed[p] += 2
                n += 1
                await asyncio.sleep(0.005)

        committing = asyncio.create_task(keep_committing())
        while sum(committed.values()) < 5 + 60:
            await asyncio.sleep(0.01)
        now = await writer._current_revision()
        assert now > behind + 1
        await writer._client.compact(now)  # the follower's next event is history now
        follower._tasks[0] = asyncio.create_task(follower._follow(behind))  # it watches from `behind` + 1: compacted
        while sum(committed.values()) < 5 + 120:  # commits go on while it reloads
            await asyncio.sleep(0.01)
        stop.set()
        await committing
        deadline = asyncio.get_running_loop().time() + 60
        while [follower.high_watermark(t, p) for p in range(3)] != [committed[p] for p in range(3)]:
            assert asyncio.get_running_loop().time() < deadline, f"the follower is at {[follower.high_watermark(t, p) for p in range(3)]}, not {committed}"
            await asyncio.sleep(0.02)
        assert follower.is_current()
        assert [(e.base_offset, e.last_offset) for e in follower.entries(t, 1, 0, max_entries=1000)] == [(o, o + 1) for o in range(0, committed[1], 2)]
    finally:
        await writer.close()
        await follower.close()


@pytest.mark.integration
async def test_each_store_compacts_the_history_it_no_longer_needs(etcd_server):
    """Every `compact_interval_s` a store compacts etcd's history up to `keep_revisions` behind
    the newest revision; a read at an older revision is then refused."""
    store = await open_etcd_store(etcd_server, "history", EtcdSettings(compact_interval_s=0.05, keep_revisions=10))
    try:
        t = (await store.create_topic("t", 1)).topic_id
        first = await store._current_revision()
        for n in range(30):
            await store.commit(commit(append(t, 0, 0, 10, 1)))
        newest = await store._current_revision()
        assert newest >= first + 30
        deadline = asyncio.get_running_loop().time() + 60
        while True:  # the compaction reaches at least newest - keep_revisions
            await _read_at(store, newest - 10)  # still kept
            try:
                await _read_at(store, first)
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.OUT_OF_RANGE and "compacted" in e.details(), e
                break
            assert asyncio.get_running_loop().time() < deadline, "the history was never compacted"
            await asyncio.sleep(0.05)
    finally:
        await store.close()


async def _read_at(store, revision: int):
    from aetcd import rpc

    return await store._client.kvstub.Range(rpc.RangeRequest(key=store.keys.topic("t"), revision=revision), timeout=10, metadata=store._client.metadata)

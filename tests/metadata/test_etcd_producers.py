"""Idempotent producers' state on the etcd store, against a real etcd: a key per producer and
partition, so a commit's cost does not grow with the producers a partition has seen; many
producers' batches in one object; and a producer idle for the expiry forgotten by every view."""

from __future__ import annotations

import asyncio

import pytest

from metadata.etcd import EtcdSettings
from metadata.model import ABORT_MARKER, Append, AppendResult, ObjectCommit
from tests.metadata.helpers import append, commit, marker_append, open_etcd_store, txn_append

pytestmark = pytest.mark.integration


def batches(topic, producers: range, per_producer: int = 1, first_seq: int = 0) -> tuple[Append, ...]:
    """One-record batches on partition 0, `per_producer` consecutive ones per producer, in turn."""
    return tuple(append(topic, 0, 10 * i, 10, 1, pid=pid, epoch=0, seq=first_seq + s) for i, (s, pid) in enumerate((s, pid) for s in range(per_producer) for pid in producers))


async def captured_commit(store, topic, pid: int, seq: int, key: str):
    """Commit one batch of `pid` and return the transaction request the store sent."""
    sent = []
    real = store._commit_txn

    async def capture(request):
        sent.append(request)
        return await real(request)

    store._commit_txn = capture
    offset = store.high_watermark(topic, 0)
    try:
        assert await store.commit(commit(append(topic, 0, 0, 10, 1, pid=pid, epoch=0, seq=seq), key=key)) == [AppendResult(0, offset, 0)]
    finally:
        store._commit_txn = real
    [request] = sent
    return request


async def test_a_commits_cost_does_not_grow_with_the_producers_a_partition_has_seen(etcd_server):
    store = await open_etcd_store(etcd_server, "many-producers")
    try:
        few = (await store.create_topic("few", 1)).topic_id
        many = (await store.create_topic("many", 1)).topic_id
        await store.commit(commit(*batches(few, range(1)), key="wal/few"))
        for n in range(4):  # 2,000 producers, 500 to an object (each object five transactions)
            results = await store.commit(ObjectCommit(f"wal/many-{n}", 0, batches(many, range(n * 500, (n + 1) * 500))))
            assert [r.error_code for r in results] == [0] * 500
        assert len(store._partitions[(many, 0)].producers) == 2000
        await store._expiring_lease()
        for label, seq, pid in (("known", 1, 0), ("new", 0, 9999)):
            small = await captured_commit(store, few, pid, seq, key=f"wal/few-{label}")
            large = await captured_commit(store, many, pid, seq, key=f"wal/many-{label}")
            assert (len(large.compare), len(large.success), len(large.failure)) == (len(small.compare), len(small.success), len(small.failure)) == (5, 3, 5)
            # the same but for the topic's name and offsets' digits (a head holding 2,000 producers was 220 KB)
            assert abs(large.ByteSize() - small.ByteSize()) <= 32, (large.ByteSize(), small.ByteSize())
        head = await store._client.get(store.keys.head(many, 0))
        assert head.value == b'{"n":2002,"s":0}'
    finally:
        await store.close()


async def test_an_object_with_more_producers_than_a_transaction_holds(etcd_server):
    """300 producers, two batches each, on one partition in one object: three transactions; each
    producer's batches keep their order; the same batches again are duplicates, offsets and all."""
    store = await open_etcd_store(etcd_server, "crowded")
    follower = await open_etcd_store(etcd_server, "crowded")
    try:
        t = (await store.create_topic("t", 1)).topic_id
        appends = batches(t, range(300), per_producer=2)
        results = await store.commit(ObjectCommit("wal/crowded", 0, appends))
        assert all(r.error_code == 0 for r in results) and sorted(r.base_offset for r in results) == list(range(600))
        by_producer: dict[int, list[int]] = {}
        for a, r in zip(appends, results, strict=True):
            by_producer.setdefault(a.producer_id, []).append(r.base_offset)
        assert all(first < second for first, second in by_producer.values())
        assert len(await store._client.get_prefix(store.keys.wal_indexes("wal/crowded"))) == 3
        again = await store.commit(ObjectCommit("wal/crowded-again", 0, appends))
        assert again == [AppendResult(0, r.base_offset, 0, duplicate=True) for r in results]
        deadline = asyncio.get_running_loop().time() + 60
        while len(follower.producer_states(t, 0)) < 300 or follower.high_watermark(t, 0) < 600:
            assert asyncio.get_running_loop().time() < deadline, "the follower never saw every producer"
            await asyncio.sleep(0.02)
        assert follower.producer_states(t, 0) == store.producer_states(t, 0)
    finally:
        await store.close()
        await follower.close()


async def test_an_idle_producers_state_expires(etcd_server):
    quick = EtcdSettings(producer_expiry_ms=2000)
    store = await open_etcd_store(etcd_server, "expiry", quick)
    try:
        t = (await store.create_topic("t", 1)).topic_id
        assert await store.commit(commit(append(t, 0, 0, 10, 3, pid=7, epoch=0, seq=0))) == [AppendResult(0, 0, 0)]
        assert list(store.producer_states(t, 0)) == [7]
        assert await store.commit(commit(append(t, 0, 0, 10, 1, pid=7, epoch=0, seq=9))) == [AppendResult(45, -1, 0)]  # a gap: refused
        deadline = asyncio.get_running_loop().time() + 60
        while await store._client.get(store.keys.producer(t, 0, 7)) is not None:  # its lease ends within twice the expiry
            assert asyncio.get_running_loop().time() < deadline, "the producer's state never expired"
            await asyncio.sleep(0.1)
        while store._partitions[(t, 0)].producers:
            assert asyncio.get_running_loop().time() < deadline, "the view never forgot the producer"
            await asyncio.sleep(0.02)
        assert store.producer_states(t, 0) == {}
        # Forgotten, as Kafka forgets a producer after producer.id.expiration.ms: any sequence is taken.
        assert await store.commit(commit(append(t, 0, 0, 10, 1, pid=7, epoch=0, seq=9))) == [AppendResult(0, 3, 0)]
    finally:
        await store.close()


async def test_a_producer_with_an_open_transaction_is_never_expired(etcd_server):
    """Issue 42 finding 7: a producer's state with a transaction open here is put with no lease,
    so it outlives producer_expiry_ms and keeps the last stable offset at the transaction's first
    offset (as Kafka keeps such a producer); the marker that ends it puts it on the lease again."""
    quick = EtcdSettings(producer_expiry_ms=2000)
    store = await open_etcd_store(etcd_server, "open-txn-expiry", quick)
    try:
        t = (await store.create_topic("t", 1)).topic_id
        assert await store.commit(commit(txn_append(t, 0, 2, pid=9, seq=0), append(t, 0, 10, 10, 1, pid=7, epoch=0, seq=0))) == [AppendResult(0, 0, 0), AppendResult(0, 2, 0)]
        assert (await store._client.get(store.keys.producer(t, 0, 9))).lease == 0
        assert (await store._client.get(store.keys.producer(t, 0, 7))).lease != 0
        deadline = asyncio.get_running_loop().time() + 60
        while await store._client.get(store.keys.producer(t, 0, 7)) is not None:  # the idle one's lease ends
            assert asyncio.get_running_loop().time() < deadline, "the idle producer's state never expired"
            await asyncio.sleep(0.1)
        assert await store._client.get(store.keys.producer(t, 0, 9)) is not None
        assert sorted(store.producer_states(t, 0)) == [9]  # idle past the expiry, its transaction open
        assert store.topic_views(t)[0].last_stable_offset == 0
        assert await store.commit(commit(marker_append(t, 0, pid=9, kind=ABORT_MARKER))) == [AppendResult(0, 3, 0)]
        assert (await store._client.get(store.keys.producer(t, 0, 9))).lease != 0
        assert store.topic_views(t)[0].last_stable_offset == 4
    finally:
        await store.close()

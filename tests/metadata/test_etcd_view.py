"""The etcd store's local view against a real etcd: what it must still show after its watch breaks
and it reloads, whatever lands in between."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from metadata.etcd import EtcdMetadataStore, EtcdSettings
from metadata.model import AppendResult, BrokerRegistration
from metadata.store import MetadataUnavailable, ObjectFenced
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
        real_read_pages = store._read_pages

        async def held_read_pages(kinds):
            async for page in real_read_pages(kinds):
                yield page
            if not range_read.is_set():  # every page read: hold the reload before it adopts them
                range_read.set()
                await release.wait()

        store._read_pages = held_read_pages
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


@pytest.mark.integration
async def test_a_topic_deletion_larger_than_a_grpc_message_is_followed_without_a_reload(etcd_server):
    """Deleting a topic deletes all its index keys in one revision. 60,000 of them make over 5 MiB
    of watch events, more than a gRPC message may carry (4 MiB): the watch must take them in
    fragments, not break and reload the whole view. etcd takes seconds to delete 60,000 keys on a
    slow disk: the stores wait for it longer than the product's 5 s default."""
    patient = EtcdSettings(timeout=60.0)
    writer = await open_etcd_store(etcd_server, "big-delete", patient)
    follower = await open_etcd_store(etcd_server, "big-delete", patient)
    try:
        info = await writer.create_topic("big", 1)
        tx = writer._client.transactions
        # one-record entries 0..59,999, each in an object of its own (written as the sequencer would)
        puts = [tx.put(writer.keys.index(info.topic_id, 0, base), json.dumps([base, f"wal/{base:040d}", 0, 0, 100, 0]).encode()) for base in range(60_000)]
        for i in range(0, len(puts), 120):
            await writer._client.transaction(compare=[], success=puts[i : i + 120], failure=[])
        deadline = asyncio.get_running_loop().time() + 180
        while len(follower.entries(info.topic_id, 0, 0, max_entries=100_000)) < 60_000:
            assert asyncio.get_running_loop().time() < deadline, "the follower never saw every index key"
            await asyncio.sleep(0.05)

        reloads = 0
        real_reload = follower._reload

        async def counted_reload():
            nonlocal reloads
            reloads += 1
            return await real_reload()

        follower._reload = counted_reload
        await writer.delete_topic("big")
        while "big" in follower.topics():
            assert asyncio.get_running_loop().time() < deadline + 180, "the follower never saw the deletion"
            await asyncio.sleep(0.05)
        # an event after the deletion: once seen, the watch has passed the whole deletion unbroken
        await writer.create_topic("after", 1)
        while "after" not in follower.topics():
            assert asyncio.get_running_loop().time() < deadline + 240, "the follower never saw the next topic"
            await asyncio.sleep(0.05)
        assert reloads == 0
        assert follower.is_current()
    finally:
        await writer.close()
        await follower.close()


@pytest.mark.integration
async def test_a_watch_from_a_compacted_revision_fails_so_the_view_is_reloaded(etcd_server):
    store = await open_etcd_store(etcd_server, "compacted")
    try:
        await store.create_topic("a", 1)
        await store.create_topic("b", 1)
        revision = (await store._client.get(store.keys.topic("b"))).mod_revision
        await store._client.compact(revision)
        with pytest.raises(MetadataUnavailable, match="compacted"):
            async for _ in store._watch(revision - 1):
                pass
    finally:
        await store.close()


@pytest.mark.integration
async def test_a_fence_waits_for_the_view_and_a_lagging_view_deletes_nothing(etcd_server):
    """The orphan sweeper's fence: a commit that lands before it must be seen as a reference. A
    store whose view has stopped following etcd never sees the commit below, so its fence must
    not report the object deletable (it would be, by that view); a following store's must not
    either, whatever the watch has delivered when it is asked."""
    committer = await open_etcd_store(etcd_server, "fence")
    follower = await open_etcd_store(etcd_server, "fence")
    lagging = EtcdMetadataStore("127.0.0.1", etcd_server.ports["client"], root="fence", settings=EtcdSettings(timeout=1.0))
    await lagging.start()
    try:
        t = (await committer.create_topic("t", 1)).topic_id
        while follower.topic_by_id(t) is None or lagging.topic_by_id(t) is None:
            await asyncio.sleep(0.01)
        watch = lagging._tasks[0]  # stop its watch: its view stays before the commit
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)

        assert await committer.commit(commit(append(t, 0, 0, 10, 3), key="wal/committed")) == [AppendResult(0, 0, 0)]
        assert await follower.fence_objects(["wal/committed", "wal/orphan-1"]) == {"wal/orphan-1"}
        assert "wal/committed" not in lagging.referenced_objects()  # what a sweeper without the fence would go by
        assert await lagging.fence_objects(["wal/committed", "wal/orphan-2"]) == set()
        # both fences stand: a commit of either orphan lands nothing
        for key in ("wal/orphan-1", "wal/orphan-2"):
            with pytest.raises(ObjectFenced):
                await committer.commit(commit(append(t, 0, 0, 10, 1), key=key))
        assert committer.high_watermark(t, 0) == 3
    finally:
        await committer.close()
        await follower.close()
        await lagging.close()


@pytest.mark.integration
async def test_a_topic_change_is_answered_once_the_watch_has_applied_it(etcd_server):
    """A topic's creation, growth or deletion shows in the view when its call returns, and must
    stay: a watch event older than the change, still on its way (the creation of a topic just
    deleted), would otherwise undo it (CI once saw a deleted topic listed again). So each call
    returns only once the store's watch has passed the change's revision. Here the watch is held
    until the test lets it go."""
    store = EtcdMetadataStore("127.0.0.1", etcd_server.ports["client"], root="topic-settles")
    flowing, answered = asyncio.Event(), asyncio.Event()
    flowing.set()
    real_watch, real_txn = store._watch, store._txn

    async def held_watch(start_revision):
        async for response in real_watch(start_revision):
            if response.events:
                await flowing.wait()
            yield response

    async def noted_txn(*args, **kwargs):
        result = await real_txn(*args, **kwargs)
        answered.set()
        return result

    store._watch, store._txn = held_watch, noted_txn
    await store.start()
    try:
        for change in (
            lambda: store.create_topic("t", 2),
            lambda: store.update_topic("t", partitions=3),
            lambda: store.delete_topic("t"),
        ):
            flowing.clear()
            answered.clear()
            call = asyncio.create_task(change())
            await asyncio.wait_for(answered.wait(), 30)
            # etcd has answered and the call has run on to its next wait: it must be the watch's
            assert not call.done()
            flowing.set()
            await asyncio.wait_for(call, 30)
        assert dict(store.topics()) == {}
        created = await store.create_topic("t", 1)
        assert dict(store.topics()) == {"t": created}
    finally:
        await store.close()


@pytest.mark.integration
async def test_a_commit_from_a_stale_view_is_sequenced_again_on_the_heads_etcd_returns(etcd_server):
    """Two brokers append to the same partitions. One's watch is held, so its view is behind and
    its commit's compare fails; the transaction's failure branch returns the current heads in the
    same round trip, and the commit is sequenced again on them: it takes the next offsets, and a
    producer's retry of a batch the other broker stored is answered as that batch's duplicate.
    The heads it learned run ahead of the index entries its view holds, so neither they nor its
    own commit enter the view before the watch brings the other broker's entries: a Fetch there
    would otherwise find offset 5's entry at offset 0 and skip 0-4 (the fault harness's poll-skip
    under a partition). The commit is answered once its view has caught up."""
    writer = await open_etcd_store(etcd_server, "stale")
    stale = EtcdMetadataStore("127.0.0.1", etcd_server.ports["client"], root="stale")
    flowing, txns, txn_done = asyncio.Event(), [0], asyncio.Event()
    flowing.set()
    real_watch, real_txn = stale._watch, stale._commit_txn

    async def held_watch(start_revision):
        async for response in real_watch(start_revision):
            await flowing.wait()
            yield response

    async def counted_txn(request):
        try:
            return await real_txn(request)
        finally:
            txns[0] += 1
            txn_done.set()

    stale._watch, stale._commit_txn = held_watch, counted_txn
    await stale.start()
    try:
        t = (await writer.create_topic("t", 2)).topic_id
        while stale.topic_by_id(t) is None:
            await asyncio.sleep(0.01)
        flowing.clear()  # its view keeps the heads as they are now

        assert await writer.commit(commit(append(t, 0, 0, 10, 5))) == [AppendResult(0, 0, 0)]
        assert await writer.commit(commit(append(t, 1, 0, 10, 3, pid=7, epoch=0, seq=0))) == [AppendResult(0, 0, 0)]
        await stale._expiring_lease()  # granted once an hour for producer keys: not counted below
        ops = stale.ops

        late = asyncio.create_task(stale.commit(commit(append(t, 0, 0, 10, 2), append(t, 1, 0, 10, 3, pid=7, epoch=0, seq=0), key="wal/late")))
        while txns[0] < 2:  # the conflict, then the commit on the returned heads
            txn_done.clear()
            await asyncio.wait_for(txn_done.wait(), 30)
        assert stale.ops - ops == 2
        # committed in etcd, not yet in the view: it shows nothing past what its entries hold
        assert (stale.high_watermark(t, 0), stale.high_watermark(t, 1)) == (0, 0)
        assert stale.entries(t, 0, 0) == []
        assert not late.done()

        flowing.set()
        results = await asyncio.wait_for(late, 30)
        assert results == [AppendResult(0, 5, 0), AppendResult(0, 0, 0, duplicate=True)]
        assert (stale.high_watermark(t, 0), stale.high_watermark(t, 1)) == (7, 3)
        assert [(e.base_offset, e.last_offset) for e in stale.entries(t, 0, 0)] == [(0, 4), (5, 6)]
        assert stale.entries(t, 0, 5)[0].object_key == "wal/late"
        while writer.high_watermark(t, 0) < 7:
            assert await writer.wait_for_commit([(t, 0)], timeout=30), "the writer never saw the stale store's commit"
        assert [(e.base_offset, e.last_offset) for e in writer.entries(t, 0, 0)] == [(0, 4), (5, 6)]
        assert [(e.base_offset, e.last_offset) for e in writer.entries(t, 1, 0)] == [(0, 2)]
    finally:
        await writer.close()
        await stale.close()


@pytest.mark.integration
async def test_a_commit_never_overwrites_the_index_record_of_another(etcd_server):
    """A commit transaction's wal-index record is created, never replaced: were an object committed
    twice, the second commit must fail whole rather than replace the entries the first one made
    readable. Here the record of the object's first transaction exists already."""
    store = await open_etcd_store(etcd_server, "record-once")
    try:
        t = (await store.create_topic("t", 2)).topic_id
        await store._client.put(store.keys.wal_index("wal/twice", 0), b'["wal/twice",[]]')
        with pytest.raises(MetadataUnavailable, match="already has index entries"):
            await store.commit(commit(append(t, 0, 0, 10, 5), append(t, 1, 10, 10, 2), key="wal/twice"))
        assert (store.high_watermark(t, 0), store.high_watermark(t, 1)) == (0, 0)
        assert (await store._client.get(store.keys.head(t, 0))) is None  # nothing of it landed in etcd

        assert await store.commit(commit(append(t, 0, 0, 10, 5), key="wal/once")) == [AppendResult(0, 0, 0)]
    finally:
        await store.close()


@pytest.mark.integration
async def test_a_commit_that_puts_nothing_takes_no_revision_for_its_own(etcd_server):
    """A commit whose only append is a producer's retry puts nothing, and etcd answers it with the
    latest revision, here another broker's commit that this store's watch has not delivered yet.
    The store skips the watch events of its own commits, so it must not take that revision for
    one of them: the other commit's records would never appear in its view."""
    writer = await open_etcd_store(etcd_server, "nothing")
    store = await open_etcd_store(etcd_server, "nothing")
    try:
        t = (await writer.create_topic("t", 2)).topic_id
        retried = append(t, 1, 0, 10, 3, pid=7, epoch=0, seq=0)
        assert await writer.commit(commit(retried)) == [AppendResult(0, 0, 0)]
        while store.high_watermark(t, 1) < 3:
            assert await store.wait_for_commit([(t, 1)], timeout=30), "the store never saw the first commit"
        watch = store._tasks[0]  # hold the watch: the next commit's events arrive after the retry's answer
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        followed = store._revision

        assert await writer.commit(commit(append(t, 0, 0, 10, 5))) == [AppendResult(0, 0, 0)]
        assert await store.commit(commit(retried)) == [AppendResult(0, 0, 0, duplicate=True)]
        store._tasks[0] = asyncio.create_task(store._follow(followed))  # the watch delivers it now
        while store.high_watermark(t, 0) < 5:
            assert await store.wait_for_commit([(t, 0)], timeout=10), "the other broker's commit never reached the view"
        assert [(e.base_offset, e.last_offset) for e in store.entries(t, 0, 0)] == [(0, 4)]
    finally:
        await writer.close()
        await store.close()


@pytest.mark.integration
async def test_a_commit_to_a_topic_deleted_meanwhile_recreates_nothing(etcd_server):
    """Another broker deletes the topic while this store's watch has not told it yet. Partition 0
    was never written: its head compares at revision 0, which a deleted key matches too, so the
    commit used to put a head for the dead topic. Partition 1 was written: its compare failed on
    the deleted head, the retry read nothing new, and the commit conflicted 64 times. Both now
    answer UNKNOWN_TOPIC_OR_PARTITION at once and leave no key behind."""
    deleter = await open_etcd_store(etcd_server, "deleted")
    store = await open_etcd_store(etcd_server, "deleted")
    try:
        info = await deleter.create_topic("t", 2)
        t = info.topic_id
        deadline = asyncio.get_running_loop().time() + 60
        while "t" not in store.topics():
            assert asyncio.get_running_loop().time() < deadline, "the store never saw the topic"
            await asyncio.sleep(0.02)
        assert await store.commit(commit(append(t, 1, 0, 10, 3))) == [AppendResult(0, 0, 0)]
        watch = store._tasks[0]  # hold the watch: the deletion is not seen before the commit
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await deleter.delete_topic("t")

        attempts = 0
        real_txn = store._commit_txn

        async def counted(request):
            nonlocal attempts
            attempts += 1
            return await real_txn(request)

        store._commit_txn = counted
        results = await asyncio.wait_for(store.commit(commit(append(t, 0, 0, 10, 2), append(t, 1, 10, 10, 2))), 30)
        assert [r.error_code for r in results] == [3, 3]  # UNKNOWN_TOPIC_OR_PARTITION
        assert attempts == 1
        assert "t" not in store.topics()
        assert [kv.key for kv in await store._client.get_prefix(f"/deleted/heads/{t.hex}/".encode())] == []
    finally:
        await deleter.close()
        await store.close()


@pytest.mark.integration
async def test_own_commit_events_arriving_before_its_answer_are_not_applied_again(etcd_server):
    """A commit's watch events can reach the store before its transaction's answer, which records
    the revision as the store's own (in a benchmark, 44% of them did). The store must still
    recognise them rather than decode and apply them a second time. Here every answer is held
    until the watch has received that commit's events (one transaction per object: 50 partitions)."""
    store = EtcdMetadataStore("127.0.0.1", etcd_server.ports["client"], root="own-events-first")
    watched, progressed = [0], asyncio.Event()
    real_watch, real_txn, real_apply = store._watch, store._commit_txn, store._apply_event

    async def watch(start_revision):
        async for response in real_watch(start_revision):
            if response.events:
                watched[0] = response.events[-1].kv.mod_revision
                progressed.set()
            yield response

    async def answer_after_the_watch(request):
        response = await real_txn(request)
        while watched[0] < response.header.revision:
            progressed.clear()
            await asyncio.wait_for(progressed.wait(), 30)
        return response

    applied = []

    def apply(event):
        applied.append(event.kv.key)
        return real_apply(event)

    store._watch, store._commit_txn, store._apply_event = watch, answer_after_the_watch, apply
    await store.start()
    try:
        t = (await store.create_topic("t", 50)).topic_id
        # the topic's event first: a watch response still held behind a commit would hold its answer
        await asyncio.wait_for(progressed.wait(), 30)
        for base in (0, 2):
            results = await asyncio.wait_for(store.commit(commit(*(append(t, p, p * 100, 100, 2) for p in range(50)))), 30)
            assert [(r.error_code, r.base_offset) for r in results] == [(0, base)] * 50
        assert await store._view_reaches(max(store._own_revisions), 30)
        assert [store.high_watermark(t, p) for p in range(50)] == [4] * 50
        assert [[(e.base_offset, e.last_offset) for e in store.entries(t, p, 0)] for p in (0, 49)] == [[(0, 1), (2, 3)]] * 2
        assert [key for key in applied if b"/heads/" in key or b"index/" in key] == []
    finally:
        await store.close()


@pytest.mark.integration
async def test_a_follower_sees_partitions_added_to_a_topic_and_a_topic_made_again(etcd_server):
    """The watch finds the partition of each head and index event by its path in the key; the
    paths must follow a topic that grows and a topic deleted and created again under a new id."""
    writer = await open_etcd_store(etcd_server, "paths")
    follower = await open_etcd_store(etcd_server, "paths")
    try:

        async def seen(t, partition: int, high: int) -> None:
            while follower.high_watermark(t, partition) < high:
                assert await follower.wait_for_commit([(t, partition)], timeout=30), f"the follower never saw {partition} reach {high}"

        t = (await writer.create_topic("t", 2)).topic_id
        await writer.commit(commit(append(t, 1, 0, 10, 2)))
        await seen(t, 1, 2)
        await writer.update_topic("t", partitions=4)
        assert await writer.commit(commit(append(t, 3, 0, 10, 5), key="wal/grown")) == [AppendResult(0, 0, 0)]
        await seen(t, 3, 5)
        assert [(e.base_offset, e.last_offset, e.object_key) for e in follower.entries(t, 3, 0)] == [(0, 4, "wal/grown")]

        await writer.delete_topic("t")
        again = (await writer.create_topic("t", 1)).topic_id
        assert await writer.commit(commit(append(again, 0, 0, 10, 3), key="wal/again")) == [AppendResult(0, 0, 0)]
        await seen(again, 0, 3)
        assert [e.object_key for e in follower.entries(again, 0, 0)] == ["wal/again"]
        assert follower.high_watermark(t, 3) == 0 and follower.entries(t, 3, 0) == []  # the old topic is gone
    finally:
        await writer.close()
        await follower.close()


@pytest.mark.integration
async def test_a_follower_logs_brokers_joining_and_leaving(etcd_server, caplog):
    """Membership changes reach a broker's view through its watch, and each is logged once: a
    registration put on a lease (as `register_broker` does), then the lease revoked."""
    caplog.set_level(logging.INFO, logger="neve.metadata.etcd")
    follower = await open_etcd_store(etcd_server, "members")
    try:
        lease = await follower._client.lease(5)
        await follower._client.put(follower.keys.broker(7), json.dumps({"host": "127.0.0.1", "port": 9999, "zone": "b"}).encode(), lease=lease)
        while 7 not in [b.node_id for b in follower.live_brokers()]:
            await asyncio.sleep(0.01)
        assert follower.live_brokers()[0] == BrokerRegistration(7, "127.0.0.1", 9999, "b")
        await lease.revoke()  # etcd deletes the registration
        while 7 in [b.node_id for b in follower.live_brokers()]:
            await asyncio.sleep(0.01)
        events = [(r.msg, r.node_id) for r in caplog.records if r.msg in ("broker_joined", "broker_left")]
        assert events == [("broker_joined", 7), ("broker_left", 7)]
    finally:
        await follower.close()


def _store_noting_broker_events(etcd, root: str, node_id: int):
    """A store (not started) whose watch can be held (clear the event it returns), and the list it
    fills with broker `node_id`'s watch events as it applies them: (a deletion, revision, the
    broker listed after it)."""
    store = EtcdMetadataStore("127.0.0.1", etcd.ports["client"], root=root)
    flowing = asyncio.Event()
    flowing.set()
    real_watch, real_apply = store._watch, store._apply_event
    key = store.keys.broker(node_id)
    noted: list[tuple[bool, int, bool]] = []

    async def held_watch(start_revision):
        async for response in real_watch(start_revision):
            if response.events:
                await flowing.wait()
            yield response

    def noted_apply(event):
        moved = real_apply(event)
        if event.kv.key == key:
            noted.append((event.type == store._delete_type, event.kv.mod_revision, node_id in [b.node_id for b in store.live_brokers()]))
        return moved

    store._watch, store._apply_event = held_watch, noted_apply
    return store, flowing, noted


@pytest.mark.integration
async def test_a_broker_registered_again_is_not_removed_by_its_old_registrations_expiry(etcd_server):
    """A broker whose lease expired registers again (`_keep_alive`): the new registration is in its
    view at once, while the old key's deletion, at an earlier revision, may still be on its way
    through the watch. Applying that deletion would drop the live broker from its own Metadata
    answers until the new put's event arrived. Here the watch is held while the lease is revoked
    and the broker registers again, then let go: the broker must stay listed throughout."""
    store, flowing, noted = _store_noting_broker_events(etcd_server, "re-register", 4)
    key = store.keys.broker(4)
    await store.start()
    try:
        registration = BrokerRegistration(4, "127.0.0.1", 9094, "a")
        await store._register(registration)  # as register_broker does, without its keep-alive task
        first = (await store._client.get(key)).mod_revision
        assert await store._view_reaches(first, 30)
        flowing.clear()
        await store._lease.revoke()  # the lease is gone: etcd deletes the registration
        await store._register(registration)  # what _keep_alive does once its refresh fails
        again = (await store._client.get(key)).mod_revision
        assert again > first and store.live_brokers() == [registration]
        flowing.set()
        assert await store._view_reaches(again, 30)
        # the watch brought the first put, the deletion between the two puts, and the new put;
        # the broker stayed listed after each
        assert [deleted for deleted, _, _ in noted] == [False, True, False], noted
        put1, deletion, put2 = (revision for _, revision, _ in noted)
        assert put1 == first and first < deletion < again and put2 == again
        assert all(listed for _, _, listed in noted), noted
        assert store.live_brokers() == [registration]
    finally:
        await store.close()


@pytest.mark.integration
async def test_a_reload_read_before_a_broker_registered_again_keeps_the_new_registration(etcd_server):
    """The same, with a reload of the view in between: its range read, taken before the broker
    registered again, still holds the old registration, so the deletion that followed it must not
    remove the new one when the watch brings it."""
    store, flowing, noted = _store_noting_broker_events(etcd_server, "re-register-reload", 5)
    key = store.keys.broker(5)
    await store.start()
    try:
        registration = BrokerRegistration(5, "127.0.0.1", 9095, None)
        await store._register(registration)
        first = (await store._client.get(key)).mod_revision
        assert await store._view_reaches(first, 30)
        flowing.clear()
        range_read, release = asyncio.Event(), asyncio.Event()
        real_read_pages = store._read_pages

        async def held_read_pages(kinds):
            async for page in real_read_pages(kinds):
                yield page
            range_read.set()
            await release.wait()

        store._read_pages = held_read_pages
        reload = asyncio.create_task(store._load())
        await asyncio.wait_for(range_read.wait(), 30)  # it read the old registration
        await store._lease.revoke()
        await store._register(registration)
        again = (await store._client.get(key)).mod_revision
        release.set()
        await asyncio.wait_for(reload, 30)
        assert store.live_brokers() == [registration]
        flowing.set()
        assert await store._view_reaches(again, 30)
        assert [deleted for deleted, _, _ in noted] == [False, True, False], noted
        assert all(listed for _, _, listed in noted), noted
        assert store.live_brokers() == [registration]
    finally:
        await store.close()


@pytest.mark.integration
async def test_a_broker_whose_registration_lapsed_writes_no_group_state_or_offsets(etcd_server):
    """The chaos harness's offsets-backwards under a broker pause: a coordinator paused past its
    lease resumed and wrote its stale group state and an OffsetCommit that had waited in its
    socket over what the group's next coordinator had stored. Group writes compare the broker's
    registration: lapsed, they write nothing (offsets answer False, a state save raises), and the
    registration revision moves when it registers again, for the coordinator to read its groups
    again."""
    from metadata.model import CommittedOffset
    from metadata.store import MetadataUnavailable

    store = EtcdMetadataStore("127.0.0.1", etcd_server.ports["client"], root="lapsed")
    await store.start()
    try:
        t = (await store.create_topic("t", 1)).topic_id
        registration = BrokerRegistration(3, "127.0.0.1", 9093, "a")
        await store._register(registration)  # as register_broker does, without its keep-alive task
        first = store.registration_revision()
        assert first > 0
        assert await store.commit_offsets("g", {(t, 0): CommittedOffset(145)})
        await store.save_group("g", b"state at epoch 10")
        await store._lease.revoke()  # the pause outlived the lease: etcd deletes the registration
        assert not await store.commit_offsets("g", {(t, 0): CommittedOffset(109)})
        with pytest.raises(MetadataUnavailable):
            await store.save_group("g", b"stale state at epoch 2")
        assert (await store.fetch_offsets("g"))[(t, 0)].offset == 145
        assert await store.load_group("g") == b"state at epoch 10"
        await store._register(registration)  # what _keep_alive does once its refresh fails
        assert store.registration_revision() > first
        assert await store.commit_offsets("g", {(t, 0): CommittedOffset(150)})
        assert (await store.fetch_offsets("g"))[(t, 0)].offset == 150
    finally:
        await store.close()

"""The MetadataStore contract, written once and run against every backend (see conftest.BACKENDS)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from kio.schema.errors import ErrorCode

from metadata.model import (
    AppendResult,
    IndexEntry,
    ObjectType,
    TopicInfo,
)
from metadata.store import Fence, Fenced, InvalidPartitions, MetadataUnavailable, ObjectFenced, TopicAlreadyExists, UnknownTopic

from .helpers import append, commit

WAL = ObjectType.WAL
MAX_SEQ = 2**31 - 1


def ok(base: int) -> AppendResult:
    return AppendResult(0, base, 0)


def dup(base: int) -> AppendResult:
    return AppendResult(0, base, 0, duplicate=True)


def refused(code: int) -> AppendResult:
    return AppendResult(code, -1, 0)


# -- topics ---------------------------------------------------------------------------------------


async def test_create_topic(store):
    info = await store.create_topic("orders", 3, {"retention.ms": "1000"})
    assert info == TopicInfo("orders", info.topic_id, 3, {"retention.ms": "1000"})
    assert isinstance(info.topic_id, uuid.UUID)
    assert dict(store.topics()) == {"orders": info}
    assert store.topic_by_id(info.topic_id) == info
    assert [store.high_watermark(info.topic_id, p) for p in range(3)] == [0, 0, 0]
    assert [store.log_start_offset(info.topic_id, p) for p in range(3)] == [0, 0, 0]
    assert store.entries(info.topic_id, 0, 0) == []


async def test_topics_get_distinct_ids_and_no_configs_means_empty(store):
    a = await store.create_topic("a", 1)
    b = await store.create_topic("b", 2)
    assert a.topic_id != b.topic_id
    assert a.configs == {} and b.configs == {}
    assert sorted(store.topics()) == ["a", "b"]


async def test_create_existing_topic_is_refused(store):
    first = await store.create_topic("orders", 2)
    with pytest.raises(TopicAlreadyExists) as e:
        await store.create_topic("orders", 5)
    assert e.value.error_code == 36
    assert dict(store.topics()) == {"orders": first}


@pytest.mark.parametrize("partitions", [0, -1])
async def test_create_topic_needs_a_partition(store, partitions):
    with pytest.raises(InvalidPartitions) as e:
        await store.create_topic("empty", partitions)
    assert e.value.error_code == 37
    assert dict(store.topics()) == {}


async def test_delete_topic(store):
    keep = await store.create_topic("keep", 1)
    gone = await store.create_topic("gone", 2)
    await store.commit(commit(append(gone.topic_id, 0, 0, 10, 4), append(keep.topic_id, 0, 10, 10, 2)))

    assert await store.delete_topic("gone") == gone
    assert dict(store.topics()) == {"keep": keep}
    assert store.topic_by_id(gone.topic_id) is None
    assert store.high_watermark(gone.topic_id, 0) == 0
    assert store.entries(gone.topic_id, 0, 0) == []
    assert store.entry_for_timestamp(gone.topic_id, 0, 0) is None
    # The other topic is untouched, and the deleted one's partitions take no more appends.
    assert store.high_watermark(keep.topic_id, 0) == 2
    results = await store.commit(commit(append(gone.topic_id, 0, 0, 10, 1), append(keep.topic_id, 0, 10, 10, 1)))
    assert results == [refused(ErrorCode.unknown_topic_or_partition), ok(2)]


async def test_topic_changes_are_seen_at_once_and_kept(store):
    # Each change is in the view when its call returns, and no older change, still on its way
    # to a watching store, undoes it afterwards (a creation arriving after the deletion).
    for round_ in range(20):
        created = await store.create_topic("churn", 1 + round_ % 3)
        assert dict(store.topics()) == {"churn": created}
        grown = await store.update_topic("churn", partitions=4)
        assert dict(store.topics()) == {"churn": grown}
        assert await store.delete_topic("churn") == grown
        assert dict(store.topics()) == {}
        assert store.topic_by_id(created.topic_id) is None
    assert dict(store.topics()) == {}


async def test_topic_views_follow_creation_growth_commits_and_deletion(store):
    def heads(topic_id):
        return [(v.next_offset, v.log_start_offset) for v in store.topic_views(topic_id)]

    t = await store.create_topic("views", 2)
    other = await store.create_topic("other", 1)
    assert heads(t.topic_id) == [(0, 0), (0, 0)]
    await store.commit(commit(append(t.topic_id, 1, 0, 10, 3), append(other.topic_id, 0, 10, 10, 1)))
    assert heads(t.topic_id) == [(0, 0), (3, 0)]
    grown = await store.update_topic("views", partitions=4)
    assert grown.partitions == 4 and heads(t.topic_id) == [(0, 0), (3, 0), (0, 0), (0, 0)]
    await store.commit(commit(append(t.topic_id, 3, 0, 10, 2)))
    # the same views as the per-partition reads, entries included
    views = store.topic_views(t.topic_id)
    for p in range(4):
        assert (views[p].next_offset, views[p].log_start_offset) == (store.high_watermark(t.topic_id, p), store.log_start_offset(t.topic_id, p))
        assert views[p].from_offset(0, 64) == store.entries(t.topic_id, p, 0)
    assert [e.last_offset for e in views[3].from_offset(0, 64)] == [1]
    await store.delete_topic("views")
    assert list(store.topic_views(t.topic_id)) == [] and list(store.topic_views(uuid.uuid4())) == []
    assert heads(other.topic_id) == [(1, 0)]
    again = await store.create_topic("views", 1)
    assert heads(again.topic_id) == [(0, 0)]


async def test_delete_unknown_topic(store):
    with pytest.raises(UnknownTopic) as e:
        await store.delete_topic("never")
    assert e.value.error_code == 3


async def test_recreated_topic_starts_afresh(store):
    old = await store.create_topic("t", 1)
    await store.commit(commit(append(old.topic_id, 0, 0, 10, 7, pid=1, epoch=0, seq=0)))
    await store.delete_topic("t")
    new = await store.create_topic("t", 1)
    assert new.topic_id != old.topic_id
    assert store.high_watermark(new.topic_id, 0) == 0
    # No producer state carried over: the same batch is new here, not a duplicate.
    assert await store.commit(commit(append(new.topic_id, 0, 0, 10, 7, pid=1, epoch=0, seq=0))) == [ok(0)]


# -- offsets and index entries ------------------------------------------------------------------


async def test_commit_assigns_contiguous_offsets(store):
    t = (await store.create_topic("t", 2)).topic_id
    first = await store.commit(commit(append(t, 0, 0, 30, 3), append(t, 0, 30, 20, 2), append(t, 1, 50, 40, 4)))
    assert first == [ok(0), ok(3), ok(0)]
    second = await store.commit(commit(append(t, 1, 0, 5, 1), append(t, 0, 5, 5, 1)))
    assert second == [ok(4), ok(5)]
    assert store.high_watermark(t, 0) == 6
    assert store.high_watermark(t, 1) == 5


async def test_adjacent_appends_of_a_partition_share_one_entry(store):
    t = (await store.create_topic("t", 2)).topic_id
    await store.commit(
        commit(
            append(t, 0, 0, 30, 3, max_ts=500),
            append(t, 0, 30, 20, 2, max_ts=900),
            append(t, 0, 50, 10, 1, max_ts=700),
            append(t, 1, 60, 40, 4, max_ts=100),
            key="wal/a",
        )
    )
    assert store.entries(t, 0, 0) == [IndexEntry(0, 5, "wal/a", WAL, 0, 60, 900)]
    assert store.entries(t, 1, 0) == [IndexEntry(0, 3, "wal/a", WAL, 60, 40, 100)]
    await store.commit(commit(append(t, 0, 8, 12, 2, max_ts=50), key="wal/b"))
    assert store.entries(t, 0, 0) == [IndexEntry(0, 5, "wal/a", WAL, 0, 60, 900), IndexEntry(6, 7, "wal/b", WAL, 8, 12, 50)]


async def test_rejected_append_splits_the_entry(store):
    t = (await store.create_topic("t", 1)).topic_id
    await store.commit(commit(append(t, 0, 0, 10, 5, pid=7, epoch=0, seq=0)))  # seq 0..4
    results = await store.commit(
        commit(
            append(t, 0, 0, 10, 2, max_ts=1, pid=7, epoch=0, seq=5),  # 5..6 stored
            append(t, 0, 10, 10, 2, max_ts=2, pid=7, epoch=0, seq=9),  # gap: refused
            append(t, 0, 20, 10, 3, max_ts=3, pid=7, epoch=0, seq=7),  # 7..9 stored
            key="wal/x",
        )
    )
    assert results == [ok(5), refused(ErrorCode.out_of_order_sequence_number), ok(7)]
    assert store.entries(t, 0, 5) == [IndexEntry(5, 6, "wal/x", WAL, 0, 10, 1), IndexEntry(7, 9, "wal/x", WAL, 20, 10, 3)]
    assert store.high_watermark(t, 0) == 10


async def test_duplicate_append_splits_the_entry(store):
    t = (await store.create_topic("t", 1)).topic_id
    await store.commit(commit(append(t, 0, 0, 10, 2, pid=7, epoch=0, seq=0)))  # offsets 0..1
    results = await store.commit(
        commit(
            append(t, 0, 0, 10, 1, max_ts=4, pid=7, epoch=0, seq=2),  # offset 2
            append(t, 0, 10, 10, 2, max_ts=5, pid=7, epoch=0, seq=0),  # a retry of the first batch
            append(t, 0, 20, 10, 1, max_ts=6, pid=7, epoch=0, seq=3),  # offset 3
            key="wal/y",
        )
    )
    assert results == [ok(2), dup(0), ok(3)]
    assert store.entries(t, 0, 2) == [IndexEntry(2, 2, "wal/y", WAL, 0, 10, 4), IndexEntry(3, 3, "wal/y", WAL, 20, 10, 6)]


async def test_unknown_partition_is_refused_alone(store):
    t = (await store.create_topic("t", 2)).topic_id
    results = await store.commit(
        commit(append(t, 0, 0, 10, 1), append(t, 2, 10, 10, 1), append(uuid.uuid4(), 0, 20, 10, 1), append(t, 1, 30, 10, 3), key="wal/z")
    )
    assert results == [ok(0), refused(ErrorCode.unknown_topic_or_partition), refused(ErrorCode.unknown_topic_or_partition), ok(0)]
    assert store.entries(t, 0, 0) == [IndexEntry(0, 0, "wal/z", WAL, 0, 10, 0)]
    assert store.entries(t, 1, 0) == [IndexEntry(0, 2, "wal/z", WAL, 30, 10, 0)]


async def test_commit_with_nothing_stored(store):
    t = (await store.create_topic("t", 1)).topic_id
    assert await store.commit(commit(append(t, 5, 0, 10, 1))) == [refused(ErrorCode.unknown_topic_or_partition)]
    assert await store.commit(commit()) == []
    assert store.high_watermark(t, 0) == 0
    assert store.entries(t, 0, 0) == []


async def test_concurrent_commits_get_gap_free_offsets(store):
    t = (await store.create_topic("t", 3)).topic_id
    # Commit i holds i % 4 + 1 records for partition 0, i % 3 + 1 for 1 and 2 for 2.
    counts = [(i % 4 + 1, i % 3 + 1, 2) for i in range(50)]
    commits = [commit(*(append(t, p, 10 * p, 10, n) for p, n in enumerate(c)), key=f"wal/{i:02d}") for i, c in enumerate(counts)]
    all_results = await asyncio.gather(*(store.commit(c) for c in commits))

    for p in range(3):
        ranges = sorted((results[p].base_offset, counts[i][p]) for i, results in enumerate(all_results))
        expected_next = 0
        for base, n in ranges:
            assert base == expected_next
            expected_next += n
        total = sum(c[p] for c in counts)
        assert expected_next == total
        assert store.high_watermark(t, p) == total
        # One entry per commit, in offset order, each pointing at the commit that took its offsets.
        entries = store.entries(t, p, 0, max_entries=100)
        by_base = {results[p].base_offset: (commits[i].object_key, counts[i][p]) for i, results in enumerate(all_results)}
        assert [(e.base_offset, e.last_offset, e.object_key, e.start, e.size) for e in entries] == [
            (base, base + by_base[base][1] - 1, by_base[base][0], 10 * p, 10) for base, _ in ranges
        ]
    assert all(r.error_code == 0 and not r.duplicate for results in all_results for r in results)


# -- idempotent producers ---------------------------------------------------------------------------


@pytest.fixture
async def topic(store):
    return (await store.create_topic("idem", 2)).topic_id


async def test_non_idempotent_appends_are_never_checked(store, topic):
    same = append(topic, 0, 0, 10, 2)  # producer id -1: any retry is a new append
    assert await store.commit(commit(same)) == [ok(0)]
    assert await store.commit(commit(same)) == [ok(2)]


async def test_unknown_producer_may_start_at_any_sequence(store, topic):
    assert await store.commit(commit(append(topic, 0, 0, 10, 3, pid=1, epoch=4, seq=1000))) == [ok(0)]
    assert await store.commit(commit(append(topic, 0, 0, 10, 1, pid=1, epoch=4, seq=1003))) == [ok(3)]


async def test_duplicate_is_answered_with_its_original_offset(store, topic):
    await store.commit(commit(append(topic, 1, 0, 10, 5)))  # another writer takes offsets 0..4 of partition 1
    batch = append(topic, 1, 0, 10, 3, pid=1, epoch=0, seq=0)
    assert await store.commit(commit(batch)) == [ok(5)]
    assert await store.commit(commit(append(topic, 1, 0, 10, 2, pid=1, epoch=0, seq=3))) == [ok(8)]
    assert await store.commit(commit(batch)) == [dup(5)]
    assert store.high_watermark(topic, 1) == 10
    assert [e.base_offset for e in store.entries(topic, 1, 0)] == [0, 5, 8]


async def test_only_the_last_five_batches_are_remembered(store, topic):
    batches = [append(topic, 0, 0, 10, 1, pid=1, epoch=0, seq=s) for s in range(6)]
    assert [(await store.commit(commit(b)))[0] for b in batches] == [ok(o) for o in range(6)]
    assert [(await store.commit(commit(b)))[0] for b in batches[1:]] == [dup(o) for o in range(1, 6)]
    # The first is forgotten: now it is just out of sequence.
    assert await store.commit(commit(batches[0])) == [refused(ErrorCode.out_of_order_sequence_number)]


async def test_duplicate_needs_the_same_sequence_range(store, topic):
    await store.commit(commit(append(topic, 0, 0, 10, 3, pid=1, epoch=0, seq=0)))
    assert await store.commit(commit(append(topic, 0, 0, 10, 2, pid=1, epoch=0, seq=0))) == [refused(ErrorCode.out_of_order_sequence_number)]


async def test_sequence_gap_is_out_of_order(store, topic):
    await store.commit(commit(append(topic, 0, 0, 10, 3, pid=1, epoch=0, seq=0)))
    assert await store.commit(commit(append(topic, 0, 0, 10, 1, pid=1, epoch=0, seq=4))) == [refused(ErrorCode.out_of_order_sequence_number)]
    assert store.high_watermark(topic, 0) == 3
    assert await store.commit(commit(append(topic, 0, 0, 10, 1, pid=1, epoch=0, seq=3))) == [ok(3)]


async def test_old_epoch_is_fenced(store, topic):
    await store.commit(commit(append(topic, 0, 0, 10, 2, pid=1, epoch=3, seq=0)))
    assert await store.commit(commit(append(topic, 0, 0, 10, 1, pid=1, epoch=2, seq=2))) == [refused(ErrorCode.invalid_producer_epoch)]
    # Even a batch the old epoch really wrote before is fenced, not a duplicate.
    assert await store.commit(commit(append(topic, 0, 0, 10, 2, pid=1, epoch=2, seq=0))) == [refused(ErrorCode.invalid_producer_epoch)]
    assert store.high_watermark(topic, 0) == 2


async def test_new_epoch_restarts_at_sequence_zero(store, topic):
    await store.commit(commit(append(topic, 0, 0, 10, 4, pid=1, epoch=0, seq=0)))
    assert await store.commit(commit(append(topic, 0, 0, 10, 1, pid=1, epoch=1, seq=4))) == [refused(ErrorCode.out_of_order_sequence_number)]
    assert await store.commit(commit(append(topic, 0, 0, 10, 2, pid=1, epoch=1, seq=0))) == [ok(4)]
    # The new epoch's state replaced the old one: its batches are gone, its epoch is fenced.
    assert await store.commit(commit(append(topic, 0, 0, 10, 4, pid=1, epoch=0, seq=0))) == [refused(ErrorCode.invalid_producer_epoch)]
    assert await store.commit(commit(append(topic, 0, 0, 10, 2, pid=1, epoch=1, seq=0))) == [dup(4)]
    assert await store.commit(commit(append(topic, 0, 0, 10, 1, pid=1, epoch=1, seq=2))) == [ok(6)]


async def test_sequence_wraps_at_int32_max(store, topic):
    await store.commit(commit(append(topic, 0, 0, 10, 2, pid=1, epoch=0, seq=MAX_SEQ - 3)))  # ..MAX-2
    # MAX-1, MAX, 0, 1: one batch across the wrap
    assert await store.commit(commit(append(topic, 0, 0, 10, 4, pid=1, epoch=0, seq=MAX_SEQ - 1))) == [ok(2)]
    assert await store.commit(commit(append(topic, 0, 0, 10, 4, pid=1, epoch=0, seq=MAX_SEQ - 1))) == [dup(2)]
    assert await store.commit(commit(append(topic, 0, 0, 10, 1, pid=1, epoch=0, seq=3))) == [refused(ErrorCode.out_of_order_sequence_number)]
    assert await store.commit(commit(append(topic, 0, 0, 10, 1, pid=1, epoch=0, seq=2))) == [ok(6)]


async def test_sequence_after_int32_max_is_zero(store, topic):
    await store.commit(commit(append(topic, 0, 0, 10, 1, pid=1, epoch=0, seq=MAX_SEQ)))
    assert await store.commit(commit(append(topic, 0, 0, 10, 1, pid=1, epoch=0, seq=MAX_SEQ + 1))) == [refused(ErrorCode.out_of_order_sequence_number)]
    assert await store.commit(commit(append(topic, 0, 0, 10, 1, pid=1, epoch=0, seq=0))) == [ok(1)]


async def test_producer_state_is_per_partition_and_per_producer(store, topic):
    await store.commit(commit(append(topic, 0, 0, 10, 3, pid=1, epoch=0, seq=0)))
    results = await store.commit(
        commit(
            append(topic, 0, 0, 10, 1, pid=2, epoch=0, seq=50),  # another producer: unknown, any sequence
            append(topic, 1, 10, 10, 1, pid=1, epoch=0, seq=0),  # same producer, other partition: unknown there
            append(topic, 1, 20, 10, 1, pid=1, epoch=0, seq=3),  # ...and now known there: a gap
        )
    )
    assert results == [ok(3), ok(0), refused(ErrorCode.out_of_order_sequence_number)]


async def test_appends_of_one_commit_are_checked_in_order(store, topic):
    results = await store.commit(
        commit(
            append(topic, 0, 0, 10, 3, pid=1, epoch=0, seq=0),
            append(topic, 0, 10, 10, 2, pid=1, epoch=0, seq=3),
            append(topic, 0, 20, 10, 2, pid=1, epoch=0, seq=3),  # a retry inside the same object
            append(topic, 0, 30, 10, 1, pid=1, epoch=0, seq=9),
            append(topic, 0, 40, 10, 1, pid=1, epoch=1, seq=0),  # bump: later appends see epoch 1
            append(topic, 0, 50, 10, 1, pid=1, epoch=0, seq=5),
            key="wal/o",
        )
    )
    assert results == [ok(0), ok(3), dup(3), refused(ErrorCode.out_of_order_sequence_number), ok(5), refused(ErrorCode.invalid_producer_epoch)]
    assert store.entries(topic, 0, 0) == [IndexEntry(0, 4, "wal/o", WAL, 0, 20, 0), IndexEntry(5, 5, "wal/o", WAL, 40, 10, 0)]


# -- producer ids -------------------------------------------------------------------------------------


async def test_init_producer_id(store):
    # Ids are distinct and increasing (backends may allocate them in blocks, so not contiguous).
    first, epoch = await store.init_producer_id()
    assert epoch == 0
    second = (await store.init_producer_id())[0]
    assert second > first
    assert await store.init_producer_id(first, 0) == (first, 1)  # KIP-360: same id, epoch bumped
    assert await store.init_producer_id(first, 1) == (first, 2)
    stale = await store.init_producer_id(first, 0)  # a stale epoch gets a fresh id
    assert stale[1] == 0 and stale[0] > second
    never = await store.init_producer_id(10**12, 0)  # so does an id never handed out
    assert never[1] == 0 and never[0] > stale[0]
    last = await store.init_producer_id(-1, -1)
    assert last[1] == 0 and last[0] > never[0]


async def test_concurrent_init_producer_ids_are_distinct(store):
    ids = await asyncio.gather(*(store.init_producer_id() for _ in range(20)))
    assert len({pid for pid, _ in ids}) == 20 and {epoch for _, epoch in ids} == {0}


# -- lookups --------------------------------------------------------------------------------------------


@pytest.fixture
async def indexed(store):
    """Partition 0 with entries [0-2] ts 300, [3-3] ts 100, [4-8] ts 500, [9-10] ts 200."""
    t = (await store.create_topic("ix", 2)).topic_id
    for key, count, ts in [("a", 3, 300), ("b", 1, 100), ("c", 5, 500), ("d", 2, 200)]:
        await store.commit(commit(append(t, 0, 16, 8 * count, count, max_ts=ts), key=key))
    return t


def entry(base: int, last: int, key: str, ts: int) -> IndexEntry:
    return IndexEntry(base, last, key, WAL, 16, 8 * (last - base + 1), ts)


A, B, C, D = entry(0, 2, "a", 300), entry(3, 3, "b", 100), entry(4, 8, "c", 500), entry(9, 10, "d", 200)


@pytest.mark.parametrize(
    ("offset", "max_entries", "expected"),
    [
        (0, 64, [A, B, C, D]),
        (2, 64, [A, B, C, D]),
        (3, 64, [B, C, D]),
        (6, 2, [C, D]),
        (8, 1, [C]),
        (9, 64, [D]),
        (10, 64, [D]),
        (11, 64, []),  # the high watermark: nothing yet
        (500, 64, []),
        (-5, 2, [A, B]),  # below the log start: from the first entry
        (0, 0, []),
    ],
)
async def test_entries_from_offset(store, indexed, offset, max_entries, expected):
    assert store.entries(indexed, 0, offset, max_entries) == expected


@pytest.mark.parametrize(
    ("timestamp", "expected"),
    [(-1, A), (0, A), (300, A), (301, C), (350, C), (500, C), (501, None)],
)
async def test_entry_for_timestamp(store, indexed, timestamp, expected):
    # Max timestamps are not monotonic (300, 100, 500, 200): the first entry reaching the target wins.
    assert store.entry_for_timestamp(indexed, 0, timestamp) == expected


async def test_reads_of_unknown_partitions_are_empty(store, indexed):
    for topic_id, partition in [(indexed, 1), (indexed, 7), (uuid.uuid4(), 0)]:
        assert store.high_watermark(topic_id, partition) == 0
        assert store.log_start_offset(topic_id, partition) == 0
        assert store.entries(topic_id, partition, 0) == []
        assert store.entry_for_timestamp(topic_id, partition, 0) is None


# -- waiting for commits ----------------------------------------------------------------------------------


async def test_wait_for_commit_wakes_on_commit(store):
    t = (await store.create_topic("w", 2)).topic_id
    waiter = asyncio.create_task(store.wait_for_commit([(t, 1), (t, 5)], timeout=30))
    await asyncio.sleep(0)  # let the waiter register; not a delay
    assert not waiter.done()
    await store.commit(commit(append(t, 1, 0, 10, 1)))
    assert await waiter is True


async def test_wait_for_commit_times_out(store):
    t = (await store.create_topic("w", 2)).topic_id
    assert await store.wait_for_commit([(t, 0)], timeout=0.05) is False


async def test_wait_for_commit_ignores_other_partitions_and_refusals(store):
    t = (await store.create_topic("w", 2)).topic_id
    await store.commit(commit(append(t, 0, 0, 10, 1, pid=1, epoch=0, seq=0)))
    waiter = asyncio.create_task(store.wait_for_commit([(t, 0)], timeout=0.2))
    await asyncio.sleep(0)
    await store.commit(commit(append(t, 1, 0, 10, 1)))  # another partition
    await store.commit(commit(append(t, 0, 0, 10, 1, pid=1, epoch=0, seq=0)))  # a duplicate: no growth
    await store.commit(commit(append(t, 0, 0, 10, 1, pid=1, epoch=0, seq=7)))  # refused
    assert await waiter is False


# -- fencing objects off (the orphan sweeper) -------------------------------------------------------------


async def test_fence_returns_only_objects_no_commit_named_and_refuses_their_commits(store):
    t = (await store.create_topic("f", 2)).topic_id
    assert await store.commit(commit(append(t, 0, 0, 10, 3), key="wal/committed")) == [ok(0)]
    deletable = await store.fence_objects(["wal/committed", "wal/orphan", "wal/late"])
    assert deletable == {"wal/orphan", "wal/late"}
    # A commit that arrives after the fence commits nothing, and says so with a retriable error.
    with pytest.raises(ObjectFenced) as e:
        await store.commit(commit(append(t, 0, 0, 10, 2), append(t, 1, 10, 10, 4), key="wal/late"))
    assert isinstance(e.value, MetadataUnavailable) and e.value.error_code == MetadataUnavailable.error_code
    assert [store.high_watermark(t, p) for p in (0, 1)] == [3, 0]
    assert "wal/late" not in store.referenced_objects()
    # Objects never fenced commit as before; fencing nothing fences nothing.
    assert await store.commit(commit(append(t, 1, 0, 10, 4), key="wal/next")) == [ok(0)]
    assert await store.fence_objects([]) == set()


# -- durability ---------------------------------------------------------------------------------------------


async def test_everything_survives_a_restart(open_store):
    store = await open_store()
    orders = await store.create_topic("orders", 2, {"cleanup.policy": "delete"})
    scratch = await store.create_topic("scratch", 1)
    gone = await store.create_topic("gone", 1)
    o = orders.topic_id
    await store.commit(commit(append(o, 0, 0, 10, 3, max_ts=30, pid=5, epoch=2, seq=0), append(o, 1, 10, 10, 2, max_ts=20), key="w1"))
    await store.commit(commit(append(o, 0, 0, 10, 2, max_ts=10, pid=5, epoch=2, seq=3), append(gone.topic_id, 0, 10, 5, 1), key="w2"))
    await store.delete_topic("gone")
    issued = [await store.init_producer_id() for _ in range(3)]
    assert [epoch for _, epoch in issued] == [0, 0, 0]
    pid = issued[1][0]
    assert await store.init_producer_id(pid, 0) == (pid, 1)
    await store.close()

    store = await open_store()
    assert dict(store.topics()) == {"orders": orders, "scratch": scratch}
    assert store.topic_by_id(o) == orders and store.topic_by_id(gone.topic_id) is None
    assert [store.high_watermark(o, p) for p in (0, 1)] == [5, 2]
    assert store.high_watermark(scratch.topic_id, 0) == 0
    assert store.entries(o, 0, 0) == [IndexEntry(0, 2, "w1", WAL, 0, 10, 30), IndexEntry(3, 4, "w2", WAL, 0, 10, 10)]
    assert store.entries(o, 1, 0) == [IndexEntry(0, 1, "w1", WAL, 10, 10, 20)]
    assert store.entry_for_timestamp(o, 0, 25) == IndexEntry(0, 2, "w1", WAL, 0, 10, 30)
    assert store.entries(gone.topic_id, 0, 0) == []
    assert [(v.next_offset, v.from_offset(0, 64)) for v in store.topic_views(o)] == [(5, store.entries(o, 0, 0)), (2, store.entries(o, 1, 0))]
    assert list(store.topic_views(gone.topic_id)) == []
    # Producer state: both remembered batches are duplicates, the sequence and epoch carry on.
    results = await store.commit(
        commit(
            append(o, 0, 0, 10, 3, pid=5, epoch=2, seq=0),
            append(o, 0, 0, 10, 2, pid=5, epoch=2, seq=3),
            append(o, 0, 0, 10, 1, pid=5, epoch=2, seq=6),
            append(o, 0, 0, 10, 1, pid=5, epoch=1, seq=5),
            append(o, 0, 0, 10, 1, pid=5, epoch=2, seq=5),
            key="w3",
        )
    )
    assert results == [dup(0), dup(3), refused(ErrorCode.out_of_order_sequence_number), refused(ErrorCode.invalid_producer_epoch), ok(5)]
    # The producer-id counter and epoch table.
    fresh, epoch = await store.init_producer_id()
    assert epoch == 0 and fresh > max(p for p, _ in issued)  # never reused after a restart
    issued.append((fresh, 0))
    assert await store.init_producer_id(pid, 1) == (pid, 2)
    await store.close()

    store = await open_store()
    assert store.high_watermark(o, 0) == 6
    assert store.entries(o, 0, 5) == [IndexEntry(5, 5, "w3", WAL, 0, 10, 0)]
    fresh, epoch = await store.init_producer_id()
    assert epoch == 0 and fresh > max(p for p, _ in issued)
    assert await store.init_producer_id(pid, 2) == (pid, 3)


# -- the range replace (compaction's index swap) ------------------------------------------------

PARQUET = ObjectType.PARQUET


async def _three_objects(store):
    """p0: A 0-4, B 5-9, C 10-14; p1: A 0-2 (object A is shared by both partitions)."""
    t = (await store.create_topic("t", 2)).topic_id
    await store.commit(commit(append(t, 0, 0, 50, 5, max_ts=40), append(t, 1, 50, 30, 3, max_ts=7), key="wal/A"))
    await store.commit(commit(append(t, 0, 0, 50, 5, max_ts=20), key="wal/B"))
    await store.commit(commit(append(t, 0, 0, 50, 5, max_ts=60), key="wal/C"))
    return t


async def test_a_range_of_entries_is_replaced_by_one(store):
    t = await _three_objects(store)
    a, b, c = store.entries(t, 0, 0)
    shared = store.entries(t, 1, 0)
    parquet = IndexEntry(0, 9, "table/data/f1.parquet", PARQUET, 0, 10, 40)
    assert await store.replace_entries(t, 0, [a, b], parquet) is True
    assert store.entries(t, 0, 0) == [parquet, c]
    for offset in range(10):  # every offset of the range is found in the new entry
        assert store.entries(t, 0, offset, max_entries=1) == [parquet]
    assert store.entries(t, 0, 12) == [c]  # what was not replaced is unchanged, byte range and all
    assert store.entries(t, 1, 0) == shared
    assert (store.high_watermark(t, 0), store.high_watermark(t, 1)) == (15, 3)
    assert store.entry_for_timestamp(t, 0, 41) == c and store.entry_for_timestamp(t, 0, 30) == parquet
    # B is no longer referenced by anything; A still is, by partition 1, until that is replaced too.
    assert {"wal/A", "wal/C"} <= store.referenced_objects() and "wal/B" not in store.referenced_objects()
    assert await store.replace_entries(t, 1, shared, IndexEntry(0, 2, "table/data/f2.parquet", PARQUET, 0, 3, 7)) is True
    assert "wal/A" not in store.referenced_objects()
    # Replaced entries can be replaced again (merging files): the parquet entry and C become one.
    merged = IndexEntry(0, 14, "table/data/f3.parquet", PARQUET, 0, 15, 60)
    assert await store.replace_entries(t, 0, [parquet, c], merged) is True
    assert store.entries(t, 0, 0) == [merged] and store.referenced_objects() == {"table/data/f2.parquet", "table/data/f3.parquet"}


async def test_a_replace_of_entries_no_longer_there_changes_nothing(store):
    t = await _three_objects(store)
    a, b, c = store.entries(t, 0, 0)
    assert await store.replace_entries(t, 0, [a, b], IndexEntry(0, 9, "f1", PARQUET, 0, 10, 40)) is True
    # A second compactor that planned the same range (or an overlapping one) loses.
    assert await store.replace_entries(t, 0, [a, b], IndexEntry(0, 9, "f1-again", PARQUET, 0, 10, 40)) is False
    assert await store.replace_entries(t, 0, [b, c], IndexEntry(5, 14, "f2", PARQUET, 0, 10, 60)) is False
    assert [e.object_key for e in store.entries(t, 0, 0)] == ["f1", "wal/C"]


async def test_a_fenced_replace_happens_only_while_its_lead_holds(store):
    t = await _three_objects(store)
    a, b, c = store.entries(t, 0, 0)
    first = await store.campaign("compactor", "one")
    assert await first.wait_leading(60.0)
    second = await store.campaign("compactor", "two")
    deposed = first.fence()
    parquet = IndexEntry(0, 4, "f1", PARQUET, 0, 5, 40)
    assert await store.replace_entries(t, 0, [a], parquet, fence=deposed) is True
    await first.resign()
    assert await second.wait_leading(60.0)
    assert second.fence() != deposed
    # The deposed lead's swap changes nothing, even though its entries are still the ones to replace.
    with pytest.raises(Fenced):
        await store.replace_entries(t, 0, [b], IndexEntry(5, 9, "f2-deposed", PARQUET, 0, 5, 20), fence=deposed)
    with pytest.raises(Fenced):  # a name nobody holds fences every write
        await store.replace_entries(t, 0, [b], IndexEntry(5, 9, "f2-nobody", PARQUET, 0, 5, 20), fence=Fence("nobody", deposed.epoch))
    assert store.entries(t, 0, 0) == [parquet, b, c]
    assert await store.replace_entries(t, 0, [b], IndexEntry(5, 9, "f2", PARQUET, 0, 5, 20), fence=second.fence()) is True
    assert [e.object_key for e in store.entries(t, 0, 0)] == ["f1", "f2", "wal/C"]
    await second.resign()


async def test_concurrent_replaces_of_one_range_one_wins(store):
    t = await _three_objects(store)
    a, b, _ = store.entries(t, 0, 0)
    won = await asyncio.gather(*(store.replace_entries(t, 0, [a, b], IndexEntry(0, 9, f"f{i}", PARQUET, 0, 10, 40)) for i in range(4)))
    assert sorted(won) == [False, False, False, True]
    assert store.entries(t, 0, 0)[0].object_key == f"f{won.index(True)}"


async def test_a_replacement_must_cover_exactly_whole_entries(store):
    t = await _three_objects(store)
    a, b, c = store.entries(t, 0, 0)
    for replaced, replacement in (
        ([a, b], IndexEntry(0, 8, "short", PARQUET, 0, 9, 40)),  # does not reach B's last offset
        ([a, b], IndexEntry(1, 9, "late", PARQUET, 0, 9, 40)),  # does not start at A's base offset
        ([a, c], IndexEntry(0, 14, "gap", PARQUET, 0, 15, 60)),  # A and C do not follow one another
        ([], IndexEntry(0, 4, "nothing", PARQUET, 0, 5, 40)),
    ):
        with pytest.raises(ValueError):
            await store.replace_entries(t, 0, replaced, replacement)
    with pytest.raises(UnknownTopic):
        await store.replace_entries(uuid.uuid4(), 0, [a], IndexEntry(0, 4, "f", PARQUET, 0, 5, 40))
    assert store.entries(t, 0, 0) == [a, b, c]


async def test_replaces_keep_up_with_commits_to_the_same_partition(store):
    """Commits go on while earlier ranges are replaced: every offset is in exactly one entry."""
    t = (await store.create_topic("t", 1)).topic_id
    stop = asyncio.Event()

    async def produce() -> None:
        n = 0
        while not stop.is_set():
            await store.commit(commit(append(t, 0, 0, 20, 2, max_ts=n), key=f"wal/{n:04d}"))
            n += 1
            await asyncio.sleep(0)

    producing = asyncio.create_task(produce())
    replaced = 0
    try:
        for round_ in range(10):
            while len(wal := [e for e in store.entries(t, 0, 0, max_entries=10_000) if e.object_type == WAL]) < 3:
                await asyncio.sleep(0.001)
            first, *_, last = wal[:3]
            assert await store.replace_entries(t, 0, wal[:3], IndexEntry(first.base_offset, last.last_offset, f"table/{round_}", PARQUET, 0, 6, last.max_timestamp)) is True
            replaced += 1
    finally:
        stop.set()
        await producing
    entries = store.entries(t, 0, 0, max_entries=100_000)
    assert [e.base_offset for e in entries] == [0] + [e.last_offset + 1 for e in entries[:-1]]  # no gap, no overlap
    assert entries[-1].last_offset + 1 == store.high_watermark(t, 0)
    assert sum(e.object_type == PARQUET for e in entries) == replaced == 10


async def test_a_replace_survives_a_restart(open_store):
    store = await open_store()
    t = await _three_objects(store)
    a, b, c = store.entries(t, 0, 0)
    parquet = IndexEntry(0, 9, "table/f1.parquet", PARQUET, 0, 10, 40)
    assert await store.replace_entries(t, 0, [a, b], parquet)
    await store.close()
    store = await open_store()
    assert store.entries(t, 0, 0) == [parquet, c]
    assert "wal/B" not in store.referenced_objects()

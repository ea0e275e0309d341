"""Transactions in the sequencer and the stores: a producer's open transaction holds its
partition's last stable offset back until a marker ends it; an abort marker records the aborted
range, which read_committed fetches return; both survive a restart on every durable backend."""

from __future__ import annotations

import uuid
from dataclasses import replace

from kio.schema.errors import ErrorCode

from metadata.model import ABORT_MARKER, COMMIT_MARKER, AbortedTransaction, Append, CommittedTransaction, IndexEntry, ObjectType
from metadata.sequencer import Head, ProducerState, sequence

from .helpers import append, commit, open_etcd_store

T = uuid.UUID(int=7)


def txn(partition: int, start: int, count: int, pid: int, epoch: int, seq: int) -> Append:
    return replace(append(T, partition, start, 10 * count, count, pid=pid, epoch=epoch, seq=seq), transactional=True)


def marker(partition: int, start: int, pid: int, epoch: int, kind: int) -> Append:
    return Append(T, partition, start, 10, 1, 0, producer_id=pid, producer_epoch=epoch, base_sequence=-1, transactional=True, control=kind)


def test_a_transactional_batch_opens_the_transaction_and_its_marker_ends_it():
    first = sequence(commit(append(T, 0, 0, 10, 1), txn(0, 10, 3, pid=5, epoch=0, seq=0)), {(T, 0): Head(4)}, {})
    state = first.producers[(5, T, 0)]
    assert state.txn_first_offset == 5  # after the non-transactional record at 4
    second = sequence(commit(txn(0, 0, 2, pid=5, epoch=0, seq=3)), {(T, 0): Head(8)}, first.producers)
    assert second.producers[(5, T, 0)].txn_first_offset == 5  # still the transaction's first offset
    ended = sequence(commit(marker(0, 0, 5, 0, COMMIT_MARKER)), {(T, 0): Head(10)}, second.producers)
    assert ended.results[0].base_offset == 10  # a marker takes an offset
    assert ended.producers[(5, T, 0)] == ProducerState(0, second.producers[(5, T, 0)].batches, -1, 10)  # batches kept at the same epoch; the marker's offset
    assert ended.aborted == {}


def test_a_late_batch_of_an_ended_transaction_is_refused_by_its_guard():
    """Issue 42 finding 1: a transactional batch verified while its transaction was open (guard:
    the producer's last marker offset then, -1) is held up behind a slow PUT; the transaction is
    aborted (its marker at 4). Sequenced after the marker, the batch would open a transaction the
    producer's next one's marker commits (an aborted read). Its guard no longer holds: refused,
    retriably, and the partition's state is unchanged. The next transaction's batches, verified
    after the marker (guard 4), are stored; a duplicate's retry is still answered as a duplicate."""
    guarded = lambda start, count, seq, guard: replace(txn(0, start, count, pid=5, epoch=0, seq=seq), txn_guard=guard)  # noqa: E731
    first = sequence(commit(guarded(0, 2, 0, -1)), {(T, 0): Head(0)}, {})
    assert [(r.error_code, r.base_offset) for r in first.results] == [(0, 0)]
    assert first.producers[(5, T, 0)].last_marker == -1
    ended = sequence(commit(marker(0, 0, 5, 0, ABORT_MARKER)), {(T, 0): Head(2)}, first.producers)
    assert ended.producers[(5, T, 0)] == ProducerState(0, first.producers[(5, T, 0)].batches, -1, 2)
    late = sequence(commit(guarded(0, 1, 2, -1)), {(T, 0): Head(3)}, ended.producers)
    assert [(r.error_code, r.base_offset) for r in late.results] == [(ErrorCode.not_enough_replicas, -1)]
    assert late.producers == {} and late.heads == {}
    retried = sequence(commit(guarded(0, 2, 0, -1)), {(T, 0): Head(3)}, ended.producers)
    assert [(r.error_code, r.base_offset, r.duplicate) for r in retried.results] == [(0, 0, True)]
    current = sequence(commit(guarded(0, 1, 2, 2), guarded(10, 1, 3, 2)), {(T, 0): Head(3)}, ended.producers)
    assert [(r.error_code, r.base_offset) for r in current.results] == [(0, 3), (0, 4)]
    assert current.producers[(5, T, 0)].txn_first_offset == 3
    # a guard taken from a state the sequencer does not have (expired since) is refused too
    unknown = sequence(commit(replace(txn(0, 0, 1, pid=6, epoch=0, seq=0), txn_guard=7)), {(T, 0): Head(5)}, {})
    assert [r.error_code for r in unknown.results] == [ErrorCode.not_enough_replicas]
    # a fenced producer is told so, whatever its guard (the abort that fenced it bumped the epoch)
    bumped = sequence(commit(marker(0, 0, 5, 1, ABORT_MARKER)), {(T, 0): Head(5)}, current.producers)
    fenced = sequence(commit(guarded(0, 1, 4, -1)), {(T, 0): Head(6)}, bumped.producers)
    assert [r.error_code for r in fenced.results] == [ErrorCode.invalid_producer_epoch]


def test_a_marker_ends_only_the_transaction_it_names():
    """Issue 42 finding 3: a marker carries the coordinator's generation of the transaction it ends.
    A late one (its transaction completed by another broker's sweep, or its EndTxn retried
    elsewhere) found the producer's next transaction open here and ended it: a late commit
    committed the next one's first records, a late abort hid them. It changes nothing now, takes
    no offset and records no aborted range; a batch verified for an ended transaction is refused."""
    named = lambda start, count, seq, generation: replace(txn(0, start, count, pid=5, epoch=0, seq=seq), txn_generation=generation)  # noqa: E731
    end = lambda kind, generation: replace(marker(0, 0, 5, 0, kind), txn_generation=generation)  # noqa: E731
    first = sequence(commit(named(0, 2, 0, 1)), {(T, 0): Head(0)}, {})
    committed = sequence(commit(end(COMMIT_MARKER, 1)), {(T, 0): Head(2)}, first.producers)
    assert committed.producers[(5, T, 0)] == ProducerState(0, first.producers[(5, T, 0)].batches, -1, 2, 1)
    second = sequence(commit(named(0, 2, 2, 2)), {(T, 0): Head(3)}, committed.producers)
    state = second.producers[(5, T, 0)]
    assert (state.txn_first_offset, state.txn_generation) == (3, 2)
    for kind in (COMMIT_MARKER, ABORT_MARKER):  # the first transaction's marker, again and late
        late = sequence(commit(end(kind, 1)), {(T, 0): Head(5)}, second.producers)
        assert [(r.error_code, r.base_offset) for r in late.results] == [(0, -1)]
        assert (late.heads, late.entries, late.producers, late.aborted) == ({}, {}, {}, {})
    # a batch verified for the first transaction, late, joins no other
    joined = sequence(commit(named(0, 1, 4, 1)), {(T, 0): Head(5)}, second.producers)
    assert [r.error_code for r in joined.results] == [ErrorCode.not_enough_replicas] and joined.heads == {}
    aborted = sequence(commit(end(ABORT_MARKER, 2)), {(T, 0): Head(5)}, second.producers)
    assert [r.base_offset for r in aborted.results] == [5]
    assert aborted.aborted == {(T, 0): [AbortedTransaction(5, 3, 5)]}
    again = sequence(commit(end(COMMIT_MARKER, 2)), {(T, 0): Head(6)}, aborted.producers)
    assert [r.base_offset for r in again.results] == [-1] and again.producers == {}  # ended already
    # a marker of a later transaction that wrote nothing here is stored, as Kafka writes it
    later = sequence(commit(end(ABORT_MARKER, 3)), {(T, 0): Head(6)}, aborted.producers)
    assert [r.base_offset for r in later.results] == [6] and later.aborted == {}
    assert later.producers[(5, T, 0)] == ProducerState(0, aborted.producers[(5, T, 0)].batches, -1, 6, 3)
    # an unnamed marker (a state or a marker from before generations) ends whatever is open
    unnamed = sequence(commit(marker(0, 0, 5, 0, COMMIT_MARKER)), {(T, 0): Head(5)}, second.producers)
    assert [r.base_offset for r in unnamed.results] == [5] and unnamed.producers[(5, T, 0)].txn_first_offset == -1


def test_a_marker_naming_its_transaction_by_first_offset_ends_only_that_one():
    """The sweep's abort of a hanging transaction names it by its first offset (it has no
    generation to go by): if that transaction ended meanwhile, and the producer opened another,
    the marker changes nothing."""
    opened = sequence(commit(txn(0, 0, 2, pid=5, epoch=0, seq=0)), {(T, 0): Head(4)}, {})
    hanging = replace(marker(0, 0, 5, 0, ABORT_MARKER), txn_guard=4)
    ended = sequence(commit(hanging), {(T, 0): Head(6)}, opened.producers)
    assert [r.base_offset for r in ended.results] == [6] and ended.aborted == {(T, 0): [AbortedTransaction(6, 4, 5)]}
    closed = sequence(commit(marker(0, 0, 5, 0, COMMIT_MARKER)), {(T, 0): Head(6)}, opened.producers)
    again = sequence(commit(txn(0, 0, 1, pid=5, epoch=0, seq=2)), {(T, 0): Head(7)}, closed.producers)
    assert again.producers[(5, T, 0)].txn_first_offset == 7
    late = sequence(commit(hanging), {(T, 0): Head(8)}, again.producers)
    assert [r.base_offset for r in late.results] == [-1] and (late.producers, late.aborted) == ({}, {})
    assert [r.base_offset for r in sequence(commit(hanging), {(T, 0): Head(7)}, closed.producers).results] == [-1]


def test_an_abort_marker_records_the_aborted_range():
    opened = sequence(commit(txn(1, 0, 3, pid=9, epoch=2, seq=0)), {(T, 1): Head(20)}, {})
    aborted = sequence(commit(marker(1, 0, 9, 2, ABORT_MARKER)), {(T, 1): Head(23)}, opened.producers)
    assert aborted.aborted == {(T, 1): [AbortedTransaction(23, 20, 9)]}
    assert aborted.producers[(9, T, 1)].txn_first_offset == -1


def test_a_marker_with_a_stale_epoch_is_refused_and_a_newer_one_starts_its_epoch():
    opened = sequence(commit(txn(0, 0, 1, pid=3, epoch=4, seq=0)), {(T, 0): Head(0)}, {})
    stale = sequence(commit(marker(0, 0, 3, 3, ABORT_MARKER)), {(T, 0): Head(1)}, opened.producers)
    assert stale.results[0].error_code == ErrorCode.invalid_producer_epoch and not stale.changed
    bumped = sequence(commit(marker(0, 0, 3, 5, ABORT_MARKER)), {(T, 0): Head(1)}, opened.producers)
    assert bumped.producers[(3, T, 0)] == ProducerState(5, (), -1, 1)  # the marker at offset 1
    # at the new epoch the producer starts at sequence 0, and only there
    producers = bumped.producers
    assert sequence(commit(txn(0, 0, 1, pid=3, epoch=5, seq=1)), {(T, 0): Head(2)}, producers).results[0].error_code == ErrorCode.out_of_order_sequence_number
    assert sequence(commit(txn(0, 0, 1, pid=3, epoch=5, seq=0)), {(T, 0): Head(2)}, producers).results[0].base_offset == 2
    # the zombie at the old epoch is fenced
    assert sequence(commit(txn(0, 0, 1, pid=3, epoch=4, seq=1)), {(T, 0): Head(2)}, producers).results[0].error_code == ErrorCode.invalid_producer_epoch


def test_a_marker_for_a_partition_the_producer_never_wrote_is_stored():
    got = sequence(commit(marker(0, 0, 8, 0, COMMIT_MARKER)), {(T, 0): Head(3)}, {})
    assert got.results[0].base_offset == 3 and got.heads == {(T, 0): 4}
    assert got.producers[(8, T, 0)] == ProducerState(0, (), -1, 3) and got.aborted == {}


async def test_last_stable_offset_and_aborted_transactions_in_the_store(open_store):
    store = await open_store()
    t = (await store.create_topic("txns", 2)).topic_id

    def data(partition, pid, seq, count=2, transactional=True):
        return replace(append(t, partition, 0, 10, count, pid=pid, epoch=0, seq=seq), transactional=transactional)

    def end(partition, pid, kind):
        return Append(t, partition, 0, 10, 1, 0, producer_id=pid, producer_epoch=0, base_sequence=-1, transactional=True, control=kind)

    await store.commit(commit(append(t, 0, 0, 10, 3)))  # 0-2, no transaction
    await store.commit(commit(data(0, pid=1, seq=0)))  # 3-4 producer 1
    await store.commit(commit(data(0, pid=2, seq=0)))  # 5-6 producer 2
    view = store.topic_views(t)[0]
    assert (view.last_stable_offset, view.next_offset) == (3, 7)
    await store.commit(commit(end(0, 1, ABORT_MARKER)))  # 7: producer 1 aborts
    assert view.last_stable_offset == 5
    await store.commit(commit(data(0, pid=1, seq=2)))  # 8-9 producer 1's next transaction
    await store.commit(commit(end(0, 2, COMMIT_MARKER)))  # 10: producer 2 commits
    assert view.last_stable_offset == 8
    assert view.aborted_between(0, 100) == [AbortedTransaction(7, 3, 1)]
    assert store.topic_views(t)[1].last_stable_offset == 0

    reopened = await open_store()
    again = reopened.topic_views(t)[0]
    assert (again.last_stable_offset, again.next_offset) == (8, 11)
    assert again.aborted_between(0, 100) == [AbortedTransaction(7, 3, 1)]
    assert again.aborted_between(8, 100) == [] and again.aborted_between(0, 2) == []
    await reopened.commit(commit(end(0, 1, ABORT_MARKER)))  # 11
    assert (again.last_stable_offset, again.aborted_between(8, 11)) == (12, [AbortedTransaction(11, 8, 1)])
    if hasattr(store, "_view_reaches"):  # the first store follows the second's commit through its watch
        assert await store._view_reaches(again.mod_revision, 30)
        assert (view.last_stable_offset, view.aborted_between(0, 100)) == (12, [AbortedTransaction(7, 3, 1), AbortedTransaction(11, 8, 1)])


async def test_a_compacted_range_forgets_its_aborted_transactions(open_store):
    store = await open_store()
    t = (await store.create_topic("gone", 1)).topic_id
    await store.commit(commit(replace(append(t, 0, 0, 10, 2, pid=4, epoch=0, seq=0), transactional=True)))  # 0-1
    await store.commit(commit(Append(t, 0, 0, 10, 1, 0, producer_id=4, producer_epoch=0, base_sequence=-1, transactional=True, control=ABORT_MARKER)))  # 2
    await store.commit(commit(replace(append(t, 0, 0, 10, 2, pid=4, epoch=0, seq=2), transactional=True)))  # 3-4
    await store.commit(commit(Append(t, 0, 0, 10, 1, 0, producer_id=4, producer_epoch=0, base_sequence=-1, transactional=True, control=ABORT_MARKER)))  # 5
    view = store.topic_views(t)[0]
    assert view.aborted_between(0, 5) == [AbortedTransaction(2, 0, 4), AbortedTransaction(5, 3, 4)]
    replaced = store.entries(t, 0, 0, max_entries=2)
    assert await store.replace_entries(t, 0, replaced, IndexEntry(0, 2, "table/f.parquet", ObjectType.PARQUET, 0, 2, 0))
    assert view.aborted_between(0, 5) == [AbortedTransaction(5, 3, 4)]
    reopened = await open_store()
    assert reopened.topic_views(t)[0].aborted_between(0, 5) == [AbortedTransaction(5, 3, 4)]


async def test_committed_transactions_are_kept_by_name_until_the_table_holds_them(open_store):
    """Issue 42 finding 4: the compactor takes a transaction into the table on all its partitions
    together, so the view keeps each committed one's range and name (producer, generation) while
    its marker is in the WAL: stored with the commit, read back by a new store, dropped when a
    table entry covers its marker. An abort is not one of them."""
    store = await open_store()
    t = (await store.create_topic("kept", 2)).topic_id

    def data(partition, seq, generation):
        return replace(append(t, partition, 0, 10, 2, pid=4, epoch=0, seq=seq), transactional=True, txn_generation=generation)

    def end(partition, kind, generation):
        return Append(t, partition, 0, 10, 1, 0, producer_id=4, producer_epoch=0, base_sequence=-1, transactional=True, control=kind, txn_generation=generation)

    await store.commit(commit(data(0, 0, 1), data(1, 0, 1)))  # p0 0-1, p1 0-1
    await store.commit(commit(end(0, COMMIT_MARKER, 1), end(1, COMMIT_MARKER, 1)))  # p0 2, p1 2
    await store.commit(commit(data(0, 2, 2)))  # p0 3-4
    await store.commit(commit(end(0, ABORT_MARKER, 2)))  # p0 5
    await store.commit(commit(data(0, 4, 3)))  # p0 6-7
    await store.commit(commit(end(0, COMMIT_MARKER, 3)))  # p0 8
    view = store.topic_views(t)[0]
    assert view.committed_from(0) == [CommittedTransaction(2, 0, 4, 1), CommittedTransaction(8, 6, 4, 3)]
    assert view.committed_from(3) == [CommittedTransaction(8, 6, 4, 3)]
    assert store.topic_views(t)[1].committed_from(0) == [CommittedTransaction(2, 0, 4, 1)]
    assert (await open_store()).topic_views(t)[0].committed_from(0) == view.committed_from(0)
    replaced = store.entries(t, 0, 0, max_entries=2)
    assert await store.replace_entries(t, 0, replaced, IndexEntry(0, 2, "table/f.parquet", ObjectType.PARQUET, 0, 2, 0))
    assert view.committed_from(0) == [CommittedTransaction(8, 6, 4, 3)]
    reopened = await open_store()
    assert reopened.topic_views(t)[0].committed_from(0) == [CommittedTransaction(8, 6, 4, 3)]
    assert reopened.topic_views(t)[1].committed_from(0) == [CommittedTransaction(2, 0, 4, 1)]


async def test_the_etcd_view_catches_up_with_what_another_store_made_durable(etcd_server):
    root = f"caught-{uuid.uuid4().hex[:8]}"
    writer, reader = await open_etcd_store(etcd_server, root), await open_etcd_store(etcd_server, root)
    t = (await writer.create_topic("caught", 1)).topic_id
    await reader.view_caught_up()
    assert reader.topic_by_id(t) is not None
    for _ in range(3):
        await writer.commit(commit(append(t, 0, 0, 10, 2)))
        await reader.view_caught_up()  # returns only once the reader's view has the commit
        assert reader.topic_views(t)[0].next_offset == writer.topic_views(t)[0].next_offset
    await writer.close()
    await reader.close()

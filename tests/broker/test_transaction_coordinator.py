"""The transaction coordinator over a real metadata store and a real WAL writer (in-memory object
store), on a clock the test moves: the sweep aborts a transaction open past its timeout (fencing
its producer), completes a decided transaction whose coordinator died before its markers, forgets
ids idle past the expiration, and ends a hanging transaction no stored transaction accounts for;
two coordinators on one store (two brokers) take turns on one transaction without losing a step;
any string is a transactional id of its own."""

from __future__ import annotations

import uuid

import pytest

from broker.appender import commit_fn
from broker.transactions.coordinator import Fenced, TransactionCoordinator, TransactionError
from metadata.embedded import EmbeddedMetadataStore
from metadata.model import Append, CommittedOffset, ObjectCommit
from metadata.transactions import Status, key_of
from wal.store import MemoryObjectStore
from wal.writer import WalWriter

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def env():
    clock = Clock()
    store = EmbeddedMetadataStore(None, clock=clock)  # producers' last writes dated on the test's clock
    await store.start()
    wal = WalWriter(MemoryObjectStore(), commit_fn(store), linger_ms=1)
    topic = await store.create_topic("t", 3)
    yield store, wal, clock, topic.topic_id
    await wal.close()
    await store.close()


def coordinator(store, wal, clock, **kw) -> TransactionCoordinator:
    return TransactionCoordinator(store, wal, max_timeout_ms=60_000, id_expiration_ms=3_600_000, clock=clock, **kw)


async def records(store, topic_id, partition: int, pid: int, epoch: int, seq: int, count: int = 2, generation: int = -1) -> int:
    """Transactional records as a producer's batch would be stored (opening transaction
    `generation` as verified, -1: unnamed); returns their base offset."""
    append = Append(topic_id, partition, 0, 10, count, 0, producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=True, txn_generation=generation)
    (result,) = await store.commit(ObjectCommit(f"wal/{uuid.uuid4().hex}", 10, (append,)))
    assert result.error_code == 0, result
    return result.base_offset


async def test_a_transaction_open_past_its_timeout_is_aborted_and_its_producer_fenced(env):
    store, wal, clock, t = env
    c = coordinator(store, wal, clock)
    pid, epoch = await c.init_producer_id("late", 5_000)
    await c.add_partitions("late", pid, epoch, [(t, 0), (t, 1)])
    await records(store, t, 0, pid, epoch, 0)
    view = store.topic_views(t)[0]
    assert (view.last_stable_offset, view.next_offset) == (0, 2)
    clock.now += 4.0
    assert await c.sweep() == 0  # not yet
    clock.now += 2.0
    assert await c.sweep() == 1
    txn, _ = await c.load("late")
    assert (txn.status, txn.producer_epoch, txn.previous_epoch) == (Status.COMPLETE_ABORT, epoch + 1, epoch)
    assert (view.last_stable_offset, view.next_offset) == (3, 3)  # the abort marker at 2
    assert [(a.first_offset, a.last_offset, a.producer_id) for a in view.aborted_between(0, 2)] == [(0, 2, pid)]
    assert store.topic_views(t)[1].next_offset == 1  # a marker where it wrote nothing too
    with pytest.raises(Fenced):
        await c.end("late", pid, epoch, commit=True)
    # KIP-360: the fenced producer may init again with its old epoch, and goes on at the epoch
    # the abort bumped to (as Kafka answers the previous epoch: a retry, not another bump)
    assert await c.init_producer_id("late", 5_000, pid, epoch) == (pid, epoch + 1)
    assert await c.init_producer_id("late", 5_000, pid, epoch + 1) == (pid, epoch + 2)


async def test_a_retried_epoch_bump_is_answered_the_epoch_it_bumped_to(env):
    """Issue 42 finding 8: a producer bumps its epoch (KIP-360 InitProducerId with its id and
    epoch) and the answer is lost; its retry names the epoch before the bump. Kafka answers the
    bumped epoch again; neve fenced it. A producer two epochs behind is still fenced."""
    store, wal, clock, t = env
    c = coordinator(store, wal, clock)
    pid, epoch = await c.init_producer_id("bump", 30_000)
    assert await c.init_producer_id("bump", 30_000, pid, epoch) == (pid, epoch + 1)
    assert await c.init_producer_id("bump", 30_000, pid, epoch) == (pid, epoch + 1)  # the retry
    await c.add_partitions("bump", pid, epoch + 1, [(t, 0)])  # the bumped epoch is the current one
    await c.end("bump", pid, epoch + 1, commit=True)
    assert await c.init_producer_id("bump", 30_000, pid, epoch + 1) == (pid, epoch + 2)
    with pytest.raises(Fenced):
        await c.init_producer_id("bump", 30_000, pid, epoch)
    # a new producer of the id (no epoch given) bumps, and leaves no previous epoch to retry with
    assert await c.init_producer_id("bump", 30_000) == (pid, epoch + 3)
    with pytest.raises(Fenced):
        await c.init_producer_id("bump", 30_000, pid, epoch + 2)


async def decided_commit(c: TransactionCoordinator, store, t, transactional_id: str):
    """A transaction of records on partition 2 and group g's offset 41 on partition 0, its commit
    decided (PREPARE_COMMIT stored) and not carried out, as a coordinator leaves it that stops
    before the markers; returns the stored decision."""
    pid, epoch = await c.init_producer_id(transactional_id, 30_000)
    await c.add_partitions(transactional_id, pid, epoch, [(t, 2)])
    await c.add_offsets(transactional_id, pid, epoch, "g")
    await c.commit_offsets(transactional_id, pid, epoch, "g", {(t, 0): CommittedOffset(41)})
    await records(store, t, 2, pid, epoch, 0)
    txn, revision = await c.load(transactional_id)
    prepared = txn.with_(status=Status.PREPARE_COMMIT)
    assert await store.registry_write({key_of(transactional_id): prepared.encode()}, {key_of(transactional_id): revision})
    return prepared


async def test_a_decided_transaction_whose_coordinator_died_is_completed_by_the_sweep(env):
    store, wal, clock, t = env
    await decided_commit(coordinator(store, wal, clock), store, t, "decided")  # then its coordinator died
    successor = coordinator(store, wal, clock)
    assert await successor.sweep() == 0  # within the grace: its coordinator may still be writing them
    clock.now += 11.0
    assert await successor.sweep() == 1
    assert (await successor.load("decided"))[0].status == Status.COMPLETE_COMMIT
    assert (await store.fetch_offsets("g"))[(t, 0)].offset == 41
    view = store.topic_views(t)[2]
    assert (view.last_stable_offset, view.next_offset, view.aborted_between(0, 10)) == (3, 3, [])


async def test_a_late_completer_does_not_write_the_transactions_offsets_again(env):
    """Issue 42 finding 3 (its offsets): a coordinator decided a commit and was slow; the sweep of
    another completed the transaction, and the group committed past its offsets. The late
    completer then wrote the transaction's offsets again, moving the group back. They are written
    only while the stored state is the decision they belong to."""
    store, wal, clock, t = env
    c = coordinator(store, wal, clock)
    prepared = await decided_commit(c, store, t, "slow")
    clock.now += 11.0
    assert await coordinator(store, wal, clock).sweep() == 1  # completed by another
    assert (await store.fetch_offsets("g"))[(t, 0)].offset == 41
    assert await store.commit_offsets("g", {(t, 0): CommittedOffset(57)})  # the group moves on
    await c._complete("slow", prepared, "client")  # the first coordinator, late
    assert (await store.fetch_offsets("g"))[(t, 0)].offset == 57


async def test_a_late_completers_markers_do_not_end_the_next_transaction(env):
    """Issue 42 finding 3 (its markers): a coordinator decided an abort and was slow; the sweep of
    another completed the transaction, and the producer began its next one on the partition. The
    late completer's abort marker then ended that one, its records aborted though it commits.
    The marker names the transaction it ends, and the next one's records stay committed."""
    store, wal, clock, t = env
    c = coordinator(store, wal, clock)
    pid, epoch = await c.init_producer_id("slow", 30_000)
    await c.add_partitions("slow", pid, epoch, [(t, 2)])
    first = (await c.verify_partitions("slow", pid, epoch, [(t, 2)])).generation
    await records(store, t, 2, pid, epoch, 0, generation=first)  # 0-1
    txn, revision = await c.load("slow")
    prepared = txn.with_(status=Status.PREPARE_ABORT)
    assert await store.registry_write({key_of("slow"): prepared.encode()}, {key_of("slow"): revision})
    clock.now += 11.0
    assert await coordinator(store, wal, clock).sweep() == 1  # completed by another: its marker at 2
    await c.add_partitions("slow", pid, epoch, [(t, 2)])  # the next transaction
    verified = await c.verify_partitions("slow", pid, epoch, [(t, 2)])
    assert verified.codes == {(t, 2): 0} and verified.generation == first + 1
    await records(store, t, 2, pid, epoch, 2, generation=verified.generation)  # 3-4
    await c._complete("slow", prepared, "recovered")  # the first coordinator, late
    view = store.topic_views(t)[2]
    assert (view.last_stable_offset, view.next_offset) == (3, 5)  # the late marker took no offset
    await c.end("slow", pid, epoch, commit=True)
    assert (view.last_stable_offset, view.next_offset) == (6, 6)
    assert [(a.first_offset, a.last_offset) for a in view.aborted_between(0, 6)] == [(0, 2)]


async def test_idle_ids_are_forgotten(env):
    store, wal, clock, t = env
    c = coordinator(store, wal, clock)
    pid, epoch = await c.init_producer_id("idle", 30_000)
    await c.add_partitions("idle", pid, epoch, [(t, 0)])
    await c.end("idle", pid, epoch, commit=False)
    clock.now += 3_599.0
    assert await c.sweep() == 0
    clock.now += 2.0
    assert await c.sweep() == 1
    assert await c.load("idle") == (None, 0)


async def test_a_hanging_transaction_is_aborted_after_the_longest_timeout(env):
    store, wal, clock, t = env
    c = coordinator(store, wal, clock)
    first = await records(store, t, 1, pid=77, epoch=3, seq=0)  # no transactional id holds it
    view = store.topic_views(t)[1]
    assert view.last_stable_offset == first
    assert await c.sweep() == 0  # first seen now
    clock.now += 59.0
    assert await c.sweep() == 0
    clock.now += 2.0
    assert await c.sweep() == 1
    assert (view.last_stable_offset, view.next_offset) == (3, 3)
    assert store.producer_states(t, 1)[77].epoch == 3


async def test_a_hanging_transaction_is_dated_from_its_last_write_not_from_when_a_leader_saw_it(env):
    """Issue 42 finding 1 (its timer): the sweep leader kept when it first saw a hanging
    transaction in its memory, so a new leader started the wait again. It is dated from the
    producer's last write as the store keeps it: a new leader ends it once that is past the
    longest timeout. Its marker names it by its first offset, so a transaction that ended
    meanwhile and the producer's next one are left alone."""
    store, wal, clock, t = env
    first = await records(store, t, 1, pid=77, epoch=3, seq=0)
    clock.now += 30.0
    assert await coordinator(store, wal, clock).sweep() == 0  # the old leader, half way
    clock.now += 31.0
    assert await coordinator(store, wal, clock).sweep() == 1  # a new leader, at once
    view = store.topic_views(t)[1]
    assert (view.last_stable_offset, view.next_offset, [(a.first_offset, a.producer_id) for a in view.aborted_between(0, 3)]) == (3, 3, [(first, 77)])


async def test_two_coordinators_on_one_store_take_turns(env):
    store, wal, clock, t = env
    a, b = coordinator(store, wal, clock), coordinator(store, wal, clock)
    pid, epoch = await a.init_producer_id("shared", 30_000)
    await b.add_partitions("shared", pid, epoch, [(t, 0)])
    await a.add_partitions("shared", pid, epoch, [(t, 1)])
    txn, _ = await b.load("shared")
    assert (txn.status, txn.partitions) == (Status.ONGOING, ((t.hex, 0), (t.hex, 1)))
    await b.end("shared", pid, epoch, commit=True)
    await a.end("shared", pid, epoch, commit=True)  # a retry through the other broker: done already
    with pytest.raises(TransactionError):
        await a.end("shared", pid, epoch, commit=False)  # the other outcome: INVALID_TXN_STATE
    assert [v.next_offset for v in store.topic_views(t)] == [1, 1, 0]


@pytest.mark.parametrize("transactional_id", ["a/b", "../../x", "%2F", "transactions/other", "ünï 🜁", "x" * 5000])
async def test_any_string_is_a_transactional_id_of_its_own(env, transactional_id):
    store, wal, clock, t = env
    c = coordinator(store, wal, clock)
    pid, _ = await c.init_producer_id(transactional_id, 30_000)
    other, _ = await c.init_producer_id(transactional_id + "-2", 30_000)
    assert pid != other
    assert set(await c.transactions()) == {transactional_id, transactional_id + "-2"}

"""The sequencer: turns the appends of one WAL object into offsets, index entries and
idempotent-producer state. Pure and backend-free, so the embedded store runs it under a lock and
the etcd store runs it inside an optimistic transaction over exactly the keys `involved` names.

Idempotence follows Kafka's ProducerStateManager: per (producer id, topic, partition) the epoch
and the last five stored batches' sequence ranges; a retried batch is answered with the offset it
was first stored at, a gap or a stale epoch is refused.

Transactions follow it too: a producer's state on a partition holds the first offset of its open
transaction there (from its first transactional batch to the marker that ends it). The partition's
last stable offset is the least of those (`PartitionView.last_stable_offset`). A marker (a control
batch the transaction coordinator writes) takes an offset like any batch, is refused with a stale
epoch, closes the transaction, and an abort marker records the aborted range
(`Sequenced.aborted`, Kafka's aborted transaction index), a commit marker the committed one
(`Sequenced.committed`, for the compactor to take a transaction into the table whole).

Beyond Kafka (transactions v1), a transaction has a name here: the coordinator's generation of the
producer's transactions (`metadata.transactions.Transaction.generation`), carried by the batch that
opens it on a partition (verified against the coordinator) and by its markers, and kept in the
producer's state. A marker applies only to the transaction it names: one that is late (its
transaction ended here already, or the next one is open) changes nothing and takes no offset. A
batch verified for a transaction that is not the one open here is refused.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from kio.schema.errors import ErrorCode

from .model import (
    ABORT_MARKER,
    AbortedTransaction,
    AppendResult,
    CommittedTransaction,
    IndexEntry,
    ObjectCommit,
    ObjectType,
)

TopicPartition = tuple[uuid.UUID, int]
ProducerKey = tuple[int, uuid.UUID, int]  # (producer_id, topic_id, partition)

# A transactional batch whose guard no longer holds: retriable (as a verification that could not be
# made, api00_produce): a late batch's producer has moved on, a current one sends it again and the
# broker verifies it again.
TXN_GUARD_FAILED = ErrorCode.not_enough_replicas

REMEMBERED_BATCHES = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN; clients pipeline at most 5
SEQUENCE_MODULUS = 2**31  # sequences wrap from Int.MaxValue to 0


class PartitionHead(Protocol):
    """What the sequencer reads of a partition. Backends may pass their own partition objects."""

    @property
    def next_offset(self) -> int: ...

    @property
    def log_start_offset(self) -> int: ...


class Head(NamedTuple):
    """A plain PartitionHead, for backends that keep no partition object of their own."""

    next_offset: int
    log_start_offset: int = 0


class BatchSequence(NamedTuple):
    first_seq: int
    last_seq: int
    base_offset: int


class ProducerState(NamedTuple):
    """One producer's state on one partition. Immutable: an update is a new value, so a failed
    commit leaves nothing half-changed and the old value can be shared freely. (A NamedTuple
    rather than a frozen dataclass: one is built per stored idempotent batch, and it is cheaper.)"""

    epoch: int
    batches: tuple[BatchSequence, ...]  # oldest first, at most REMEMBERED_BATCHES
    txn_first_offset: int = -1  # the first offset of the producer's open transaction here; -1: none
    # The offset of the last marker that ended a transaction of the producer here; -1: none. A
    # transactional batch carries the value the broker saw when it accepted it (Append.txn_guard,
    # as Kafka's VerificationGuard): a marker written since ended the transaction it was verified
    # for, and the batch, late, is refused rather than opening a transaction the next one's marker
    # would end.
    last_marker: int = -1
    # The coordinator's generation of the open transaction here, or of the last one that opened or
    # ended here (-1: unknown, a state from before generations or a batch that was not verified).
    txn_generation: int = -1

    def find(self, epoch: int, first_seq: int, last_seq: int) -> BatchSequence | None:
        if epoch != self.epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None

    def after(self, epoch: int, batch: BatchSequence, transactional: bool = False, generation: int = -1) -> ProducerState:
        """The state once `batch` is stored; a transactional batch opens the producer's
        transaction here if none is open, as the coordinator's `generation` (an open one stays
        open across an epoch bump: only its marker closes it)."""
        txn_first, txn_generation = self.txn_first_offset, self.txn_generation
        if transactional and txn_first < 0:
            txn_first, txn_generation = batch.base_offset, generation
        batches = (batch,) if epoch != self.epoch else self.batches[1 - REMEMBERED_BATCHES :] + (batch,)
        return ProducerState(epoch, batches, txn_first, self.last_marker, txn_generation)

    def ended(self, epoch: int, marker_offset: int, generation: int = -1) -> ProducerState:
        """The state once a marker at `epoch` (not older than this state's), at `marker_offset`,
        ends the open transaction (`generation`, -1: unnamed). A marker at a newer epoch (Kafka's
        transactions v2 bump, or the abort that fences a zombie) starts that epoch with no
        batches: its next batch is sequence 0."""
        batches = self.batches if epoch == self.epoch else ()
        return ProducerState(epoch, batches, -1, marker_offset, generation if generation >= 0 else self.txn_generation)

    def holds_another(self, generation: int) -> bool:
        """Is the transaction named `generation` not this state's to open or end: another one is
        open here, or it (or a later one) ended here already? Unknown generations (-1, on either
        side) name nothing and hold nothing."""
        if generation < 0 or self.txn_generation < 0:
            return False
        if self.txn_first_offset >= 0:
            return self.txn_generation != generation
        return self.txn_generation >= generation


@dataclass(slots=True)
class Sequenced:
    """Everything one commit changes; a backend persists all of it atomically, then applies it."""

    results: list[AppendResult]
    heads: dict[TopicPartition, int]  # new next offset of every partition that grew
    entries: dict[TopicPartition, list[IndexEntry]]  # new index entries, in offset order
    producers: dict[ProducerKey, ProducerState]  # new state of every producer that stored a batch
    aborted: dict[TopicPartition, list[AbortedTransaction]]  # transactions aborted by the commit's markers
    committed: dict[TopicPartition, list[CommittedTransaction]] = field(default_factory=dict)  # and committed by them

    @property
    def changed(self) -> bool:
        return bool(self.heads)


def last_sequence(base_sequence: int, record_count: int) -> int:
    return (base_sequence + record_count - 1) % SEQUENCE_MODULUS


def involved(commit: ObjectCommit) -> tuple[set[TopicPartition], set[ProducerKey]]:
    """The partitions and producer states `sequence` will read for this commit."""
    partitions: set[TopicPartition] = set()
    producers: set[ProducerKey] = set()
    for a in commit.appends:
        partitions.add((a.topic_id, a.partition))
        if a.producer_id >= 0:
            producers.add((a.producer_id, a.topic_id, a.partition))
    return partitions, producers


def sequence(
    commit: ObjectCommit,
    heads: Mapping[TopicPartition, PartitionHead],
    producers: Mapping[ProducerKey, ProducerState],
) -> Sequenced:
    """Sequence one commit against the current state, which is only read: the changes come back
    as overlays (`Sequenced`). `heads` must hold every live partition the commit touches (a missing
    one is an unknown partition); `producers` every known state of the producers involved."""
    results: list[AppendResult] = []
    new_heads: dict[TopicPartition, int] = {}
    new_entries: dict[TopicPartition, list[IndexEntry]] = {}
    new_producers: dict[ProducerKey, ProducerState] = {}
    new_aborted: dict[TopicPartition, list[AbortedTransaction]] = {}
    new_committed: dict[TopicPartition, list[CommittedTransaction]] = {}
    object_key = commit.object_key

    # The open run: the last stored append's partition and the entry fields it has gathered so far.
    # Only a stored append that directly follows it in the object, on the same partition and
    # byte-adjacent, extends it; anything else (another partition, a refusal, a duplicate) closes it.
    run_tp: TopicPartition | None = None
    run_base = run_last = run_start = run_end = run_max_ts = 0

    def close_run() -> None:
        new_entries.setdefault(run_tp, []).append(IndexEntry(run_base, run_last, object_key, ObjectType.WAL, run_start, run_end - run_start, run_max_ts))

    for a in commit.appends:
        tp = (a.topic_id, a.partition)
        head = heads.get(tp)
        if head is None:
            results.append(AppendResult(ErrorCode.unknown_topic_or_partition))
            if run_tp is not None:
                close_run()
                run_tp = None
            continue
        log_start = head.log_start_offset
        next_offset = new_heads.get(tp)
        if next_offset is None:
            next_offset = head.next_offset

        if a.control >= 0:  # a transaction marker
            pkey = (a.producer_id, a.topic_id, a.partition)
            state = new_producers.get(pkey) or producers.get(pkey)
            if state is not None and a.producer_epoch < state.epoch:
                results.append(AppendResult(ErrorCode.invalid_producer_epoch, -1, log_start))
                if run_tp is not None:
                    close_run()
                    run_tp = None
                continue
            named_elsewhere = state is not None and state.holds_another(a.txn_generation)
            if named_elsewhere or (a.txn_guard is not None and (state is None or state.txn_first_offset != a.txn_guard)):
                # late: the transaction it ends (by generation, or by first offset) ended here
                # already, or the next one is open
                results.append(AppendResult(ErrorCode.none, -1, log_start))
                if run_tp is not None:
                    close_run()
                    run_tp = None
                continue
            if state is None:
                new_producers[pkey] = ProducerState(a.producer_epoch, (), -1, next_offset, a.txn_generation)
            else:
                ended = new_producers[pkey] = state.ended(a.producer_epoch, next_offset, a.txn_generation)
                if state.txn_first_offset >= 0:
                    if a.control == ABORT_MARKER:
                        new_aborted.setdefault(tp, []).append(AbortedTransaction(next_offset, state.txn_first_offset, a.producer_id))
                    else:
                        new_committed.setdefault(tp, []).append(CommittedTransaction(next_offset, state.txn_first_offset, a.producer_id, ended.txn_generation))
        elif a.producer_id >= 0:
            pkey = (a.producer_id, a.topic_id, a.partition)
            state = new_producers.get(pkey) or producers.get(pkey)
            last_seq = last_sequence(a.base_sequence, a.record_count)
            error = ErrorCode.none
            if state is not None:
                original = state.find(a.producer_epoch, a.base_sequence, last_seq)
                if original is not None:
                    results.append(AppendResult(ErrorCode.none, original.base_offset, log_start, duplicate=True))
                    if run_tp is not None:
                        close_run()
                        run_tp = None
                    continue
                if a.producer_epoch < state.epoch:
                    error = ErrorCode.invalid_producer_epoch
                elif a.txn_guard is not None and a.txn_guard != state.last_marker:
                    error = TXN_GUARD_FAILED
                elif a.transactional and state.holds_another(a.txn_generation):
                    error = TXN_GUARD_FAILED  # verified for a transaction that is not the one here
                elif a.producer_epoch > state.epoch:
                    if a.base_sequence != 0:
                        error = ErrorCode.out_of_order_sequence_number
                elif a.base_sequence != ((state.batches[-1].last_seq + 1) % SEQUENCE_MODULUS if state.batches else 0):
                    error = ErrorCode.out_of_order_sequence_number
            elif a.txn_guard is not None and a.txn_guard != -1:
                error = TXN_GUARD_FAILED  # verified against a state that has expired (or was never here)
            if error:
                results.append(AppendResult(error, -1, log_start))
                if run_tp is not None:
                    close_run()
                    run_tp = None
                continue
            batch = BatchSequence(a.base_sequence, last_seq, next_offset)
            if state is not None:
                new_producers[pkey] = state.after(a.producer_epoch, batch, a.transactional, a.txn_generation)
            elif a.transactional:
                new_producers[pkey] = ProducerState(a.producer_epoch, (batch,), next_offset, -1, a.txn_generation)
            else:
                new_producers[pkey] = ProducerState(a.producer_epoch, (batch,))

        # Stored: take the offsets and extend or open the index run.
        last_offset = next_offset + a.record_count - 1
        new_heads[tp] = last_offset + 1
        results.append(AppendResult(ErrorCode.none, next_offset, log_start))
        if run_tp == tp and a.start == run_end:
            run_last = last_offset
            run_end = a.start + a.size
            if a.max_timestamp > run_max_ts:
                run_max_ts = a.max_timestamp
        else:
            if run_tp is not None:
                close_run()
            run_tp = tp
            run_base, run_last = next_offset, last_offset
            run_start, run_end = a.start, a.start + a.size
            run_max_ts = a.max_timestamp

    if run_tp is not None:
        close_run()
    return Sequenced(results, new_heads, new_entries, new_producers, new_aborted, new_committed)

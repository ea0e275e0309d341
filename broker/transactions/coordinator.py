"""The transaction coordinator, leaderless: every transactional id's state is one compare-and-write
item of the metadata store (`state.py`), and each step of a transaction (InitProducerId,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn, a timeout's abort) reads it and
replaces it only if no other step replaced it meanwhile. So any broker can take any step:
FindCoordinator names one broker per id (rendezvous hashing, as for groups) only so that one
broker's lock orders a producer's requests; when that broker dies, the next one carries on from
the stored state.

Ending a transaction is two durable steps, as in Kafka: the decision (PrepareCommit or
PrepareAbort) is stored first, then the pending offsets are committed to their groups (on commit)
and a marker is written to every partition of the transaction, and only then the transaction is
stored complete. Whoever finds a decided transaction that is not complete (the same producer
retrying, InitProducerId, the sweep after its coordinator died) completes it with the same
outcome: a transaction ends committed or aborted, never both. Writing a marker or an offset twice
is harmless: a second marker ends nothing, an offset is the same value.

Fencing (KIP-98): InitProducerId for an id whose transaction is open aborts it at a bumped epoch
(its markers carry that epoch, so the sequencer refuses the old producer's batches on every
partition it wrote), then gives the new producer the epoch after it. A transaction open past its
timeout is aborted the same way by the sweep."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from metadata.model import CommittedOffset
from metadata.rules import MAX_EPOCH
from metadata.store import MetadataError, MetadataStore
from metadata.transactions import KEY_PREFIX, PendingOffset, Status, Transaction, id_of, key_of

from ..metrics import HANGING_TRANSACTIONS_ABORTED, TRANSACTIONS_ENDED
from .markers import MarkersNotWritten, write_markers

log = logging.getLogger("neve.broker.transactions")

ATTEMPTS = 8  # compare-and-write rounds before answering a retriable error
# A decided transaction not complete after this long is completed by the sweep: its coordinator
# died between the decision and the markers (or is still writing them: its markers name the
# transaction, and once it is complete they change nothing).
PREPARED_GRACE_MS = 10_000


class Verification(NamedTuple):
    """KIP-890's answer for a producer's partitions: each one's error (none: in the open
    transaction), and the open transaction's generation, which the batches that open it there
    carry (-1 when the producer is not the transactional id's)."""

    codes: dict[tuple[uuid.UUID, int], ErrorCode]
    generation: int


class TransactionError(Exception):
    """The Kafka error a transactional request is answered with."""

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code


class Fenced(TransactionError):
    """The producer's epoch is not the transaction's: another producer with its transactional id
    took over (or the coordinator aborted its transaction). Handlers answer PRODUCER_FENCED, or
    INVALID_PRODUCER_EPOCH to versions from before KIP-588."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.producer_fenced, message)


def error_code(e: TransactionError, api_version: int, fenced_since: int) -> ErrorCode:
    """What a request of `api_version` is answered for `e`: its code, and for a fenced producer
    PRODUCER_FENCED, or INVALID_PRODUCER_EPOCH below the API's `fenced_since` version (KIP-588)."""
    if isinstance(e, Fenced):
        return ErrorCode.producer_fenced if api_version >= fenced_since else ErrorCode.invalid_producer_epoch
    return e.code


class TransactionCoordinator:
    def __init__(
        self,
        metadata: MetadataStore,
        wal,
        *,
        max_timeout_ms: int = 900_000,
        id_expiration_ms: int = 604_800_000,
        kill_during_end: str = "",
        lose_abort_marker_every: int = 0,
        marker_linger_ms: int = 20,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metadata = metadata
        self.wal = wal
        self.max_timeout_ms = max_timeout_ms
        self.id_expiration_ms = id_expiration_ms
        self._clock = clock
        self._kill_during_end = kill_during_end  # a test fault (neve/config.py [faults] kill_during_end_txn)
        self._lose_abort_marker_every = lose_abort_marker_every  # a planted bug ([faults] marker_lost_every)
        self._aborts_completed = 0  # the aborts _complete carried out, for that plant alone
        self._marker_linger_s = marker_linger_ms / 1000
        self._locks: dict[str, list] = {}  # transactional id -> [lock, users]
        # open transactions on partitions that no stored transaction accounts for, by when the
        # sweep first saw them: (topic id, partition, producer id, first offset) -> ms
        self._unaccounted: dict[tuple[uuid.UUID, int, int, int], int] = {}

    def _now(self) -> int:
        return int(self._clock() * 1000)

    @contextlib.asynccontextmanager
    async def _serialized(self, transactional_id: str):
        """One step of an id at a time on this broker (the store's compare settles the rest)."""
        entry = self._locks.get(transactional_id)
        if entry is None:
            entry = self._locks[transactional_id] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if not entry[1]:
                del self._locks[transactional_id]

    # -- the stored state -----------------------------------------------------------------------

    async def load(self, transactional_id: str) -> tuple[Transaction | None, int]:
        """The id's transaction and its revision (0: none stored)."""
        try:
            item = await self.metadata.registry_get(key_of(transactional_id))
        except MetadataError as e:
            raise TransactionError(ErrorCode.coordinator_not_available, str(e)) from e
        return (Transaction.decode(item.value), item.revision) if item is not None else (None, 0)

    async def _store(self, transactional_id: str, txn: Transaction | None, revision: int) -> bool:
        """Replace the id's state if it is still at `revision` (None deletes it)."""
        key = key_of(transactional_id)
        try:
            return await self.metadata.registry_write({key: None if txn is None else txn.encode()}, {key: revision})
        except MetadataError as e:
            raise TransactionError(ErrorCode.coordinator_not_available, str(e)) from e

    async def transactions(self) -> dict[str, tuple[Transaction, int]]:
        """Every stored transaction by id, with its revision."""
        try:
            items = await self.metadata.registry_items(KEY_PREFIX)
        except MetadataError as e:
            raise TransactionError(ErrorCode.coordinator_not_available, str(e)) from e
        return {id_of(item.key): (Transaction.decode(item.value), item.revision) for item in items}

    @staticmethod
    def _check_producer(txn: Transaction | None, producer_id: int, producer_epoch: int) -> Transaction:
        if txn is None or txn.producer_id != producer_id:
            raise TransactionError(ErrorCode.invalid_producer_id_mapping, f"producer id {producer_id} does not hold this transactional id")
        if producer_epoch != txn.producer_epoch:
            raise Fenced(f"producer epoch {producer_epoch} is not the current {txn.producer_epoch}")
        return txn

    # -- the steps ----------------------------------------------------------------------------

    async def init_producer_id(self, transactional_id: str, timeout_ms: int, producer_id: int = -1, producer_epoch: int = -1) -> tuple[int, int]:
        """The producer id and epoch for a producer starting with `transactional_id`, after
        fencing any earlier producer of it (its open transaction aborted)."""
        if not 0 < timeout_ms <= self.max_timeout_ms:
            raise TransactionError(ErrorCode.invalid_transaction_timeout, f"transaction timeout {timeout_ms} ms is not within 1..{self.max_timeout_ms}")
        async with self._serialized(transactional_id):
            for _ in range(ATTEMPTS):
                txn, revision = await self.load(transactional_id)
                now = self._now()
                if txn is None:
                    new_id, _ = await self._new_producer_id()
                    if await self._store(transactional_id, Transaction(new_id, 0, timeout_ms, updated_ms=now), 0):
                        log.info("transactional_id_created", extra={"transactional_id": transactional_id, "producer_id": new_id})
                        return new_id, 0
                    continue
                if producer_id >= 0 and (producer_id != txn.producer_id or producer_epoch not in (txn.producer_epoch, txn.previous_epoch)):
                    raise Fenced(f"producer {producer_id} epoch {producer_epoch} is not the current producer of this transactional id")
                if txn.status.preparing:
                    await self._complete(transactional_id, txn, "recovered")
                    continue
                if txn.status == Status.ONGOING:
                    await self._abort_fencing(transactional_id, txn, revision, "fenced")
                    continue
                if producer_id >= 0 and producer_epoch == txn.previous_epoch != txn.producer_epoch:
                    # KIP-360, as Kafka's prepareIncrementProducerEpoch: the previous epoch asks again
                    # (a retry of a bump whose answer was lost, or the producer of a transaction the
                    # sweep aborted): the current epoch is its answer, not another bump
                    if txn.timeout_ms != timeout_ms and not await self._store(transactional_id, txn.with_(timeout_ms=timeout_ms, updated_ms=now), revision):
                        continue
                    return txn.producer_id, txn.producer_epoch
                if txn.producer_epoch + 1 >= MAX_EPOCH:
                    new_id, epoch = (await self._new_producer_id())[0], 0
                else:
                    new_id, epoch = txn.producer_id, txn.producer_epoch + 1
                # the epoch a producer that asked with it may ask again with (above); a new
                # producer (no epoch given) leaves none
                previous = txn.producer_epoch if producer_id >= 0 and new_id == txn.producer_id else -1
                fresh = Transaction(new_id, epoch, timeout_ms, updated_ms=now, previous_epoch=previous, generation=txn.generation)
                if await self._store(transactional_id, fresh, revision):
                    return new_id, epoch
        raise TransactionError(ErrorCode.concurrent_transactions, "the transaction state kept changing")

    async def _new_producer_id(self) -> tuple[int, int]:
        try:
            return await self.metadata.init_producer_id()
        except MetadataError as e:
            raise TransactionError(ErrorCode.coordinator_not_available, str(e)) from e

    async def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: Iterable[tuple[uuid.UUID, int]]) -> None:
        """AddPartitionsToTxn: the partitions join the producer's transaction (which begins)."""
        added = [(topic_id.hex, p) for topic_id, p in partitions]
        await self._add(transactional_id, producer_id, producer_epoch, added, None)

    async def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group: str) -> None:
        """AddOffsetsToTxn: the group's offsets will be committed by the transaction."""
        await self._add(transactional_id, producer_id, producer_epoch, [], group)

    async def _add(self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]], group: str | None) -> None:
        async with self._serialized(transactional_id):
            for _ in range(ATTEMPTS):
                txn, revision = await self.load(transactional_id)
                txn = self._check_producer(txn, producer_id, producer_epoch)
                if txn.status.preparing:
                    await self._complete(transactional_id, txn, "client")
                    continue
                now = self._now()
                if txn.status != Status.ONGOING:
                    txn = txn.with_(status=Status.ONGOING, partitions=(), groups=(), offsets=(), started_ms=now, generation=txn.generation + 1)
                known = set(txn.partitions)
                new_partitions = txn.partitions + tuple(p for p in dict.fromkeys(partitions) if p not in known)
                groups = txn.groups + ((group,) if group is not None and group not in txn.groups else ())
                updated = txn.with_(partitions=new_partitions, groups=groups, updated_ms=now)
                if await self._store(transactional_id, updated, revision):
                    return
        raise TransactionError(ErrorCode.concurrent_transactions, "the transaction state kept changing")

    async def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: Iterable[tuple[uuid.UUID, int]]) -> Verification:
        """KIP-890's check: is each partition in the producer's open transaction, and which is it?"""
        txn, _ = await self.load(transactional_id)
        partitions = list(partitions)
        try:
            txn = self._check_producer(txn, producer_id, producer_epoch)
        except TransactionError as e:
            return Verification(dict.fromkeys(partitions, e.code), -1)
        inside = set(txn.partitions) if txn.status == Status.ONGOING else set()
        return Verification({tp: ErrorCode.none if (tp[0].hex, tp[1]) in inside else ErrorCode.invalid_txn_state for tp in partitions}, txn.generation)

    async def commit_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group: str, offsets: Mapping[tuple[uuid.UUID, int], CommittedOffset]) -> None:
        """TxnOffsetCommit: the offsets are committed to `group` if the transaction commits."""
        async with self._serialized(transactional_id):
            for _ in range(ATTEMPTS):
                txn, revision = await self.load(transactional_id)
                txn = self._check_producer(txn, producer_id, producer_epoch)
                if txn.status != Status.ONGOING or group not in txn.groups:
                    raise TransactionError(ErrorCode.invalid_txn_state, f"group {group!r} was not added to an open transaction (AddOffsetsToTxn)")
                replaced = {(tid.hex, p) for tid, p in offsets}
                pending = tuple(o for o in txn.offsets if not (o.group == group and (o.topic_id, o.partition) in replaced))
                pending += tuple(PendingOffset(group, tid.hex, p, o.offset, o.leader_epoch, o.metadata) for (tid, p), o in offsets.items())
                if await self._store(transactional_id, txn.with_(offsets=pending, updated_ms=self._now()), revision):
                    return
        raise TransactionError(ErrorCode.concurrent_transactions, "the transaction state kept changing")

    async def pending_offsets(self, group: str) -> set[tuple[uuid.UUID, int]]:
        """The partitions of `group` with offsets an unfinished transaction would commit (KIP-447:
        OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them, so a member
        taking a partition over waits for the transaction instead of reading it again). A scan of
        the stored transactions: asked when a member is assigned partitions, not per record."""
        pending = set()
        for txn, _ in (await self.transactions()).values():
            if txn.status in (Status.ONGOING, Status.PREPARE_COMMIT):
                pending.update((uuid.UUID(hex=o.topic_id), o.partition) for o in txn.offsets if o.group == group)
        return pending

    async def end(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> None:
        """EndTxn: decide the outcome, make it durable, complete it."""
        decided = Status.PREPARE_COMMIT if commit else Status.PREPARE_ABORT
        completed = Status.COMPLETE_COMMIT if commit else Status.COMPLETE_ABORT
        async with self._serialized(transactional_id):
            for _ in range(ATTEMPTS):
                txn, revision = await self.load(transactional_id)
                txn = self._check_producer(txn, producer_id, producer_epoch)
                if txn.status == Status.ONGOING:
                    prepared = txn.with_(status=decided, updated_ms=self._now())
                    if not await self._store(transactional_id, prepared, revision):
                        continue
                    log.info("transaction_decided", extra={"transactional_id": transactional_id, "producer_id": producer_id, "epoch": producer_epoch, "outcome": str(decided), "partitions": len(txn.partitions)})
                    if self._kill_during_end and transactional_id == self._kill_during_end and producer_epoch == 0 and prepared.partitions:
                        await self._die_after_first_marker(prepared)
                    await self._complete(transactional_id, prepared, "client")
                    return
                if txn.status == decided:  # a retry of this EndTxn, or its coordinator died: finish it
                    await self._complete(transactional_id, txn, "client")
                    return
                if txn.status == completed:  # a retry of an EndTxn that completed
                    return
                raise TransactionError(ErrorCode.invalid_txn_state, f"cannot {'commit' if commit else 'abort'} a transaction in state {txn.status}")
        raise TransactionError(ErrorCode.concurrent_transactions, "the transaction state kept changing")

    # -- completion -----------------------------------------------------------------------------

    async def _die_after_first_marker(self, prepared: Transaction) -> None:
        """The kill_during_end_txn fault: store the first partition's marker, then SIGKILL."""
        topic, partition = prepared.partitions[0]
        await write_markers(self.wal, [(uuid.UUID(hex=topic), partition)], prepared.producer_id, prepared.producer_epoch, prepared.status == Status.PREPARE_COMMIT, prepared.generation, self._marker_linger_s)
        log.warning("fault_kill_during_end_txn", extra={"producer_id": prepared.producer_id})
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    async def _lose_abort_marker(self, prepared: Transaction, partitions: list[tuple[uuid.UUID, int]]) -> list[tuple[uuid.UUID, int]]:
        """The marker_lost plant (a deliberate bug, test only): every Nth abort, its first
        partition's abort marker is not written, and a commit marker is in its place. The
        sequencer closes the producer's transaction there without recording it aborted, so its
        records sit below the last stable offset in no aborted range: read_committed readers and
        the table take them as committed, while the transaction completes as aborted and the
        other partitions' markers abort their records (a torn transaction). A commit marker, not
        none: a partition left without one would only hold its last stable offset back until the
        sweep ended the hanging transaction, which no reader sees as wrong data. The partitions
        whose abort markers are still to be written are returned."""
        self._aborts_completed += 1
        if self._aborts_completed % self._lose_abort_marker_every:
            return partitions
        lost, rest = partitions[0], partitions[1:]
        log.warning("planted_bug_marker_lost", extra={"producer_id": prepared.producer_id, "topic_id": lost[0].hex, "partition": lost[1]})
        await write_markers(self.wal, [lost], prepared.producer_id, prepared.producer_epoch, True, prepared.generation, self._marker_linger_s)
        return rest

    async def _abort_fencing(self, transactional_id: str, txn: Transaction, revision: int, cause: str) -> bool:
        """Abort an open transaction at the next epoch, so its producer can write no more; `cause`:
        fenced (a new producer of its id) or timeout (the sweep)."""
        prepared = txn.with_(status=Status.PREPARE_ABORT, producer_epoch=txn.producer_epoch + 1, previous_epoch=txn.producer_epoch, updated_ms=self._now())
        if not await self._store(transactional_id, prepared, revision):
            return False
        log.info("transaction_aborted", extra={"transactional_id": transactional_id, "producer_id": txn.producer_id, "epoch": txn.producer_epoch, "cause": cause, "timeout_ms": txn.timeout_ms, "partitions": len(txn.partitions)})
        await self._complete(transactional_id, prepared, cause)
        return True

    async def _complete(self, transactional_id: str, prepared: Transaction, cause: str) -> None:
        """Carry out a decided transaction: its offsets (on commit), its markers, then the state
        complete, unless someone completed it meanwhile. Raises TransactionError (retriable) if a
        part could not be stored: the decision stays, and is carried out again by whoever finds
        it."""
        commit = prepared.status == Status.PREPARE_COMMIT
        if commit and prepared.offsets:
            # Written only while the stored state is still this decision, checked with each write:
            # a completer that was late (the sweep took over, a client's EndTxn retried through
            # another broker) would otherwise write them again after the group moved past them.
            current, revision = await self.load(transactional_id)
            if current != prepared:
                return  # completed (or moved on) by another meanwhile: the offsets were its to write
            by_group: dict[str, dict[tuple[uuid.UUID, int], CommittedOffset]] = {}
            now = self._now()
            for o in prepared.offsets:
                by_group.setdefault(o.group, {})[(uuid.UUID(hex=o.topic_id), o.partition)] = CommittedOffset(o.offset, o.leader_epoch, o.metadata, now)
            try:
                for group, offsets in by_group.items():
                    if not await self.metadata.commit_offsets(group, offsets, if_unchanged={key_of(transactional_id): revision}):
                        return  # completed by another meanwhile
            except MetadataError as e:
                raise TransactionError(ErrorCode.coordinator_not_available, f"offsets not committed: {e}") from e
        partitions = [(uuid.UUID(hex=t), p) for t, p in prepared.partitions]
        try:
            if not commit and self._lose_abort_marker_every and partitions:
                partitions = await self._lose_abort_marker(prepared, partitions)
            await write_markers(self.wal, partitions, prepared.producer_id, prepared.producer_epoch, commit, prepared.generation, self._marker_linger_s)
        except MarkersNotWritten as e:
            log.warning("transaction_markers_not_written", extra={"transactional_id": transactional_id, "error": str(e)})
            raise TransactionError(ErrorCode.concurrent_transactions, str(e)) from e
        done = prepared.with_(status=Status.COMPLETE_COMMIT if commit else Status.COMPLETE_ABORT, partitions=(), groups=(), offsets=(), started_ms=-1)
        for _ in range(ATTEMPTS):
            txn, revision = await self.load(transactional_id)
            if txn != prepared:  # completed (or moved on) by another broker meanwhile
                return
            if await self._store(transactional_id, done.with_(updated_ms=self._now()), revision):
                TRANSACTIONS_ENDED.labels("commit" if commit else "abort", cause).inc()
                return
        raise TransactionError(ErrorCode.concurrent_transactions, "the transaction state kept changing")

    # -- the sweep ----------------------------------------------------------------------------

    async def sweep(self) -> int:
        """Abort transactions open past their timeout, complete decided ones whose coordinator
        did not, forget ids idle past the expiration, and end hanging transactions
        (`_end_hanging`). Returns how many it changed."""
        changed = 0
        now = self._now()
        stored = await self.transactions()
        changed += await self._end_hanging(stored, now)
        for transactional_id, (txn, revision) in stored.items():
            try:
                if txn.status == Status.ONGOING and now - txn.started_ms > txn.timeout_ms:
                    async with self._serialized(transactional_id):
                        current, revision = await self.load(transactional_id)
                        if current == txn:
                            changed += await self._abort_fencing(transactional_id, txn, revision, "timeout")
                elif txn.status.preparing and now - txn.updated_ms > PREPARED_GRACE_MS:
                    async with self._serialized(transactional_id):
                        current, _ = await self.load(transactional_id)
                        if current == txn:
                            await self._complete(transactional_id, txn, "recovered")
                            changed += 1
                elif txn.status.complete and now - txn.updated_ms > self.id_expiration_ms:
                    async with self._serialized(transactional_id):
                        changed += await self._store(transactional_id, None, revision)
            except TransactionError as e:
                log.warning("transaction_sweep_failed", extra={"transactional_id": transactional_id, "error": str(e)})
        return changed

    async def _end_hanging(self, stored: Mapping[str, tuple[Transaction, int]], now: int) -> int:
        """Abort the open transactions of partitions that no open transaction of a stored
        transactional id holds, once they stayed so for the longest transaction timeout: a
        transactional batch that landed after its transaction ended (a late retry), or whose
        producer's id was forgotten. Left alone, such a transaction would hold the partition's
        last stable offset (read_committed readers and the table) back for ever. It is dated from
        the producer's last write there as the store keeps it, so a new sweep leader does not
        start the wait again (as from when this one first saw it, if that is earlier). Its marker
        carries the epoch the partition last saw of that producer and names the transaction by
        its first offset and generation: one that ended meanwhile is left alone, and so is the
        producer's next one."""
        held = {(uuid.UUID(hex=t), p, txn.producer_id) for txn, _ in stored.values() if txn.status in (Status.ONGOING, Status.PREPARE_COMMIT, Status.PREPARE_ABORT) for t, p in txn.partitions}
        seen: dict[tuple[uuid.UUID, int, int, int], int] = {}
        for info in list(self.metadata.topics().values()):
            for p, view in enumerate(self.metadata.topic_views(info.topic_id)):
                if view is None:
                    continue
                for pid, first in view.open_transactions().items():
                    if (info.topic_id, p, pid) not in held:
                        key = (info.topic_id, p, pid, first)
                        since = self._unaccounted.get(key, now)
                        used = self.metadata.producer_last_used(info.topic_id, p, pid)
                        seen[key] = since if used is None else min(since, used)
        self._unaccounted = seen
        ended = 0
        for (topic_id, p, pid, first), since in list(seen.items()):
            if now - since <= self.max_timeout_ms:
                continue
            state = self.metadata.producer_states(topic_id, p).get(pid)
            if state is None or state.txn_first_offset != first:
                continue
            try:
                await write_markers(self.wal, [(topic_id, p)], pid, state.epoch, False, state.txn_generation, self._marker_linger_s, first_offset=first)
            except MarkersNotWritten as e:
                log.warning("hanging_transaction_not_ended", extra={"topic_id": topic_id.hex, "partition": p, "producer_id": pid, "error": str(e)})
                continue
            log.warning("hanging_transaction_aborted", extra={"topic_id": topic_id.hex, "partition": p, "producer_id": pid, "first_offset": first})
            HANGING_TRANSACTIONS_ABORTED.inc()
            del self._unaccounted[(topic_id, p, pid, first)]
            ended += 1
        return ended


async def run_transaction_sweep(coordinator: TransactionCoordinator, is_leader: Callable[[], bool], is_current: Callable[[], bool], interval_s: float) -> None:
    """The sweep every `interval_s` on the broker leading it, while its view of the store is
    current (a stale view could see ended transactions as open)."""
    while True:
        await asyncio.sleep(interval_s)
        if not is_leader() or not is_current():
            continue
        try:
            await coordinator.sweep()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("transaction_sweep_failed", extra={"error": repr(e)})

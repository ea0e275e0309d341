"""The embedded metadata store for a single process: an in-memory view that is authoritative while
running, made durable in one SQLite file (or nowhere, for unit tests) and reloaded at start().

Every write runs under one asyncio lock: sequence against memory, persist all effects in one
SQLite transaction on a dedicated thread, and only then apply to memory and wake waiters. A
failed write raises MetadataUnavailable and changes nothing. A write is shielded from its
caller's cancellation: once started it finishes, so memory never falls behind the database.

SQLite layout (WAL journal, synchronous=FULL):
    topics(topic_id TEXT PK, name TEXT UNIQUE, partitions INT, configs TEXT)  -- configs as JSON
    partitions(topic_id, partition, next_offset, log_start_offset)          PK (topic_id, partition)
    index_entries(topic_id, partition, base_offset, last_offset, object_key, object_type,
                  start, size, max_timestamp)                              PK (topic_id, partition, base_offset)
    producer_states(producer_id, topic_id, partition, epoch, batches, last_used, txn_first_offset,
                    last_marker, txn_generation)
                                                    PK (producer_id, topic_id, partition)
                                                    -- batches: JSON [[first_seq, last_seq, base_offset], ...];
                                                    -- last_used: ms, for expiry (0 in databases from before it);
                                                    -- txn_first_offset: its open transaction's first offset, -1 none
    aborted_transactions(topic_id, partition, last_offset, first_offset, producer_id)
                                                    PK (topic_id, partition, last_offset)  -- by abort marker
    committed_transactions(topic_id, partition, last_offset, first_offset, producer_id, generation)
                                                    PK (topic_id, partition, last_offset)  -- by commit marker,
                                                    -- while in a WAL entry
    producer_epochs(producer_id INT PK, epoch INT)  -- for KIP-360 epoch bumps in init_producer_id
    counters(name TEXT PK, value INT)               -- 'next_producer_id', 'registry_revision'
    registry(key TEXT PK, value BLOB, revision INT) -- the schema registry's items (registry/store.py)
    security(key TEXT PK, value BLOB)               -- the security family (credentials, ACLs), held in memory too
Topic ids are stored as their 32-digit hex form.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import MappingProxyType
from typing import Any, TypeVar

from .model import AbortedTransaction, AppendResult, CommittedOffset, CommittedTransaction, IndexEntry, ObjectCommit, ObjectType, TopicInfo
from .rules import bumped_epoch, clamped_log_start, merged_configs, partition_count
from .sequencer import BatchSequence, ProducerKey, ProducerState, Sequenced, TopicPartition, sequence
from .store import (
    PRODUCER_EXPIRY_MS,
    Fence,
    InvalidPartitions,
    MetadataStore,
    MetadataUnavailable,
    ObjectFenced,
    RegistryItem,
    TopicAlreadyExists,
    UnknownTopic,
    check_replacement,
    checked_security_writes,
)
from .view import IndexReads, PartitionView

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    topic_id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, partitions INTEGER NOT NULL, configs TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS partitions (
    topic_id TEXT NOT NULL, partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL, log_start_offset INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS index_entries (
    topic_id TEXT NOT NULL, partition INTEGER NOT NULL, base_offset INTEGER NOT NULL,
    last_offset INTEGER NOT NULL, object_key TEXT NOT NULL, object_type INTEGER NOT NULL,
    start INTEGER NOT NULL, size INTEGER NOT NULL, max_timestamp INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition, base_offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS producer_states (
    producer_id INTEGER NOT NULL, topic_id TEXT NOT NULL, partition INTEGER NOT NULL,
    epoch INTEGER NOT NULL, batches TEXT NOT NULL, last_used INTEGER NOT NULL DEFAULT 0,
    txn_first_offset INTEGER NOT NULL DEFAULT -1, last_marker INTEGER NOT NULL DEFAULT -1,
    txn_generation INTEGER NOT NULL DEFAULT -1,
    PRIMARY KEY (producer_id, topic_id, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS aborted_transactions (
    topic_id TEXT NOT NULL, partition INTEGER NOT NULL, last_offset INTEGER NOT NULL,
    first_offset INTEGER NOT NULL, producer_id INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition, last_offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS committed_transactions (
    topic_id TEXT NOT NULL, partition INTEGER NOT NULL, last_offset INTEGER NOT NULL,
    first_offset INTEGER NOT NULL, producer_id INTEGER NOT NULL, generation INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition, last_offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS producer_epochs (producer_id INTEGER PRIMARY KEY, epoch INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS registry (key TEXT PRIMARY KEY, value BLOB NOT NULL, revision INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS security (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS group_states (group_id TEXT PRIMARY KEY, state BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS group_offsets (
    group_id TEXT NOT NULL, topic_id TEXT NOT NULL, partition INTEGER NOT NULL,
    committed_offset INTEGER NOT NULL, leader_epoch INTEGER NOT NULL, metadata TEXT, commit_timestamp INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic_id, partition)
) WITHOUT ROWID;
"""


class EmbeddedMetadataStore(IndexReads, MetadataStore):
    def __init__(self, path: str | None, *, producer_expiry_ms: int = PRODUCER_EXPIRY_MS, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.path = path
        self.producer_expiry_ms = producer_expiry_ms
        self._clock = clock  # seconds; a test's own clock moves expiry along
        self._next_expiry_ms = 0
        self._lock = asyncio.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None
        self._topics: dict[str, TopicInfo] = {}
        self._topics_view: Mapping[str, TopicInfo] = MappingProxyType({})  # replaced, never mutated
        self._by_id: dict[uuid.UUID, TopicInfo] = {}
        self._partitions: dict[TopicPartition, PartitionView] = {}
        self._topic_views = {}
        self._producers: dict[ProducerKey, ProducerState] = {}
        self._producer_used: dict[ProducerKey, int] = {}  # ms of each producer state's last write
        self._producer_epochs: dict[int, int] = {}
        self._next_producer_id = 0
        # Objects the orphan sweeper fenced off. In memory: a fence only has to outlive the
        # commits in flight, and a restarted node has none for the objects of before.
        self._fenced: set[str] = set()
        self._security: dict[str, bytes] = {}
        self._security_version = 0

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        # One thread owns the connection for its whole life; SQLite calls never block the loop.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="neve-metadata")
        try:
            rows = await self._run(self._open)
        except sqlite3.Error as e:
            await self._run(self._close_db)
            self._executor.shutdown(wait=True)
            self._executor = None
            raise MetadataUnavailable(f"cannot open metadata database {self.path!r}: {e}") from e
        self._load(*rows)

    async def close(self) -> None:
        for holders in list(self._campaigns.values()):
            for leadership in list(holders):
                await leadership.resign()
        if self._executor is None:
            return
        async with self._lock:
            await self._run(self._close_db)
            self._executor.shutdown(wait=True)
            self._executor = None

    def _open(self) -> tuple[list, ...]:
        # isolation_level=None: transactions are explicit BEGIN/COMMIT, nothing implicit.
        db = self._db = sqlite3.connect(self.path or ":memory:", isolation_level=None)
        if self.path is not None:
            db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(producer_states)")}
        if "last_used" not in columns:  # a database from before expiry
            db.execute("ALTER TABLE producer_states ADD COLUMN last_used INTEGER NOT NULL DEFAULT 0")
        if "txn_first_offset" not in columns:  # a database from before transactions
            db.execute("ALTER TABLE producer_states ADD COLUMN txn_first_offset INTEGER NOT NULL DEFAULT -1")
        if "last_marker" not in columns:  # a database from before transactional batches' guards
            db.execute("ALTER TABLE producer_states ADD COLUMN last_marker INTEGER NOT NULL DEFAULT -1")
        if "txn_generation" not in columns:  # a database from before transactions' generations
            db.execute("ALTER TABLE producer_states ADD COLUMN txn_generation INTEGER NOT NULL DEFAULT -1")
        return (
            db.execute("SELECT topic_id, name, partitions, configs FROM topics").fetchall(),
            db.execute("SELECT topic_id, partition, next_offset, log_start_offset FROM partitions").fetchall(),
            db.execute("SELECT topic_id, partition, base_offset, last_offset, object_key, object_type, start, size, max_timestamp FROM index_entries ORDER BY topic_id, partition, base_offset").fetchall(),
            db.execute("SELECT producer_id, topic_id, partition, epoch, batches, last_used, txn_first_offset, last_marker, txn_generation FROM producer_states").fetchall(),
            db.execute("SELECT topic_id, partition, last_offset, first_offset, producer_id FROM aborted_transactions").fetchall(),
            db.execute("SELECT topic_id, partition, last_offset, first_offset, producer_id, generation FROM committed_transactions").fetchall(),
            db.execute("SELECT producer_id, epoch FROM producer_epochs").fetchall(),
            db.execute("SELECT value FROM counters WHERE name = 'next_producer_id'").fetchall(),
            db.execute("SELECT key, value FROM security").fetchall(),
        )

    def _close_db(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _load(self, topics, partitions, entries, producers, aborted, committed, epochs, counter, security) -> None:
        for tid, name, count, configs in topics:
            info = TopicInfo(name, uuid.UUID(hex=tid), count, json.loads(configs))
            self._topics[name] = info
            self._by_id[info.topic_id] = info
        self._topics_view = MappingProxyType(dict(self._topics))
        for tid, p, next_offset, log_start in partitions:
            topic_id = uuid.UUID(hex=tid)
            view = self._partitions[(topic_id, p)] = PartitionView(next_offset, log_start)
            self._view_added(topic_id, p, view)
        for tid, p, base, last, key, otype, start, size, max_ts in entries:
            self._partitions[(uuid.UUID(hex=tid), p)].add(IndexEntry(base, last, key, ObjectType(otype), start, size, max_ts))
        now = self._now_ms()
        for pid, tid, p, epoch, batches, used, txn_first, last_marker, generation in producers:
            state = ProducerState(epoch, tuple(BatchSequence(*b) for b in json.loads(batches)), txn_first, last_marker, generation)
            key = (pid, uuid.UUID(hex=tid), p)
            self._producers[key], self._producer_used[key] = state, used or now
            view = self._partitions.get(key[1:])
            if view is not None:
                view.set_transaction_start(pid, txn_first)
        for tid, p, last, first, pid in aborted:
            view = self._partitions.get((uuid.UUID(hex=tid), p))
            if view is not None:
                view.add_aborted(AbortedTransaction(last, first, pid))
        for tid, p, last, first, pid, generation in committed:
            view = self._partitions.get((uuid.UUID(hex=tid), p))
            if view is not None:
                view.add_committed(CommittedTransaction(last, first, pid, generation))
        self._producer_epochs = dict(epochs)
        self._next_producer_id = counter[0][0] if counter else 0
        self._security = {key: bytes(value) for key, value in security}
        self._security_version += 1

    async def _exclusive(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run one write under the lock, shielded: a cancelled caller stops waiting, the write
        still completes (or fails) as a whole."""

        async def locked() -> T:
            async with self._lock:
                return await fn(*args)

        return await asyncio.shield(locked())

    async def _run(self, fn, *args) -> Any:
        if self._executor is None:
            raise MetadataUnavailable("metadata store is not started")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _write(self, statements: list[tuple[str, Any, bool]]) -> None:
        """Run (sql, params, many) statements as one transaction; MetadataUnavailable if it fails."""
        try:
            await self._run(self._transaction, statements)
        except (sqlite3.Error, OSError) as e:
            raise MetadataUnavailable(f"metadata write failed: {e}") from e

    def _transaction(self, statements: list[tuple[str, Any, bool]]) -> None:
        db = self._db
        if db is None:
            raise sqlite3.OperationalError("database is closed")
        db.execute("BEGIN IMMEDIATE")
        try:
            for sql, params, many in statements:
                if many:
                    db.executemany(sql, params)
                else:
                    db.execute(sql, params)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    # -- topics -------------------------------------------------------------------------------

    async def create_topic(self, name: str, partitions: int, configs: Mapping[str, str] | None = None) -> TopicInfo:
        if partitions < 1:
            raise InvalidPartitions(f"a topic needs at least one partition, got {partitions}")
        return await self._exclusive(self._create_topic, name, partitions, dict(configs or {}))

    async def _create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo:
        if name in self._topics:
            raise TopicAlreadyExists(name)
        info = TopicInfo(name, uuid.uuid4(), partitions, configs)
        tid = info.topic_id.hex
        await self._write(
            [
                ("INSERT INTO topics VALUES (?, ?, ?, ?)", (tid, name, partitions, json.dumps(configs)), False),
                ("INSERT INTO partitions VALUES (?, ?, 0, 0)", [(tid, p) for p in range(partitions)], True),
            ]
        )
        self._topics[name] = info
        self._by_id[info.topic_id] = info
        self._topics_view = MappingProxyType(dict(self._topics))
        for p in range(partitions):
            view = self._partitions[(info.topic_id, p)] = PartitionView()
            self._view_added(info.topic_id, p, view)
        return info

    async def delete_topic(self, name: str) -> TopicInfo:
        return await self._exclusive(self._delete_topic, name)

    async def _delete_topic(self, name: str) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise UnknownTopic(name)
        tid = info.topic_id.hex
        await self._write([(f"DELETE FROM {table} WHERE topic_id = ?", (tid,), False) for table in ("topics", "partitions", "index_entries", "producer_states", "aborted_transactions", "committed_transactions")])
        del self._topics[name]
        del self._by_id[info.topic_id]
        self._topics_view = MappingProxyType(dict(self._topics))
        for p in range(info.partitions):
            del self._partitions[(info.topic_id, p)]
        self._views_dropped(info.topic_id)
        # A scan, but deletes are rare and it keeps the commit path's lookups flat.
        for key in [k for k in self._producers if k[1] == info.topic_id]:
            del self._producers[key]
            self._producer_used.pop(key, None)
        return info

    def topics(self) -> Mapping[str, TopicInfo]:
        return self._topics_view

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self._by_id.get(topic_id)

    # -- the sequencer ------------------------------------------------------------------------

    async def commit(self, commit: ObjectCommit) -> list[AppendResult]:
        return await self._exclusive(self._commit, commit)

    async def _commit(self, commit: ObjectCommit) -> list[AppendResult]:
        if commit.object_key in self._fenced:
            raise ObjectFenced(f"{commit.object_key} was fenced off by the orphan sweeper")
        now = self._now_ms()
        if now >= self._next_expiry_ms:
            await self._expire_producers(now)
        seq = sequence(commit, self._partitions, self._producers)
        if not seq.changed:  # only refusals and duplicates: nothing to make durable
            return seq.results
        await self._write(self._commit_statements(seq, now))
        self._apply(seq, now)
        self.notifier.notify(seq.heads)
        return seq.results

    async def _expire_producers(self, now: int) -> None:
        """Forget producers idle for the expiry (Kafka's producer.id.expiration.ms), checked at
        most once a minute (or once an expiry, if shorter) by the commit that comes then."""
        self._next_expiry_ms = now + min(60_000, self.producer_expiry_ms)
        # A producer with a transaction open here is never expired (as Kafka's ProducerStateManager
        # keeps it): its state holds the transaction's first offset, which pins the last stable offset.
        idle = [key for key, used in self._producer_used.items() if used < now - self.producer_expiry_ms and self._producers[key].txn_first_offset < 0]
        if not idle:
            return
        await self._write([("DELETE FROM producer_states WHERE producer_id = ? AND topic_id = ? AND partition = ?", [(pid, tid.hex, p) for pid, tid, p in idle], True)])
        for key in idle:
            del self._producers[key], self._producer_used[key]
            view = self._partitions.get(key[1:])
            if view is not None:
                view.set_transaction_start(key[0], -1)

    @staticmethod
    def _commit_statements(seq: Sequenced, now: int) -> list[tuple[str, Any, bool]]:
        rows = [(tp[0].hex, tp[1], e.base_offset, e.last_offset, e.object_key, int(e.object_type), e.start, e.size, e.max_timestamp) for tp, entries in seq.entries.items() for e in entries]
        heads = [(offset, tp[0].hex, tp[1]) for tp, offset in seq.heads.items()]
        states = [(pid, tid.hex, p, s.epoch, json.dumps([list(b) for b in s.batches]), now, s.txn_first_offset, s.last_marker, s.txn_generation) for (pid, tid, p), s in seq.producers.items()]
        statements = [
            ("INSERT INTO index_entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows, True),
            ("UPDATE partitions SET next_offset = ? WHERE topic_id = ? AND partition = ?", heads, True),
            ("INSERT OR REPLACE INTO producer_states VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", states, True),
        ]
        if seq.aborted:
            aborted = [(tid.hex, p, a.last_offset, a.first_offset, a.producer_id) for (tid, p), txns in seq.aborted.items() for a in txns]
            statements.append(("INSERT OR REPLACE INTO aborted_transactions VALUES (?, ?, ?, ?, ?)", aborted, True))
        if seq.committed:
            committed = [(tid.hex, p, c.last_offset, c.first_offset, c.producer_id, c.generation) for (tid, p), txns in seq.committed.items() for c in txns]
            statements.append(("INSERT OR REPLACE INTO committed_transactions VALUES (?, ?, ?, ?, ?, ?)", committed, True))
        return statements

    def _apply(self, seq: Sequenced, now: int) -> None:
        partitions = self._partitions
        for tp, offset in seq.heads.items():
            partitions[tp].next_offset = offset
        for tp, entries in seq.entries.items():
            part = partitions[tp]
            for e in entries:
                part.add(e)
        self._producers.update(seq.producers)
        self._producer_used.update(dict.fromkeys(seq.producers, now))
        for (pid, tid, p), state in seq.producers.items():
            partitions[(tid, p)].set_transaction_start(pid, state.txn_first_offset)
        for tp, txns in seq.aborted.items():
            for a in txns:
                partitions[tp].add_aborted(a)
        for tp, txns in seq.committed.items():
            for c in txns:
                partitions[tp].add_committed(c)

    async def replace_entries(self, topic_id: uuid.UUID, partition: int, replaced: Sequence[IndexEntry], replacement: IndexEntry, fence: Fence | None = None) -> bool:
        check_replacement(replaced, replacement)
        return await self._exclusive(self._replace_entries, topic_id, partition, list(replaced), replacement, fence)

    async def _replace_entries(self, topic_id: uuid.UUID, partition: int, replaced: list[IndexEntry], replacement: IndexEntry, fence: Fence | None) -> bool:
        self._check_fence(fence)  # one process: a lead changes hands only by a resign in it, never behind its back
        part = self._partitions.get((topic_id, partition))
        if part is None:
            raise UnknownTopic(f"{topic_id}/{partition}")
        first, last = replaced[0].base_offset, replaced[-1].last_offset
        if part.covering(first, last) != replaced:
            return False
        e = replacement
        tid = topic_id.hex
        statements = [
            ("DELETE FROM index_entries WHERE topic_id = ? AND partition = ? AND base_offset BETWEEN ? AND ?", (tid, partition, first, last), False),
            ("INSERT INTO index_entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (tid, partition, e.base_offset, e.last_offset, e.object_key, int(e.object_type), e.start, e.size, e.max_timestamp), False),
        ]
        if e.object_type != ObjectType.WAL:  # its aborted records are gone with the WAL range (PartitionView.replace)
            statements.append(("DELETE FROM aborted_transactions WHERE topic_id = ? AND partition = ? AND last_offset BETWEEN ? AND ?", (tid, partition, first, last), False))
            statements.append(("DELETE FROM committed_transactions WHERE topic_id = ? AND partition = ? AND last_offset BETWEEN ? AND ?", (tid, partition, first, last), False))
        await self._write(statements)
        part.replace(replacement)
        return True

    async def fence_objects(self, object_keys: Collection[str]) -> set[str]:
        return await self._exclusive(self._fence_objects, object_keys)

    async def _fence_objects(self, object_keys: Collection[str]) -> set[str]:
        # Commits run under the same lock: each one landed before this, or will find the fence.
        self._fenced.update(object_keys)
        referenced = self.referenced_objects()
        return {key for key in object_keys if key not in referenced}

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def producer_state(self, topic_id: uuid.UUID, partition: int, producer_id: int) -> ProducerState | None:
        return self._producers.get((producer_id, topic_id, partition))

    def producer_last_used(self, topic_id: uuid.UUID, partition: int, producer_id: int) -> int | None:
        return self._producer_used.get((producer_id, topic_id, partition))

    def producer_states(self, topic_id: uuid.UUID, partition: int) -> dict[int, ProducerState]:
        # A scan over every producer state; DescribeProducers is rare and the commit path keeps its flat keys.
        # One idle past the expiry is not active, though the next commit's check forgets it only then.
        idle_before = self._now_ms() - self.producer_expiry_ms
        return {pid: state for (pid, tid, p), state in self._producers.items() if tid == topic_id and p == partition and (self._producer_used[(pid, tid, p)] >= idle_before or state.txn_first_offset >= 0)}

    async def init_producer_id(self, producer_id: int = -1, producer_epoch: int = -1) -> tuple[int, int]:
        return await self._exclusive(self._init_producer_id, producer_id, producer_epoch)

    async def _init_producer_id(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        """KIP-360: a known (id, current epoch) gets the same id at the next epoch. Anything else
        (no id, an unknown id, a stale epoch, an exhausted epoch) gets a fresh id at epoch 0, as
        Kafka does for producers without a transactional id."""
        bumped = bumped_epoch(producer_id, producer_epoch)
        if bumped is not None and self._producer_epochs.get(producer_id) == producer_epoch:
            pid, epoch, next_id = producer_id, bumped, self._next_producer_id
        else:
            pid, epoch, next_id = self._next_producer_id, 0, self._next_producer_id + 1
        await self._write(
            [
                ("INSERT OR REPLACE INTO producer_epochs VALUES (?, ?)", (pid, epoch), False),
                ("INSERT OR REPLACE INTO counters VALUES ('next_producer_id', ?)", (next_id,), False),
            ]
        )
        self._producer_epochs[pid] = epoch
        self._next_producer_id = next_id
        return pid, epoch

    # -- topic changes and log start ------------------------------------------------------------

    async def update_topic(self, name: str, partitions: int | None = None, configs: Mapping[str, str | None] | None = None) -> TopicInfo:
        return await self._exclusive(self._update_topic, name, partitions, dict(configs or {}))

    async def _update_topic(self, name: str, partitions: int | None, configs: dict[str, str | None]) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise UnknownTopic(name)
        count = partition_count(info, partitions)
        merged = merged_configs(info.configs, configs)
        updated = TopicInfo(name, info.topic_id, count, merged)
        tid = info.topic_id.hex
        await self._write(
            [
                ("UPDATE topics SET partitions = ?, configs = ? WHERE topic_id = ?", (count, json.dumps(merged), tid), False),
                ("INSERT INTO partitions VALUES (?, ?, 0, 0)", [(tid, p) for p in range(info.partitions, count)], True),
            ]
        )
        self._topics[name] = updated
        self._by_id[info.topic_id] = updated
        self._topics_view = MappingProxyType(dict(self._topics))
        for p in range(info.partitions, count):
            view = self._partitions[(info.topic_id, p)] = PartitionView()
            self._view_added(info.topic_id, p, view)
        return updated

    async def advance_log_start(self, topic_id: uuid.UUID, partition: int, offset: int) -> int:
        return await self._exclusive(self._advance_log_start, topic_id, partition, offset)

    async def _advance_log_start(self, topic_id: uuid.UUID, partition: int, offset: int) -> int:
        part = self._partitions.get((topic_id, partition))
        if part is None:
            raise UnknownTopic(f"{topic_id}/{partition}")
        target = clamped_log_start(offset, part.log_start_offset, part.next_offset)
        if target != part.log_start_offset:
            await self._write([("UPDATE partitions SET log_start_offset = ? WHERE topic_id = ? AND partition = ?", (target, topic_id.hex, partition), False)])
            part.log_start_offset = target
        return target

    # -- consumer groups ------------------------------------------------------------------------

    async def commit_offsets(self, group: str, offsets: Mapping[TopicPartition, CommittedOffset], if_unchanged: Mapping[str, int] | None = None) -> bool:
        rows = [(group, tid.hex, p, o.offset, o.leader_epoch, o.metadata, o.commit_timestamp) for (tid, p), o in offsets.items()]
        statements = [("INSERT OR REPLACE INTO group_offsets VALUES (?, ?, ?, ?, ?, ?, ?)", rows, True)]
        if not if_unchanged:
            await self._exclusive(self._write, statements)
            return True
        return await self._exclusive(self._write_if_unchanged, statements, dict(if_unchanged))

    async def _write_if_unchanged(self, statements: list[tuple[str, Any, bool]], expect: dict[str, int]) -> bool:
        def compare_and_write() -> bool:
            if not self._registry_matches(expect):
                return False
            self._transaction(statements)
            return True

        try:
            return await self._run(compare_and_write)
        except (sqlite3.Error, OSError) as e:
            raise MetadataUnavailable(f"metadata write failed: {e}") from e

    async def fetch_offsets(self, group: str) -> dict[TopicPartition, CommittedOffset]:
        rows = await self._run(self._query, "SELECT topic_id, partition, committed_offset, leader_epoch, metadata, commit_timestamp FROM group_offsets WHERE group_id = ?", (group,))
        return {(uuid.UUID(hex=tid), p): CommittedOffset(o, e, m, ts) for tid, p, o, e, m, ts in rows}

    async def delete_offsets(self, group: str, partitions=None) -> None:
        if partitions is None:
            statements = [("DELETE FROM group_offsets WHERE group_id = ?", (group,), False)]
        else:
            statements = [("DELETE FROM group_offsets WHERE group_id = ? AND topic_id = ? AND partition = ?", [(group, tid.hex, p) for tid, p in partitions], True)]
        await self._exclusive(self._write, statements)

    async def save_group(self, group: str, state: bytes | None) -> None:
        if state is None:
            statement = ("DELETE FROM group_states WHERE group_id = ?", (group,), False)
        else:
            statement = ("INSERT OR REPLACE INTO group_states VALUES (?, ?)", (group, state), False)
        await self._exclusive(self._write, [statement])

    async def load_group(self, group: str) -> bytes | None:
        rows = await self._run(self._query, "SELECT state FROM group_states WHERE group_id = ?", (group,))
        return bytes(rows[0][0]) if rows else None

    async def list_groups(self) -> list[str]:
        rows = await self._run(self._query, "SELECT group_id FROM group_states UNION SELECT group_id FROM group_offsets ORDER BY 1", ())
        return [r[0] for r in rows]

    # -- the schema registry's storage ------------------------------------------------------------

    async def registry_get(self, key: str) -> RegistryItem | None:
        rows = await self._run(self._query, "SELECT key, value, revision FROM registry WHERE key = ?", (key,))
        return RegistryItem(rows[0][0], bytes(rows[0][1]), rows[0][2]) if rows else None

    async def registry_items(self, prefix: str) -> list[RegistryItem]:
        # a range, not LIKE: keys may hold % and _
        rows = await self._run(self._query, "SELECT key, value, revision FROM registry WHERE key >= ? AND key < ? ORDER BY key", (prefix, prefix + "\U0010ffff"))
        return [RegistryItem(k, bytes(v), r) for k, v, r in rows]

    async def registry_write(self, writes: Mapping[str, bytes | None], expect: Mapping[str, int]) -> bool:
        return await self._exclusive(self._registry_write, dict(writes), dict(expect))

    async def _registry_write(self, writes: dict[str, bytes | None], expect: dict[str, int]) -> bool:
        try:
            return await self._run(self._registry_transaction, writes, expect)
        except (sqlite3.Error, OSError) as e:
            raise MetadataUnavailable(f"metadata write failed: {e}") from e

    def _registry_matches(self, expect: dict[str, int]) -> bool:
        """Whether every registry key of `expect` is at its revision (0: absent); under the lock."""
        db = self._db
        if db is None:
            raise sqlite3.OperationalError("database is closed")
        for key, revision in expect.items():
            row = db.execute("SELECT revision FROM registry WHERE key = ?", (key,)).fetchone()
            if (row[0] if row else 0) != revision:
                return False
        return True

    def _registry_transaction(self, writes: dict[str, bytes | None], expect: dict[str, int]) -> bool:
        """The compare and the writes in one SQLite transaction (the lock keeps other writers out)."""
        if not self._registry_matches(expect):
            return False
        db = self._db
        row = db.execute("SELECT value FROM counters WHERE name = 'registry_revision'").fetchone()
        revision = (row[0] if row else 0) + 1
        statements: list[tuple[str, Any, bool]] = [("INSERT OR REPLACE INTO counters VALUES ('registry_revision', ?)", (revision,), False)]
        for key, value in writes.items():
            if value is None:
                statements.append(("DELETE FROM registry WHERE key = ?", (key,), False))
            else:
                statements.append(("INSERT OR REPLACE INTO registry VALUES (?, ?, ?)", (key, value, revision), False))
        self._transaction(statements)
        return True

    # -- the security family ------------------------------------------------------------------

    async def security_write(self, writes: Mapping[str, bytes | None]) -> None:
        checked = checked_security_writes(writes)
        if checked:
            await self._exclusive(self._security_write, checked)

    async def _security_write(self, writes: dict[str, bytes | None]) -> None:
        puts = [(key, value) for key, value in writes.items() if value is not None]
        deletes = [(key,) for key, value in writes.items() if value is None]
        await self._write([("INSERT OR REPLACE INTO security VALUES (?, ?)", puts, True), ("DELETE FROM security WHERE key = ?", deletes, True)])
        for key, value in writes.items():
            if value is None:
                self._security.pop(key, None)
            else:
                self._security[key] = value
        self._security_version += 1

    def _query(self, sql: str, params: tuple) -> list:
        if self._db is None:
            raise MetadataUnavailable("metadata store is closed")
        return self._db.execute(sql, params).fetchall()

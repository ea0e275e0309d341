"""The compaction service: the single owner of every topic's table, cycling plan → Spark tasks →
manifest → one Iceberg commit → index swap, topic by topic (`neve compactor`, and inside `neve dev`).

Each cycle of a topic: its table is loaded or created and evolved by the topic's registered value
schemas; the last cycle's index swap is finished if a crash cut it short (commits/reindex.py); the WAL
entries older than the freshness setting, below each partition's last stable offset (an open
transaction holds its partition's table back: `neve_compactor_transaction_held_offsets`), are
planned into tasks with the aborted transactions they meet (files/planner.py); the job turns them into
Parquet files, without control batches or aborted records (files/job.py, on Spark or in this process); the cycle's manifest is written; the
committer appends the files in one snapshot naming the manifest (commits/committer.py); the index swap
replaces the WAL entries by one PARQUET entry per partition. A crash or a failure anywhere is
finished or redone by the next cycle: files written but not committed are orphans (never in the
table), a commit without its swap is swapped (reindex.finish_last_cycle, run again after any
failure past a commit), a swap is idempotent. After each topic's cycle its table is maintained
(maintenance/rounds.py: expired rows deleted, small files merged, old snapshots expired, the index
re-pointed at the files any rewrite made); a deleted topic's table is dropped when its topic asked
(maintenance/retention.py). Blocking work (pyiceberg, Spark, Parquet) runs in threads, off the event loop.

Fenced: the service cycles as the holder of the "compactor" leadership (`leadership`), checks it
before each step of a cycle and stops the run once it is lost; its index swaps carry the lead's
fence, so a swap after the lead changed hands changes nothing. Its Iceberg commit cannot carry the
fence; a deposed compactor's commit is harmless because the table keeps the offsets each topic's
cycles committed (commits/committer.py): the new leader's commit over the same offsets is refused and the
new leader swaps the deposed one's cycle instead (finish_last_cycle), so every offset is in the
table once.

A topic whose cycles keep failing is reported (`neve_compactor_topic_failing`, by reason, and a
log line per failure, its traceback the first time); a failed table maintenance is reported apart
(`neve_compactor_maintenance_failures`) and does not count as the topic's compaction failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import signal
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from metadata.model import IndexEntry, ObjectType, TopicInfo
from metadata.store import Fenced, MetadataError, MetadataStore
from metadata.transactions import KEY_PREFIX, ending_partitions
from table import removals
from wal.manifest import CycleManifest, FileSlice, PartitionCompaction, Removal, WalRange, new_cycle_id, removal_key
from wal.store import ObjectStore, ObjectStoreError

from .. import metrics
from ..commits import compacted_index, upsert
from ..commits.committer import CycleOverlap, DeletedFilesGone, TableChanged, commit_cycle_table
from ..commits.reindex import finish_last_cycle, swap
from ..config import CompactorConfig
from ..files import planner
from ..maintenance import wal_expiry
from ..maintenance.retention import TopicDrops
from ..maintenance.rounds import TableMaintenance
from . import tables

log = logging.getLogger("neve.compactor")

MAX_ENTRIES_PER_PARTITION = 4096  # a cycle plans at most this many WAL entries of a partition
FAILING_AFTER = 3  # cycles of a topic failing in a row before it is reported as failing
# Tables kept in memory as their last commit left them (the next cycle's commit starts from one
# without reading the catalog). A table's metadata holds every snapshot it keeps, about 4 KiB each
# in pyiceberg's models: up to 0.8 MiB at twice snapshot_max_count's default.
KEPT_TABLES = 256
# A compacted topic's commit computes its deletes again when a table rewrite (maintenance, another
# engine) removed a file they named, at most this many times in a cycle (the cycle then fails and
# is redone).
UPSERT_ATTEMPTS = 5


@dataclass(slots=True)
class Failing:
    """A topic's cycles failing in a row, and the kind of the last failure."""

    reason: str
    count: int = 0
    reasons: set[str] = field(default_factory=set)  # kinds logged with their traceback already


class _TableKey(NamedTuple):
    """What a kept table is the table of: a topic config change loads it again."""

    topic_id: uuid.UUID
    partition_by: str | None

    @classmethod
    def of(cls, info: TopicInfo) -> _TableKey:
        return cls(info.topic_id, info.configs.get(tables.PARTITION_BY))


@dataclass(slots=True)
class TopicCycle:
    """What one cycle did to one topic's table."""

    topic: str
    table: str
    cycle_id: str | None = None  # None: nothing was due
    snapshot_id: int | None = None
    rows: int = 0
    files: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    # a compacted topic's cycle: rows it deleted (older rows of its keys, and tombstones)
    rows_superseded: int = 0
    tombstones: int = 0
    delete_bytes: int = 0  # bytes of the position-delete files it wrote


@dataclass(slots=True)
class _Due:
    """A topic with tasks in this cycle, between its plan and its commit."""

    info: TopicInfo
    cycle: TopicCycle
    table: Any  # pyiceberg Table
    context: Any  # job.TaskContext
    plan: planner.Plan
    started: float
    results: list | None = None  # job.TaskResult of each task, once the job ran


class InjectedFault(Exception):
    """A test's fault raised at a step of a cycle (`CompactorConfig.fault_raise_at`)."""


class CompactionService:
    """`objects` is the WAL object store (`objects_url` names it for the executors, which open their
    own); `schemas` is a registry.client.SchemaLookup (neve's own registry or an external one);
    `spark` a SparkSession to run the tasks on (the runner `spark`) instead of one this service
    starts on first need: its owner stops it, close() does not."""

    def __init__(
        self,
        config: CompactorConfig,
        metadata: MetadataStore,
        objects: ObjectStore,
        objects_url: str,
        schemas,
        *,
        clock: Callable[[], float] = time.time,
        spark=None,
    ) -> None:
        self.config = config
        self.metadata = metadata
        self.objects = objects
        self.objects_url = objects_url
        self.schemas = schemas
        self._clock = clock
        self._catalog = None
        self._spark = spark
        self._owns_spark = spark is None
        self.failed: list[str] = []  # topics whose compaction failed in the last run_once
        # per (topic id, partition): the next offset not yet in the table, once known
        self._checkpoints: dict[tuple, int] = {}
        self._recovered: set[str] = set()  # tables with no cycle committed and not swapped (as far as this process knows)
        self.leadership = None  # metadata.store.Leadership this service cycles under; None: it cycles regardless
        # compactor.service.sharing.Sharing: the topics this compactor takes among the live compactors
        # sharing them (its `leadership` then its own membership); None: every topic
        self.sharing = None
        self._fence = None  # the lead's fence this run's swaps carry
        self._failing: dict[str, Failing] = {}  # by topic name
        self._held: dict[str, set[int]] = {}  # by topic name: its partitions an open transaction has held back
        self._failed_now: set[str] = set()  # topics whose cycle failed in this run
        self._owned: dict = {}  # topic id -> TopicInfo: the topics the last run cycled
        # identifier -> (what it is the table of, the pyiceberg Table as this process last committed to it)
        self._tables: OrderedDict[str, tuple[_TableKey, Any]] = OrderedDict()  # the KEPT_TABLES last committed to
        self._maintenance_failing: dict[str, Failing] = {}
        self._faults_to_raise = set(filter(None, config.fault_raise_at.split(",")))
        self._tasks_planned = 0  # counted for the table-row-dropped plant alone (`_drop_row_tasks`)
        self.maintenance = TableMaintenance(config, metadata, objects, spark=self._maintenance_spark, fault=self._fault, clock=clock)
        self.drops = TopicDrops(metadata, config.namespace, lambda info: tables.table_identifier(config.namespace, info.name, info.configs))

    # -- the loop -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Cycle until `stop` is set: a cycle, then a pause of `interval_ms` (none while a topic
        still had more due than a cycle took). A failed cycle is logged, counted and retried."""
        while not stop.is_set():
            busy = False
            try:
                for cycle in await self.run_once():
                    busy = busy or cycle.cycle_id is not None
            except Exception:
                metrics.CYCLE_FAILURES.inc()
                log.exception("compaction cycle failed; retrying")
            if not busy or stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), self.config.interval_ms / 1000)
                except TimeoutError:
                    pass

    async def run_once(self) -> list[TopicCycle]:
        """One cycle over every topic whose table is on (of those this compactor owns, when
        compactors share them): the tables of deleted topics that asked for it are dropped first;
        then every topic with something due is planned and the tasks of all of them run in one job
        (`_cycle`). A topic that fails is logged and counted; the others still run. A topic
        without a table has what retention hid let go (maintenance/wal_expiry.py)."""
        done: list[TopicCycle] = []
        self.failed = []
        self._failed_now = set()
        if self.leadership is not None:
            fence = self.leadership.fence()
            if self._fence is None or fence.epoch != self._fence.epoch:
                # A new lead: a compactor that led in between may have left a cycle unswapped.
                self._recovered.clear()
            self._fence = fence
        try:
            if self.sharing is not None and await self.sharing.refresh():
                self._recovered.clear()  # topics gained: their last owner may have left a cycle unswapped
            if self.sharing is None or self.sharing.drops_tables(self.drops):  # one compactor's work, not per topic
                await self.drop_deleted_tables()
            topics = []
            for info in sorted(self.metadata.topics().values(), key=lambda t: t.name):
                if self.sharing is not None and not self.sharing.owns(info.topic_id):
                    continue
                if not tables.is_enabled(info.configs, self.config.tables_by_default):
                    await self._expire_wal(info)
                    continue
                topics.append(info)
            self._owning(topics)
            await self._cycle(topics, done)
        except Fenced as e:  # another compactor leads now: what this one had not done is its to do
            log.warning("compactor leadership lost; this run stops", extra={"reason": str(e)})
        return done

    async def _cycle(self, topics: list[TopicInfo], done: list[TopicCycle]) -> None:
        """One cycle of `topics`: each one's table recovered when needed and its due WAL entries
        planned (several topics at a time); the tasks of every topic with something due in one job
        (job.run_cycle: a Spark job's fixed cost once a cycle, not once a topic); then each of
        those topics' manifest, Iceberg commit and index swap, `tables_in_parallel` tables at a
        time; last, each topic's table maintenance. A topic failing at any step is that topic's
        failure alone (`_topic_failed`); a lost lead (Fenced) stops the cycle."""
        started = time.monotonic()
        live = tables.live_topic_ids(self.metadata)  # once a cycle: each table's binding check reads it
        recovering = [info for info in topics if self._identifier(info) not in self._recovered]
        loaded = {}
        if recovering:
            for info, table in zip(recovering, await self._each(recovering, lambda info: self._recover(info, live)), strict=True):
                if table is not None:
                    loaded[info.topic_id] = table
        topics = [info for info in topics if self._identifier(info) in self._recovered]  # a failed recovery is that topic's failure
        reads, ending = await self._read_pending(topics)
        prepared = await self._each(topics, lambda info: self._prepare(info, live, reads[info.topic_id], ending, loaded.get(info.topic_id)))
        due: list[_Due] = []
        for outcome in prepared:
            if isinstance(outcome, _Due):
                due.append(outcome)
            elif outcome is not None:
                done.append(outcome)
        if due:
            self._check_lead()
            job_started = time.monotonic()
            try:
                ran = await self._run_job(due)
            except Exception as e:  # the job failed as a whole (an executor lost, say): so did each of its topics
                ran = [e] * len(due)
            tasks = sum(len(d.plan.tasks) for d in due)
            log.info("cycle's tasks ran", extra={"topics": len(due), "tasks": tasks, "bytes": sum(d.plan.size for d in due), "seconds": round(time.monotonic() - job_started, 3), "runner": self.config.runner})
            for d, results in zip(due, ran, strict=True):
                if isinstance(results, Exception):
                    self._topic_failed(d.info, results)
                    self._tables.pop(d.cycle.table, None)
                else:
                    d.results = results
            committed = await self._each([d for d in due if d.results is not None], self._commit, key=lambda d: d.info)
            done.extend(c for c in committed if c is not None)
        failed = self._failed_now
        cycled = {c.topic for c in done if c.cycle_id is not None}
        # Merges and expiries due take at most a quarter of the time the cycle's compaction did (at
        # least one a cycle): the others wait for a later cycle, and no topic's freshness waits for
        # all of them. A merge's cost is mostly fixed (0.2-0.4 s a table at a thousand small
        # topics): one that waits merges more files for about the same.
        rounds_until = time.monotonic() + (time.monotonic() - started) / 4
        for info in topics:
            if info.name in failed:
                continue
            self._topic_recovered(info)
            await self._maintain(info, committed=info.name in cycled, rounds=time.monotonic() < rounds_until)

    async def _each(self, items: list, step: Callable[[Any], Awaitable[Any]], key: Callable[[Any], TopicInfo] = lambda info: info) -> list:
        """`step` of each item, `tables_in_parallel` at a time, their outcomes in order: None for
        an item whose step failed (`_topic_failed` of its topic). Fenced, raised by any, is raised
        once every step under way has ended."""
        limit = asyncio.Semaphore(max(1, self.config.tables_in_parallel))
        fenced: list[Fenced] = []

        async def one(item):
            async with limit:
                if fenced:
                    return None
                try:
                    return await step(item)
                except Fenced as e:
                    fenced.append(e)
                except Exception as e:
                    self._topic_failed(key(item), e)
                return None

        outcomes = await asyncio.gather(*(one(item) for item in items))
        if fenced:
            raise fenced[0]
        return outcomes

    def _owning(self, topics: list[TopicInfo]) -> None:
        """The topics this compactor cycles from now on: one it did not cycle before (gained from
        another compactor, or new) has its table recovered first; one it no longer cycles has its
        table let go and its lag no longer exported here."""
        owned = {info.topic_id: info for info in topics}
        for topic_id, info in self._owned.items():
            if topic_id not in owned:
                self._recovered.discard(self._identifier(info))
                self._tables.pop(self._identifier(info), None)
                metrics.forget_lag(info.name, info.partitions)
                self._held.pop(info.name, None)
        for topic_id, info in owned.items():
            if topic_id not in self._owned:
                self._recovered.discard(self._identifier(info))
        self._owned = owned

    def _identifier(self, info: TopicInfo) -> str | None:
        """The topic's table, None when its config names another namespace (its cycle fails)."""
        try:
            return tables.table_identifier(self.config.namespace, info.name, info.configs)
        except ValueError:
            return None

    def _check_lead(self) -> None:
        """Fenced once this service's lead is lost (or taken again: another lead in between)."""
        if self.leadership is not None and (not self.leadership.is_leader() or self.leadership.epoch != self._fence.epoch):
            raise Fenced(f"compactor leadership lost (epoch {self._fence.epoch})")

    def _topic_failed(self, info: TopicInfo, e: Exception) -> None:
        """A topic's cycle failed: retried next cycle, counted, logged (its traceback the first time
        for each kind of failure), and once FAILING_AFTER in a row, reported by the gauge."""
        reason = type(e).__name__
        self._failed_now.add(info.name)
        failing = self._failing.setdefault(info.name, Failing(reason))
        if failing.reason != reason:
            metrics.TOPIC_FAILING.labels(info.name, failing.reason).set(0)
            failing.reason = reason
        failing.count += 1
        if not isinstance(e, MetadataError):  # the metadata store away is no failure of the topic's
            metrics.CYCLE_FAILURES.inc()
            self.failed.append(info.name)
        first = reason not in failing.reasons and not isinstance(e, MetadataError)
        failing.reasons.add(reason)
        extra = {"topic": info.name, "reason": reason, "error": str(e), "failures": failing.count}
        log.log(logging.ERROR if failing.count >= FAILING_AFTER else logging.WARNING, "topic's compaction failed; it is retried next cycle", extra=extra, exc_info=e if first else None)
        if failing.count >= FAILING_AFTER:
            metrics.TOPIC_FAILING.labels(info.name, reason).set(failing.count)
        with contextlib.suppress(Exception):  # its lag grows visibly while it fails, wherever the cycle stopped
            self._export_lag(info, self._wal_entries(info))

    def _topic_recovered(self, info: TopicInfo) -> None:
        failing = self._failing.pop(info.name, None)
        if failing is not None:
            metrics.TOPIC_FAILING.labels(info.name, failing.reason).set(0)
            log.info("topic's compaction recovered", extra={"topic": info.name, "failures": failing.count})

    async def _maintain(self, info: TopicInfo, committed: bool, rounds: bool = True) -> None:
        """maintain_topic, whose failure is reported as a maintenance failure (retried at its next
        round) and never as the topic's compaction failing."""
        self._check_lead()
        try:
            await self.maintain_topic(info, committed=committed, rounds=rounds)
        except Fenced:
            raise
        except Exception as e:
            reason = type(e).__name__
            failing = self._maintenance_failing.setdefault(info.name, Failing(reason))
            failing.count += 1
            metrics.MAINTENANCE_FAILURES.labels(info.name, reason).inc()
            log.warning("table maintenance failed; retried at its next round", extra={"topic": info.name, "reason": reason, "error": str(e)}, exc_info=e if reason not in failing.reasons else None)
            failing.reasons.add(reason)
        else:
            self._maintenance_failing.pop(info.name, None)

    # -- one topic ------------------------------------------------------------------------------

    async def compact_topic(self, info: TopicInfo) -> TopicCycle:
        """One cycle of one topic alone, its failure raised (tests, the compaction bench)."""
        live = tables.live_topic_ids(self.metadata)
        table = await self._recover(info, live) if self._identifier(info) not in self._recovered else None
        reads, ending = await self._read_pending([info])
        prepared = await self._prepare(info, live, reads[info.topic_id], ending, table)
        if isinstance(prepared, TopicCycle):
            return prepared
        (results,) = await self._run_job([prepared])
        if isinstance(results, Exception):
            raise results
        prepared.results = results
        return await self._commit(prepared)

    async def _recover(self, info: TopicInfo, live: frozenset[str] | None):
        """A topic this compactor has not seen through its last cycle: its table loaded, and that
        cycle's index swap finished (reindex.finish_last_cycle), before its entries are read: the
        swap may move them. Returns the table."""
        identifier = tables.table_identifier(self.config.namespace, info.name, info.configs)
        self._check_lead()
        self._tables.pop(identifier, None)  # read as it is now, not as this process last knew it
        table = await self._table(info, identifier, live)
        await finish_last_cycle(self.metadata, self.objects, table, self._fence)
        if upsert.is_compacted(info.configs):  # a merge a crash cut short (commits/compacted_index.py)
            await self._merge_compacted(info, identifier, range(info.partitions))
        self._recovered.add(identifier)
        return table

    async def _read_pending(self, topics: list[TopicInfo]) -> tuple[dict, set[tuple[str, int]] | None]:
        """Each topic's pending entries, last stable offsets and aborted transactions, read from
        the view all at once (no await between topics), and the partitions whose transaction's
        markers the view may hold only in part: the stored transactions are read before and after
        (metadata/transactions.py `ending_partitions`), the view caught up with the first read.
        Those partitions wait for the next cycle, so a transaction over several partitions (and
        topics) is in each table whole or not at all. None when the stored transactions could not
        be read: then every partition that has had a transaction waits."""
        try:
            before = await self.metadata.registry_items(KEY_PREFIX)
            await self.metadata.view_caught_up()
        except MetadataError as e:
            log.warning("transactions unreadable: partitions with transactions wait", extra={"error": str(e)})
            before = None
        reads = {info.topic_id: self._pending(info) for info in topics}
        ending: set[tuple[str, int]] | None = None
        if before is not None:
            try:
                after = await self.metadata.registry_items(KEY_PREFIX)
            except MetadataError as e:
                log.warning("transactions unreadable: partitions with transactions wait", extra={"error": str(e)})
            else:
                ending = ending_partitions({i.key: (i.value, i.revision) for i in before}, {i.key: (i.value, i.revision) for i in after}) if before or after else set()
        return reads, ending

    async def _prepare(self, info: TopicInfo, live: frozenset[str] | None, pending: tuple, ending: set[tuple[str, int]] | None, table=None) -> TopicCycle | _Due:
        """A topic's part of a cycle before its tasks run: its due WAL entries planned (from what
        `_read_pending` read), and when there are any, its table evolved by the topic's value
        schemas and the context its tasks need. A topic with nothing due costs no catalog, table
        metadata or registry read (its table loaded once, when this compactor takes it on)."""
        from ..files.job import TaskContext

        started = time.monotonic()
        identifier = tables.table_identifier(self.config.namespace, info.name, info.configs)
        plan = await self._plan(info, pending, ending)
        if not plan.tasks:
            return TopicCycle(info.name, identifier)
        if table is None:
            table = await self._table(info, identifier, live)
        versions = await self.schemas.subject_schemas(tables.value_subject(info.name))
        table, resolved = await asyncio.to_thread(tables.apply_schemas, table, versions)
        self._keep_table(info, identifier, table)
        cycle = TopicCycle(info.name, identifier, new_cycle_id())
        context = TaskContext.for_table(
            table,
            topic=info.name,
            cycle_id=cycle.cycle_id,
            objects_url=self.objects_url,
            schemas={sid: (r.text, r.raw_reason) for sid, r in resolved.items()},
            subject=tables.value_subject(info.name),
            drop_row_tasks=self._drop_row_tasks(len(plan.tasks)) if self.config.fault_drop_row_every else frozenset(),
        )
        return _Due(info, cycle, table, context, plan, started)

    async def _table(self, info: TopicInfo, identifier: str, live: frozenset[str] | None):
        """The topic's table as this compactor last committed to it, or loaded (created, bound, a
        deleted topic's table set aside: tables.load_or_create) when it has not kept it. A table
        changed by another writer since is not wrong to start from: the commit finds the change
        (its snapshot check fails) and re-reads the table before it tries again (commits/committer.py)."""
        kept = self._tables.get(identifier)
        if kept is not None and kept[0] == _TableKey.of(info):
            return kept[1]
        catalog = await self._load_catalog()
        table = await asyncio.to_thread(tables.load_or_create, catalog, identifier, info.configs.get(tables.PARTITION_BY), info.topic_id, live)
        self._keep_table(info, identifier, table)
        return table

    def _keep_table(self, info: TopicInfo, identifier: str, table) -> None:
        self._tables[identifier] = (_TableKey.of(info), table)
        self._tables.move_to_end(identifier)
        while len(self._tables) > KEPT_TABLES:
            self._tables.popitem(last=False)

    async def _run_job(self, due: list[_Due]):
        """The tasks of every topic in `due` in one job: per topic its results, or the error that
        failed it. Raises when the job failed as a whole."""
        from ..files import job

        work = [(d.context, d.plan.tasks) for d in due]
        if self.config.runner == "in-process":
            return await asyncio.to_thread(job.run_cycle_in_process, work, self.config.parallelism)
        return await asyncio.to_thread(job.run_cycle, await self._spark_session(), work, self.config.parallelism)

    async def _commit(self, d: _Due) -> TopicCycle:
        """A topic's part of a cycle after its tasks ran: the cycle's manifest, its one Iceberg
        commit (commits/committer.py) and the index swap (commits/reindex.py)."""
        info, cycle, identifier, results = d.info, d.cycle, d.cycle.table, d.results
        written = [f for r in results for f in r.files]
        self._fault("written")
        spec = d.table.spec()
        data_files = [f.data_file(spec, d.table.format_version) for f in written]
        deletes, removed = None, {}
        if upsert.is_compacted(info.configs):
            compute = upsert.cycle_deletes if upsert.UPSERT in d.table.properties else upsert.conversion_deletes
            deletes = await asyncio.to_thread(compute, d.table, data_files)
            removed = await self._write_removals(info, cycle.cycle_id, deletes)
            self._fault("removals-written")
        manifest = await asyncio.to_thread(_manifest, cycle.cycle_id, info, identifier, d.plan, written, removed)
        data = await asyncio.to_thread(manifest.encode)
        await self.objects.put(manifest.key, data)
        self._fault("manifest-written")
        self._check_lead()
        # Until this cycle is swapped, the next one finishes it first (a failure may come between).
        self._recovered.discard(identifier)
        self._tables.pop(identifier, None)  # kept again once committed: a failed commit re-reads it
        try:
            committed, table = await self._commit_table(d, manifest, data_files, deletes)
        except CycleOverlap as e:  # another cycle committed these offsets first (the next cycle swaps it): ours are not needed
            log.warning("cycle not committed: another cycle holds its offsets", extra={"topic": info.name, "cycle": cycle.cycle_id, "reason": str(e)})
            await asyncio.to_thread(_delete_files, d.table.io, [f.path for f in written])
            return TopicCycle(info.name, identifier)
        self._keep_table(info, identifier, table)
        self._fault("committed")
        self._check_lead()
        outcome = await swap(self.metadata, manifest, self._fence)
        self._recovered.add(identifier)
        self._fault("swapped")
        if deletes is not None:
            await self._merge_compacted(info, identifier, [p.partition for p in manifest.partitions])
            self._fault("entries-merged")
        for part in manifest.partitions:
            if part.partition in outcome.swapped or part.partition in outcome.already:
                self._checkpoints[(info.topic_id, part.partition)] = part.last_offset + 1

        cycle.snapshot_id = committed.snapshot_id
        cycle.offsets = manifest.offsets()
        cycle.files = len(written)
        cycle.rows = sum(f.record_count for f in written)
        cycle.bytes_read = sum(r.bytes_read for r in results)
        cycle.bytes_written = sum(f.file_size for f in written)
        for r in results:
            for name, n in r.outcomes.items():
                cycle.outcomes[name] = cycle.outcomes.get(name, 0) + n
        metrics.observe_cycle(cycle, time.monotonic() - d.started, [r.seconds for r in results])
        log.info(
            "cycle committed",
            extra={"topic": info.name, "table": identifier, "cycle": cycle.cycle_id, "snapshot": committed.snapshot_id, "rows": cycle.rows, "files": cycle.files, "partitions": len(manifest.partitions)},
        )
        return cycle

    async def _commit_table(self, d: _Due, manifest: CycleManifest, data_files: list, deletes: upsert.Deletes | None):
        """The cycle's one Iceberg commit. A compacted topic's (`deletes` computed) also deletes,
        in the same snapshot, the rows the cycle's records supersede (commits/upsert.py); computed again
        against the table as the commit finds it when another writer committed meanwhile (a
        cycle of another compactor, a rewrite of a file they named) (the offsets they remove stay those the manifest names: they follow from the
        keys, not from the files)."""
        if deletes is None:  # and no longer an upsert table, if it was one
            properties = {upsert.UPSERT: None} if upsert.UPSERT in d.table.properties else None
            return await asyncio.to_thread(commit_cycle_table, d.table, manifest, data_files, properties=properties)
        table = d.table
        for attempt in range(1, UPSERT_ATTEMPTS + 1):
            if attempt > 1:
                compute = upsert.cycle_deletes if upsert.UPSERT in table.properties else upsert.conversion_deletes
                deletes = await asyncio.to_thread(compute, table, data_files)
            delete_files = await asyncio.to_thread(upsert.write_deletes, table, d.context.data_location, deletes, f"{d.cycle.cycle_id}-{attempt}")
            self._fault("deletes-written")
            try:
                done = await asyncio.to_thread(commit_cycle_table, table, manifest, data_files, delete_files=delete_files, properties={upsert.UPSERT: "true"})
            except (DeletedFilesGone, TableChanged, CycleOverlap) as e:  # refused before committing: its delete files are nobody's
                await asyncio.to_thread(_delete_files, table.io, [f.file_path for f in delete_files])
                if isinstance(e, CycleOverlap) or attempt == UPSERT_ATTEMPTS:
                    raise
                log.info("the table changed since the upsert's deletes were computed; computed again", extra={"topic": d.info.name, "cycle": d.cycle.cycle_id, "reason": str(e)})
                table = await asyncio.to_thread(table.refresh)
                continue
            d.cycle.rows_superseded = sum(len(p) for _, p in deletes.superseded)
            d.cycle.tombstones = sum(len(p) for _, p in deletes.tombstones)
            d.cycle.delete_bytes = sum(f.file_size_in_bytes for f in delete_files)
            return done
        raise AssertionError("unreachable")

    async def _write_removals(self, info: TopicInfo, cycle_id: str, deletes: upsert.Deletes) -> dict[int, Removal]:
        """The removal object of a compacted topic's cycle (table/removals.py): the offsets its
        Kafka readers skip, superseded records at once, tombstones once the topic's
        delete.retention.ms has passed from now. Per partition, its rows there."""
        hidden_from = int(self._clock() * 1000) + upsert.delete_retention_ms(info.configs)
        removed = deletes.removed(hidden_from)
        if not removed:
            return {}
        data, rows = await asyncio.to_thread(removals.encode, removed)
        key = removal_key(info.topic_id, cycle_id)
        await self.objects.put(key, data)
        return {p: Removal(key, first, n) for p, (first, n) in rows.items()}

    async def _merge_compacted(self, info: TopicInfo, identifier: str, partitions: Iterable[int]) -> None:
        """A compacted topic's partitions' PARQUET entries merged into one each, so that its Kafka
        readers skip every record a cycle removed (commits/compacted_index.py). A failure leaves the
        entries as they are (readers then see records later ones superseded) until the next try."""
        try:
            await compacted_index.merge_entries(self.metadata, self.objects, self.maintenance.manifests, info, identifier, partitions, self._fence)
        except (MetadataError, ObjectStoreError) as e:
            log.warning("a compacted topic's index entries were not merged; merged at its next cycle", extra={"topic": info.name, "error": repr(e)})

    def _pending(self, info: TopicInfo) -> tuple:
        """The topic's WAL entries not in its table yet (their lag exported on the way), with the
        last stable offsets, aborted transactions and the parts of transactions read with them:
        no await between."""
        entries = self._wal_entries(info)
        self._export_lag(info, entries)
        stable, aborted, parts = self._transactions(info, entries)
        return entries, stable, aborted, parts

    async def _plan(self, info: TopicInfo, pending: tuple, ending: set[tuple[str, int]] | None) -> planner.Plan:
        """The cycle's tasks over the topic's pending WAL entries, but for the partitions of a
        transaction whose markers are being written (`ending`; None: every partition that has had
        a transaction), and then stopped where a transaction would be in the table in part
        (`planner.whole_transactions`)."""
        entries, stable, aborted, parts = pending
        starts = {(info.name, p): e[0].base_offset for p, e in entries.items() if e}
        if ending is None:
            views = self.metadata.topic_views(info.topic_id)
            entries = {p: e for p, e in entries.items() if not (p < len(views) and views[p] is not None and views[p].txn_starts is not None)}
        elif ending:
            topic = info.topic_id.hex
            entries = {p: e for p, e in entries.items() if (topic, p) not in ending}
        now_ms = int(self._clock() * 1000)
        freshness_ms = self.config.freshness_ms
        if upsert.is_compacted(info.configs):
            # a compacted topic's records younger than min.compaction.lag.ms wait in the WAL;
            # max.compaction.lag.ms below the freshness makes its records due sooner
            for p, offset in upsert.horizons(info.configs, entries, now_ms).items():
                stable = {**stable, (info.name, p): min(stable.get((info.name, p), offset), offset)}
            if (most := upsert.max_compaction_lag_ms(info.configs)) is not None:
                freshness_ms = min(freshness_ms, most)
        # pure CPU over every pending entry (thousands at 1,000 partitions): off the broker's loop
        return await asyncio.to_thread(self._whole_plan, {(info.name, p): e for p, e in entries.items()}, starts, now_ms, freshness_ms, stable, aborted, parts)

    def _whole_plan(self, entries: dict, starts: dict, now_ms: int, freshness_ms: int, stable: dict, aborted: dict, parts: dict) -> planner.Plan:
        """The plan, made again with its partitions stopped sooner while it would take a
        transaction on some of its partitions and not on others (each round only lowers where a
        partition stops, so few rounds do)."""
        while True:
            plan = planner.plan(entries, starts, now_ms=now_ms, freshness_ms=freshness_ms, due_bytes=self.config.due_bytes, parallelism=self.config.parallelism, stable=stable, aborted=aborted)
            if not parts:
                return plan
            ends = {tp: plan.offsets[tp][1] + 1 if tp in plan.offsets else start for tp, start in starts.items()}
            held = planner.whole_transactions(ends, parts)
            if not held:
                return plan
            stable = {**stable, **{tp: min(stable.get(tp, end), end) for tp, end in held.items()}}

    def _transactions(self, info: TopicInfo, entries: Mapping[int, list[IndexEntry]]) -> tuple[dict, dict, dict]:
        """Per partition with pending entries, its last stable offset where a transaction is open
        there (the table waits below it), the aborted transactions its entries meet, and the
        named transactions with pending records there (committed or open), as the planner takes
        them; the offsets open transactions hold back exported. A partition that never had a
        transaction costs a lookup or two."""
        views = self.metadata.topic_views(info.topic_id)
        stable: dict[planner.TopicPartition, int] = {}
        aborted: dict[planner.TopicPartition, list[planner.Aborted]] = {}
        parts: dict[planner.TopicPartition, list[planner.TxnPart]] = {}
        held: dict[int, int] = {}
        for p, wal in entries.items():
            view = views[p] if p < len(views) else None
            if view is None or not wal:
                continue
            lso = view.last_stable_offset
            last = wal[-1].last_offset
            if lso < view.next_offset:
                stable[(info.name, p)] = lso
                held[p] = view.next_offset - lso
                last = min(last, lso - 1)
            found = view.aborted_between(wal[0].base_offset, last) if last >= wal[0].base_offset else ()
            if found:
                aborted[(info.name, p)] = [(a.producer_id, a.first_offset, a.last_offset) for a in found]
            named = [(c.producer_id, c.generation, c.first_offset, c.last_offset) for c in view.committed_from(wal[0].base_offset) if c.generation >= 0]
            for pid, first in (view.txn_starts or {}).items():
                state = self.metadata.producer_state(info.topic_id, p, pid)
                if state is not None and state.txn_generation >= 0:
                    named.append((pid, state.txn_generation, first, None))
            if named:
                parts[(info.name, p)] = named
        self._export_held(info, held)
        return stable, aborted, parts

    def _export_held(self, info: TopicInfo, held: dict[int, int]) -> None:
        """The offsets of each partition an open transaction holds out of the table; a partition
        held before and no longer is exported as 0 (only partitions ever held are exported)."""
        before = self._held.get(info.name, set())
        for p in before - held.keys():
            metrics.set_held(info.name, p, 0)
        for p, n in held.items():
            metrics.set_held(info.name, p, n)
        if held:
            self._held[info.name] = before | held.keys()

    async def _expire_wal(self, info: TopicInfo) -> None:
        try:
            metrics.WAL_ENTRIES_EXPIRED.labels(info.name).inc(await wal_expiry.expire_topic(self.metadata, info))
        except MetadataError as e:
            log.warning("topic's expired WAL entries kept this cycle", extra={"topic": info.name, "reason": repr(e)})

    async def maintain_topic(self, info: TopicInfo, committed: bool = False, rounds: bool = True):
        """The table maintenance of `info`'s table (maintenance/rounds.py): merge and expiry when due
        (and `rounds`: otherwise they stay due), the index re-pointed at the files any rewrite
        made (`committed`: a cycle just committed, and the table it left is read no more). A table
        maintenance changed is read again by the next cycle."""
        catalog = await self._load_catalog()
        identifier = tables.table_identifier(self.config.namespace, info.name, info.configs)
        kept = self._tables.get(identifier) if committed else None
        table = kept[1] if kept is not None and kept[0] == _TableKey.of(info) else None
        outcome = await self.maintenance.maintain(catalog, info, identifier, committed, table=table, rounds=rounds)
        if any(dataclasses.astuple(outcome)):
            self._tables.pop(identifier, None)
        return outcome

    async def drop_deleted_tables(self) -> list[str]:
        """Drop the tables of topics deleted with `neve.iceberg.drop.on.delete` (maintenance/retention.py)."""
        self._check_lead()
        try:
            dropped = await self.drops.check(await self._load_catalog())
        except Exception:
            log.exception("dropping deleted topics' tables failed; retried next cycle")
            return []
        for identifier in dropped:
            self._recovered.discard(identifier)
            self.maintenance.forget(identifier)
        if dropped:
            self._fault("dropped")
        return dropped

    def _wal_entries(self, info: TopicInfo) -> dict[int, list[IndexEntry]]:
        """Each partition's WAL entries from its checkpoint on, in offset order, up to the first
        entry that is not WAL and at most MAX_ENTRIES_PER_PARTITION: what the table does not hold
        yet. The PARQUET entries before them move the checkpoint (read once after a start)."""
        out: dict[int, list[IndexEntry]] = {}
        for p in range(info.partitions):
            key = (info.topic_id, p)
            offset = self._checkpoints.get(key, 0)
            wal: list[IndexEntry] = []
            full = False
            while not full and (page := self.metadata.entries(info.topic_id, p, offset, max_entries=1024)):
                for e in page:
                    if e.object_type == ObjectType.WAL:
                        wal.append(e)
                        full = len(wal) >= MAX_ENTRIES_PER_PARTITION
                    elif not wal:
                        self._checkpoints[key] = e.last_offset + 1
                    else:
                        full = True  # only a rewrite by maintenance could put one after WAL entries
                    if full:
                        break
                offset = page[-1].last_offset + 1
            if wal:
                out[p] = wal
        return out

    def _export_lag(self, info: TopicInfo, entries: Mapping[int, list[IndexEntry]]) -> None:
        now_ms = int(self._clock() * 1000)
        for p in range(info.partitions):
            wal = entries.get(p, ())
            lag = (self.metadata.high_watermark(info.topic_id, p) - wal[0].base_offset) if wal else 0
            oldest = min((e.max_timestamp for e in wal), default=None)
            metrics.set_lag(info.name, p, lag, 0.0 if oldest is None else max(0.0, (now_ms - oldest) / 1000))

    def _drop_row_tasks(self, tasks: int) -> frozenset[int]:
        """The table-row-dropped plant (a deliberate bug, test only: config.fault_drop_row_every):
        of a cycle's `tasks`, the indexes of those that are every Nth task this compactor planned,
        whose writers leave their first row out."""
        every, first = self.config.fault_drop_row_every, self._tasks_planned
        self._tasks_planned += tasks
        return frozenset(i for i in range(tasks) if (first + i + 1) % every == 0)

    def _fault(self, point: str) -> None:
        """Test-only (config.fault_kill_after, fault_raise_at): kill this process, or raise once."""
        if self.config.fault_kill_after == point:
            log.warning("fault injection: killing this process", extra={"after": point})
            os.kill(os.getpid(), signal.SIGKILL)
        if point in self._faults_to_raise:
            self._faults_to_raise.discard(point)
            raise InjectedFault(point)

    # -- resources ------------------------------------------------------------------------------

    async def _load_catalog(self):
        if self._catalog is None:
            from ..catalog import load_catalog

            self._catalog = await asyncio.to_thread(load_catalog, self.config)
        return self._catalog

    async def _spark_session(self):
        if self._spark is None:
            from ..files.spark import spark_session

            self._spark = await asyncio.to_thread(spark_session, self.config)
            if gc.get_freeze_count():  # the process froze what it started with (neve/cli.py's tune_gc):
                # pyspark and py4j, imported for the session, are never garbage either; unfrozen,
                # the full collection each job ends with (job.run_tasks) traversed them (70 ms)
                gc.collect()
                gc.freeze()
        return self._spark

    async def _maintenance_spark(self):
        """The session maintenance runs Spark's procedures on: the tasks' (None in-process)."""
        return None if self.config.runner == "in-process" else await self._spark_session()

    async def close(self) -> None:
        if self._spark is not None and self._owns_spark:
            spark, self._spark = self._spark, None
            await asyncio.to_thread(spark.stop)


def _delete_files(io, paths: list[str]) -> None:
    for path in paths:
        try:
            io.delete(path)
        except OSError as e:
            log.warning("could not delete an uncommitted file", extra={"path": path, "error": repr(e)})


def _manifest(cycle_id: str, info: TopicInfo, identifier: str, plan: planner.Plan, written, removed: Mapping[int, Removal] | None = None) -> CycleManifest:
    """The cycle's manifest: per partition, the WAL entries its runs read (in offset order) and
    the row ranges of the files holding its rows."""
    replaced: dict[int, list[IndexEntry]] = {}
    for task in plan.tasks:
        for run in task.runs:
            replaced.setdefault(run.partition, []).extend(run.entries)
    slices: dict[int, list[FileSlice]] = {}
    for f in written:
        for p, span in f.offsets.items():
            slices.setdefault(p, []).append(FileSlice(f.path, span.first_row, span.rows, span.first, span.last))
    parts = []
    for p in sorted(replaced):
        ranges = tuple(WalRange(e.object_key, e.start, e.size, e.base_offset, e.last_offset, e.max_timestamp) for e in sorted(replaced[p], key=lambda e: e.base_offset))
        removal = (removed[p],) if removed and p in removed else ()
        parts.append(PartitionCompaction(p, ranges, tuple(sorted(slices.get(p, ()), key=lambda s: (s.first_offset, s.path))), removal))
    return CycleManifest(cycle_id, info.topic_id, info.name, identifier, tuple(parts))

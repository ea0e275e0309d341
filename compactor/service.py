"""The compaction service: the single owner of every topic's table, cycling plan → Spark tasks →
manifest → one Iceberg commit → index swap, topic by topic (`neve compactor`, and inside `neve dev`).

Each cycle of a topic: its table is loaded or created and evolved by the topic's registered value
schemas; the last cycle's index swap is finished if a crash cut it short (reindex.py); the WAL
entries older than the freshness setting are planned into tasks (planner.py); the job turns them
into Parquet files (job.py, on Spark or in this process); the cycle's manifest is written; the
committer appends the files in one snapshot naming the manifest (committer.py); the index swap
replaces the WAL entries by one PARQUET entry per partition. A crash anywhere is finished or redone
by the next cycle: files written but not committed are orphans (never in the table), a commit
without its swap is swapped, a swap is idempotent. After each topic's cycle its table is maintained
(maintenance.py: expired rows deleted, small files merged, old snapshots expired, the index
re-pointed at the files any rewrite made); a deleted topic's table is dropped when its topic asked
(retention.py). Blocking work (pyiceberg, Spark, Parquet) runs in threads, off the event loop.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from metadata.model import IndexEntry, ObjectType, TopicInfo
from metadata.store import MetadataError, MetadataStore
from wal.manifest import CycleManifest, FileSlice, PartitionCompaction, WalRange, new_cycle_id
from wal.store import ObjectStore

from . import metrics, planner, tables, wal_expiry
from .committer import CycleOverlap, commit_cycle
from .config import CompactorConfig
from .maintenance import TableMaintenance
from .reindex import finish_last_cycle, swap
from .retention import TopicDrops

log = logging.getLogger("neve.compactor")

MAX_ENTRIES_PER_PARTITION = 4096  # a cycle plans at most this many WAL entries of a partition


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
        self._recovered: set[str] = set()  # tables whose last cycle was checked since start
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
        """One cycle over every topic whose table is on. A topic that fails is logged and counted;
        the others still run. First, the tables of deleted topics that asked for it are dropped.
        A topic without a table has what retention hid let go (wal_expiry.py)."""
        done = []
        self.failed = []
        await self.drop_deleted_tables()
        for info in sorted(self.metadata.topics().values(), key=lambda t: t.name):
            if not tables.is_enabled(info.configs, self.config.tables_by_default):
                await self._expire_wal(info)
                continue
            try:
                done.append(await self.compact_topic(info))
                await self.maintain_topic(info, committed=done[-1].cycle_id is not None)
            except MetadataError as e:
                log.warning("topic skipped this cycle", extra={"topic": info.name, "reason": repr(e)})
            except Exception:
                metrics.CYCLE_FAILURES.inc()
                self.failed.append(info.name)
                log.exception("topic's compaction failed; it is retried next cycle", extra={"topic": info.name})
        return done

    # -- one topic ------------------------------------------------------------------------------

    async def compact_topic(self, info: TopicInfo) -> TopicCycle:
        from .job import TaskContext

        started = time.monotonic()
        catalog = await self._load_catalog()
        identifier = tables.table_identifier(self.config.namespace, info.name, info.configs)
        cycle = TopicCycle(info.name, identifier)
        table = None
        if identifier not in self._recovered:  # the table first: its last cycle may move index entries
            table = await asyncio.to_thread(tables.load_or_create, catalog, identifier, info.configs.get(tables.PARTITION_BY), info.topic_id, tables.live_topic_ids(self.metadata))
            await finish_last_cycle(self.metadata, self.objects, table)
            self._recovered.add(identifier)
        plan = await self._plan(info)
        if not plan.tasks:  # a topic with nothing due costs no catalog, table metadata or registry read
            return cycle
        if table is None:
            table = await asyncio.to_thread(tables.load_or_create, catalog, identifier, info.configs.get(tables.PARTITION_BY), info.topic_id, tables.live_topic_ids(self.metadata))
        versions = await self.schemas.subject_schemas(tables.value_subject(info.name))
        table, resolved = await asyncio.to_thread(tables.apply_schemas, table, versions)

        cycle.cycle_id = new_cycle_id()
        context = TaskContext.for_table(
            table,
            topic=info.name,
            cycle_id=cycle.cycle_id,
            objects_url=self.objects_url,
            schemas={sid: (r.text, r.raw_reason) for sid, r in resolved.items()},
            subject=tables.value_subject(info.name),
        )
        results = await self._run_tasks(context, plan.tasks)
        written = [f for r in results for f in r.files]
        self._fault("written")
        manifest = await asyncio.to_thread(_manifest, cycle.cycle_id, info, identifier, plan, written)
        data = await asyncio.to_thread(manifest.encode)
        await self.objects.put(manifest.key, data)
        spec = table.spec()
        data_files = [f.data_file(spec, table.format_version) for f in written]
        try:
            committed = await asyncio.to_thread(commit_cycle, table, manifest, data_files)
        except CycleOverlap as e:  # another compactor committed these offsets first: ours are not needed
            log.warning("cycle not committed: another compactor's cycle holds its offsets", extra={"topic": info.name, "cycle": cycle.cycle_id, "reason": str(e)})
            await asyncio.to_thread(_delete_files, table.io, [f.path for f in written])
            return TopicCycle(info.name, identifier)
        self._fault("committed")
        outcome = await swap(self.metadata, manifest)
        self._fault("swapped")
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
        metrics.observe_cycle(cycle, time.monotonic() - started, [r.seconds for r in results])
        log.info(
            "cycle committed",
            extra={"topic": info.name, "table": identifier, "cycle": cycle.cycle_id, "snapshot": committed.snapshot_id, "rows": cycle.rows, "files": cycle.files, "partitions": len(manifest.partitions)},
        )
        return cycle

    async def _plan(self, info: TopicInfo) -> planner.Plan:
        """The cycle's tasks over the topic's WAL entries (their lag exported on the way)."""
        entries = self._wal_entries(info)
        self._export_lag(info, entries)
        # pure CPU over every pending entry (thousands at 1,000 partitions): off the broker's loop
        return await asyncio.to_thread(
            planner.plan,
            {(info.name, p): e for p, e in entries.items()},
            {(info.name, p): e[0].base_offset for p, e in entries.items() if e},
            now_ms=int(self._clock() * 1000),
            freshness_ms=self.config.freshness_ms,
            due_bytes=self.config.due_bytes,
            parallelism=self.config.parallelism,
        )

    async def _expire_wal(self, info: TopicInfo) -> None:
        try:
            metrics.WAL_ENTRIES_EXPIRED.labels(info.name).inc(await wal_expiry.expire_topic(self.metadata, info))
        except MetadataError as e:
            log.warning("topic's expired WAL entries kept this cycle", extra={"topic": info.name, "reason": repr(e)})

    async def maintain_topic(self, info: TopicInfo, committed: bool = False):
        """The table maintenance of `info`'s table (maintenance.py): merge and expiry when due,
        the index re-pointed at the files any rewrite made (`committed`: a cycle just committed)."""
        catalog = await self._load_catalog()
        identifier = tables.table_identifier(self.config.namespace, info.name, info.configs)
        return await self.maintenance.maintain(catalog, info, identifier, committed)

    async def drop_deleted_tables(self) -> list[str]:
        """Drop the tables of topics deleted with `neve.iceberg.drop.on.delete` (retention.py)."""
        try:
            dropped = await self.drops.check(await self._load_catalog())
        except Exception:
            log.exception("dropping deleted topics' tables failed; retried next cycle")
            return []
        for identifier in dropped:
            self._recovered.discard(identifier)
            self.maintenance.forget(identifier)
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

    def _fault(self, point: str) -> None:
        if self.config.fault_kill_after == point:
            log.warning("fault injection: killing this process", extra={"after": point})
            os.kill(os.getpid(), signal.SIGKILL)

    # -- resources ------------------------------------------------------------------------------

    async def _load_catalog(self):
        if self._catalog is None:
            from .catalog import load_catalog

            self._catalog = await asyncio.to_thread(load_catalog, self.config)
        return self._catalog

    async def _run_tasks(self, context, tasks):
        from . import job

        if self.config.runner == "in-process":
            return await asyncio.to_thread(job.run_tasks_in_process, context, tasks, self.config.parallelism)
        return await asyncio.to_thread(job.run_tasks, await self._spark_session(), context, tasks)

    async def _spark_session(self):
        if self._spark is None:
            from .spark import spark_session

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


def _manifest(cycle_id: str, info: TopicInfo, identifier: str, plan: planner.Plan, written) -> CycleManifest:
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
        parts.append(PartitionCompaction(p, ranges, tuple(sorted(slices.get(p, ()), key=lambda s: (s.first_offset, s.path)))))
    return CycleManifest(cycle_id, info.topic_id, info.name, identifier, tuple(parts))

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

The service coordinates the parts of a cycle, each its own class: Planning (planning.py: the
pending entries, checkpoints and transactions), Commits (commit.py: manifest, commit, upsert, swap),
Recovery (recovery.py), Upkeep (upkeep.py: maintenance's schedule), Lag and Failures (lag.py,
failures.py: what is exported and reported), Resources (resources.py: catalog, Spark, kept
tables), Lead (lead.py) and the test-only Faults (faults.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from metadata.model import TopicInfo
from metadata.store import Fenced, MetadataStore
from wal.manifest import new_cycle_id
from wal.store import ObjectStore

from .. import metrics
from ..config import CompactorConfig
from ..maintenance.retention import TopicDrops
from ..maintenance.rounds import TableMaintenance
from . import tables
from .commit import Commits
from .cycle import Due, TopicCycle
from .failures import Failures
from .faults import Faults
from .lag import Lag
from .lead import Lead
from .planning import Planning
from .recovery import Recovery
from .resources import Resources
from .upkeep import Upkeep

log = logging.getLogger("neve.compactor")


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
        self.lead = Lead()
        # compactor.service.sharing.Sharing: the topics this compactor takes among the live compactors
        # sharing them (its `leadership` then its own membership); None: every topic
        self.sharing = None
        self._owned: dict = {}  # topic id -> TopicInfo: the topics the last run cycled
        self.faults = Faults(config)
        self.resources = Resources(config, spark=spark)
        self.lag = Lag(metadata, clock)
        self.failures = Failures()
        self.planning = Planning(config, metadata, self.lag, clock)
        self.maintenance = TableMaintenance(config, metadata, objects, spark=self.resources.maintenance_spark, fault=self.faults.at, clock=clock)
        self.drops = TopicDrops(metadata, config.namespace, lambda info: tables.table_identifier(config.namespace, info.name, info.configs))
        self.recovery = Recovery(config, metadata, objects, self.resources, self.lead, self.maintenance.manifests)
        self.commits = Commits(metadata, objects, self.resources, self.recovery, self.planning, self.lead, self.faults, clock)
        self.upkeep = Upkeep(config, metadata, self.maintenance, self.drops, self.resources, self.recovery, self.lead, self.faults)

    @property
    def leadership(self):
        """metadata.store.Leadership this service cycles under; None: it cycles regardless."""
        return self.lead.leadership

    @leadership.setter
    def leadership(self, leadership) -> None:
        self.lead.leadership = leadership

    @property
    def failed(self) -> list[str]:
        """The topics whose compaction failed in the last run_once."""
        return self.failures.failed

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
        self.failures.new_run()
        if self.lead.renew():  # a new lead: a compactor that led in between may have left a cycle unswapped
            self.recovery.clear()
        try:
            if self.sharing is not None and await self.sharing.refresh():
                self.recovery.clear()  # topics gained: their last owner may have left a cycle unswapped
            if self.sharing is None or self.sharing.drops_tables(self.drops):  # one compactor's work, not per topic
                await self.drop_deleted_tables()
            topics = []
            for info in sorted(self.metadata.topics().values(), key=lambda t: t.name):
                if self.sharing is not None and not self.sharing.owns(info.topic_id):
                    continue
                if not tables.is_enabled(info.configs, self.config.tables_by_default):
                    await self.upkeep.expire_wal(info)
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
        recovering = [info for info in topics if not self.recovery.done(self._identifier(info))]
        loaded = {}
        if recovering:
            for info, table in zip(recovering, await self._each(recovering, lambda info: self.recovery.recover(info, live)), strict=True):
                if table is not None:
                    loaded[info.topic_id] = table
        topics = [info for info in topics if self.recovery.done(self._identifier(info))]  # a failed recovery is that topic's failure
        reads, ending = await self.planning.read_pending(topics)
        prepared = await self._each(topics, lambda info: self._prepare(info, live, reads[info.topic_id], ending, loaded.get(info.topic_id)))
        due: list[Due] = []
        for outcome in prepared:
            if isinstance(outcome, Due):
                due.append(outcome)
            elif outcome is not None:
                done.append(outcome)
        if due:
            self.lead.check()
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
                    self.resources.forget(d.cycle.table)
                else:
                    d.results = results
            committed = await self._each([d for d in due if d.results is not None], self.commits.commit, key=lambda d: d.info)
            done.extend(c for c in committed if c is not None)
        failed = self.failures.now
        cycled = {c.topic for c in done if c.cycle_id is not None}
        # Merges and expiries due take at most a quarter of the time the cycle's compaction did (at
        # least one a cycle): the others wait for a later cycle, and no topic's freshness waits for
        # all of them. A merge's cost is mostly fixed (0.2-0.4 s a table at a thousand small
        # topics): one that waits merges more files for about the same.
        rounds_until = time.monotonic() + (time.monotonic() - started) / 4
        for info in topics:
            if info.name in failed:
                continue
            self.failures.topic_recovered(info)
            await self.upkeep.maintain(info, committed=info.name in cycled, rounds=time.monotonic() < rounds_until)

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
                self.recovery.forget(self._identifier(info))
                self.resources.forget(self._identifier(info))
                self.lag.forget(info)
        for topic_id, info in owned.items():
            if topic_id not in self._owned:
                self.recovery.forget(self._identifier(info))
        self._owned = owned

    def _identifier(self, info: TopicInfo) -> str | None:
        """The topic's table, None when its config names another namespace (its cycle fails)."""
        try:
            return tables.table_identifier(self.config.namespace, info.name, info.configs)
        except ValueError:
            return None

    def _topic_failed(self, info: TopicInfo, e: Exception) -> None:
        """A topic's cycle failed: retried next cycle, reported (Failures), its lag exported."""
        self.failures.topic_failed(info, e)
        with contextlib.suppress(Exception):  # its lag grows visibly while it fails, wherever the cycle stopped
            self.lag.export(info, self.planning.wal_entries(info))

    # -- one topic ------------------------------------------------------------------------------

    async def compact_topic(self, info: TopicInfo) -> TopicCycle:
        """One cycle of one topic alone, its failure raised (tests, the compaction bench)."""
        live = tables.live_topic_ids(self.metadata)
        table = await self.recovery.recover(info, live) if not self.recovery.done(self._identifier(info)) else None
        reads, ending = await self.planning.read_pending([info])
        prepared = await self._prepare(info, live, reads[info.topic_id], ending, table)
        if isinstance(prepared, TopicCycle):
            return prepared
        (results,) = await self._run_job([prepared])
        if isinstance(results, Exception):
            raise results
        prepared.results = results
        return await self.commits.commit(prepared)

    async def _prepare(self, info: TopicInfo, live: frozenset[str] | None, pending: tuple, ending: set[tuple[str, int]] | None, table=None) -> TopicCycle | Due:
        """A topic's part of a cycle before its tasks run: its due WAL entries planned (from what
        Planning.read_pending read), and when there are any, its table evolved by the topic's value
        schemas and the context its tasks need. A topic with nothing due costs no catalog, table
        metadata or registry read (its table loaded once, when this compactor takes it on)."""
        from ..files.job import TaskContext

        started = time.monotonic()
        identifier = tables.table_identifier(self.config.namespace, info.name, info.configs)
        plan = await self.planning.plan(info, pending, ending)
        if not plan.tasks:
            return TopicCycle(info.name, identifier)
        if table is None:
            table = await self.resources.table(info, identifier, live)
        versions = await self.schemas.subject_schemas(tables.value_subject(info.name))
        table, resolved = await asyncio.to_thread(tables.apply_schemas, table, versions)
        self.resources.keep(info, identifier, table)
        cycle = TopicCycle(info.name, identifier, new_cycle_id())
        context = TaskContext.for_table(
            table,
            topic=info.name,
            cycle_id=cycle.cycle_id,
            objects_url=self.objects_url,
            schemas={sid: (r.text, r.raw_reason) for sid, r in resolved.items()},
            subject=tables.value_subject(info.name),
            drop_row_tasks=self.faults.drop_row_tasks(len(plan.tasks)) if self.config.fault_drop_row_every else frozenset(),
        )
        return Due(info, cycle, table, context, plan, started)

    async def _run_job(self, due: list[Due]):
        """The tasks of every topic in `due` in one job: per topic its results, or the error that
        failed it. Raises when the job failed as a whole."""
        from ..files import job

        work = [(d.context, d.plan.tasks) for d in due]
        if self.config.runner == "in-process":
            return await asyncio.to_thread(job.run_cycle_in_process, work, self.config.parallelism)
        return await asyncio.to_thread(job.run_cycle, await self.resources.spark_session(), work, self.config.parallelism)

    # -- maintenance, the topic's and the deleted topics' (upkeep.py) ---------------------------

    async def maintain_topic(self, info: TopicInfo, committed: bool = False, rounds: bool = True):
        """The table maintenance of `info`'s table (Upkeep.maintain_topic)."""
        return await self.upkeep.maintain_topic(info, committed=committed, rounds=rounds)

    async def drop_deleted_tables(self) -> list[str]:
        """Drop the tables of topics deleted with `neve.iceberg.drop.on.delete` (maintenance/retention.py)."""
        return await self.upkeep.drop_deleted_tables()

    async def close(self) -> None:
        await self.resources.close()

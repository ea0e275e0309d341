"""A topic's part of a cycle after its tasks ran: the cycle's manifest, its one Iceberg commit
(commits/committer.py; a compacted topic's also deletes the rows its records supersede, computed
again when the table changed meanwhile: commits/upsert.py) and the index swap (commits/reindex.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from metadata.model import IndexEntry, TopicInfo
from metadata.store import MetadataStore
from table import removals
from wal.manifest import CycleManifest, FileSlice, PartitionCompaction, Removal, WalRange, removal_key
from wal.store import ObjectStore

from .. import metrics
from ..commits import upsert
from ..commits.committer import CycleOverlap, DeletedFilesGone, TableChanged, commit_cycle_table
from ..commits.reindex import swap
from ..files import planner
from .cycle import Due, TopicCycle
from .faults import Faults
from .lead import Lead
from .planning import Planning
from .recovery import Recovery
from .resources import Resources

log = logging.getLogger("neve.compactor")

# A compacted topic's commit computes its deletes again when a table rewrite (maintenance, another
# engine) removed a file they named, at most this many times in a cycle (the cycle then fails and
# is redone).
UPSERT_ATTEMPTS = 5


class Commits:
    def __init__(
        self,
        metadata: MetadataStore,
        objects: ObjectStore,
        resources: Resources,
        recovery: Recovery,
        planning: Planning,
        lead: Lead,
        faults: Faults,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metadata = metadata
        self.objects = objects
        self.resources = resources
        self.recovery = recovery
        self.planning = planning
        self.lead = lead
        self.faults = faults
        self._clock = clock

    async def commit(self, d: Due) -> TopicCycle:
        """A topic's part of a cycle after its tasks ran: the cycle's manifest, its one Iceberg
        commit (commits/committer.py) and the index swap (commits/reindex.py)."""
        info, cycle, identifier, results = d.info, d.cycle, d.cycle.table, d.results
        written = [f for r in results for f in r.files]
        self.faults.at("written")
        spec = d.table.spec()
        data_files = [f.data_file(spec, d.table.format_version) for f in written]
        deletes, removed = None, {}
        if upsert.is_compacted(info.configs):
            compute = upsert.cycle_deletes if upsert.UPSERT in d.table.properties else upsert.conversion_deletes
            deletes = await asyncio.to_thread(compute, d.table, data_files)
            removed = await self._write_removals(info, cycle.cycle_id, deletes)
            self.faults.at("removals-written")
        manifest = await asyncio.to_thread(_manifest, cycle.cycle_id, info, identifier, d.plan, written, removed)
        data = await asyncio.to_thread(manifest.encode)
        await self.objects.put(manifest.key, data)
        self.faults.at("manifest-written")
        self.lead.check()
        # Until this cycle is swapped, the next one finishes it first (a failure may come between).
        self.recovery.forget(identifier)
        self.resources.forget(identifier)  # kept again once committed: a failed commit re-reads it
        try:
            committed, table = await self._commit_table(d, manifest, data_files, deletes)
        except CycleOverlap as e:  # another cycle committed these offsets first (the next cycle swaps it): ours are not needed
            log.warning("cycle not committed: another cycle holds its offsets", extra={"topic": info.name, "cycle": cycle.cycle_id, "reason": str(e)})
            await asyncio.to_thread(_delete_files, d.table.io, [f.path for f in written])
            return TopicCycle(info.name, identifier)
        self.resources.keep(info, identifier, table)
        self.faults.at("committed")
        self.lead.check()
        outcome = await swap(self.metadata, manifest, self.lead.fence)
        self.recovery.mark(identifier)
        self.faults.at("swapped")
        if deletes is not None:
            await self.recovery.merge_compacted(info, identifier, [p.partition for p in manifest.partitions])
            self.faults.at("entries-merged")
        for part in manifest.partitions:
            if part.partition in outcome.swapped or part.partition in outcome.already:
                self.planning.advance(info, part.partition, part.last_offset + 1)

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

    async def _commit_table(self, d: Due, manifest: CycleManifest, data_files: list, deletes: upsert.Deletes | None):
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
            self.faults.at("deletes-written")
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

"""Table maintenance that keeps the Kafka view right: after every cycle of a topic, the
index is checked against the table's snapshots and re-indexed when a rewrite moved rows it names
(commits/rewrites.py); every `maintenance_interval_ms`, a table partition's small files are merged into
files of the target size sorted by kafka.partition, kafka.offset (on Spark, Iceberg's action behind
`rewrite_data_files`; in-process, pyarrow and pyiceberg's overwrite, as is a merge of fewer than
`merge_on_spark_min_bytes` with the Spark runner), then re-indexed,
and snapshots older than `snapshot_max_age_ms` are expired (and all but the newest
`snapshot_max_count`, once a table holds twice as many, checked after each commit), the data files only they held being
deleted once no index entry's manifest names them and `file_delete_grace_ms` has passed; files in
the data directory that nothing holds (a crashed cycle's or Spark job's), and the metadata
files of commits that never landed, are deleted once older than `orphan_file_age_ms`. Before
the merge, a topic with `neve.iceberg.retention.ms` has its expired rows deleted (retention.py).

A merge's crash between its table commit and the re-index is finished by the next check: the
index names files the current snapshot lacks, which still exist (only this module's expiry, after
the index stops naming them, deletes them). Expiry runs through pyiceberg, not Spark's
`expire_snapshots`, which deletes files without asking the index.

What an outside engine may do: rewrite files (rewrite_data_files, any compaction that keeps every
row): the index follows within a cycle. Expire snapshots: only with `older_than` well past a cycle
(the default of Spark's procedure is 5 days), or a Kafka read of the old files in between fails.
Delete rows: those offsets leave the Kafka view (commits/rewrites.py says what consumers see). Rows must
not be changed in place (an UPDATE rewrites the values Kafka serves) nor appended by others (rows
with kafka offsets the index does not cover are never served, and ones it covers would be doubled).
Synchronous pyiceberg and Spark work runs in threads, off the event loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from metadata.model import TopicInfo
from metadata.store import MetadataStore
from table.layout import KAFKA, OFFSET, PARTITION
from wal.store import ObjectStore

from .. import metrics
from ..commits import binding, upsert
from ..commits.committer import CYCLE
from ..commits.rewrites import OFFSET_COLUMN, PARTITION_COLUMN, ManifestCache, bounds, live_data_files, named_files, reindex
from ..config import CompactorConfig
from .retention import TableRetention

log = logging.getLogger("neve.compactor.maintenance")

MAINTENANCE = "neve.maintenance"  # summary property of neve's own merge snapshots ("merge")


@dataclass(slots=True)
class MaintenanceOutcome:
    files_rewritten: int = 0
    reindexed_partitions: int = 0
    snapshots_expired: int = 0
    files_deleted: int = 0
    rows_expired: int = 0
    orphans_deleted: int = 0


class TableMaintenance:
    """The maintenance of every topic's table, kept by the compaction service. `spark` gives the
    service's Spark session (started on first need), or None when the tasks run in-process;
    `fault` is the service's fault injection."""

    def __init__(
        self,
        config: CompactorConfig,
        metadata: MetadataStore,
        objects: ObjectStore,
        *,
        spark: Callable[[], Awaitable[object | None]],
        fault: Callable[[str], None] = lambda point: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.metadata = metadata
        self.manifests = ManifestCache(objects)
        self.objects = objects
        self._spark = spark
        self._fault = fault
        self._clock = clock
        self._verified: dict[str, int] = {}  # table -> the snapshot its topic's index was last found right for
        self._last_run: dict[str, float] = {}  # table -> when merge and expiry last ran
        self._started = clock()
        self._last_check: dict[str, float] = {}  # table -> when it was last read here
        self._pending: dict[str, dict[str, float]] = {}  # table -> files to delete -> since when they were unnamed
        self.retention = TableRetention(metadata, clock=clock)  # table retention and the drop-on-delete mark (retention.py)

    async def maintain(self, catalog, info: TopicInfo, identifier: str, committed: bool = False, table=None, rounds: bool = True) -> MaintenanceOutcome:
        """One round for `info`'s table: merge and expire when due, re-index when needed, delete
        the files whose grace has passed. Nothing, not even a read of the table, when none of that
        is due, the table was checked within `table_check_interval_ms` and the compactor has not
        `committed` to it since. `table`: the table as the compactor's commit just left it (current
        then: no read of the catalog needed), or None to load it. Not `rounds`: a merge and expiry
        due stay due, for a later call."""
        from pyiceberg.exceptions import NoSuchTableError

        outcome = MaintenanceOutcome()
        now = self._clock()
        interval = self.config.maintenance_interval_ms / 1000
        due = interval > 0 and now - self._last_run.setdefault(identifier, self._first_phase(identifier, now, interval)) >= interval and rounds
        keep = self.config.snapshot_max_count
        if not (due or committed) and now - self._last_check.get(identifier, -math.inf) < self.config.table_check_interval_ms / 1000:
            return outcome
        self._last_check[identifier] = now
        if table is None:
            try:
                table = await asyncio.to_thread(catalog.load_table, identifier)
            except NoSuchTableError:
                return outcome
        binding.require(table, info.topic_id, info.name)  # before the mark, retention, merge and re-index below
        table = await self.retention.mark(table, info)
        if due:
            self._last_run[identifier] = now
            # table retention first: its log starts move before its rows go, the re-index below follows
            outcome.rows_expired = (await self.retention.expire(table, info, {MAINTENANCE: "retention"})).rows_deleted
            if outcome.rows_expired:
                self._fault("overwrite")
            table = await asyncio.to_thread(table.refresh)
            outcome.files_rewritten = await self.merge(table, identifier, info)
            if outcome.files_rewritten:
                metrics.FILES_REWRITTEN.labels(info.name).inc(outcome.files_rewritten)
                self._fault("merged")
            table = await asyncio.to_thread(table.refresh)
        if await asyncio.to_thread(self._needs_reindex, table, identifier):
            # an outside snapshot: rows its delete files remove must leave the files Kafka reads too
            # (not a compacted topic's: its own cycles' deletes are most of them, and its readers
            # skip what those remove without a rewrite)
            compacted = upsert.is_compacted(info.configs)
            applied = 0 if compacted else await asyncio.to_thread(apply_deletes, table, self.config.merge_target_file_bytes)
            if applied:
                outcome.files_rewritten += applied
                metrics.FILES_REWRITTEN.labels(info.name).inc(applied)
                table = await asyncio.to_thread(table.refresh)
            done = await reindex(self.metadata, self.objects, self.manifests, table, info, identifier, now_ms=int(self._clock() * 1000))
            outcome.reindexed_partitions = len(done.partitions)
            metrics.PARTITIONS_REINDEXED.labels(info.name).inc(len(done.partitions))
            if not done.conflicts:
                self._verified[identifier] = done.snapshot_id
        if due or (keep > 0 and len(table.metadata.snapshots) > 2 * keep):
            expired, gone = await asyncio.to_thread(expire_snapshots, table, int((now - self.config.snapshot_max_age_ms / 1000) * 1000), keep)
            outcome.snapshots_expired = expired
            metrics.SNAPSHOTS_EXPIRED.labels(info.name).inc(expired)
            pending = self._pending.setdefault(identifier, {})
            for path in gone:
                pending.setdefault(path, now)
        outcome.files_deleted = await self._delete_due(table, info, identifier, now)
        if due and self.config.orphan_file_age_ms > 0:
            outcome.orphans_deleted = await self._delete_orphans(table, info, identifier, now)
            outcome.files_deleted += outcome.orphans_deleted
        metrics.FILES_DELETED.labels(info.name).inc(outcome.files_deleted)
        return outcome

    def _first_phase(self, identifier: str, now: float, interval: float) -> float:
        """When a table's first merge and expiry count as last run: a phase of its own within the
        interval from the compactor's start (its name's hash), so that a compactor of a thousand
        tables spreads their rounds over the interval instead of running them all in one cycle
        (a cycle's freshness waits for its maintenance)."""
        phase = int.from_bytes(hashlib.blake2b(identifier.encode(), digest_size=4).digest(), "big") / 2**32
        return min(now, self._started) - interval * (1 - phase)

    def forget(self, identifier: str) -> None:
        """Drop what is kept about a table that was dropped (a table made again under its name starts afresh)."""
        for kept in (self._verified, self._last_run, self._last_check, self._pending):
            kept.pop(identifier, None)

    def _needs_reindex(self, table, identifier: str) -> bool:
        """Whether the current snapshot may have moved rows the index names: unless every
        snapshot since the one last found right is a neve cycle (appends only)."""
        from pyiceberg.table.snapshots import ancestors_of

        current = table.current_snapshot()
        if current is None:
            return False
        verified = self._verified.get(identifier)
        for snapshot in ancestors_of(current, table.metadata):
            if snapshot.snapshot_id == verified:
                self._verified[identifier] = current.snapshot_id
                return False
            if CYCLE not in (snapshot.summary.additional_properties if snapshot.summary is not None else {}):
                return True
        return True  # not seen since this process started, or its history was expired

    # -- merge ------------------------------------------------------------------------------------

    async def merge(self, table, identifier: str, info: TopicInfo | None = None) -> int:
        """Merge the small files of `table`: how many files were rewritten (0: none due). A
        compacted topic's files holding tombstones its Kafka readers are still served wait
        (upsert.held_by_tombstones: the merge drops deleted rows), and are merged in this process
        (Spark's rewrite would not leave them out)."""
        target, min_files = self.config.merge_target_file_bytes, self.config.merge_min_files
        held: frozenset[str] = frozenset()
        compacted = info is not None and upsert.is_compacted(info.configs)
        if compacted:
            held = await asyncio.to_thread(upsert.held_by_tombstones, table, upsert.delete_retention_ms(info.configs), int(self._clock() * 1000))
        groups = await asyncio.to_thread(small_file_groups, table, target, min_files, held)
        if not groups:
            return 0
        spark = None if compacted else await self._spark()
        if spark is not None and sum(f.file_size_in_bytes for group in groups for f in group) < self.config.merge_on_spark_min_bytes:
            spark = None  # a Spark job would cost more than the whole rewrite (merge_on_spark_min_bytes)
        if spark is not None:
            from ..catalog import catalog_target
            from ..files.spark import register_catalog

            catalog = register_catalog(spark, catalog_target(self.config))
            # the table as pyiceberg resolved it (namespace levels, name), never re-parsed from text
            rewritten = await asyncio.to_thread(merge_on_spark, spark, catalog, table.name(), target, min_files)
        else:
            rewritten = await asyncio.to_thread(rewrite_groups, table, groups, target, "merge")
        if rewritten:
            log.info("merged a table's small files", extra={"table": identifier, "files": rewritten, "runner": "spark" if spark is not None else "in-process"})
        return rewritten

    # -- expiry -----------------------------------------------------------------------------------

    async def _delete_due(self, table, info: TopicInfo, identifier: str, now: float) -> int:
        """Delete the pending files whose grace has passed and that no index entry names (one the
        index still names starts its grace again)."""
        pending = self._pending.get(identifier)
        if not pending:
            return 0
        grace = self.config.file_delete_grace_ms / 1000
        if not any(now - since >= grace for since in pending.values()):
            return 0
        named = await named_files(self.metadata, self.manifests, info)
        due = []
        for path, since in list(pending.items()):
            if path in named:
                pending[path] = now
            elif now - since >= grace:
                due.append(path)
        deleted = await asyncio.to_thread(delete_files, table.io, due)
        for path in due:
            pending.pop(path, None)
        if deleted:
            log.info("deleted files no snapshot or index entry holds", extra={"table": identifier, "files": deleted})
        return deleted

    async def _delete_orphans(self, table, info: TopicInfo, identifier: str, now: float) -> int:
        """Delete the files of the table's data and metadata directories that are older than
        `orphan_file_age_ms` and that the table does not hold, no index entry names and no expiry
        has pending (those wait for their own grace)."""
        cutoff_ms = int((now - self.config.orphan_file_age_ms / 1000) * 1000)
        candidates = await asyncio.to_thread(unheld_table_files, table, cutoff_ms)
        if not candidates:
            return 0
        io = table.io
        kept = {io.parse_location(uri, io.properties)[2] for uri in (await named_files(self.metadata, self.manifests, info)) | set(self._pending.get(identifier, ()))}
        due = [uri for path, uri in candidates.items() if path not in kept]
        deleted = await asyncio.to_thread(delete_files, table.io, due)
        if deleted:
            log.info("deleted orphan files (in the table's data and metadata directories, held by nothing)", extra={"table": identifier, "files": deleted})
        return deleted


# -- the blocking parts (pyiceberg, pyarrow, Spark) --------------------------------------------------


# What a failed or abandoned commit leaves in a table's metadata directory: metadata JSON,
# manifest lists and manifests (Avro), statistics (Puffin). Anything else found there is not ours
# to judge, and stays.
METADATA_FILE_SUFFIXES = (".metadata.json", ".avro", ".puffin", ".stats")


def unheld_table_files(table, cutoff_ms: int) -> dict[str, str]:
    """The files under the table's data directory, and the Iceberg metadata files under its
    metadata directory (METADATA_FILE_SUFFIXES), last written before `cutoff_ms` that the table
    does not hold (after a refresh): no snapshot's manifest list, manifests or live files, not
    the current metadata file nor one in its log, no statistics file. Their paths as the file
    system lists them, each with its location for the table's FileIO. Empty when the FileIO
    cannot list (not pyarrow's)."""
    from pyarrow.fs import FileSelector, FileType

    io = table.io
    if not hasattr(io, "fs_by_scheme"):
        log.warning("orphan files are not looked for: the table's FileIO cannot list", extra={"table": str(table.name()), "io": type(io).__name__})
        return {}
    table = table.refresh()
    location = table.location().rstrip("/")
    data = table.metadata.properties.get("write.data.path") or f"{location}/data"
    metadata = table.metadata.properties.get("write.metadata.path") or f"{location}/metadata"
    cutoff = dt.datetime.fromtimestamp(cutoff_ms / 1000, dt.UTC)
    old: dict[str, str] = {}
    for directory, kinds in ((data, None), (metadata, METADATA_FILE_SUFFIXES)):
        scheme, netloc, root = io.parse_location(directory, io.properties)
        listed = io.fs_by_scheme(scheme, netloc).get_file_info(FileSelector(root, recursive=True, allow_not_found=True))
        for f in listed:
            if f.type == FileType.File and f.mtime is not None and f.mtime < cutoff and (kinds is None or f.path.endswith(kinds)):
                old[f.path] = f.path if scheme == "file" else f"{scheme}://{f.path}"
    if not old:
        return {}
    held = snapshot_files(table, table.snapshots(), {})
    held |= {table.metadata_location, *(entry.metadata_file for entry in table.metadata.metadata_log)}
    held |= {stats.statistics_path for stats in (*table.metadata.statistics, *table.metadata.partition_statistics)}
    held_paths = {io.parse_location(path, io.properties)[2] for path in held}
    return {path: old[path] for path in sorted(set(old) - held_paths)}


def small_file_groups(table, target: int, min_files: int, held: Collection[str] = ()) -> list[list]:
    """The current snapshot's data files smaller than 3/4 of `target` (Iceberg's own choice of
    files) but those `held`, by table partition of the current spec, in Kafka order (lowest
    partition, then offset), cut into groups of at most `target` bytes: the groups of at least
    `min_files` files."""
    schema = table.schema()
    pfield, ofield = schema.find_field(PARTITION_COLUMN), schema.find_field(OFFSET_COLUMN)
    spec_id = table.spec().spec_id
    by_partition: dict[tuple, list] = {}
    for f in live_data_files(table):
        if f.spec_id == spec_id and f.file_size_in_bytes < target * 3 // 4 and f.file_path not in held:
            by_partition.setdefault(tuple(f.partition), []).append(f)
    groups = []
    for _, files in sorted(by_partition.items(), key=lambda kv: repr(kv[0])):
        files.sort(key=lambda f: (bounds(f, pfield) or (0, 0), bounds(f, ofield) or (0, 0), f.file_path))
        group: list = []
        for f in files:
            if group and sum(g.file_size_in_bytes for g in group) + f.file_size_in_bytes > target:
                groups.append(group)
                group = []
            group.append(f)
        groups.append(group)
    return [g for g in groups if len(g) >= min_files]


def sorted_by_offset(rows):
    """`rows` (Arrow) ordered by kafka.partition, kafka.offset."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kafka = rows.column(KAFKA)
    keys = pa.table({"p": pc.struct_field(kafka, PARTITION), "o": pc.struct_field(kafka, OFFSET)})
    return rows.take(pc.sort_indices(keys, sort_keys=[("p", "ascending"), ("o", "ascending")]))


def files_with_deletes(table) -> list[list]:
    """The current snapshot's data files that delete files apply to (an engine's merge-on-read
    DELETE), by table partition."""
    by_partition: dict[tuple, list] = {}
    try:
        tasks = table.scan().plan_files()
    except ValueError as e:  # equality deletes, which pyiceberg cannot read yet
        log.warning("the table's delete files are not applied to the files Kafka reads", extra={"table": str(table.name()), "error": str(e)})
        return []
    for task in tasks:
        if task.delete_files:
            by_partition.setdefault((task.file.spec_id, repr(tuple(task.file.partition))), []).append(task.file)
    return [files for _, files in sorted(by_partition.items())]


def apply_deletes(table, target: int) -> int:
    """Rewrite the data files that delete files apply to without the rows those delete (how a
    copy-on-write DELETE would have left them), so that the files Kafka reads are served from
    hold no deleted row: how many data files were rewritten."""
    groups = files_with_deletes(table)
    if groups:
        log.info("rewriting the data files an engine's delete files apply to", extra={"table": str(table.name()), "files": sum(map(len, groups))})
    return rewrite_groups(table, groups, target, "apply-deletes")


def rewrite_groups(table, groups: list[list], target: int, why: str) -> int:
    """Rewrite each group of data files (one table partition's) into files of about `target`
    bytes, their live rows (delete files applied) sorted by Kafka partition and offset, in one
    overwrite snapshot marked `MAINTENANCE: why` (which fails, and deletes what it wrote, if the
    table changed meanwhile): how many files were rewritten."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files

    if not groups:
        return 0
    tasks = {t.file.file_path: t for t in table.scan().plan_files()}
    old, new = [], []
    for group in groups:
        if any(f.file_path not in tasks for f in group):  # a file the scan does not plan (all its rows deleted)
            continue
        rows = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table([tasks[f.file_path] for f in group])
        rows = sorted_by_offset(rows)
        # pyiceberg cuts files by Arrow bytes: scale the target by what Parquet made of these rows
        parquet_per_arrow = sum(f.file_size_in_bytes for f in group) / max(1, rows.nbytes)
        metadata = table.metadata.model_copy(update={"properties": {**table.metadata.properties, "write.target-file-size-bytes": str(max(1, int(target / max(parquet_per_arrow, 1e-6))))}})
        old += group
        new += list(_dataframe_to_data_files(metadata, rows, table.io))
    if not old:
        return 0
    try:
        with table.transaction() as txn, txn.update_snapshot(snapshot_properties={MAINTENANCE: why}).overwrite() as overwrite:
            for f in old:
                overwrite.delete_data_file(f)
            for f in new:
                overwrite.append_data_file(f)
    except CommitFailedException as e:
        log.warning("rewrite not committed: the table changed meanwhile; retried at the next round", extra={"table": str(table.name()), "rewrite": why, "error": repr(e)})
        delete_files(table.io, [f.file_path for f in new])
        return 0
    return len(old)


def merge_on_spark(spark, catalog: str, name: tuple[str, ...], target: int, min_files: int) -> int:
    """Iceberg's own rewrite of data files on Spark (the action behind its `rewrite_data_files`
    procedure), sorting by kafka.partition, kafka.offset: how many files it rewrote. The table is
    handed to the action as values (the Spark catalog's name, the namespace levels, the table's
    name: `name` as pyiceberg's `Table.name()` gives it), not as SQL text, which Spark would parse:
    a table named by a topic or by `neve.iceberg.table` may hold quotes, backticks, dots or
    semicolons, and its name then is a name, never another table (a text `neve.orders` is table
    `orders` of catalog `neve` when the catalog and the namespace share a name, as in `neve dev`)
    nor a statement."""
    jvm = spark._jvm
    iceberg = jvm.org.apache.iceberg
    # Spark's own SQL runs with its session active; a py4j thread has none, and without it the
    # action's reads of its file groups do not find the session's catalogs (CatalogNotFound)
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    *namespace, table_name = name
    levels = spark.sparkContext._gateway.new_array(jvm.java.lang.String, len(namespace))
    for i, level in enumerate(namespace):
        levels[i] = level
    identifier = iceberg.catalog.TableIdentifier.of(iceberg.catalog.Namespace.of(levels), table_name)
    table = iceberg.spark.Spark3Util.loadIcebergCatalog(spark._jsparkSession, catalog).loadTable(identifier)
    nulls_last = iceberg.NullOrder.NULLS_LAST
    order = iceberg.SortOrder.builderFor(table.schema()).asc(PARTITION_COLUMN, nulls_last).asc(OFFSET_COLUMN, nulls_last).build()
    action = iceberg.spark.actions.SparkActions.get(spark._jsparkSession).rewriteDataFiles(table).sort(order)
    result = action.option("target-file-size-bytes", str(target)).option("min-input-files", str(min_files)).execute()
    return int(result.rewrittenDataFilesCount())


def snapshot_files(table, snapshots, manifests_seen: dict[str, set[str]]) -> set[str]:
    """Every file `snapshots` hold: their manifest lists, manifests and live data and delete files
    (`manifests_seen` caches each manifest's files)."""
    files: set[str] = set()
    for snapshot in snapshots:
        files.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            held = manifests_seen.get(manifest.manifest_path)
            if held is None:
                held = manifests_seen[manifest.manifest_path] = {e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True)}
            files.add(manifest.manifest_path)
            files |= held
    return files


def expire_snapshots(table, cutoff_ms: int, keep: int = 0) -> tuple[int, set[str]]:
    """Expire the snapshots older than `cutoff_ms` and, when `keep`, all but the newest `keep`
    (never the current one, nor a branch or tag head): how many, and the files only they held
    (the caller deletes them when it may)."""
    heads = {ref.snapshot_id for ref in table.metadata.refs.values()}
    newest = sorted(table.snapshots(), key=lambda s: (s.timestamp_ms, s.sequence_number or 0), reverse=True)
    kept = {s.snapshot_id for s in newest[:keep]} if keep > 0 else None
    old = [s for s in newest if s.snapshot_id not in heads and (s.timestamp_ms < cutoff_ms or (kept is not None and s.snapshot_id not in kept))]
    if not old:
        return 0, set()
    table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in old]).commit()
    table = table.refresh()
    retained = table.snapshots()
    kept = {s.snapshot_id for s in retained}
    expired = [s for s in old if s.snapshot_id not in kept]
    if not expired:
        return 0, set()
    seen: dict[str, set[str]] = {}
    gone = snapshot_files(table, expired, seen) - snapshot_files(table, retained, seen)
    log.info("expired snapshots", extra={"table": str(table.name()), "snapshots": len(expired), "files": len(gone)})
    return len(expired), gone


def delete_files(io, paths) -> int:
    deleted = 0
    for path in paths:
        try:
            io.delete(path)
            deleted += 1
        except FileNotFoundError:
            deleted += 1
        except OSError as e:
            log.warning("could not delete a table file; it is left as an orphan", extra={"path": path, "error": repr(e)})
    return deleted

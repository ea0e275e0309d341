"""Table retention and topic deletion: the two topic configs that let the compactor
delete table rows, which nothing else in neve does.

`neve.iceberg.retention.ms` (default -1, keep forever): every maintenance round (rounds.py, at
`maintenance_interval_ms`) the rows of each Kafka partition are expired up to the first offset
whose timestamp is not older than now - retention: the partition's log start moves there first
(MetadataStore.advance_log_start, so no consumer is ever sent to offsets whose rows are going), then
one Iceberg overwrite snapshot drops the files holding only expired offsets and rewrites the files
holding some, and the re-index (commits/rewrites.py) points the index at what remains. As Kafka keeps a
segment holding any record newer than its retention, expiry stops at the first record that has
not expired: a record with an old timestamp after it stays, in the table and in the Kafka view
(the Kafka view then never has a gap). Only what the table holds is expired; records still in
the WAL wait for their cycle. The rows leave the table's current snapshot at once; their files
are deleted with the snapshots that still hold them (`snapshot_max_age_ms`, time travel).

`neve.iceberg.drop.on.delete` (default false): when the topic is deleted, its table is dropped
and its files purged (the catalog's purge_table). The compactor remembers the configs of the
topics it has seen and drops the table of one that disappears. For a topic deleted while no
compactor ran, it also marks each table whose topic asks for this with table properties
(`neve.drop-on-delete`, `neve.topic-id`): at its start a compactor drops every table of its
namespace so marked whose topic id no longer exists. A table is purged only when it is bound to
the deleted topic's id (commits/binding.py): never another topic's table under the name, nor one set aside.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from metadata.model import IndexEntry, ObjectType, TopicInfo
from metadata.store import MetadataError, MetadataStore
from table.layout import KAFKA, OFFSET, PARTITION, TIMESTAMP

from .. import metrics
from ..commits import binding
from ..commits.rewrites import OFFSET_COLUMN, PARTITION_COLUMN, bounds

log = logging.getLogger("neve.compactor.retention")

# Topic configs (declared, with their documentation, in broker/topic_configs.py, which the
# compactor may not import).
RETENTION_MS = "neve.iceberg.retention.ms"
DROP_ON_DELETE = "neve.iceberg.drop.on.delete"
# Table properties marking a table to drop once its topic is gone (read at a compactor's start).
DROP_PROPERTY = "neve.drop-on-delete"
TOPIC_PROPERTY = binding.TOPIC_PROPERTY
TIMESTAMP_COLUMN = f"{KAFKA}.{TIMESTAMP}"
PAGE = 4096


def retention_ms(configs: Mapping[str, str]) -> int:
    """The topic's table retention in ms, -1 for none (also for a value stored unvalidated)."""
    try:
        value = int(configs.get(RETENTION_MS, "-1"))
    except ValueError:
        return -1
    return value if value >= 0 else -1


def drops_on_delete(configs: Mapping[str, str]) -> bool:
    return configs.get(DROP_ON_DELETE, "false").strip().lower() == "true"


@dataclass(slots=True)
class RetentionOutcome:
    log_starts: dict[int, int] = field(default_factory=dict)  # partition -> log start moved to
    rows_deleted: int = 0
    files_dropped: int = 0
    files_rewritten: int = 0
    conflict: bool = False  # the delete's commit failed (the table changed meanwhile)


# -- where each partition's kept rows start ----------------------------------------------------------


def table_entries(store: MetadataStore, info: TopicInfo, partition: int, offset: int) -> list[IndexEntry]:
    """The partition's PARQUET entries from the one holding `offset` on, up to its first WAL entry
    (what follows is not in the table yet)."""
    out: list[IndexEntry] = []
    while page := store.entries(info.topic_id, partition, offset, max_entries=PAGE):
        for e in page:
            if e.object_type != ObjectType.PARQUET:
                return out
            out.append(e)
        offset = page[-1].last_offset + 1
    return out


def _range_filter(partition: int, first: int, last: int):
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThanOrEqual

    return And(EqualTo(PARTITION_COLUMN, partition), And(GreaterThanOrEqual(OFFSET_COLUMN, first), LessThanOrEqual(OFFSET_COLUMN, last)))


def first_unexpired(table, ranges: Mapping[int, tuple[int, int]], cutoff_ms: int) -> dict[int, int]:
    """Per Kafka partition, the lowest offset within its (first, last) range whose row's timestamp
    is at least `cutoff_ms`; a partition with no such row is left out. One scan (its files pruned
    by their statistics), the kafka struct alone read."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyiceberg.expressions import And, GreaterThanOrEqual, Or

    if not ranges:
        return {}
    wanted = functools.reduce(Or, [_range_filter(p, first, last) for p, (first, last) in sorted(ranges.items())])
    row_filter = And(GreaterThanOrEqual(TIMESTAMP_COLUMN, cutoff_ms * 1000), wanted)
    kafka = table.scan(row_filter=row_filter, selected_fields=(KAFKA,)).to_arrow().column(KAFKA)
    if len(kafka) == 0:
        return {}
    found = pa.table({"p": pc.struct_field(kafka, PARTITION), "o": pc.struct_field(kafka, OFFSET)}).group_by("p").aggregate([("o", "min")])
    return dict(zip(found.column("p").to_pylist(), found.column("o_min").to_pylist(), strict=True))


# -- deleting the rows before them -----------------------------------------------------------------


def delete_before(table, starts: Mapping[int, int], snapshot_properties: Mapping[str, str]) -> RetentionOutcome:
    """Delete every row of Kafka partition p with an offset below starts[p], in one overwrite
    snapshot: a file whose statistics show only such rows is dropped whole (unread); one that may
    hold some is read, and rewritten without them. Nothing is committed when nothing matched; a
    commit that fails (the table changed meanwhile) deletes what it wrote and is retried by the
    next round."""
    import numpy as np
    import pyarrow.compute as pc
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files

    outcome = RetentionOutcome()
    if not starts or max(starts.values()) <= 0:
        return outcome
    schema = table.schema()
    pfield, ofield = schema.find_field(PARTITION_COLUMN), schema.find_field(OFFSET_COLUMN)
    limit = np.zeros(max(starts) + 1, dtype=np.int64)
    for p, start in starts.items():
        limit[p] = start

    def start_of(p: int) -> int:
        return int(limit[p]) if 0 <= p < len(limit) else 0

    dropped, replaced, added = [], [], []
    for task in table.scan().plan_files():
        f = task.file
        pb, ob = bounds(f, pfield), bounds(f, ofield)
        if pb is not None and ob is not None:
            held = [start_of(p) for p in range(pb[0], pb[1] + 1)]
            if ob[1] < min(held):
                dropped.append(f)
                outcome.rows_deleted += f.record_count
                continue
            if ob[0] >= max(held):
                continue
        rows = ArrowScan(table.metadata, table.io, schema, AlwaysTrue()).to_table([task])
        kafka = rows.column(KAFKA)
        partitions = pc.struct_field(kafka, PARTITION).to_numpy(zero_copy_only=False)
        offsets = pc.struct_field(kafka, OFFSET).to_numpy(zero_copy_only=False)
        inside = partitions < len(limit)
        keep = ~inside | (offsets >= limit[np.where(inside, partitions, 0)])
        if keep.all():
            continue
        outcome.rows_deleted += int((~keep).sum())
        if not keep.any():
            dropped.append(f)
            continue
        replaced.append(f)
        added += list(_dataframe_to_data_files(table.metadata, rows.filter(keep), table.io))
    if not dropped and not replaced:
        return RetentionOutcome()
    try:
        with table.transaction() as txn, txn.update_snapshot(snapshot_properties=dict(snapshot_properties)).overwrite() as overwrite:
            for f in dropped + replaced:
                overwrite.delete_data_file(f)
            for f in added:
                overwrite.append_data_file(f)
    except CommitFailedException as e:
        log.warning("expired rows not deleted: the table changed meanwhile; retried at the next round", extra={"table": str(table.name()), "error": repr(e)})
        for f in added:
            try:
                table.io.delete(f.file_path)
            except OSError:
                pass
        return RetentionOutcome(conflict=True)
    outcome.files_dropped, outcome.files_rewritten = len(dropped), len(replaced)
    return outcome


class TableRetention:
    """Expires the rows of topics with `neve.iceberg.retention.ms` set, and keeps each table's
    drop-on-delete mark in step with its topic's config (held by the table maintenance)."""

    def __init__(self, metadata: MetadataStore, *, clock: Callable[[], float] = time.time) -> None:
        self.metadata = metadata
        self._clock = clock
        self._expired: dict[tuple[uuid.UUID, int], int] = {}  # (topic id, partition) -> offset rows were expired up to

    async def expire(self, table, info: TopicInfo, snapshot_properties: Mapping[str, str]) -> RetentionOutcome:
        """One round for `info`'s table: nothing unless its topic sets a table retention."""
        keep_ms = retention_ms(info.configs)
        if keep_ms < 0:
            return RetentionOutcome()
        binding.require(table, info.topic_id, info.name)  # rows are deleted by (partition, offset) alone
        cutoff = int(self._clock() * 1000) - keep_ms
        starts = await self._starts(table, info, cutoff)
        starts = {p: s for p, s in starts.items() if s > self._expired.get((info.topic_id, p), 0)}
        if not starts:
            return RetentionOutcome()
        moved: dict[int, int] = {}
        for p, start in sorted(starts.items()):  # the Kafka view first: no consumer is sent to rows about to go
            try:
                moved[p] = await self.metadata.advance_log_start(info.topic_id, p, start)
            except MetadataError as e:  # the topic deleted meanwhile, say: its rows are left for now
                log.warning("table retention could not move a log start; its rows are kept", extra={"topic": info.name, "partition": p, "error": repr(e)})
        starts = {p: s for p, s in starts.items() if p in moved}
        outcome = await asyncio.to_thread(delete_before, table, starts, snapshot_properties)
        outcome.log_starts = moved
        if not outcome.conflict:
            for p, start in starts.items():
                self._expired[(info.topic_id, p)] = start
        if outcome.files_dropped or outcome.files_rewritten:
            metrics.ROWS_EXPIRED.labels(info.name).inc(outcome.rows_deleted)
            metrics.RETENTION_FILES.labels(info.name, "dropped").inc(outcome.files_dropped)
            metrics.RETENTION_FILES.labels(info.name, "rewritten").inc(outcome.files_rewritten)
            log.info(
                "expired table rows older than the topic's table retention",
                extra={"topic": info.name, "table": str(table.name()), "rows": outcome.rows_deleted, "files_dropped": outcome.files_dropped, "files_rewritten": outcome.files_rewritten, "log_starts": moved},
            )
        return outcome

    async def _starts(self, table, info: TopicInfo, cutoff_ms: int) -> dict[int, int]:
        """Per partition, the first offset the table keeps: past the entries whose newest record
        is older than the cutoff, at the first row of the entries after them that is not."""
        candidates: dict[int, list[IndexEntry]] = {}
        starts: dict[int, int] = {}
        for p in range(info.partitions):
            entries = table_entries(self.metadata, info, p, self._expired.get((info.topic_id, p), 0))
            i = 0
            while i < len(entries) and entries[i].max_timestamp < cutoff_ms:
                i += 1
            if i:
                starts[p] = entries[i - 1].last_offset + 1
            candidates[p] = entries[i:]
        while pending := {p: (e[0].base_offset, e[0].last_offset) for p, e in candidates.items() if e}:
            found = await asyncio.to_thread(first_unexpired, table, pending, cutoff_ms)
            for p in pending:
                if p in found:
                    starts[p] = found[p]
                    candidates[p] = []
                else:  # every row of that entry expired (or is gone): on to the next
                    starts[p] = candidates[p][0].last_offset + 1
                    candidates[p] = candidates[p][1:]
        return starts

    async def mark(self, table, info: TopicInfo):
        """Keep `table`'s drop-on-delete mark as its topic's config says (a write only on change):
        the table, refreshed when it was written."""
        props = table.properties
        if drops_on_delete(info.configs):
            want = {DROP_PROPERTY: "true", TOPIC_PROPERTY: str(info.topic_id)}
            if all(props.get(k) == v for k, v in want.items()):
                return table
        elif props.get(DROP_PROPERTY) == "true":
            want = {DROP_PROPERTY: "false"}
        else:
            return table
        await asyncio.to_thread(_set_properties, table, want)
        return await asyncio.to_thread(table.refresh)


def _set_properties(table, properties: Mapping[str, str]) -> None:
    """Set table properties; a commit another writer beat is left to the next round."""
    from pyiceberg.exceptions import CommitFailedException

    try:
        with table.transaction() as txn:
            txn.set_properties(dict(properties))
    except CommitFailedException as e:
        log.warning("drop-on-delete mark not written: the table changed meanwhile; retried next round", extra={"table": str(table.name()), "error": repr(e)})


# -- topic deletion ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SeenTopic:
    name: str
    identifier: str | None  # None: its table config names no table of this compactor's
    drop: bool


class TopicDrops:
    """Drops the tables of deleted topics that asked for it (held by the compaction service).
    `identifier_of(info)` names a topic's table."""

    def __init__(self, metadata: MetadataStore, namespace: str, identifier_of: Callable[[TopicInfo], str]) -> None:
        self.metadata = metadata
        self.namespace = namespace
        self._identifier_of = identifier_of
        self._seen: dict[uuid.UUID, SeenTopic] = {}
        self._started = False

    def restart(self) -> None:
        """Forget the topics seen: the next check is a start's (every marked table of the namespace
        whose topic is gone), for a compactor taking this work back after another did it."""
        self._seen.clear()
        self._started = False

    async def check(self, catalog) -> list[str]:
        """Drop the tables of the topics gone since the last check (at the first, of every marked
        table of the namespace whose topic is gone): the tables dropped. Nothing while the metadata
        view may be stale (a topic missing from it need not be deleted)."""
        if not self.metadata.is_current():
            return []
        topics = {info.topic_id: info for info in self.metadata.topics().values()}
        dropped: list[str] = []
        if not self._started:
            for identifier, name, owner in await asyncio.to_thread(marked_orphans, catalog, self.namespace, {str(t) for t in topics}):
                if await asyncio.to_thread(purge, catalog, identifier, owner):
                    dropped.append(identifier)
                    _dropped(name, identifier, "a marked table whose topic was deleted while no compactor ran")
            self._started = True
        for topic_id, seen in list(self._seen.items()):
            if topic_id in topics:
                continue
            if seen.drop and seen.identifier is not None and seen.identifier not in dropped and await asyncio.to_thread(purge, catalog, seen.identifier, topic_id):
                dropped.append(seen.identifier)
                _dropped(seen.name, seen.identifier, "its topic was deleted")
            del self._seen[topic_id]  # only once dropped: a purge that failed is tried again
        for topic_id, info in topics.items():
            self._seen[topic_id] = SeenTopic(info.name, self._identifier(info), drops_on_delete(info.configs))
        return dropped

    def _identifier(self, info: TopicInfo) -> str | None:
        try:
            return self._identifier_of(info)
        except ValueError:  # a table config this compactor refuses (its compaction says why)
            return None


def _dropped(topic: str, identifier: str, why: str) -> None:
    metrics.TABLES_DROPPED.labels(topic).inc()
    log.info("dropped a deleted topic's table and purged its files", extra={"topic": topic, "table": identifier, "reason": why})


def marked_orphans(catalog, namespace: str, topic_ids: set[str]) -> list[tuple[str, str]]:
    """(identifier, table name, topic id) of the tables of `namespace` marked to drop whose topic
    id is not in `topic_ids`."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        listed = catalog.list_tables(namespace)
    except NoSuchNamespaceError:
        return []
    out = []
    for ident in listed:
        identifier = ".".join(ident)
        try:
            props = catalog.load_table(identifier).properties
        except NoSuchTableError:
            continue
        if props.get(DROP_PROPERTY) == "true" and props.get(TOPIC_PROPERTY) not in topic_ids:
            out.append((identifier, ident[-1], props.get(TOPIC_PROPERTY, "")))
    return out


def purge(catalog, identifier: str, topic_id: uuid.UUID | str) -> bool:
    """Drop the table of deleted topic `topic_id` and delete its files (the catalog's purge: a SQL
    catalog deletes every file the table's snapshots and metadata name; a REST catalog is asked to
    purge). False when there was no such table, or it is not bound to that topic (another topic's
    table under the name, or one set aside: never purged for this one)."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table = catalog.load_table(identifier)
        if binding.bound_topic(table) != str(topic_id):
            log.warning("a deleted topic's table is not dropped: the table under its name is not bound to it", extra={"table": identifier, "topic_id": str(topic_id), "bound_to": binding.bound_topic(table)})
            return False
        catalog.purge_table(identifier)
    except NoSuchTableError:
        return False
    return True

"""The one committer: a cycle's Parquet files become one Iceberg snapshot (a fast append through
pyiceberg) whose summary names the cycle, its manifest and the Kafka offsets it covers.

Exactly once (seed 002): before every attempt the committer reads the table back, and a cycle the
table already holds is not appended again, so an attempt whose answer was lost (a timeout, a
crash, CommitStateUnknown) is never doubled; nor is a cycle whose offsets another cycle already
holds (two compactors planning the same entries, or a deposed one committing late: the second to
commit finds the first's offsets in the refreshed table and appends nothing). What the table holds
is kept in its properties, written in the same transaction as the append and so never apart from
it: per topic id and partition the last offset committed and the manifest of the cycle that
committed it (`neve.committed.<topic id>`), and the last cycle (`neve.last-cycle`). Snapshot
expiry does not touch them, as it does the summaries; the summaries are still read for the cycles
of tables made before the properties were. The properties are also how a compactor finds cycles
whose index swap may not have happened (`last_cycle`, `unswapped`).

Synchronous (pyiceberg is): the service runs it off the event loop.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from wal.manifest import CycleManifest

from . import binding

log = logging.getLogger("neve.compactor.committer")

CYCLE = "neve.cycle"
MANIFEST = "neve.manifest"
TOPIC_ID = "neve.topic-id"
OFFSETS = "neve.offsets"  # {"<partition>": [first, last], ...}: the Kafka offsets this snapshot added
COMMITTED = "neve.committed."  # + topic id: {"<partition>": [last offset, manifest key], ...}, a table property
LAST_CYCLE = "neve.last-cycle"  # {"cycle": id, "manifest": key, "topic-id": id}, a table property


class CycleOverlap(Exception):
    """Another cycle in the table already holds some of this cycle's offsets (a second compactor
    got there first): appending would duplicate rows, so nothing is appended."""


class DeletedFilesGone(Exception):
    """Data files the cycle's position deletes name are no longer live in the table: another
    writer (maintenance's rewrite of small files, retention) removed or rewrote them since the
    cycle read the table, so the deletes would miss the rows now in the files that replaced them
    and a key would keep two rows. Nothing is committed: the caller computes its deletes again
    from the table as it is now."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = tuple(sorted(paths))
        shown = ", ".join(self.paths[:5]) + (f" and {len(self.paths) - 5} more" if len(self.paths) > 5 else "")
        super().__init__(f"{len(self.paths)} data file(s) the position deletes name are not in the table any more: {shown}")


class TableChanged(Exception):
    """The table's current snapshot is no longer the one the cycle's position deletes were
    computed against: another writer committed meanwhile (another compactor's cycle, the other
    owner in a sharing handover, `neve compactor --once`, a rewrite). Its rows may hold keys the
    cycle also wrote, which the deletes do not name, and a key would keep two live rows. Nothing is
    committed: the caller computes its deletes again from the table as it is now."""

    def __init__(self, computed_on: int | None, current: int | None) -> None:
        self.computed_on, self.current = computed_on, current
        super().__init__(f"the deletes were computed on snapshot {computed_on}; the table is at {current}")


@dataclass(frozen=True, slots=True)
class CommittedCycle:
    cycle_id: str
    manifest_key: str
    snapshot_id: int | None  # None (and no offsets): its snapshot expired, the table's properties know the cycle
    offsets: dict[int, tuple[int, int]]
    topic_id: str = ""


def summary_properties(manifest: CycleManifest) -> dict[str, str]:
    offsets = {str(p): [first, last] for p, (first, last) in sorted(manifest.offsets().items())}
    return {
        CYCLE: manifest.cycle_id,
        MANIFEST: manifest.key,
        TOPIC_ID: str(manifest.topic_id),
        OFFSETS: json.dumps(offsets, separators=(",", ":")),
    }


def _cycles(table) -> Iterable[CommittedCycle]:
    """The neve cycles in the current snapshot's ancestry, newest first (snapshots another engine
    made, a maintenance rewrite say, carry no cycle and are passed over)."""
    from pyiceberg.table.snapshots import ancestors_of

    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        props = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        if CYCLE in props:
            offsets = {int(p): (r[0], r[1]) for p, r in json.loads(props.get(OFFSETS, "{}")).items()}
            yield CommittedCycle(props[CYCLE], props.get(MANIFEST, ""), snapshot.snapshot_id, offsets, props.get(TOPIC_ID, ""))


def committed_offsets(table, topic_id: str) -> dict[int, tuple[int, str]]:
    """Per partition of topic `topic_id`, the last offset a cycle committed to the table and that
    cycle's manifest key (the table's property; empty for a table made before it was kept)."""
    raw = table.metadata.properties.get(COMMITTED + topic_id)
    return {int(p): (last, key) for p, (last, key) in json.loads(raw).items()} if raw else {}


def _last_cycle_property(table) -> dict | None:
    raw = table.metadata.properties.get(LAST_CYCLE)
    return json.loads(raw) if raw else None


def commit_properties(table, manifest: CycleManifest) -> dict[str, str]:
    """The table properties the cycle's append sets: its offsets added to the topic's committed
    offsets, and the cycle as the last one."""
    topic_id = str(manifest.topic_id)
    committed = committed_offsets(table, topic_id)
    for p, (_first, last) in manifest.offsets().items():
        committed[p] = (last, manifest.key)
    return {
        COMMITTED + topic_id: json.dumps({str(p): [last, key] for p, (last, key) in sorted(committed.items())}, separators=(",", ":")),
        LAST_CYCLE: json.dumps({"cycle": manifest.cycle_id, "manifest": manifest.key, "topic-id": topic_id}, separators=(",", ":")),
    }


def committed_cycle(table, cycle_id: str) -> CommittedCycle | None:
    """The cycle `cycle_id` if the table holds it: its snapshot in the current history, or (its
    snapshot expired) the table's last cycle."""
    if (found := next((c for c in _cycles(table) if c.cycle_id == cycle_id), None)) is not None:
        return found
    last = _last_cycle_property(table)
    if last is not None and last["cycle"] == cycle_id:
        return CommittedCycle(cycle_id, last["manifest"], None, {}, last["topic-id"])
    return None


def overlap(table, topic_id: str, offsets: dict[int, tuple[int, int]]) -> str | None:
    """Why `offsets` (partition -> first, last) of topic `topic_id` are already in the table, or
    None. Cycles commit each partition's offsets in order, so an offset at or below the last one
    committed is held. A topic deleted and made again under the same name is another topic id:
    its offsets start over in the same table."""
    committed = committed_offsets(table, topic_id)
    for p, (first, _last) in sorted(offsets.items()):
        if p in committed and first <= committed[p][0]:
            return f"partition {p} holds offsets up to {committed[p][0]} (manifest {committed[p][1]})"
    if (other := overlapping_cycle(table, topic_id, offsets)) is not None:
        return f"cycle {other.cycle_id} (snapshot {other.snapshot_id}) holds some of them"
    return None


def _may_hold(table, topic_id: str, offsets: dict[int, tuple[int, int]]) -> bool:
    """Whether the table may hold some of `offsets` (this cycle's, or another's): unless the
    committed offsets the table keeps in its properties, written with every cycle's append, cover
    each of their partitions below them. Only then is its snapshot history walked (`_cycles`, a
    step per snapshot the table keeps: a commit every few seconds keeps many)."""
    committed = committed_offsets(table, topic_id)
    return any(p not in committed or first <= committed[p][0] for p, (first, _last) in offsets.items())


def overlapping_cycle(table, topic_id: str, offsets: dict[int, tuple[int, int]]) -> CommittedCycle | None:
    """A cycle of topic `topic_id` in the table's snapshot history holding some of `offsets`
    (what tables made before the committed-offsets property tell)."""
    for cycle in _cycles(table):
        if cycle.topic_id != topic_id:
            continue
        for p, (first, last) in cycle.offsets.items():
            mine = offsets.get(p)
            if mine is not None and first <= mine[1] and mine[0] <= last:
                return cycle
    return None


def last_cycle(table) -> CommittedCycle | None:
    """The table's newest neve cycle (its snapshot_id None when only the properties still know it)."""
    last = _last_cycle_property(table)
    if last is None:
        return next(iter(_cycles(table)), None)
    return committed_cycle(table, last["cycle"])


NO_RETRIES = {"commit.retry.num-retries": "0"}


def _without_blind_retries(table):
    """`table` as this process sees it, with pyiceberg's own retry of a conflicted commit off.
    That retry re-applies an append to the refreshed table without the checks above, which would
    append a cycle whose offsets another compactor committed meanwhile; the committer retries
    itself, after the checks. Only the copy in memory changes (pyiceberg reads the setting from
    it; the catalog applies the commit's updates to its own current metadata): the table's
    stored properties keep their retries for every other writer (Spark's rewrites, say)."""
    from pyiceberg.table import Table

    if all(table.metadata.properties.get(k) == v for k, v in NO_RETRIES.items()):
        return table
    metadata = table.metadata.model_copy(update={"properties": {**table.metadata.properties, **NO_RETRIES}})
    return Table(table.name(), metadata, table.metadata_location, table.io, table.catalog)


def _with_stored_retries(table, stored):
    """`table` (a copy _without_blind_retries made) with the retry settings the table stores."""
    from pyiceberg.table import Table

    properties = {k: v for k, v in table.metadata.properties.items() if k not in NO_RETRIES}
    properties.update({k: stored[k] for k in NO_RETRIES if k in stored})
    return Table(table.name(), table.metadata.model_copy(update={"properties": properties}), table.metadata_location, table.io, table.catalog)


def _transaction(table):
    """A pyiceberg transaction on `table` whose staged metadata is computed once per change
    (`_staged_once`)."""
    return _staged_once()(table)


@functools.cache
def _staged_once():
    """pyiceberg's Transaction, but its `table_metadata` (the table's metadata with the staged
    updates applied) computed once per change instead of at every read: each read deep-copies the
    whole metadata, snapshots included, and an append reads it a dozen times, so a commit's CPU
    grew with the snapshots the table keeps (apache/iceberg-python #2673; the fix proposed there
    is not in 0.12). The metadata models are frozen: one copy shared between reads is safe."""
    from pyiceberg.table import Transaction
    from pyiceberg.table.update import update_table_metadata

    class StagedOnce(Transaction):
        _staged: tuple | None = None

        @property
        def table_metadata(self):
            staged = self._staged
            if staged is None or staged[0] is not self._table.metadata or staged[1] is not self._updates:
                staged = self._staged = (self._table.metadata, self._updates, update_table_metadata(self._table.metadata, self._updates))
            return staged[2]

    return StagedOnce


def commit_cycle(table, manifest: CycleManifest, data_files: Sequence, *, attempts: int = 10, delete_files: Sequence = ()) -> CommittedCycle:
    """Append `data_files` (pyiceberg DataFiles) in one snapshot recording `manifest`, unless the
    table already holds the cycle. Returns the snapshot that holds it. Another writer's commit in
    between (CommitFailedException) is retried on the refreshed table; an attempt whose outcome is
    unknown is read back before the next. Raises the last error after `attempts`.

    With `delete_files` (position-delete DataFiles, position_deletes.py) the same snapshot adds
    them too, as an "overwrite" (Java's RowDelta): the rows they name are gone from the table in
    the snapshot that adds their replacements. They must have been computed on `table` as it is:
    if another writer's snapshot is current at an attempt, TableChanged is raised, and if a data
    file they name is no longer live, DeletedFilesGone; either way nothing is committed."""
    return commit_cycle_table(table, manifest, data_files, attempts=attempts, delete_files=delete_files)[0]


def commit_cycle_table(table, manifest: CycleManifest, data_files: Sequence, *, attempts: int = 10, delete_files: Sequence = (), properties: Mapping[str, str | None] | None = None):
    """commit_cycle, with the table as the commit left it (the metadata the catalog answered with:
    the next cycle starts from it without reading the table again). `properties`: table
    properties set (removed where None) in the same commit."""
    from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

    if delete_files and table.metadata.format_version < 2:
        raise ValueError(f"table {table.name()} is format v{table.metadata.format_version}: position deletes need v2")
    named = _named_data_files(table.io, delete_files, data_files)
    computed_on = _snapshot_id(table)  # the snapshot the deletes were computed against

    props = summary_properties(manifest)
    error: Exception | None = None
    for attempt in range(attempts):
        if attempt:
            table = table.refresh()
        binding.require(table, manifest.topic_id, manifest.topic)
        stored = table.metadata.properties
        table = _without_blind_retries(table)
        if _may_hold(table, str(manifest.topic_id), manifest.offsets()):
            if (done := committed_cycle(table, manifest.cycle_id)) is not None:
                if attempt:
                    log.info("cycle found committed on re-reading the table", extra={"cycle": manifest.cycle_id, "snapshot": done.snapshot_id})
                return done, _with_stored_retries(table, stored)
            if (held := overlap(table, str(manifest.topic_id), manifest.offsets())) is not None:
                raise CycleOverlap(f"offsets of cycle {manifest.cycle_id} are in the table already: {held}")
        if named and (gone := _not_live(table, named)):
            raise DeletedFilesGone(gone)
        if delete_files and _snapshot_id(table) != computed_on:
            raise TableChanged(computed_on, _snapshot_id(table))
        try:
            with _transaction(table) as txn:
                txn.set_properties({**commit_properties(table, manifest), **{k: v for k, v in (properties or {}).items() if v is not None}})
                if gone := [k for k, v in (properties or {}).items() if v is None and k in table.metadata.properties]:
                    txn.remove_properties(*gone)
                if delete_files:
                    snapshot = _row_delta()(delete_files, transaction=txn, io=table.io, snapshot_properties=props)
                else:
                    snapshot = txn.update_snapshot(snapshot_properties=props).fast_append()
                with snapshot as append:
                    for data_file in data_files:
                        append.append_data_file(data_file)
        except (CommitFailedException, CommitStateUnknownException, OSError) as e:
            error = e
            log.warning("iceberg commit failed; reading the table back before retrying", extra={"cycle": manifest.cycle_id, "attempt": attempt + 1, "error": repr(e)})
            continue
        done = committed_cycle(table, manifest.cycle_id)
        if done is None:  # the transaction returned but its snapshot is not current: read it back
            continue
        return done, _with_stored_retries(table, stored)
    raise error if error is not None else RuntimeError(f"cycle {manifest.cycle_id} not found in the table after {attempts} commits")


def _snapshot_id(table) -> int | None:
    snapshot = table.current_snapshot()
    return snapshot.snapshot_id if snapshot is not None else None


def _named_data_files(io, delete_files: Sequence, data_files: Sequence) -> dict[int, dict[str, object]]:
    """The data files `delete_files` name, by spec id then path (with the partition the delete
    file is in, the named file's), less the data files added in the same commit."""
    from .position_deletes import referenced_paths

    added = {f.file_path for f in data_files}
    named: dict[int, dict[str, object]] = {}
    for delete_file in delete_files:
        for path in referenced_paths(io, delete_file) - added:
            named.setdefault(delete_file.spec_id, {})[path] = delete_file.partition
    return named


def _not_live(table, named: dict[int, dict[str, object]]) -> list[str]:
    """Of the data files `named` (_named_data_files), those the table's current snapshot does not
    hold. Only the data manifests that may hold their partitions are read (their partition
    summaries), and the reading stops once every file is found."""
    from pyiceberg.expressions import And, EqualTo, IsNull, Or
    from pyiceberg.expressions.visitors import manifest_evaluator
    from pyiceberg.manifest import ManifestContent

    missing = {path for paths in named.values() for path in paths}
    snapshot = table.current_snapshot()
    if snapshot is None:
        return sorted(missing)
    specs, schema = table.metadata.specs(), table.schema()
    may_hold = {}
    for spec_id, paths in named.items():
        spec = specs[spec_id]
        if not spec.fields:
            may_hold[spec_id] = lambda _manifest: True
            continue
        values = [[IsNull(f.name) if p[i] is None else EqualTo(f.name, p[i]) for i, f in enumerate(spec.fields)] for p in set(paths.values())]
        terms = [And(*v) if len(v) > 1 else v[0] for v in values]
        may_hold[spec_id] = manifest_evaluator(spec, schema, Or(*terms) if len(terms) > 1 else terms[0])
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA or manifest.partition_spec_id not in may_hold:
            continue
        if not (manifest.has_added_files() or manifest.has_existing_files()) or not may_hold[manifest.partition_spec_id](manifest):
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            missing.discard(entry.data_file.file_path)
        if not missing:
            break
    return sorted(missing)


@functools.cache
def _row_delta():
    """pyiceberg's fast append that also adds position-delete files, in a manifest of their own
    (Java's RowDelta): pyiceberg 0.12 reads position deletes but never writes them, its manifest
    writer writing data manifests only. So: the v2 manifest writer with its content DELETES, and
    the fast append writing one such manifest per partition spec of the delete files beside its
    data manifest, with the delete files counted in the snapshot's summary (added-delete-files,
    added-position-deletes and their totals, by pyiceberg's own summary collector). Recorded as
    an "overwrite", as Java records a RowDelta that adds rows and deletes others."""
    from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestWriterV2
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _FastAppendFiles

    class DeleteManifestWriter(ManifestWriterV2):
        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    class RowDelta(_FastAppendFiles):
        def __init__(self, delete_files: Sequence, **kwargs) -> None:
            super().__init__(operation=Operation.OVERWRITE, **kwargs)
            self._delete_files = list(delete_files)

        def _manifests(self):
            manifests = super()._manifests()
            by_spec: dict[int, list] = {}
            for delete_file in self._delete_files:
                by_spec.setdefault(delete_file.spec_id, []).append(delete_file)
            written = []
            for spec_id, files in sorted(by_spec.items()):
                with DeleteManifestWriter(self.spec(spec_id), self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression) as writer:
                    for delete_file in files:
                        writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id, data_file=delete_file))
                written.append(writer.to_manifest_file())
            return [*manifests[:1], *written, *manifests[1:]] if self._added_data_files else [*written, *manifests]

        def _summary(self, snapshot_properties):
            # The base counts what `_added_data_files` holds, delete files included by content.
            data_files = self._added_data_files
            self._added_data_files = [*data_files, *self._delete_files]
            try:
                return super()._summary(snapshot_properties)
            finally:
                self._added_data_files = data_files

    return RowDelta

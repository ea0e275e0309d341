"""The upsert of a compacted topic's table: which rows a cycle deletes so that the table holds one row
per live key, the latest value of each key, and no row of a deleted key.

A compacted topic's table is merge-on-read. A cycle appends its rows as any topic's cycle does, and
in the same snapshot adds Iceberg position deletes (position_deletes.py) for
- each row of the table the cycle supersedes: a row of the same Kafka partition and key, older than
  the cycle's newest record of that key (a tombstone row the table deleted already, but the Kafka
  view still serves, too: it is superseded at once);
- each of the cycle's own rows that a later record of the cycle supersedes;
- each tombstone (a record with a key and no value) that is its key's newest record: the key is
  gone, so its tombstone is no row either (the Kafka view keeps tombstones for
  `delete.retention.ms`, apart from the table's rows).
The tombstones' deletes are written to files of their own (`Deletes.tombstones`), so that the Kafka
view can tell the deletes it applies at once from those it waits `delete.retention.ms` for.

Rows with no key (a batch stored whole because its records could not be made rows, or records
produced before the topic compacted) neither supersede nor are superseded: they stay.

A key is its Kafka partition and its exact key bytes, as Kafka's log cleaner compares them. The cost
of a cycle follows the keys it changes for what it writes: a delete file of one (path, position)
per superseded row. To find those rows it reads the key column of the live rows of the Kafka
partitions the cycle touches (the table's files Iceberg's statistics do not rule out); see
bench/RESULTS.md for what that costs at a million keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from table.layout import KAFKA, KEY_RAW, OFFSET, PARTITION, STORED_BATCH, VALUE_RAW, VALUE_SCHEMA_ID

from .rewrites import PARTITION_COLUMN

COMPACT = "compact"
# The table property a compacted topic's cycles keep set: its table is an upsert table (the first
# cycle without it converts the whole table, conversion_deletes); a cycle of the topic under
# another policy removes it, so that a switch back converts again.
UPSERT = "neve.upsert"
LONG_MAX = 2**63 - 1
TOMBSTONES = "-tombstones-"  # in the names of the position-delete files of tombstones (`write_deletes`)
DELETE_RETENTION_MS = 86_400_000  # Kafka's default, as broker/topic_configs.py declares it


def is_compacted(configs: Mapping[str, str]) -> bool:
    """Whether a topic's cleanup.policy compacts its keys (`compact` or `compact,delete`)."""
    return COMPACT in (v.strip() for v in configs.get("cleanup.policy", "delete").split(","))


def _ms(configs: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(configs.get(name, default))
    except ValueError:  # the broker validates topic configs; a value it let through is not ours to fail on
        return default


def min_compaction_lag_ms(configs: Mapping[str, str]) -> int:
    """min.compaction.lag.ms: how long a record stays out of the table (and uncompacted)."""
    return max(0, _ms(configs, "min.compaction.lag.ms", 0))


def max_compaction_lag_ms(configs: Mapping[str, str]) -> int | None:
    """max.compaction.lag.ms when set below its default (Long.MAX_VALUE): None otherwise."""
    lag = _ms(configs, "max.compaction.lag.ms", LONG_MAX)
    return lag if 0 < lag < LONG_MAX else None


def delete_retention_ms(configs: Mapping[str, str]) -> int:
    """delete.retention.ms: how long Kafka readers are served a tombstone once compacted."""
    return max(0, _ms(configs, "delete.retention.ms", DELETE_RETENTION_MS))


def horizons(configs: Mapping[str, str], entries: Mapping[int, Sequence[Any]], now_ms: int) -> dict[int, int]:
    """Per partition of a compacted topic with min.compaction.lag.ms, the first offset of its first
    pending entry (IndexEntry) holding a record younger than the lag: the cycle stops before it, so
    those records stay in the WAL, uncompacted, every one served to Kafka readers (as Kafka's
    cleaner leaves the segments newer than the lag). Empty for no lag."""
    lag = min_compaction_lag_ms(configs)
    if not lag:
        return {}
    cutoff = now_ms - lag
    out = {}
    for p, wal in entries.items():
        young = next((e.base_offset for e in wal if e.max_timestamp > cutoff), None)
        if young is not None:
            out[p] = young
    return out


@dataclass(slots=True)
class Deletes:
    """What one cycle deletes: as (data file, sorted positions) pairs (pyiceberg DataFiles, of the
    table or added by the cycle) for the table's position deletes, and as offsets per Kafka
    partition for its Kafka readers (table/removals.py)."""

    superseded: list[tuple[Any, Any]] = field(default_factory=list)
    tombstones: list[tuple[Any, Any]] = field(default_factory=list)
    superseded_offsets: dict[int, Any] = field(default_factory=dict)
    tombstone_offsets: dict[int, Any] = field(default_factory=dict)

    def removed(self, tombstones_hidden_from_ms: int) -> dict[int, tuple[Any, Any]]:
        """Per partition, the offsets Kafka readers skip and from when (ms; 0: at once): the
        superseded records at once, the tombstones from `tombstones_hidden_from_ms`."""
        import numpy as np

        out = {}
        for p in sorted(self.superseded_offsets.keys() | self.tombstone_offsets.keys()):
            gone = self.superseded_offsets.get(p, np.empty(0, dtype=np.int64))
            tombs = self.tombstone_offsets.get(p, np.empty(0, dtype=np.int64))
            hidden = np.concatenate([np.zeros(len(gone), dtype=np.int64), np.full(len(tombs), tombstones_hidden_from_ms, dtype=np.int64)])
            out[p] = (np.concatenate([gone, tombs]), hidden)
        return out


def cycle_deletes(table, added: Sequence[Any]) -> Deletes:
    """The deletes that make `table` (as the cycle read it, before its commit) plus the data files
    `added` (the cycle's DataFiles) one row per live key. Reads the added files' keys, offsets and
    whether each value is null, and the keys of the table's live rows of the Kafka partitions the
    added rows are in."""
    import pyarrow as pa
    import pyarrow.compute as pc

    new = _rows(table.io, added, with_values=True)
    keyed = new.filter(pc.is_valid(new["k"])) if new is not None else None
    if keyed is None or keyed.num_rows == 0:
        return Deletes()
    # each key's newest record among the cycle's: the cycle's other rows of it are superseded
    newest = keyed.group_by(["p", "k"]).aggregate([("o", "max")]).rename_columns(["p", "k", "newest"])
    marked = keyed.join(newest, keys=["p", "k"], join_type="inner")
    is_newest = pc.equal(marked["o"], marked["newest"])
    superseded = [marked.filter(pc.invert(is_newest)).select(["p", "o", "f", "pos"])]
    gone = marked.filter(pc.and_(is_newest, marked["tomb"])).select(["p", "o", "f", "pos"])
    # the table's live rows of the keys the cycle wrote: all superseded by the cycle's newest; and
    # so are its tombstones still served to Kafka readers (deleted from the table by tombstone
    # delete files alone, hidden from readers once delete.retention.ms has passed): a later record
    # of their key hides them at once, as Kafka's cleaner removes a tombstone a later record
    # follows. Their rows are deleted again as superseded, so that no later cycle finds them.
    existing = _live_files(table, pc.unique(keyed["p"]).to_pylist())
    old = _rows(table.io, [f for f, _ in existing], deleted={f.file_path: [d for d in ds if not _tombstone_deletes(d)] for f, ds in existing})
    if old is not None:
        hit = old.filter(pc.is_valid(old["k"])).join(newest.select(["p", "k"]), keys=["p", "k"], join_type="left semi")
        superseded.append(hit.select(["p", "o", "f", "pos"]).set_column(2, "f", pc.add(hit["f"], pa.scalar(len(added), pa.int32()))))
    all_superseded = pa.concat_tables(superseded)
    files = [*added, *(f for f, _ in existing)]
    return Deletes(
        superseded=_by_file(all_superseded, files),
        tombstones=_by_file(gone, files),
        superseded_offsets=_by_partition(all_superseded),
        tombstone_offsets=_by_partition(gone),
    )


def conversion_deletes(table, added: Sequence[Any]) -> Deletes:
    """The deletes of a topic's first cycle as a compacted topic (its table not an upsert table
    yet: UPSERT not set; its cleanup.policy was switched to compact, or it is new): every row of
    the table and of the data files `added` but the newest of its key, and that one too where it
    is a tombstone. The whole table becomes one row per live key, as Kafka's log cleaner compacts
    the whole log once the policy compacts. Reads every live row's key and whether its value is
    null: a cost of the table's size, once."""
    import pyarrow.compute as pc

    existing = _live_files(table, None)
    files = [*added, *(f for f, _ in existing)]
    rows = _rows(table.io, files, with_values=True, deleted={f.file_path: ds for f, ds in existing})
    keyed = rows.filter(pc.is_valid(rows["k"])) if rows is not None else None
    if keyed is None or keyed.num_rows == 0:
        return Deletes()
    newest = keyed.group_by(["p", "k"]).aggregate([("o", "max")]).rename_columns(["p", "k", "newest"])
    marked = keyed.join(newest, keys=["p", "k"], join_type="inner")
    is_newest = pc.equal(marked["o"], marked["newest"])
    superseded = marked.filter(pc.invert(is_newest)).select(["p", "o", "f", "pos"])
    gone = marked.filter(pc.and_(is_newest, marked["tomb"])).select(["p", "o", "f", "pos"])
    return Deletes(
        superseded=_by_file(superseded, files),
        tombstones=_by_file(gone, files),
        superseded_offsets=_by_partition(superseded),
        tombstone_offsets=_by_partition(gone),
    )


def _tombstone_deletes(path: str) -> bool:
    """Whether a delete file is one of tombstones (`write_deletes` names them so)."""
    return f"{TOMBSTONES}deletes-" in path.rsplit("/", 1)[-1]


def _by_file(rows, files: Sequence[Any]) -> list[tuple[Any, Any]]:
    """(file, its sorted positions) for the files `rows` (with f and pos columns) name."""
    import numpy as np

    index, positions = rows["f"].to_numpy(), rows["pos"].to_numpy()
    return [(files[int(f)], np.sort(positions[index == f])) for f in np.unique(index)]


def _by_partition(rows) -> dict[int, Any]:
    """The sorted offsets of `rows` (with p and o columns) by Kafka partition."""
    import numpy as np

    partitions, offsets = rows["p"].to_numpy(), rows["o"].to_numpy()
    return {int(p): np.sort(offsets[partitions == p]) for p in np.unique(partitions)}


def _live_files(table, partitions: Iterable[int] | None) -> list[tuple[Any, list[str]]]:
    """The table's current data files that may hold rows of these Kafka `partitions` (None: all),
    each with the paths of the delete files that apply to it."""
    from pyiceberg.expressions import AlwaysTrue, In

    if table.current_snapshot() is None:
        return []
    tasks = table.scan(row_filter=AlwaysTrue() if partitions is None else In(PARTITION_COLUMN, set(partitions))).plan_files()
    return [(t.file, [d.file_path for d in t.delete_files]) for t in tasks]


def _rows(io, files: Sequence[Any], with_values: bool = False, deleted: Mapping[str, Sequence[str]] | None = None):
    """One Arrow table of the rows of `files` (DataFiles): p (Kafka partition), k (key bytes, null
    for a row with no key or a stored batch), o (offset), f (the file's index in `files`), pos (the
    row's position in it), and with `with_values` tomb (a tombstone: no value). Rows the delete
    files in `deleted` (data file path → delete file paths) remove are left out. None for no rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    positions_cache: dict[str, dict[str, np.ndarray]] = {}
    pieces = []
    for i, data_file in enumerate(files):
        with io.new_input(data_file.file_path).open() as fi:
            parquet = pq.ParquetFile(fi)
            names = set(parquet.schema_arrow.names)
            kafka_fields = {f.name for f in parquet.schema_arrow.field(KAFKA).type}
            columns = [f"{KAFKA}.{PARTITION}", f"{KAFKA}.{OFFSET}", KEY_RAW]
            if STORED_BATCH in kafka_fields:
                columns.append(f"{KAFKA}.{STORED_BATCH}")
            if with_values:
                columns += [c for c in (VALUE_RAW, VALUE_SCHEMA_ID) if c in names]
            rows = parquet.read(columns=columns)
        kafka = rows.column(KAFKA).combine_chunks()
        key = rows.column(KEY_RAW).combine_chunks()
        if STORED_BATCH in kafka_fields:
            stored = pc.fill_null(pc.struct_field(kafka, STORED_BATCH), False)
            key = pc.if_else(stored, pa.scalar(None, key.type), key)
        n = rows.num_rows
        piece = {
            "p": pc.struct_field(kafka, PARTITION),
            "k": key.cast(pa.large_binary()),
            "o": pc.struct_field(kafka, OFFSET),
            "f": pa.array(np.full(n, i, dtype=np.int32)),
            "pos": pa.array(np.arange(n, dtype=np.int64)),
        }
        if with_values:
            tomb = pa.array(np.ones(n, dtype=bool))
            for c in (VALUE_RAW, VALUE_SCHEMA_ID):
                if c in names:
                    tomb = pc.and_(tomb, pc.is_null(rows.column(c).combine_chunks()))
            piece["tomb"] = tomb
        table = pa.table(piece)
        if deleted and deleted.get(data_file.file_path):
            gone = _deleted_positions(io, deleted[data_file.file_path], data_file.file_path, positions_cache)
            if len(gone):
                keep = np.ones(n, dtype=bool)
                keep[gone[gone < n]] = False
                table = table.filter(pa.array(keep))
        pieces.append(table)
    if not pieces:
        return None
    out = pa.concat_tables(pieces)
    return out if out.num_rows else None


def _deleted_positions(io, delete_paths: Sequence[str], data_path: str, cache: dict[str, dict[str, Any]]):
    """The positions of `data_path`'s rows that the position-delete files `delete_paths` remove."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    found = []
    for path in delete_paths:
        if path not in cache:
            with io.new_input(path).open() as fi:
                rows = pq.ParquetFile(fi).read(columns=["file_path", "pos"])
            by_path: dict[str, np.ndarray] = {}
            paths = rows.column("file_path").combine_chunks()
            for p in pc.unique(paths).to_pylist():
                by_path[p] = rows.column("pos").filter(pc.equal(paths, p)).to_numpy()
            cache[path] = by_path
        if (hit := cache[path].get(data_path)) is not None:
            found.append(hit)
    return np.unique(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)



def write_deletes(table, data_location: str, deletes: Deletes, cycle_id: str) -> list:
    """The position-delete files of `deletes` (pyiceberg DataFiles to commit with the cycle's rows):
    the superseded rows' and the tombstones' in files of their own, each named after `cycle_id`
    (which must begin with the cycle's id: held_by_tombstones reads it back)."""
    from .position_deletes import write_position_deletes

    spec, schema, specs = table.spec(), table.schema(), table.specs()
    return [
        *write_position_deletes(table.io, data_location, spec, schema, deletes.superseded, name_prefix=f"{cycle_id}-superseded", specs=specs),
        *write_position_deletes(table.io, data_location, spec, schema, deletes.tombstones, name_prefix=f"{cycle_id}-tombstones", specs=specs),
    ]


def held_by_tombstones(table, retention_ms: int, now_ms: int) -> frozenset[str]:
    """The data files holding a tombstone whose `delete.retention.ms` has not passed since the
    cycle that compacted it: a rewrite applies every delete, so it would take the tombstone from
    the Kafka readers it is still served to. A tombstone delete file names its cycle (`write_deletes`);
    the cycle's snapshot gives the time (an expired snapshot is older than any retention kept)."""
    from .committer import CYCLE

    if table.current_snapshot() is None:
        return frozenset()
    cycles = {}
    for snapshot in table.metadata.snapshots:
        props = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        if CYCLE in props:
            cycles[props[CYCLE]] = snapshot.timestamp_ms
    held = set()
    for task in table.scan().plan_files():
        for d in task.delete_files:
            if _tombstone_deletes(d.file_path):
                cycle_id = d.file_path.rsplit("/", 1)[-1].split("-", 1)[0]
                if cycles.get(cycle_id, -retention_ms - 1) + retention_ms > now_ms:
                    held.add(task.file.file_path)
                    break
    return frozenset(held)

"""The committer's exactly-once rules and the index swap, on a real pyiceberg SQL catalog (SQLite)
and the embedded metadata store: a cycle is appended once however often it is committed, a crash
between the Iceberg commit and the swap is finished on restart, and the swap is idempotent."""

from __future__ import annotations

import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.schema import Schema
from pyiceberg.types import BinaryType, IntegerType, LongType, NestedField

from compactor.commits.binding import TOPIC_PROPERTY, TableNotBound
from compactor.commits.committer import commit_cycle, committed_cycle, last_cycle
from compactor.commits.reindex import finish_last_cycle, replacement, swap
from compactor.files.layout import arrow_schema, rows_to_arrow
from compactor.rows.records import Batch, Record
from compactor.rows.translator import kafka_columns, translate
from compactor.service.tables import load_or_create
from metadata.model import Append, IndexEntry, ObjectCommit, ObjectType
from metadata.store import load_metadata_store
from wal.manifest import CycleManifest, FileSlice, PartitionCompaction, WalRange, new_cycle_id
from wal.store import MemoryObjectStore

SCHEMA = Schema(
    NestedField(1, "partition", IntegerType(), required=True),
    NestedField(2, "offset", LongType(), required=True),
    NestedField(3, "value_raw", BinaryType(), required=False),
)
ARROW = pa.schema(
    [
        pa.field("partition", pa.int32(), nullable=False, metadata={b"PARQUET:field_id": b"1"}),
        pa.field("offset", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"2"}),
        pa.field("value_raw", pa.binary(), metadata={b"PARQUET:field_id": b"3"}),
    ]
)


@pytest.fixture
def table(tmp_path):
    catalog = SqlCatalog("neve", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("neve")
    return catalog.create_table("neve.t", SCHEMA)


@pytest.fixture
async def store():
    s = load_metadata_store("memory://")
    await s.start()
    yield s
    await s.close()


async def commit_wal(store, topic_id, partition, counts):
    """One WAL object per count, `count` records each: the entries the compactor will replace."""
    for i, count in enumerate(counts):
        await store.commit(ObjectCommit(f"wal/{partition}-{i}", 100 * count, (Append(topic_id, partition, 0, 100 * count, count, 1000 + i),)))
    return store.entries(topic_id, partition, 0, max_entries=100)


def write_rows(table, tmp_path, name, rows):
    path = f"{tmp_path}/{name}.parquet"
    pq.write_table(pa.Table.from_pylist([{"partition": p, "offset": o, "value_raw": v} for p, o, v in rows], schema=ARROW), path)
    return parquet_file_to_data_file(table.io, table.metadata, f"file://{path}")


def ranges(entries):
    return tuple(WalRange(e.object_key, e.start, e.size, e.base_offset, e.last_offset, e.max_timestamp) for e in entries)


def manifest_for(topic_id, partition, entries, path):
    rows = entries[-1].last_offset - entries[0].base_offset + 1
    part = PartitionCompaction(partition, ranges(entries), (FileSlice(f"file://{path}", 0, rows, entries[0].base_offset, entries[-1].last_offset),))
    return CycleManifest(new_cycle_id(), topic_id, "t", "neve.t", (part,))


def bind(table, topic_id):
    """The table bound to topic `topic_id`, as the compactor creates it (compactor/commits/binding.py)."""
    with table.transaction() as change:
        change.set_properties({TOPIC_PROPERTY: str(topic_id)})
    return table.refresh()


def rows_of(table):
    return sorted((r["partition"], r["offset"]) for r in table.refresh().scan().to_arrow().to_pylist())


async def test_a_cycle_committed_twice_is_appended_once_and_its_offsets_are_in_the_summary(table, tmp_path, store):
    info = await store.create_topic("t", 1)
    table = bind(table, info.topic_id)
    entries = await commit_wal(store, info.topic_id, 0, [2, 3])
    data_file = write_rows(table, tmp_path, "a", [(0, o, b"v%d" % o) for o in range(5)])
    manifest = manifest_for(info.topic_id, 0, entries, f"{tmp_path}/a.parquet")

    first = commit_cycle(table, manifest, [data_file])
    again = commit_cycle(table.refresh(), manifest, [data_file])  # e.g. a retry whose answer was lost

    assert again.snapshot_id == first.snapshot_id
    assert rows_of(table) == [(0, o) for o in range(5)]
    assert first.offsets == {0: (0, 4)} and first.manifest_key == manifest.key
    assert len(table.refresh().metadata.snapshots) == 1


async def test_a_new_cycle_past_the_offsets_the_table_keeps_reads_no_snapshot_history(table, tmp_path, store, monkeypatch):
    """A commit's cost must not grow with the snapshots a table keeps: the committed offsets in
    the table's properties tell that a new cycle's offsets are not held, and the history is read
    only to find the appended snapshot (the current one)."""
    from compactor.commits import committer

    info = await store.create_topic("t", 1)
    table = bind(table, info.topic_id)
    entries = await commit_wal(store, info.topic_id, 0, [1] * 12)
    for i, entry in enumerate(entries[:10]):
        table = table.refresh()
        commit_cycle(table, manifest_for(info.topic_id, 0, [entry], f"{tmp_path}/{i}.parquet"), [write_rows(table, tmp_path, str(i), [(0, entry.base_offset, None)])])
    walked = []
    cycles = committer._cycles

    def counted(table):
        for cycle in cycles(table):
            walked.append(cycle.cycle_id)
            yield cycle

    monkeypatch.setattr(committer, "_cycles", counted)
    table = table.refresh()
    manifest = manifest_for(info.topic_id, 0, entries[10:11], f"{tmp_path}/new.parquet")
    done = commit_cycle(table, manifest, [write_rows(table, tmp_path, "new", [(0, 10, None)])])
    assert walked == [manifest.cycle_id] and done.offsets == {0: (10, 10)}
    # one it holds (a retry whose answer was lost) is still found, by the history
    walked.clear()
    assert commit_cycle(table.refresh(), manifest, []).snapshot_id == done.snapshot_id and walked == [manifest.cycle_id]
    assert rows_of(table) == [(0, o) for o in range(11)]


async def test_the_snapshot_before_a_cycle_holds_exactly_the_earlier_rows(table, tmp_path, store):
    info = await store.create_topic("t", 1)
    table = bind(table, info.topic_id)
    entries = await commit_wal(store, info.topic_id, 0, [2, 2])
    one = commit_cycle(table, manifest_for(info.topic_id, 0, entries[:1], f"{tmp_path}/a.parquet"), [write_rows(table, tmp_path, "a", [(0, 0, b"a"), (0, 1, b"b")])])
    commit_cycle(table.refresh(), manifest_for(info.topic_id, 0, entries[1:], f"{tmp_path}/b.parquet"), [write_rows(table, tmp_path, "b", [(0, 2, b"c"), (0, 3, b"d")])])

    before = table.refresh().scan(snapshot_id=one.snapshot_id).to_arrow().to_pylist()
    assert sorted((r["offset"], r["value_raw"]) for r in before) == [(0, b"a"), (1, b"b")]
    assert rows_of(table) == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert last_cycle(table.refresh()).offsets == {0: (2, 3)}


async def test_a_restart_between_the_commit_and_the_swap_finishes_the_swap_once(table, tmp_path, store):
    info = await store.create_topic("t", 2)
    table = bind(table, info.topic_id)
    entries = await commit_wal(store, info.topic_id, 1, [1, 2, 3])
    objects = MemoryObjectStore()
    manifest = manifest_for(info.topic_id, 1, entries, f"{tmp_path}/a.parquet")
    data = manifest.encode()
    await objects.put(manifest.key, data)
    commit_cycle(table, manifest, [write_rows(table, tmp_path, "a", [(1, o, None) for o in range(6)])])
    # the compactor dies here: the index still says WAL

    assert [e.object_type for e in store.entries(info.topic_id, 1, 0)] == [ObjectType.WAL] * 3
    outcome = await finish_last_cycle(store, objects, table.refresh())
    assert outcome.swapped == [1]
    # the entry's bytes are the replaced WAL bytes laid end to end: 100 a record here
    assert store.entries(info.topic_id, 1, 0) == [IndexEntry(0, 5, manifest.key, ObjectType.PARQUET, 0, 600, 1002)]
    for offset in range(6):
        assert store.entries(info.topic_id, 1, offset, max_entries=1)[0].object_key == manifest.key

    again = await finish_last_cycle(store, objects, table.refresh())  # a second restart changes nothing
    assert (again.swapped, again.already) == ([], [1])
    assert store.entries(info.topic_id, 1, 0) == [IndexEntry(0, 5, manifest.key, ObjectType.PARQUET, 0, 600, 1002)]
    assert store.high_watermark(info.topic_id, 1) == 6


async def test_the_swap_keeps_later_wal_entries_and_commits_after_it_continue(table, tmp_path, store):
    info = await store.create_topic("t", 1)
    table = bind(table, info.topic_id)
    entries = await commit_wal(store, info.topic_id, 0, [2, 2, 2])
    manifest = manifest_for(info.topic_id, 0, entries[:2], f"{tmp_path}/a.parquet")
    outcome = await swap(store, manifest)
    await commit_wal(store, info.topic_id, 0, [4])

    got = store.entries(info.topic_id, 0, 0)
    assert outcome.swapped == [0]
    assert [(e.base_offset, e.last_offset, e.object_type) for e in got] == [(0, 3, ObjectType.PARQUET), (4, 5, ObjectType.WAL), (6, 9, ObjectType.WAL)]
    assert got[1] == entries[2]


async def test_a_table_without_cycles_has_nothing_to_finish(table, store):
    assert last_cycle(table) is None
    assert committed_cycle(table, "x") is None
    assert await finish_last_cycle(store, MemoryObjectStore(), table) is None


def test_a_manifest_decodes_to_what_was_encoded_and_maps_its_replaced_bytes_back_to_wal_ranges():
    a = (WalRange("wal/a", 10, 90, 5, 9, 7), WalRange("wal/b", 0, 30, 10, 10, 8))
    b = (WalRange("wal/a", 100, 40, 0, 3, 6),)
    parts = (PartitionCompaction(3, a, (FileSlice("s3://w/a.parquet", 4, 3, 5, 9), FileSlice("s3://w/b.parquet", 0, 3, 6, 10))), PartitionCompaction(4, b, ()))
    manifest = CycleManifest(new_cycle_id(), uuid.uuid4(), "orders", "neve.orders", parts)
    assert CycleManifest.decode(manifest.encode()) == manifest
    assert manifest.offsets() == {3: (5, 10), 4: (0, 3)}
    assert (manifest.partition_range(3), manifest.partition_range(4)) == ((0, 120), (120, 40))
    assert replacement(manifest, parts[0]) == IndexEntry(5, 10, manifest.key, ObjectType.PARQUET, 0, 120, 8)
    assert replacement(manifest, parts[1]) == IndexEntry(0, 3, manifest.key, ObjectType.PARQUET, 120, 40, 6)
    assert manifest.resolve(0, 120) == [("wal/a", 10, 90), ("wal/b", 0, 30)]
    assert manifest.resolve(85, 40) == [("wal/a", 95, 5), ("wal/b", 0, 30), ("wal/a", 100, 5)]
    assert manifest.resolve(120, 40) == [("wal/a", 100, 40)]
    assert manifest.wal_objects() == {"wal/a", "wal/b"}
    with pytest.raises(ValueError):
        manifest.resolve(150, 20)


async def test_a_second_compactors_cycle_over_the_same_offsets_appends_nothing(table, tmp_path, store):
    from compactor.commits.committer import CycleOverlap

    info = await store.create_topic("t", 1)
    table = bind(table, info.topic_id)
    entries = await commit_wal(store, info.topic_id, 0, [2, 2])
    first = manifest_for(info.topic_id, 0, entries, f"{tmp_path}/a.parquet")
    commit_cycle(table, first, [write_rows(table, tmp_path, "a", [(0, o, None) for o in range(4)])])
    # another compactor planned the same entries (and one more offset) before seeing the first's commit
    rival = manifest_for(info.topic_id, 0, entries[1:], f"{tmp_path}/b.parquet")
    with pytest.raises(CycleOverlap):
        commit_cycle(table, rival, [write_rows(table, tmp_path, "b", [(0, o, None) for o in range(2, 4)])])
    assert rows_of(table) == [(0, o) for o in range(4)]
    # the topic deleted and made again under its name: a new topic id, which never writes into the old one's table
    again = await store.create_topic("t2", 1)
    reborn = manifest_for(again.topic_id, 0, await commit_wal(store, again.topic_id, 0, [4]), f"{tmp_path}/c.parquet")
    with pytest.raises(TableNotBound, match=str(again.topic_id)):
        commit_cycle(table.refresh(), reborn, [write_rows(table, tmp_path, "c", [(0, o, None) for o in range(4)])])
    assert rows_of(table) == [(0, o) for o in range(4)]


async def test_neve_tables_keep_the_metadata_files_of_the_last_commits_only_and_every_snapshot(tmp_path, store):
    """A table made by the compactor deletes its oldest metadata.json after each commit past
    write.metadata.previous-versions-max (100 by default; 3 here), and its snapshots (time
    travel, the cycles' summaries) all stay."""
    catalog = SqlCatalog("neve", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    info = await store.create_topic("t", 1)
    table = load_or_create(catalog, "neve.t", "none", info.topic_id)
    with table.transaction() as change:
        change.set_properties({"write.metadata.previous-versions-max": "3"})
    entries = await commit_wal(store, info.topic_id, 0, [1] * 8)
    cycles = []
    for i, entry in enumerate(entries):
        path = f"{tmp_path}/c{i}.parquet"
        batch = Batch(0, 0, 0, i, 0, 2, 0, 0, 1000 + i, 1000 + i, -1, -1, -1, 1)
        pq.write_table(pa.Table.from_batches([rows_to_arrow([translate(Record(i, 1000 + i, None, b"v%d" % i, ()), kafka_columns(0, batch), None)[0]], arrow_schema(table.schema()))]), path)
        data_file = parquet_file_to_data_file(table.io, table.refresh().metadata, f"file://{path}")
        cycles.append(commit_cycle(table.refresh(), manifest_for(info.topic_id, 0, [entry], path), [data_file]))

    metadata_files = sorted((tmp_path / "warehouse" / "neve" / f"t-{info.topic_id.hex}" / "metadata").glob("*.metadata.json"))
    assert len(metadata_files) == 4  # the current one and the 3 before it
    table = table.refresh()
    assert [s.snapshot_id for s in table.metadata.snapshots] == [c.snapshot_id for c in cycles]
    assert sorted(r["value_raw"] for r in table.scan(snapshot_id=cycles[2].snapshot_id).to_arrow().to_pylist()) == [b"v0", b"v1", b"v2"]


async def test_offsets_committed_are_refused_again_after_snapshot_expiry_took_their_cycles(table, tmp_path, store):
    from compactor.commits.committer import CycleOverlap
    from compactor.maintenance.rounds import expire_snapshots

    info = await store.create_topic("t", 1)
    table = bind(table, info.topic_id)
    entries = await commit_wal(store, info.topic_id, 0, [2, 2, 2])
    old = manifest_for(info.topic_id, 0, entries[:1], f"{tmp_path}/a.parquet")
    commit_cycle(table, old, [write_rows(table, tmp_path, "a", [(0, 0, None), (0, 1, None)])])
    for i, entry in enumerate(entries[1:]):
        rows = [(0, o, None) for o in range(entry.base_offset, entry.last_offset + 1)]
        newest = manifest_for(info.topic_id, 0, [entry], f"{tmp_path}/b{i}.parquet")
        commit_cycle(table.refresh(), newest, [write_rows(table, tmp_path, f"b{i}", rows)])
    expire_snapshots(table.refresh(), int(time.time() * 1000) + 60_000)  # every snapshot but the current one: the first two cycles' summaries are gone
    table = table.refresh()
    assert len(table.metadata.snapshots) == 1
    # A deposed compactor that had planned the first entries again commits late: refused, and a
    # retry of the last cycle's commit (its answer lost) is found committed, not appended again.
    late = manifest_for(info.topic_id, 0, entries[:1], f"{tmp_path}/late.parquet")
    with pytest.raises(CycleOverlap):
        commit_cycle(table, late, [write_rows(table, tmp_path, "late", [(0, 0, None), (0, 1, None)])])
    assert commit_cycle(table, newest, []).cycle_id == newest.cycle_id
    assert last_cycle(table).manifest_key == newest.key
    assert rows_of(table) == [(0, o) for o in range(6)]


async def test_a_cycle_committed_by_a_deposed_compactor_and_never_swapped_is_swapped_by_the_next_leader(table, tmp_path, store):
    """The deposed compactor's cycle over partition 0 is committed but its swap refused; the new
    leader's cycle over partition 1 commits after it (the last cycle): the deposed cycle's
    partition is still swapped when the table's cycles are finished."""
    info = await store.create_topic("t", 2)
    table = bind(table, info.topic_id)
    objects = MemoryObjectStore()
    deposed = manifest_for(info.topic_id, 0, await commit_wal(store, info.topic_id, 0, [2]), f"{tmp_path}/a.parquet")
    leader = manifest_for(info.topic_id, 1, await commit_wal(store, info.topic_id, 1, [3]), f"{tmp_path}/b.parquet")
    for m in (deposed, leader):
        await objects.put(m.key, m.encode())
    commit_cycle(table, deposed, [write_rows(table, tmp_path, "a", [(0, o, None) for o in range(2)])])
    commit_cycle(table.refresh(), leader, [write_rows(table, tmp_path, "b", [(1, o, None) for o in range(3)])])
    await swap(store, leader)

    outcome = await finish_last_cycle(store, objects, table.refresh())
    assert (outcome.swapped, outcome.already) == ([0], [1])
    assert [(e.object_key, e.object_type) for p in (0, 1) for e in store.entries(info.topic_id, p, 0)] == [(deposed.key, ObjectType.PARQUET), (leader.key, ObjectType.PARQUET)]

"""Position-delete files written by the compactor (compactor/commits/position_deletes.py) and committed
with a cycle's data files in one snapshot (committer.commit_cycle's delete_files), on a table made
as the compactor makes it (SQLite catalog, the topic's layout, each partition spec): pyiceberg,
DuckDB and Spark read exactly the rows not deleted, whether the deleted rows are in files of
earlier snapshots or of the same one, in one Iceberg partition or several, a file's every row or
some. A commit whose deletes name a data file another writer has removed meanwhile commits
nothing (DeletedFilesGone), and so does one whose deletes were computed before another writer's
cycle (TableChanged): that cycle's rows of the same keys would stay live beside the new ones. The broker's reader of the deleted positions (table/position_deletes.py)
finds exactly the positions written."""

from __future__ import annotations

import uuid

import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import DataFileContent, ManifestContent

from compactor.commits.committer import DeletedFilesGone, TableChanged, commit_cycle
from compactor.commits.position_deletes import FILE_PATH_ID, POS_ID, write_position_deletes
from compactor.files.spark import register_catalog
from compactor.files.writer import TableWriter
from compactor.rows.records import Batch, Record
from compactor.rows.translator import kafka_columns, translate
from compactor.service.tables import load_or_create
from table import layout as table_layout
from table.files import TableFiles
from table.position_deletes import read_positions
from tests.readers import rows_duckdb, rows_spark
from wal.manifest import CycleManifest, FileSlice, PartitionCompaction, WalRange, new_cycle_id

DAY_MS = 86_400_000
T0 = 1_795_000_000_000  # 2026-11-19, ms
TOPIC = "t"


class Topic:
    """A topic's table on a catalog, and the cycles committed to it: the data files each cycle
    wrote, and where each (Kafka partition, offset) row is (data file, position)."""

    def __init__(self, iceberg, partition_by: str | None) -> None:
        self.topic_id = uuid.uuid4()
        self.identifier = f"{iceberg.config.namespace}.t_{self.topic_id.hex[:10]}"
        self.table = load_or_create(iceberg.catalog, self.identifier, partition_by, self.topic_id)
        self.rows: dict[tuple[int, int], tuple] = {}  # (partition, offset) -> (DataFile, position)
        self.cycles = 0

    def write(self, offsets: dict[int, range], day_of=lambda offset: 0) -> list:
        """One cycle's data files: rows of each Kafka partition at `offsets`, keyed by offset % 4,
        on the day `day_of(offset)` says."""
        table = self.table
        writer = TableWriter(table.schema(), table.spec(), f"{table.location()}/data", table.io, file_prefix=uuid.uuid4().hex, table_properties=table.properties)
        for partition, span in offsets.items():
            batch = Batch(0, 0, 0, span[0], 0, 2, 0, len(span) - 1, T0, T0, -1, -1, -1, len(span))
            for offset in span:
                row, outcome = translate(Record(offset, T0 + day_of(offset) * DAY_MS, b"k%d" % (offset % 4), b"v%d-%d" % (partition, offset), ()), kafka_columns(partition, batch), None)
                writer.add(row, outcome)
        data_files = []
        for written in writer.close():
            data_file = written.data_file(table.spec())
            with table.io.new_input(written.path).open() as f:
                kafka = pq.read_table(f, columns=["kafka"]).column("kafka").to_pylist()
            for position, k in enumerate(kafka):
                self.rows[(k["partition"], k["offset"])] = (data_file, position)
            data_files.append(data_file)
        return data_files

    def commit(self, offsets: dict[int, range], data_files: list, delete_files=(), table=None):
        replaced = {p: (WalRange(f"wal/{self.cycles}-{p}", 0, 10, span[0], span[-1], T0),) for p, span in offsets.items()}
        manifest = CycleManifest(new_cycle_id(), self.topic_id, TOPIC, self.identifier, tuple(
            PartitionCompaction(p, replaced[p], (FileSlice(data_files[0].file_path, 0, len(span), span[0], span[-1]),)) for p, span in offsets.items()
        ))  # fmt: skip
        self.cycles += 1
        committed = commit_cycle(table if table is not None else self.table, manifest, data_files, delete_files=delete_files)
        self.table = self.table.refresh()
        return committed

    def cycle(self, offsets: dict[int, range], day_of=lambda offset: 0) -> list:
        data_files = self.write(offsets, day_of)
        self.commit(offsets, data_files)
        return data_files

    def deletes(self, rows) -> list:
        """Position-delete files deleting `rows` ((partition, offset) pairs)."""
        by_file: dict[str, tuple] = {}
        for row in rows:
            data_file, position = self.rows[row]
            by_file.setdefault(data_file.file_path, (data_file, []))[1].append(position)
        table = self.table
        return write_position_deletes(table.io, f"{table.location()}/data", table.spec(), table.schema(), list(by_file.values()), name_prefix=uuid.uuid4().hex)


def kafka_rows(rows: list[dict]) -> list[tuple[int, int]]:
    return sorted((r["kafka"]["partition"], r["kafka"]["offset"]) for r in rows)


@pytest.fixture
def catalog(sqlite_catalog):
    return sqlite_catalog


def upsert_scenario(topic: Topic) -> list[tuple[int, int]]:
    """Three cycles; the third deletes rows of the first (some of a file's), all rows of the
    second, and rows of its own new files, over two days (two partitions of the default spec)
    and two Kafka partitions (two of identity(partition)); a fourth appends without deletes.
    Returns the (partition, offset) rows that must remain."""
    assert topic.table.metadata.format_version == 2
    first = {0: range(0, 10), 1: range(0, 10)}
    topic.cycle(first, day_of=lambda o: 0 if o < 8 else 1)
    second = {0: range(10, 12), 1: range(10, 12)}
    topic.cycle(second, day_of=lambda o: 1)
    third = {0: range(12, 16), 1: range(12, 16)}
    new_files = topic.write(third, day_of=lambda o: 1)
    deleted = {(0, 1), (0, 3), (0, 5), (0, 8), (1, 0), (1, 2), (0, 10), (0, 11), (1, 10), (1, 11), (0, 13), (1, 15)}
    delete_files = topic.deletes(sorted(deleted))
    assert all(f.content == DataFileContent.POSITION_DELETES for f in delete_files)
    before = topic.table.current_snapshot().snapshot_id
    topic.commit(third, new_files, delete_files)
    assert kafka_rows(topic.table.scan(snapshot_id=before).to_arrow().to_pylist()) == sorted((p, o) for spans in (first, second) for p, span in spans.items() for o in span)

    snapshot = topic.table.current_snapshot()
    assert snapshot.parent_snapshot_id == before
    summary = snapshot.summary
    assert summary.operation.value == "overwrite"
    assert int(summary["added-delete-files"]) == int(summary["added-position-delete-files"]) == len(delete_files)
    assert int(summary["added-position-deletes"]) == int(summary["total-position-deletes"]) == len(deleted)
    assert int(summary["added-records"]) == 8 and int(summary["added-data-files"]) == len(new_files)
    manifests = snapshot.manifests(topic.table.io)
    assert sum(m.content == ManifestContent.DELETES for m in manifests) == 1

    fourth = {0: range(16, 18), 1: range(16, 18)}
    topic.cycle(fourth, day_of=lambda o: 1)
    assert topic.table.current_snapshot().summary["total-position-deletes"] == str(len(deleted))  # the deletes stay in the next append
    written = {(p, o) for spans in (first, second, third, fourth) for p, span in spans.items() for o in span}
    return sorted(written - deleted)


@pytest.mark.parametrize("partition_by", [None, "none", "identity(partition)"])
def test_pyiceberg_and_duckdb_read_exactly_the_rows_not_deleted(catalog, partition_by):
    topic = Topic(catalog, partition_by)
    want = upsert_scenario(topic)
    assert kafka_rows(topic.table.scan().to_arrow().to_pylist()) == want
    assert kafka_rows(rows_duckdb(topic.table)) == want


def test_delete_files_are_one_per_partition_value_sorted_with_field_ids_and_path_bounds(catalog):
    topic = Topic(catalog, None)  # day(timestamp)
    data_files = topic.cycle({0: range(0, 6), 1: range(0, 6)}, day_of=lambda o: o % 2)
    assert len(data_files) == 2
    delete_files = topic.deletes([(1, 4), (0, 0), (0, 4), (1, 1), (0, 3), (0, 4)])  # unordered, one twice
    assert sorted(f.partition[0] for f in delete_files) == sorted(f.partition[0] for f in data_files)
    for delete_file in delete_files:
        with topic.table.io.new_input(delete_file.file_path).open() as f:
            parquet = pq.ParquetFile(f)
            arrow = parquet.schema_arrow
            rows = parquet.read().to_pylist()
        assert [(field.name, field.metadata[b"PARQUET:field_id"]) for field in arrow] == [("file_path", str(FILE_PATH_ID).encode()), ("pos", str(POS_ID).encode())]
        assert not any(field.nullable for field in arrow)
        data_file = next(d for d in data_files if d.partition == delete_file.partition)
        assert delete_file.file_path.startswith(topic.table.location() + "/data/")
        want = sorted((data_file.file_path, topic.rows[row][1]) for row in {(1, 4), (0, 0), (0, 4), (1, 1), (0, 3)} if topic.rows[row][0] is data_file)
        assert [(r["file_path"], r["pos"]) for r in rows] == want and delete_file.record_count == len(want)
        assert delete_file.lower_bounds[FILE_PATH_ID] == delete_file.upper_bounds[FILE_PATH_ID] == data_file.file_path.encode()
        assert delete_file.file_size_in_bytes == len(topic.table.io.new_input(delete_file.file_path))
    assert write_position_deletes(topic.table.io, topic.table.location(), topic.table.spec(), topic.table.schema(), [], name_prefix="x") == []


async def test_the_broker_reads_the_positions_each_data_file_lost(catalog):
    topic = Topic(catalog, "none")
    first = topic.cycle({0: range(0, 5)})
    second = topic.cycle({0: range(5, 10)})
    delete_files = topic.deletes([(0, 1), (0, 4), (0, 7)])
    more = topic.deletes([(0, 4), (0, 0)])  # a second file, one row again

    files = TableFiles(None, "memory://")  # data files on the local disk: no WAL store read
    paths = [f.file_path for f in delete_files + more]
    try:
        found = [await read_positions(files, paths, path) for path in (first[0].file_path, second[0].file_path, f"{topic.table.location()}/data/none.parquet")]
        found.append(await read_positions(files, [], first[0].file_path))
    finally:
        await files.close()
    assert [f.dtype.name for f in found] == ["int64"] * 4
    assert [f.tolist() for f in found] == [[0, 1, 4], [2], [], []]


def test_deletes_naming_a_file_another_writer_rewrote_commit_nothing(catalog, caplog):
    topic = Topic(catalog, "none")
    first = topic.cycle({0: range(0, 5)})
    stale = catalog.catalog.load_table(topic.identifier)  # as the cycle read it (refresh() would update it in place)
    deletes = topic.deletes([(0, 2)])
    rewritten = topic.write({0: range(0, 5)})  # maintenance rewrites the file: the same rows in a new one
    with topic.table.transaction() as change, change.update_snapshot().overwrite() as rewrite:
        rewrite.delete_data_file(first[0])
        rewrite.append_data_file(rewritten[0])
    table = topic.table.refresh()
    location, snapshots = table.metadata_location, len(table.metadata.snapshots)

    new_files = topic.write({0: range(5, 7)})
    with pytest.raises(DeletedFilesGone) as gone:
        topic.commit({0: range(5, 7)}, new_files, deletes, table=stale)  # the first attempt conflicts, the second finds the file gone
    assert gone.value.paths == (first[0].file_path,)
    assert [r.message for r in caplog.records if r.name == "neve.compactor.committer"] == ["iceberg commit failed; reading the table back before retrying"]
    table = table.refresh()
    assert (table.metadata_location, len(table.metadata.snapshots)) == (location, snapshots)
    assert kafka_rows(table.scan().to_arrow().to_pylist()) == [(0, o) for o in range(5)]

    with pytest.raises(DeletedFilesGone):  # on the current table too
        topic.commit({0: range(5, 7)}, new_files, deletes)
    # recomputed on the table as it is: the rewritten file's row, and one of the cycle's own
    topic.commit({0: range(5, 7)}, new_files, topic.deletes([(0, 2), (0, 6)]))
    assert kafka_rows(topic.table.scan().to_arrow().to_pylist()) == [(0, 0), (0, 1), (0, 3), (0, 4), (0, 5)]
    # a file whose every row goes in the commit that adds it (a cycle of superseded rows and tombstones)
    superseded = topic.write({0: range(7, 9)})
    topic.commit({0: range(7, 9)}, superseded, topic.deletes([(0, 7), (0, 8)]))
    assert kafka_rows(topic.table.scan().to_arrow().to_pylist()) == kafka_rows(rows_duckdb(topic.table)) == [(0, 0), (0, 1), (0, 3), (0, 4), (0, 5)]


def test_deletes_computed_before_another_writers_cycle_commit_nothing(catalog, caplog):
    """Finding 5 of issue 42: two compactors commit cycles of one compacted topic (a sharing
    handover, `neve compactor --once`). Ours computed its deletes on the table before the other's
    cycle, which wrote the same keys: committed as they are, those rows would stay live beside
    ours (the fault harness's compacted-duplicate-key). The commit refuses them, and deletes
    computed again on the table as it is leave one row per key."""
    topic = Topic(catalog, "none")
    topic.cycle({0: range(0, 4)})  # keys k0..k3 (offset % 4)
    stale = catalog.catalog.load_table(topic.identifier)  # as our cycle read it
    ours = topic.write({0: range(8, 10)})  # k0, k1
    deletes = topic.deletes([(0, 0), (0, 1)])  # computed on `stale`: its rows of k0 and k1
    topic.commit({0: range(4, 8)}, topic.write({0: range(4, 8)}), topic.deletes([(0, 0), (0, 1), (0, 2), (0, 3)]))  # the other writer's cycle
    table = topic.table.refresh()
    location = table.metadata_location

    with pytest.raises(TableChanged) as changed:
        topic.commit({0: range(8, 10)}, ours, deletes, table=stale)  # the first attempt conflicts, the second finds another snapshot
    assert changed.value.current == table.current_snapshot().snapshot_id != changed.value.computed_on
    assert [r.message for r in caplog.records if r.name == "neve.compactor.committer"] == ["iceberg commit failed; reading the table back before retrying"]
    assert table.refresh().metadata_location == location
    assert kafka_rows(table.scan().to_arrow().to_pylist()) == [(0, o) for o in range(4, 8)]

    topic.commit({0: range(8, 10)}, ours, topic.deletes([(0, 4), (0, 5)]))  # computed again: the other cycle's k0 and k1
    rows = topic.table.scan().to_arrow().to_pylist()
    assert kafka_rows(rows) == [(0, 6), (0, 7), (0, 8), (0, 9)]
    assert sorted(r[table_layout.KEY_RAW] for r in rows) == [b"k0", b"k1", b"k2", b"k3"]


@pytest.mark.xdist_group("spark")
def test_spark_reads_exactly_the_rows_not_deleted(sqlite_catalog, spark_session):
    topic = Topic(sqlite_catalog, None)
    want = upsert_scenario(topic)
    name = register_catalog(spark_session, sqlite_catalog.target)
    assert kafka_rows(rows_spark(spark_session, name, topic.identifier)) == want
    assert kafka_rows(topic.table.scan().to_arrow().to_pylist()) == want

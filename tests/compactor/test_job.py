"""compactor/files/job.py: WAL byte ranges to Parquet rows, one per offset. Records that confluent-kafka
produced to `neve dev` through every codec (raw values; Avro values from its AvroSerializer against
neve's registry in two schema versions; tombstones; values framed with an unknown id, not framed,
with bytes after them, or that do not decode), planned from the stopped node's index and written by
the tasks in this process and on Spark, read back with pyarrow field by field. Batches that do not
decode become one row each; a failed task leaves no files."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pickle
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from compactor.catalog import load_catalog
from compactor.config import CompactorConfig
from compactor.files.job import MALFORMED, CycleTaskError, TaskContext, TaskResult, run_task, run_tasks, run_tasks_in_process
from compactor.files.layout import partition_spec, table_schema
from compactor.files.planner import ObjectRead, Run, Task, plan
from compactor.rows.avro_types import union_schema
from compactor.rows.translator import COLUMNS, COLUMNS_RAW, RAW, TOMBSTONE, writer_schema
from metadata.model import IndexEntry, ObjectType
from metadata.store import load_metadata_store
from table.rebuild import rebuild_run
from tests.batches import GZIP, frame_batch, make_batch
from tests.compactor.produced import EVENT, T0, Produced, check_rows, ms, produce_avro, produce_raw
from tests.fixtures import free_port
from wal.batch import inject_offsets
from wal.batch_builder import zigzag_varint
from wal.store import ObjectNotFound

# -- batches that do not decode (no node) ---------------------------------------------------------


def _records(n: int, first: int) -> list:
    return [(f"k{first + i}".encode(), f"v{first + i}".encode() * 3, [("h", str(first + i).encode())], T0 + first + i) for i in range(n)]


def _context(tmp_path: Path, topic: str = "t") -> TaskContext:
    schema = table_schema()
    return TaskContext(
        cycle_id="c0", topic=topic, objects_url=f"file://{tmp_path / 'objects'}", data_location=f"file://{tmp_path / 'data'}", io_properties={},
        table_schema=schema.model_dump_json(), partition_spec=partition_spec(schema).model_dump_json(), table_properties={},
    )  # fmt: skip


def _put(tmp_path: Path, key: str, data: bytes) -> None:
    (tmp_path / "objects").mkdir(exist_ok=True)
    (tmp_path / "objects" / key).write_bytes(data)


def _rows(results: list[TaskResult]) -> list[dict]:
    rows = [row for r in results for f in r.files for row in pq.read_table(f.path, partitioning=None).to_pylist()]
    return sorted(rows, key=lambda row: (row["kafka"]["partition"], row["kafka"]["offset"]))


def _parquet_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.parquet")) if root.exists() else []


@pytest.fixture
def corrupt_wal(tmp_path):
    """One object: entry A (offsets 0-7) holds a good batch (0-2), a batch failing its CRC (3-4),
    one whose records do not decode (5), a good one (6-7); entry B (8-12) a good batch (8-9) and a
    batch cut short (10-12: its header whole, its framing broken); entry C (13-14) a batch of magic
    1 (no header parses). Returns the entries and each bad batch's bytes."""
    good1 = make_batch(_records(3, 0), producer_id=7, producer_epoch=1, base_sequence=0)
    crc = bytearray(make_batch(_records(2, 3), producer_id=7, producer_epoch=1, base_sequence=3, compression=GZIP))
    crc[-1] ^= 0xFF
    undecodable = frame_batch(b"\x7f" * 20, record_count=1, last_offset_delta=0, base_timestamp=T0 + 5, max_timestamp=T0 + 5, producer_id=7, producer_epoch=1, base_sequence=5)
    good2 = make_batch(_records(2, 6), producer_id=7, producer_epoch=1, base_sequence=6)
    good3 = make_batch(_records(2, 8))
    cut = make_batch(_records(3, 10), producer_id=8)[:-9]
    magic1 = bytearray(make_batch(_records(2, 13)))
    magic1[16] = 1
    a = good1 + bytes(crc) + undecodable + good2
    b = good3 + cut
    _put(tmp_path, "obj", b"head" + a + b + magic1)
    entries = (
        IndexEntry(0, 7, "obj", ObjectType.WAL, 4, len(a), T0 + 7),
        IndexEntry(8, 12, "obj", ObjectType.WAL, 4 + len(a), len(b), T0 + 12),
        IndexEntry(13, 14, "obj", ObjectType.WAL, 4 + len(a) + len(b), len(magic1), T0 + 99),
    )
    return entries, {3: bytes(crc), 5: undecodable, 10: cut, 13: bytes(magic1)}


def _read_all(entries) -> tuple[ObjectRead, ...]:
    return (ObjectRead("obj", 4, 4 + sum(e.size for e in entries)),)


@pytest.mark.parametrize("first_offset", [0, 4])
def test_batches_that_do_not_decode_are_one_row_each_and_the_rest_is_kept(tmp_path, corrupt_wal, first_offset):
    entries, bad = corrupt_wal
    task = Task((Run("t", 3, entries, first_offset),), _read_all(entries))
    result = run_task(_context(tmp_path), task)
    rows = _rows([result])
    good = {o: r for o, r in enumerate(_records(10, 0)) if o not in (3, 4, 5)}
    # Each at its batch's last offset (a read of any of its offsets finds it), the batch's first as its base.
    malformed_at = {4: 3, 5: 5, 12: 10, 14: 13}
    assert [row["kafka"]["offset"] for row in rows] == sorted(o for o in (*good, *malformed_at) if o >= first_offset)
    for row in rows:
        offset, kafka = row["kafka"]["offset"], row["kafka"]
        assert kafka["partition"] == 3
        if offset in good:
            key, value, headers, timestamp = good[offset]
            assert (row["key_raw"], row["value_raw"], row["value_error"], kafka["timestamp"]) == (key, value, None, ms(timestamp))
            assert row["headers"] == [{"key": k, "value": v, "key_bytes": None} for k, v in headers]
            continue
        batch_offset = malformed_at[offset]
        assert (row["key_raw"], row["headers"], row["value_schema_id"], kafka["batch_base_offset"]) == (None, [], None, batch_offset)
        assert row["value_raw"] == bad[batch_offset], offset
        assert row["value_error"].startswith("batch does not decode: ")
        assert {3: "fails its CRC-32C", 5: "records do not decode", 10: "does not fit", 13: "magic 1"}[batch_offset] in row["value_error"]
        # a batch whose framing is sound is served back as stored; bytes that are no batch are not
        assert kafka["stored_batch"] is (batch_offset in (3, 5)), offset
    by_offset = {row["kafka"]["offset"]: row["kafka"] for row in rows}
    # Header fields where they parse: all of the CRC failure's, the undecodable and the cut batch's; none of magic 1's.
    crc_row = by_offset[4]
    assert (crc_row["producer_id"], crc_row["producer_epoch"], crc_row["base_sequence"], crc_row["batch_compression"], crc_row["timestamp"]) == (7, 1, 3, "gzip", ms(T0 + 3))
    assert (by_offset[5]["producer_id"], by_offset[5]["base_sequence"], by_offset[5]["timestamp"]) == (7, 5, ms(T0 + 5))
    assert (by_offset[12]["producer_id"], by_offset[12]["batch_compression"], by_offset[12]["timestamp"]) == (8, "none", ms(T0 + 10))
    assert (by_offset[14]["producer_id"], by_offset[14]["batch_magic"], by_offset[14]["batch_compression"], by_offset[14]["timestamp"]) == (-1, 1, "unknown", ms(T0 + 99))
    assert result.partition_outcomes == {3: {COLUMNS: 0, COLUMNS_RAW: 0, RAW: sum(o >= first_offset for o in good), TOMBSTONE: 0, MALFORMED: 4}}
    assert [(p, o) for p, o, _ in result.malformed] == [(3, o) for o in sorted(malformed_at)]
    assert result.bytes_read == sum(e.size for e in entries)
    assert [f.offsets[3].first for f in result.files] == [first_offset]
    assert sum(f.record_count for f in result.files) == len(rows)


@pytest.mark.parametrize("schemas", [{}, {1: (json.dumps(EVENT), None)}], ids=["raw topic", "topic with a schema"])
def test_a_batch_whose_records_cannot_become_rows_is_one_row_served_back_as_stored(tmp_path, schemas):
    """A poison batch (sound framing and CRC; a record whose offset delta runs past the batch's
    range and past int64) never fails the task: it is one row holding the batch, at its last
    offset, and the rebuild serves it back as the WAL does, the batches around it too."""
    body = b"\x00" + zigzag_varint(0) + zigzag_varint(2**63 - 1) + zigzag_varint(-1) + zigzag_varint(1) + b"v" + zigzag_varint(0)
    poison = frame_batch(zigzag_varint(len(body)) + body, record_count=1, last_offset_delta=0, base_timestamp=T0, max_timestamp=T0, producer_id=7, producer_epoch=1, base_sequence=1)
    data = make_batch(_records(1, 0), producer_id=7, producer_epoch=1) + poison + make_batch(_records(2, 2), producer_id=7, producer_epoch=1, base_sequence=2)
    _put(tmp_path, "obj", data)
    entry = IndexEntry(0, 3, "obj", ObjectType.WAL, 0, len(data), T0 + 3)
    context = dataclasses.replace(_context(tmp_path), schemas=schemas)
    result = run_task(context, Task((Run("t", 0, (entry,), 0),), (ObjectRead("obj", 0, len(data)),)))
    rows = _rows([result])
    assert [row["kafka"]["offset"] for row in rows] == [0, 1, 2, 3]
    stored = rows[1]
    assert (stored["kafka"]["stored_batch"], stored["value_raw"], stored["kafka"]["batch_base_offset"]) == (True, poison, 1)
    assert "outside 1-1" in stored["value_error"]
    assert [(p, o) for p, o, _ in result.malformed] == [(0, 1)]
    table = pa.concat_tables([pq.read_table(f.path, partitioning=None) for f in result.files])
    table = table.take(pc.sort_indices(pc.struct_field(table.column("kafka"), "offset")))
    assert bytes(rebuild_run(table, "producer", {}, complete=True).data) == bytes(inject_offsets(data, 0))


def test_a_failed_task_deletes_its_files_and_so_do_the_tasks_before_it(tmp_path, corrupt_wal):
    entries, _ = corrupt_wal
    reads = _read_all(entries)
    good = Task((Run("t", 0, entries, 0),), reads)
    # The same offsets twice in one task: the writer refuses the second run after files were opened.
    twice = Task((Run("t", 1, entries, 0), Run("t", 1, entries, 0)), reads)
    with pytest.raises(ValueError, match="offset order"):
        run_task(_context(tmp_path), twice)
    assert _parquet_files(tmp_path / "data") == []
    with pytest.raises(CycleTaskError, match="ValueError: .*offset order"):
        run_tasks_in_process(_context(tmp_path), [good, twice])
    assert _parquet_files(tmp_path / "data") == []
    (result,) = run_tasks_in_process(_context(tmp_path), [good])
    assert [Path(f.path.removeprefix("file://")) for f in result.files] == _parquet_files(tmp_path / "data")
    assert all(Path(f.path).name.startswith("c0-00000-0-") for f in result.files)


def test_a_task_whose_object_cannot_be_read_fails_after_writing_what_it_read_and_leaves_no_file(tmp_path, corrupt_wal):
    """A task's reads land on a thread of their own while it writes the rows of those already read:
    a read that fails fails the task at the entry that needs it, and the files it wrote before are
    deleted."""
    entries, _ = corrupt_wal
    _put(tmp_path, "other", (tmp_path / "objects" / "obj").read_bytes())
    moved = [dataclasses.replace(e, object_key="other") for e in entries]
    missing = [dataclasses.replace(e, object_key="gone") for e in entries]
    # partition 0 from the object that is there, then partition 1 from one that is not
    task = Task((Run("t", 0, moved, 0), Run("t", 1, missing, 0)), (ObjectRead("other", 4, 4 + sum(e.size for e in entries)), ObjectRead("gone", 4, 4 + sum(e.size for e in entries))))
    with pytest.raises(ObjectNotFound, match="gone"):
        run_task(_context(tmp_path), task)
    assert _parquet_files(tmp_path / "data") == []
    (result,) = run_tasks_in_process(_context(tmp_path), [Task((Run("t", 0, moved, 0),), task.reads[:1])])
    assert result.bytes_read == sum(e.size for e in entries) and result.rows == sum(f.record_count for f in result.files) > 0


def test_context_and_results_pickle(tmp_path, corrupt_wal):
    entries, _ = corrupt_wal
    context = dataclasses.replace(_context(tmp_path), schemas={1: (json.dumps(EVENT), None)})
    assert pickle.loads(pickle.dumps(context)) == context
    result = run_task(context, Task((Run("t", 0, entries, 0),), _read_all(entries)), index=2, attempt=1)
    back = pickle.loads(pickle.dumps(result))
    assert (back.files, back.partition_outcomes, back.malformed, back.index, back.attempt) == (result.files, result.partition_outcomes, result.malformed, 2, 1)
    assert all(Path(f.path).name.startswith("c0-00002-1-") for f in result.files)


# -- records from a real client through `neve dev` ------------------------------------------------


async def _index(data_dir: Path, topic: str) -> dict[tuple[str, int], list[IndexEntry]]:
    store = load_metadata_store(f"sqlite:///{data_dir.resolve() / 'metadata.db'}")
    await store.start()
    try:
        info = store.topics()[topic]
        out = {}
        for partition in range(info.partitions):
            entries: list[IndexEntry] = []
            while more := store.entries(info.topic_id, partition, entries[-1].last_offset + 1 if entries else 0, 1000):
                entries += more
            out[(topic, partition)] = entries
        return out
    finally:
        await store.close()


def _table(catalog, topic: str, schemas: dict[int, tuple[str, None]]):
    """The topic's table as the service makes it: created raw, each writer schema's value type unioned in."""
    raw = table_schema()
    table = catalog.create_table(("neve", topic), schema=raw, partition_spec=partition_spec(raw))
    for schema_id in sorted(schemas):
        layout = writer_schema(schema_id, schemas[schema_id][0]).layout
        with table.update_schema() as update:
            update.union_by_name(union_schema(layout.iceberg))
    return table


def compact(node, tmp_path: Path, produced: list[Produced], run) -> dict[str, tuple[list[dict], list[TaskResult], object]]:
    catalog = load_catalog(CompactorConfig(catalog_url=f"sqlite:///{tmp_path / 'catalog.db'}"))
    catalog.create_namespace("neve")
    out = {}
    for p in produced:
        entries = asyncio.run(_index(Path(node.data_dir), p.topic))
        cycle = plan(entries, {}, now_ms=int(time.time() * 1000), freshness_ms=0, parallelism=3, min_task_bytes=1)
        assert len(cycle.tasks) > 1
        table = _table(catalog, p.topic, p.schemas)
        context = TaskContext.for_table(table, cycle_id=uuid.uuid4().hex, topic=p.topic, objects_url=f"file://{Path(node.data_dir).resolve() / 'objects'}", schemas=p.schemas)
        results = run(context, list(cycle.tasks))
        out[p.topic] = (_rows(results), results, table)
    return out


def check(p: Produced, rows: list[dict], results: list[TaskResult], table) -> None:
    check_rows(p, rows)
    wanted: dict[int, dict[str, int]] = {}
    for (partition, _), want in p.want.items():
        counts = wanted.setdefault(partition, dict.fromkeys((COLUMNS, COLUMNS_RAW, RAW, TOMBSTONE, MALFORMED), 0))
        counts[want.outcome] += 1
    got: dict[int, dict[str, int]] = {}
    for result in results:
        for partition, counts in result.partition_outcomes.items():
            for outcome, n in counts.items():
                got.setdefault(partition, dict.fromkeys(counts, 0))[outcome] += n
    assert got == wanted
    assert {o: sum(r.outcomes[o] for r in results) for o in (COLUMNS, COLUMNS_RAW, RAW, TOMBSTONE, MALFORMED)} == {o: sum(c[o] for c in wanted.values()) for o in (COLUMNS, COLUMNS_RAW, RAW, TOMBSTONE, MALFORMED)}
    # Each partition's rows in the files, by the offset spans a manifest records
    for partition in wanted:
        assert sum(f.offsets[partition].rows for r in results for f in r.files if partition in f.offsets) == sum(wanted[partition].values())
    assert all(r.bytes_read > 0 for r in results)
    # The DataFiles a committer appends: pyiceberg reads back the same offsets.
    with table.transaction() as txn, txn.update_snapshot().fast_append() as append:
        for result in results:
            for written in result.files:
                append.append_data_file(written.data_file(table.spec()))
    scanned = table.scan(selected_fields=("kafka",)).to_arrow().column("kafka").to_pylist()
    assert sorted((k["partition"], k["offset"]) for k in scanned) == sorted(p.want)


@pytest.fixture
def produced(neve_factory):
    port = free_port()
    node = neve_factory(env={"NEVE_REGISTRY_PORT": str(port), "NEVE_WAL_LINGER_MS": "5"})
    topics = [produce_raw(node.bootstrap), produce_avro(node.bootstrap, f"http://127.0.0.1:{port}")]
    assert node.stop() == 0
    return node, topics


@pytest.mark.integration
def test_records_from_a_client_become_one_row_per_offset(produced, tmp_path):
    node, topics = produced
    for p, (rows, results, table) in zip(topics, compact(node, tmp_path, topics, run_tasks_in_process).values(), strict=True):
        check(p, rows, results, table)


@pytest.mark.integration
@pytest.mark.xdist_group("spark")
def test_the_same_rows_through_spark(produced, tmp_path, spark_session):
    node, topics = produced
    for p, (rows, results, table) in zip(topics, compact(node, tmp_path, topics, lambda c, t: run_tasks(spark_session, c, t)).values(), strict=True):
        assert [r.index for r in results] == list(range(len(results)))
        check(p, rows, results, table)


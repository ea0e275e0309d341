"""table/serve.py over files with small row groups: batches that cross row groups, a partition's
offsets spread over two files (as day partitions spread them), another partition's rows among them,
and rows deleted by another engine. Every fetch offset, with any byte budget, fetch after fetch,
gives exactly the batches that hold the offsets from there on, each whole, each once."""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cache.reader import ObjectReader
from cache.recent import RecentObjects
from compactor.files.job import TaskContext, run_task
from compactor.files.layout import arrow_schema, partition_spec, rows_to_arrow, table_schema
from compactor.files.planner import ObjectRead, Run, Task
from compactor.rows.records import Batch, Record, decode_records, iter_batches
from compactor.rows.translator import kafka_columns, translate
from metadata.model import IndexEntry, ObjectType
from table.files import TableFiles
from table.parquet import ParquetRows
from table.serve import CompactedReader
from tests.batches import frame_batch, make_batch
from wal.batch import BATCH_HEADER, LOG_OVERHEAD, inject_offsets, iter_headers
from wal.manifest import CycleManifest, FileSlice, PartitionCompaction, WalRange, new_cycle_id
from wal.store import MemoryObjectStore

TOPIC_ID = uuid.uuid4()
ROW_GROUP = 7  # rows per row group: most batches cross one


def produced(partition: int, count: int, seed: int) -> list[tuple[Batch, list[Record]]]:
    """Batches of 1-20 records with offsets 0..count-1 and timestamps on two days."""
    rng = random.Random(seed)
    out, offset = [], 0
    while offset < count:
        n = min(rng.randint(1, 20), count - offset)
        ts = 1_700_000_000_000 + rng.choice((0, 86_400_000)) + offset
        batch = Batch(0, 0, 0, offset, 0, 2, rng.choice((0, 1, 2, 3, 4)), n - 1, ts, ts + n, 1000 + partition, 3, offset, n)
        records = [Record(offset + i, ts + i, b"k%d" % (offset + i) if i % 3 else None, None if i % 5 == 4 else b"v%d " % (offset + i) * (i + 1), (("h", b"%d" % i),) if i % 2 else ()) for i in range(n)]
        out.append((batch, records))
        offset += n
    return out


def rows_of(partition: int, batches, keep=lambda offset: True) -> list[dict]:
    rows = []
    for batch, records in batches:
        kafka = kafka_columns(partition, batch)
        rows += [translate(r, kafka, None)[0] for r in records if keep(r.offset)]
    return rows


def write(path: Path, rows: list[dict], row_group: int = ROW_GROUP) -> None:
    schema = arrow_schema(table_schema())
    pq.write_table(pa.Table.from_batches([rows_to_arrow(rows, schema)]), path, row_group_size=row_group, compression="zstd")


def served(data: bytes | None) -> list[tuple[int, list[Record]]]:
    out, view, pos = [], memoryview(data or b""), 0
    while pos < len(view):
        base, length = BATCH_HEADER.unpack_from(view, pos)[:2]
        one = view[pos : pos + LOG_OVERHEAD + length]
        (batch,) = iter_batches(one, base)
        out.append((base, decode_records(one, batch)))
        pos += len(one)
    return out


@pytest.fixture
def table(tmp_path):
    """Partition 0's 300 offsets over two files by the day of their batch (the batches of each day
    in one file, so both files' offsets run 0..299 with holes), partition 1's rows in the first
    file before partition 0's; offsets 120-140 of partition 0 deleted by "another engine"."""
    p0, p1 = produced(0, 300, 1), produced(1, 50, 2)
    deleted = range(120, 141)
    day = {b.base_offset: (b.base_timestamp // 86_400_000) % 2 for b, _ in p0}
    first = rows_of(1, p1) + rows_of(0, [(b, r) for b, r in p0 if day[b.base_offset] == 0], keep=lambda o: o not in deleted)
    second = rows_of(0, [(b, r) for b, r in p0 if day[b.base_offset] == 1], keep=lambda o: o not in deleted)
    paths = [tmp_path / "day0.parquet", tmp_path / "day1.parquet"]
    write(paths[0], first)
    write(paths[1], second)
    manifest = CycleManifest(
        new_cycle_id(), TOPIC_ID, "t", "neve.t",
        (PartitionCompaction(0, (WalRange("wal/x", 0, 30_000, 0, 299, 0),), tuple(FileSlice(p.as_uri(), 0, 1, 0, 299) for p in paths)),),
    )  # fmt: skip
    wal = MemoryObjectStore()
    asyncio.run(wal.put(manifest.key, manifest.encode()))
    entry = IndexEntry(0, 299, manifest.key, ObjectType.PARQUET, 0, 30_000, 0)
    want = [(b.base_offset, [r for r in records if r.offset not in deleted]) for b, records in p0]
    return wal, entry, [w for w in want if w[1]]


def reader_over(wal: MemoryObjectStore, cache_bytes: int) -> CompactedReader:
    objects = ObjectReader(wal, RecentObjects(0))
    return CompactedReader(objects, ParquetRows(TableFiles(objects, "memory://")), schema_of=None, cache_bytes=cache_bytes)


@pytest.mark.parametrize("budget", [1, 700, 1_000_000])
def test_every_offset_reads_the_batches_from_there_fetch_after_fetch(table, budget):
    wal, entry, want = table

    async def check():
        for cache_bytes in (0, 64 << 20):  # nothing kept between fetches, and the usual cache
            reader = reader_over(wal, cache_bytes)
            for offset in range(0, 300, 7):
                got, at, complete = [], offset, False
                while not complete:
                    data, complete = await reader.read(TOPIC_ID, 0, entry, at, budget, first=True)
                    batches = served(data)
                    assert batches or complete, f"nothing served at {at}"
                    got += batches
                    if batches:
                        at = batches[-1][1][-1].offset + 1
                expected = [w for w in want if w[1][-1].offset >= offset]
                assert got == expected, (offset, budget, cache_bytes)

    asyncio.run(check())


def test_timestamps_are_found_in_offset_order(table):
    wal, entry, want = table
    reader = reader_over(wal, 64 << 20)
    records = [r for _, rs in want for r in rs]
    for target in sorted({r.timestamp for r in records})[::5] + [records[-1].timestamp + 10**9]:
        first = next(((r.offset, r.timestamp) for r in records if r.timestamp >= target), None)
        assert asyncio.run(reader.offset_for_timestamp(TOPIC_ID, 0, entry, target)) == first


@pytest.mark.parametrize("cache_bytes", [64 << 20, 3000])
def test_the_next_run_is_rebuilt_ahead_and_no_row_is_read_twice(table, cache_bytes):
    """While a consumer is served from one run, the next is rebuilt: once those reads ahead are
    done, each following fetch is answered without reading a file, and reading the partition
    through decodes each of its rows once (the cut batch carried from run to run); also when the
    cache has room for a few runs only (runs read past make room, the one being read stays)."""
    wal, entry, want = table

    async def check():
        reader = reader_over(wal, cache_bytes)
        decoded, original = [], reader.rows.read

        async def read(path, partition, lo, hi, columns):
            rows = await original(path, partition, lo, hi, columns)
            if rows is not None and columns:
                decoded.extend(rows.column("kafka").combine_chunks().field("offset").to_pylist())
            return rows

        reader.rows.read = read
        got, at, complete, reads_while_ready = [], 0, False, 0
        while not complete:
            await asyncio.gather(*reader._ahead)
            before = len(decoded)
            data, complete = await reader.read(TOPIC_ID, 0, entry, at, 1, first=True)
            reads_while_ready += (len(decoded) != before) and at > 0
            batches = served(data)
            got += batches
            if batches:
                at = batches[-1][1][-1].offset + 1
        assert got == want
        assert sorted(decoded) == sorted({r.offset for _, rs in want for r in rs})  # each row once
        assert reads_while_ready == 0
        await reader.close()

    asyncio.run(check())


CYCLE_GROUP = 60  # rows per row group of the cycle file: most partitions' rows lie in one


@pytest.fixture
def cycle(tmp_path):
    """One cycle's file as the compactor writes it: 12 partitions of 3-40 records each, partition
    by partition, in row groups of 60 rows (so most partitions lie in one row group and some
    cross into the next); partition 5 lost a whole batch and two rows of others to "another
    engine"; partition 9's index entry ends with the batch holding its offset 9 (the rest in a
    later entry: its run over the whole cycle must not serve past it)."""
    rng = random.Random(7)
    produced_by = {p: produced(p, 30 if p == 9 else rng.randint(3, 40), 100 + p) for p in range(12)}
    deleted = {5: {b.base_offset + i for b, _ in produced_by[5][1:2] for i in range(b.last_offset_delta + 1)} | {0}, 8: {2}}
    rows = [row for p in range(12) for row in rows_of(p, produced_by[p], keep=lambda o, p=p: o not in deleted.get(p, ()))]
    path = tmp_path / "cycle.parquet"
    write(path, rows, CYCLE_GROUP)
    last = {p: sum(len(r) for _, r in batches) - 1 for p, batches in produced_by.items()}
    manifest = CycleManifest(
        new_cycle_id(), TOPIC_ID, "t", "neve.t",
        tuple(PartitionCompaction(p, (WalRange("wal/x", 0, 30_000, 0, last[p], 0),), (FileSlice(path.as_uri(), 0, 1, 0, last[p]),)) for p in range(12)),
    )  # fmt: skip
    wal = MemoryObjectStore()
    asyncio.run(wal.put(manifest.key, manifest.encode()))
    # partition 9's entry ends with the batch holding offset 9 (batches never cross entries)
    ends = {p: last[p] for p in range(12)} | {9: next(b.base_offset + b.last_offset_delta for b, _ in produced_by[9] if b.base_offset + b.last_offset_delta >= 9)}
    entries = {p: IndexEntry(0, ends[p], manifest.key, ObjectType.PARQUET, 0, 30_000, 0) for p in range(12)}
    want = {p: [w for w in ((b.base_offset, [r for r in rs if r.offset not in deleted.get(p, ())]) for b, rs in produced_by[p]) if w[1] and w[0] <= entries[p].last_offset] for p in range(12)}
    return wal, entries, want


def test_a_row_groups_partitions_are_rebuilt_together_byte_for_byte_as_each_alone(cycle):
    """Reading every partition of a cycle file from any offset with any budget: the same bytes as
    rebuilding each partition's own rows (the window's way), and exactly the batches from there;
    the partitions whose rows lie in one row group are served without reading their rows apart,
    once one of them was read."""
    wal, entries, want = cycle

    async def read_all(reader, partition, offset, budget):
        pieces, at, complete = [], offset, False
        while not complete:
            data, complete = await reader.read(TOPIC_ID, partition, entries[partition], at, budget, first=True)
            pieces.append(data or b"")
            batches = served(data)
            if batches:
                at = batches[-1][1][-1].offset + 1
        return b"".join(pieces)

    async def check():
        for cache_bytes in (0, 64 << 20):
            for budget in (1, 500, 1_000_000):
                grouped, alone = reader_over(wal, cache_bytes), reader_over(wal, cache_bytes)

                async def no_group(*args):
                    return None

                alone._grouped = no_group
                read_apart, original = [], grouped.rows.read

                async def read(path, partition, lo, hi, columns, original=original, read_apart=read_apart):
                    read_apart.append(partition)
                    return await original(path, partition, lo, hi, columns)

                grouped.rows.read = read
                for partition in range(12):
                    for offset in sorted({0, 1, 7, entries[partition].last_offset}):
                        data = await read_all(grouped, partition, offset, budget)
                        assert data == await read_all(alone, partition, offset, budget), (partition, offset, budget, cache_bytes)
                        assert served(data) == [w for w in want[partition] if w[1][-1].offset >= offset], (partition, offset, budget)
                # what is counted is what is kept: a row group's runs share one buffer, counted once
                assert grouped._cached == sum(kept.size for kept in grouped._runs.values())
                assert grouped._cached <= cache_bytes or len(grouped._runs) == 1
                # the runs consumers are on are among the runs kept, not every partition ever read
                assert set(grouped._serving.values()) <= {key for key, kept in grouped._runs.items() for key in (kept.runs if hasattr(kept, "runs") else (key,))}
                if cache_bytes:
                    footer = await grouped.rows.footer((await grouped._parts_of(entries[0].object_key))[0].slices[0].path)
                    whole = {p for p in range(12) if sum(g.may_hold(p, 0, 10**6) for g in footer.row_groups) == 1}
                    assert len(whole) >= 6 and not whole & set(read_apart), (whole, read_apart)

    asyncio.run(check())


def test_a_batch_kept_as_stored_is_served_whole_from_any_of_its_offsets(tmp_path):
    """A batch whose records are no rows is one row at its last offset (compactor/files/job.py): a fetch
    from any of its offsets gets it whole, as the WAL gave it, then the batches after it."""
    t0 = 1_700_000_000_000
    batches = [
        make_batch([(b"k%d" % i, b"v%d" % i, [], t0 + i) for i in range(3)]),
        frame_batch(b"\xd0\x0f" + b"x" * 10, record_count=3, last_offset_delta=2, base_timestamp=t0 + 3, max_timestamp=t0 + 5),  # records that do not decode
        make_batch([(b"k%d" % i, b"v%d" % i, [], t0 + i) for i in range(6, 8)]),
    ]
    data = b"".join(batches)
    (tmp_path / "objects").mkdir()
    (tmp_path / "objects" / "wal").write_bytes(data)
    schema = table_schema()
    context = TaskContext(
        cycle_id="c", topic="t", objects_url=f"file://{tmp_path / 'objects'}", data_location=f"file://{tmp_path / 'data'}", io_properties={},
        table_schema=schema.model_dump_json(), partition_spec=partition_spec(schema).model_dump_json(), table_properties={},
    )  # fmt: skip
    result = run_task(context, Task((Run("t", 0, (IndexEntry(0, 7, "wal", ObjectType.WAL, 0, len(data), 0),), 0),), (ObjectRead("wal", 0, len(data)),)))
    (written,) = result.files
    rows = pq.read_table(written.path.removeprefix("file://"), partitioning=None)
    assert rows.column("kafka").combine_chunks().field("offset").to_pylist() == [0, 1, 2, 5, 6, 7]
    path = tmp_path / "rows.parquet"
    pq.write_table(rows, path, row_group_size=2)  # the stored batch's row in a row group of its own
    manifest = CycleManifest(
        new_cycle_id(), TOPIC_ID, "t", "neve.t", (PartitionCompaction(0, (WalRange("wal/x", 0, len(data), 0, 7, 0),), (FileSlice(path.as_uri(), 0, 6, 0, 7),)),),
    )  # fmt: skip
    wal = MemoryObjectStore()
    asyncio.run(wal.put(manifest.key, manifest.encode()))
    entry = IndexEntry(0, 7, manifest.key, ObjectType.PARQUET, 0, len(data), 0)
    firsts = [0, 3, 6]

    async def check():
        for budget in (1, 1_000_000):  # a batch a fetch, or all at once
            reader = reader_over(wal, 64 << 20)
            for offset in range(8):
                got, at, complete = b"", offset, False
                while not complete and at <= 7:
                    served_bytes, complete = await reader.read(TOPIC_ID, 0, entry, at, budget, first=True)
                    got += bytes(served_bytes or b"")
                    headers = list(iter_headers(got))
                    at = headers[-1].base_offset + headers[-1].last_offset_delta + 1 if headers else at
                k = max(i for i, f in enumerate(firsts) if f <= offset)
                assert got == bytes(inject_offsets(b"".join(batches[k:]), firsts[k])), (offset, budget)

    asyncio.run(check())

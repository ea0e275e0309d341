"""table/parquet.py: a partition's rows from a file whose row groups hold many partitions' rows
(a compaction cycle writes every partition of a topic into one file). Each partition's reader
gets exactly its rows in offset order, and a row group is decoded once for all of them while it
is kept; another engine's file (rows in no order) gives the same rows."""

from __future__ import annotations

import asyncio
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import table.parquet as parquet_module
from cache.chunks import ZoneChunks
from cache.reader import ObjectReader
from cache.recent import RecentObjects
from compactor.files.layout import arrow_schema, rows_to_arrow, table_schema
from compactor.rows.records import Batch, Record
from compactor.rows.translator import kafka_columns, translate
from table.files import TableFiles
from table.parquet import ParquetRows
from wal.store import MemoryObjectStore

PARTITIONS, PER_PARTITION = 40, 30


def rows() -> list[dict]:
    out = []
    for p in range(PARTITIONS):
        for o in range(PER_PARTITION):
            batch = Batch(0, 0, 0, o, 0, 2, 0, 0, 1000 + o, 1000 + o, -1, -1, -1, 1)
            out.append(translate(Record(o, 1000 + o, None, b"%d-%d" % (p, o), ()), kafka_columns(p, batch), None)[0])
    return out


@pytest.fixture(params=["partition by partition", "shuffled"])
def path(request, tmp_path):
    data = rows()
    if request.param == "shuffled":  # another engine's file: rows in no order
        random.Random(7).shuffle(data)
    path = tmp_path / "f.parquet"
    # two row groups, each holding many partitions' rows
    pq.write_table(pa.Table.from_batches([rows_to_arrow(data, arrow_schema(table_schema()))]), path, row_group_size=PARTITIONS * PER_PARTITION // 2)
    return path


def test_each_partition_reads_its_rows_and_each_row_group_is_decoded_once(path, monkeypatch):
    decodes = []
    real = parquet_module._decode
    monkeypatch.setattr(parquet_module, "_decode", lambda footer, pieces, group, columns: decodes.append(group) or real(footer, pieces, group, columns))
    objects = ObjectReader(MemoryObjectStore(), RecentObjects(0))
    reader = ParquetRows(TableFiles(objects, "memory://"))

    async def read_all():
        return await asyncio.gather(*(reader.read(path.as_uri(), p, 5, 24, ["value_raw"]) for p in range(PARTITIONS)))

    got = asyncio.run(read_all())
    for p, table in enumerate(got):
        kafka = table.column("kafka").combine_chunks()
        assert kafka.field("partition").to_pylist() == [p] * 20
        assert kafka.field("offset").to_pylist() == list(range(5, 25))
        assert table.column("value_raw").to_pylist() == [b"%d-%d" % (p, o) for o in range(5, 25)]
    assert sorted(decodes) == sorted(set(decodes))  # no row group twice


def test_a_row_group_is_decoded_again_once_evicted(path, monkeypatch):
    decodes = []
    real = parquet_module._decode
    monkeypatch.setattr(parquet_module, "_decode", lambda footer, pieces, group, columns: decodes.append(group) or real(footer, pieces, group, columns))
    objects = ObjectReader(MemoryObjectStore(), RecentObjects(0))
    reader = ParquetRows(TableFiles(objects, "memory://"), decoded_bytes=0)  # keeps one only

    async def read(p):
        return await reader.read(path.as_uri(), p, 0, PER_PARTITION - 1, [])

    for p in (0, PARTITIONS - 1, 0):
        assert asyncio.run(read(p)).column("kafka").combine_chunks().field("partition").to_pylist() == [p] * PER_PARTITION
    assert len(decodes) > len(set(decodes))


class GetsStore(MemoryObjectStore):
    """Remembers every GET's range and the bytes object it answered with."""

    def __init__(self) -> None:
        super().__init__()
        self.gets: list[tuple[int, int | None]] = []
        self.answers: list[bytes] = []

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = await super().get(key, start, end)
        self.gets.append((start, end))
        self.answers.append(data)
        return data


@pytest.mark.parametrize("ahead", [parquet_module.READ_AHEAD, 0])
def test_through_the_zone_chunks_row_groups_across_chunk_edges_are_read_once_and_decoded_from_views_of_the_gets(tmp_path, monkeypatch, ahead):
    monkeypatch.setattr(parquet_module, "READ_AHEAD", ahead)
    data = [dict(r, value_raw=random.Random(i).randbytes(700)) for i, r in enumerate(rows())]  # incompressible: row groups of ~100 KB
    path = tmp_path / "f.parquet"
    pq.write_table(pa.Table.from_batches([rows_to_arrow(data, arrow_schema(table_schema()))]), path, row_group_size=PARTITIONS * PER_PARTITION // 8)
    file = path.read_bytes()
    chunk = 64 * 1024  # smaller than a row group: each crosses chunk edges
    store = GetsStore()
    asyncio.run(store.put("warehouse/f.parquet", file))
    objects = ObjectReader(store, RecentObjects(0), chunks=ZoneChunks(store, RecentObjects(0), node_id=0, members=lambda: [], chunk_bytes=chunk, memory_bytes=64 * chunk))
    reader = ParquetRows(TableFiles(objects, "s3://bucket/"))
    given = []
    real = parquet_module._decode
    monkeypatch.setattr(parquet_module, "_decode", lambda footer, pieces, group, columns: given.append(pieces) or real(footer, pieces, group, columns))

    async def read_all():
        return await asyncio.gather(*(reader.read("s3://bucket/warehouse/f.parquet", p, 0, PER_PARTITION - 1, ["value_raw"]) for p in range(PARTITIONS)))

    for p, table in enumerate(asyncio.run(read_all())):
        assert table.column("kafka").combine_chunks().field("offset").to_pylist() == list(range(PER_PARTITION))
        assert table.column("value_raw").to_pylist() == [data[p * PER_PARTITION + o]["value_raw"] for o in range(PER_PARTITION)]
    assert len(given) == 8
    # each chunk of the file read once, in aligned GETs
    read = sorted(c for start, end in store.gets for c in range(start, min(end, len(file)), chunk))
    assert read == sorted(set(read)) and all(start % chunk == 0 for start, _ in store.gets)
    if ahead:
        # the footer's chunk, then the rest in one run: a row group's column chunks are views of
        # a GET's bytes, joined (a copy) only for a row group across two GETs' bytes
        assert len(store.gets) <= 3
        joined = [(min(pieces), max(s + len(v) for s, v in pieces.items())) for pieces in given if not all(isinstance(v, memoryview) and any(v.obj is answer for answer in store.answers) for v in pieces.values())]
        assert all(any(lo < g < hi for g, _ in store.gets) for lo, hi in joined)
        assert len(joined) <= len(store.gets) - 1

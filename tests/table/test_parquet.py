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
from cache.reader import ObjectReader
from cache.recent import RecentObjects
from compactor.layout import arrow_schema, rows_to_arrow, table_schema
from compactor.records import Batch, Record
from compactor.translator import kafka_columns, translate
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

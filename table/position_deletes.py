"""Which rows of a table's data file its position-delete files delete (Iceberg v2: rows named by
data file path and 0-based position), so that the Kafka view of an upsert table skips the rows
the table's readers do not see. Delete files are small (two columns, one row per deleted row):
each is read whole, in one GET, through the table's files as ParquetRows reads data files, and
decoded off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .files import TableFiles

FILE_PATH, POS = "file_path", "pos"  # the Iceberg spec's columns of a position-delete file (ids 2147483546, 2147483545)


async def read_positions(files: TableFiles, delete_paths: Sequence[str], data_path: str) -> np.ndarray:
    """The positions (int64, sorted, unique) of `data_path`'s rows that the position-delete files
    at `delete_paths` delete; empty when none does."""
    contents = await asyncio.gather(*(_read_whole(files, path) for path in delete_paths))
    return await asyncio.to_thread(positions_in, contents, data_path)


async def _read_whole(files: TableFiles, path: str) -> bytes | memoryview:
    reader, key = files.locate(path)
    return await reader.read(key, 0, await files.size(path))


def positions_in(delete_files: Iterable[bytes | memoryview], data_path: str) -> np.ndarray:
    """positions of `data_path`'s rows deleted by the position-delete files whose bytes are
    `delete_files` (read_positions, once they are read)."""
    found = []
    for content in delete_files:
        rows = pq.read_table(pa.BufferReader(content), columns=[FILE_PATH, POS], filters=pc.field(FILE_PATH) == data_path)
        found.append(rows.column(POS).to_numpy().astype(np.int64, copy=False))
    return np.unique(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)

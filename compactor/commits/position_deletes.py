"""Iceberg v2 position-delete files: the rows of earlier data files (and of a cycle's own) that a
newer row of the same key supersedes, or a tombstone deletes, named by data file path and row
position, so that an upsert table keeps one row per live key without rewriting the files that
hold the others. One Parquet file per partition value (the spec scopes a delete file to one), its
rows sorted by file_path then pos, with the bounds of file_path that Java, Spark and pyiceberg use
to tell which data files a delete file applies to.

Synchronous (pyarrow and pyiceberg's FileIO are): the caller runs it off the event loop.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.types import StringType

# The reserved field ids and names of a position-delete file's columns (Iceberg spec, "Position
# Delete Files"): readers find the columns by these ids.
FILE_PATH_ID, POS_ID = 2147483546, 2147483545
FILE_PATH, POS = "file_path", "pos"
ARROW_SCHEMA = pa.schema([
    pa.field(FILE_PATH, pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID).encode()}),
    pa.field(POS, pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID).encode()}),
])  # fmt: skip


def write_position_deletes(
    io: FileIO,
    data_location: str,
    spec: PartitionSpec,
    schema: Schema,
    deletes: Sequence[tuple[DataFile, Sequence[int]]],
    *,
    name_prefix: str,
    specs: Mapping[int, PartitionSpec] | None = None,
    format_version: int = 2,
) -> list[DataFile]:
    """Write the deletes of rows `deletes` names ((data file, 0-based row positions in it)) as
    one position-delete file per partition value of those data files, under `data_location`
    (at the partition's path, as the data files are), named `<name_prefix>-deletes-<n>.parquet`:
    `name_prefix` must be unique per attempt (a uuid) for a retry never to overwrite a committed
    file. Returns their DataFiles (content POSITION_DELETES), to commit with the data files
    (committer.commit_cycle's delete_files). A data file of another spec than `spec` (the table's
    spec evolved) needs its spec in `specs` (table.specs())."""
    by_partition: dict[tuple[int, object], dict[str, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    for data_file, positions in deletes:
        if len(positions) == 0:
            continue
        by_partition[(data_file.spec_id, data_file.partition)][data_file.file_path].append(np.asarray(positions, dtype=np.int64))
    written = []
    for n, ((spec_id, partition), files) in enumerate(by_partition.items()):
        file_spec = _spec_of(spec_id, spec, specs)
        rows = _sorted_rows(files)
        directory = data_location.rstrip("/")
        if file_spec.fields:
            directory += "/" + file_spec.partition_to_path(partition, schema)
        path = f"{directory}/{name_prefix}-deletes-{n:05d}.parquet"
        with io.new_output(path).create(overwrite=False) as sink:
            pq.write_table(rows, sink, compression="zstd")
            size = sink.tell()
        written.append(_delete_file(path, size, file_spec.spec_id, partition, rows, format_version))
    return written


def _spec_of(spec_id: int, spec: PartitionSpec, specs: Mapping[int, PartitionSpec] | None) -> PartitionSpec:
    if spec_id == spec.spec_id:
        return spec
    if specs is not None and spec_id in specs:
        return specs[spec_id]
    raise ValueError(f"a data file of partition spec {spec_id} is deleted from, but only spec {spec.spec_id} was given: pass the table's specs")


def _sorted_rows(files: Mapping[str, list[np.ndarray]]) -> pa.Table:
    """The rows of one delete file: each data file's positions, unique and ascending, the data
    files in path order (the order the spec asks for: file_path, then pos)."""
    paths, positions = [], []
    for file_path in sorted(files):
        unique = np.unique(np.concatenate(files[file_path]))
        if unique[0] < 0:
            raise ValueError(f"negative row position {int(unique[0])} for {file_path}")
        paths.append(pa.array([file_path] * len(unique), pa.string()))
        positions.append(unique)
    return pa.Table.from_arrays([pa.chunked_array(paths, pa.string()), pa.array(np.concatenate(positions), pa.int64())], schema=ARROW_SCHEMA)


def _delete_file(path: str, size: int, spec_id: int, partition, rows: pa.Table, format_version: int) -> DataFile:
    # Bounds of file_path in full (not truncated, as Iceberg's metrics would truncate a data
    # column's): a file deleting from one data file has lower == upper, which readers take as the
    # one data file it applies to, and the others prune by the range.
    paths = rows.column(FILE_PATH)
    first, last = paths[0].as_py(), paths[len(paths) - 1].as_py()
    count = rows.num_rows
    delete_file = DataFile.from_args(
        _table_format_version=format_version,
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=count,
        file_size_in_bytes=size,
        value_counts={FILE_PATH_ID: count, POS_ID: count},
        null_value_counts={FILE_PATH_ID: 0, POS_ID: 0},
        lower_bounds={FILE_PATH_ID: to_bytes(StringType(), first)},
        upper_bounds={FILE_PATH_ID: to_bytes(StringType(), last)},
        sort_order_id=None,
        spec_id=spec_id,
        equality_ids=None,
        key_metadata=None,
    )
    delete_file.spec_id = spec_id  # from_args does not take it (pyiceberg 0.12)
    return delete_file


def referenced_paths(io: FileIO, delete_file: DataFile) -> set[str]:
    """The data file paths position-delete file `delete_file` names: its file_path bounds when
    they are one path (a file deleting from one data file), else its file_path column."""
    lower = (delete_file.lower_bounds or {}).get(FILE_PATH_ID)
    if lower is not None and lower == (delete_file.upper_bounds or {}).get(FILE_PATH_ID):
        return {lower.decode()}
    with io.new_input(delete_file.file_path).open() as f:
        paths = pq.read_table(f, columns=[FILE_PATH]).column(FILE_PATH)
    return {p for p in paths.unique().to_pylist()}

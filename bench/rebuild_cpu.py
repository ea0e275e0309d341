"""What rebuilding Kafka batches from the table's rows (table/rebuild.py) costs, per GiB of values,
apart from reading them: rows as the table serves them (Parquet written with the table's Arrow
schema, zstd, partition by partition, random values in batches of about 16 KiB, row groups of
about 8 MiB, read back one row group at a time), rebuilt as the catch-up rebuilds them
(`rebuild_run` on each partition's rows of a row group, the window's way; `rebuild_partitions` on
the row group, the held way).

`python -m bench.rebuild_cpu [--sizes 1024,100] [--mib 64] [--partitions 4] [--rounds 7]
[--against OLD_REBUILD_PY]`; one JSON line per value size: CPU-s per GiB of values (process time,
the least of the rounds), with --against the same for another copy of table/rebuild.py (say
`git show REV:table/rebuild.py > /tmp/old.py`), the two alternating in this process.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from compactor.files.layout import arrow_schema, table_schema
from table.layout import HEADERS, KAFKA, KEY_RAW, PARTITION, VALUE_RAW, VALUE_SCHEMA_ID

SCHEMA = arrow_schema(table_schema())
COLUMNS = [KAFKA, HEADERS, KEY_RAW, VALUE_RAW, VALUE_SCHEMA_ID]  # table/serve.py's GROUP_COLUMNS


def rows(value_size: int, mib: float, partitions: int, batch_bytes: int = 16384, seed: int = 0) -> pa.Table:
    """Keyless, headerless rows of random values, partition by partition, each in offset order."""
    rng = np.random.default_rng(seed)
    per = int(mib * 2**20) // value_size // partitions
    per_batch = max(1, batch_bytes // value_size)
    kafka_type = SCHEMA.field(KAFKA).type
    tables = []
    for p in range(partitions):
        offsets = np.arange(per, dtype=np.int64)
        bases = offsets - offsets % per_batch
        millis = 1_764_000_000_000 + offsets // 50

        def micros(ms: np.ndarray) -> pa.Array:
            return pa.array(ms * 1000, pa.timestamp("us", tz="UTC"))

        def ints(value: int, kind) -> pa.Array:
            return pa.array(np.full(per, value, dtype=kind))

        kafka = pa.StructArray.from_arrays(
            [ints(p, np.int32), pa.array(offsets), micros(millis), ints(0, np.int32), pa.array(bases), ints(0, np.int32), ints(2, np.int32),
             pa.array(["none"] * per, pa.large_string()), micros(millis[bases]), micros(millis[np.minimum(bases + per_batch - 1, per - 1)]),
             ints(1000 + p, np.int64), ints(0, np.int32), pa.array(bases.astype(np.int32)), ints(0, np.bool_), ints(0, np.bool_),
             *(pa.nulls(per, f.type) for f in list(kafka_type)[15:])],
            fields=list(kafka_type),
        )  # fmt: skip
        values = pa.Array.from_buffers(pa.large_binary(), per, [None, pa.py_buffer(np.arange(per + 1, dtype=np.int64) * value_size), pa.py_buffer(rng.integers(0, 256, per * value_size, dtype=np.uint8))])
        headers = pa.array([[]] * per, SCHEMA.field(HEADERS).type)
        nulls = [pa.nulls(per, pa.large_binary()), values, pa.nulls(per, pa.int32()), pa.nulls(per, pa.large_string())]
        tables.append(pa.Table.from_arrays([kafka, headers, *nulls], schema=SCHEMA))
    return pa.concat_tables(tables)


def row_groups(table: pa.Table, value_size: int, directory: Path) -> list[pa.Table]:
    path = directory / f"rows-{value_size}.parquet"
    pq.write_table(table, path, compression="zstd", row_group_size=max(1, 8 * 2**20 // (value_size + 60)))
    parquet = pq.ParquetFile(path)
    return [parquet.read_row_groups([i], columns=COLUMNS, use_threads=False) for i in range(parquet.num_row_groups)]


def by_partition(group: pa.Table) -> list[pa.Table]:
    partitions = pc.struct_field(group.column(KAFKA), PARTITION).to_numpy()
    cuts = [0, *(np.flatnonzero(partitions[1:] != partitions[:-1]) + 1).tolist(), len(group)]
    return [group.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def load(path: Path):
    """Another copy of table/rebuild.py, as a module of the table package (its relative imports)."""
    spec = importlib.util.spec_from_file_location("table._rebuild_against", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.rebuild_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1024,100", help="value sizes in bytes (default 1024,100)")
    p.add_argument("--mib", type=float, default=64, help="MiB of values per size (default 64)")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--against", type=Path, default=None, help="another copy of table/rebuild.py, timed alternately")
    a = p.parse_args()
    import table.rebuild

    modules = {"rebuild": table.rebuild, **({"against": load(a.against)} if a.against else {})}
    with tempfile.TemporaryDirectory() as directory:
        for size in (int(s) for s in a.sizes.split(",")):
            groups = row_groups(rows(size, a.mib, a.partitions), size, Path(directory))
            gib = sum(g.column(VALUE_RAW).combine_chunks().buffers()[2].size for g in groups) / 2**30
            pieces = [by_partition(g) for g in groups]
            best: dict[str, float] = {}
            for _ in range(a.rounds):
                for name, module in modules.items():
                    started = time.process_time()
                    for parts in pieces:
                        for part in parts:
                            module.rebuild_run(part, "producer", {}, True)
                    best[f"{name}_run"] = min(best.get(f"{name}_run", float("inf")), time.process_time() - started)
                    started = time.process_time()
                    for group in groups:
                        module.rebuild_partitions(group, "producer", {})
                    best[f"{name}_partitions"] = min(best.get(f"{name}_partitions", float("inf")), time.process_time() - started)
            out = {"value_bytes": size, "partitions": a.partitions, "rows": sum(len(g) for g in groups), "gib": round(gib, 4)}
            out.update({f"{k}_cpu_s_per_gib": round(v / gib, 3) for k, v in best.items()})
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

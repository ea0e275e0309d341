"""`python -m bench.compaction_worker`: the compaction service over a stopped `neve dev` data dir,
timed topic by topic, in a process of its own so that its CPU (a Spark driver's JVM and Python
workers included) is its process tree's. Warm-up topics are compacted first, unmeasured (Spark's
start, the workers' imports); then each measured topic's cycles run until it is caught up, and
the rows they committed are written again by pyarrow alone (Parquet, zstd) as the baseline. One
JSON line `RESULT {...}` on stdout holds every figure."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

from . import procstat

PYARROW_ROUNDS = 3
# Spark jobs run after the warm-up topics, before any measurement: a compactor that runs for good
# starts a job every few seconds, so its JVM has long finished compiling the code a job runs; a
# JVM a few jobs old spends a CPU-second and more compiling it (C2) within the measured cycles.
JIT_WARM_JOBS = 60


def _cpu() -> float:
    cpu = procstat.tree_cpu_seconds(os.getpid())
    assert cpu is not None
    return cpu


def _cpu_by_process() -> dict[str, float]:
    """The tree's CPU seconds by kind of process: this one (the driver's Python: plan, commit,
    index swap; in-process, the tasks too), Spark's JVM, and the Python below it (pyspark's
    daemon and the workers that run the tasks); each counts its reaped children."""
    out = {"driver": 0.0, "jvm": 0.0, "python workers": 0.0}
    me = os.getpid()
    for pid, (name, cpu) in (procstat.tree_processes(me) or {}).items():
        out["driver" if pid == me else "jvm" if name == "java" else "python workers"] += cpu
    return out


async def _compact(service, info) -> dict:
    """Cycles of one topic until one finds nothing due: wall seconds and tree CPU to the end of the
    last cycle with work, WAL bytes read, rows and files committed, outcomes."""
    wall0, cpu0, by_process0 = time.monotonic(), _cpu(), _cpu_by_process()
    wall, cpu, by_process = 0.0, 0.0, by_process0
    done = {"cycles": 0, "wal_bytes": 0, "rows": 0, "files": 0, "parquet_bytes": 0, "outcomes": {}}
    while True:
        cycle = await service.compact_topic(info)
        if cycle.cycle_id is None:
            break
        wall, cpu, by_process = time.monotonic() - wall0, _cpu() - cpu0, _cpu_by_process()
        done["cycles"] += 1
        done["wal_bytes"] += cycle.bytes_read
        done["rows"] += cycle.rows
        done["files"] += cycle.files
        done["parquet_bytes"] += cycle.bytes_written
        for name, n in cycle.outcomes.items():
            done["outcomes"][name] = done["outcomes"].get(name, 0) + n
    done["table"] = cycle.table
    done["seconds"] = round(wall, 3)
    done["cpu_s"] = round(cpu, 3)
    done["cpu_s_by_process"] = {kind: round(by_process[kind] - by_process0[kind], 3) for kind in by_process}
    return done


def _warm_jit(spark, parallelism: int) -> None:
    """JIT_WARM_JOBS jobs of the shape the compactor's are (items pickled to Python workers, a
    map, results collected), so that the JVM the measured cycles run on is as a running
    compactor's is."""
    items = [bytes(64 << 10)] * max(2, parallelism)
    for _ in range(JIT_WARM_JOBS):
        spark.sparkContext.parallelize(items, len(items)).map(len).collect()


def _pyarrow_baseline(catalog, identifier: str, work_dir: str) -> dict:
    """The table's rows, scanned into Arrow, written by pyarrow to one Parquet file (zstd), as the
    writer writes them: median of PYARROW_ROUNDS rounds, wall and process CPU."""
    import pyarrow.parquet as pq

    rows = catalog.load_table(identifier).scan().to_arrow()
    walls, cpus, size = [], [], 0
    for _ in range(PYARROW_ROUNDS):
        with tempfile.NamedTemporaryFile(dir=work_dir, suffix=".parquet") as f:
            wall0, cpu0 = time.monotonic(), time.process_time()
            pq.write_table(rows, f.name, compression="zstd", coerce_timestamps="us", store_decimal_as_integer=True)
            walls.append(time.monotonic() - wall0)
            cpus.append(time.process_time() - cpu0)
            size = os.path.getsize(f.name)
    return {"rows": rows.num_rows, "arrow_bytes": rows.nbytes, "parquet_bytes": size, "seconds": round(statistics.median(walls), 4), "cpu_s": round(statistics.median(cpus), 4)}


async def main(args: argparse.Namespace) -> dict:
    from neve.cli import tune_gc
    from neve.compaction import CompactorNode
    from neve.config import load_config

    config = load_config(None, data_dir=args.data_dir, compactor__freshness_ms=0, compactor__runner=args.runner)
    tune_gc(config.broker.gc_young_threshold)  # as `neve compactor` runs
    node = CompactorNode(config)
    await node.start(cycle=False)
    out: dict = {"runner": args.runner, "parallelism": node.running.settings.parallelism, "topics": {}}
    try:
        service = node.running.service
        topics = node.metadata.topics()
        started = time.monotonic()
        for name in args.warm:
            await _compact(service, topics[name])
        if args.runner == "spark":
            await asyncio.to_thread(_warm_jit, await service.resources.spark_session(), out["parallelism"])
        out["warmup_s"] = round(time.monotonic() - started, 1)
        catalog = await service.resources.catalog()
        for name in args.measure:
            result = await _compact(service, topics[name])
            result["load_average"] = procstat.load_average()
            result["pyarrow"] = await asyncio.to_thread(_pyarrow_baseline, catalog, result["table"], args.data_dir)
            out["topics"][name] = result
            print(f"compacted {name}: {result['rows']} rows, {result['wal_bytes']} WAL bytes in {result['seconds']} s, {result['cpu_s']} CPU-s", file=sys.stderr, flush=True)
    finally:
        await node.stop()
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.compaction_worker", description=__doc__)
    p.add_argument("--data-dir", required=True, help="a stopped neve dev's data dir")
    p.add_argument("--runner", choices=["spark", "in-process"], required=True)
    p.add_argument("--warm", nargs="*", default=[], help="topics compacted first, unmeasured")
    p.add_argument("--measure", nargs="+", required=True, help="topics compacted and measured, in turn")
    return p.parse_args(argv)


if __name__ == "__main__":
    import uvloop

    result = uvloop.run(main(parse()))
    print("RESULT " + json.dumps(result), flush=True)

"""compaction: MB/s of WAL turned into committed Iceberg data by the compaction service's whole
cycle (plan, tasks, manifest, Iceberg commit, index swap), on the Spark runner and in-process, for
raw and Confluent-framed Avro values of 100 B and 1 KiB; beside it, pyarrow writing the same rows
to Parquet (zstd) in the same process; and the compactor's CPU-seconds per GiB (its whole process
tree: the Spark driver's JVM and Python workers included).

A `neve dev` node (its compactor off) takes each case's records from confluent-kafka (a topic per
case and runner, plus small warm-up topics), then stops; `python -m bench.compaction_worker`
compacts the warm-up topics unmeasured (Spark's start), runs a few dozen small Spark jobs (a
running compactor's JVM has compiled what a job runs), and then each measured topic alone."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from .. import table_load
from ..load import create_topic
from ..options import sizes
from ..servers import free_port
from ..stats import MB, GiB
from ..systems import NeveDev

NAME = "compaction"
HELP = "compaction MB/s of WAL into committed Iceberg data (Spark and in-process) against pyarrow's Parquet write, and compactor CPU-s per GiB"

RUNNERS = ("spark", "in-process")
RATIO_TARGET = 0.5  # of pyarrow's own Parquet write rate (issue 21)
PER_CORE_TARGET_MIB = 20.0  # MiB/s per core of 1 KiB records (issue 21)
WORKER_TIMEOUT_S = 3600


def add_arguments(parser) -> None:
    parser.add_argument("--record-sizes", type=sizes, default=[100, 1024], help="value sizes (default 100,1KiB)")
    parser.add_argument("--codecs", type=lambda s: [c.strip() for c in s.split(",") if c.strip()], default=list(table_load.CODECS), help="of raw, avro and avro-nested (default all three)")
    parser.add_argument("--runners", type=lambda s: [c.strip() for c in s.split(",") if c.strip()], default=list(RUNNERS), help="spark and/or in-process (default both)")
    parser.add_argument("--mib", type=float, default=None, help="MiB of values per case and runner (default 64; --quick 1)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions per topic (default 4)")


def run(r) -> None:
    a = r.args
    for runner in a.runners:
        if runner not in RUNNERS:
            raise ValueError(f"--runners: {runner!r} is not one of {RUNNERS}")
    mib = a.mib if a.mib is not None else (1.0 if r.quick else 64.0)
    registry_port = free_port()
    # The node's own compactor stays off: the worker compacts the topics once production is over.
    a.broker_env = [*a.broker_env, ("NEVE_COMPACTOR_IN_NODE", "false"), ("NEVE_REGISTRY_PORT", str(registry_port))]
    system = r.make_system()
    if not isinstance(system, NeveDev):
        raise ValueError("compaction runs against --system neve-dev (the worker compacts its data dir)")
    r.start_system()

    cases = [(codec, size) for size in a.record_sizes for codec in a.codecs]
    produced: dict[str, dict] = {}
    warm: dict[str, list[str]] = {runner: [] for runner in a.runners}
    measured: dict[str, list[tuple[str, str, int]]] = {runner: [] for runner in a.runners}
    pools: dict[tuple, list[bytes]] = {}
    r.progress.begin("produce")
    for runner in a.runners:
        # Warm-up topics: a few records of each codec, so the measured cycles find Spark started
        # and every import made.
        jobs = [("warm", codec, min(a.record_sizes), 0.1 if r.quick else 0.5) for codec in a.codecs] + [("case", codec, size, mib) for codec, size in cases]
        for kind, codec, size, job_mib in jobs:
            topic = create_topic(system.bootstrap, a.partitions, f"{kind}-{runner}-{codec}-{size}")
            schema_id = table_load.register_schema(registry_port, f"{topic}-value", table_load.SCHEMAS[codec]) if codec in table_load.SCHEMAS else None
            pool = pools.get((codec, size, schema_id))
            if pool is None:
                pool = pools[(codec, size, schema_id)] = table_load.values(codec, size, schema_id)
            count = max(a.partitions, int(job_mib * 2**20 / size))
            done = table_load.produce(system.bootstrap, topic, a.partitions, pool, count)
            if done.failed or done.errors or done.acked != count:
                r.fail(f"{topic}: {done.acked} of {count} acknowledged, {done.failed} failed: {done.errors[:3]}")
            produced[topic] = {"codec": codec, "record_bytes": size, "records": count, "acked": done.acked, "value_bytes": done.value_bytes, "produce_s": round(done.seconds, 2)}
            r.progress.line(f"{topic}: {done.acked:,} records, {done.value_bytes / MB:.1f} MB in {done.seconds:.1f} s")
            if kind == "warm":
                warm[runner].append(topic)
            else:
                measured[runner].append((topic, codec, size))
    r.stop_system(system)

    rows, table_rows = [], []
    for runner in a.runners:
        r.progress.begin(f"compact/{runner}")
        r.progress.line(f"warm-up on {len(warm[runner])} small topics, then {len(measured[runner])} measured ones")
        result = _worker(r, system, runner, warm[runner], [t for t, _, _ in measured[runner]])
        r.progress.line(f"warm-up {result['warmup_s']} s (Spark's start, imports, the JVM's compiling), parallelism {result['parallelism']}")
        for topic, codec, size in measured[runner]:
            m, p = result["topics"][topic], produced[topic]
            row = _row(runner, codec, size, m, p)
            rows.append(row)
            if m["rows"] != p["acked"]:
                r.fail(f"{topic}: {m['rows']} rows committed for {p['acked']} acknowledged records")
            table_rows.append([
                runner, codec, f"{size} B", f"{m['rows']:,}", f"{row['wal_mib']:.1f}", f"{row['mib_per_s']:.1f}", f"{row['pyarrow_mib_per_s']:.1f}",
                f"{row['ratio_to_pyarrow']:.2f}", f"{row['cpu_s_per_gib']:.1f}", f"{row['mib_per_cpu_s']:.1f}", f"{row['ratio_to_pyarrow_cpu']:.2f}", f"{m['load_average']}",
            ])  # fmt: skip
            by_process = ", ".join(f"{kind} {cpu:.1f}" for kind, cpu in row["cpu_s_per_gib_by_process"].items())
            r.progress.line(f"{codec} {size} B: {row['mib_per_s']:.1f} MiB/s ({row['ratio_to_pyarrow']:.2f} of pyarrow's {row['pyarrow_mib_per_s']:.1f}), {row['cpu_s_per_gib']:.1f} CPU-s/GiB ({by_process}), load {m['load_average']}")
    r.derived["compaction"] = rows
    r.derived["produced"] = produced
    r.derived.setdefault("tables", {})["Compaction of WAL into committed Iceberg data, against pyarrow writing the same rows"] = {
        "headers": ["runner", "values", "size", "rows", "WAL MiB", "MiB/s", "pyarrow MiB/s", "ratio", "CPU-s/GiB", "MiB per CPU-s", "ratio (CPU)", "load avg"],
        "rows": table_rows,
    }
    for row in rows:
        label = f"{row['runner']}, {row['codec']} {row['record_bytes']} B"
        r.target(f"compaction rate / pyarrow's Parquet write rate ({label})", f">= {RATIO_TARGET}", row["ratio_to_pyarrow"], row["ratio_to_pyarrow"] >= RATIO_TARGET)
        if row["record_bytes"] >= 1000:
            r.target(f"compaction MiB/s per core ({label})", f">= {PER_CORE_TARGET_MIB:g} (<= {1024 / PER_CORE_TARGET_MIB:.1f} CPU-s/GiB)", row["mib_per_cpu_s"], row["mib_per_cpu_s"] >= PER_CORE_TARGET_MIB)
    r.notes.append(
        "Rates are WAL bytes read by the cycle's tasks (record batches as stored) over the wall time of the topic's cycles, from the first cycle's start to the end of the last with work "
        "(table load or creation, plan, tasks, manifest, Iceberg commit, index swap). pyarrow's rate is the same WAL bytes over the median wall time of pyarrow.parquet.write_table of the "
        "committed rows (scanned back into Arrow) to one zstd file, in the same process right after; ratio (CPU) compares the two CPU-seconds instead (steadier on a shared machine). "
        "Per core: WAL MiB per CPU-second of the compactor's process tree."
    )


def _row(runner: str, codec: str, size: int, m: dict, p: dict) -> dict:
    wal_mib = m["wal_bytes"] / 2**20
    pa = m["pyarrow"]
    return {
        "runner": runner,
        "codec": codec,
        "record_bytes": size,
        "rows": m["rows"],
        "cycles": m["cycles"],
        "files": m["files"],
        "outcomes": m["outcomes"],
        "wal_mib": round(wal_mib, 2),
        "value_mib": round(p["value_bytes"] / 2**20, 2),
        "seconds": m["seconds"],
        "cpu_s": m["cpu_s"],
        "cpu_s_per_gib_by_process": {kind: round(cpu / (m["wal_bytes"] / GiB), 2) for kind, cpu in m.get("cpu_s_by_process", {}).items()},
        "mib_per_s": round(wal_mib / m["seconds"], 2),
        "rows_per_s": round(m["rows"] / m["seconds"]),
        "cpu_s_per_gib": round(m["cpu_s"] / (m["wal_bytes"] / GiB), 2),
        "mib_per_cpu_s": round(wal_mib / m["cpu_s"], 2),
        "pyarrow_seconds": pa["seconds"],
        "pyarrow_cpu_s": pa["cpu_s"],
        "pyarrow_mib_per_s": round(wal_mib / pa["seconds"], 2),
        "ratio_to_pyarrow": round(pa["seconds"] / m["seconds"], 3),
        "ratio_to_pyarrow_cpu": round(pa["cpu_s"] / m["cpu_s"], 3),
        "parquet_bytes": m["parquet_bytes"],
        "pyarrow_parquet_bytes": pa["parquet_bytes"],
        "load_average": m["load_average"],
    }


def _worker(r, system: NeveDev, runner: str, warm: list[str], measure: list[str]) -> dict:
    log = r.out_dir / f"compactor-{runner}.log"
    command = [sys.executable, "-m", "bench.compaction_worker", "--data-dir", str(system.data_dir), "--runner", runner, "--warm", *warm, "--measure", *measure]
    started = time.monotonic()
    with open(log, "ab") as err:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=err, timeout=WORKER_TIMEOUT_S, check=False)
    lines = [line for line in done.stdout.decode(errors="replace").splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"compaction worker ({runner}) exited with {done.returncode} after {time.monotonic() - started:.0f} s; log {log}:\n{tail}")
    return json.loads(lines[-1][len("RESULT ") :])

"""catchup-table: a consumer reading a topic from offset 0 while its records are WAL objects, and
again, in the same run, once they are compacted (every index entry PARQUET) and served from the
table's Parquet files: read MB/s and broker CPU-s per GiB read for each, raw values of 1 KiB and
100 B (issue 22's target: Parquet at least as fast as the WAL).

A `neve dev` node (its compactor off) takes each size's records from confluent-kafka, and stops.
Each read is by the node started afresh (no recently written object, no rebuilt batch in its
memory): first from the WAL; then `neve compactor --once` compacts the stopped node's data dir
and the index is checked to hold PARQUET entries only; then from the table. The reader is
bench/workers.py's consumer, assigned every partition at offset 0 and run until it has read every
record; a read's time runs from its assignment to its last record, the broker's CPU over the same.

With `--system neve-s3` the node is one `neve broker` over the run's etcd and SeaweedFS, and the
compactor runs over the same etcd root and S3 WAL with a SQLite catalog in the run's work dir and
the table's files in the WAL's bucket: one object store against itself. Each read then also
counts the bucket's requests (GETs per GiB read) and SeaweedFS's CPU-s per GiB, which on a small
machine shares the cores with the broker and the reader."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .. import procstat, table_load, workers
from ..load import CONSUMER_DEFAULTS, create_topic
from ..options import sizes
from ..profile import hot_frames
from ..stats import MB, GiB
from ..systems import NeveDev, NeveS3

NAME = "catchup-table"
HELP = "catch-up reads from offset 0 served from the WAL, then from the table's Parquet files after compaction: MB/s and broker CPU-s per GiB read"

SOURCES = ("wal", "parquet")
# librdkafka stops fetching for fetch.queue.backoff.ms (1 s) whenever its queue holds
# queued.min.messages (100,000): at 100 B that held every read to about 14 MB/s, whatever the
# broker did. The reader keeps fetching instead (--consumer-config overrides these).
READER_CONFIG = {"queued.min.messages": 2_000_000, "fetch.queue.backoff.ms": 5}
READ_TIMEOUT_S = 1800.0
STORE_SERVER = "seaweedfs"  # bench/servers.py's name for the S3 server's process
STORE_KEYS = ("store_gets_per_gib", "store_cpu_s_per_gib")  # medians of these too
COMPACT_TIMEOUT_S = 3600.0


def add_arguments(parser) -> None:
    parser.add_argument("--record-sizes", type=sizes, default=[1024, 100], help="raw value sizes (default 1KiB,100)")
    parser.add_argument("--mib", type=float, default=None, help="MiB of values per size (default 256; --quick 0.5)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions per topic (default 4)")
    parser.add_argument("--rounds", type=int, default=None, help="reads of each source, each by the node started afresh; medians reported (default 3; --quick 1)")
    parser.add_argument("--runner", choices=["in-process", "spark"], default="in-process", help="the compactor's runner (default in-process: no JVM on a small machine)")


def run(r) -> None:
    a = r.args
    mib = a.mib if a.mib is not None else (0.5 if r.quick else 256.0)
    rounds = a.rounds if a.rounds is not None else (1 if r.quick else 3)
    a.broker_env = [*a.broker_env, ("NEVE_COMPACTOR_IN_NODE", "false")]
    system = r.make_system()
    if not isinstance(system, (NeveDev, NeveS3)):
        raise ValueError("catchup-table runs against --system neve-dev or neve-s3 (the compactor runs over their stores)")
    r.start_system()

    cases: list[dict] = []
    r.progress.begin("produce")
    for size in a.record_sizes:
        topic = create_topic(system.bootstrap, a.partitions, f"catchup-table-{size}")
        count = max(a.partitions, int(mib * 2**20 / size))
        done = table_load.produce(system.bootstrap, topic, a.partitions, table_load.values("raw", size), count)
        if done.failed or done.errors or done.acked != count:
            r.fail(f"{topic}: {done.acked} of {count} acknowledged, {done.failed} failed: {done.errors[:3]}")
        cases.append({"topic": topic, "record_bytes": size, "records": done.acked, "value_bytes": done.value_bytes})
        r.progress.line(f"{topic}: {done.acked:,} records, {done.value_bytes / MB:.1f} MB in {done.seconds:.1f} s")
    r.stop_system(system)

    compaction = None
    for source in SOURCES:
        if source == "parquet":
            compaction = _compact(r, system, a.runner)
        for case in cases:
            types = index_types(_metadata_url(system), case["topic"])
            want = {"WAL"} if source == "wal" else {"PARQUET"}
            if types != want:
                r.fail(f"{case['topic']}: index entries {sorted(types)} before the read from {source}, not {sorted(want)}")
        for n in range(rounds):
            system.start()  # afresh: nothing of the previous read in memory
            for case in cases:
                label = f"{source}-{case['record_bytes']}B-{n + 1}"
                r.progress.begin(label)
                read = read_topic(r, system, case, label)
                case.setdefault(f"{source}_rounds", []).append(read)
                if read["consumed"] != case["records"] or read["offset_anomalies"] or read["error"]:
                    r.fail(f"{case['topic']} from {source}: {read['consumed']} of {case['records']} records read, {read['offset_anomalies']} offset anomalies, {read['error']}")
            r.stop_system(system)
        for case in cases:
            case[source] = _median(case[f"{source}_rounds"])

    # the object store's own counts, where it keeps them (S3): columns only then
    store = any(case[s]["store_gets_per_gib"] is not None for case in cases for s in SOURCES)
    rows = []
    for case in cases:
        wal, parquet = case["wal"], case["parquet"]
        ratio = round(parquet["mb_per_s"] / wal["mb_per_s"], 3) if wal["mb_per_s"] else None
        case["parquet_over_wal"] = ratio
        rows.append([f"{case['record_bytes']} B", f"{case['records']:,}", f"{case['value_bytes'] / MB:.1f}",
                     str(wal["mb_per_s"]), str(parquet["mb_per_s"]), str(ratio),
                     str(wal["broker_cpu_s_per_gib"]), str(parquet["broker_cpu_s_per_gib"]),
                     str(wal["consumer_cpu_s_per_gib"]), str(parquet["consumer_cpu_s_per_gib"])])  # fmt: skip
        if store:
            rows[-1] += [str(wal["store_gets_per_gib"]), str(parquet["store_gets_per_gib"]), str(wal["store_cpu_s_per_gib"]), str(parquet["store_cpu_s_per_gib"])]
        r.target(f"catch-up read from Parquet / from the WAL, raw {case['record_bytes']} B (MB/s)", ">= 1.0", ratio, None if ratio is None else ratio >= 1.0)
    r.derived["catchup_table"] = cases
    r.derived["compaction"] = compaction
    headers = ["values", "records", "MB", "WAL MB/s", "Parquet MB/s", "Parquet / WAL", "broker CPU-s/GiB WAL", "Parquet", "consumer CPU-s/GiB WAL", "Parquet"]
    if store:
        headers += ["S3 GETs/GiB WAL", "Parquet", "SeaweedFS CPU-s/GiB WAL", "Parquet"]
    r.derived.setdefault("tables", {})["Catch-up from offset 0: WAL, then the same records from Parquet"] = {"headers": headers, "rows": rows}
    r.notes.append(
        f"Figures are medians of {rounds} reads per source. MB are 10^6 bytes of record values read; a read's time runs from the consumer's assignment (offset 0 of every partition) to its last record; "
        "CPU-s per GiB are the broker process's (and the consumer process's) over the same time, per GiB of values read. "
        f"The node is started afresh before each source's reads (the WAL's recent-objects cache and the table's rebuilt batches empty); the compaction ran `neve compactor --once` with the {a.runner} runner."
    )
    if store:
        r.notes.append(
            "S3 GETs per GiB are the GET requests SeaweedFS counted on the bucket during a read (its own Prometheus counters, their difference over the read), per GiB of values read; "
            "the table's files are in the WAL's bucket, read through the broker's reader like the WAL's objects. SeaweedFS CPU-s per GiB are the `weed` process's. "
            "Both run from just before the reader starts (its first fetch may come before its assignment is seen) to its last record."
        )


def _median(reads: list[dict]) -> dict:
    """Each figure's median over the rounds (they need not come from one round)."""
    keys = ("seconds", "mb_per_s", "records_per_s", "broker_cpu_s", "broker_cpu_s_per_gib", "consumer_cpu_s_per_gib", *STORE_KEYS)
    return {k: None if any(x[k] is None for x in reads) else round(statistics.median(x[k] for x in reads), 2) for k in keys}


def _metadata_url(system: NeveDev | NeveS3) -> str:
    return f"sqlite:///{system.data_dir / 'metadata.db'}" if isinstance(system, NeveDev) else system.metadata_url


def index_types(metadata_url: str, topic: str) -> set[str]:
    """The object types ("WAL", "PARQUET") of every index entry of `topic`, read from the metadata
    store of a stopped node (`neve dev`'s SQLite, or etcd)."""
    from metadata.store import load_metadata_store

    async def read() -> set[str]:
        store = load_metadata_store(metadata_url)
        await store.start()
        try:
            info = store.topics()[topic]
            return {e.object_type.name for p in range(info.partitions) for e in store.entries(info.topic_id, p, 0, max_entries=1_000_000)}
        finally:
            await store.close()

    return asyncio.run(read())


def _compact(r, system: NeveDev | NeveS3, runner: str) -> dict:
    """`neve compactor --once` over the stopped node's data dir (neve-dev), or over its etcd root
    and S3 WAL (neve-s3): its wall time and CPU, and etcd's and SeaweedFS's CPU beside it (neve-s3;
    they are this process's children too, so their CPU is taken out of the compactor's)."""
    r.progress.begin("compact")
    log = r.out_dir / "compactor.log"
    if isinstance(system, NeveDev):
        where, env = ["--data-dir", str(system.data_dir)], system.env
    else:
        where, env = [], system.compactor_env(r.work_dir / "catalog.db")
    env = {**os.environ, **env, "NEVE_COMPACTOR_RUNNER": runner}
    servers0 = system.servers.cpu_seconds()
    started, cpu0 = time.monotonic(), procstat.tree_cpu_seconds(os.getpid()) or 0.0
    with open(log, "ab") as out:
        done = subprocess.run([sys.executable, "-m", "neve", "compactor", "--once", *where], stdout=out, stderr=subprocess.STDOUT, env=env, timeout=COMPACT_TIMEOUT_S, check=False)
    seconds = time.monotonic() - started
    cpu = (procstat.tree_cpu_seconds(os.getpid()) or 0.0) - cpu0  # the reaped child counts in cutime/cstime
    servers = procstat.cpu_delta(servers0, system.servers.cpu_seconds())
    cpu -= sum(servers.values())
    if done.returncode != 0:
        raise RuntimeError(f"neve compactor --once exited with {done.returncode}; log {log}:\n{log.read_text(errors='replace')[-3000:]}")
    beside = "".join(f", {name} {s:.1f}" for name, s in servers.items())
    r.progress.line(f"compacted in {seconds:.1f} s, {cpu:.1f} CPU-s ({runner}){beside}")
    return {"runner": runner, "seconds": round(seconds, 2), "cpu_s": round(cpu, 2), **({"servers_cpu_s": servers} if servers else {})}


def _store_edge(system: NeveDev | NeveS3) -> tuple[dict[str, float] | None, float | None]:
    """(the object store's request counts by kind, the object store server's CPU seconds) now;
    (None, None) for local files."""
    requests = system.object_requests()
    cpu = system.servers.cpu_seconds().get(STORE_SERVER) if requests is not None else None
    return requests, cpu


def _store_figures(before: tuple, after: tuple, read_bytes: int) -> dict:
    """The object store's share of a read: GETs and all requests on the bucket, GETs and the
    store server's CPU per GiB of values read (None where not counted)."""
    (req0, cpu0), (req1, cpu1) = before, after
    gets = requests = None
    if req0 is not None and req1 is not None:
        gets = round(req1.get("GET", 0.0) - req0.get("GET", 0.0))
        requests = {k: round(v - req0.get(k, 0.0)) for k, v in sorted(req1.items()) if v != req0.get(k, 0.0)}
    gib = read_bytes / GiB
    return {
        "store_gets": gets,
        "store_requests": requests,
        "store_gets_per_gib": None if gets is None else round(gets / gib, 1),
        "store_cpu_s_per_gib": None if cpu0 is None or cpu1 is None else round((cpu1 - cpu0) / gib, 2),
    }


def read_topic(r, system: NeveDev | NeveS3, case: dict, label: str) -> dict:
    """bench/workers.py's consumer reading every record of the case's topic from offset 0."""
    ctx = multiprocessing.get_context("spawn")
    # Told to stop at once, it reads until it holds `records` and then ends.
    control = ctx.Array("d", [workers.STOP, float(case["records"])], lock=False)
    counters = ctx.Array("d", workers.SLOT, lock=False)
    results = ctx.Queue()
    config = {**CONSUMER_DEFAULTS, **READER_CONFIG, **dict(r.args.consumer_config)}
    plan = workers.WorkerPlan("consumer", 0, system.bootstrap, case["topic"], r.args.partitions, case["record_bytes"], None, True, config)
    proc = ctx.Process(target=workers.consumer_main, args=(plan, control, counters, results), name=f"bench-reader-{label}", daemon=True)
    # before the reader starts: its first fetch may GET between its assignment and a later count
    store0 = _store_edge(system)
    proc.start()
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        while not counters[workers.READY]:
            system.check_alive()
            if not proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the reader of {case['topic']} did not start")
            time.sleep(0.005)
        t0, cpu0, client0 = time.monotonic(), system.cpu_seconds(), procstat.cpu_seconds(proc.pid) or 0.0
        r.progress.line(f"measured from the reader's assignment: {case['records']:,} records of {case['record_bytes']} B")
        profiler = _profiler(r, system, label)
        client1, last = client0, (t0, 0.0)
        while True:
            try:
                result = results.get(timeout=1.0)
                break
            except queue.Empty:
                system.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{case['topic']}: {counters[workers.CONSUMED]:,.0f} of {case['records']:,} records read after {READ_TIMEOUT_S:g} s") from None
                client1 = procstat.cpu_seconds(proc.pid) or client1
                now, consumed = time.monotonic(), counters[workers.CONSUMED]
                r.progress.line(f"read {consumed:>12,.0f} of {case['records']:,}  {(consumed - last[1]) * case['record_bytes'] / MB / (now - last[0]):8.2f} MB/s")
                last = (now, consumed)
        cpu1 = system.cpu_seconds()
        store1 = _store_edge(system)
        client1 = procstat.cpu_seconds(proc.pid) or client1  # gone once it has put its result: its last sample
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    profile = _stop_profiler(r, profiler)
    recv = [t for t in memoryview(result["recv_times"]).cast("d")]
    seconds = (max(recv) if recv else time.monotonic()) - t0
    read_bytes = result["consumed_bytes"]
    broker_cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    out = {
        "consumed": result["consumed"],
        "offset_anomalies": result["offset_anomalies"],
        "error": result["error"],
        "seconds": round(seconds, 3),
        "mb_per_s": round(read_bytes / MB / seconds, 2),
        "records_per_s": round(result["consumed"] / seconds),
        "broker_cpu_s": None if broker_cpu is None else round(broker_cpu, 2),
        "broker_cpu_s_per_gib": None if broker_cpu is None else round(broker_cpu / (read_bytes / GiB), 2),
        "consumer_cpu_s_per_gib": round((client1 - client0) / (read_bytes / GiB), 2),
        **_store_figures(store0, store1, read_bytes),
        "load_average": procstat.load_average(),
    }
    if profile is not None:
        out["profile"] = profile
    store = "" if out["store_gets"] is None else f", {out['store_gets']} GETs ({out['store_gets_per_gib']}/GiB), SeaweedFS {out['store_cpu_s_per_gib']} CPU-s/GiB"
    r.progress.line(f"{label}: {out['mb_per_s']} MB/s in {out['seconds']} s, broker {out['broker_cpu_s_per_gib']} CPU-s/GiB, consumer {out['consumer_cpu_s_per_gib']}{store}")
    return out


def _profiler(r, system: NeveDev | NeveS3, label: str):
    """py-spy over the broker for the read, with --profile (collapsed stacks with `raw`); stopped
    by SIGINT when the read ends."""
    if not r.args.profile:
        return None
    exe = Path(sys.executable).parent / "py-spy"
    path = r.out_dir / f"profile-{label}.{'txt' if r.args.profile == 'raw' else 'svg'}"
    cmd = [str(exe), "record", "--pid", str(system.broker_pids()[0]), "--rate", "100", "--nonblocking", "--output", str(path)]
    if r.args.profile == "raw":
        cmd += ["--format", "raw"]
    return path, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop_profiler(r, profiler) -> dict | None:
    if profiler is None:
        return None
    path, proc = profiler
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    r.progress.line(f"profile written to {path}")
    return hot_frames(path) if path.suffix == ".txt" and path.exists() else None

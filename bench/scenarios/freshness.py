"""freshness: seconds from a produce's acknowledgement to its row being visible to a reader of the
topic's Iceberg table, at a fixed produce rate, with `neve dev`'s default settings (the compactor
in the node, the Spark runner, freshness 2 s, a cycle every second).

confluent-kafka produces at the rate and keeps each record's acknowledgement time; a reader in
another process polls the table through pyiceberg and stamps each offset with the time of the
poll that first sees it. Production runs until the first snapshot appears (the compactor's Spark
session starts on the first cycle with work), then a settling warm-up, then the measured window;
only records acknowledged inside the window count. Afterwards the whole table is checked: every
acknowledged offset once."""

from __future__ import annotations

import multiprocessing
import os
import queue
import time

import numpy as np

from .. import procstat, table_load
from ..load import create_topic
from ..options import size
from ..servers import free_port
from ..stats import MB, latency_ms
from ..systems import NeveDev
from ..table_poll import PollPlan, poll_main

NAME = "freshness"
HELP = "seconds from a produce's acknowledgement to its row being visible in the Iceberg table, at a fixed rate, neve dev's defaults"

P99_TARGET_S = 10.0  # issue 21
FIRST_SNAPSHOT_TIMEOUT_S = 300.0  # Spark's start on a loaded machine
DRAIN_TIMEOUT_S = 180.0


def add_arguments(parser) -> None:
    parser.add_argument("--record-bytes", type=size, default=1024, help="value size (default 1KiB)")
    parser.add_argument("--codec", choices=table_load.CODECS, default="raw", help="raw values, or Confluent-framed Avro: avro (an order's flat fields) or avro-nested (with a list, a map, a decimal, a uuid and a time of day) (default raw)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions (default 4)")
    parser.add_argument("--rate-mb", type=float, default=2.0, help="offered MB/s of values (default 2)")
    parser.add_argument("--poll-ms", type=int, default=200, help="the reader's poll interval (default 200)")


def run(r) -> None:
    a = r.args
    timing = r.timing(full=(20.0, 60.0), quick=(1.0, 4.0))
    registry_port = free_port()
    a.broker_env = [*a.broker_env, ("NEVE_REGISTRY_PORT", str(registry_port))]
    system = r.make_system()
    if not isinstance(system, NeveDev):
        raise ValueError("freshness runs against --system neve-dev (its compactor runs in the node)")
    r.start_system()
    topic = create_topic(system.bootstrap, a.partitions, f"fresh-{a.codec}-{a.record_bytes}")
    schema_id = table_load.register_schema(registry_port, f"{topic}-value", table_load.SCHEMAS[a.codec]) if a.codec in table_load.SCHEMAS else None
    pool = table_load.values(a.codec, a.record_bytes, schema_id)
    rate = a.rate_mb * MB / a.record_bytes

    ctx = multiprocessing.get_context("spawn")
    expect = ctx.Array("q", [-1] * a.partitions, lock=False)
    first_seen, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    poller = ctx.Process(target=poll_main, args=(PollPlan(str(system.data_dir), topic, a.partitions, a.poll_ms / 1000), expect, first_seen, stop, results), daemon=True)
    poller.start()
    phase = {"name": "until the first snapshot", "since": time.monotonic()}
    window: dict[str, float] = {}

    def until() -> bool:
        now = time.monotonic()
        if phase["name"] == "until the first snapshot":
            if first_seen.is_set():
                r.progress.line(f"first snapshot after {now - phase['since']:.1f} s; settling {timing.warmup_s:g} s")
                phase.update(name="warm-up", since=now)
            elif now - phase["since"] > FIRST_SNAPSHOT_TIMEOUT_S:
                raise TimeoutError(f"no snapshot of {topic} after {FIRST_SNAPSHOT_TIMEOUT_S:g} s of production")
        elif phase["name"] == "warm-up" and now - phase["since"] >= timing.warmup_s:
            r.progress.line(f"the measured window: {timing.duration_s:g} s")
            phase.update(name="window", since=now)
            window["start"], window["cpu_start"] = time.time(), _node_cpu(system)
        elif phase["name"] == "window" and now - phase["since"] >= timing.duration_s:
            window["end"], window["cpu_end"] = time.time(), _node_cpu(system)
            return True
        return False

    r.progress.begin("produce")
    load_before = _load()
    produced = table_load.produce(system.bootstrap, topic, a.partitions, pool, rate=rate, keep_acks=True, until=until)
    acks = produced.ack_array()
    for p in range(a.partitions):
        mine = acks[acks[:, 0] == p, 1]
        expect[p] = int(mine.max()) if mine.size else 0
    r.progress.line(f"{produced.acked:,} records acknowledged ({produced.value_bytes / produced.seconds / MB:.2f} MB/s offered); waiting for their rows")
    # The reader's answer is read before it is joined: a process exits only once what it put on a
    # queue has been taken (182,000 offsets are more than a pipe holds).
    try:
        seen = results.get(timeout=DRAIN_TIMEOUT_S)
    except queue.Empty:
        stop.set()
        seen = results.get(timeout=120)
    poller.join(30)
    load_after = _load()
    if "error" in seen:
        raise RuntimeError(f"the table reader failed: {seen['error']}")
    if produced.failed or produced.errors:
        r.fail(f"{produced.failed} records failed: {produced.errors[:3]}")

    in_window = acks[(acks[:, 2] >= window["start"]) & (acks[:, 2] < window["end"])]
    lags, missing = _lags(in_window, seen)
    stats = latency_ms(lags)
    r.derived["freshness_s"] = {k: (v if k == "count" or v is None else round(v / 1000, 3)) for k, v in stats.items()}
    r.derived["freshness"] = {
        "records_in_window": len(in_window),
        "not_visible": missing,
        "acked": produced.acked,
        "table_rows": seen["table_rows"],
        "duplicate_rows": seen["duplicates"],
        "snapshots": seen["snapshots"],
        "polls": seen["polls"],
        "offered_mb_per_s": round(rate * a.record_bytes / MB, 2),
        "produced_mb_per_s": round(produced.value_bytes / produced.seconds / MB, 2),
        "load_average": [load_before, load_after],
        "compactor": _settings(system),
    }
    node_cpu = window["cpu_end"] - window["cpu_start"] if window["cpu_start"] is not None and window["cpu_end"] is not None else None
    window_bytes = float(in_window.shape[0]) * a.record_bytes
    r.derived["freshness"]["node_cores"] = None if node_cpu is None else round(node_cpu / (window["end"] - window["start"]), 3)
    r.derived["freshness"]["node_cpu_s_per_gib"] = None if node_cpu is None or not window_bytes else round(node_cpu / (window_bytes / 2**30), 1)
    fs = r.derived["freshness_s"]
    r.derived.setdefault("tables", {})["Acknowledgement to visible row, seconds"] = {
        "headers": ["records", "p50", "p99", "p99.9", "max", "not visible", "snapshots", "node cores", "node CPU-s/GiB", "load avg before, after"],
        "rows": [[f"{fs['count']:,}", str(fs["p50"]), str(fs["p99"]), str(fs["p999"]), str(fs["max"]), str(missing), str(seen["snapshots"]),
                  str(r.derived["freshness"]["node_cores"]), str(r.derived["freshness"]["node_cpu_s_per_gib"]), f"{load_before}, {load_after}"]],  # fmt: skip
    }
    r.progress.line(f"freshness p50 {fs['p50']} s, p99 {fs['p99']} s over {fs['count']:,} records; {missing} not visible; {seen['snapshots']} snapshots")
    if missing:
        r.fail(f"{missing} acknowledged records of the window not visible within {DRAIN_TIMEOUT_S:g} s")
    if seen["duplicates"] or seen["table_rows"] != produced.acked:
        r.fail(f"the table holds {seen['table_rows']} rows ({seen['duplicates']} duplicates) for {produced.acked} acknowledged records")
    r.target("table freshness p99 (s)", f"<= {P99_TARGET_S:g}", fs["p99"], None if fs["p99"] is None else fs["p99"] <= P99_TARGET_S)
    r.notes.append(
        f"A row's visibility time is when the reader's load of the table (polled every {a.poll_ms} ms through pyiceberg) that first holds its offset returned, an upper bound by up to one poll; "
        "acknowledgement and visibility times are both the machine's wall clock. Records acknowledged before the first snapshot (the compactor's Spark session starting) and during the warm-up do not count. "
        "Node cores and CPU-s per GiB are the `neve dev` process tree's (broker, registry, compactor, Spark's JVM and Python workers) over the measured window, per GiB of values acknowledged in it."
    )


def _node_cpu(system: NeveDev) -> float | None:
    """CPU-seconds of the node's process tree (its compactor's Spark JVM and workers are children)."""
    pids = system.broker_pids()
    cpus = [procstat.tree_cpu_seconds(pid) for pid in pids]
    return None if not pids or any(c is None for c in cpus) else sum(cpus)


def _lags(acks: np.ndarray, seen: dict) -> tuple[np.ndarray, int]:
    """Seconds from each ack (partition, offset, time rows) to the first poll seeing its offset;
    and how many were never seen."""
    visible: dict[tuple[int, int], float] = {}
    for p, o, t in zip(seen["partition"], seen["offset"], seen["time"], strict=True):
        key = (int(p), int(o))
        if key not in visible or t < visible[key]:
            visible[key] = t
    lags, missing = [], 0
    for p, o, t in acks:
        v = visible.get((int(p), int(o)))
        if v is None:
            missing += 1
        else:
            lags.append(v - t)
    return np.array(lags, dtype=np.float64), missing


def _settings(system) -> dict:
    from neve.config import load_config

    c = load_config(None, {**os.environ, **system.env}, dev=True).compactor
    return {"runner": c.runner, "freshness_ms": c.freshness_ms, "interval_ms": c.interval_ms, "parallelism": c.parallelism, "in_node": c.in_node}


def _load() -> float | None:
    from ..procstat import load_average

    return load_average()

"""freshness: seconds from a produce's acknowledgement to its row being visible to a reader of the
topic's Iceberg table, at a fixed produce rate, over one topic or many, with `neve dev`'s default
settings (the compactor in the node, the Spark runner, freshness 2 s, a cycle every second).

The topics are created in bulk; one confluent-kafka producer sends at a steady rate spread evenly
over every topic's partitions (a rate in MB/s, or records a second per topic) and keeps the
acknowledgement time of each record of a fixed sample of topics (all of them when few); a reader in
another process polls the sampled topics' tables through pyiceberg, round-robin, and stamps each
offset with the time of the load that first sees it. Production runs until the first snapshot of a
sampled table appears (the compactor's Spark session starts on the first cycle with work), then a
settling warm-up, then the measured window; only the sampled topics' records acknowledged inside
the window count. Afterwards each sampled table is checked whole: every acknowledged offset once."""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
import uuid

import numpy as np

from .. import many_topics, procstat, table_load
from ..options import size
from ..servers import free_port
from ..stats import MB, latency_ms
from ..systems import NeveDev
from ..table_poll import PollPlan, poll_main

NAME = "freshness"
HELP = "seconds from a produce's acknowledgement to its row being visible in the Iceberg table, at a fixed rate over one topic or many, neve dev's defaults"

P99_TARGET_S = 10.0  # issue 21
FIRST_SNAPSHOT_TIMEOUT_S = 300.0  # Spark's start on a loaded machine, and the first cycle's walk over the topics
DRAIN_S = 300.0  # after the last acknowledgement, for the sampled tables to show every record
LAG_EVERY_S = 10.0  # progress lines (and the lag timeline) while producing


def add_arguments(parser) -> None:
    parser.add_argument("--record-bytes", type=size, default=1024, help="value size (default 1KiB)")
    parser.add_argument("--codec", choices=table_load.CODECS, default="raw", help="raw values, or Confluent-framed Avro: avro (an order's flat fields) or avro-nested (with a list, a map, a decimal, a uuid and a time of day) (default raw)")
    parser.add_argument("--topics", type=int, default=1, help="topics, each with its table (default 1)")
    parser.add_argument("--partitions", type=int, default=None, help="partitions of each topic (default 4 for one topic, 1 for several)")
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument("--rate-mb", type=float, default=None, help="offered MB/s of values, spread evenly over the topics (default 2)")
    rate.add_argument("--records-per-topic-s", type=float, default=None, help="offered records a second to each topic, instead of --rate-mb")
    parser.add_argument("--sample-topics", type=int, default=20, help="topics whose tables the reader follows, spread evenly (default 20; all of them when fewer)")
    parser.add_argument("--drain-s", type=float, default=DRAIN_S, help=f"seconds after production for the sampled tables to show every record (default {DRAIN_S:g})")
    parser.add_argument("--poll-ms", type=int, default=200, help="the reader's shortest round over the sampled tables (default 200)")


def rate_of(a) -> float:
    """Offered records a second over every topic."""
    if a.records_per_topic_s is not None:
        return a.records_per_topic_s * a.topics
    return (2.0 if a.rate_mb is None else a.rate_mb) * MB / a.record_bytes


def run(r) -> None:
    a = r.args
    if a.topics < 1 or a.sample_topics < 1:
        raise ValueError("--topics and --sample-topics are at least 1")
    partitions = a.partitions if a.partitions is not None else (4 if a.topics == 1 else 1)
    timing = r.timing(full=(20.0, 60.0), quick=(1.0, 4.0))
    registry_port = free_port()
    a.broker_env = [*a.broker_env, ("NEVE_REGISTRY_PORT", str(registry_port))]
    system = r.make_system()
    if not isinstance(system, NeveDev):
        raise ValueError("freshness runs against --system neve-dev (its compactor runs in the node)")
    r.start_system()
    prefix = f"fresh-{a.codec}-{a.record_bytes}-{uuid.uuid4().hex[:8]}"
    names = [prefix] if a.topics == 1 else [f"{prefix}-{i:05d}" for i in range(a.topics)]
    r.progress.begin("topics")
    many_topics.create_topics(system.bootstrap, names, partitions, r.progress.line)
    schema_id = None
    if a.codec in table_load.SCHEMAS:
        for name in names:  # each topic's subject (TopicNameStrategy); the same schema, the same id
            schema_id = table_load.register_schema(registry_port, f"{name}-value", table_load.SCHEMAS[a.codec])
    pool = table_load.values(a.codec, a.record_bytes, schema_id)
    rate = rate_of(a)
    sampled = many_topics.sample(a.topics, a.sample_topics)
    followed = {names[i]: k for k, i in enumerate(sampled)}
    slots = len(sampled) * partitions
    r.progress.line(f"{a.topics:,} topics of {partitions} partitions; the reader follows {len(sampled)} of them; {rate:,.1f} records/s offered")

    ctx = multiprocessing.get_context("spawn")
    expect = ctx.Array("q", [-1] * slots, lock=False)
    highest = ctx.Array("q", [-1] * slots, lock=False)
    expected, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    plan = PollPlan(str(system.data_dir), tuple(names[i] for i in sampled), partitions, a.poll_ms / 1000)
    poller = ctx.Process(target=poll_main, args=(plan, expect, expected, highest, stop, results), daemon=True)
    poller.start()
    acks = many_topics.Acks(slots)
    phase = {"name": "until the first snapshot", "since": time.monotonic(), "report": time.monotonic()}
    window: dict[str, float] = {}
    timeline: list[list] = []
    began = time.monotonic()

    def report(now: float) -> None:
        lags = many_topics.current_lags(acks, highest, time.time())
        with_rows = sum(1 for k in range(len(sampled)) if max(highest[k * partitions : (k + 1) * partitions]) >= 0)
        p50, worst = (round(float(np.median(lags)), 1), round(max(lags), 1)) if lags else (None, None)
        timeline.append([round(now - began, 1), phase["name"], p50, worst])
        r.progress.line(f"{phase['name']}: {acks.acked:,} acknowledged; {with_rows} of {len(sampled)} sampled tables have rows; their lag p50 {p50} s, max {worst} s")
        system.check_alive()

    def until() -> bool:
        now = time.monotonic()
        if now - phase["report"] >= LAG_EVERY_S:
            phase["report"] = now
            report(now)
        if phase["name"] == "until the first snapshot":
            if max(highest) >= 0:
                r.progress.line(f"first rows in a sampled table after {now - phase['since']:.1f} s; settling {timing.warmup_s:g} s")
                phase.update(name="warm-up", since=now)
            elif now - phase["since"] > FIRST_SNAPSHOT_TIMEOUT_S:
                stop.set()
                raise TimeoutError(
                    f"no row in any of the {len(sampled)} sampled tables after {FIRST_SNAPSHOT_TIMEOUT_S:g} s of production "
                    f"({acks.acked:,} records acknowledged): the compactor committed nothing; see the node's log {system.log_path}"
                )
        elif phase["name"] == "warm-up" and now - phase["since"] >= timing.warmup_s:
            r.progress.line(f"the measured window: {timing.duration_s:g} s")
            phase.update(name="window", since=now)
            window["start"], window["cpu_start"], window["acked_start"] = time.time(), _node_cpu(system), acks.acked
        elif phase["name"] == "window" and now - phase["since"] >= timing.duration_s:
            window["end"], window["cpu_end"], window["acked_end"] = time.time(), _node_cpu(system), acks.acked
            return True
        return False

    r.progress.begin("produce")
    load_before = _load()
    many_topics.produce(system.bootstrap, names, partitions, pool, rate, followed, acks, until)
    for slot in range(slots):
        expect[slot] = acks.offsets[slot][-1] if acks.offsets[slot] else -1
    expected.set()
    produced_mb_s = acks.value_bytes / acks.seconds / MB
    r.progress.line(f"{acks.acked:,} records acknowledged ({acks.acked / acks.seconds:,.1f} records/s, {produced_mb_s:.3f} MB/s); waiting for the sampled tables to show theirs")
    # The reader's answer is read before it is joined: a process exits only once what it put on a
    # queue has been taken (182,000 offsets are more than a pipe holds).
    try:
        seen = results.get(timeout=a.drain_s)
    except queue.Empty:
        stop.set()
        seen = results.get(timeout=DRAIN_S)  # the reader's last round and its whole-table checks
    poller.join(30)
    load_after = _load()
    if "error" in seen:
        raise RuntimeError(f"the table reader failed: {seen['error']}")
    if acks.failed or acks.errors:
        r.fail(f"{acks.failed} records failed: {acks.errors[:3]}")

    in_window = _window(acks, window["start"], window["end"])
    lags, missing = _lags(in_window, seen)
    stats = latency_ms(lags)
    sampled_acked = [sum(len(acks.offsets[k * partitions + p]) for p in range(partitions)) for k in range(len(sampled))]
    table_rows, duplicates = sum(seen["table_rows"]), sum(seen["duplicates"])
    short = [plan.topics[k] for k in range(len(sampled)) if seen["table_rows"][k] != sampled_acked[k]]
    r.derived["freshness_s"] = {k: (v if k == "count" or v is None else round(v / 1000, 3)) for k, v in stats.items()}
    r.derived["freshness"] = {
        "topics": a.topics,
        "partitions": partitions,
        "sampled_topics": len(sampled),
        "records_in_window": len(in_window),
        "not_visible": missing,
        "acked": acks.acked,
        "sampled_acked": sum(sampled_acked),
        "table_rows": table_rows,
        "duplicate_rows": duplicates,
        "snapshots": seen["snapshots"],
        "polls": seen["polls"],
        "poll_round_s": seen["round_s"],
        "offered_records_per_s": round(rate, 1),
        "offered_mb_per_s": round(rate * a.record_bytes / MB, 4),
        "produced_mb_per_s": round(produced_mb_s, 4),
        "produce_s": round(acks.seconds, 3),
        "load_average": [load_before, load_after],
        "lag_timeline": timeline,
        "compactor": _settings(system),
    }
    node_cpu = window["cpu_end"] - window["cpu_start"] if window["cpu_start"] is not None and window["cpu_end"] is not None else None
    window_bytes = float(window["acked_end"] - window["acked_start"]) * a.record_bytes  # every topic's, not only the sampled
    f = r.derived["freshness"]
    f["node_cores"] = None if node_cpu is None else round(node_cpu / (window["end"] - window["start"]), 3)
    f["node_cpu_s_per_gib"] = None if node_cpu is None or not window_bytes else round(node_cpu / (window_bytes / 2**30), 1)
    fs = r.derived["freshness_s"]
    rounds = seen["round_s"] or {"p50": None, "max": None}
    r.derived.setdefault("tables", {})["Acknowledgement to visible row, seconds"] = {
        "headers": ["topics x partitions", "sampled", "records", "p50", "p99", "p99.9", "max", "not visible", "poll round p50, max s", "snapshots", "node cores", "node CPU-s/GiB", "load avg before, after"],
        "rows": [[f"{a.topics:,} x {partitions}", str(len(sampled)), f"{fs['count']:,}", str(fs["p50"]), str(fs["p99"]), str(fs["p999"]), str(fs["max"]), str(missing),
                  f"{rounds['p50']}, {rounds['max']}", str(seen["snapshots"]), str(f["node_cores"]), str(f["node_cpu_s_per_gib"]), f"{load_before}, {load_after}"]],  # fmt: skip
    }
    r.progress.line(
        f"freshness p50 {fs['p50']} s, p99 {fs['p99']} s over {fs['count']:,} records of {len(sampled)} sampled topics (of {a.topics:,}); "
        f"{missing} not visible; each sampled table polled every {rounds['p50']} s (max {rounds['max']} s)"
    )
    if missing:
        r.fail(f"{missing} acknowledged records of the window not visible within {a.drain_s:g} s of production's end")
        r.notes.append(f"The percentiles cover the {fs['count']:,} records that became visible: with {missing:,} never seen, they are lower bounds.")
    if duplicates or short:
        r.fail(f"the sampled tables hold {table_rows} rows ({duplicates} duplicates) for {sum(sampled_acked)} acknowledged records; short or over: {short[:5]}")
    r.target("table freshness p99 (s)", f"<= {P99_TARGET_S:g}", fs["p99"], None if fs["p99"] is None else fs["p99"] <= P99_TARGET_S)
    r.notes.append(
        f"{a.topics:,} topics of {partitions} partitions, {rate:,.1f} records/s spread evenly over them by one producer; the reader follows {len(sampled)} topics spread evenly over them "
        f"(only their records count: {fs['count']:,} acknowledged in the window), loading their tables one after another through pyiceberg in rounds of at least {a.poll_ms} ms. "
        f"A row's visibility time is when the load of its table that first holds its offset returned: an upper bound, by up to one round (p50 {rounds['p50']} s, max {rounds['max']} s here), "
        "so the figures are biased upward by up to that much. Acknowledgement and visibility times are both the machine's wall clock. "
        "Records acknowledged before the first rows of a sampled table (the compactor's Spark session starting) and during the warm-up do not count. "
        "Node cores and CPU-s per GiB are the whole `neve dev` process tree's (broker, registry, compactor, Spark's JVM and Python workers: not the compactor's alone) over the measured window, "
        "per GiB of values acknowledged in it over every topic. The exactly-once check covers the sampled tables, each whole."
    )


def _window(acks: many_topics.Acks, start: float, end: float) -> np.ndarray:
    """The followed records acknowledged in [start, end): (slot, offset, time) rows."""
    rows = []
    for slot in range(acks.slots):
        t = np.asarray(acks.times[slot], dtype=np.float64)
        o = np.asarray(acks.offsets[slot], dtype=np.float64)
        keep = (t >= start) & (t < end)
        rows.append(np.column_stack([np.full(int(keep.sum()), slot, dtype=np.float64), o[keep], t[keep]]))
    return np.concatenate(rows) if rows else np.zeros((0, 3))


def _node_cpu(system: NeveDev) -> float | None:
    """CPU-seconds of the node's process tree (its compactor's Spark JVM and workers are children)."""
    pids = system.broker_pids()
    cpus = [procstat.tree_cpu_seconds(pid) for pid in pids]
    return None if not pids or any(c is None for c in cpus) else sum(cpus)


def _lags(acks: np.ndarray, seen: dict) -> tuple[np.ndarray, int]:
    """Seconds from each ack (slot, offset, time rows) to the first poll seeing its offset; and how
    many were never seen."""
    visible: dict[tuple[int, int], float] = {}
    for s, o, t in zip(seen["slot"], seen["offset"], seen["time"], strict=True):
        key = (int(s), int(o))
        if key not in visible or t < visible[key]:
            visible[key] = t
    lags, missing = [], 0
    for s, o, t in acks:
        v = visible.get((int(s), int(o)))
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

"""One load step: create a fresh topic, start producer and consumer processes, let them warm up,
measure a window, drain, and turn what the workers saw into one step record.

A step with consumers and no producers reads a backlog (`Load.topic`, `Load.backlog_records`): its
consumers (assign() ones) start reading when the step runs, not when they are ready, and its window
closes once every consumer has read the backlog, if that comes before its duration; with no
warm-up the window is the whole read.

Throughput counts only acknowledgements inside the measured window; latency percentiles count
the records *sent* inside it (so slow acks of records sent late in the window still count). The
broker's CPU seconds and the object store's contents are read at the window's two edges.
"""

from __future__ import annotations

import multiprocessing
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import procstat, workers
from .progress import Progress
from .stats import MB, latency_ms, per_gib
from .systems import System

READY_TIMEOUT_S = 90.0
DRAIN_TIMEOUT_S = workers.FLUSH_TIMEOUT_S + 30.0
# The window opens after the warm-up once the producers have an acknowledgement, and closes after
# its duration once one more has arrived (a window of start-up or of a stall measures nothing);
# waiting for either longer than this fails the step.
ACK_WAIT_S = 60.0

# Client settings every step starts from; `--producer-config k=v` overrides them.
PRODUCER_DEFAULTS = {
    "acks": "all",
    # librdkafka sends one partition per ProduceRequest, and neve holds each request for its WAL
    # linger (200 ms): a short client linger turns into many small requests waiting at once.
    # 100 ms is what diskless brokers advise; the broker's own linger dominates latency anyway.
    "linger.ms": 100,
    "batch.size": 1_000_000,
    "compression.type": "none",
    # librdkafka's own default queue is 1 GiB: at saturation that measures the client's queue,
    # not the broker. 32 MiB keeps the broker's pipeline (linger buffer + uploads) full.
    "queue.buffering.max.kbytes": 32 * 1024,
    "queue.buffering.max.messages": 1_000_000,
    "log_level": 3,
}
CONSUMER_DEFAULTS = {"fetch.wait.max.ms": 500, "fetch.min.bytes": 1, "log_level": 3}

# The keys of every load step, in the order the JSON shows them.
STEP_KEYS = (
    "name",
    "system",
    "topic",
    "partitions",
    "record_bytes",
    "producers",
    "consumers",
    "mode",
    "offered_records_per_s",
    "warmup_s",
    "window_s",
    "produced",
    "acked",
    "failed",
    "unacknowledged",
    "transactions",
    "records_per_s",
    "mb_per_s",
    "ack_latency_ms",
    "backlog_records",
    "consumed_per_consumer",
    "consumer_offset_anomalies",
    "consume_mb_per_s",
    "e2e_latency_ms",
    "broker_cpu_s",
    "broker_cpu_s_per_gib_produced",
    "broker_cpu_s_per_gib_consumed",
    "client_cpu_s",
    "servers_cpu_s",
    "machine_busy_cores",
    "slow_wal_puts",
    "slow_wal_commits",
    "hedged_wal_puts",
    "produce_requests",
    "objects_put",
    "object_bytes_put",
    "mean_object_bytes",
    "store_puts",
    "store_gets",
    "step_objects_put",
    "step_store_puts",
    "step_hedged_wal_puts",
    "puts_per_gib",
    "stored_bytes_per_gib",
    "ratio_to_put_ceiling",
    "errors",
    "timeline",
)


@dataclass
class Load:
    name: str
    partitions: int
    record_bytes: int
    warmup_s: float
    duration_s: float
    producers: int = 1
    consumers: int = 0
    consumer_groups: bool = False  # each consumer subscribes in a group of its own (else assign())
    # producers send keyless records and let librdkafka's sticky partitioner fill one partition's
    # batch at a time (else each record goes to the next partition in turn, the worst case)
    keyless: bool = False
    topic: str | None = None  # an existing topic to produce to and read (else a fresh one)
    backlog_records: int = 0  # records already in `topic`: consumers read these first, then the step's
    rate: float | None = None  # total offered records/s; None: saturation
    stamp: bool = False
    producer_config: dict = field(default_factory=dict)
    consumer_config: dict = field(default_factory=dict)
    profile_path: Path | None = None  # py-spy flame graph of the broker over the window
    client: str = "c"  # producers: librdkafka driven from C ("c") or from Python ("python"); see bench/workers.py
    transaction_ms: int = 0  # producers (Python client only): transactional, committing this often; 0: not
    bootstrap: str | None = None  # the listener every client of the step connects to (else the system's bootstrap)
    connection: dict = field(default_factory=dict)  # librdkafka settings of every client: security.protocol, ssl.*, sasl.*


@dataclass
class StepOutcome:
    """The step record (JSON) plus the raw samples the plots need."""

    record: dict
    ack_latencies: np.ndarray
    e2e_latencies: np.ndarray


def create_topic(bootstrap: str, partitions: int, prefix: str, connection: dict | None = None) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = re.sub(r"[^a-zA-Z0-9._-]", "-", f"{prefix}-{uuid.uuid4().hex[:8]}")  # Kafka's legal topic characters
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3, **(connection or {})})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)], request_timeout=120, operation_timeout=120)
    futures[name].result(timeout=180)
    return name


def run_load(system: System, load: Load, progress: Progress) -> StepOutcome:
    ctx = multiprocessing.get_context("spawn")
    bootstrap = load.bootstrap or system.bootstrap
    topic = load.topic or create_topic(bootstrap, load.partitions, f"bench-{load.name}".replace(" ", "-")[:60], load.connection)
    n = load.producers + load.consumers
    control = ctx.Array("d", [workers.PREPARE, -1.0], lock=False)
    counters = ctx.Array("d", n * workers.SLOT, lock=False)
    results = ctx.Queue()
    stamp = load.stamp or load.consumers > 0
    hold = not load.producers and load.backlog_records > 0 and not load.consumer_groups
    plans = []
    for i in range(load.producers):
        rate = load.rate / load.producers if load.rate else None
        config = {**PRODUCER_DEFAULTS, **load.producer_config, **load.connection}
        plans.append(workers.WorkerPlan("producer", i, bootstrap, topic, load.partitions, load.record_bytes, rate, stamp, config, keyless=load.keyless, client=load.client, transaction_ms=load.transaction_ms))
    for j in range(load.consumers):
        config = {**CONSUMER_DEFAULTS, **load.consumer_config, **load.connection}
        plans.append(workers.WorkerPlan("consumer", load.producers + j, bootstrap, topic, load.partitions, load.record_bytes, None, stamp, config, load.consumer_groups, hold=hold))
    procs = []
    for plan in plans:
        target = workers.producer_main if plan.role == "producer" else workers.consumer_main
        p = ctx.Process(target=target, args=(plan, control, counters, results), name=f"bench-{plan.role}-{plan.index}", daemon=True)
        p.start()
        procs.append(p)
    outcomes: list[dict] = []
    try:
        _wait_ready(system, procs, counters, n, results, outcomes)
        return _measure(system, load, topic, procs, control, counters, results, outcomes, progress)
    finally:
        control[workers.PHASE] = workers.ABORT
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)


def _wait_ready(system, procs, counters, n, results, outcomes) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all(counters[i * workers.SLOT + workers.READY] for i in range(n)):
        system.check_alive()
        while not results.empty():  # a worker that failed before it was ready says why here
            outcomes.append(results.get())
        failed = [o for o in outcomes if o.get("error")]
        if failed:
            raise RuntimeError(f"{failed[0]['role']} {failed[0]['index']} failed while starting: {failed[0]['error']}")
        if any(not p.is_alive() for p in procs):
            raise RuntimeError("a load worker exited while starting")
        if time.monotonic() > deadline:
            raise TimeoutError(f"load workers not ready after {READY_TIMEOUT_S:.0f}s")
        time.sleep(0.02)


def _read(counters, load: Load, field_: int, roles: range) -> float:
    return sum(counters[i * workers.SLOT + field_] for i in roles)


def _measure(system, load, topic, procs, control, counters, results, outcomes, progress) -> StepOutcome:
    producers = range(load.producers)
    consumers = range(load.producers, load.producers + load.consumers)
    pids = [p.pid for p in procs] + [int(c) for c in counters[workers.CHILD_PID :: workers.SLOT] if c]
    quiet0 = _edge(system, pids)  # nothing produced yet: no upload in flight
    reading = not load.producers and load.backlog_records > 0  # a backlog read: closes once read
    edge0 = edge1 = None
    profiler = None
    if reading and not load.warmup_s:  # the whole read: the window opens before the consumers start
        edge0 = quiet0
        profiler = _start_profiler(system, load)
    started = time.monotonic()
    control[workers.PHASE] = workers.RUN
    t0 = started + load.warmup_s
    t1 = t0 + load.duration_s
    timeline = []
    last = (started, 0.0, 0.0, system.cpu_seconds() or 0.0)
    next_tick = started + 1.0
    acked_at_open = 0.0
    while edge1 is None:
        now = time.monotonic()
        acked = _read(counters, load, workers.ACKED, producers)
        if edge0 is None and now >= t0:
            if acked > 0 or not load.producers:
                edge0 = _edge(system, pids)
                acked_at_open = acked
                t1 = edge0.at + load.duration_s
                profiler = _start_profiler(system, load)
            elif now > t0 + ACK_WAIT_S:
                raise TimeoutError(f"no record acknowledged {load.warmup_s + ACK_WAIT_S:.0f}s into the step")
        if edge0 is not None and reading and all(counters[i * workers.SLOT + workers.CONSUMED] >= load.backlog_records for i in consumers):
            edge1 = _edge(system, pids)
            break
        if edge0 is not None and now >= t1:
            if acked > acked_at_open or not load.producers:
                edge1 = _edge(system, pids)
                break
            if now > t1 + ACK_WAIT_S:
                raise TimeoutError(f"no record acknowledged in the {now - edge0.at:.0f}s since the window opened")
        if now >= next_tick:
            system.check_alive()
            consumed = _read(counters, load, workers.CONSUMED, consumers)
            cpu = system.cpu_seconds() or 0.0
            dt = now - last[0]
            point = {
                "t": round(now - started, 2),
                "acked_mb_per_s": round((acked - last[1]) * load.record_bytes / MB / dt, 2),
                "consumed_mb_per_s": round((consumed - last[2]) * load.record_bytes / MB / dt, 2) if load.consumers else None,
                "broker_cpu_pct": round(100 * (cpu - last[3]) / dt, 1),
            }
            timeline.append(point)
            sent = _read(counters, load, workers.SENT, producers)
            phase = "warmup" if edge0 is None else "measure"
            progress.line(
                f"{phase:7s} t={point['t']:5.1f}s  acked {acked:>10,.0f}  {point['acked_mb_per_s']:7.2f} MB/s"
                f"  in flight {sent - acked:>8,.0f}"
                + (f"  consumed {point['consumed_mb_per_s']:7.2f} MB/s" if load.consumers else "")
                + f"  broker cpu {point['broker_cpu_pct']:5.1f}%"
            )
            last = (now, acked, consumed, cpu)
            next_tick += 1.0
        now = time.monotonic()
        edge = t0 if edge0 is None else t1
        wake = min(next_tick, edge if now < edge else now + 0.01)  # past an edge: waiting for an ack
        if reading and edge0 is not None:
            wake = min(wake, now + 0.05)  # the consumers' counters move every 0.2 s: see the end of the backlog soon after
        time.sleep(max(0.0, wake - now))
    control[workers.PHASE] = workers.STOP
    if profiler is not None:
        _finish_profiler(profiler, load, progress)
    progress.line("draining: waiting for every acknowledgement")
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while sum(1 for o in outcomes if o["role"] == "producer") < load.producers:
        outcomes.append(_get(results, deadline, system))
    control[workers.TARGET] = load.backlog_records + sum(o["acked"] for o in outcomes if o["role"] == "producer")
    while len(outcomes) < len(procs):
        outcomes.append(_get(results, deadline, system))
    quiet1 = _edge(system, pids)  # every record acknowledged, so every object stored
    return _summarize(system, load, topic, outcomes, edge0, edge1, t0, t1, timeline, quiet0, quiet1)


def _start_profiler(system: System, load: Load) -> subprocess.Popen | None:
    if load.profile_path is None:
        return None
    beside = Path(sys.executable).parent / "py-spy"  # a venv's scripts need not be on PATH
    exe = str(beside) if beside.exists() else shutil.which("py-spy")
    if exe is None:
        raise RuntimeError("--profile needs py-spy (pip install py-spy)")
    pid = system.broker_pids()[0]
    cmd = [exe, "record", "--pid", str(pid), "--duration", str(max(1, round(load.duration_s))), "--rate", "200", "--nonblocking", "--output", str(load.profile_path)]
    if load.profile_path.suffix == ".txt":
        cmd += ["--format", "raw"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _finish_profiler(profiler: subprocess.Popen, load: Load, progress: Progress) -> None:
    try:
        _, err = profiler.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        profiler.kill()
        _, err = profiler.communicate()
    if profiler.returncode == 0:
        progress.line(f"profile written to {load.profile_path}")
    else:
        progress.line(f"py-spy failed ({profiler.returncode}): {err.decode(errors='replace')[-300:]}")


def _get(results, deadline: float, system: System) -> dict:
    import queue

    while True:
        system.check_alive()
        try:
            return results.get(timeout=1.0)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise TimeoutError("load workers did not report before the drain deadline") from None


@dataclass
class _Edge:
    cpu: float | None
    client_cpu: float
    servers_cpu: dict[str, float | None]
    machine_busy: float
    metrics: dict[str, float]
    stored: object
    requests: dict[str, float] | None
    at: float


def _edge(system: System, pids: list[int]) -> _Edge:
    # The slow reads (listing an S3 prefix) come first, CPU and the clock last, so the window's
    # edges are where its CPU and acknowledgements are counted.
    stored, requests = system.stored_objects(), system.object_requests()
    client_cpu = sum(procstat.cpu_seconds(pid) or 0.0 for pid in pids)
    metrics = system.metrics()
    return _Edge(system.cpu_seconds(), client_cpu, system.servers.cpu_seconds(), procstat.machine_busy_seconds(), metrics, stored, requests, time.monotonic())


PRODUCE_REQUESTS = 'neve_requests_total{api="Produce"}'  # the broker's counter (broker/metrics.py)

# Slow WAL steps in a window, from the broker's histograms (neve only): PUTs over 0.5 s and
# commits over 0.25 s, the two places an acknowledgement can wait.
SLOW = {"slow_wal_puts": ("neve_wal_put_seconds", "0.5"), "slow_wal_commits": ("neve_wal_commit_seconds", "0.25")}


def _slow(edge0: _Edge, edge1: _Edge, metric: str, le: str) -> int | None:
    count, bucket = f"{metric}_count", f'{metric}_bucket{{le="{le}"}}'
    if count not in edge0.metrics or count not in edge1.metrics:
        return None
    over0 = edge0.metrics[count] - edge0.metrics.get(bucket, 0.0)
    over1 = edge1.metrics[count] - edge1.metrics.get(bucket, 0.0)
    return round(over1 - over0)


def _counter_delta(edge0: _Edge, edge1: _Edge, metric: str) -> int | None:
    if metric not in edge0.metrics or metric not in edge1.metrics:
        return None
    return round(edge1.metrics[metric] - edge0.metrics[metric])


def _request_delta(edge0: _Edge, edge1: _Edge, kind: str) -> int | None:
    if edge0.requests is None or edge1.requests is None:
        return None
    return round(edge1.requests.get(kind, 0.0) - edge0.requests.get(kind, 0.0))


def _summarize(system, load: Load, topic, outcomes, edge0: _Edge, edge1: _Edge, t0, t1, timeline, quiet0: _Edge, quiet1: _Edge) -> StepOutcome:
    prods = sorted((o for o in outcomes if o["role"] == "producer"), key=lambda o: o["index"])
    cons = sorted((o for o in outcomes if o["role"] == "consumer"), key=lambda o: o["index"])
    window = edge1.at - edge0.at
    ack_times = np.concatenate([np.frombuffer(o["ack_times"]) for o in prods]) if prods else np.empty(0)
    ack_lat = np.concatenate([np.frombuffer(o["latencies"]) for o in prods]) if prods else np.empty(0)
    in_window = (ack_times >= edge0.at) & (ack_times < edge1.at)
    window_acked = int(in_window.sum())
    sent_at = ack_times - ack_lat
    sent_in_window = ack_lat[(sent_at >= edge0.at) & (sent_at < edge1.at)]
    sent_in_window = sent_in_window[~np.isnan(sent_in_window)]
    produced_bytes = window_acked * load.record_bytes

    e2e = np.empty(0)
    consumed_in_window = 0
    if cons:
        recv = np.concatenate([np.frombuffer(o["recv_times"]) for o in cons])
        lat = np.concatenate([np.frombuffer(o["latencies"]) for o in cons])
        consumed_in_window = int(((recv >= edge0.at) & (recv < edge1.at)).sum())
        sent = recv - lat
        e2e = lat[(sent >= edge0.at) & (sent < edge1.at)]
    consumed_bytes = consumed_in_window * load.record_bytes

    cpu = None if edge0.cpu is None or edge1.cpu is None else round(edge1.cpu - edge0.cpu, 3)
    puts = put_bytes = None
    if edge0.stored is not None and edge1.stored is not None:
        puts = edge1.stored.objects - edge0.stored.objects
        put_bytes = edge1.stored.bytes - edge0.stored.bytes
    store_puts, store_gets = _request_delta(edge0, edge1, "PUT"), _request_delta(edge0, edge1, "GET")
    produced = sum(o["produced"] for o in prods)
    acked = sum(o["acked"] for o in prods)
    failed = sum(o["failed"] for o in prods)
    errors = [f"{o['role']} {o['index']}: {o['error']}" for o in outcomes if o.get("error")]
    errors += [f"producer {o['index']}: delivery failed: {o['first_error']}" for o in prods if o["first_error"]]
    record = {
        "name": load.name,
        "system": system.name,
        "topic": topic,
        "partitions": load.partitions,
        "record_bytes": load.record_bytes,
        "producers": load.producers,
        "consumers": load.consumers,
        "mode": "backlog-read" if not load.producers else "saturation" if load.rate is None else "fixed-rate",
        "offered_records_per_s": load.rate,
        "warmup_s": load.warmup_s,
        "window_s": round(window, 3),
        "produced": produced,
        "acked": acked,
        "failed": failed,
        "unacknowledged": produced - acked - failed,
        "transactions": sum(o.get("transactions", 0) for o in prods),
        "records_per_s": round(window_acked / window, 1),
        "mb_per_s": round(produced_bytes / MB / window, 3),
        "ack_latency_ms": latency_ms(sent_in_window),
        "backlog_records": load.backlog_records,
        "consumed_per_consumer": [o["consumed"] for o in cons],
        "consumer_offset_anomalies": sum(o["offset_anomalies"] for o in cons),
        "consume_mb_per_s": round(consumed_bytes / MB / window, 3) if cons else None,
        "e2e_latency_ms": latency_ms(e2e) if cons else None,
        "broker_cpu_s": cpu,
        "broker_cpu_s_per_gib_produced": per_gib(cpu, produced_bytes),
        "broker_cpu_s_per_gib_consumed": per_gib(cpu, consumed_bytes) if cons else None,
        "client_cpu_s": round(edge1.client_cpu - edge0.client_cpu, 3),
        # etcd's and SeaweedFS's CPU, and the whole machine's busy cores: on 2 cores the load
        # generator, the broker and the servers share the CPU, which the raw PUT ceiling does not
        "servers_cpu_s": procstat.cpu_delta(edge0.servers_cpu, edge1.servers_cpu),
        "machine_busy_cores": round((edge1.machine_busy - edge0.machine_busy) / window, 2),
        **{key: _slow(edge0, edge1, metric, le) for key, (metric, le) in SLOW.items()},
        # second PUTs raced against slow ones (wal/writer.py), counted in store_puts too
        "hedged_wal_puts": _counter_delta(edge0, edge1, "neve_wal_put_hedges_total"),
        # Produce requests the broker read in the window (neve only): librdkafka sends one per
        # partition, so at many partitions their count, not the bytes, sets the broker's CPU
        "produce_requests": _counter_delta(edge0, edge1, PRODUCE_REQUESTS),
        "objects_put": puts,
        "object_bytes_put": put_bytes,
        "mean_object_bytes": round(put_bytes / puts) if puts else None,
        "store_puts": store_puts,
        "store_gets": store_gets,
        # The same counts over the whole step, from before the first record to after the last
        # acknowledgement: no upload is in flight at either edge, so PUTs per object is exact there
        # (in the window, an upload crossing an edge counts on one side only).
        "step_objects_put": None if quiet0.stored is None or quiet1.stored is None else quiet1.stored.objects - quiet0.stored.objects,
        "step_store_puts": _request_delta(quiet0, quiet1, "PUT"),
        "step_hedged_wal_puts": _counter_delta(quiet0, quiet1, "neve_wal_put_hedges_total"),
        # PUT requests the store counted (overwrites included) when it counts them, else new objects
        "puts_per_gib": per_gib(store_puts if store_puts is not None else puts, produced_bytes),
        "stored_bytes_per_gib": per_gib(put_bytes, produced_bytes),
        "ratio_to_put_ceiling": None,  # filled by the scenario once its baseline is measured
        "errors": errors,
        "timeline": timeline,
    }
    assert tuple(record) == STEP_KEYS
    return StepOutcome(record, sent_in_window, e2e)


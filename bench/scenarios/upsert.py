"""upsert: what a compacted topic (cleanup.policy=compact) costs to keep as an upsert table, against
the same records appended (cleanup.policy=delete): per compaction cycle, the compactor's CPU, wall
time and every byte it writes (data files, position-delete files, removal object, manifests and
Iceberg metadata) against the bytes of the changed rows themselves; the read of a partition's
compacted range from offset 0 by a Kafka consumer; and the table's freshness while updates flow.

A `neve dev` node (its compactor off) takes N keys of ~100 B values into both topics (4 partitions,
confluent-kafka, keyed), then stops; `python -m bench.upsert_worker` compacts both (the initial
table). Then, C times: the node takes 1% of the keys again (random keys, a fixed seed) into both,
stops, and the worker runs and measures one cycle of each topic (the in-process runner unless
--runner spark). After the last cycle a consumer reads one partition of each topic from offset 0 to
its end. Last, the node runs with its compactor in it at its defaults while 1% of the keys is
updated every ~2 s; a reader in another process polls the upsert table through pyiceberg and
stamps each offset with the time of the load that first sees it. Every acknowledged record is
accounted for: afterwards the upsert table holds exactly one row per key, its latest value, and the
appended one every record once."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import subprocess
import sys
import time
import uuid

import numpy as np

from .. import procstat, table_load
from ..options import size
from ..stats import latency_ms
from ..systems import NeveDev
from ..table_poll import PollPlan, poll_main
from .freshness import _lags

NAME = "upsert"
HELP = "a compacted topic's upsert table: per-cycle CPU and bytes written against the changed rows, compacted-range read latency, table freshness; against the same records appended"

WRITTEN_TARGET = 3.0  # bytes a cycle writes / its changed rows' Parquet bytes
P99_TARGET_S = 10.0  # table freshness
WORKER_TIMEOUT_S = 3600
READ_TIMEOUT_S = 600.0
FIRST_CYCLE_TIMEOUT_S = 300.0  # Spark's start on a loaded machine
DRAIN_S = 300.0
WARM_KEYS = 100  # keyed records into the warm-up topic before each worker run
READS = 2  # reads of each partition: the first after the node's start, then again


def add_arguments(parser) -> None:
    parser.add_argument("--keys", type=int, default=None, help="keys of the compacted topic (default 1,000,000; --quick 10,000)")
    parser.add_argument("--cycles", type=int, default=None, help="measured update cycles (default 10; --quick 1)")
    parser.add_argument("--update-fraction", type=float, default=0.01, help="keys updated per cycle, and per --update-every-s while freshness is measured (default 0.01)")
    parser.add_argument("--update-every-s", type=float, default=2.0, help="while freshness is measured: seconds per --update-fraction of the keys (default 2)")
    parser.add_argument("--record-bytes", type=size, default=100, help="value size (default 100)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions per topic (default 4)")
    parser.add_argument("--runner", choices=["in-process", "spark"], default="in-process", help="the measured cycles' runner (default in-process); freshness runs the node's default")
    parser.add_argument("--seed", type=int, default=35, help="of the updated keys (default 35)")
    parser.add_argument("--poll-ms", type=int, default=200, help="the table reader's shortest round (default 200)")


class Keys:
    """The keys and what was acknowledged of them: each key's latest version and its partition.
    Key k is b"k%09d"; its version v's value is the key number and version, then random text
    (table_load's pool: no repeats zstd finds within a page) up to the value size."""

    def __init__(self, n: int, record_bytes: int) -> None:
        self.n = n
        self.record_bytes = record_bytes
        self.version = np.zeros(n, dtype=np.int32)
        self.partition = np.full(n, -1, dtype=np.int16)
        self.pool = table_load.values("raw", record_bytes)

    @staticmethod
    def key(k: int) -> bytes:
        return b"k%09d" % k

    def value(self, k: int, v: int) -> bytes:
        head = b"%09d.%06d." % (k, v)
        # a multiplier prime to the pool's size: keys and versions spread over all of it
        return head + self.pool[(k * 2_654_435_761 + v * 7_919) % len(self.pool)][: max(0, self.record_bytes - len(head))]

    def latest(self, k: int) -> bytes:
        return self.value(k, int(self.version[k]))


class Produced:
    """What one produce run saw: acknowledged and failed records, per (topic, partition), and (for
    the first topic, when asked) each acknowledgement's (partition, offset, wall-clock time)."""

    def __init__(self, keep_acks: bool) -> None:
        self.acked = self.failed = 0
        self.seconds = 0.0
        self.errors: list[str] = []
        self.per_partition: dict[tuple[str, int], int] = {}
        self.keep_acks = keep_acks
        self.acks: list[tuple[int, int, float]] = []


def produce(bootstrap: str, topics: list[str], keys: Keys, updates, *, bump: bool = True, rate: float | None = None, until=None, keep_acks: bool = False) -> Produced:
    """Each key number of `updates` (an iterable), as its next version (`bump`) or its current one,
    to every one of `topics`; at `rate` keys a second when given, until `until()` is true (asked
    every 100 keys). Each key's partition (librdkafka's hash of the key, the same in every topic)
    is kept from the first topic's acknowledgements."""
    from confluent_kafka import Producer

    out = Produced(keep_acks)
    first = topics[0]
    producer = Producer({"bootstrap.servers": bootstrap, **table_load.PRODUCER_CONFIG, "enable.idempotence": True})

    def delivered(err, msg) -> None:
        if err is not None:
            out.failed += 1
            if len(out.errors) < 10:
                out.errors.append(str(err))
            return
        out.acked += 1
        slot = (msg.topic(), msg.partition())
        out.per_partition[slot] = out.per_partition.get(slot, 0) + 1
        if msg.topic() == first:
            keys.partition[int(msg.key()[1:])] = msg.partition()
            if out.keep_acks:
                out.acks.append((msg.partition(), msg.offset(), time.time()))

    started = time.monotonic()
    for i, k in enumerate(updates):
        if until is not None and i % 100 == 0 and until():
            break
        if rate is not None:
            wait = started + i / rate - time.monotonic()
            if wait > 0.01:
                producer.poll(wait)
        k = int(k)
        if bump:
            keys.version[k] += 1
        key, value = Keys.key(k), keys.latest(k)
        for topic in topics:
            while True:
                try:
                    producer.produce(topic, value, key=key, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    out.seconds = time.monotonic() - started
    if left:
        out.errors.append(f"{left} records not acknowledged after 300 s")
    return out


def create(bootstrap: str, partitions: int, prefix: str, policy: str) -> str:
    """A topic of `partitions` with cleanup.policy `policy`."""
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1, config={"cleanup.policy": policy})], request_timeout=120, operation_timeout=120)
    futures[name].result(timeout=180)
    return name


class Ledger:
    """Every acknowledged record of the run, counted per (topic, partition), and the failures."""

    def __init__(self, r) -> None:
        self.r = r
        self.per_partition: dict[tuple[str, int], int] = {}

    def add(self, what: str, done: Produced, expected: int) -> None:
        if done.failed or done.errors or done.acked != expected:
            self.r.fail(f"{what}: {done.acked} of {expected} acknowledged, {done.failed} failed: {done.errors[:3]}")
        for slot, count in done.per_partition.items():
            self.per_partition[slot] = self.per_partition.get(slot, 0) + count

    def records(self, topic: str, partition: int | None = None) -> int:
        return sum(c for (t, p), c in self.per_partition.items() if t == topic and partition in (None, p))


def run(r) -> None:
    a = r.args
    n = a.keys if a.keys is not None else (10_000 if r.quick else 1_000_000)
    cycles = a.cycles if a.cycles is not None else (1 if r.quick else 10)
    per_cycle = max(1, int(n * a.update_fraction))
    # The node's own compactor stays off until the freshness phase: the worker runs the cycles.
    a.broker_env = [*a.broker_env, ("NEVE_COMPACTOR_IN_NODE", "false")]
    a.client = "python"  # every record here is produced from Python (keyed, confluent-kafka): the report says so
    system = r.make_system()
    if not isinstance(system, NeveDev):
        raise ValueError("upsert runs against --system neve-dev (the worker compacts its data dir)")
    r.start_system()
    upsert = create(system.bootstrap, a.partitions, "upsert", "compact")
    append = create(system.bootstrap, a.partitions, "append", "delete")
    warm = create(system.bootstrap, 1, "warm", "compact")
    topics = [upsert, append]
    keys, warm_keys = Keys(n, a.record_bytes), Keys(WARM_KEYS, a.record_bytes)
    ledger = Ledger(r)
    rng = np.random.default_rng(a.seed)
    r.derived["upsert"] = {"keys": n, "updates_per_cycle": per_cycle, "cycles": cycles, "partitions": a.partitions, "record_bytes": a.record_bytes, "runner": a.runner, "topics": {"upsert": upsert, "append": append}}

    r.progress.begin("initial")
    done = produce(system.bootstrap, topics, keys, range(n), bump=False)
    ledger.add("the initial keys", done, 2 * n)
    r.progress.line(f"{n:,} keys into {upsert} (compact) and {append} (delete) in {done.seconds:.1f} s")
    ledger.add("warm-up keys", produce(system.bootstrap, [warm], warm_keys, range(WARM_KEYS)), WARM_KEYS)
    r.stop_system(system)
    initial = _worker(r, system, a.runner, [warm], topics, "initial")
    rows = [_cycle_row(0, initial, upsert, append)]
    _line(r, rows[-1])

    for c in range(1, cycles + 1):
        r.progress.begin(f"cycle {c}")
        system.start()
        updated = rng.choice(n, size=per_cycle, replace=False)
        done = produce(system.bootstrap, topics, keys, updated)
        ledger.add(f"cycle {c}'s updates", done, 2 * per_cycle)
        ledger.add("warm-up keys", produce(system.bootstrap, [warm], warm_keys, range(WARM_KEYS)), WARM_KEYS)
        r.stop_system(system)
        rows.append(_cycle_row(c, _worker(r, system, a.runner, [warm], topics, f"cycle-{c}"), upsert, append))
        _line(r, rows[-1])
        if rows[-1]["upsert"]["rows"] != per_cycle or rows[-1]["append"]["rows"] != per_cycle:
            r.fail(f"cycle {c}: {rows[-1]['upsert']['rows']} and {rows[-1]['append']['rows']} rows committed for {per_cycle} acknowledged records each")
        if rows[-1]["upsert"]["rows_superseded"] != per_cycle:
            r.fail(f"cycle {c}: {rows[-1]['upsert']['rows_superseded']} rows superseded for {per_cycle} keys updated once")
    if rows[0]["upsert"]["rows"] != n or rows[0]["append"]["rows"] != n:
        r.fail(f"initial: {rows[0]['upsert']['rows']} and {rows[0]['append']['rows']} rows committed for {n:,} keys")
    r.derived["cycles"] = rows
    _cycle_tables(r, rows)

    r.progress.begin("read")
    system.start()
    reads = _reads(r, system, keys, ledger, upsert, append)
    r.derived["reads"] = reads

    r.progress.begin("freshness")
    r.stop_system(system)
    system.env.pop("NEVE_COMPACTOR_IN_NODE", None)  # now the node's compactor, at neve dev's defaults
    system.start()
    _freshness(r, system, keys, ledger, upsert, rng, per_cycle / a.update_every_s)
    r.stop_system(system)

    r.progress.begin("check")
    _check_tables(r, system, keys, ledger, upsert, append)


def _worker(r, system: NeveDev, runner: str, warm: list[str], measure: list[str], label: str) -> dict:
    log = r.out_dir / "compactor.log"
    command = [sys.executable, "-m", "bench.upsert_worker", "--data-dir", str(system.data_dir), "--runner", runner, "--warm", *warm, "--measure", *measure]
    started = time.monotonic()
    with open(log, "ab") as err:
        err.write(f"--- {label}\n".encode())
        err.flush()
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=err, timeout=WORKER_TIMEOUT_S, check=False)
    lines = [line for line in done.stdout.decode(errors="replace").splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"upsert worker ({label}) exited with {done.returncode} after {time.monotonic() - started:.0f} s; log {log}:\n{tail}")
    return json.loads(lines[-1][len("RESULT ") :])["topics"]


def _cycle_row(c: int, result: dict, upsert: str, append: str) -> dict:
    row: dict = {"cycle": c}
    for name, topic in (("upsert", upsert), ("append", append)):
        m = dict(result[topic])
        w = m.pop("written")
        m["written"] = w
        m["removal_bytes"] = w["removals"]
        m["manifest_bytes"] = w["cycle manifests"]
        m["iceberg_metadata_bytes"] = w["iceberg metadata"]
        m["other_bytes"] = w["other"]
        m["bytes_written"] = sum(w.values())
        # the changed rows: the cycle's own data files hold exactly them
        m["written_per_changed_byte"] = round(m["bytes_written"] / m["data_bytes"], 3) if m["data_bytes"] else None
        m["parquet_unaccounted"] = w["parquet"] - m["data_bytes"] - m["delete_bytes"]  # 0: every Parquet file is the cycle's data or deletes
        row[name] = m
    return row


def _line(r, row: dict) -> None:
    u, p = row["upsert"], row["append"]
    r.progress.line(
        f"cycle {row['cycle']}: upsert {u['rows']:,} rows, {u['rows_superseded']:,} superseded, {u['cpu_s']} CPU-s, {u['seconds']} s, "
        f"{u['bytes_written']:,} B written for {u['data_bytes']:,} B of changed rows ({u['written_per_changed_byte']}x); "
        f"append {p['cpu_s']} CPU-s, {p['bytes_written']:,} B ({p['written_per_changed_byte']}x); load {u['load_average']}"
    )


def _cycle_tables(r, rows: list[dict]) -> None:
    headers = ["cycle", "topic", "rows", "superseded", "CPU-s", "wall s", "changed rows B", "delete files B", "removal B", "cycle manifests B", "Iceberg metadata B", "written B", "written / changed", "load avg"]
    table = []
    for row in rows:
        for name in ("upsert", "append"):
            m = row[name]
            table.append([
                "initial" if row["cycle"] == 0 else str(row["cycle"]), name, f"{m['rows']:,}", f"{m['rows_superseded']:,}", f"{m['cpu_s']:.3f}", f"{m['seconds']:.3f}",
                f"{m['data_bytes']:,}", f"{m['delete_bytes']:,}", f"{m['removal_bytes']:,}", f"{m['manifest_bytes']:,}", f"{m['iceberg_metadata_bytes']:,}",
                f"{m['bytes_written']:,}", f"{m['written_per_changed_byte']}", f"{m['load_average']}",
            ])  # fmt: skip
    r.derived.setdefault("tables", {})["Compaction cycles: the compacted topic (upsert) against the same records appended"] = {"headers": headers, "rows": table}
    updates = rows[1:]
    if not updates:
        return
    summary = {}
    for name in ("upsert", "append"):
        ms = [row[name] for row in updates]
        ratios = [m["written_per_changed_byte"] for m in ms if m["written_per_changed_byte"] is not None]
        summary[name] = {
            "cpu_s_median": round(float(np.median([m["cpu_s"] for m in ms])), 3),
            "seconds_median": round(float(np.median([m["seconds"] for m in ms])), 3),
            "bytes_written_median": int(np.median([m["bytes_written"] for m in ms])),
            "data_bytes_median": int(np.median([m["data_bytes"] for m in ms])),
            "written_per_changed_byte_median": round(float(np.median(ratios)), 3) if ratios else None,
            "written_per_changed_byte_max": max(ratios) if ratios else None,
        }
    r.derived["cycles_summary"] = summary
    worst = summary["upsert"]["written_per_changed_byte_max"]
    r.target("bytes a cycle writes / its changed rows' bytes (upsert, worst cycle)", f"<= {WRITTEN_TARGET:g}", worst, None if worst is None else worst <= WRITTEN_TARGET)
    r.derived["tables"]["Update cycles, medians"] = {
        "headers": ["topic", "CPU-s", "wall s", "written B", "changed rows B", "written / changed (median, worst)"],
        "rows": [
            [name, f"{s['cpu_s_median']:.3f}", f"{s['seconds_median']:.3f}", f"{s['bytes_written_median']:,}", f"{s['data_bytes_median']:,}", f"{s['written_per_changed_byte_median']}, {s['written_per_changed_byte_max']}"]
            for name, s in summary.items()
        ],
    }


def read_partition(bootstrap: str, topic: str, partition: int) -> dict:
    """A consumer's read of `partition` from offset 0 to its end: seconds to the first record and
    to the end, and the records (offset, key, value)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"upsert-read-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False, "enable.partition.eof": True, "log_level": 3})
    got: list[tuple[int, bytes, bytes | None]] = []
    first = None
    started = time.monotonic()
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        while True:
            if time.monotonic() - started > READ_TIMEOUT_S:
                raise TimeoutError(f"{topic}[{partition}]: {len(got)} records, not at the end after {READ_TIMEOUT_S:g} s")
            for msg in consumer.consume(10_000, timeout=0.01):  # a short wait: the first record's time is when its batch returns
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        return {"first_s": first, "end_s": time.monotonic() - started, "records": got}
                    raise KafkaException(msg.error())
                if first is None:
                    first = time.monotonic() - started
                got.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()


def _reads(r, system: NeveDev, keys: Keys, ledger: Ledger, upsert: str, append: str) -> dict:
    """Partition 0 of each topic read from offset 0, READS times each in turn; the upsert topic's
    read must be one record per key of the partition, its latest, and the appended one's every
    record the partition has."""
    out: dict = {"upsert": [], "append": []}
    want_keys = np.flatnonzero(keys.partition == 0)
    for i in range(READS):
        for name, topic in (("upsert", upsert), ("append", append)):
            read = read_partition(system.bootstrap, topic, 0)
            records = read.pop("records")
            value_bytes = sum(len(v or b"") for _, _, v in records)
            out[name].append({"records": len(records), "first_s": round(read["first_s"], 3), "end_s": round(read["end_s"], 3), "value_mb_per_s": round(value_bytes / 1e6 / read["end_s"], 2)})
            r.progress.line(f"read {i + 1} of {name} partition 0: {len(records):,} records, first after {read['first_s']:.3f} s, the end after {read['end_s']:.3f} s")
            if any(b[0] <= a[0] for a, b in zip(records, records[1:], strict=False)):
                r.fail(f"{topic}[0]: offsets not strictly increasing")
            if name == "append":
                if len(records) != ledger.records(append, 0):
                    r.fail(f"{topic}[0]: {len(records)} records read for {ledger.records(append, 0)} acknowledged")
                continue
            read_keys = [int(k[1:]) for _, k, _ in records]
            if sorted(read_keys) != want_keys.tolist():
                r.fail(f"{topic}[0]: {len(records)} records read for {len(want_keys)} keys in the partition (or keys twice)")
            elif any(v != keys.latest(k) for k, (_, _, v) in zip(read_keys, records, strict=True)):
                r.fail(f"{topic}[0]: a key read with other than its latest value")
    headers = ["read", "topic", "records", "first record s", "to the end s", "MB/s of values"]
    rows = [[str(i + 1), name, f"{x['records']:,}", f"{x['first_s']:.3f}", f"{x['end_s']:.3f}", f"{x['value_mb_per_s']:.2f}"] for i in range(READS) for name in ("upsert", "append") for x in [out[name][i]]]
    r.derived.setdefault("tables", {})["Partition 0 read from offset 0 by a consumer, after the last cycle (the whole partition is the compacted range)"] = {"headers": headers, "rows": rows}
    return out


def _freshness(r, system: NeveDev, keys: Keys, ledger: Ledger, upsert: str, rng: np.random.Generator, rate: float) -> None:
    """Updates at `rate` keys a second into the upsert topic, the node's compactor at its
    defaults; the time from each acknowledgement to a pyiceberg load of the table that holds its
    row (table_poll.py), over a window after a warm-up, once the node's first cycle is in."""
    a = r.args
    timing = r.timing(full=(20.0, 60.0), quick=(1.0, 4.0))
    partitions = a.partitions
    ctx = multiprocessing.get_context("spawn")
    expect = ctx.Array("q", [-1] * partitions, lock=False)
    highest = ctx.Array("q", [-1] * partitions, lock=False)
    expected, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    plan = PollPlan(str(system.data_dir), (upsert,), partitions, a.poll_ms / 1000)
    poller = ctx.Process(target=poll_main, args=(plan, expect, expected, highest, stop, results), daemon=True)
    poller.start()
    ends_before = [ledger.records(upsert, p) for p in range(partitions)]  # the next offset of each partition
    phase = {"name": "until the node's first cycle", "since": time.monotonic()}
    window: dict[str, float] = {}
    load_before = procstat.load_average()

    def until() -> bool:
        now = time.monotonic()
        if phase["name"] == "until the node's first cycle":
            if any(highest[p] >= ends_before[p] for p in range(partitions)):
                r.progress.line(f"the node's first cycle is in the table after {now - phase['since']:.1f} s; settling {timing.warmup_s:g} s")
                phase.update(name="warm-up", since=now)
            elif now - phase["since"] > FIRST_CYCLE_TIMEOUT_S:
                stop.set()
                raise TimeoutError(f"no new row in the table after {FIRST_CYCLE_TIMEOUT_S:g} s of updates: see the node's log {system.log_path}")
        elif phase["name"] == "warm-up" and now - phase["since"] >= timing.warmup_s:
            r.progress.line(f"the measured window: {timing.duration_s:g} s")
            phase.update(name="window", since=now)
            window["start"] = time.time()
        elif phase["name"] == "window" and now - phase["since"] >= timing.duration_s:
            window["end"] = time.time()
            return True
        return False

    def forever():
        while True:
            yield int(rng.integers(keys.n))

    r.progress.line(f"{rate:,.0f} updates/s (random keys) into {upsert}, the node's compactor at its defaults")
    done = produce(system.bootstrap, [upsert], keys, forever(), rate=rate, until=until, keep_acks=True)
    ledger.add("the freshness phase's updates", done, done.acked + done.failed)
    acks = np.array(done.acks, dtype=np.float64).reshape(-1, 3)
    for p in range(partitions):
        mine = acks[acks[:, 0] == p]
        expect[p] = int(mine[:, 1].max()) if len(mine) else -1
    expected.set()
    try:
        seen = results.get(timeout=DRAIN_S)
    except queue.Empty:
        stop.set()
        seen = results.get(timeout=DRAIN_S)
    poller.join(30)
    if "error" in seen:
        raise RuntimeError(f"the table reader failed: {seen['error']}")
    in_window = acks[(acks[:, 2] >= window["start"]) & (acks[:, 2] < window["end"])]
    lags, missing = _lags(in_window, seen)
    stats = latency_ms(lags)
    fs = {k: (v if k == "count" or v is None else round(v / 1000, 3)) for k, v in stats.items()}
    settings = _settings(system)
    rounds = seen["round_s"] or {"p50": None, "max": None}
    load_after = procstat.load_average()
    r.derived["freshness_s"] = fs
    r.derived["freshness"] = {
        "updates_per_s": round(rate, 1),
        "acked": done.acked,
        "records_in_window": len(in_window),
        "not_visible": missing,
        "snapshots": seen["snapshots"],
        "poll_round_s": rounds,
        "table_rows": seen["table_rows"][0],
        "load_average": [load_before, load_after],
        "compactor": settings,
    }
    r.derived.setdefault("tables", {})["Table freshness while 1% of the keys is updated every ~2 s: acknowledgement to a pyiceberg load holding the row, seconds"] = {
        "headers": ["updates/s", "records", "p50", "p99", "p99.9", "max", "not visible", "poll round p50, max s", "snapshots", "compactor", "load avg before, after"],
        "rows": [
            [
                f"{rate:,.0f}",
                f"{fs['count']:,}",
                str(fs["p50"]),
                str(fs["p99"]),
                str(fs["p999"]),
                str(fs["max"]),
                str(missing),
                f"{rounds['p50']}, {rounds['max']}",
                str(seen["snapshots"]),
                f"{settings['runner']}, freshness {settings['freshness_ms']} ms",
                f"{load_before}, {load_after}",
            ]
        ],  # fmt: skip
    }
    r.progress.line(f"freshness p50 {fs['p50']} s, p99 {fs['p99']} s over {fs['count']:,} records; {missing} not visible; polled every {rounds['p50']} s")
    if missing:
        r.fail(f"{missing} acknowledged updates of the window not visible in the table")
    r.target("table freshness p99 (s), 1% of the keys updated every ~2 s", f"<= {P99_TARGET_S:g}", fs["p99"], None if fs["p99"] is None else fs["p99"] <= P99_TARGET_S)


def _settings(system: NeveDev) -> dict:
    from neve.config import load_config

    c = load_config(env={**os.environ, **system.env}, dev=True).compactor
    return {"runner": c.runner, "freshness_ms": c.freshness_ms, "interval_ms": c.interval_ms, "in_node": c.in_node}


def _check_tables(r, system: NeveDev, keys: Keys, ledger: Ledger, upsert: str, append: str) -> None:
    """The upsert table: exactly one row per key, its latest value; the appended one: every
    acknowledged record once (pyiceberg, the node stopped)."""
    import pyarrow.compute as pc

    from compactor.catalog import load_catalog
    from compactor.service import tables
    from neve.compaction import compactor_settings
    from neve.config import load_config
    from table.layout import KAFKA, KEY_RAW, OFFSET, PARTITION, VALUE_RAW

    settings = compactor_settings(load_config(None, dev=True, data_dir=str(system.data_dir)), str(system.data_dir))
    catalog = load_catalog(settings)
    rows = catalog.load_table(tables.table_identifier(settings.namespace, upsert, {})).scan(selected_fields=(KEY_RAW, VALUE_RAW)).to_arrow()
    found = [int(k[1:]) for k in rows.column(KEY_RAW).to_pylist()]
    values = rows.column(VALUE_RAW).to_pylist()
    wrong = sum(1 for k, v in zip(found, values, strict=True) if v != keys.latest(k))
    unique = len(set(found))
    check = {"upsert_rows": rows.num_rows, "keys": keys.n, "distinct_keys": unique, "not_latest": wrong}
    if rows.num_rows != keys.n or unique != keys.n or wrong:
        r.fail(f"the upsert table holds {rows.num_rows:,} rows of {unique:,} keys ({wrong:,} not their latest value) for {keys.n:,} keys")
    kafka = catalog.load_table(tables.table_identifier(settings.namespace, append, {})).scan(selected_fields=(KAFKA,)).to_arrow().column(KAFKA).combine_chunks()
    slots = pc.add(pc.multiply(kafka.field(PARTITION).cast("int64"), 1 << 40), kafka.field(OFFSET).cast("int64"))
    check |= {"append_rows": len(slots), "append_acked": ledger.records(append), "append_distinct": len(pc.unique(slots))}
    if len(slots) != ledger.records(append) or check["append_distinct"] != len(slots):
        r.fail(f"the appended table holds {len(slots):,} rows ({check['append_distinct']:,} distinct offsets) for {ledger.records(append):,} acknowledged records")
    r.derived["table_check"] = check
    r.progress.line(f"upsert table: {rows.num_rows:,} rows, {unique:,} keys, {wrong} not latest; appended table: {len(slots):,} rows for {ledger.records(append):,} acknowledged")
    r.notes.append(
        f"Cycles: `python -m bench.upsert_worker` runs compactor/service/loop.py's compact_topic on the {r.args.runner} runner over the stopped node's data dir, one topic after the other "
        "(a small compacted warm-up topic first, and each table loaded, unmeasured); CPU is the worker's process tree (procstat), wall the cycle's compact_topic calls. "
        "Bytes written are the files that appeared under the data dir's objects/ and warehouse/ during the topic's cycles: data files (the changed rows: the cycle's rows are exactly the records "
        "it compacted), position-delete files, the removal object, the cycle's manifest and the merged manifest of each partition it touched (compacted/), and the Iceberg metadata "
        "(manifests, manifest list, metadata JSON). Reads: a confluent-kafka consumer assigned partition 0 at offset 0, timed from assign() to the first record and to the partition's end "
        "(partition EOF), the records checked afterwards; one Python consumer takes each record through confluent-kafka's Message objects, so the time to the end includes the client's own "
        "cost per record (the same for both topics). Freshness: table_poll.py's reader loading the table through pyiceberg every poll round; a row's visibility time is the load "
        "that first holds its data file, an upper bound by up to one round. "
        f"Values: the key's number and version, then random letters to {r.args.record_bytes} B (table_load's pool: about 6 bits a byte for zstd)."
    )

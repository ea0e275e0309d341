"""catchup: a consumer reading a backlog from the start of a topic while production continues.

Three steps on one system:
1. backlog: one producer at saturation fills a fresh topic for `--backlog-s` seconds;
2. tail: the same fixed produce rate with a consumer tailing a fresh topic, the baseline for what
   catching up costs the producers;
3. catchup: the same fixed rate into the backlog topic, with one consumer reading it from offset 0.
   Its window (`--duration`, short of the backlog) is all catching up: the consumer's rate is the
   backlog read rate. Reads older than the broker's recent-objects cache (256 MiB by default) come
   from the object store: the GETs per GiB read say how.

Reads come from WAL objects; once compaction exists, the same steps will read Parquet.
"""

from __future__ import annotations

from ..load import Load
from ..options import size
from ..stats import MB, per_gib, ratio

NAME = "catchup"
HELP = "read a backlog from the start of a topic while production continues"


def add_arguments(parser) -> None:
    parser.add_argument("--record-bytes", type=size, default=1024, help="record size (default 1KiB)")
    parser.add_argument("--partitions", type=int, default=10, help="partitions (default 10)")
    parser.add_argument("--backlog-s", type=float, default=None, help="seconds of saturated production that make the backlog (default 15; quick 2)")
    parser.add_argument("--rate-mb", type=float, default=10.0, help="MB/s produced while the consumer catches up (default 10)")


def run(r) -> None:
    a = r.args
    backlog_s = a.backlog_s if a.backlog_s is not None else (2.0 if r.quick else 15.0)
    timing = r.timing(full=(1.0, 4.0), quick=(0.3, 1.0))
    rate = round(a.rate_mb * MB / a.record_bytes, 1)
    backlog = r.load(Load("backlog", a.partitions, a.record_bytes, timing.warmup_s, backlog_s))
    tail = r.load(Load("tail", a.partitions, a.record_bytes, timing.warmup_s, timing.duration_s, consumers=1, rate=rate, stamp=True))
    step = r.load(
        Load(
            "catchup", a.partitions, a.record_bytes, timing.warmup_s, timing.duration_s,
            consumers=1, rate=rate, stamp=True, topic=backlog["topic"], backlog_records=backlog["acked"],
        )
    )  # fmt: skip
    read_bytes = step["consume_mb_per_s"] * MB * step["window_s"] if step["consume_mb_per_s"] else 0
    figures = {
        "backlog_records": backlog["acked"],
        "backlog_mb": round(backlog["acked"] * a.record_bytes / MB, 1),
        "read_mb_per_s": step["consume_mb_per_s"],
        "read_vs_produce": ratio(step["consume_mb_per_s"], step["mb_per_s"]),
        "gets_per_gib_read": per_gib(step["store_gets"], read_bytes),
        "broker_cpu_s_per_gib_read": step["broker_cpu_s_per_gib_consumed"],
        "ack_p99_ms": step["ack_latency_ms"]["p99"],
        "ack_p99_ms_without_catchup": tail["ack_latency_ms"]["p99"],
    }
    r.derived["catchup"] = figures
    rows = [[k.replace("_", " "), "–" if v is None else f"{v:,}" if isinstance(v, int) else str(v)] for k, v in figures.items()]
    r.derived.setdefault("tables", {})["Catching up"] = {"headers": ["figure", "value"], "rows": rows}
    if figures["read_vs_produce"] is not None and figures["read_vs_produce"] < 1.5:
        r.notes.append("The consumer read at under 1.5x the produce rate in the window: it may have caught up before the window ended (use a longer --backlog-s).")
    r.notes.append(
        f"The backlog was {figures['backlog_mb']:,} MB ({backlog['acked']:,} records) in {a.partitions} partitions; the catch-up consumer reads it from offset 0 "
        "while one producer keeps the fixed rate; GETs are SeaweedFS's own request counts for the system's bucket in the window."
    )

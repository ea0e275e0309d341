"""partitions: the saturation produce step at 10, 100, 1,000 and 10,000 partitions, each as a ratio
of the 10-partition step, plotted as throughput against partition count. `--sink` runs every count
against the null object store too, which separates what the client and the broker path cost at
many partitions from what storing costs."""

from __future__ import annotations

from ..load import Load
from ..options import ints, size
from ..stats import ratio

NAME = "partitions"
HELP = "produce throughput at 10, 100, 1000 and 10000 partitions"


def add_arguments(parser) -> None:
    parser.add_argument("--counts", type=ints, default=None, help="partition counts (default 10,100,1000,10000; quick 10,100)")
    parser.add_argument("--with-10k", action="store_true", help="add a 10,000-partition step to --counts or the quick counts")
    parser.add_argument("--record-bytes", type=size, default=1024, help="record size (default 1KiB)")
    parser.add_argument("--producers", type=int, default=1, help="producer processes (default 1)")
    parser.add_argument("--sink", action="store_true", help="also run every count against the null object store")


def _scaling(r, steps: list[dict], title: str) -> tuple[dict, dict]:
    base = next((s for s in steps if s["partitions"] == 10), steps[0])
    rows = []
    for s in steps:
        rel = ratio(s["mb_per_s"], base["mb_per_s"])
        rows.append([str(s["partitions"]), f"{s['mb_per_s']:.2f}", "–" if rel is None else f"{rel:.2f}", str(s["ack_latency_ms"]["p99"]), str(s["broker_cpu_s_per_gib_produced"])])
    r.derived.setdefault("tables", {})[title] = {"headers": ["partitions", "MB/s", f"x {base['partitions']} partitions", "ack p99 ms", "CPU-s/GiB"], "rows": rows}
    return base, {str(s["partitions"]): ratio(s["mb_per_s"], base["mb_per_s"]) for s in steps}


def run(r) -> None:
    a = r.args
    timing = r.timing(full=(3.0, 8.0), quick=(0.5, 1.5))
    counts = a.counts or ([10, 100] if r.quick else [10, 100, 1000, 10000])
    if a.with_10k and 10000 not in counts:
        counts = [*counts, 10000]
    steps = [r.load(Load(f"p{n}", n, a.record_bytes, timing.warmup_s, timing.duration_s, producers=a.producers)) for n in counts]
    r.stop_system(r.system)
    base, r.derived["scaling"] = _scaling(r, steps, "Scaling against the 10-partition step")
    top = steps[-1]
    rel = ratio(top["mb_per_s"], base["mb_per_s"])
    r.target(f"throughput at {top['partitions']} partitions vs {base['partitions']}", ">= 0.80 (issue 5 sets it at 10,000 partitions)", rel, None if rel is None else rel >= 0.8)
    sink = r.make_sink() if a.sink else None
    if sink is not None:
        sink_steps = [r.load(Load(f"sink/p{n}", n, a.record_bytes, timing.warmup_s, timing.duration_s, producers=a.producers), sink) for n in counts]
        r.stop_system(sink)
        _, r.derived["sink_scaling"] = _scaling(r, sink_steps, "The same counts against the null object store (sink)")

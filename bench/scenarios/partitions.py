"""partitions: the saturation produce step at 10, 100, 1,000 and 10,000 partitions, each as a ratio
of the 10-partition step, plotted as throughput against partition count. `--sink` runs every count
against the null object store too, which separates what the client and the broker path cost at
many partitions from what storing costs; `--peer tansu` runs every count against tansu.

Records go to each partition in turn, so every partition is equally loaded: the worst case for
batching, since librdkafka sends one partition per ProduceRequest and at 10,000 partitions most
requests carry one record. `--keyless` sends keyless records instead and lets librdkafka's sticky
partitioner (KIP-480) fill one partition's batch at a time, as keyless producers do by default."""

from __future__ import annotations

from ..load import Load
from ..options import ints, size
from ..stats import ratio
from ..systems import PEERS

NAME = "partitions"
HELP = "produce throughput at 10, 100, 1000 and 10000 partitions"


def add_arguments(parser) -> None:
    parser.add_argument("--counts", type=ints, default=None, help="partition counts (default 10,100,1000,10000; quick 10,100)")
    parser.add_argument("--with-10k", action="store_true", help="add a 10,000-partition step to --counts or the quick counts")
    parser.add_argument("--record-bytes", type=size, default=1024, help="record size (default 1KiB)")
    parser.add_argument("--producers", type=int, default=1, help="producer processes (default 1)")
    parser.add_argument("--sink", action="store_true", help="also run every count against the null object store")
    parser.add_argument("--keyless", action="store_true", help="keyless records placed by librdkafka's sticky partitioner (default: each record to the next partition in turn)")
    parser.add_argument("--peer", choices=PEERS, default=None, help="also run every count against this peer, in the same run (tansu)")


def _cores(step: dict) -> list[str]:
    """Cores the broker, the client, etcd and the object store used over the step's window: at
    many partitions the one near 1.0 (or a machine near 2.0 in all) is what sets the rate."""
    window = step.get("window_s") or 0
    servers = step.get("servers_cpu_s") or {}
    used = [step.get("broker_cpu_s"), step.get("client_cpu_s"), servers.get("etcd"), servers.get("seaweedfs")]
    return ["–" if cpu is None or window <= 0 else f"{cpu / window:.2f}" for cpu in used]


def _requests(step: dict) -> list[str]:
    """Produce requests a second over the step's window, records per request, and broker CPU per
    request (the broker does nothing else in this scenario): librdkafka sends a request per
    partition, so at many partitions requests carry few records and their count sets the CPU.
    Dashes where the broker does not count them (the peer)."""
    requests, window = step.get("produce_requests"), step.get("window_s") or 0
    if not requests or window <= 0:
        return ["–", "–", "–"]
    records = step["records_per_s"] * window
    cpu = step.get("broker_cpu_s")
    return [f"{requests / window:,.0f}", f"{records / requests:.1f}", "–" if cpu is None else f"{cpu / requests * 1e6:.0f}"]


def _scaling(r, steps: list[dict], title: str) -> tuple[dict, dict]:
    base = next((s for s in steps if s["partitions"] == 10), steps[0])
    rows = []
    for s in steps:
        rel = ratio(s["mb_per_s"], base["mb_per_s"])
        rows.append([str(s["partitions"]), f"{s['mb_per_s']:.2f}", "–" if rel is None else f"{rel:.2f}", str(s["ack_latency_ms"]["p99"]), str(s["broker_cpu_s_per_gib_produced"]), *_requests(s), *_cores(s)])
    headers = ["partitions", "MB/s", f"x {base['partitions']} partitions", "ack p99 ms", "CPU-s/GiB", "Produce requests/s", "records per request", "broker µs per request"]
    headers += ["broker cores", "client cores", "etcd cores", "store cores"]
    r.derived.setdefault("tables", {})[title] = {"headers": headers, "rows": rows}
    return base, {str(s["partitions"]): ratio(s["mb_per_s"], base["mb_per_s"]) for s in steps}


def run(r) -> None:
    a = r.args
    timing = r.timing(full=(3.0, 8.0), quick=(0.5, 1.5))
    counts = a.counts or ([10, 100] if r.quick else [10, 100, 1000, 10000])
    if a.with_10k and 10000 not in counts:
        counts = [*counts, 10000]

    def sweep(prefix: str, system) -> list[dict]:
        """The saturation step at every count against `system`, which is then stopped."""
        steps = [r.load(Load(f"{prefix}p{n}", n, a.record_bytes, timing.warmup_s, timing.duration_s, producers=a.producers, keyless=a.keyless), system) for n in counts]
        r.stop_system(system)
        return steps

    steps = sweep("", r.make_system())
    r.notes.append("Records are keyless, placed by librdkafka's sticky partitioner." if a.keyless else "Each record goes to the next partition in turn (every partition equally loaded).")
    base, r.derived["scaling"] = _scaling(r, steps, "Scaling against the 10-partition step")
    top = steps[-1]
    rel = ratio(top["mb_per_s"], base["mb_per_s"])
    r.target(f"throughput at {top['partitions']} partitions vs {base['partitions']}", ">= 0.80 (issue 5 sets it at 10,000 partitions)", rel, None if rel is None else rel >= 0.8)
    sink = r.make_sink() if a.sink else None
    if sink is not None:
        sink_steps = sweep("sink/", sink)
        _, r.derived["sink_scaling"] = _scaling(r, sink_steps, "The same counts against the null object store (sink)")
        _against(r, steps, sink_steps, "sink")
    peer = r.make_peer()
    if peer is not None:
        peer_steps = sweep(f"{peer.name}/", peer)
        _, r.derived["peer_scaling"] = _scaling(r, peer_steps, f"The same counts against {peer.name}")
        _against(r, steps, peer_steps, peer.name)


def _against(r, steps: list[dict], others: list[dict], what: str) -> None:
    """neve's rate at each count as a ratio of another system's at the same count."""
    rows, ratios = [], {}
    for mine, theirs in zip(steps, others, strict=True):
        rel = ratio(mine["mb_per_s"], theirs["mb_per_s"])
        ratios[str(mine["partitions"])] = rel
        rows.append([str(mine["partitions"]), f"{mine['mb_per_s']:.2f}", f"{theirs['mb_per_s']:.2f}", "–" if rel is None else f"{rel:.2f}", f"{mine['broker_cpu_s_per_gib_produced']} / {theirs['broker_cpu_s_per_gib_produced']}"])
    r.derived[f"ratio_to_{what}"] = ratios
    r.derived.setdefault("tables", {})[f"neve against {what} at each count (neve / {what})"] = {
        "headers": ["partitions", "neve MB/s", f"{what} MB/s", f"× {what}", "CPU-s/GiB"],
        "rows": rows,
    }

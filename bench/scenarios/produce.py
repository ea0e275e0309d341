"""produce: throughput and acknowledgement latency for 100 B, 1 KiB and 64 KiB records, first at
saturation, then at a fixed offered rate below it; broker CPU per GiB; and each saturation step
as a ratio of the raw PUT ceiling measured at the object size that step produced."""

from __future__ import annotations

from ..load import Load
from ..options import size_label, sizes
from ..stats import GiB, MB, ratio

NAME = "produce"
HELP = "produce throughput and ack latency by record size, at saturation and at a fixed rate"
CPU_TARGET_S_PER_GIB = 10.0
QUANTUM = 256 * 1024


def add_arguments(parser) -> None:
    parser.add_argument("--sizes", type=sizes, default=[100, 1024, 65536], help="record sizes (default 100,1KiB,64KiB)")
    parser.add_argument("--partitions", type=int, default=10, help="partitions of each step's topic (default 10)")
    parser.add_argument("--producers", type=int, default=1, help="producer processes (default 1)")
    parser.add_argument("--fixed-fraction", type=float, default=0.5, help="fixed-rate steps offer this fraction of the saturation rate (default 0.5)")
    parser.add_argument("--rate-mb", type=float, default=None, help="fixed-rate steps offer this many MB/s instead")


def run(r) -> None:
    a = r.args
    timing = r.timing(full=(2.0, 10.0), quick=(0.5, 1.5))
    saturated = []
    for size in a.sizes:
        label = size_label(size)
        sat = r.load(Load(f"{label}-saturation", a.partitions, size, timing.warmup_s, timing.duration_s, producers=a.producers))
        saturated.append(sat)
        rate = a.rate_mb * MB / size if a.rate_mb else a.fixed_fraction * sat["records_per_s"]
        if rate > 0:
            r.load(Load(f"{label}-fixed", a.partitions, size, timing.warmup_s, timing.duration_s, producers=a.producers, rate=round(rate, 1)))
    judge(r, saturated)


def judge(r, saturated: list[dict]) -> None:
    """Ceiling ratios and the issue-5 targets that a produce run can judge."""
    wal = r.make_system().wal_settings()
    ceiling_timing = r.timing(full=(0.5, 3.0), quick=(0.2, 1.0))
    if r.args.duration is not None:  # --duration is for load steps; keep the baseline short
        ceiling_timing.duration_s = min(ceiling_timing.duration_s, 3.0)
    ceilings = {}
    for step in saturated:
        # One ceiling per object size the broker wrote, rounded to 256 KiB so near-equal sizes share it.
        object_bytes = max(QUANTUM, round((step["mean_object_bytes"] or wal.flush_bytes) / QUANTUM) * QUANTUM)
        if object_bytes not in ceilings:
            ceilings[object_bytes] = r.ceiling(f"put-ceiling-{object_bytes / 2**20:.2f}MiB", object_bytes, wal.max_inflight_uploads, ceiling_timing)
        base = ceilings[object_bytes]
        step["ratio_to_put_ceiling"] = ratio(step["mb_per_s"], base["mb_per_s"])
        r.target(f"{step['name']}: throughput vs raw PUT ceiling", ">= 0.80", step["ratio_to_put_ceiling"], None if step["ratio_to_put_ceiling"] is None else step["ratio_to_put_ceiling"] >= 0.8)
    for step in r.steps:
        cpu = step["broker_cpu_s_per_gib_produced"]
        r.target(f"{step['name']}: broker CPU-s per GiB produced", f"<= {CPU_TARGET_S_PER_GIB:.0f}", cpu, None if cpu is None else cpu <= CPU_TARGET_S_PER_GIB)
    # The bound takes the slowest PUT p99 among this run's ceilings: generous to the broker, whose
    # fixed-rate objects are smaller than the saturation objects those ceilings were measured at.
    put_p99 = max((b["put_latency_ms"]["p99"] or 0.0) for b in ceilings.values()) if ceilings else None
    for step in r.steps:
        if step["mode"] != "fixed-rate" or put_p99 is None:
            continue
        bound = wal.linger_ms + 2 * put_p99
        p99 = step["ack_latency_ms"]["p99"]
        r.target(f"{step['name']}: ack p99 (ms)", f"<= linger {wal.linger_ms} + 2 x PUT p99 {put_p99:.1f} = {bound:.1f}", p99, None if p99 is None else p99 <= bound)
    for step in saturated:
        mean = step["mean_object_bytes"]
        r.target(
            f"{step['name']}: WAL object size at saturation",
            f">= 90% of flush size {wal.flush_bytes:,} B",
            mean,
            None if mean is None else mean >= 0.9 * wal.flush_bytes,
        )
        if step["puts_per_gib"] is not None:
            ideal = GiB / wal.flush_bytes
            r.target(f"{step['name']}: PUTs per GiB", f"<= {ideal * 1.1:.0f} (one per {size_label(wal.flush_bytes)} object)", step["puts_per_gib"], step["puts_per_gib"] <= ideal * 1.1)
    r.notes.append("etcd is not in this system (embedded metadata), so the ack-latency bound has no etcd term; tansu is not measured in this run.")

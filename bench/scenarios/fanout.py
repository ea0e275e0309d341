"""fanout: one producer and 1, 3, 5 independent consumers that each read every partition (Ursa's
1:1, 1:3, 1:5). Each consumer is the one member of a consumer group of its own, subscribed
through the group protocol, as independent applications reading one topic are (`--assign`:
assigned partitions instead, no group protocol). The producer offers a fixed rate so the steps
are comparable; broker CPU per GiB consumed is the figure."""

from __future__ import annotations

from ..load import Load
from ..options import ints, size
from ..stats import MB

NAME = "fanout"
HELP = "1 producer, 1/3/5 independent consumers of all partitions"
CPU_TARGET_S_PER_GIB = 10.0


def add_arguments(parser) -> None:
    parser.add_argument("--consumer-counts", type=ints, default=[1, 3, 5], help="consumers per step (default 1,3,5)")
    parser.add_argument("--record-bytes", type=size, default=1024, help="record size (default 1KiB)")
    parser.add_argument("--partitions", type=int, default=10, help="partitions (default 10)")
    parser.add_argument("--rate-mb", type=float, default=10.0, help="offered MB/s; 0: saturation (default 10)")
    parser.add_argument("--assign", action="store_true", help="consumers assign() every partition instead of subscribing in groups")


def run(r) -> None:
    a = r.args
    timing = r.timing(full=(2.0, 8.0), quick=(0.5, 1.5))
    rate = round(a.rate_mb * MB / a.record_bytes, 1) if a.rate_mb else None
    for n in a.consumer_counts:
        step = r.load(Load(f"1-to-{n}", a.partitions, a.record_bytes, timing.warmup_s, timing.duration_s, consumers=n, consumer_groups=not a.assign, rate=rate, stamp=True))
        cpu = step["broker_cpu_s_per_gib_consumed"]
        r.target(f"1-to-{n}: broker CPU-s per GiB consumed (producing included)", f"<= {CPU_TARGET_S_PER_GIB:.0f}", cpu, None if cpu is None else cpu <= CPU_TARGET_S_PER_GIB)
    r.notes.append("CPU per GiB consumed divides all broker CPU in the window (producing included) by the bytes all consumers read.")
    r.notes.append("Consumers " + ("assign() every partition (no group protocol)." if a.assign else "each subscribe in a consumer group of their own (classic protocol): each group gets every partition."))

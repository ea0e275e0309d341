"""e2e: produce-to-consume latency for a tailing consumer. One producer offers a fixed rate with
its produce() time stamped into each value; one consumer reads every partition from the start of
a fresh topic and subtracts (both use the machine's monotonic clock)."""

from __future__ import annotations

from ..load import Load
from ..options import size
from ..stats import MB

NAME = "e2e"
HELP = "produce-to-consume latency percentiles for a tailing consumer"


def add_arguments(parser) -> None:
    parser.add_argument("--record-bytes", type=size, default=1024, help="record size (default 1KiB)")
    parser.add_argument("--partitions", type=int, default=10, help="partitions (default 10)")
    parser.add_argument("--rate-mb", type=float, default=5.0, help="offered MB/s (default 5)")


def run(r) -> None:
    a = r.args
    timing = r.timing(full=(2.0, 15.0), quick=(0.5, 2.0))
    rate = a.rate_mb * MB / a.record_bytes
    step = r.load(Load("tail", a.partitions, a.record_bytes, timing.warmup_s, timing.duration_s, consumers=1, rate=round(rate, 1), stamp=True))
    wal = r.make_system().wal_settings()
    if wal is not None:
        r.notes.append(
            f"End-to-end latency includes the broker's WAL linger ({wal.linger_ms} ms), the object PUT, the metadata commit and the consumer's fetch wake-up; "
            f"p50 {step['e2e_latency_ms']['p50']} ms."
        )

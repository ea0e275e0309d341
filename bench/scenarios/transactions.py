"""transactions: a transactional producer (a transaction committed every `--transaction-ms`, 100
by default) beside an idempotent one, in the same run, on the same system, at saturation: produce
MB/s and the broker's CPU seconds per GiB of each, and the transactional one as a ratio of the
idempotent one (the target: at least 0.8 of its throughput).

Both producers are librdkafka driven from Python (confluent-kafka): the C load generator has no
transactions, and comparing like with like needs one client (this scenario sets `--client
python`). A transaction's commit waits for its records' acknowledgements and then EndTxn (its
markers stored through the WAL), and the producer sends nothing meanwhile, so the ratio is the
share of time a producer spends sending.
"""

from __future__ import annotations

from ..load import Load
from ..options import size_label, sizes
from ..stats import ratio

NAME = "transactions"
HELP = "a transactional producer's throughput and broker CPU beside an idempotent one's"
TARGET = 0.8


def add_arguments(parser) -> None:
    parser.add_argument("--sizes", type=sizes, default=[1024], help="record sizes (default 1KiB)")
    parser.add_argument("--partitions", type=int, default=10, help="partitions of each step's topic (default 10)")
    parser.add_argument("--transaction-ms", type=int, default=100, help="how often the transactional producer commits (default 100 ms)")


def run(r) -> None:
    a = r.args
    a.client = "python"  # both producers (the C load generator has no transactions); the report says so
    system = r.make_system()
    timing = r.timing(full=(2.0, 10.0), quick=(0.5, 2.0))
    pairs = []
    for size in a.sizes:
        label = size_label(size)
        idempotent = r.load(Load(f"{label}-idempotent", a.partitions, size, timing.warmup_s, timing.duration_s, producer_config={"enable.idempotence": "true"}), system)
        transactional = r.load(Load(f"{label}-transactions-{a.transaction_ms}ms", a.partitions, size, timing.warmup_s, timing.duration_s, transaction_ms=a.transaction_ms), system)
        pairs.append((idempotent, transactional))
    r.stop_system(system)
    for idempotent, transactional in pairs:
        rel = ratio(transactional["mb_per_s"], idempotent["mb_per_s"])
        r.target(f"{transactional['name']}: throughput vs the idempotent producer", f">= {TARGET:.2f}", rel, None if rel is None else rel >= TARGET)
        cpu = ratio(transactional["broker_cpu_s_per_gib_produced"], idempotent["broker_cpu_s_per_gib_produced"])
        r.target(f"{transactional['name']}: broker CPU-s per GiB vs the idempotent producer", "reported", cpu, None)

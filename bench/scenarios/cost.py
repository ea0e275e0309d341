"""cost: object-store PUTs and bytes stored per GiB produced (counted in the object store itself),
GETs and metadata-store operations per GiB when the broker exposes counters for them, the keys
and bytes the metadata store (etcd) keeps per GiB, and what a month of this run's traffic would
cost at S3 list prices, in the shape of Ursa's Table 1."""

from __future__ import annotations

from ..load import Load
from ..options import size
from ..stats import MB, GiB

NAME = "cost"
HELP = "object-store PUTs/GETs, bytes stored, metadata operations and metadata bytes per GiB; month cost at S3 list prices"

# S3 Standard list prices (us-east-1), the ones Ursa's Table 1 uses.
PUT_PER_1000 = 0.005
GET_PER_1000 = 0.0004
STORAGE_PER_GB_MONTH = 0.023
MONTH_S = 30 * 24 * 3600
ETCD_DEFAULT_QUOTA = 2 * 2**30  # etcd's --quota-backend-bytes default

# Prometheus counters that count what this scenario wants, if the broker has them.
PUT_METRIC = "neve_wal_object_puts_total"
GET_METRICS = ("neve_object_gets_total", "neve_cache_object_gets_total")
METADATA_METRICS = ("neve_metadata_ops_total", "neve_metadata_operations_total", "neve_metadata_requests_total")


def add_arguments(parser) -> None:
    parser.add_argument("--record-bytes", type=size, default=1024, help="record size (default 1KiB)")
    parser.add_argument("--partitions", type=int, default=10, help="partitions (default 10)")
    parser.add_argument("--consumers", type=int, default=1, help="tailing consumers, so reads are counted too (default 1)")
    parser.add_argument(
        "--compact-every", type=float, default=0.0, metavar="S",
        help="with an etcd system: a stand-in compactor replaces all but each partition's newest two index entries by one every S seconds, with the real range replace, and etcd is sampled each time (default 0: off)",
    )


def _counter(metrics: dict[str, float], names) -> float | None:
    """Sum of every sample of the first named counter present (over all its label sets)."""
    for name in names:
        hits = [v for k, v in metrics.items() if k == name or k.startswith(name + "{")]
        if hits:
            return sum(hits)
    return None


def run(r) -> None:
    a = r.args
    system = r.start_system()
    timing = r.timing(full=(2.0, 10.0), quick=(0.5, 1.5))
    footprint_before = system.metadata_footprint()
    before, requests_before = system.metrics(), system.object_requests()
    compactor = _standin(r, system)
    try:
        step = r.load(Load("cost", a.partitions, a.record_bytes, timing.warmup_s, timing.duration_s, consumers=a.consumers))
    finally:
        if compactor is not None:
            compactor.stop()
    after, requests_after = system.metrics(), system.object_requests()
    footprint_after = system.metadata_footprint()
    produced_gib = step["produced"] * a.record_bytes / GiB  # the whole step: counters cover warm-up and drain too

    def delta(names):
        x, y = _counter(before, names), _counter(after, names)
        return None if x is None or y is None else y - x

    def store_delta(kind):
        if requests_before is None or requests_after is None:
            return None
        return requests_after.get(kind, 0.0) - requests_before.get(kind, 0.0)

    metric_puts = delta((PUT_METRIC,))
    store_puts, store_gets = store_delta("PUT"), store_delta("GET")
    gets = store_gets if store_gets is not None else delta(GET_METRICS)
    meta = delta(METADATA_METRICS)
    footprint_measured = footprint_before is not None and footprint_after is not None
    per = lambda v: None if v is None or produced_gib <= 0 else round(v / produced_gib, 2)  # noqa: E731
    r.derived["per_gib"] = {
        "puts_counted_in_store": per(store_puts) if store_puts is not None else step["puts_per_gib"],
        "puts_from_broker_metrics": per(metric_puts),
        "gets": per(gets),
        "metadata_ops": per(meta),
        "metadata_keys": per(footprint_after[0] - footprint_before[0]) if footprint_measured else None,
        "metadata_bytes": per(footprint_after[1] - footprint_before[1]) if footprint_measured else None,
        "stored_bytes": step["stored_bytes_per_gib"],
    }
    if compactor is not None:
        _standin_report(r, compactor)
    metadata_bytes = r.derived["per_gib"]["metadata_bytes"]
    if metadata_bytes and compactor is None:
        # Every index entry stays until compaction (next phase) replaces many by one: at this
        # rate, how long until etcd's default database quota is full.
        gib_to_quota = ETCD_DEFAULT_QUOTA / metadata_bytes
        hours = gib_to_quota * GiB / (step["mb_per_s"] * MB) / 3600 if step["mb_per_s"] else None
        r.derived["etcd_default_quota"] = {"gib_produced": round(gib_to_quota, 1), "hours_at_this_rate": None if hours is None else round(hours, 1)}
        r.notes.append(
            f"Metadata bytes per GiB: the growth of etcd's database in use over the step, its revision history compacted away before and after (what the keys themselves take: {metadata_bytes:,.0f} bytes per GiB produced). "
            f"Index entries are kept until compaction replaces them, so etcd's default 2 GiB quota (--quota-backend-bytes) fills after {gib_to_quota:,.0f} GiB produced"
            + (f", {hours:,.1f} hours at this run's rate." if hours is not None else ".")
        )
    elif not footprint_measured:
        r.notes.append("Metadata bytes per GiB: not measured (only an etcd metadata store is measured; run --system neve-s3).")
    if store_puts is not None:
        r.notes.append("PUTs and GETs per GiB are SeaweedFS's own S3 request counters for the system's bucket over the whole step (warm-up and drain included), divided by all bytes the step produced.")
    if gets is None:
        r.notes.append("GETs per GiB: not measured (a local-file store counts no requests; tail reads are served from the broker's recent-object cache).")
    if meta is None:
        r.notes.append("Metadata-store operations per GiB: not measured (the embedded store keeps no operation count; run --system neve-s3 for etcd's).")
    if metric_puts is None:
        r.notes.append(f"Broker metrics unavailable ({PUT_METRIC} not found); PUTs are counted in the object store only.")

    # A month of this run's traffic: the window's produce rate, sustained for 30 days.
    gib_month = step["mb_per_s"] * MB * MONTH_S / GiB
    puts_month = (r.derived["per_gib"]["puts_counted_in_store"] or 0) * gib_month
    gets_month = (per(gets) or 0) * gib_month
    stored_gb = (step["stored_bytes_per_gib"] or 0) * gib_month / 1e9
    rows = [
        ["S3 PUT requests", f"{puts_month:,.0f}", f"${puts_month / 1000 * PUT_PER_1000:,.2f}"],
        ["S3 GET requests", "not measured" if gets is None else f"{gets_month:,.0f}", "–" if gets is None else f"${gets_month / 1000 * GET_PER_1000:,.2f}"],
        ["Storage (WAL objects kept all month: no compaction yet)", f"{stored_gb:,.0f} GB", f"${stored_gb * STORAGE_PER_GB_MONTH:,.2f}"],
    ]
    total = puts_month / 1000 * PUT_PER_1000 + gets_month / 1000 * GET_PER_1000 + stored_gb * STORAGE_PER_GB_MONTH
    rows.append(["Total", "", f"${total:,.2f}"])
    r.derived["month_cost_usd"] = round(total, 2)
    r.derived.setdefault("tables", {})[f"A month at this run's {step['mb_per_s']:.1f} MB/s, S3 list prices"] = {"headers": ["item", "quantity", "cost"], "rows": rows}
    per_row = [[k.replace("_", " "), "not measured" if v is None else f"{v:,.2f}"] for k, v in r.derived["per_gib"].items() if k != "stored_bytes"]
    stored = step["stored_bytes_per_gib"]
    per_row.append(["bytes stored", "not measured" if stored is None else f"{stored / 2**30:.4f} GiB (WAL framing and footers included)"])
    r.derived["tables"]["Per GiB produced"] = {"headers": ["what", "per GiB"], "rows": per_row}


def _standin(r, system):
    """The stand-in compactor, started, when asked for and the system's metadata is in etcd."""
    url = system.describe().get("metadata", "")
    if not r.args.compact_every:
        return None
    if not url.startswith("etcd://"):
        r.notes.append("--compact-every: no stand-in compactor (only an etcd metadata store is measured; run --system neve-s3).")
        return None
    from ..standin_compactor import StandInCompactor

    return StandInCompactor(url, r.args.compact_every, r.args.record_bytes).start()


def _standin_report(r, compactor) -> None:
    """etcd over the run with the index kept short: keys and bytes against GiB produced."""
    samples = compactor.samples
    r.derived["metadata_over_time"] = {"samples": samples, "entries_replaced": compactor.replaced, "replaces_lost": compactor.lost}
    rows = [[f"{s['elapsed_s']:.0f}", f"{s['gib_produced']:.2f}", str(s["keys"]), f"{s['key_value_bytes']:,}", str(s["wal_index_records"]), str(s["index_entries"])] for s in samples]
    r.derived.setdefault("tables", {})[f"etcd with a stand-in compactor replacing every {r.args.compact_every:g} s"] = {
        "headers": ["s", "GiB produced", "live keys", "key and value bytes", "wal-index records", "index entries"],
        "rows": rows,
    }
    if len(samples) >= 4:
        half = len(samples) // 2
        early, late = samples[half - 1], samples[-1]
        r.notes.append(
            f"With the index replaced every {r.args.compact_every:g} s ({compactor.replaced:,} entries replaced, {compactor.lost} replaces lost): "
            f"{early['keys']} live keys and {early['key_value_bytes']:,} bytes at {early['gib_produced']:.2f} GiB produced, "
            f"{late['keys']} and {late['key_value_bytes']:,} at {late['gib_produced']:.2f} GiB."
        )

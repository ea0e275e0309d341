"""stored-bytes: bytes in the object store per byte produced, at steady state, with the compactor
in the node and the WAL sweeper deleting compacted objects (issue 22: stored bytes per produced
byte approach the Parquet ratio alone, the table's data files per produced byte).

A `neve dev` node (compactor in the node, sweeps every `--sweep-s` with a read grace of
`--grace-s`) takes raw values at a fixed rate for `--seconds`; what its data dir holds is sampled
every few seconds by kind: WAL objects, cycle manifests (compacted/), the table's data files and
its Iceberg metadata (metadata JSON, manifest lists and manifests). Steady state is the second half
of the window: the stored bytes it added per byte produced in it. Once production ends, the node
runs on until no WAL object is left (compacted and swept), and the whole is measured again."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from table.layout import KAFKA, OFFSET, PARTITION

from .. import procstat, table_load
from ..load import create_topic
from ..options import size
from ..stats import MB
from ..systems import NeveDev

NAME = "stored-bytes"
HELP = "object-store bytes (WAL, manifests, table files) per produced byte at steady state, the compactor and the WAL sweeper running"

KINDS = ("wal", "cycle_manifests", "table_data", "table_metadata", "other")
SAMPLE_EVERY_S = 2.0
SETTLE_TIMEOUT_S = 300.0
APPROACH = 1.10  # "approach the Parquet ratio alone": steady state within 10 % of it


def production_arguments(parser, rate_mb: float, seconds: float, quick_seconds: float) -> None:
    """The options of a fixed-rate production into a node whose compactor runs in it."""
    parser.add_argument("--record-bytes", type=size, default=1024, help="raw value size (default 1KiB)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions (default 4)")
    parser.add_argument("--rate-mb", type=float, default=rate_mb, help=f"MB/s of values produced (default {rate_mb:g})")
    parser.add_argument("--seconds", type=float, default=None, help=f"seconds of production (default {seconds:g}; --quick {quick_seconds:g})")
    parser.add_argument("--runner", choices=["in-process", "spark"], default="in-process", help="the compactor's runner (default in-process)")


def add_arguments(parser) -> None:
    production_arguments(parser, 2.0, 180.0, 6.0)
    parser.add_argument("--sweep-s", type=float, default=2.0, help="NEVE_WAL_SWEEP_INTERVAL_S (default 2)")
    parser.add_argument("--grace-s", type=float, default=5.0, help="NEVE_WAL_READ_GRACE_S (default 5)")
    parser.add_argument("--orphan-grace-s", type=float, default=30.0, help="NEVE_WAL_ORPHAN_GRACE_S (default 30; the broker's own is 3600)")


@dataclass(frozen=True, slots=True)
class Stored:
    """Files and bytes of each kind (KINDS) under a `neve dev` data dir."""

    files: dict[str, int]
    bytes: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


def stored(data_dir: Path) -> Stored:
    """What the node's object store and warehouse hold, by kind (uploads in progress left out)."""
    files = dict.fromkeys(KINDS, 0)
    sizes = dict.fromkeys(KINDS, 0)
    for top in ("objects", "warehouse"):
        for dirpath, _dirs, names in os.walk(data_dir / top):
            parts = Path(dirpath).relative_to(data_dir).parts
            kind = _kind(parts)
            for name in names:
                if ".tmp-" in name or name.startswith("."):
                    continue
                try:
                    n = os.stat(os.path.join(dirpath, name)).st_size
                except FileNotFoundError:
                    continue
                files[kind] += 1
                sizes[kind] += n
    return Stored(files, sizes)


def _kind(parts: tuple[str, ...]) -> str:
    if parts[:2] == ("objects", "wal"):
        return "wal"
    if parts[:2] == ("objects", "compacted"):
        return "cycle_manifests"
    if parts[0] == "warehouse" and "data" in parts:
        return "table_data"
    if parts[0] == "warehouse" and "metadata" in parts:
        return "table_metadata"
    return "other"


def table_files(data_dir: Path, topic: str) -> dict:
    """The current snapshot of `topic`'s table in a `neve dev` data dir: data files per table
    partition, their bytes, rows, rows with an offset another row has too, and snapshots."""
    import numpy as np
    from pyiceberg.exceptions import NoSuchTableError

    from compactor.catalog import load_catalog
    from compactor.service import tables
    from neve.compaction import compactor_settings
    from neve.config import load_config

    settings = compactor_settings(load_config(None, dev=True, data_dir=str(data_dir)), str(data_dir))
    catalog = load_catalog(settings)
    try:
        table = catalog.load_table(tables.table_identifier(settings.namespace, topic, {}))
    except NoSuchTableError:
        return {"files": 0, "bytes": 0, "rows": 0, "duplicates": 0, "per_partition": {}, "snapshots": 0}
    if table.current_snapshot() is None:
        return {"files": 0, "bytes": 0, "rows": 0, "duplicates": 0, "per_partition": {}, "snapshots": len(table.snapshots())}
    files = table.inspect.files().to_pylist()
    data = [f for f in files if f["content"] == 0]
    per = Counter(str(sorted((f["partition"] or {}).items())) for f in data)
    kafka = table.scan(selected_fields=(KAFKA,)).to_arrow().column(KAFKA).combine_chunks()
    keys = kafka.field(PARTITION).to_numpy().astype(np.int64) << 40 | kafka.field(OFFSET).to_numpy().astype(np.int64)
    return {
        "files": len(data),
        "bytes": sum(f["file_size_in_bytes"] for f in data),
        "rows": len(keys),
        "duplicates": int(len(keys) - len(np.unique(keys))),
        "per_partition": dict(per),
        "snapshots": len(table.snapshots()),
    }


def gc_env(runner: str, sweep_s: float, grace_s: float, orphan_grace_s: float) -> list[tuple[str, str]]:
    """The node's settings: the compactor in the node, the sweeper on short intervals."""
    return [
        ("NEVE_WAL_ORPHAN_GRACE_S", f"{orphan_grace_s:g}"),
        ("NEVE_COMPACTOR_IN_NODE", "true"),
        ("NEVE_COMPACTOR_RUNNER", runner),
        ("NEVE_WAL_SWEEP_INTERVAL_S", f"{sweep_s:g}"),
        ("NEVE_WAL_READ_GRACE_S", f"{grace_s:g}"),
    ]


def run(r) -> None:
    a = r.args
    seconds = a.seconds if a.seconds is not None else (6.0 if r.quick else 180.0)
    a.broker_env = [*a.broker_env, *gc_env(a.runner, a.sweep_s, a.grace_s, a.orphan_grace_s)]
    system = r.make_system()
    if not isinstance(system, NeveDev):
        raise ValueError("stored-bytes runs against --system neve-dev (its data dir is measured)")
    r.start_system()
    topic = create_topic(system.bootstrap, a.partitions, f"stored-{a.record_bytes}")
    pool = table_load.values("raw", a.record_bytes)
    rate = a.rate_mb * MB / a.record_bytes

    samples: list[dict] = []
    sent = [0]  # records handed to the producer so far (every value is record_bytes long)
    asked = [0]
    t0 = time.monotonic()
    stop = threading.Event()

    def sample(phase: str) -> dict:
        s = stored(system.data_dir)
        point = {"t": round(time.monotonic() - t0, 2), "phase": phase, "produced_bytes": sent[0] * a.record_bytes, "bytes": s.bytes, "files": s.files, "total": s.total}
        samples.append(point)
        return point

    def sampler() -> None:
        while not stop.wait(SAMPLE_EVERY_S):
            p = sample("production")
            r.progress.line(_line(p))

    def until() -> bool:
        asked[0] += 1  # asked before records 0, 100, 200, ...
        sent[0] = 100 * (asked[0] - 1)
        return time.monotonic() - t0 >= seconds

    r.progress.begin("produce")
    load_before = procstat.load_average()
    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    produced = table_load.produce(system.bootstrap, topic, a.partitions, pool, rate=rate, until=until)
    stop.set()
    thread.join()
    sent[0] = produced.acked + produced.failed
    end = sample("end of production")
    if produced.failed or produced.errors:
        r.fail(f"{produced.failed} records failed: {produced.errors[:3]}")

    settled = _settle(r, system, sample, end) if a.orphan_grace_s <= SETTLE_TIMEOUT_S else None
    if settled is None:
        r.notes.append(f"Not waited for the WAL to empty: the orphan grace ({a.orphan_grace_s:g} s) is longer than the wait ({SETTLE_TIMEOUT_S:g} s).")
    deleted = _deleted(system.metrics())
    table = table_files(system.data_dir, topic)
    if settled is not None and (table["rows"] != produced.acked or table["duplicates"]):
        r.fail(f"the table holds {table['rows']} rows ({table['duplicates']} duplicates) for {produced.acked} acknowledged records")
    figures = _figures([s for s in samples if s["phase"] == "production"], end, settled, produced.value_bytes)
    figures.update(
        record_bytes=a.record_bytes, rate_mb_per_s=a.rate_mb, seconds=seconds, acked=produced.acked,
        produced_mb=round(produced.value_bytes / MB, 2), sweep_interval_s=a.sweep_s, read_grace_s=a.grace_s, runner=a.runner,
        orphan_grace_s=a.orphan_grace_s, wal_deleted=deleted, table_rows=table["rows"], duplicate_rows=table["duplicates"], table_files=table["files"], load_average=[load_before, procstat.load_average()],
    )  # fmt: skip
    r.derived["stored_bytes"] = figures
    r.derived["samples"] = samples
    r.derived.setdefault("tables", {})["Stored bytes per produced byte"] = {
        "headers": ["when", "produced MB", "stored MB", "WAL MB (objects)", "cycle manifests MB", "table data MB (files)", "table metadata MB (files)", "stored / produced", "table data / produced"],
        "rows": [_row("end of production", end)] + ([_row("settled (no WAL object left)", settled)] if settled is not None else []),
    }
    r.derived["tables"]["Steady state: the second half of production"] = {
        "headers": ["stored / produced", "table data / produced (the Parquet ratio)", "ratio of the two", "WAL held at the end (s of production)"],
        "rows": [[str(figures["steady_stored_per_produced"]), str(figures["steady_parquet_per_produced"]), str(figures["steady_over_parquet"]), str(figures["wal_seconds_held"])]],
    }
    ratio = figures["steady_over_parquet"]
    r.target("stored bytes per produced byte at steady state / the Parquet ratio alone", f"<= {APPROACH}", ratio, None if ratio is None else ratio <= APPROACH)
    r.notes.append(
        "Produced bytes are the record values sent (the WAL stores them in record batches, a few bytes more per record). Stored bytes are every file under the node's objects/ "
        "(WAL objects, cycle manifests) and warehouse/ (the table's data files and Iceberg metadata); the metadata store and the catalog (SQLite) are not counted. "
        f"The sweeper deleted {deleted['unreferenced']['objects']:,} WAL objects ({deleted['unreferenced']['bytes'] / MB:.1f} MB) as unreferenced (seen named by an index entry, then not for the read grace) and "
        f"{deleted['orphan']['objects']:,} ({deleted['orphan']['bytes'] / MB:.1f} MB) as orphans (never seen referenced by a sweep: committed and compacted between two, deleted once older than the orphan grace, {a.orphan_grace_s:g} s). "
        f"The steady state compares what was stored and produced between the sample nearest the middle of production and the last one of it; the sweeper ran every {a.sweep_s:g} s with a {a.grace_s:g} s read grace."
    )


def _settle(r, system: NeveDev, sample, end: dict) -> dict:
    """Samples until no WAL object is left (compacted and swept): the last one."""
    r.progress.begin("settle")
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        p = sample("settling")
        if p["files"]["wal"] == 0:
            break
        r.progress.line(_line(p))
        if time.monotonic() > deadline:
            r.fail(f"{p['files']['wal']} WAL objects ({p['bytes']['wal']:,} bytes) left {SETTLE_TIMEOUT_S:g} s after production ended")
            break
        time.sleep(SAMPLE_EVERY_S)
    r.progress.line(f"settled after {p['t'] - end['t']:.1f} s: stored {p['total'] / MB:.1f} MB for {p['produced_bytes'] / MB:.1f} MB produced")
    return p


def _line(p: dict) -> str:
    b, f = p["bytes"], p["files"]
    return f"measured t={p['t']:6.1f}s produced {p['produced_bytes'] / MB:8.1f} MB  stored {p['total'] / MB:8.1f} MB  WAL {b['wal'] / MB:6.1f} MB in {f['wal']} objects  table {b['table_data'] / MB:8.1f} MB in {f['table_data']} files"


def _deleted(metrics: dict[str, float]) -> dict[str, dict[str, int]]:
    """WAL objects and bytes the sweeper deleted, by reason, from the node's counters."""
    return {
        reason: {
            "objects": round(metrics.get(f'neve_wal_objects_deleted_total{{reason="{reason}"}}', 0.0)),
            "bytes": round(metrics.get(f'neve_wal_bytes_deleted_total{{reason="{reason}"}}', 0.0)),
        }
        for reason in ("unreferenced", "orphan")
    }


def _figures(during: list[dict], end: dict, settled: dict | None, produced_bytes: int) -> dict:
    mid = during[len(during) // 2] if during else None
    steady = parquet = over = None
    if mid is not None and end["produced_bytes"] > mid["produced_bytes"]:
        added = end["produced_bytes"] - mid["produced_bytes"]
        steady = round((end["total"] - mid["total"]) / added, 4)
        parquet = round((end["bytes"]["table_data"] - mid["bytes"]["table_data"]) / added, 4)
        over = round(steady / parquet, 3) if parquet else None
    rate = end["produced_bytes"] / end["t"] if end["t"] else 0
    return {
        "steady_stored_per_produced": steady,
        "steady_parquet_per_produced": parquet,
        "steady_over_parquet": over,
        "end_stored_per_produced": round(end["total"] / produced_bytes, 4) if produced_bytes else None,
        "settled_stored_per_produced": round(settled["total"] / produced_bytes, 4) if settled and produced_bytes else None,
        "settled_parquet_per_produced": round(settled["bytes"]["table_data"] / produced_bytes, 4) if settled and produced_bytes else None,
        "wal_bytes_at_end": end["bytes"]["wal"],
        "wal_objects_at_end": end["files"]["wal"],
        "wal_seconds_held": round(end["bytes"]["wal"] / rate, 1) if rate else None,
        "settled": None if settled is None else {"bytes": settled["bytes"], "files": settled["files"]},
        "settle_s": None if settled is None else round(settled["t"] - end["t"], 1),
    }


def _row(when: str, p: dict) -> list[str]:
    b, f = p["bytes"], p["files"]
    produced = p["produced_bytes"]
    return [
        when, f"{produced / MB:.1f}", f"{p['total'] / MB:.1f}", f"{b['wal'] / MB:.1f} ({f['wal']})", f"{b['cycle_manifests'] / MB:.2f}",
        f"{b['table_data'] / MB:.1f} ({f['table_data']})", f"{b['table_metadata'] / MB:.2f} ({f['table_metadata']})",
        f"{p['total'] / produced:.4f}" if produced else "–", f"{b['table_data'] / produced:.4f}" if produced else "–",
    ]  # fmt: skip

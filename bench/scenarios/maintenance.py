"""maintenance: data files per table partition before and after neve's table maintenance (issue
22: frequent commits make small files; maintenance merges them into files of the target size,
expires old snapshots and deletes the files only they held, and the Kafka view stays whole).

A `neve dev` node with the compactor in it, frequent cycles (`--freshness-ms`) and maintenance
off takes raw values at a fixed rate; once the table holds every acknowledged record, the files of
its current snapshot are counted per table partition, and those on disk. The node is then started
again with maintenance every `--interval-ms` (merge from `--min-files` small files, snapshots
expired after `--snapshot-age-ms`, unnamed files deleted after `--delete-grace-ms`), and runs until
no table partition has `--min-files` files left and the disk holds only the current snapshot's
files; they are counted again. A consumer then reads the topic from offset 0: every record, once,
in order (served from the merged files)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from .. import procstat, table_load
from ..load import create_topic
from ..stats import MB
from ..systems import NeveDev
from .catchup_table import read_topic
from .stored_bytes import production_arguments, stored, table_files

NAME = "maintenance"
HELP = "data files per table partition before and after table maintenance (merge, snapshot expiry, file deletion), and the Kafka view after it"

WAIT_S = 300.0
POLL_S = 1.0


def add_arguments(parser) -> None:
    production_arguments(parser, 1.0, 60.0, 3.0)
    parser.add_argument("--freshness-ms", type=int, default=500, help="NEVE_COMPACTOR_FRESHNESS_MS while producing (default 500: a small file per partition and cycle)")
    parser.add_argument("--interval-ms", type=int, default=2000, help="NEVE_COMPACTOR_MAINTENANCE_INTERVAL_MS once maintenance is on (default 2000)")
    parser.add_argument("--min-files", type=int, default=5, help="NEVE_COMPACTOR_MERGE_MIN_FILES (default 5)")
    parser.add_argument("--snapshot-age-ms", type=int, default=5000, help="NEVE_COMPACTOR_SNAPSHOT_MAX_AGE_MS once maintenance is on (default 5000)")
    parser.add_argument("--delete-grace-ms", type=int, default=5000, help="NEVE_COMPACTOR_FILE_DELETE_GRACE_MS once maintenance is on (default 5000)")


def run(r) -> None:
    a = r.args
    seconds = a.seconds if a.seconds is not None else (3.0 if r.quick else 60.0)
    a.broker_env = [
        *a.broker_env,
        ("NEVE_COMPACTOR_IN_NODE", "true"),
        ("NEVE_COMPACTOR_RUNNER", a.runner),
        ("NEVE_COMPACTOR_FRESHNESS_MS", str(a.freshness_ms)),
        ("NEVE_COMPACTOR_MAINTENANCE_INTERVAL_MS", "0"),
    ]
    system = r.make_system()
    if not isinstance(system, NeveDev):
        raise ValueError("maintenance runs against --system neve-dev (its table is inspected)")
    r.start_system()
    topic = create_topic(system.bootstrap, a.partitions, f"maintained-{a.record_bytes}")
    r.progress.begin("produce")
    started = time.monotonic()
    produced = table_load.produce(system.bootstrap, topic, a.partitions, table_load.values("raw", a.record_bytes), rate=a.rate_mb * MB / a.record_bytes, until=lambda: time.monotonic() - started >= seconds)
    if produced.failed or produced.errors:
        r.fail(f"{produced.failed} records failed: {produced.errors[:3]}")
    r.progress.line(f"{produced.acked:,} records, {produced.value_bytes / MB:.1f} MB acknowledged in {produced.seconds:.1f} s")

    r.progress.begin("compact")
    _wait(r, system, "every acknowledged record in the table", lambda: table_files(system.data_dir, topic)["rows"] >= produced.acked)
    r.stop_system(system)
    before = table_files(system.data_dir, topic)
    before["disk"] = _disk(system.data_dir)
    r.progress.line(_line("before", before))

    r.progress.begin("maintain")
    system.env.update({
        "NEVE_COMPACTOR_MAINTENANCE_INTERVAL_MS": str(a.interval_ms),
        "NEVE_COMPACTOR_MERGE_MIN_FILES": str(a.min_files),
        "NEVE_COMPACTOR_SNAPSHOT_MAX_AGE_MS": str(a.snapshot_age_ms),
        "NEVE_COMPACTOR_FILE_DELETE_GRACE_MS": str(a.delete_grace_ms),
    })  # fmt: skip
    system.start()
    on = time.monotonic()
    merged_after = None

    def maintained() -> bool:
        nonlocal merged_after
        now = table_files(system.data_dir, topic)
        if merged_after is None and max(now["per_partition"].values(), default=0) < a.min_files:
            merged_after = time.monotonic() - on
            r.progress.line(f"measured: merged after {merged_after:.1f} s: {_line('now', now)}")
        return merged_after is not None and _disk(system.data_dir)["files"] == now["files"]

    _wait(r, system, "merged and the older files deleted", maintained)
    settled_after = time.monotonic() - on
    after = table_files(system.data_dir, topic)
    after["disk"] = _disk(system.data_dir)
    r.progress.line(_line("after", after))

    r.progress.begin("read")
    read = read_topic(r, system, {"topic": topic, "records": produced.acked, "record_bytes": a.record_bytes}, "after-maintenance")
    r.stop_system(system)
    if read["consumed"] != produced.acked or read["offset_anomalies"] or read["error"]:
        r.fail(f"after maintenance: {read['consumed']} of {produced.acked} records read from offset 0, {read['offset_anomalies']} offset anomalies, {read['error']}")
    for when, t in (("before", before), ("after", after)):
        if t["rows"] != produced.acked or t["duplicates"]:
            r.fail(f"{when} maintenance the table holds {t['rows']} rows ({t['duplicates']} duplicates) for {produced.acked} acknowledged records")

    target_bytes = _merge_target_bytes(system)
    per = [after["per_partition"][k] for k in after["per_partition"]]
    r.derived["maintenance"] = {
        "acked": produced.acked,
        "produced_mb": round(produced.value_bytes / MB, 2),
        "before": before,
        "after": after,
        "merged_after_s": None if merged_after is None else round(merged_after, 1),
        "settled_after_s": round(settled_after, 1),
        "read_after": read,
        "settings": {"freshness_ms": a.freshness_ms, "interval_ms": a.interval_ms, "min_files": a.min_files, "snapshot_age_ms": a.snapshot_age_ms, "delete_grace_ms": a.delete_grace_ms, "runner": a.runner},
        "load_average": procstat.load_average(),
    }
    r.derived.setdefault("tables", {})["Data files per table partition"] = {
        "headers": ["", "table partitions", "files (current snapshot)", "files per partition (max)", "mean file MB", "files on disk", "data MB on disk", "snapshots", "rows"],
        "rows": [_table_row("before maintenance", before), _table_row("after maintenance", after)],
    }
    most = max(per, default=0)
    r.target("data files per table partition after maintenance (most)", f"< {a.min_files} (merge_min_files)", most, most < a.min_files)
    fewest = math.ceil(after["bytes"] / len(per) / target_bytes) if per else 0
    r.notes.append(
        f"Production: {produced.value_bytes / MB:.1f} MB of raw {a.record_bytes} B values at {a.rate_mb:g} MB/s into {a.partitions} Kafka partitions, compaction every cycle with freshness {a.freshness_ms} ms "
        f"and maintenance off; then maintenance every {a.interval_ms} ms. Files per table partition are the current snapshot's data files; the disk's are every data file under the warehouse "
        f"(files older snapshots still hold until expiry and the delete grace). At least {fewest} file(s) per table partition at the {target_bytes / 2**20:g} MiB target size. After maintenance the reader read "
        f"{read['consumed']:,} records from offset 0 at {read['mb_per_s']} MB/s ({read['broker_cpu_s_per_gib']} broker CPU-s/GiB)."
    )


def _merge_target_bytes(system: NeveDev) -> int:
    from neve.config import load_config  # the node's own defaults and env precedence

    return load_config(None, {**os.environ, **system.env}, dev=True).compactor.merge_target_file_bytes


def _disk(data_dir: Path) -> dict:
    s = stored(data_dir)
    return {"files": s.files["table_data"], "bytes": s.bytes["table_data"]}


def _wait(r, system, what: str, done) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        system.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"not {what} after {WAIT_S:g} s")
        time.sleep(POLL_S)


def _line(when: str, t: dict) -> str:
    return f"{when}: {t['files']} data files in {len(t['per_partition'])} table partition(s), {t['bytes'] / MB:.1f} MB, {t['rows']:,} rows, {t['snapshots']} snapshots" + (
        f"; on disk {t['disk']['files']} files, {t['disk']['bytes'] / MB:.1f} MB" if "disk" in t else ""
    )


def _table_row(when: str, t: dict) -> list[str]:
    per = list(t["per_partition"].values())
    return [
        when, str(len(per)), str(t["files"]), str(max(per, default=0)), f"{t['bytes'] / MB / t['files']:.2f}" if t["files"] else "–",
        str(t["disk"]["files"]), f"{t['disk']['bytes'] / MB:.1f}", str(t["snapshots"]), f"{t['rows']:,}",
    ]  # fmt: skip

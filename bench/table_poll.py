"""A reader polling a topic's Iceberg table through pyiceberg, in a process of its own (so its work
and the producer's do not share a GIL): each new snapshot's added data files are read for their
(partition, offset) columns, stamped with the wall-clock time of the poll that first saw them.
When told the last offsets to expect, it stops once it has seen them (or at its deadline), checks
the whole table for duplicate offsets, and sends everything back."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from table.layout import KAFKA, OFFSET, PARTITION


@dataclass(frozen=True)
class PollPlan:
    data_dir: str  # the neve dev node's data dir: its catalog and warehouse
    topic: str
    partitions: int
    poll_s: float


def poll_main(plan: PollPlan, expect, first_seen, stop, results) -> None:
    """`expect`: a shared array of the last offset to wait for per partition (-1 until the producer
    is done); `first_seen`: an Event set at the first snapshot; `stop`: an Event that ends the
    polling at once; `results`: a Queue that gets one dict."""
    try:
        results.put(_poll(plan, expect, first_seen, stop))
    except Exception as e:  # the parent reports it; nothing to retry here
        results.put({"error": f"{type(e).__name__}: {e}"})


def _poll(plan: PollPlan, expect, first_seen, stop) -> dict:
    import pyarrow.parquet as pq
    from pyiceberg.exceptions import NoSuchTableError
    from pyiceberg.manifest import ManifestEntryStatus

    from compactor import tables
    from compactor.catalog import load_catalog
    from neve.compaction import compactor_settings
    from neve.config import load_config

    settings = compactor_settings(load_config(None, dev=True, data_dir=plan.data_dir), plan.data_dir)
    catalog = load_catalog(settings)
    identifier = tables.table_identifier(settings.namespace, plan.topic, {})
    seen: set[int] = set()
    parts, offsets, times = [], [], []
    highest = np.full(plan.partitions, -1, dtype=np.int64)
    polls = 0
    table = None
    while not stop.is_set():
        started = time.monotonic()
        try:
            table = catalog.load_table(identifier)
        except NoSuchTableError:
            table = None
        now = time.time()  # the table as loaded: its snapshots were committed by now
        polls += 1
        for snapshot in table.snapshots() if table is not None else ():
            if snapshot.snapshot_id in seen:
                continue
            seen.add(snapshot.snapshot_id)
            first_seen.set()
            for manifest in snapshot.manifests(table.io):
                if manifest.added_snapshot_id != snapshot.snapshot_id:
                    continue
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                    if entry.status != ManifestEntryStatus.ADDED or entry.snapshot_id != snapshot.snapshot_id:
                        continue
                    with table.io.new_input(entry.data_file.file_path).open() as f:
                        kafka = pq.read_table(f, columns=[KAFKA]).column(KAFKA).combine_chunks()
                    p = kafka.field(PARTITION).to_numpy()
                    o = kafka.field(OFFSET).to_numpy()
                    parts.append(p)
                    offsets.append(o)
                    times.append(np.full(len(p), now))
                    np.maximum.at(highest, p, o)
        targets = np.frombuffer(expect, dtype=np.int64) if not isinstance(expect, np.ndarray) else expect
        if (targets >= 0).all() and (highest >= targets).all():
            break
        time.sleep(max(0.0, plan.poll_s - (time.monotonic() - started)))
    out = {
        "polls": polls,
        "snapshots": len(seen),
        "partition": np.concatenate(parts).tolist() if parts else [],
        "offset": np.concatenate(offsets).tolist() if offsets else [],
        "time": np.concatenate(times).tolist() if times else [],
    }
    out["table_rows"], out["duplicates"] = _exactly_once(table)
    return out


def _exactly_once(table) -> tuple[int, int]:
    """(rows, rows whose (partition, offset) another row has too) in the table's current snapshot."""
    if table is None:
        return 0, 0
    kafka = table.scan(selected_fields=(KAFKA,)).to_arrow().column(KAFKA).combine_chunks()
    keys = kafka.field(PARTITION).to_numpy().astype(np.int64) << 40 | kafka.field(OFFSET).to_numpy().astype(np.int64)
    return len(keys), int(len(keys) - len(np.unique(keys)))

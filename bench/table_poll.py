"""A reader polling topics' Iceberg tables through pyiceberg, in a process of its own (so its work
and the producer's do not share a GIL): the tables are loaded one after another, round after
round (a round takes at least the poll interval), and each new snapshot's added data files are
read for their (partition, offset) columns, stamped with the wall-clock time of the load that first
saw them. A table's offsets are reported by slot: its index in the plan times the partitions, plus
the partition. When told the last offsets to expect, it stops once it has seen them (or when told
to stop), checks each whole table for duplicate offsets, and sends everything back."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from table.layout import KAFKA, OFFSET, PARTITION


@dataclass(frozen=True)
class PollPlan:
    data_dir: str  # the neve dev node's data dir: its catalog and warehouse
    topics: tuple[str, ...]
    partitions: int  # of each topic
    poll_s: float  # the shortest round over every table


def poll_main(plan: PollPlan, expect, expected, highest, stop, results) -> None:
    """`expect`: a shared array of the last offset to wait for per slot (-1: none), read once the
    `expected` Event is set; `highest`: a shared array the reader keeps at the highest offset seen
    per slot (-1 before any); `stop`: an Event that ends the polling at once; `results`: a Queue
    that gets one dict."""
    try:
        results.put(_poll(plan, expect, expected, highest, stop))
    except Exception as e:  # the parent reports it; nothing to retry here
        results.put({"error": f"{type(e).__name__}: {e}"})


def _poll(plan: PollPlan, expect, expected, highest, stop) -> dict:
    from pyiceberg.exceptions import NoSuchTableError

    from compactor.catalog import load_catalog
    from compactor.service import tables
    from neve.compaction import compactor_settings
    from neve.config import load_config

    settings = compactor_settings(load_config(None, dev=True, data_dir=plan.data_dir), plan.data_dir)
    catalog = load_catalog(settings)
    identifiers = [tables.table_identifier(settings.namespace, topic, {}) for topic in plan.topics]
    seen: set[int] = set()
    slots, offsets, times = [], [], []
    high = np.frombuffer(highest, dtype=np.int64) if not isinstance(highest, np.ndarray) else highest
    loaded: list = [None] * len(identifiers)
    polls, rounds = 0, []
    while not stop.is_set():
        started = time.monotonic()
        for k, identifier in enumerate(identifiers):
            try:
                table = catalog.load_table(identifier)
            except NoSuchTableError:
                continue
            now = time.time()  # the table as loaded: its snapshots were committed by now
            polls += 1
            loaded[k] = table
            for slot, offset in _added(table, seen):
                slots.append(slot + k * plan.partitions)
                offsets.append(offset)
                times.append(np.full(len(offset), now))
                np.maximum.at(high, slots[-1], offset)
            if stop.is_set():
                break
        if expected.is_set():
            targets = np.frombuffer(expect, dtype=np.int64) if not isinstance(expect, np.ndarray) else expect
            if (high >= targets).all():
                break
        time.sleep(max(0.0, plan.poll_s - (time.monotonic() - started)))
        rounds.append(time.monotonic() - started)  # from one load of a table to its next
    checks = [_exactly_once(table) for table in loaded]
    return {
        "polls": polls,
        "rounds": len(rounds),
        "round_s": {"p50": round(float(np.median(rounds)), 3), "max": round(float(np.max(rounds)), 3)} if rounds else None,
        "snapshots": len(seen),
        "slot": np.concatenate(slots).tolist() if slots else [],
        "offset": np.concatenate(offsets).tolist() if offsets else [],
        "time": np.concatenate(times).tolist() if times else [],
        "table_rows": [rows for rows, _ in checks],
        "duplicates": [dups for _, dups in checks],
    }


def _added(table, seen: set[int]):
    """(partitions, offsets) arrays of the data files each snapshot of `table` not in `seen` added."""
    import pyarrow.parquet as pq
    from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

    for snapshot in table.snapshots():
        if snapshot.snapshot_id in seen:
            continue
        seen.add(snapshot.snapshot_id)
        for manifest in snapshot.manifests(table.io):
            # a compacted topic's snapshots add position-delete files too: they hold no rows
            if manifest.added_snapshot_id != snapshot.snapshot_id or manifest.content != ManifestContent.DATA:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.status != ManifestEntryStatus.ADDED or entry.snapshot_id != snapshot.snapshot_id:
                    continue
                with table.io.new_input(entry.data_file.file_path).open() as f:
                    kafka = pq.read_table(f, columns=[KAFKA]).column(KAFKA).combine_chunks()
                yield kafka.field(PARTITION).to_numpy().astype(np.int64), kafka.field(OFFSET).to_numpy().astype(np.int64)


def _exactly_once(table) -> tuple[int, int]:
    """(rows, rows whose (partition, offset) another row has too) in the table's current snapshot."""
    if table is None:
        return 0, 0
    kafka = table.scan(selected_fields=(KAFKA,)).to_arrow().column(KAFKA).combine_chunks()
    keys = kafka.field(PARTITION).to_numpy().astype(np.int64) << 40 | kafka.field(OFFSET).to_numpy().astype(np.int64)
    return len(keys), int(len(keys) - len(np.unique(keys)))

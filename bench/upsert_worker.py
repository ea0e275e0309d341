"""`python -m bench.upsert_worker`: compaction cycles of topics of a stopped `neve dev` data dir,
each topic's measured alone, in a process of its own so that its CPU is its process tree's (as
bench/compaction_worker.py). A warm-up topic is compacted first, unmeasured (the imports and the
upsert path's first use), and each measured topic's table is loaded and its last cycle finished
(the compactor's recovery of a topic) before its cycles are timed. For each measured topic, its
cycles until one finds nothing due: wall and CPU seconds, rows, rows superseded, and every byte
the cycles wrote, by kind, from the data dir's files before and after. One JSON line `RESULT {...}`
on stdout holds every figure."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import procstat
from .compaction_worker import _cpu

# What a cycle writes, by where it lands in `neve dev`'s data dir (objects/ holds the WAL's store,
# warehouse/ the Iceberg tables): the kinds its bytes are reported by.
KINDS = ("parquet", "iceberg metadata", "removals", "cycle manifests", "other")


def files(data_dir: Path) -> dict[str, int]:
    """Every file under the data dir's objects/ and warehouse/: relative path -> size."""
    out: dict[str, int] = {}
    for top in ("objects", "warehouse"):
        for dirpath, _dirs, names in os.walk(data_dir / top):
            for name in names:
                if ".tmp-" in name:  # an upload in progress, not yet an object
                    continue
                path = os.path.join(dirpath, name)
                try:
                    out[os.path.relpath(path, data_dir)] = os.stat(path).st_size
                except FileNotFoundError:
                    continue
    return out


def kind_of(path: str) -> str:
    from wal.manifest import PREFIX, REMOVED_PREFIX

    if path.startswith("warehouse/"):
        return "parquet" if path.endswith(".parquet") else "iceberg metadata"
    key = path.removeprefix("objects/")
    if key.startswith(REMOVED_PREFIX):
        return "removals"
    if key.startswith(PREFIX):
        return "cycle manifests"  # a cycle's own, and the merged one of each partition it touched
    return "other"


def written(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Bytes of the files that appeared (or changed) between two listings, by kind."""
    out = dict.fromkeys(KINDS, 0)
    for path, size in after.items():
        if before.get(path) != size:
            out[kind_of(path)] += size
    return out


async def _cycles(service, info, data_dir: Path) -> dict:
    """A topic's cycles until one finds nothing due, with what they did and wrote."""
    done = {"cycles": 0, "rows": 0, "files": 0, "data_bytes": 0, "delete_bytes": 0, "rows_superseded": 0, "tombstones": 0, "wal_bytes": 0, "seconds": 0.0, "cpu_s": 0.0}
    before = files(data_dir)
    while True:
        wall0, cpu0 = time.monotonic(), _cpu()
        cycle = await service.compact_topic(info)
        if cycle.cycle_id is None:
            break
        done["seconds"] += time.monotonic() - wall0
        done["cpu_s"] += _cpu() - cpu0
        done["cycles"] += 1
        done["rows"] += cycle.rows
        done["files"] += cycle.files
        done["data_bytes"] += cycle.bytes_written
        done["delete_bytes"] += cycle.delete_bytes
        done["rows_superseded"] += cycle.rows_superseded
        done["tombstones"] += cycle.tombstones
        done["wal_bytes"] += cycle.bytes_read
    done["written"] = written(before, files(data_dir))
    done["table"] = cycle.table
    done["seconds"] = round(done["seconds"], 3)
    done["cpu_s"] = round(done["cpu_s"], 3)
    done["load_average"] = procstat.load_average()
    return done


async def main(args: argparse.Namespace) -> dict:
    from compactor.service import tables
    from neve.cli import tune_gc
    from neve.compaction import CompactorNode
    from neve.config import load_config

    data_dir = Path(args.data_dir)
    config = load_config(None, data_dir=args.data_dir, compactor__freshness_ms=0, compactor__runner=args.runner)
    tune_gc(config.broker.gc_young_threshold)  # as `neve compactor` runs
    node = CompactorNode(config)
    await node.start(cycle=False)
    out: dict = {"runner": args.runner, "topics": {}}
    try:
        service = node.running.service
        topics = node.metadata.topics()
        for name in args.warm:
            await _cycles(service, topics[name], data_dir)
        live = tables.live_topic_ids(node.metadata)
        for name in args.measure:
            await service.recovery.recover(topics[name], live)  # the table loaded, as a running compactor has it
        for name in args.measure:
            out["topics"][name] = result = await _cycles(service, topics[name], data_dir)
            print(f"compacted {name}: {result['cycles']} cycles, {result['rows']} rows, {result['rows_superseded']} superseded in {result['seconds']} s, {result['cpu_s']} CPU-s", file=sys.stderr, flush=True)
    finally:
        await node.stop()
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.upsert_worker", description=__doc__)
    p.add_argument("--data-dir", required=True, help="a stopped neve dev's data dir")
    p.add_argument("--runner", choices=["spark", "in-process"], required=True)
    p.add_argument("--warm", nargs="*", default=[], help="topics compacted first, unmeasured")
    p.add_argument("--measure", nargs="+", required=True, help="topics compacted and measured, in turn")
    return p.parse_args(argv)


if __name__ == "__main__":
    import uvloop

    result = uvloop.run(main(parse()))
    print("RESULT " + json.dumps(result), flush=True)

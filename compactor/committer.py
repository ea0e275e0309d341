"""The one committer: a cycle's Parquet files become one Iceberg snapshot (a fast append through
pyiceberg) whose summary names the cycle, its manifest and the Kafka offsets it covers.

Exactly once (seed 002): before every attempt the committer reads the table's history back, and a
cycle already in the current snapshot's ancestry is not appended again, so an attempt whose answer
was lost (a timeout, a crash, CommitStateUnknown) is never doubled; nor is a cycle whose offsets
another cycle already holds (two compactors planning the same entries: the second to commit
finds the first's offsets in the refreshed table and appends nothing). The summary is also how a
restarted compactor finds the last cycle whose index swap may not have happened (`last_cycle`).

Synchronous (pyiceberg is): the service runs it off the event loop.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from wal.manifest import CycleManifest

from . import binding

log = logging.getLogger("neve.compactor.committer")

CYCLE = "neve.cycle"
MANIFEST = "neve.manifest"
TOPIC_ID = "neve.topic-id"
OFFSETS = "neve.offsets"  # {"<partition>": [first, last], ...}: the Kafka offsets this snapshot added


class CycleOverlap(Exception):
    """Another cycle in the table already holds some of this cycle's offsets (a second compactor
    got there first): appending would duplicate rows, so nothing is appended."""


@dataclass(frozen=True, slots=True)
class CommittedCycle:
    cycle_id: str
    manifest_key: str
    snapshot_id: int
    offsets: dict[int, tuple[int, int]]
    topic_id: str = ""


def summary_properties(manifest: CycleManifest) -> dict[str, str]:
    offsets = {str(p): [first, last] for p, (first, last) in sorted(manifest.offsets().items())}
    return {
        CYCLE: manifest.cycle_id,
        MANIFEST: manifest.key,
        TOPIC_ID: str(manifest.topic_id),
        OFFSETS: json.dumps(offsets, separators=(",", ":")),
    }


def _cycles(table) -> Iterable[CommittedCycle]:
    """The neve cycles in the current snapshot's ancestry, newest first (snapshots another engine
    made, a maintenance rewrite say, carry no cycle and are passed over)."""
    from pyiceberg.table.snapshots import ancestors_of

    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        props = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        if CYCLE in props:
            offsets = {int(p): (r[0], r[1]) for p, r in json.loads(props.get(OFFSETS, "{}")).items()}
            yield CommittedCycle(props[CYCLE], props.get(MANIFEST, ""), snapshot.snapshot_id, offsets, props.get(TOPIC_ID, ""))


def committed_cycle(table, cycle_id: str) -> CommittedCycle | None:
    """The snapshot that committed `cycle_id`, if the table's current history holds it."""
    return next((c for c in _cycles(table) if c.cycle_id == cycle_id), None)


def overlapping_cycle(table, topic_id: str, offsets: dict[int, tuple[int, int]]) -> CommittedCycle | None:
    """A cycle of topic `topic_id` in the table's history holding some of `offsets` (partition ->
    first, last). A topic deleted and made again under the same name is another topic id: its
    offsets start over in the same table."""
    for cycle in _cycles(table):
        if cycle.topic_id != topic_id:
            continue
        for p, (first, last) in cycle.offsets.items():
            mine = offsets.get(p)
            if mine is not None and first <= mine[1] and mine[0] <= last:
                return cycle
    return None


def last_cycle(table) -> CommittedCycle | None:
    """The newest neve cycle in the table's current history."""
    return next(iter(_cycles(table)), None)


def commit_cycle(table, manifest: CycleManifest, data_files: Sequence, *, attempts: int = 10) -> CommittedCycle:
    """Append `data_files` (pyiceberg DataFiles) in one snapshot recording `manifest`, unless the
    table already holds the cycle. Returns the snapshot that holds it. Another writer's commit in
    between (CommitFailedException) is retried on the refreshed table; an attempt whose outcome is
    unknown is read back before the next. Raises the last error after `attempts`."""
    from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

    props = summary_properties(manifest)
    error: Exception | None = None
    for attempt in range(attempts):
        if attempt:
            table = table.refresh()
        binding.require(table, manifest.topic_id, manifest.topic)
        if (done := committed_cycle(table, manifest.cycle_id)) is not None:
            if attempt:
                log.info("cycle found committed on re-reading the table", extra={"cycle": manifest.cycle_id, "snapshot": done.snapshot_id})
            return done
        if (other := overlapping_cycle(table, str(manifest.topic_id), manifest.offsets())) is not None:
            raise CycleOverlap(f"cycle {other.cycle_id} (snapshot {other.snapshot_id}) already holds offsets of cycle {manifest.cycle_id}")
        try:
            with table.transaction() as txn, txn.update_snapshot(snapshot_properties=props).fast_append() as append:
                for data_file in data_files:
                    append.append_data_file(data_file)
        except (CommitFailedException, CommitStateUnknownException, OSError) as e:
            error = e
            log.warning("iceberg commit failed; reading the table back before retrying", extra={"cycle": manifest.cycle_id, "attempt": attempt + 1, "error": repr(e)})
            continue
        done = committed_cycle(table, manifest.cycle_id)
        if done is None:  # the transaction returned but its snapshot is not current: read it back
            continue
        return done
    raise error if error is not None else RuntimeError(f"cycle {manifest.cycle_id} not found in the table after {attempts} commits")

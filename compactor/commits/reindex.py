"""The index swap: once a cycle's snapshot is committed, each partition's WAL entries that the cycle
compacted become one PARQUET entry naming the cycle's manifest (and its byte range of the
manifest's replaced bytes, see wal/manifest.py), through the metadata store's range replace (atomic
per partition). Idempotent: a partition whose offsets PARQUET entries already cover (this manifest's,
or a re-index's over the same offsets) is left as it is, so a compactor can run the swap of a cycle
committed without it again (`finish_last_cycle`): after a restart, after a failed swap, or when a
deposed compactor's commit is found in the table. The swap carries the leader's fence: a deposed
compactor's changes nothing (Fenced).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field

from metadata.model import IndexEntry, ObjectType
from metadata.store import Fence, MetadataStore, UnknownTopic
from wal.manifest import CycleManifest, PartitionCompaction
from wal.store import ObjectNotFound, ObjectStore

from .committer import COMMITTED, committed_offsets, last_cycle

log = logging.getLogger("neve.compactor.reindex")


@dataclass(slots=True)
class SwapOutcome:
    swapped: list[int] = field(default_factory=list)  # partitions replaced by this call
    already: list[int] = field(default_factory=list)  # partitions an earlier call had replaced
    conflicts: list[int] = field(default_factory=list)  # partitions whose entries were neither (left as they are)
    topic_gone: bool = False


def replaced_entries(part: PartitionCompaction) -> list[IndexEntry]:
    """The WAL index entries `part` replaces, as the index holds them (the replace compares them)."""
    return [IndexEntry(r.base_offset, r.last_offset, r.object_key, ObjectType.WAL, r.start, r.size, r.max_timestamp) for r in part.replaced]


def replacement(manifest: CycleManifest, part: PartitionCompaction) -> IndexEntry:
    """The PARQUET entry standing for `part`'s offsets: its range of the manifest's replaced bytes."""
    start, size = manifest.partition_range(part.partition)
    return IndexEntry(part.first_offset, part.last_offset, manifest.key, ObjectType.PARQUET, start, size, part.max_timestamp)


async def swap(store: MetadataStore, manifest: CycleManifest, fence: Fence | None = None) -> SwapOutcome:
    outcome = SwapOutcome()
    for part in manifest.partitions:
        new = replacement(manifest, part)
        try:
            if await store.replace_entries(manifest.topic_id, part.partition, replaced_entries(part), new, fence=fence):
                outcome.swapped.append(part.partition)
                continue
        except UnknownTopic:
            outcome.topic_gone = True
            return outcome
        if _swapped_already(store, manifest, part):
            outcome.already.append(part.partition)
        else:
            # Nothing but this compactor replaces WAL entries; seen only if two compactors ran at once.
            log.error("index entries changed under the swap; left as they are", extra={"cycle": manifest.cycle_id, "partition": part.partition})
            outcome.conflicts.append(part.partition)
    return outcome


def _swapped_already(store: MetadataStore, manifest: CycleManifest, part: PartitionCompaction) -> bool:
    """Whether PARQUET entries cover `part`'s offsets without a gap: this manifest's, or those a
    re-index (rewrites.py) made after the table's files were rewritten, which name a newer
    manifest over the same offsets (often merged with their neighbours' into one entry)."""
    covered = part.first_offset
    while covered <= part.last_offset:
        current = store.entries(manifest.topic_id, part.partition, covered, max_entries=1)
        if not current or current[0].object_type != ObjectType.PARQUET or not current[0].base_offset <= covered <= current[0].last_offset:
            return False
        covered = current[0].last_offset + 1
    return True


async def finish_last_cycle(store: MetadataStore, objects: ObjectStore, table, fence: Fence | None = None) -> SwapOutcome | None:
    """Swap what the table holds and the index does not name yet: the table's newest cycle (a
    crash, or a failed swap, between its commit and its swap), and each partition's last committed
    cycle whose offsets the index still serves from the WAL (a cycle a deposed compactor committed
    while the leader's own, over the same offsets, was refused). A no-op when all was swapped; None
    if the table holds no cycle yet."""
    cycle = await asyncio.to_thread(last_cycle, table)
    if cycle is None:
        return None
    outcome = SwapOutcome()
    for key in [cycle.manifest_key, *sorted(_unswapped(store, table) - {cycle.manifest_key})]:
        try:
            data = await objects.get(key)
        except ObjectNotFound:
            log.error("the table's committed offsets name a manifest that is not in the object store", extra={"cycle": cycle.cycle_id, "manifest": key})
            raise
        done = await swap(store, CycleManifest.decode(data), fence)
        outcome.swapped += done.swapped
        outcome.already += done.already
        outcome.conflicts += done.conflicts
        outcome.topic_gone = outcome.topic_gone or done.topic_gone
        if done.swapped:
            log.info("finished the index swap of a committed cycle", extra={"manifest": key, "partitions": len(done.swapped)})
    return outcome


def _unswapped(store: MetadataStore, table) -> set[str]:
    """Manifests of the partitions whose last committed offset is still in a WAL index entry. An
    in-memory lookup per partition the table's properties name."""
    keys = set()
    for name in table.metadata.properties:
        if not name.startswith(COMMITTED):
            continue
        topic_id = name[len(COMMITTED) :]
        for p, (last, key) in committed_offsets(table, topic_id).items():
            found = store.entries(uuid.UUID(topic_id), p, last, max_entries=1)
            if found and found[0].object_type == ObjectType.WAL and found[0].base_offset <= last:
                keys.add(key)
    return keys

"""The index swap: once a cycle's snapshot is committed, each partition's WAL entries that the cycle
compacted become one PARQUET entry naming the cycle's manifest (and its byte range of the
manifest's replaced bytes, see wal/manifest.py), through the metadata store's range replace (atomic
per partition). Idempotent: a partition whose offsets PARQUET entries already cover (this manifest's,
or a re-index's over the same offsets) is left as it is, so a restarted compactor can run the swap
of its last cycle again (`finish_last_cycle`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from metadata.model import IndexEntry, ObjectType
from metadata.store import MetadataStore, UnknownTopic
from wal.manifest import CycleManifest, PartitionCompaction
from wal.store import ObjectNotFound, ObjectStore

from .committer import last_cycle

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


async def swap(store: MetadataStore, manifest: CycleManifest) -> SwapOutcome:
    outcome = SwapOutcome()
    for part in manifest.partitions:
        new = replacement(manifest, part)
        try:
            if await store.replace_entries(manifest.topic_id, part.partition, replaced_entries(part), new):
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


async def finish_last_cycle(store: MetadataStore, objects: ObjectStore, table) -> SwapOutcome | None:
    """After a restart: the table's newest cycle may have been committed without its index swap
    (a crash between the two). Swap it now; a no-op when it was swapped. None if the table holds no
    cycle yet. Cycles of one table run one after the other, so only the newest can be unswapped."""
    cycle = await asyncio.to_thread(last_cycle, table)
    if cycle is None:
        return None
    try:
        data = await objects.get(cycle.manifest_key)
    except ObjectNotFound:
        log.error("the table's last cycle names a manifest that is not in the object store", extra={"cycle": cycle.cycle_id, "manifest": cycle.manifest_key})
        raise
    manifest = CycleManifest.decode(data)
    outcome = await swap(store, manifest)
    if outcome.swapped:
        log.info("finished the index swap of a cycle committed before a restart", extra={"cycle": cycle.cycle_id, "partitions": len(outcome.swapped)})
    return outcome

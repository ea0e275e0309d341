"""The Kafka view of a compacted topic: each partition's compacted offsets as one PARQUET index
entry, whose manifest names every file slice holding its rows and every removal (the offsets its
readers skip: table/removals.py).

A compacted topic's cycle removes rows anywhere in the partition's compacted range (the older
records of the keys it writes), not only in its own offsets; its cycle manifest names the removal
object holding them, but the older entries' manifests do not. So after the cycle's index swap,
the partition's PARQUET entries (from the log start to the first WAL entry) are merged into one
entry naming a new manifest: their slices and their removals, all of them. Readers then skip
every removed record wherever it is. Until the merge (a crash between the swap and it), the older
entries serve records a later one superseded: more than the latest record of a key, never less,
and the next cycle, or the compactor's recovery of the topic, merges them.

The merged part's `replaced` is one range with no WAL object over the offsets it covers and the
bytes the merged entries counted: what it replaced the merged manifests said (and their WAL objects
are collected as theirs were).

Removals accumulate with the updates (one object per cycle); once a partition's part names more
than MAX_REMOVALS of them, the merge rewrites them as one object.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import numpy as np

from metadata.model import IndexEntry, ObjectType, TopicInfo
from metadata.store import Fence, MetadataStore, UnknownTopic
from table import removals
from wal.manifest import CycleManifest, FileSlice, PartitionCompaction, Removal, WalRange, new_cycle_id, removal_key
from wal.store import ObjectStore

from .rewrites import PAGE, ManifestCache, find_part

log = logging.getLogger("neve.compactor.compacted_index")

MAX_REMOVALS = 16  # removal objects a merged part names before the merge rewrites them as one
MAX_MERGED = 4096  # entries of a partition merged at once, at most


async def merge_entries(store: MetadataStore, objects: ObjectStore, manifests: ManifestCache, info: TopicInfo, identifier: str, partitions: Iterable[int], fence: Fence | None = None) -> int:
    """Merge each of `partitions`' PARQUET entries into one (see the module): how many partitions
    were merged. A partition whose entries changed meanwhile is left for the next call."""
    runs: list[tuple[int, list[IndexEntry], list[PartitionCompaction]]] = []
    for p in sorted(set(partitions)):
        entries = _compacted_entries(store, info, p)
        if len(entries) < 2:
            continue
        parts = []
        for e in entries:
            part = find_part(await manifests.get(e.object_key), p)
            if part is None:
                log.error("a PARQUET entry's manifest holds no part for its partition; entries left as they are", extra={"topic": info.name, "partition": p, "manifest": e.object_key})
                break
            parts.append(part)
        else:
            runs.append((p, entries, parts))
    if not runs:
        return 0
    cycle_id = new_cycle_id()
    merged_parts = []
    for p, entries, parts in runs:
        removed = tuple(dict.fromkeys(r for part in parts for r in part.removed))
        if len(removed) > MAX_REMOVALS:
            removed = await _rewrite_removals(objects, info, p, removed, f"{cycle_id}-{p}")
        slices = sorted(dict.fromkeys(s for part in parts for s in part.slices), key=lambda s: (s.first_offset, s.path, s.first_row))
        span = WalRange("", 0, sum(e.size for e in entries), entries[0].base_offset, entries[-1].last_offset, max(e.max_timestamp for e in entries))
        merged_parts.append(PartitionCompaction(p, (span,), tuple(_distinct(slices)), removed))
    manifest = CycleManifest(cycle_id, info.topic_id, info.name, identifier, tuple(merged_parts))
    await objects.put(manifest.key, await asyncio.to_thread(manifest.encode))
    manifests.put(manifest)
    merged = 0
    for (p, entries, _), part in zip(runs, manifest.partitions, strict=True):
        start, size = manifest.partition_range(p)
        new = IndexEntry(part.first_offset, part.last_offset, manifest.key, ObjectType.PARQUET, start, size, part.max_timestamp)
        try:
            if await store.replace_entries(info.topic_id, p, entries, new, fence=fence):
                merged += 1
            else:
                log.info("a compacted partition's entries changed under the merge; merged next time", extra={"topic": info.name, "partition": p})
        except UnknownTopic:
            return merged
    return merged


def _compacted_entries(store: MetadataStore, info: TopicInfo, partition: int) -> list[IndexEntry]:
    """The partition's consecutive PARQUET entries from its log start, up to its first WAL entry."""
    out: list[IndexEntry] = []
    offset = store.log_start_offset(info.topic_id, partition)
    while len(out) < MAX_MERGED and (page := store.entries(info.topic_id, partition, offset, max_entries=PAGE)):
        for e in page:
            if e.object_type != ObjectType.PARQUET or (out and e.base_offset != out[-1].last_offset + 1):
                return out
            out.append(e)
        offset = page[-1].last_offset + 1
    return out[:MAX_MERGED]


def _distinct(slices: list[FileSlice]) -> list[FileSlice]:
    """Slices without repeats of the same rows (two manifests may name one slice)."""
    seen: set[tuple[str, int, int]] = set()
    out = []
    for s in slices:
        if (s.path, s.first_row, s.rows) not in seen:
            seen.add((s.path, s.first_row, s.rows))
            out.append(s)
    return out


async def _rewrite_removals(objects: ObjectStore, info: TopicInfo, partition: int, refs: tuple[Removal, ...], name: str) -> tuple[Removal, ...]:
    """`refs` as one removal object: every offset once, with the earliest time it is hidden from."""
    offsets, hidden = [], []
    for ref in refs:
        rows = removals.decode(await objects.get(ref.key)).slice(ref.first_row, ref.rows)
        offsets.append(rows.column(removals.OFFSET).to_numpy())
        hidden.append(rows.column(removals.HIDDEN_FROM).to_numpy())
    all_offsets, all_hidden = np.concatenate(offsets), np.concatenate(hidden)
    order = np.lexsort((all_hidden, all_offsets))
    all_offsets, all_hidden = all_offsets[order], all_hidden[order]
    first = np.ones(len(all_offsets), dtype=bool)
    first[1:] = all_offsets[1:] != all_offsets[:-1]
    data, rows = removals.encode({partition: (all_offsets[first], all_hidden[first])})
    key = removal_key(info.topic_id, name)
    await objects.put(key, data)
    at, n = rows[partition]
    return (Removal(key, at, n),)

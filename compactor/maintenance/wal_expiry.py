"""What retention hid on a topic without a table is let go: per partition, the index entries
wholly below the log start are replaced (the range replace compaction uses) by one EXPIRED entry
that names no object. Their WAL objects are then collected by the sweeper once no other entry
names them, the wal-index records holding them are deleted once no partition refers to them,
and the partition's index keeps one entry for all its expired history: a table-less topic's
storage, etcd keys and broker memory follow its retention, not its age.

Topics with a table keep their entries below the log start: retention never deletes table rows,
and the compactor still takes those records into the table (their entries then become PARQUET
entries, which table retention and maintenance govern)."""

from __future__ import annotations

import logging

from metadata.model import IndexEntry, ObjectType, TopicInfo
from metadata.store import MetadataStore

log = logging.getLogger("neve.compactor.wal_expiry")
PAGE = 1024


def expired_runs(entries: list[IndexEntry], log_start: int) -> list[list[IndexEntry]]:
    """The runs of entries to replace: consecutive WAL and EXPIRED entries wholly below
    `log_start` (a PARQUET entry, from a time the topic had a table, is left in place and cuts a
    run), each with a WAL entry in it or more than one entry (a lone EXPIRED entry is done)."""
    runs: list[list[IndexEntry]] = []
    run: list[IndexEntry] = []
    for e in entries:
        if e.last_offset >= log_start:
            break
        if e.object_type == ObjectType.PARQUET or (run and e.base_offset != run[-1].last_offset + 1):
            runs.append(run)
            run = []
        if e.object_type != ObjectType.PARQUET:
            run.append(e)
    runs.append(run)
    return [r for r in runs if len(r) > 1 or (r and r[0].object_type == ObjectType.WAL)]


def expired_entry(run: list[IndexEntry]) -> IndexEntry:
    """The entry that stands for a run: its offsets, no object, no bytes, and a max timestamp
    below any record's (-1), so that ListOffsets by timestamp never lands on it."""
    return IndexEntry(run[0].base_offset, run[-1].last_offset, "", ObjectType.EXPIRED, 0, 0, -1)


async def expire_partition(store: MetadataStore, info: TopicInfo, partition: int) -> int:
    """Replace the partition's runs below its log start; returns the WAL entries let go (0 when
    another store replaced the same entries first, or the log start is still 0)."""
    log_start = store.log_start_offset(info.topic_id, partition)
    if log_start == 0:
        return 0
    head = store.entries(info.topic_id, partition, 0, max_entries=2)
    if not expired_runs(head, log_start) and (len(head) < 2 or head[1].last_offset >= log_start):
        return 0  # nothing below the log start but one EXPIRED entry at most: the usual cycle, two entries read
    below: list[IndexEntry] = []
    offset = 0
    while page := store.entries(info.topic_id, partition, offset, max_entries=PAGE):
        below.extend(e for e in page if e.last_offset < log_start)
        if page[-1].last_offset >= log_start:
            break
        offset = page[-1].last_offset + 1
    released = 0
    for run in expired_runs(below, log_start):
        if await store.replace_entries(info.topic_id, partition, run, expired_entry(run)):
            released += sum(1 for e in run if e.object_type == ObjectType.WAL)
    return released


async def expire_topic(store: MetadataStore, info: TopicInfo) -> int:
    """Every partition of a topic without a table; returns the WAL entries let go."""
    released = 0
    for partition in range(info.partitions):
        released += await expire_partition(store, info, partition)
    if released:
        log.info("wal_entries_expired", extra={"topic": info.name, "entries": released})
    return released

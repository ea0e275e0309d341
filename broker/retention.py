"""Retention for the Kafka view: retention.ms and retention.bytes advance each partition's log
start offset. Nothing is deleted here: the records stay in their objects and go to the Iceberg
table; Fetch, ListOffsets earliest and the consumers' auto.offset.reset follow the log start. (On a
topic without a table, the compactor then lets the hidden entries and their objects go:
compactor/maintenance/wal_expiry.py.)

As Kafka deletes whole segments, retention hides whole index entries, oldest first:
- retention.ms: every entry whose newest record timestamp is older than now - retention.ms, up
  to the first that is not (an entry with a newer timestamp stops the scan, as a segment does in
  Kafka). When every entry has expired the log start reaches the high watermark: Kafka too rolls
  and deletes the active segment then.
- retention.bytes: entries are hidden only while what remains is still at least retention.bytes
  (Kafka's rule, so a partition keeps between retention.bytes and that plus one entry).
Only topics whose cleanup.policy includes 'delete' are touched. Sizes are the stored bytes of
WAL entries (compacted Parquet entries, a later issue, will need their byte size here).

Every broker of a cluster runs the loop; advance_log_start is monotonic and idempotent, so they
agree without coordination."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from metadata.model import IndexEntry
from metadata.store import MetadataError, MetadataStore

from .topic_configs import retention_policy

log = logging.getLogger("neve.broker.retention")
PAGE = 4096


def retention_target(entries: Iterable[IndexEntry], now_ms: int, retention_ms: int, retention_bytes: int) -> int | None:
    """The offset the log start should move to for these entries (a partition's entries from its
    log start on, in offset order), or None when nothing has expired. -1 disables a limit."""
    entries = list(entries)
    if not entries:
        return None
    kept = 0  # index of the first entry kept
    if retention_ms >= 0:
        cutoff = now_ms - retention_ms
        while kept < len(entries) and entries[kept].max_timestamp < cutoff:
            kept += 1
    if retention_bytes >= 0:
        remaining = sum(e.size for e in entries[kept:])
        while kept < len(entries) and remaining - entries[kept].size >= retention_bytes:
            remaining -= entries[kept].size
            kept += 1
    if kept == 0:
        return None
    return entries[kept].base_offset if kept < len(entries) else entries[-1].last_offset + 1


def _partition_entries(store: MetadataStore, topic_id, partition: int, cutoff_ms: int | None) -> list[IndexEntry]:
    """The partition's entries from its log start on. With only a time limit (`cutoff_ms` given)
    the scan stops at the first page holding an entry that has not expired: nothing after it can
    be hidden, and a partition's visible history may be long."""
    out: list[IndexEntry] = []
    offset = store.log_start_offset(topic_id, partition)
    while batch := store.entries(topic_id, partition, offset, max_entries=PAGE):
        out.extend(batch)
        if cutoff_ms is not None and any(e.max_timestamp >= cutoff_ms for e in batch):
            break
        offset = batch[-1].last_offset + 1
    return out


async def enforce_once(store: MetadataStore, now_ms: int | None = None) -> int:
    """Advance the log start of every partition whose retention has expired entries; returns how
    many partitions moved."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    moved = 0
    for info in list(store.topics().values()):
        policy = retention_policy(info.configs)
        if not policy.active:
            continue
        for p in range(info.partitions):
            cutoff = now_ms - policy.retention_ms if policy.retention_bytes < 0 else None
            entries = _partition_entries(store, info.topic_id, p, cutoff)
            target = retention_target(entries, now_ms, policy.retention_ms, policy.retention_bytes)
            if target is not None and target > store.log_start_offset(info.topic_id, p):
                try:
                    new_start = await store.advance_log_start(info.topic_id, p, target)
                except MetadataError as e:  # e.g. the topic was deleted meanwhile: the next pass retries the rest
                    log.warning("retention_not_advanced", extra={"topic": info.name, "partition": p, "error": repr(e)})
                    continue
                log.info("retention_advanced", extra={"topic": info.name, "partition": p, "log_start_offset": new_start})
                moved += 1
            await asyncio.sleep(0)  # many partitions: let the broker's requests in between
    return moved


async def run_retention(store: MetadataStore, interval_s: float) -> None:
    """Enforce retention every `interval_s` for as long as the task runs, skipping rounds where
    the store's view may be stale (the store unreachable)."""
    while True:
        await asyncio.sleep(interval_s)
        if not store.is_current():
            continue
        try:
            await enforce_once(store)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("retention_failed", extra={"error": repr(e)})

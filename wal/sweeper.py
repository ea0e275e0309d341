"""Deletes orphaned WAL objects: uploaded, never committed (a broker died between its PUT and its
sequencer commit). Only objects older than the grace period and referenced by no index entry are
deleted, and only while the caller's view of the index is current: a writer never commits an object
whose upload began more than half the grace period ago (WalWriter's commit deadline), so an
object that old and unreferenced can never become referenced."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from .store import ObjectStore

log = logging.getLogger("neve.wal.sweeper")


async def sweep_once(
    store: ObjectStore,
    referenced: Callable[[], set[str]],
    grace_s: float,
    prefix: str = "wal/",
    now: float | None = None,
) -> list[str]:
    """Delete the orphans found now; returns their keys."""
    now = time.time() if now is None else now
    candidates = [info.key async for info in store.list(prefix) if now - info.modified >= grace_s]
    if not candidates:
        return []
    refs = referenced()  # read after listing: anything committed before the listing is in it
    deleted = []
    for key in candidates:
        if key not in refs:
            await store.delete(key)
            deleted.append(key)
    if deleted:
        log.info("wal_orphans_deleted", extra={"count": len(deleted), "first": deleted[0]})
    return deleted


async def run_sweeper(
    store: ObjectStore,
    referenced: Callable[[], set[str]],
    is_current: Callable[[], bool],
    grace_s: float,
    interval_s: float,
) -> None:
    """Sweep every `interval_s` for as long as the task runs, skipping rounds where the index
    view may be stale (e.g. the metadata store is unreachable)."""
    while True:
        await asyncio.sleep(interval_s)
        if not is_current():
            log.info("wal_sweep_skipped", extra={"reason": "index view not current"})
            continue
        try:
            await sweep_once(store, referenced, grace_s)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("wal_sweep_failed", extra={"error": repr(e)})

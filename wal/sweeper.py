"""Deletes orphaned WAL objects: uploaded, never committed (a broker died between its PUT and its
sequencer commit).

An object is deleted only if it is older than the grace period, no index entry in the caller's
view names it, and the metadata store then fences it off (`MetadataStore.fence_objects`): from the
fence on no commit naming it can land, and one that landed before is in the view the fence checks
against, so a deleted object is never referenced. The grace period keeps the sweeper from fencing
objects whose commits are simply on their way (they would fail and be retried), and a writer
never commits an object whose upload began more than half the grace period ago (WalWriter's
commit deadline): that timing rule used to be the only guard, and is now a second one."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Collection

from .store import ObjectStore

log = logging.getLogger("neve.wal.sweeper")

Fence = Callable[[Collection[str]], Awaitable[set[str]]]
# The keys of every object still referenced: by an index entry, or by a cycle manifest an index entry
# names (the WAL objects a compaction replaced stay readable through it until the table serves them).
Referenced = Callable[[], set[str] | Awaitable[set[str]]]


async def sweep_once(
    store: ObjectStore,
    referenced: Referenced,
    fence: Fence,
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
    if inspect.isawaitable(refs):
        refs = await refs
    unreferenced = [key for key in candidates if key not in refs]
    if not unreferenced:
        return []
    deletable = await fence(unreferenced)  # from here on, none of them can become referenced
    deleted = []
    for key in unreferenced:
        if key in deletable:
            await store.delete(key)
            deleted.append(key)
    if deleted:
        log.info("wal_orphans_deleted", extra={"count": len(deleted), "first": deleted[0]})
    kept = len(unreferenced) - len(deleted)
    if kept:
        log.info("wal_orphans_kept", extra={"count": kept, "reason": "committed before the fence, or the view lagged"})
    return deleted


async def run_sweeper(
    store: ObjectStore,
    referenced: Referenced,
    fence: Fence,
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
            await sweep_once(store, referenced, fence, grace_s)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("wal_sweep_failed", extra={"error": repr(e)})

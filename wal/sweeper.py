"""Deletes the WAL objects nothing needs any more, on one node of a cluster (the caller makes it the
leader of a named leadership): objects whose index entries are gone, and orphans.

Unreferenced: an object an index entry named and none does any more (compaction replaced its
entries, retention moved the log start past them). A fetch that read the index before may still be
reading it, so it is deleted only once this sweeper has seen it unreferenced for the read grace.
Those clocks are kept in memory: a sweeper that starts (a new leader) starts them afresh, and
treats every object it finds unreferenced on its first listing the same way, since it cannot tell
how long ago that one lost its entries.

Orphans: uploaded, never committed (a broker died between its PUT and its sequencer commit). An
orphan is deleted once its modification time is older than the orphan grace. The grace keeps the
sweeper from fencing objects whose commits are simply on their way (they would fail and be
retried), and a writer never commits an object whose upload began more than half the grace period
ago (WalWriter's commit deadline). An object committed and compacted between two listings is never
seen referenced, and goes as an orphan: the orphan grace (an hour) is far longer than the read grace.

Every object is deleted only after the metadata store fenced it off (`MetadataStore.fence_objects`):
from the fence on no commit naming it can land, and one that landed before is in the view the fence
checks against, so a deleted object is never referenced."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Collection

from prometheus_client import Counter

from .store import ObjectInfo, ObjectStore

log = logging.getLogger("neve.wal.sweeper")

OBJECTS_DELETED = Counter(
    "neve_wal_objects_deleted_total",
    "WAL objects the sweeper deleted, by reason: unreferenced (its index entries went: compaction, retention) or orphan (never committed, as far as the sweeper saw)",
    ["reason"],
)
BYTES_DELETED = Counter("neve_wal_bytes_deleted_total", "Bytes of the WAL objects the sweeper deleted, by reason (as neve_wal_objects_deleted_total)", ["reason"])
# the log event of each reason's deletions
DELETED_EVENTS = {"orphan": "wal_orphans_deleted", "unreferenced": "wal_unreferenced_deleted"}

Fence = Callable[[Collection[str]], Awaitable[set[str]]]
# The keys of every object still referenced: by an index entry, or by a cycle manifest an index entry
# names (the WAL objects a compaction replaced stay readable through it until the table serves them).
Referenced = Callable[[], set[str] | Awaitable[set[str]]]
# The keys of objects known to have been committed (e.g. those a cycle manifest says compaction
# replaced): once unreferenced they wait the read grace, not the orphan grace, even if no round saw
# them referenced (a compactor can replace an object's entries between two rounds).
Committed = Callable[[], set[str] | Awaitable[set[str]]]


class Sweeper:
    """The sweeper's memory from one round to the next: which listed objects it has seen
    referenced, and since when each unreferenced one has been so. `forget` starts it afresh."""

    def __init__(
        self, store: ObjectStore, referenced: Referenced, fence: Fence, orphan_grace_s: float, read_grace_s: float = 0.0, prefix: str = "wal/", committed: Committed | None = None
    ) -> None:
        self.store, self.referenced, self.fence, self.prefix, self.committed = store, referenced, fence, prefix, committed
        self.orphan_grace_s, self.read_grace_s = orphan_grace_s, read_grace_s
        self.forget()

    def forget(self) -> None:
        self._rounds = 0
        self._leading = False
        self._seen_referenced: set[str] = set()  # listed objects some round saw referenced
        self._unreferenced_since: dict[str, float] = {}  # listed, unreferenced objects: when first seen so
        self._inherited: set[str] = set()  # unreferenced at the first listing: for how long, unknown

    async def tick(self, leading: bool, current: bool, now: float | None = None) -> list[str]:
        """A round of `run_sweeper`: a sweep if this node leads (`leading`) and its index view is
        `current`; nothing, and the memory forgotten, if it does not lead."""
        if not leading:
            if self._leading:
                log.info("wal_sweeper_stopped", extra={"reason": "not the leader"})
                self.forget()
            return []
        if not self._leading:
            log.info("wal_sweeper_leading", extra={"read_grace_s": self.read_grace_s, "orphan_grace_s": self.orphan_grace_s})
            self._leading = True
        if not current:
            log.info("wal_sweep_skipped", extra={"reason": "index view not current"})
            return []
        return await self.sweep(now)

    async def sweep(self, now: float | None = None) -> list[str]:
        """One round: delete what is due now; returns the keys deleted."""
        now = time.time() if now is None else now
        listed = {info.key: info async for info in self.store.list(self.prefix)}
        refs = self.referenced()  # read after listing: anything committed before the listing is in it
        if inspect.isawaitable(refs):
            refs = await refs
        known: set[str] = set()
        if self.committed is not None:
            known = self.committed()
            if inspect.isawaitable(known):
                known = await known
        first = self._rounds == 0
        self._rounds += 1
        seen = {key for key in listed if key in refs or key in self._seen_referenced or key in known}
        since = {key: self._unreferenced_since.get(key, now) for key in listed if key not in refs}
        self._seen_referenced, self._unreferenced_since = seen, since
        self._inherited = set(since) if first else self._inherited & since.keys()
        due = {key: reason for key in since if (reason := self._due(listed[key], now)) is not None}
        if not due:
            return []
        deletable = await self.fence(list(due))  # from here on, none of them can become referenced
        deleted: dict[str, list[ObjectInfo]] = {"orphan": [], "unreferenced": []}
        for key, reason in due.items():
            if key in deletable:
                await self.store.delete(key)
                deleted[reason].append(listed[key])
                self._forget_object(key)
        for reason, infos in deleted.items():
            if infos:
                size = sum(info.size for info in infos)
                OBJECTS_DELETED.labels(reason).inc(len(infos))
                BYTES_DELETED.labels(reason).inc(size)
                log.info(DELETED_EVENTS[reason], extra={"count": len(infos), "bytes": size, "first": infos[0].key})
        kept = len(due) - len(deletable & due.keys())
        if kept:
            log.info("wal_sweep_kept", extra={"count": kept, "reason": "committed before the fence, or the view lagged"})
        return [info.key for infos in deleted.values() for info in infos]

    def _due(self, info: ObjectInfo, now: float) -> str | None:
        """Why an unreferenced object may be deleted now ("unreferenced", "orphan"), or None."""
        unreferenced_for = now - self._unreferenced_since[info.key]
        if info.key in self._seen_referenced:
            return "unreferenced" if unreferenced_for >= self.read_grace_s else None
        if now - info.modified < self.orphan_grace_s:
            return None
        if info.key in self._inherited and unreferenced_for < self.read_grace_s:
            return None
        return "orphan"

    def _forget_object(self, key: str) -> None:
        self._seen_referenced.discard(key)
        self._unreferenced_since.pop(key, None)
        self._inherited.discard(key)


async def sweep_once(store: ObjectStore, referenced: Referenced, fence: Fence, grace_s: float, prefix: str = "wal/", now: float | None = None) -> list[str]:
    """One round of a sweeper with no memory and no read grace: the orphans found now."""
    return await Sweeper(store, referenced, fence, grace_s, prefix=prefix).sweep(now)


async def run_sweeper(
    store: ObjectStore,
    referenced: Referenced,
    fence: Fence,
    is_current: Callable[[], bool],
    grace_s: float,
    interval_s: float,
    read_grace_s: float = 0.0,
    is_leader: Callable[[], bool] = lambda: True,
    committed: Committed | None = None,
) -> None:
    """Sweep every `interval_s` for as long as the task runs, while `is_leader` says so (its
    memory forgotten whenever it does not), skipping rounds where the index view may be stale
    (e.g. the metadata store is unreachable)."""
    sweeper = Sweeper(store, referenced, fence, grace_s, read_grace_s, committed=committed)
    while True:
        await asyncio.sleep(interval_s)
        try:
            await sweeper.tick(is_leader(), is_current())
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("wal_sweep_failed", extra={"error": repr(e)})

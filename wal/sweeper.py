"""Deletes the WAL objects nothing needs any more, on one node of a cluster (the caller makes it the
leader of a named leadership): objects whose index entries are gone, and orphans.

Unreferenced: an object an index entry named and none does any more (compaction replaced its
entries, retention moved the log start past them). A fetch that read the index before may still be
reading it, so it is deleted only once this sweeper has seen it unreferenced for the read grace.
Those clocks are kept in memory: a sweeper that starts (a new leader) starts them afresh, and
treats every object it finds unreferenced on its first listing the same way, since it cannot tell
how long ago that one lost its entries.

Listings are the expensive part (a LIST request per thousand objects), so they are rare
(`interval_s`, minutes). Between them the sweeper watches the index alone (`watch`, every
`watch_interval(read_grace_s)`, in memory): an object it saw referenced that lost its last entry
starts its clock there, and so does every object a swap's new entries say they replaced
(`superseded`: the WAL objects of a new cycle manifest, which the sweeper may never have seen
referenced, a cycle taking them seconds after their commit). Each is deleted as soon as its read
grace has passed, with no listing: an object's index entries going is followed by its deletion
within the read grace and one watch interval. Its size, for the metrics, comes from the last
listing, or from one HEAD request when no listing saw it.

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

from .store import ObjectInfo, ObjectNotFound, ObjectStore

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
# Given keys that index entries name now and did not at the sweeper's last look (a swap's new
# entries name its cycle manifest), the objects those say they replaced: committed objects whose
# entries just went, which the sweeper may never have seen referenced.
Superseded = Callable[[set[str]], Awaitable[set[str]]]


def watch_interval(read_grace_s: float) -> float:
    """How often the sweeper looks at the index between listings: a quarter of the read grace (an
    object then goes between the read grace and 1.25 times it after its entries), at least 1 s. A
    look makes no request, but walks the whole in-memory index on the event loop, as a listing
    round does: about 0.1 us an entry (0.1 s at a million entries, every 15 s at the default)."""
    return max(1.0, read_grace_s / 4)


class Sweeper:
    """The sweeper's memory from one round to the next: which listed objects it has seen
    referenced, and since when each unreferenced one has been so. `forget` starts it afresh."""

    def __init__(
        self,
        store: ObjectStore,
        referenced: Referenced,
        fence: Fence,
        orphan_grace_s: float,
        read_grace_s: float = 0.0,
        prefix: str = "wal/",
        committed: Committed | None = None,
        superseded: Superseded | None = None,
    ) -> None:
        self.store, self.referenced, self.fence, self.prefix, self.committed, self.superseded = store, referenced, fence, prefix, committed, superseded
        self.orphan_grace_s, self.read_grace_s = orphan_grace_s, read_grace_s
        self.forget()

    def forget(self) -> None:
        self._rounds = 0
        self._leading = False
        self._seen_referenced: set[str] = set()  # objects some round or watch saw referenced (or known committed)
        self._unreferenced_since: dict[str, float] = {}  # of those and the listed: when first seen unreferenced
        self._inherited: set[str] = set()  # unreferenced at the first listing: for how long, unknown
        self._sizes: dict[str, int] = {}  # object sizes, as the last listing gave them
        self._watched: set[str] | None = None  # the keys the index named at the last look (None: no look yet)

    async def tick(self, leading: bool, current: bool, now: float | None = None, listing: bool = True) -> list[str]:
        """A round of `run_sweeper`: a sweep (`listing`) or a watch if this node leads (`leading`)
        and its index view is `current`; nothing, and the memory forgotten, if it does not lead."""
        if not leading:
            if self._leading:
                log.info("wal_sweeper_stopped", extra={"reason": "not the leader"})
                self.forget()
            return []
        if not self._leading:
            log.info("wal_sweeper_leading", extra={"read_grace_s": self.read_grace_s, "orphan_grace_s": self.orphan_grace_s})
            self._leading = True
        if not current:
            if listing:
                log.info("wal_sweep_skipped", extra={"reason": "index view not current"})
            return []
        return await (self.sweep(now) if listing else self.watch(now))

    async def _referenced(self) -> set[str]:
        refs = self.referenced()
        return await refs if inspect.isawaitable(refs) else refs

    async def watch(self, now: float | None = None) -> list[str]:
        """Between listings, from the index alone (no listing): start the clock of each object that
        lost its last entry since the last look (seen referenced then, or named by what a swap's
        new entries replaced), and delete those whose read grace has passed; returns the keys
        deleted. The first look only learns what is referenced."""
        now = time.time() if now is None else now
        refs = await self._referenced()
        replaced: set[str] = set()
        if self._watched is not None and self.superseded is not None and (new := refs - self._watched):
            replaced = await self.superseded(new)
        self._watched = refs
        self._seen_referenced.update(key for key in (*refs, *replaced) if key.startswith(self.prefix))
        # a clock stops when its object is referenced again (a commit that landed before a fence)
        self._unreferenced_since = {key: since for key, since in self._unreferenced_since.items() if key not in refs}
        for key in self._seen_referenced:
            if key not in refs:
                self._unreferenced_since.setdefault(key, now)
        due = {key: "unreferenced" for key in self._seen_referenced if key not in refs and now - self._unreferenced_since[key] >= self.read_grace_s}
        return await self._delete(due, {})

    def next_due(self) -> float | None:
        """When the next object a watch or a round saw referenced has had its read grace (wall clock), if any waits."""
        waiting = [since for key, since in self._unreferenced_since.items() if key in self._seen_referenced]
        return min(waiting) + self.read_grace_s if waiting else None

    async def sweep(self, now: float | None = None) -> list[str]:
        """One round: delete what is due now; returns the keys deleted."""
        now = time.time() if now is None else now
        listed = {info.key: info async for info in self.store.list(self.prefix)}
        refs = await self._referenced()  # read after listing: anything committed before the listing is in it
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
        self._sizes = {key: info.size for key, info in listed.items()}
        due = {key: reason for key in since if (reason := self._due(listed[key], now)) is not None}
        return await self._delete(due, listed)

    async def _delete(self, due: dict[str, str], listed: dict[str, ObjectInfo]) -> list[str]:
        """Fence `due` (key -> reason) off, delete what the fence allows and count it; returns the keys deleted."""
        if not due:
            return []
        deletable = await self.fence(list(due))  # from here on, none of them can become referenced
        deleted: dict[str, list[ObjectInfo]] = {"orphan": [], "unreferenced": []}
        for key, reason in due.items():
            if key in deletable:
                info = listed.get(key)
                if info is None:  # no listing saw it (a watch's): its size from the last listing, or a HEAD
                    try:
                        size = self._sizes[key] if key in self._sizes else await self.store.size(key)
                    except ObjectNotFound:  # gone already
                        self._forget_object(key)
                        continue
                    info = ObjectInfo(key, size, 0.0)
                await self.store.delete(key)
                deleted[reason].append(info)
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
        self._sizes.pop(key, None)


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
    superseded: Superseded | None = None,
) -> None:
    """List and sweep every `interval_s`, and watch the index in between (`Sweeper.watch`, every
    `watch_interval(read_grace_s)` and when an object's read grace ends), for as long as the task
    runs, while `is_leader` says so (its memory forgotten whenever it does not), skipping rounds
    where the index view may be stale (e.g. the metadata store is unreachable)."""
    sweeper = Sweeper(store, referenced, fence, grace_s, read_grace_s, committed=committed, superseded=superseded)
    watch_s = min(watch_interval(read_grace_s), interval_s)
    next_listing = time.monotonic() + interval_s
    while True:
        wait = min(watch_s, next_listing - time.monotonic())
        if (due := sweeper.next_due()) is not None:
            wait = min(wait, due - time.time())
        await asyncio.sleep(max(wait, 0.0 if time.monotonic() >= next_listing else min(watch_s, 1.0)))
        listing = time.monotonic() >= next_listing
        if listing:
            next_listing = time.monotonic() + interval_s
        try:
            await sweeper.tick(is_leader(), is_current(), listing=listing)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("wal_sweep_failed", extra={"error": repr(e), "listing": listing})

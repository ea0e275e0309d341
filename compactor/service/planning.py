"""A cycle's planning of one topic: its WAL entries not in its table yet, read from each partition's
checkpoint (the next offset not yet in the table) and the view; the transactions they meet (an open
one holds its partition's table back below the last stable offset; one whose markers are being
written waits for the next cycle); and the plan over them (files/planner.py), stopped where a
transaction would be in the table on some of its partitions and not on others."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from metadata.model import IndexEntry, ObjectType, TopicInfo
from metadata.store import MetadataError, MetadataStore
from metadata.transactions import KEY_PREFIX, ending_partitions

from ..commits import upsert
from ..config import CompactorConfig
from ..files import planner
from .lag import Lag

log = logging.getLogger("neve.compactor")

MAX_ENTRIES_PER_PARTITION = 4096  # a cycle plans at most this many WAL entries of a partition


class Planning:
    def __init__(self, config: CompactorConfig, metadata: MetadataStore, lag: Lag, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.metadata = metadata
        self.lag = lag
        self._clock = clock
        # per (topic id, partition): the next offset not yet in the table, once known
        self._checkpoints: dict[tuple, int] = {}

    def advance(self, info: TopicInfo, partition: int, next_offset: int) -> None:
        """A cycle's offsets of the partition are in the table (and its index swapped)."""
        self._checkpoints[(info.topic_id, partition)] = next_offset

    async def read_pending(self, topics: list[TopicInfo]) -> tuple[dict, set[tuple[str, int]] | None]:
        """Each topic's pending entries, last stable offsets and aborted transactions, read from
        the view all at once (no await between topics), and the partitions whose transaction's
        markers the view may hold only in part: the stored transactions are read before and after
        (metadata/transactions.py `ending_partitions`), the view caught up with the first read.
        Those partitions wait for the next cycle, so a transaction over several partitions (and
        topics) is in each table whole or not at all. None when the stored transactions could not
        be read: then every partition that has had a transaction waits."""
        try:
            before = await self.metadata.registry_items(KEY_PREFIX)
            await self.metadata.view_caught_up()
        except MetadataError as e:
            log.warning("transactions unreadable: partitions with transactions wait", extra={"error": str(e)})
            before = None
        reads = {info.topic_id: self.pending(info) for info in topics}
        ending: set[tuple[str, int]] | None = None
        if before is not None:
            try:
                after = await self.metadata.registry_items(KEY_PREFIX)
            except MetadataError as e:
                log.warning("transactions unreadable: partitions with transactions wait", extra={"error": str(e)})
            else:
                ending = ending_partitions({i.key: (i.value, i.revision) for i in before}, {i.key: (i.value, i.revision) for i in after}) if before or after else set()
        return reads, ending

    def pending(self, info: TopicInfo) -> tuple:
        """The topic's WAL entries not in its table yet (their lag exported on the way), with the
        last stable offsets, aborted transactions and the parts of transactions read with them:
        no await between."""
        entries = self.wal_entries(info)
        self.lag.export(info, entries)
        stable, aborted, parts = self._transactions(info, entries)
        return entries, stable, aborted, parts

    async def plan(self, info: TopicInfo, pending: tuple, ending: set[tuple[str, int]] | None) -> planner.Plan:
        """The cycle's tasks over the topic's pending WAL entries, but for the partitions of a
        transaction whose markers are being written (`ending`; None: every partition that has had
        a transaction), and then stopped where a transaction would be in the table in part
        (`planner.whole_transactions`)."""
        entries, stable, aborted, parts = pending
        starts = {(info.name, p): e[0].base_offset for p, e in entries.items() if e}
        if ending is None:
            views = self.metadata.topic_views(info.topic_id)
            entries = {p: e for p, e in entries.items() if not (p < len(views) and views[p] is not None and views[p].txn_starts is not None)}
        elif ending:
            topic = info.topic_id.hex
            entries = {p: e for p, e in entries.items() if (topic, p) not in ending}
        now_ms = int(self._clock() * 1000)
        freshness_ms = self.config.freshness_ms
        if upsert.is_compacted(info.configs):
            # a compacted topic's records younger than min.compaction.lag.ms wait in the WAL;
            # max.compaction.lag.ms below the freshness makes its records due sooner
            for p, offset in upsert.horizons(info.configs, entries, now_ms).items():
                stable = {**stable, (info.name, p): min(stable.get((info.name, p), offset), offset)}
            if (most := upsert.max_compaction_lag_ms(info.configs)) is not None:
                freshness_ms = min(freshness_ms, most)
        # pure CPU over every pending entry (thousands at 1,000 partitions): off the broker's loop
        return await asyncio.to_thread(self._whole_plan, {(info.name, p): e for p, e in entries.items()}, starts, now_ms, freshness_ms, stable, aborted, parts)

    def _whole_plan(self, entries: dict, starts: dict, now_ms: int, freshness_ms: int, stable: dict, aborted: dict, parts: dict) -> planner.Plan:
        """The plan, made again with its partitions stopped sooner while it would take a
        transaction on some of its partitions and not on others (each round only lowers where a
        partition stops, so few rounds do)."""
        while True:
            plan = planner.plan(entries, starts, now_ms=now_ms, freshness_ms=freshness_ms, due_bytes=self.config.due_bytes, parallelism=self.config.parallelism, stable=stable, aborted=aborted)
            if not parts:
                return plan
            ends = {tp: plan.offsets[tp][1] + 1 if tp in plan.offsets else start for tp, start in starts.items()}
            held = planner.whole_transactions(ends, parts)
            if not held:
                return plan
            stable = {**stable, **{tp: min(stable.get(tp, end), end) for tp, end in held.items()}}

    def _transactions(self, info: TopicInfo, entries: Mapping[int, list[IndexEntry]]) -> tuple[dict, dict, dict]:
        """Per partition with pending entries, its last stable offset where a transaction is open
        there (the table waits below it), the aborted transactions its entries meet, and the
        named transactions with pending records there (committed or open), as the planner takes
        them; the offsets open transactions hold back exported. A partition that never had a
        transaction costs a lookup or two."""
        views = self.metadata.topic_views(info.topic_id)
        stable: dict[planner.TopicPartition, int] = {}
        aborted: dict[planner.TopicPartition, list[planner.Aborted]] = {}
        parts: dict[planner.TopicPartition, list[planner.TxnPart]] = {}
        held: dict[int, int] = {}
        for p, wal in entries.items():
            view = views[p] if p < len(views) else None
            if view is None or not wal:
                continue
            lso = view.last_stable_offset
            last = wal[-1].last_offset
            if lso < view.next_offset:
                stable[(info.name, p)] = lso
                held[p] = view.next_offset - lso
                last = min(last, lso - 1)
            found = view.aborted_between(wal[0].base_offset, last) if last >= wal[0].base_offset else ()
            if found:
                aborted[(info.name, p)] = [(a.producer_id, a.first_offset, a.last_offset) for a in found]
            named = [(c.producer_id, c.generation, c.first_offset, c.last_offset) for c in view.committed_from(wal[0].base_offset) if c.generation >= 0]
            for pid, first in (view.txn_starts or {}).items():
                state = self.metadata.producer_state(info.topic_id, p, pid)
                if state is not None and state.txn_generation >= 0:
                    named.append((pid, state.txn_generation, first, None))
            if named:
                parts[(info.name, p)] = named
        self.lag.export_held(info, held)
        return stable, aborted, parts

    def wal_entries(self, info: TopicInfo) -> dict[int, list[IndexEntry]]:
        """Each partition's WAL entries from its checkpoint on, in offset order, up to the first
        entry that is not WAL and at most MAX_ENTRIES_PER_PARTITION: what the table does not hold
        yet. The PARQUET entries before them move the checkpoint (read once after a start)."""
        out: dict[int, list[IndexEntry]] = {}
        for p in range(info.partitions):
            key = (info.topic_id, p)
            offset = self._checkpoints.get(key, 0)
            wal: list[IndexEntry] = []
            full = False
            while not full and (page := self.metadata.entries(info.topic_id, p, offset, max_entries=1024)):
                for e in page:
                    if e.object_type == ObjectType.WAL:
                        wal.append(e)
                        full = len(wal) >= MAX_ENTRIES_PER_PARTITION
                    elif not wal:
                        self._checkpoints[key] = e.last_offset + 1
                    else:
                        full = True  # only a rewrite by maintenance could put one after WAL entries
                    if full:
                        break
                offset = page[-1].last_offset + 1
            if wal:
                out[p] = wal
        return out

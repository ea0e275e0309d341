"""When a compaction service maintains its tables (the work itself is maintenance/): after each
topic's cycle its table's maintenance (maintenance/rounds.py), whose failure is reported apart and
never as the topic's compaction failing; once a run, the tables of deleted topics that asked for it
dropped (maintenance/retention.py); and on a topic without a table, what retention hid let go
(maintenance/wal_expiry.py)."""

from __future__ import annotations

import dataclasses
import logging

from metadata.model import TopicInfo
from metadata.store import Fenced, MetadataError, MetadataStore

from .. import metrics
from ..config import CompactorConfig
from ..maintenance import wal_expiry
from ..maintenance.retention import TopicDrops
from ..maintenance.rounds import TableMaintenance
from . import tables
from .failures import Failing
from .faults import Faults
from .lead import Lead
from .recovery import Recovery
from .resources import Resources

log = logging.getLogger("neve.compactor")


class Upkeep:
    def __init__(
        self,
        config: CompactorConfig,
        metadata: MetadataStore,
        maintenance: TableMaintenance,
        drops: TopicDrops,
        resources: Resources,
        recovery: Recovery,
        lead: Lead,
        faults: Faults,
    ) -> None:
        self.config = config
        self.metadata = metadata
        self.maintenance = maintenance
        self.drops = drops
        self.resources = resources
        self.recovery = recovery
        self.lead = lead
        self.faults = faults
        self._maintenance_failing: dict[str, Failing] = {}

    async def maintain(self, info: TopicInfo, committed: bool, rounds: bool = True) -> None:
        """maintain_topic, whose failure is reported as a maintenance failure (retried at its next
        round) and never as the topic's compaction failing."""
        self.lead.check()
        try:
            await self.maintain_topic(info, committed=committed, rounds=rounds)
        except Fenced:
            raise
        except Exception as e:
            reason = type(e).__name__
            failing = self._maintenance_failing.setdefault(info.name, Failing(reason))
            failing.count += 1
            metrics.MAINTENANCE_FAILURES.labels(info.name, reason).inc()
            log.warning("table maintenance failed; retried at its next round", extra={"topic": info.name, "reason": reason, "error": str(e)}, exc_info=e if reason not in failing.reasons else None)
            failing.reasons.add(reason)
        else:
            self._maintenance_failing.pop(info.name, None)

    async def maintain_topic(self, info: TopicInfo, committed: bool = False, rounds: bool = True):
        """The table maintenance of `info`'s table (maintenance/rounds.py): merge and expiry when due
        (and `rounds`: otherwise they stay due), the index re-pointed at the files any rewrite
        made (`committed`: a cycle just committed, and the table it left is read no more). A table
        maintenance changed is read again by the next cycle."""
        catalog = await self.resources.catalog()
        identifier = tables.table_identifier(self.config.namespace, info.name, info.configs)
        table = self.resources.kept(info, identifier) if committed else None
        outcome = await self.maintenance.maintain(catalog, info, identifier, committed, table=table, rounds=rounds)
        if any(dataclasses.astuple(outcome)):
            self.resources.forget(identifier)
        return outcome

    async def drop_deleted_tables(self) -> list[str]:
        """Drop the tables of topics deleted with `neve.iceberg.drop.on.delete` (maintenance/retention.py)."""
        self.lead.check()
        try:
            dropped = await self.drops.check(await self.resources.catalog())
        except Exception:
            log.exception("dropping deleted topics' tables failed; retried next cycle")
            return []
        for identifier in dropped:
            self.recovery.forget(identifier)
            self.maintenance.forget(identifier)
        if dropped:
            self.faults.at("dropped")
        return dropped

    async def expire_wal(self, info: TopicInfo) -> None:
        try:
            metrics.WAL_ENTRIES_EXPIRED.labels(info.name).inc(await wal_expiry.expire_topic(self.metadata, info))
        except MetadataError as e:
            log.warning("topic's expired WAL entries kept this cycle", extra={"topic": info.name, "reason": repr(e)})

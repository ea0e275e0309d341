"""What a crash or a change of owner may have cut short is finished before a topic's entries are
read: a table this service has not seen through its last cycle has that cycle's index swap finished
(commits/reindex.py `finish_last_cycle`), and a compacted topic's index entries merged (commits/
compacted_index.py). Which tables are through is known here, and forgotten whenever another
compactor may have cycled them meanwhile."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from metadata.model import TopicInfo
from metadata.store import MetadataError, MetadataStore
from wal.store import ObjectStore, ObjectStoreError

from ..commits import compacted_index, upsert
from ..commits.reindex import finish_last_cycle
from ..commits.rewrites import ManifestCache
from ..config import CompactorConfig
from . import tables
from .lead import Lead
from .resources import Resources

log = logging.getLogger("neve.compactor")


class Recovery:
    def __init__(self, config: CompactorConfig, metadata: MetadataStore, objects: ObjectStore, resources: Resources, lead: Lead, manifests: ManifestCache) -> None:
        self.config = config
        self.metadata = metadata
        self.objects = objects
        self.resources = resources
        self.lead = lead
        self.manifests = manifests
        self._recovered: set[str] = set()  # tables with no cycle committed and not swapped (as far as this process knows)

    def done(self, identifier: str | None) -> bool:
        """Whether the table is through its last cycle, as far as this process knows."""
        return identifier in self._recovered

    def mark(self, identifier: str) -> None:
        self._recovered.add(identifier)

    def forget(self, identifier: str | None) -> None:
        """The table is recovered again before its next cycle."""
        self._recovered.discard(identifier)

    def clear(self) -> None:
        self._recovered.clear()

    async def recover(self, info: TopicInfo, live: frozenset[str] | None):
        """A topic this compactor has not seen through its last cycle: its table loaded, and that
        cycle's index swap finished (reindex.finish_last_cycle), before its entries are read: the
        swap may move them. Returns the table."""
        identifier = tables.table_identifier(self.config.namespace, info.name, info.configs)
        self.lead.check()
        self.resources.forget(identifier)  # read as it is now, not as this process last knew it
        table = await self.resources.table(info, identifier, live)
        await finish_last_cycle(self.metadata, self.objects, table, self.lead.fence)
        if upsert.is_compacted(info.configs):  # a merge a crash cut short (commits/compacted_index.py)
            await self.merge_compacted(info, identifier, range(info.partitions))
        self._recovered.add(identifier)
        return table

    async def merge_compacted(self, info: TopicInfo, identifier: str, partitions: Iterable[int]) -> None:
        """A compacted topic's partitions' PARQUET entries merged into one each, so that its Kafka
        readers skip every record a cycle removed (commits/compacted_index.py). A failure leaves the
        entries as they are (readers then see records later ones superseded) until the next try."""
        try:
            await compacted_index.merge_entries(self.metadata, self.objects, self.manifests, info, identifier, partitions, self.lead.fence)
        except (MetadataError, ObjectStoreError) as e:
            log.warning("a compacted topic's index entries were not merged; merged at its next cycle", extra={"topic": info.name, "error": repr(e)})

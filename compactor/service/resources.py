"""What a compaction service opens once and keeps: the Iceberg catalog, the Spark session (started
on first need, unless its owner gave one), and the tables as this process last committed to them (a
cycle's commit starts from one without reading the catalog)."""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections import OrderedDict
from typing import Any, NamedTuple

from metadata.model import TopicInfo

from ..config import CompactorConfig
from . import tables

# Tables kept in memory as their last commit left them (the next cycle's commit starts from one
# without reading the catalog). A table's metadata holds every snapshot it keeps, about 4 KiB each
# in pyiceberg's models: up to 0.8 MiB at twice snapshot_max_count's default.
KEPT_TABLES = 256


class _TableKey(NamedTuple):
    """What a kept table is the table of: a topic config change loads it again."""

    topic_id: uuid.UUID
    partition_by: str | None

    @classmethod
    def of(cls, info: TopicInfo) -> _TableKey:
        return cls(info.topic_id, info.configs.get(tables.PARTITION_BY))


class Resources:
    """`spark` a SparkSession to run the tasks on (the runner `spark`) instead of one started on
    first need: its owner stops it, close() does not."""

    def __init__(self, config: CompactorConfig, *, spark=None) -> None:
        self.config = config
        self._catalog = None
        self._spark = spark
        self._owns_spark = spark is None
        # identifier -> (what it is the table of, the pyiceberg Table as this process last committed to it)
        self._tables: OrderedDict[str, tuple[_TableKey, Any]] = OrderedDict()  # the KEPT_TABLES last committed to

    async def catalog(self):
        if self._catalog is None:
            from ..catalog import load_catalog

            self._catalog = await asyncio.to_thread(load_catalog, self.config)
        return self._catalog

    async def spark_session(self):
        if self._spark is None:
            from ..files.spark import spark_session

            self._spark = await asyncio.to_thread(spark_session, self.config)
            if gc.get_freeze_count():  # the process froze what it started with (neve/cli.py's tune_gc):
                # pyspark and py4j, imported for the session, are never garbage either; unfrozen,
                # the full collection each job ends with (job.run_tasks) traversed them (70 ms).
                # Frozen without a collection first: one over the whole heap held the event loop
                # of a node with its compactor in it for about a second (bench/RESULTS.md, Nov 29);
                # the little garbage the imports left is frozen with them.
                gc.freeze()
        return self._spark

    async def maintenance_spark(self):
        """The session maintenance runs Spark's procedures on: the tasks' (None in-process)."""
        return None if self.config.runner == "in-process" else await self.spark_session()

    async def table(self, info: TopicInfo, identifier: str, live: frozenset[str] | None):
        """The topic's table as this compactor last committed to it, or loaded (created, bound, a
        deleted topic's table set aside: tables.load_or_create) when it has not kept it. A table
        changed by another writer since is not wrong to start from: the commit finds the change
        (its snapshot check fails) and re-reads the table before it tries again (commits/committer.py)."""
        kept = self.kept(info, identifier)
        if kept is not None:
            return kept
        catalog = await self.catalog()
        table = await asyncio.to_thread(tables.load_or_create, catalog, identifier, info.configs.get(tables.PARTITION_BY), info.topic_id, live)
        self.keep(info, identifier, table)
        return table

    def kept(self, info: TopicInfo, identifier: str):
        """The topic's table as this process last committed to it, None when it has not kept it."""
        kept = self._tables.get(identifier)
        return kept[1] if kept is not None and kept[0] == _TableKey.of(info) else None

    def keep(self, info: TopicInfo, identifier: str, table) -> None:
        self._tables[identifier] = (_TableKey.of(info), table)
        self._tables.move_to_end(identifier)
        while len(self._tables) > KEPT_TABLES:
            self._tables.popitem(last=False)

    def forget(self, identifier: str | None) -> None:
        """The table is read again when next needed, not as this process last knew it."""
        self._tables.pop(identifier, None)

    async def close(self) -> None:
        if self._spark is not None and self._owns_spark:
            spark, self._spark = self._spark, None
            await asyncio.to_thread(spark.stop)

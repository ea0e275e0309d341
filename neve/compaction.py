"""Wiring of the compactor: inside a node (`neve dev`, where it shares the node's stores) and alone
(`neve compactor`, beside a cluster's brokers on etcd and S3)."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import replace

from cache.reader import ObjectReader
from compactor.catalog import CatalogError, catalog_target, load_catalog
from compactor.config import CompactorConfig
from compactor.service.cycle import TopicCycle
from compactor.service.loop import CompactionService
from compactor.service.sharing import LEADERSHIP, Sharing
from metadata.store import MetadataStore
from registry.client import load_lookup
from wal.store import ObjectStore

from .config import Config

log = logging.getLogger("neve.compaction")


def compactor_settings(config: Config, data_dir: str) -> CompactorConfig:
    """The [compactor] section, with a node's local defaults filled in: a SQLite catalog and a
    warehouse in the data dir when no catalog is named, and at most 2 tables at a time."""
    c = config.compactor
    if c.in_node:  # its commits' CPU is taken from the broker's event loop (compactor/config.py)
        c = replace(c, tables_in_parallel=min(c.tables_in_parallel, 2))
    if not c.catalog_url:
        c = replace(c, catalog_url=f"sqlite://{os.path.join(data_dir, 'catalog.db')}", warehouse=c.warehouse or f"file://{os.path.join(data_dir, 'warehouse')}")
    return c


async def check_prerequisites(settings: CompactorConfig, *, escape: str) -> None:
    """What the compactor needs, checked at start so that a missing piece is one line then and not
    a failed cycle later (StartupError): the catalog reachable, and for the Spark runner Java,
    pyspark and the jars of that catalog's kind. `escape` says how to run without them."""
    from .node import StartupError

    try:
        target = catalog_target(settings)
        if settings.runner == "spark":
            from compactor.files.spark import SparkStartError, check_java, spark_jars

            try:
                await asyncio.to_thread(check_java)
                if importlib.util.find_spec("pyspark") is None:
                    raise SparkStartError("the compactor's Spark runner needs pyspark 3.5: pip install 'neve[table]'")
                spark_jars(target)
            except SparkStartError as e:
                raise StartupError(f"{e}; {escape}") from None
        elif settings.runner != "in-process":
            raise StartupError(f"compactor.runner {settings.runner!r}: use spark or in-process")
        await asyncio.to_thread(load_catalog, target)
    except CatalogError as e:
        raise StartupError(str(e)) from None


def serve_metrics(host: str, port: int) -> None:
    """Prometheus metrics of this process (the compactor's, and a node's) on host:port."""
    from prometheus_client import start_http_server

    from .node import StartupError

    try:
        start_http_server(port, addr=host)
    except OSError as e:
        raise StartupError(f"cannot serve metrics on {host}:{port}: {e.strerror or e}") from None



class CompactionLoop(CompactionService):
    """The service with a word on each committed cycle (`on_cycle`), for what a node prints, that
    cycles only while it leads "compactor" in the metadata store (`leadership`; None: cycle
    regardless, `neve compactor --once`): a second compactor on a cluster stands by, and takes over
    when the first stops or dies (its lease expires). With `share_topics`, its `leadership` is its
    membership among the compactors sharing the topics (compactor/service/sharing.py), which it leads at
    once: it cycles over its share. The service checks the lead between the
    steps of a cycle and fences its index swaps with it (compactor/service/lead.py)."""

    on_cycle: Callable[[TopicCycle], None] | None = None
    _standing_by = False

    async def run_once(self) -> list[TopicCycle]:
        if self.leadership is not None and not self.leadership.is_leader():
            if not self._standing_by:
                log.info("compactor_standing_by", extra={"leadership": self.leadership.name, "holder": self.leadership.holder})
            self._standing_by = True
            return []
        if self._standing_by:
            log.info("compactor_leading", extra={"leadership": self.leadership.name, "holder": self.leadership.holder})
            self._standing_by = False
        cycles = await super().run_once()
        if self.on_cycle is not None:
            for cycle in cycles:
                if cycle.cycle_id is not None:
                    self.on_cycle(cycle)
        return cycles


class RunningCompactor:
    """A CompactionService cycling in this process's event loop until `stop`."""

    def __init__(
        self,
        config: Config,
        settings: CompactorConfig,
        metadata: MetadataStore,
        objects: ObjectStore,
        objects_url: str,
        on_cycle: Callable[[TopicCycle], None] | None = None,
        reader: ObjectReader | None = None,
    ) -> None:
        """`reader`: the node's, when the compactor runs in a node: tasks run in this process read
        the WAL through it (its recent objects, the zone's chunk cache)."""
        self.settings = settings
        self.objects_url = objects_url
        self.reader = reader
        self.metadata = metadata
        self.lookup = load_lookup(config.registry, metadata)  # with the registry's credentials and CA
        self.service = CompactionLoop(settings, metadata, objects, objects_url, self.lookup)
        self.service.on_cycle = on_cycle
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.reader is not None:
            from compactor.files import job

            job.register_local_reader(self.objects_url, self.reader.read, asyncio.get_running_loop())
        self._task = asyncio.create_task(self._run())
        log.info("compactor_started", extra={"catalog": self.settings.catalog_url, "runner": self.settings.runner, "namespace": self.settings.namespace, "share_topics": self.settings.share_topics})

    async def _run(self) -> None:
        holder = f"{socket.gethostname()}:{os.getpid()}"
        if self.settings.share_topics:  # its own membership is its lead: it cycles over its share (compactor/service/sharing.py)
            self.service.sharing = Sharing(self.metadata, holder)
            self.service.leadership = await self.service.sharing.start()
        else:
            self.service.leadership = await self.metadata.campaign(LEADERSHIP, holder)
        try:
            await self.service.run(self._stop)
        finally:
            if self.service.sharing is not None:
                await self.service.sharing.stop()  # the others take its topics at their next run
            else:
                await self.service.leadership.resign()

    async def run_until_caught_up(self, on_cycle=None, max_rounds: int = 1000) -> list[TopicCycle]:
        """`neve compactor --once`: cycles until one finds nothing due; `on_cycle` sees each topic's.
        The topics whose compaction failed in that last round are then in `self.service.failed`."""
        done: list[TopicCycle] = []
        for _ in range(max_rounds):
            cycles = [c for c in await self.service.run_once() if c.cycle_id is not None]
            for c in cycles:
                if on_cycle is not None:
                    on_cycle(c)
            done.extend(cycles)
            if not cycles:
                break
        return done

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        if self.reader is not None:
            from compactor.files import job

            job.register_local_reader(self.objects_url, None)
        await self.service.close()
        await self.lookup.close()


class CompactorNode:
    """`neve compactor`: the compaction service alone, over a cluster's metadata store and WAL object
    store (metadata.url, wal.object_store), or over a data dir no node is running on."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.data_dir = os.path.abspath(config.data_dir)
        self.objects_url = config.wal.object_store or f"file://{os.path.join(self.data_dir, 'objects')}"
        self.metadata_url = config.metadata.url or f"sqlite://{os.path.join(self.data_dir, 'metadata.db')}"
        self.running: RunningCompactor | None = None
        self._chunks = None
        self._lock_fd: int | None = None

    async def start(self, *, cycle: bool = True) -> None:
        from metadata.store import MetadataError, load_metadata_store
        from wal.store import ObjectStoreError, load_object_store

        from .node import StartupError, lock_data_dir

        if self.objects_url.startswith("file:") or self.metadata_url.startswith("sqlite:"):
            self._lock_fd = lock_data_dir(self.data_dir)
        settings = compactor_settings(self.config, self.data_dir)
        await check_prerequisites(settings, escape="or run the tasks without Spark: NEVE_COMPACTOR_RUNNER=in-process")
        if settings.metrics_port:
            serve_metrics(self.config.broker.metrics_host or self.config.broker.host, settings.metrics_port)
        m = self.config.metadata
        try:
            self.objects = load_object_store(self.objects_url)
            self.metadata = load_metadata_store(self.metadata_url, timeout_ms=m.timeout_ms, lease_ttl_s=m.lease_ttl_s, compact_interval_s=m.compact_interval_s, producer_expiry_ms=m.producer_expiry_ms)
            await self.objects.probe()
            await self.metadata.start()
        except (ValueError, ImportError, ObjectStoreError, MetadataError) as e:
            raise StartupError(str(e)) from None
        self.running = RunningCompactor(self.config, settings, self.metadata, self.objects, self.objects_url, reader=self._zone_reader())
        if cycle:
            self.running.start()

    def _zone_reader(self) -> ObjectReader | None:
        """A reader through the chunk cache of the zone's brokers (NEVE_BROKER_ZONE names the
        compactor's zone), for tasks that run in this process: it asks the chunks' owners and never
        owns any itself (seed 003 §4.3.3). None when the cache is off or the runner is Spark (its
        executors are other processes, which read the store themselves)."""
        from cache.chunks import Member, ZoneChunks
        from cache.peerauth import load_peer_secret, peer_tls
        from cache.recent import RecentObjects

        cache, zone = self.config.cache, self.config.broker.zone or None  # registrations name no zone None
        if not cache.enabled or compactor_settings(self.config, self.data_dir).runner != "in-process":
            return None
        secret, tls = load_peer_secret(cache), peer_tls(cache)  # the zone's brokers refuse a reader without them

        def members() -> list[Member]:
            return [Member(b.node_id, b.host, b.cache_port) for b in self.metadata.live_brokers() if b.zone == zone and b.cache_port]

        self._chunks = ZoneChunks(
            self.objects, RecentObjects(0), node_id=-1, members=members, chunk_bytes=cache.chunk_bytes, memory_bytes=cache.memory_bytes,
            peer_timeout_s=cache.peer_timeout_ms / 1000, peer_retry_s=cache.peer_retry_ms / 1000, member=False,
            peer_secret=secret, peer_tls=tls[1] if tls else None,
        )  # fmt: skip
        return ObjectReader(self.objects, RecentObjects(0), chunks=self._chunks)

    async def stop(self) -> None:
        if self.running is not None:
            await self.running.stop()
        if self._chunks is not None:
            await self._chunks.close()
        await self.metadata.close()
        await self.objects.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)

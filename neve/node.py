"""Wiring of one neve node: object store, metadata store, WAL writer, caches, the schema registry
and the Kafka server, started and stopped in dependency order."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
from dataclasses import replace

from auth.credentials import ScramCredentials
from auth.sasl import SaslMechanisms
from auth.tls import ReloadingServerContext, TlsError, TlsFiles, parse_mapping_rules
from broker.appender import commit_fn
from broker.config import BrokerConfig
from broker.context import Services
from broker.listeners import ListenerError, check_listeners, listeners_of
from broker.metrics import WalMetrics, expose_metadata_ops, object_get
from broker.peer_dial import peer_dialer
from broker.retention import run_retention
from broker.security import authorizer, bootstrap_scram_users, sasl_mechanisms
from broker.server import KafkaServer
from broker.transactions.coordinator import run_transaction_sweep
from cache.chunks import Member, ZoneChunks
from cache.peerauth import PeerSecurityError, check_chunk_port, load_peer_secret, peer_tls
from cache.peers import ChunkServer
from cache.reader import ObjectReader
from cache.recent import RecentObjects
from metadata.model import BrokerRegistration
from metadata.store import MetadataError, MetadataStore, load_metadata_store
from registry.client import load_lookup
from registry.config import DEFAULT_PORT as REGISTRY_PORT
from registry.server import RegistryServer, load_server
from wal.manifest import is_manifest
from wal.store import ObjectStoreError, load_object_store
from wal.sweeper import run_sweeper
from wal.writer import WalWriter

from .config import Config

log = logging.getLogger("neve.node")


class StartupError(Exception):
    """A clear, user-facing reason the node cannot start."""


def broker_settings(config: Config) -> BrokerConfig:
    """The broker's settings as the node runs them: a copy of [broker] with what the other
    sections decide filled in (the read pause capped by the WAL linger, the produce deadline)."""
    b = config.broker
    return replace(
        b,
        produce_read_pause_ms=max(0.0, min(b.produce_read_pause_ms, config.wal.linger_ms / 10)),
        produce_timeout_ms=max(b.produce_timeout_ms, config.wal.upload_timeout_ms + 15_000),
    )


def lock_data_dir(data_dir: str) -> int:
    """Hold the data dir for this process (its SQLite metadata has one owner): the lock's fd."""
    os.makedirs(data_dir, exist_ok=True)
    fd = os.open(os.path.join(data_dir, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StartupError(f"data dir {data_dir} is in use by another neve process") from None
    return fd


def registry_port(config: Config, dev: bool) -> tuple[int, bool]:
    """(the port to serve the schema registry on, 0 for none; whether it may be skipped when taken):
    see RegistryConfig.port."""
    r = config.registry
    if r.url:
        return 0, False
    if r.port == -1:
        return (REGISTRY_PORT, True) if dev else (0, False)
    return r.port, False


async def start_registry(config: Config, metadata: MetadataStore, port: int, optional: bool, check_password=None) -> RegistryServer | None:
    """The schema registry, serving on `port` (HTTPS and its users as [registry] says);
    `check_password` checks the SCRAM users' passwords (registry.scram_users)."""
    settings = replace(config.registry, host=config.registry.host or config.broker.host, port=port)
    try:
        server = await load_server(settings, metadata, check_password)
    except (ValueError, OSError) as e:
        raise StartupError(f"schema registry: {e}") from None
    try:
        await server.start()
    except OSError as e:
        if optional:
            log.warning("registry_not_served", extra={"port": port, "reason": e.strerror or str(e)})
            return None
        raise StartupError(f"cannot serve the schema registry on {server.host}:{port}: {e.strerror or e}") from None
    return server


class Node:
    """`on_cycle` hears of each cycle the compactor inside commits (compactor.in_node)."""

    def __init__(self, config: Config, dev: bool = False, on_cycle=None) -> None:
        self.config = config
        self.dev = dev
        self.on_cycle = on_cycle
        self.registry: RegistryServer | None = None
        self._table_files = None
        self._schemas = None
        self.data_dir = os.path.abspath(config.data_dir)
        self.object_store_url = config.wal.object_store or f"file://{os.path.join(self.data_dir, 'objects')}"
        self.metadata_url = config.metadata.url or f"sqlite://{os.path.join(self.data_dir, 'metadata.db')}"
        self._lock_fd: int | None = None
        self.server: KafkaServer | None = None
        self._sweeper: asyncio.Task | None = None
        self._retention: asyncio.Task | None = None
        self._transaction_sweep: asyncio.Task | None = None
        self.compactor = None  # neve.compaction.RunningCompactor when compactor.in_node
        self._chunks: ZoneChunks | None = None
        self._chunk_server: ChunkServer | None = None
        self._authorizer = None  # the ACL authorizer (broker.authorizer_enabled)

    def _lock_data_dir(self) -> None:
        self._lock_fd = lock_data_dir(self.data_dir)

    @property
    def uses_data_dir(self) -> bool:
        return self.object_store_url.startswith("file:") or self.metadata_url.startswith("sqlite:")

    async def start(self) -> None:
        c = self.config
        listeners, tls, principal_rules = self._listeners()  # before anything starts: bad settings fail at once
        if self.uses_data_dir:
            self._lock_data_dir()
        if c.compactor.in_node:  # before anything listens: a node without what its tables need does not start
            from .compaction import check_prerequisites, compactor_settings

            escape = "or run the tasks without Spark: NEVE_COMPACTOR_RUNNER=in-process, or the node without tables: NEVE_COMPACTOR_IN_NODE=false"
            await check_prerequisites(compactor_settings(c, self.data_dir), escape=escape)
        try:
            self.objects = load_object_store(self.object_store_url)
            m = c.metadata
            self.metadata = load_metadata_store(
                self.metadata_url, timeout_ms=m.timeout_ms, lease_ttl_s=m.lease_ttl_s, compact_interval_s=m.compact_interval_s, producer_expiry_ms=m.producer_expiry_ms
            )
        except (ValueError, ImportError) as e:
            raise StartupError(str(e)) from None
        try:
            await self.objects.probe()
        except ObjectStoreError as e:
            raise StartupError(f"object store {self.object_store_url.split('?')[0]}: {e}") from None
        try:
            await self.metadata.start()
        except MetadataError as e:
            raise StartupError(f"metadata store {self.metadata_url}: {e}") from None
        self.recent = RecentObjects(c.wal.recent_objects_bytes)
        self.wal = WalWriter(
            self.objects,
            commit_fn(self.metadata),
            node_id=c.broker.node_id,
            linger_ms=c.wal.linger_ms,
            flush_bytes=c.wal.flush_bytes,
            max_inflight_uploads=c.wal.max_inflight_uploads,
            buffer_bytes=c.wal.buffer_bytes,
            upload_timeout_ms=c.wal.upload_timeout_ms,
            put_hedge_after_ms=c.wal.put_hedge_after_ms,
            # half the orphan grace: a second guard, behind the sweeper's fence, against committing an object a sweeper deletes
            commit_deadline_s=c.wal.orphan_grace_s / 2,
            on_object_stored=self.recent.add,
            metrics=WalMetrics(),
        )
        if c.broker.metrics_port:
            # before the Kafka listener: once clients can connect, the counters can be scraped
            from prometheus_client import start_http_server

            expose_metadata_ops(self.metadata)
            metrics_host = c.broker.metrics_host or c.broker.host
            try:
                start_http_server(c.broker.metrics_port, addr=metrics_host)
            except OSError as e:
                raise StartupError(f"cannot serve metrics on {metrics_host}:{c.broker.metrics_port}: {e.strerror or e}") from None
        credentials, sasl = await self._authentication(listeners)
        port, optional = registry_port(c, self.dev)
        if port:  # before the Kafka listener: a node that takes connections serves its schemas
            self.registry = await start_registry(c, self.metadata, port, optional, credentials.check_password if c.registry.scram_users else None)
        settings = broker_settings(c)
        reader = ObjectReader(self.objects, self.recent, on_get=object_get, chunks=await self._start_chunks(settings))
        services = Services(
            settings=settings, metadata=self.metadata, wal=self.wal, reader=reader, compacted=self._compacted_reader(reader),
            storage=self.object_store_url.split("?", 1)[0], faults=c.faults, sasl=sasl, authorizer=self._authorizer,
        )  # fmt: skip
        self.services = services
        self.server = KafkaServer(services, listeners, tls, principal_rules, peer_dialer(c.broker, listeners))
        try:
            await self.server.start()
        except OSError as e:
            where = ", ".join(f"{item.host}:{item.port}" for item in listeners)
            raise StartupError(f"cannot listen on {where}: {e.strerror or e}") from None
        port, ports = self.server.port, self.server.ports
        services.settings = replace(settings, port=port)
        endpoints = tuple((item.name, item.advertised_host, item.advertised_port or ports[item.name]) for item in listeners)
        first = endpoints[0]
        try:
            cache_port = self._chunk_server.port if self._chunk_server is not None else 0
            registration = BrokerRegistration(settings.node_id, first[1], first[2], settings.zone or None, cache_port, endpoints if len(endpoints) > 1 else ())
            await self.metadata.register_broker(registration)
        except Exception as e:
            raise StartupError(f"cannot register broker {settings.node_id} in {self.metadata_url}: {e!r}") from None
        if c.wal.sweep_interval_s > 0:  # one node of a cluster sweeps: the leader of "wal-sweeper"
            sweeping = await self.metadata.campaign("wal-sweeper", f"{settings.node_id}@{settings.advertised()}:{port}")
            self._sweeper = asyncio.create_task(
                run_sweeper(
                    self.objects, self._referenced_objects, self.metadata.fence_objects, self.metadata.is_current, c.wal.orphan_grace_s, c.wal.sweep_interval_s,
                    read_grace_s=c.wal.read_grace_s, is_leader=sweeping.is_leader, committed=self._compacted_objects, superseded=self._superseded_objects,
                )
            )
        if c.broker.retention_check_interval_ms > 0:
            self._retention = asyncio.create_task(run_retention(self.metadata, c.broker.retention_check_interval_ms / 1000))
        if c.broker.transaction_check_interval_ms > 0:  # one node of a cluster: the leader of "transaction-sweeper"
            sweeping = await self.metadata.campaign("transaction-sweeper", f"{settings.node_id}@{settings.advertised()}:{port}")
            self._transaction_sweep = asyncio.create_task(
                run_transaction_sweep(services.transactions, sweeping.is_leader, self.metadata.is_current, c.broker.transaction_check_interval_ms / 1000)
            )
        if c.compactor.in_node:
            from .compaction import RunningCompactor, compactor_settings

            self.compactor = RunningCompactor(c, compactor_settings(c, self.data_dir), self.metadata, self.objects, self.object_store_url, on_cycle=self.on_cycle, reader=self.services.reader)
            self.compactor.start()
        log.info("node_started", extra={"listen": f"{settings.host}:{port}", "data_dir": self.data_dir, "objects": self.object_store_url, "metadata": self.metadata_url})

    def _listeners(self):
        """(the Kafka listeners, the TLS context of the SSL ones or None, the certificate principal
        rules), checked: StartupError says what is wrong."""
        b = self.config.broker
        try:
            listeners = listeners_of(b)
            check_listeners(listeners, b, cluster=not self.dev)
            files = TlsFiles(b.ssl_certfile, b.ssl_keyfile, b.ssl_cafile, b.ssl_client_auth, b.ssl_key_password)
            # client certificates are asked on SSL listeners only, as Kafka's ssl.client.auth
            per_protocol = {"SSL": files, "SASL_SSL": replace(files, client_auth="none")}
            tls = {p: ReloadingServerContext(per_protocol[p]) for p in {item.protocol for item in listeners if item.uses_tls}}
            return listeners, tls, parse_mapping_rules(b.ssl_principal_mapping_rules)
        except (ListenerError, TlsError) as e:
            raise StartupError(str(e)) from None

    async def _authentication(self, listeners) -> tuple[ScramCredentials, SaslMechanisms | None]:
        """The SCRAM credentials (bootstrap users created) and the SASL mechanisms the SASL
        listeners offer (None when no listener is SASL)."""
        b = self.config.broker
        credentials = ScramCredentials(self.metadata)
        try:
            if b.sasl_scram_users_file:
                await bootstrap_scram_users(b.sasl_scram_users_file, credentials)
            sasl = sasl_mechanisms(b, credentials) if any(item.uses_sasl for item in listeners) else None
            if sasl is not None and any(sasl.offers(m) for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")):
                await credentials.ensure_unknown_user_key()
            self._authorizer = authorizer(b, self.metadata)
        except (OSError, ValueError, MetadataError) as e:
            raise StartupError(f"authentication: {e}") from None
        return credentials, sasl

    async def _start_chunks(self, settings: BrokerConfig) -> ZoneChunks | None:
        """The per-zone chunk cache and its server (before the broker registers: the registration
        names the server's port), or None when it is off."""
        cache = self.config.cache
        if not cache.enabled:
            return None
        zone, me = settings.zone or None, settings.node_id
        try:  # the chunk port proves the deployment's secret both ways; never open off loopback
            secret, tls = load_peer_secret(cache), peer_tls(cache)
            if not self.dev:  # `neve dev` serves its chunks on loopback: one node has no peers
                check_chunk_port(settings.host, cache, secret)
        except PeerSecurityError as e:
            raise StartupError(str(e)) from None

        def members() -> list[Member]:  # the zone's live brokers serving chunks; never another zone's
            return [Member(b.node_id, b.host, b.cache_port) for b in self.metadata.live_brokers() if b.zone == zone and b.cache_port and b.node_id != me]

        self._chunks = ZoneChunks(
            self.objects, self.recent, node_id=me, members=members, chunk_bytes=cache.chunk_bytes, memory_bytes=cache.memory_bytes,
            peer_timeout_s=cache.peer_timeout_ms / 1000, peer_retry_s=cache.peer_retry_ms / 1000, on_get=object_get,
            peer_secret=secret, peer_tls=tls[1] if tls else None,
        )  # fmt: skip
        chunk_host = "127.0.0.1" if self.dev else settings.host
        self._chunk_server = ChunkServer(self._chunks.serve, chunk_host, cache.port, cache.chunk_bytes, secret=secret, tls=tls[0] if tls else None)
        try:
            await self._chunk_server.start()
        except OSError as e:
            raise StartupError(f"cannot serve cache chunks on {chunk_host}:{cache.port}: {e.strerror or e}") from None
        return self._chunks

    def _compacted_reader(self, reader: ObjectReader):
        """What serves compacted offsets from the table's files; None without the table extra
        (pyarrow), when compacted offsets are read from the WAL their manifests name."""
        try:
            from table.files import TableFiles
            from table.parquet import ParquetRows
            from table.serve import CompactedReader
        except ImportError as e:
            log.warning("compacted_reads_from_wal", extra={"reason": f"{e}: pip install 'neve[table]' to serve them from the table"})
            return None
        compactor = self.config.compactor
        self._table_files = TableFiles(
            reader, self.object_store_url, compactor.s3_endpoint, compactor.s3_region if compactor.s3_endpoint else "", compactor.s3_access_key_id, compactor.s3_secret_access_key
        )
        self._schemas = load_lookup(self.config.registry, self.metadata)
        table = self.config.table
        return CompactedReader(reader, ParquetRows(self._table_files, table.decoded_bytes), self._schemas.schema, cache_bytes=table.rebuilt_bytes)

    async def _referenced_objects(self) -> set[str]:
        """What the sweeper keeps: objects index entries name; and, only where compacted offsets
        are not served from the table (no table extra), the WAL objects of the cycle manifests
        compacted entries name, since reads of compacted offsets then go to them."""
        keys = self.metadata.referenced_objects()
        if self.services.compacted is not None:
            return keys
        for key in [k for k in keys if is_manifest(k)]:
            keys |= (await self.services.reader.manifest(key)).wal_objects()
        return keys

    async def _compacted_objects(self) -> set[str]:
        """The WAL objects the cycle manifests that index entries name say compaction replaced:
        committed objects, which the sweeper collects after the read grace, not the orphan grace."""
        keys: set[str] = set()
        for key in [k for k in self.metadata.referenced_objects() if is_manifest(k)]:
            keys |= (await self.services.reader.manifest(key)).wal_objects()
        return keys

    async def _superseded_objects(self, keys: set[str]) -> set[str]:
        """The WAL objects that the cycle manifests among `keys` (named by entries a swap just
        made) say compaction replaced: the sweeper starts their read grace at once."""
        replaced: set[str] = set()
        for key in keys:
            if is_manifest(key):
                replaced |= (await self.services.reader.manifest(key)).wal_objects()
        return replaced

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    def listening(self) -> list[tuple[str, str, str, int]]:
        """(name, security protocol, host, bound port) of each Kafka listener, the first first."""
        assert self.server is not None
        ports = self.server.ports
        return [(item.name, item.protocol, item.host, ports[item.name]) for item in self.server.listeners]

    async def stop(self) -> None:
        if self.compactor is not None:
            await self.compactor.stop()  # a cycle under way finishes (or is redone after a restart)
        for task in (self._sweeper, self._retention, self._transaction_sweep):
            if task is not None:
                task.cancel()
        if self.server is not None:
            self.services.coordinator.close()  # answer waiting joins/syncs before connections close
            await self.server.stop()
            await self.services.coordinator.flush()  # group state writes already under way
            if self._chunk_server is not None:
                await self._chunk_server.stop()
                await self._chunks.close()
            await self.wal.close()
            if self.registry is not None:
                await self.registry.stop()
            if self.services.compacted is not None:
                await self.services.compacted.close()  # reads ahead under way
            if self._table_files is not None:
                await self._table_files.close()
            if self._schemas is not None:
                await self._schemas.close()
            await self.metadata.close()
            await self.objects.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        log.info("node_stopped")


class RegistryNode:
    """`neve registry`: the schema registry alone, over the configured metadata store (etcd, for a
    registry beside a cluster's brokers; or a data dir's SQLite, which it then owns)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.data_dir = os.path.abspath(config.data_dir)
        self.metadata_url = config.metadata.url or f"sqlite://{os.path.join(self.data_dir, 'metadata.db')}"
        self._lock_fd: int | None = None
        self.registry: RegistryServer | None = None

    async def start(self) -> None:
        if self.metadata_url.startswith("sqlite:"):
            self._lock_fd = lock_data_dir(self.data_dir)
        m = self.config.metadata
        try:
            self.metadata = load_metadata_store(
                self.metadata_url, timeout_ms=m.timeout_ms, lease_ttl_s=m.lease_ttl_s, compact_interval_s=m.compact_interval_s, producer_expiry_ms=m.producer_expiry_ms
            )
            await self.metadata.start()
        except (ValueError, ImportError, MetadataError) as e:
            raise StartupError(f"metadata store {self.metadata_url}: {e}") from None
        port = self.config.registry.port
        self.registry = await start_registry(self.config, self.metadata, REGISTRY_PORT if port == -1 else port, optional=False)

    @property
    def port(self) -> int:
        assert self.registry is not None
        return self.registry.port

    async def stop(self) -> None:
        if self.registry is not None:
            await self.registry.stop()
            await self.metadata.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)

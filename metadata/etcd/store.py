"""The etcd store's entry point: its settings, its state, starting and closing, and the two
request helpers (a transaction, a read) that every part of it uses."""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass

from ..model import BrokerRegistration, TopicInfo
from ..store import PRODUCER_EXPIRY_MS, MetadataStore, MetadataUnavailable
from ..view import IndexReads
from .client import EtcdClient, EtcdSecurity, connect_failure
from .commits import _Commits
from .follower import _Follower, _PartitionState
from .groups import _Groups
from .index import _Index
from .keys import _Keys
from .leaders import _Leaders
from .leases import _Leases
from .schemas import _Schemas
from .security import _Security
from .topics import _Topics

log = logging.getLogger("neve.metadata.etcd")

GRPC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # both ways; well above a load's pages (follower.PAGE_BYTES)


@dataclass
class EtcdSettings:
    timeout: float = 5.0
    lease_ttl: int = 5
    producer_expiry_ms: int = PRODUCER_EXPIRY_MS
    compact_interval_s: float = 300.0
    keep_revisions: int = 10_000
    commit_attempts: int = 64


class EtcdMetadataStore(_Follower, _Commits, _Index, _Topics, _Leases, _Leaders, _Groups, _Schemas, _Security, IndexReads, MetadataStore):
    """The store, one class: each part of it is a mixin of its own module (follower, commits,
    topics, leases, leaders, groups, schemas, security); the state they share is made here."""

    def __init__(self, host: str, port: int, root: str = "neve", settings: EtcdSettings | None = None, security: EtcdSecurity | None = None) -> None:
        super().__init__()
        self.host, self.port = host, port
        self.security = security or EtcdSecurity()
        self.keys = _Keys(root)
        self._heads_prefix, self._index_prefix = self.keys.prefix("heads/"), self.keys.prefix("index/")
        self._wal_index_prefix = self.keys.prefix("wal-index/")
        self._producers_prefix = self.keys.prefix("producers/")
        self._security_prefix = self.keys.prefix("security/")
        self.settings = settings or EtcdSettings()
        self._client = None
        self._topics: dict[str, TopicInfo] = {}
        self._topics_by_id: dict[uuid.UUID, TopicInfo] = {}
        self._topic_created: dict[uuid.UUID, int] = {}  # topic id -> its key's create revision
        self._partitions: dict[tuple[uuid.UUID, int], _PartitionState] = {}
        self._topic_views = {}
        self._tasks: list[asyncio.Task] = []
        self._lease = None
        self._registration: BrokerRegistration | None = None
        # The revision of this broker's registration put: group writes compare it (groups.py), so
        # a broker whose lease lapsed (a pause past the TTL) writes no group state or offsets
        # until it registers again, and then rereads its groups (`registration_revision`).
        self._registered_revision = 0
        # The etcd revision of each broker registration in the view: a watch event older than it
        # is dropped. A broker that registers again after losing its lease puts its registration
        # in the view at once, while the old key's deletion (the lease's expiry, an earlier
        # revision) may still be on its way through the watch: it must not remove the new one.
        self._broker_revisions: dict[int, int] = {}
        self._security: dict[str, bytes] = {}  # the security family, by key below `security/`
        self._security_version = 0  # the etcd revision of the family's last change in the view (or its load)
        self._pid_next = 0
        self._pid_end = 0
        self._pid_lock = asyncio.Lock()
        self._commit_lock = asyncio.Lock()
        self._expiring_lease_obj = None
        self._expiring_lease_at = 0.0
        self._loaded = asyncio.Event()
        self._watching = False
        self._closed = False
        self.ops = 0  # etcd requests made, for the cost benchmark
        # Revisions of this broker's own commit transactions, already applied to the view: their
        # watch events (a head per partition and a wal-index record) are skipped, not decoded again.
        self._own_revisions: set[int] = set()
        self._commits_in_flight: set[asyncio.Future] = set()  # one per commit transaction sent and not yet answered
        # Every partition by its path in keys (`_Keys.partition_path`): the watch finds the
        # partition of a head or index event with one string lookup, not by parsing its id.
        self._by_path: dict[str, tuple[tuple[uuid.UUID, int], _PartitionState]] = {}
        self._revision = 0  # the etcd revision the view reflects (loaded, then followed)
        self._revision_waiters: list[tuple[int, asyncio.Future]] = []
        self._delete_type = None  # etcd's Event.DELETE, set once aetcd is imported (start)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        from aetcd import rpc

        self._delete_type = rpc.Event.DELETE
        options = {"grpc.max_receive_message_length": GRPC_MAX_MESSAGE_BYTES, "grpc.max_send_message_length": GRPC_MAX_MESSAGE_BYTES}
        self._client = EtcdClient(self.host, self.port, self.security, timeout=self.settings.timeout, options=options)
        try:
            # each page's read is bounded by the timeout, not the whole load: years of metadata take longer
            revision = await self._load()
        except Exception as e:
            await self._client.close()
            raise MetadataUnavailable(f"etcd at {self.host}:{self.port}: {connect_failure(e, self.security)}") from e
        self._view_at(revision)
        self._tasks.append(asyncio.create_task(self._follow(revision)))
        self._tasks.append(asyncio.create_task(self._compact_history()))

    async def close(self) -> None:
        # `_follow` also checks `_closed` when its watch stream ends (aetcd's own watch, used before,
        # could swallow a cancellation on Python 3.11, CPython gh-86296), and every step of closing
        # is bounded: a stuck step is logged and left behind.
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await self._bounded("background tasks", *self._tasks)
        if self._lease is not None:
            await self._bounded("lease revoke", self._lease.revoke())
        if self._client is not None:
            await self._bounded("client close", self._client.close())

    async def _bounded(self, what: str, *aws) -> None:
        if not aws:
            return
        futures = [asyncio.ensure_future(a) for a in aws]
        done, pending = await asyncio.wait(futures, timeout=self.settings.timeout)
        for f in done:
            if not f.cancelled() and f.exception() is not None and not isinstance(f.exception(), asyncio.CancelledError):
                log.debug("etcd_close_step_failed", extra={"step": what, "error": repr(f.exception())})
        if pending:
            log.warning("etcd_close_step_stuck", extra={"step": what, "pending": len(pending)})
            for f in pending:
                f.cancel()

    # -- requests -----------------------------------------------------------------------------

    async def _txn(self, compare, success, failure=()):
        self.ops += 1
        try:
            return await asyncio.wait_for(self._client.transaction(compare=list(compare), success=list(success), failure=list(failure)), self.settings.timeout)
        except TimeoutError as e:
            raise MetadataUnavailable("etcd transaction timed out") from e
        except MetadataUnavailable:
            raise
        except Exception as e:
            raise MetadataUnavailable(f"etcd transaction failed: {e!r}") from e

    async def _read(self, call):
        self.ops += 1
        try:
            return await asyncio.wait_for(call, self.settings.timeout)
        except Exception as e:
            raise MetadataUnavailable(f"etcd read failed: {e!r}") from e

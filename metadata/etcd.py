"""The etcd backend of the metadata interface (production): many stateless brokers sequence
offsets through one etcd, with optimistic concurrency and no leader.

Key layout (all under `/<root>/`, root "neve" by default; values are compact JSON):

    topics/<name>                             {"id": hex, "partitions": n, "configs": {...}}
    heads/<topic id hex>/<partition:06d>      {"n": next offset, "s": log start, "p": {producer id:
                                               [epoch, [[first seq, last seq, base offset] x<=5], last used ms]}}
    wal-index/<object key>/<group:04d>        the index entries one commit transaction added, all in one WAL
                                              object: [object key, [[topic id hex, [[partition:06d, base
                                              offset, last offset, start, size, max timestamp] ...]] ...]]
    index/<topic id hex>/<partition:06d>/<base offset:020d>
                                              one index entry: [last offset, object key, type, start,
                                              size, max timestamp] (written before wal-index existed; read)
    producer-ids                              the next unallocated producer id (allocated in blocks)
    producer-epochs/<producer id>             current epoch, on a lease of the producer expiry
    brokers/<node id>                         {"host", "port", "zone"}, attached to the broker's lease
    groups/<group, url-quoted>                the group coordinator's state (opaque to this store)
    offsets/<group, url-quoted>/<topic id hex>/<partition:06d>
                                              [offset, leader epoch, metadata, commit timestamp]

A partition's head is the unit of optimistic concurrency: it holds the next offset and the
idempotent-producer state of that partition, so one compare on its mod revision guards both. A
missing head means offset 0 (topics with 10,000 partitions are created with one put).

Committing a WAL object: the sequencer (metadata/sequencer.py) runs on the cached heads; one
transaction compares every touched head's mod revision and puts the new heads and one wal-index
record holding the new index entries of all its partitions (one key per transaction, not one per
entry: half the puts and watch events). On conflict the transaction's failure branch returns the current heads
in the same round trip, the cache is refreshed, and the commit is re-sequenced. etcd allows 128
operations per transaction branch and 1.5 MiB per request by default, so an object's partitions
are committed in groups that fit both (each group is atomic; the brief asks for atomicity per
partition): an object touching 500 partitions commits as 5 transactions of at most
`PARTITIONS_PER_TXN` (118), run concurrently because they touch disjoint keys.

Staying bounded over months: index entries are replaced by compaction (many WAL entries become one
PARQUET entry; a wal-index record goes once every entry in it is replaced, with its WAL object)
and removed by retention; a deleted topic's entries stay in the wal-index records they share with
other topics until then (its heads and per-entry keys are deleted); producer state expires with
`producer_expiry_ms` of inactivity (Kafka's producer.id.expiration.ms); and each broker compacts
etcd's revision history every `compact_interval_s`, keeping the last `keep_revisions` revisions
for watchers that lag.

Brokers follow changes through one watch on the root prefix (no polling): the in-memory view
(`view.py`) stays current and long-poll fetches wake when another broker commits. If the watch
breaks (etcd restarted), the store reloads everything and watches again from the new revision.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote

import orjson  # the values every broker decodes per partition-append it follows: 7x faster than json here

from .model import AppendResult, BrokerRegistration, CommittedOffset, IndexEntry, ObjectCommit, ObjectType, TopicInfo
from .sequencer import BatchSequence, ProducerState, involved, sequence
from .store import InvalidPartitions, MetadataStore, MetadataUnavailable, ObjectFenced, TopicAlreadyExists, UnknownTopic, resolved_within
from .view import IndexReads, PartitionView

log = logging.getLogger("neve.metadata.etcd")

MAX_OPS = 120  # etcd's default --max-txn-ops is 128 per branch; keep headroom
PARTITIONS_PER_TXN = MAX_OPS - 2  # a commit transaction's branches: an operation per partition, two more
MAX_TXN_BYTES = 1024 * 1024  # etcd's default --max-request-bytes is 1.5 MiB
MAX_EPOCH = 32767
# Loading the view: only the key families it holds, in pages (etcd has no byte limit on a range
# read, gRPC has one on a message). The first page of each family is small; later pages hold up to
# PAGE_BYTES of the largest value seen so far in it; gRPC's limit is set well above that.
LOADED_KINDS = ("topics/", "brokers/", "heads/", "index/", "wal-index/")
FIRST_PAGE_KEYS = 16
MAX_PAGE_KEYS = 4096
PAGE_BYTES = 4 * 1024 * 1024
GRPC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
LOAD_ATTEMPTS = 5
PRODUCER_ID_BLOCK = 1000


class _PartitionState(PartitionView):
    """PartitionView plus what the sequencer and the compare need, and its head's key (made once:
    a commit names the head of every partition it touches three times)."""

    __slots__ = ("producers", "mod_revision", "producer_used", "head_key")

    def __init__(self, head_key: bytes) -> None:
        super().__init__()
        self.producers: dict[int, ProducerState] = {}
        self.producer_used: dict[int, int] = {}
        self.mod_revision = 0
        self.head_key = head_key


@dataclass
class _Keys:
    root: str

    def topic(self, name: str) -> bytes:
        return f"/{self.root}/topics/{name}".encode()

    @staticmethod
    def partition_path(topic_id: uuid.UUID, partition: int) -> str:
        """`<topic id hex>/<partition:06d>`: how head, index and offset keys name a partition
        (`head` and `index`, made per partition-append, write it out rather than call this)."""
        return f"{topic_id.hex}/{partition:06d}"

    def head(self, topic_id: uuid.UUID, partition: int) -> bytes:
        return f"/{self.root}/heads/{topic_id.hex}/{partition:06d}".encode()

    def index(self, topic_id: uuid.UUID, partition: int, base_offset: int) -> bytes:
        """A per-entry index key, as versions before wal-index records wrote them (still read and
        deleted with their topic; nothing writes them now but tests of that reading)."""
        return f"/{self.root}/index/{topic_id.hex}/{partition:06d}/{base_offset:020d}".encode()

    def wal_index(self, object_key: str, group: int) -> bytes:
        """The wal-index record of one commit transaction (`group`) of the WAL object `object_key`."""
        return f"/{self.root}/wal-index/{object_key}/{group:04d}".encode()

    def group(self, group: str) -> bytes:
        return f"/{self.root}/groups/{quote(group, safe='')}".encode()

    def offsets(self, group: str) -> bytes:
        return f"/{self.root}/offsets/{quote(group, safe='')}/".encode()

    def offset(self, group: str, topic_id: uuid.UUID, partition: int) -> bytes:
        return self.offsets(group) + self.partition_path(topic_id, partition).encode()

    def broker(self, node_id: int) -> bytes:
        return f"/{self.root}/brokers/{node_id}".encode()

    def swept(self, object_key: str) -> bytes:
        """The orphan sweeper's fence on one object: while it exists, no commit naming it lands."""
        return f"/{self.root}/swept/{object_key}".encode()

    def producer_epoch(self, producer_id: int) -> bytes:
        return f"/{self.root}/producer-epochs/{producer_id}".encode()

    @property
    def producer_ids(self) -> bytes:
        return f"/{self.root}/producer-ids".encode()

    def prefix(self, kind: str = "") -> bytes:
        return f"/{self.root}/{kind}".encode()


def encode_wal_index(object_key: str, entries: Mapping[tuple[uuid.UUID, int], list[IndexEntry]]) -> bytes:
    """A wal-index record, the entries of one commit transaction, all in the WAL object
    `object_key`: `[object key, [[topic id hex, [[partition:06d, base offset, last offset, start,
    size, max timestamp], ...]], ...]]`. The partition is a string, so that a topic's id and it
    join into the partition's path (`_Keys.partition_path`) without formatting a number."""
    by_topic: dict[uuid.UUID, list[str]] = {}
    for (topic_id, partition), partition_entries in entries.items():
        rows = by_topic.get(topic_id)
        if rows is None:
            rows = by_topic[topic_id] = []
        for e in partition_entries:
            rows.append(f'["{partition:06d}",{e.base_offset:d},{e.last_offset:d},{e.start:d},{e.size:d},{e.max_timestamp:d}]')
    topics = ",".join(f'["{topic_id.hex}",[{",".join(rows)}]]' for topic_id, rows in by_topic.items())
    return f"[{json.dumps(object_key)},[{topics}]]".encode()


def decode_wal_index(raw: bytes) -> tuple[str, list[tuple[str, IndexEntry]]]:
    """The object key and the (partition path, entry) pairs of a wal-index record."""
    key, topics = orjson.loads(raw)
    wal = ObjectType.WAL
    return key, [
        (topic + "/" + partition, IndexEntry(base, last, key, wal, start, size, max_ts))
        for topic, rows in topics
        for partition, base, last, start, size, max_ts in rows
    ]


_OBJECT_TYPES = tuple(ObjectType)  # by value (0, 1, ...): indexing is 15x cheaper than ObjectType(kind)


def _decode_entry(base: int, raw: bytes) -> IndexEntry:
    last, key, kind, start, size, max_ts = orjson.loads(raw)
    return IndexEntry(base, last, key, _OBJECT_TYPES[kind], start, size, max_ts)


@dataclass
class EtcdSettings:
    timeout: float = 5.0
    lease_ttl: int = 5
    producer_expiry_ms: int = 24 * 3600 * 1000
    compact_interval_s: float = 300.0
    keep_revisions: int = 10_000
    commit_attempts: int = 64


class EtcdMetadataStore(IndexReads, MetadataStore):
    def __init__(self, host: str, port: int, root: str = "neve", settings: EtcdSettings | None = None) -> None:
        super().__init__()
        self.host, self.port = host, port
        self.keys = _Keys(root)
        self._heads_prefix, self._index_prefix = self.keys.prefix("heads/"), self.keys.prefix("index/")
        self._wal_index_prefix = self.keys.prefix("wal-index/")
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
        # The etcd revision of each broker registration in the view: a watch event older than it
        # is dropped. A broker that registers again after losing its lease puts its registration
        # in the view at once, while the old key's deletion (the lease's expiry, an earlier
        # revision) may still be on its way through the watch: it must not remove the new one.
        self._broker_revisions: dict[int, int] = {}
        self._pid_next = 0
        self._pid_end = 0
        self._pid_lock = asyncio.Lock()
        self._commit_lock = asyncio.Lock()
        self._epoch_lease_obj = None
        self._epoch_lease_at = 0.0
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
        import aetcd
        from aetcd import rpc

        self._delete_type = rpc.Event.DELETE
        options = {"grpc.max_receive_message_length": GRPC_MAX_MESSAGE_BYTES, "grpc.max_send_message_length": GRPC_MAX_MESSAGE_BYTES}
        self._client = aetcd.Client(host=self.host, port=self.port, timeout=self.settings.timeout, options=options)
        try:
            # each page's read is bounded by the timeout, not the whole load: years of metadata take longer
            revision = await self._load()
        except Exception as e:
            await self._client.close()
            raise MetadataUnavailable(f"etcd at {self.host}:{self.port} is unreachable: {e!r}") from e
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

    async def _load(self) -> int:
        """Read what the view holds into it; returns the revision it reflects. The read is paged
        (`_read_pages`) at one revision, so its size is bounded by nothing but etcd's own; if that
        revision is compacted away while the pages are read (a busy cluster, a slow read), the
        read starts again at the newest revision."""
        for attempt in range(LOAD_ATTEMPTS):
            try:
                return await self._load_at_one_revision()
            except _RevisionCompacted as e:
                log.warning("etcd_load_revision_compacted", extra={"attempt": attempt + 1, "error": str(e)})
        raise MetadataUnavailable(f"etcd's history was compacted under {LOAD_ATTEMPTS} loads in a row")

    async def _read_pages(self, kinds: tuple[str, ...]):
        """Every key of the given kinds (key families under the root), as etcd KeyValues, read at
        one revision in pages: the first page's revision, then that one. A page holds at most
        PAGE_BYTES of values as far as the values seen so far tell, and a page over gRPC's
        message limit is asked again in smaller pieces. Yields (kind, key-values); the revision
        read is `self._loading_revision` once the first page is in."""
        import grpc
        from aetcd import rpc

        await self._client.connect()
        revision = 0
        for kind in kinds:
            prefix = self.keys.prefix(kind)
            start, end, limit = prefix, _prefix_end(prefix), FIRST_PAGE_KEYS
            while True:
                request = rpc.RangeRequest(key=start, range_end=end, limit=limit, revision=revision)
                self.ops += 1
                try:
                    page = await self._client.kvstub.Range(request, timeout=self.settings.timeout, metadata=self._client.metadata)
                except grpc.aio.AioRpcError as e:
                    if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and limit > 1:
                        limit = max(1, limit // 8)
                        continue
                    if e.code() == grpc.StatusCode.OUT_OF_RANGE and "compacted" in (e.details() or ""):
                        raise _RevisionCompacted(e.details()) from e
                    raise MetadataUnavailable(f"etcd range read failed: {e.code().name} {e.details()}") from e
                if not revision:
                    revision = self._loading_revision = page.header.revision
                if page.kvs:
                    yield kind, page.kvs
                if not page.more or not page.kvs:
                    break
                start = page.kvs[-1].key + b"\0"
                largest = max(len(kv.value) for kv in page.kvs)
                limit = max(1, min(MAX_PAGE_KEYS, PAGE_BYTES // max(largest, 1)))

    async def _load_at_one_revision(self) -> int:
        self._loading_revision = 0
        topics: dict[str, TopicInfo] = {}
        created: dict[uuid.UUID, int] = {}
        brokers: dict[int, BrokerRegistration] = {}
        broker_revisions: dict[int, int] = {}
        heads, entries, wal_indexes = [], [], []
        revision = 0
        async for _kind, kvs in self._read_pages(LOADED_KINDS):
            for kv in kvs:
                revision = max(revision, kv.mod_revision)
                self._load_one(kv, topics, created, heads, entries, wal_indexes, brokers, broker_revisions)
        revision = max(revision, self._loading_revision)
        self._adopt_loaded(revision, topics, created, heads, entries, wal_indexes, brokers, broker_revisions)
        return revision

    def _load_one(self, kv, topics, created, heads, entries, wal_indexes, brokers, broker_revisions) -> None:
        """Sort one key-value of a load into the collections `_adopt_loaded` builds the view from."""
        kind, rest = self._split(kv.key)
        if kind == "topics":
            info = self._decode_topic(rest, kv.value)
            topics[info.name] = info
            created[info.topic_id] = kv.create_revision
        elif kind == "heads":
            heads.append((rest, kv))
        elif kind == "wal-index":
            wal_indexes.append(kv.value)
        elif kind == "index":
            entries.append((rest, kv))
        elif kind == "brokers":
            b = json.loads(kv.value)
            brokers[int(rest)] = BrokerRegistration(int(rest), b["host"], b["port"], b.get("zone"))
            broker_revisions[int(rest)] = kv.mod_revision

    def _adopt_loaded(self, revision, topics, created, heads, entries, wal_indexes, brokers, broker_revisions) -> None:
        """Replace the view by what a load read at `revision`."""
        own = self._registration
        if own is not None and self._broker_revisions.get(own.node_id, 0) > revision:
            # registered again after this range read: the watch from it brings the put, keep it meanwhile
            brokers[own.node_id], broker_revisions[own.node_id] = own, self._broker_revisions[own.node_id]
        self._topics = topics
        self._topics_by_id = {t.topic_id: t for t in topics.values()}
        self._topic_created = created
        self._partitions = {}
        self._topic_views = {}
        self._by_path = {}
        # Our commits recorded so far were applied to the view just replaced; one that landed after
        # this range read is missing from the new view, so its watch events must not be skipped.
        self._own_revisions = set()
        for info in topics.values():
            self._add_partitions(info)
        for rest, kv in heads:
            self._apply_head(rest, kv.value, kv.mod_revision)
        for raw in wal_indexes:
            self._apply_wal_index(raw)
        for rest, kv in entries:
            self._apply_entry(rest, kv.value)
        self._brokers, self._broker_revisions = brokers, broker_revisions
        self._loaded.set()
        log.info("etcd_view_loaded", extra={"revision": revision, "topics": len(topics), "brokers": sorted(brokers), "wal_index_records": len(wal_indexes)})

    @staticmethod
    def _split(key: bytes) -> tuple[str, str]:
        parts = key.decode().split("/", 3)  # "", root, kind, rest
        return (parts[2], parts[3]) if len(parts) == 4 else (parts[-1], "")

    @staticmethod
    def _decode_topic(name: str, raw: bytes) -> TopicInfo:
        d = json.loads(raw)
        return TopicInfo(name, uuid.UUID(hex=d["id"]), d["partitions"], d.get("configs", {}))

    # -- following changes --------------------------------------------------------------------

    async def _follow(self, revision: int) -> None:
        delay = 0.1
        while not self._closed:
            try:
                async for response in self._watch(revision + 1):
                    if response.created:
                        delay = 0.1
                        self._watching = True
                        continue
                    events = response.events
                    if not events:
                        continue
                    followed = revision
                    if self._commits_in_flight and any(e.kv.mod_revision not in self._own_revisions for e in events):
                        # A commit's watch events can arrive before its transaction's answer, which
                        # records its revision: wait for the commits in flight, so that their events
                        # are recognised rather than decoded and applied a second time (44% of a
                        # committing store's own events were). Another writer's events wait at most
                        # for this store's transactions already sent, each bounded by gRPC's deadline.
                        await asyncio.wait(tuple(self._commits_in_flight))
                    last = events[-1].kv.mod_revision
                    if last in self._own_revisions and events[0].kv.mod_revision == last:
                        # all of one of this store's commits (or a fragment of it), applied already
                        revision = max(revision, last)
                    else:
                        moved = []
                        for event in events:
                            kv = event.kv
                            if kv.mod_revision > revision:
                                revision = kv.mod_revision
                            if kv.mod_revision not in self._own_revisions:
                                tp = self._apply_event(event)
                                if tp is not None:
                                    moved.append(tp)
                        self.notifier.notify(moved)
                    if revision > followed and len(self._own_revisions) > 256:  # events come in revision order
                        self._own_revisions = {r for r in self._own_revisions if r >= revision}
                    if revision > self._revision:
                        self._view_at(revision)
                if self._closed:
                    return
                raise MetadataUnavailable("etcd ended the watch stream")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._watching = False
                log.warning("etcd_watch_broken", extra={"error": repr(e), "retry_in_s": delay})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                try:
                    revision = await self._reload()
                    self._view_at(revision)
                except Exception as reload_error:
                    log.warning("etcd_reload_failed", extra={"error": repr(reload_error)})

    async def _watch(self, start_revision: int):
        """etcd's watch of everything under the root from `start_revision`, one WatchResponse at a
        time, on the client's own channel. The stream is read directly rather than through
        aetcd's watch iterator, which hands over each event through a queue and two coroutines:
        with a head and an index entry per partition an object holds (before wal-index records),
        that was a quarter of a committing broker's metadata CPU, spent mostly on skipping the
        events of its own commits."""
        from aetcd import rpc

        await self._client.connect()
        prefix = self.keys.prefix()
        # fragment: a revision's events may exceed a gRPC message (a topic's deletion deletes all its
        # index keys at once); etcd then sends them in several responses rather than failing the watch
        create = rpc.WatchRequest(create_request=rpc.WatchCreateRequest(key=prefix, range_end=_prefix_end(prefix), start_revision=start_revision, fragment=True))

        async def requests():
            yield create
            await asyncio.Event().wait()  # keep the request side open until the call ends

        call = rpc.WatchStub(self._client.channel).Watch(requests(), metadata=self._client.metadata)
        try:
            async for response in call:
                if response.compact_revision:
                    raise MetadataUnavailable(f"watch from revision {start_revision} is compacted (now {response.compact_revision})")
                if response.canceled:
                    raise MetadataUnavailable(f"etcd cancelled the watch: {response.cancel_reason or 'no reason given'}")
                yield response
        finally:
            call.cancel()

    def _view_at(self, revision: int) -> None:
        """The view now reflects every change up to `revision`: wake whoever waits for it."""
        self._revision = revision
        if self._revision_waiters:
            waiting = []
            for target, fut in self._revision_waiters:
                if target <= revision:
                    if not fut.done():
                        fut.set_result(None)
                else:
                    waiting.append((target, fut))
            self._revision_waiters = waiting

    async def _view_reaches(self, revision: int, timeout: float) -> bool:
        """Whether the view reflects `revision` within `timeout` seconds."""
        if self._revision >= revision:
            return True
        fut = asyncio.get_running_loop().create_future()
        self._revision_waiters.append((revision, fut))
        try:
            return await resolved_within(fut, timeout)
        finally:
            self._revision_waiters = [(t, f) for t, f in self._revision_waiters if f is not fut]

    async def _view_settles(self, revision: int) -> None:
        """After a topic change etcd has accepted: wait until the watch has applied it. The
        call then applies the change to the view itself, which is a no-op unless the watch lagged
        past the timeout. Applying it before the watch got there would let an older event still
        on its way undo it (a topic's creation arriving after its deletion); after the timeout
        it is applied regardless, and the next reload puts the view right."""
        if not await self._view_reaches(revision, self.settings.timeout):
            log.warning("etcd_topic_view_behind", extra={"revision": revision, "view_revision": self._revision})

    async def _reload(self) -> int:
        """After a broken watch: rebuild the view from scratch, then wake every waiter (whatever
        changed meanwhile is now visible)."""
        revision = await self._load()
        self.notifier.notify(list(self._partitions))
        if self._registration is not None:
            await self._register(self._registration)
        return revision

    def _apply_event(self, event) -> tuple[uuid.UUID, int] | None:
        """Apply one watch event to the view; returns the partition whose head moved, if one did
        (the caller wakes its waiters once the whole response is applied)."""
        kv = event.kv
        key = kv.key
        deleted = event.type == self._delete_type
        if key.startswith(self._heads_prefix):  # the common events first: no general key parsing
            return None if deleted else self._apply_head(key[len(self._heads_prefix) :].decode(), kv.value, kv.mod_revision)
        if key.startswith(self._wal_index_prefix):
            # A record is deleted only once every entry in it has been replaced (compaction).
            if not deleted:
                self._apply_wal_index(kv.value)
            return None
        if key.startswith(self._index_prefix):
            rest = key[len(self._index_prefix) :].decode()
            if deleted:
                part, base = self._index_key(rest)
                if part is not None:
                    part.remove(base)
            else:
                self._apply_entry(rest, kv.value)
            return None
        kind, rest = self._split(key)
        if kind == "topics":
            if deleted:
                info = self._topics.pop(rest, None)
                if info is not None:
                    self._forget_topic(info)
            else:
                self._adopt_topic(self._decode_topic(rest, event.kv.value), kv.create_revision)
        elif kind == "brokers":  # membership changes are rare and worth a line each
            node_id = int(rest)
            if kv.mod_revision < self._broker_revisions.get(node_id, 0):
                return None  # older than the registration in the view (see _broker_revisions)
            if deleted:
                self._broker_revisions.pop(node_id, None)
                if self._brokers.pop(node_id, None) is not None:
                    log.info("broker_left", extra={"node_id": node_id, "revision": kv.mod_revision})
            else:
                b = json.loads(event.kv.value)
                joined = node_id not in self._brokers
                self._brokers[node_id] = BrokerRegistration(node_id, b["host"], b["port"], b.get("zone"))
                self._broker_revisions[node_id] = kv.mod_revision
                if joined:
                    log.info("broker_joined", extra={"node_id": node_id, "revision": kv.mod_revision, "zone": b.get("zone")})
        return None

    def _adopt_topic(self, info: TopicInfo, created: int) -> None:
        """A topic created or changed (more partitions, new configs); `created`: its key's create
        revision, which every commit to it compares (the topic still exists)."""
        known = self._topics.get(info.name)
        if known is not None and known.topic_id != info.topic_id:
            self._forget_topic(known)
        self._topics[info.name] = info
        self._topics_by_id[info.topic_id] = info
        self._topic_created[info.topic_id] = created
        self._add_partitions(info)

    def _add_partitions(self, info: TopicInfo) -> None:
        """A state for each partition of the topic that has none yet (all of a new topic's, the
        added ones of a grown topic)."""
        for p in range(info.partitions):
            tp = (info.topic_id, p)
            if tp not in self._partitions:
                part = self._partitions[tp] = _PartitionState(self.keys.head(info.topic_id, p))
                self._by_path[_Keys.partition_path(info.topic_id, p)] = (tp, part)
                self._view_added(info.topic_id, p, part)

    def _topic_gone(self, topic_id: uuid.UUID) -> None:
        """A commit found the topic's key deleted (or made anew): drop it from the view now rather
        than retry against it until the watch brings the deletion."""
        info = self._topics_by_id.get(topic_id)
        if info is not None and self._topics.get(info.name) is info:
            del self._topics[info.name]
            self._forget_topic(info)
            log.info("etcd_topic_gone_at_commit", extra={"topic": info.name, "topic_id": topic_id.hex})

    def _forget_topic(self, info: TopicInfo) -> None:
        self._topics_by_id.pop(info.topic_id, None)
        self._topic_created.pop(info.topic_id, None)
        for p in range(info.partitions):
            self._partitions.pop((info.topic_id, p), None)
            self._by_path.pop(_Keys.partition_path(info.topic_id, p), None)
        self._views_dropped(info.topic_id)

    def _apply_head(self, path: str, raw: bytes, mod_revision: int) -> tuple[uuid.UUID, int] | None:
        """Take a head's value if it is newer than the view's; returns its partition if it was."""
        found = self._by_path.get(path)
        if found is None:
            return None
        tp, part = found
        if mod_revision <= part.mod_revision:
            return None
        d = orjson.loads(raw)
        part.next_offset, part.log_start_offset, part.mod_revision = d["n"], d["s"], mod_revision
        producers = d.get("p")
        if producers:
            part.producers = {int(pid): ProducerState(v[0], tuple(BatchSequence(*b) for b in v[1])) for pid, v in producers.items()}
            part.producer_used = {int(pid): v[2] for pid, v in producers.items()}
        else:  # the common case: no idempotent producer writes the partition
            part.producers, part.producer_used = {}, {}
        return tp

    def _index_key(self, rest: str) -> tuple[_PartitionState | None, int]:
        """The partition (None if unknown) and base offset an index key names."""
        path, _, base = rest.rpartition("/")
        found = self._by_path.get(path)
        return (found[1] if found is not None else None), int(base)

    def _apply_wal_index(self, raw: bytes) -> None:
        _, entries = decode_wal_index(raw)
        by_path = self._by_path
        for path, entry in entries:
            found = by_path.get(path)
            if found is not None:
                found[1].add(entry)

    def _apply_entry(self, rest: str, raw: bytes) -> None:
        part, base = self._index_key(rest)
        if part is not None:
            part.add(_decode_entry(base, raw))

    def is_current(self) -> bool:
        return self._watching and not self._closed

    # -- topics ---------------------------------------------------------------------------------

    def topics(self) -> Mapping[str, TopicInfo]:
        return self._topics

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self._topics_by_id.get(topic_id)

    async def _commit_txn(self, request) -> object:
        """One commit transaction, built as etcd's own protobuf message (`rpc.TxnRequest`) and sent
        on aetcd's KV stub. aetcd's `transaction` wraps every compare and operation in an object of
        its own and converts each response: at 10,000 partitions an object's commit is dozens of
        transactions of 120 operations, and that wrapping was a quarter of the commit's CPU. gRPC's
        deadline bounds it (no wrapping task)."""
        import grpc

        self.ops += 1
        try:
            await self._client.connect()
            return await self._client.kvstub.Txn(request, timeout=self.settings.timeout, metadata=self._client.metadata)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise MetadataUnavailable("etcd transaction timed out") from e
            raise MetadataUnavailable(f"etcd transaction failed: {e.code().name} {e.details()}") from e
        except Exception as e:
            raise MetadataUnavailable(f"etcd transaction failed: {e!r}") from e

    async def _txn(self, compare, success, failure=()):
        self.ops += 1
        try:
            return await asyncio.wait_for(self._client.transaction(compare=list(compare), success=list(success), failure=list(failure)), self.settings.timeout)
        except (TimeoutError, asyncio.TimeoutError) as e:
            raise MetadataUnavailable("etcd transaction timed out") from e
        except MetadataUnavailable:
            raise
        except Exception as e:
            raise MetadataUnavailable(f"etcd transaction failed: {e!r}") from e

    async def create_topic(self, name: str, partitions: int, configs: Mapping[str, str] | None = None) -> TopicInfo:
        if partitions <= 0:
            raise InvalidPartitions(f"{partitions} partitions")
        info = TopicInfo(name, uuid.uuid4(), partitions, dict(configs or {}))
        tx = self._client.transactions
        key = self.keys.topic(name)
        value = json.dumps({"id": info.topic_id.hex, "partitions": partitions, "configs": info.configs}).encode()
        ok, responses = await self._txn([tx.create(key) == 0], [tx.put(key, value)])
        if not ok:
            raise TopicAlreadyExists(name)
        revision = responses[0].response_put.header.revision
        await self._view_settles(revision)
        if name not in self._topics:
            self._adopt_topic(info, revision)
        return self._topics[name]

    async def update_topic(self, name: str, partitions: int | None = None, configs: Mapping[str, str | None] | None = None) -> TopicInfo:
        tx = self._client.transactions
        key = self.keys.topic(name)
        for _ in range(self.settings.commit_attempts):
            got = await self._client.get(key)
            self.ops += 1
            if got is None:
                raise UnknownTopic(name)
            info = self._decode_topic(name, got.value)
            count = info.partitions if partitions is None else partitions
            if count < info.partitions:
                raise InvalidPartitions(f"topic {name} has {info.partitions} partitions; it cannot shrink to {count}")
            merged = {k: v for k, v in {**info.configs, **(configs or {})}.items() if v is not None}
            updated = TopicInfo(name, info.topic_id, count, merged)
            value = json.dumps({"id": info.topic_id.hex, "partitions": count, "configs": merged}).encode()
            ok, responses = await self._txn([tx.mod(key) == got.mod_revision], [tx.put(key, value)])
            if ok:
                await self._view_settles(responses[0].response_put.header.revision)
                self._adopt_topic(updated, got.create_revision)
                return updated
        raise MetadataUnavailable(f"update of topic {name} kept conflicting")

    async def advance_log_start(self, topic_id: uuid.UUID, partition: int, offset: int) -> int:
        tp = (topic_id, partition)
        tx = self._client.transactions
        for _ in range(self.settings.commit_attempts):
            part = self._partitions.get(tp)
            if part is None:
                raise UnknownTopic(f"{topic_id}/{partition}")
            key = part.head_key
            target = min(max(offset, part.log_start_offset), part.next_offset)
            if target == part.log_start_offset:
                return target
            value, _kept, _used = self._encode_head(part, part.next_offset, {}, int(time.time() * 1000), log_start=target)
            ok, responses = await self._txn([tx.mod(key) == part.mod_revision], [tx.put(key, value)], [tx.get(key)])
            if ok:
                revision = responses[0].response_put.header.revision
                if revision > part.mod_revision:
                    part.log_start_offset, part.mod_revision = target, revision
                return target
            if responses and responses[0]:
                fresh, meta = responses[0][0]
                self._apply_head(_Keys.partition_path(topic_id, partition), fresh, meta.mod_revision)
        raise MetadataUnavailable(f"log start of {topic_id}/{partition} kept conflicting")

    async def delete_topic(self, name: str) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise UnknownTopic(name)
        tx = self._client.transactions
        heads = self.keys.prefix(f"heads/{info.topic_id.hex}/")
        index = self.keys.prefix(f"index/{info.topic_id.hex}/")
        ok, responses = await self._txn(
            [tx.create(self.keys.topic(name)) > 0],
            [tx.delete(self.keys.topic(name)), tx.delete(heads, _prefix_end(heads)), tx.delete(index, _prefix_end(index))],
        )
        if not ok:
            raise UnknownTopic(name)
        await self._view_settles(responses[0].response_delete_range.header.revision)
        if self._topics.get(name) is info:
            del self._topics[name]
            self._forget_topic(info)
        return info

    # -- the sequencer ------------------------------------------------------------------------

    async def fence_objects(self, object_keys: Collection[str]) -> set[str]:
        keys = list(dict.fromkeys(object_keys))
        if not keys:
            return set()
        tx = self._client.transactions
        fenced_at = 0
        for i in range(0, len(keys), MAX_OPS):
            _ok, responses = await self._txn([], [tx.put(self.keys.swept(key), b"") for key in keys[i : i + MAX_OPS]])
            fenced_at = max(fenced_at, responses[0].response_put.header.revision)
        # A commit of one of these objects either landed before its fence, and is in the view
        # once the view reaches the fence's revision, or finds the fence and lands nothing.
        if not await self._view_reaches(fenced_at, self.settings.timeout * 2):
            log.warning("etcd_fence_view_behind", extra={"revision": fenced_at, "view_revision": self._revision})
            return set()
        referenced = self.referenced_objects()
        return {key for key in keys if key not in referenced}

    async def commit(self, commit: ObjectCommit) -> list[AppendResult]:
        # One broker's commits go one at a time (its WAL writer orders them anyway); contention is
        # only between brokers, where the optimistic transaction settles it.
        async with self._commit_lock:
            return await self._commit(commit)

    async def _commit(self, commit: ObjectCommit) -> list[AppendResult]:
        groups = self._groups(commit)
        results: list[AppendResult | None] = [None] * len(commit.appends)
        # The partitions the groups' transactions grew, announced once they all returned: a
        # long-poll Fetch of many partitions answers once per object, not once per group.
        touched: list[tuple[uuid.UUID, int]] = []
        try:
            outcomes = await asyncio.gather(*(self._commit_group(commit, idx, n, touched) for n, idx in enumerate(groups)), return_exceptions=True)
        finally:
            self.notifier.notify(touched)
        failure = None
        for idx, outcome in zip(groups, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                failure = outcome
                continue
            for i, r in zip(idx, outcome, strict=True):
                results[i] = r
        if failure is not None:
            if all(r is None for r in results):
                error = failure if isinstance(failure, MetadataUnavailable) else MetadataUnavailable(repr(failure))
                # Raised from this frame, the error references it through its traceback; if the
                # frame still referenced the error (`failure`, `outcome`, `outcomes`, `error`), the
                # cycle would keep the callers' frames, and with them the WAL object's bytes, until
                # a full collection.
                failure = outcome = outcomes = None
                try:
                    raise error
                finally:
                    del error
            # Some groups committed, others did not: answer the failed appends with a retriable error.
            results = [r if r is not None else AppendResult(MetadataUnavailable.error_code) for r in results]
        return results  # type: ignore[return-value]

    def _groups(self, commit: ObjectCommit) -> list[list[int]]:
        """Indices of the appends, grouped so each group's transaction fits etcd's limits; a
        partition's appends always stay in one group. A group's transaction compares the head of
        each partition, each topic's key (it still exists), the fence and its wal-index record
        (absent), and puts the heads and the record: one operation per partition and per topic, and
        two per group, in each branch."""
        by_tp: dict[tuple[uuid.UUID, int], list[int]] = {}
        for i, a in enumerate(commit.appends):
            by_tp.setdefault((a.topic_id, a.partition), []).append(i)
        groups: list[list[int]] = []
        current: list[int] = []
        topics: set[uuid.UUID] = set()
        ops = size = 0
        for tp, idx in by_tp.items():
            part = self._partitions.get(tp)
            need_bytes = 300 + 100 * len(idx) + (120 * len(part.producers) if part is not None else 0)
            need_ops = 1 if tp[0] in topics else 2
            if current and (ops + need_ops > PARTITIONS_PER_TXN or size + need_bytes > MAX_TXN_BYTES):
                groups.append(current)
                current, ops, size = [], 0, 0
                topics = set()
                need_ops = 2
            current.extend(idx)
            topics.add(tp[0])
            ops += need_ops
            size += need_bytes
        if current:
            groups.append(current)
        return groups

    async def _commit_group(self, commit: ObjectCommit, idx: list[int], group: int, touched: list[tuple[uuid.UUID, int]]) -> list[AppendResult]:
        """One transaction's appends; the partitions it grew are added to `touched`."""
        from aetcd import rpc

        EQUAL, MOD, CREATE = rpc.Compare.EQUAL, rpc.Compare.MOD, rpc.Compare.CREATE
        sub = ObjectCommit(commit.object_key, commit.object_size, tuple(commit.appends[i] for i in idx))
        partitions, producer_keys = involved(sub)
        fence_key = self.keys.swept(commit.object_key)
        record_key = self.keys.wal_index(commit.object_key, group)
        for attempt in range(self.settings.commit_attempts):
            heads = {tp: self._partitions[tp] for tp in partitions if tp in self._partitions}
            producers = {}
            for pid, tid, p in producer_keys:
                part = heads.get((tid, p))
                if part is not None and pid in part.producers:
                    producers[(pid, tid, p)] = part.producers[pid]
            seq = sequence(sub, heads, producers)
            if not heads:
                return seq.results
            request = rpc.TxnRequest()
            # Compare every touched head, changed or not: answers computed from a stale cache
            # (a duplicate, a sequence error) must be confirmed too.
            compare = request.compare.add
            for tp, part in heads.items():
                compare(result=EQUAL, target=MOD, key=part.head_key, mod_revision=part.mod_revision)
            # Each topic still exists, as the view knows it: a head compared at revision 0 (never
            # written) also matches once the topic is deleted, and would be put again for a dead topic.
            topic_keys = [(tid, self.keys.topic(self._topics_by_id[tid].name), self._topic_created[tid]) for tid in {tid for tid, _ in heads}]
            for _tid, key, created in topic_keys:
                compare(result=EQUAL, target=CREATE, key=key, create_revision=created)
            compare(result=EQUAL, target=CREATE, key=fence_key, create_revision=0)  # the sweeper has not fenced the object off
            compare(result=EQUAL, target=CREATE, key=record_key, create_revision=0)  # never overwrite another commit's entries
            changed_by_tp: dict[tuple[uuid.UUID, int], dict[int, ProducerState]] = {}
            for (pid, tid, p), state in seq.producers.items():
                changed_by_tp.setdefault((tid, p), {})[pid] = state
            now_ms = int(time.time() * 1000)
            new_heads = {}
            success = request.success.add
            for tp, part in heads.items():
                changed_producers = changed_by_tp.get(tp, {})
                next_offset = seq.heads.get(tp)
                if next_offset is None:
                    if not changed_producers:
                        continue
                    next_offset = part.next_offset
                value, kept, used = self._encode_head(part, next_offset, changed_producers, now_ms)
                new_heads[tp] = (next_offset, kept, used)
                put = success().request_put
                put.key, put.value = part.head_key, value
            if seq.entries:
                put = success().request_put
                put.key, put.value = record_key, encode_wal_index(sub.object_key, seq.entries)
            failure = request.failure.add
            for part in heads.values():
                failure().request_range.key = part.head_key
            failure().request_range.key = fence_key
            failure().request_range.key = record_key
            for _tid, key, _created in topic_keys:
                failure().request_range.key = key
            in_flight = asyncio.get_running_loop().create_future()  # the watch waits for it (`_follow`)
            self._commits_in_flight.add(in_flight)
            try:
                response = await self._commit_txn(request)
                # A transaction that put nothing (every append a duplicate or refused) made no
                # revision: its header's is the latest one, another writer's, whose events the
                # watch must still apply.
                revision = response.header.revision if response.succeeded and request.success else 0
                if revision:
                    self._own_revisions.add(revision)  # the transaction put only heads and a wal-index record
            finally:
                self._commits_in_flight.discard(in_flight)
                in_flight.set_result(None)
            if response.succeeded:
                touched += self._apply_commit(seq, new_heads, revision)
                return seq.results
            responses = response.responses
            head_responses, (fence, record), topic_responses = responses[: len(heads)], responses[len(heads) : len(heads) + 2], responses[len(heads) + 2 :]
            for (tid, _key, created), got in zip(topic_keys, topic_responses, strict=True):
                if not any(kv.create_revision == created for kv in got.response_range.kvs):
                    self._topic_gone(tid)  # its appends are answered UNKNOWN_TOPIC_OR_PARTITION next attempt
            if fence.response_range.kvs:
                raise ObjectFenced(f"{commit.object_key} was fenced off by the orphan sweeper")
            if record.response_range.kvs:  # one object is committed once: this is a bug, not a race
                raise MetadataUnavailable(f"{commit.object_key} already has index entries of commit transaction {group}")
            # Conflict: refresh the heads from the failure branch's reads and sequence again.
            for tp, got in zip(heads, head_responses, strict=True):
                for kv in got.response_range.kvs:
                    self._apply_head(_Keys.partition_path(*tp), kv.value, kv.mod_revision)
            if attempt >= 2:
                await asyncio.sleep(random.uniform(0, min(0.002 * 2**attempt, 0.1)))
        raise MetadataUnavailable(f"commit of {commit.object_key} kept conflicting")

    def _encode_head(
        self, part: _PartitionState, next_offset: int, changed: dict[int, ProducerState], now_ms: int, log_start: int | None = None
    ) -> tuple[bytes, dict[int, ProducerState], dict[int, int]]:
        """A head's value `{"n": next offset, "s": log start, "p": {producer id: [epoch, batches,
        last used ms]}}`, and the producers it keeps with their last-used times (the view takes
        them as they are once the commit succeeds, rather than decoding the value again)."""
        expiry = now_ms - self.settings.producer_expiry_ms
        kept: dict[int, ProducerState] = {}
        used: dict[int, int] = {}
        for pid, state in part.producers.items():
            last_used = part.producer_used.get(pid, now_ms)
            if pid not in changed and last_used >= expiry:
                kept[pid], used[pid] = state, last_used
        for pid, state in changed.items():
            kept[pid], used[pid] = state, now_ms
        start = part.log_start_offset if log_start is None else log_start
        if not kept:  # the common case, non-idempotent producers only: no JSON encoder needed
            return f'{{"n":{next_offset:d},"s":{start:d},"p":{{}}}}'.encode(), kept, used
        producers = {str(pid): [state.epoch, [list(b) for b in state.batches], used[pid]] for pid, state in kept.items()}
        return orjson.dumps({"n": next_offset, "s": start, "p": producers}), kept, used

    def _apply_commit(self, seq, new_heads, revision: int) -> list[tuple[uuid.UUID, int]]:
        """Take a successful transaction into the view; returns the partitions whose head it moved."""
        touched = []
        for tp, entries in seq.entries.items():
            part = self._partitions.get(tp)
            if part is not None:
                for e in entries:
                    part.add(e)
        for tp, (next_offset, kept, used) in new_heads.items():
            part = self._partitions.get(tp)
            if part is not None and revision > part.mod_revision:
                part.next_offset, part.mod_revision = next_offset, revision
                part.producers, part.producer_used = kept, used
                touched.append(tp)
        return touched

    def producer_states(self, topic_id: uuid.UUID, partition: int) -> dict[int, ProducerState]:
        part = self._partitions.get((topic_id, partition))
        if part is None:
            return {}
        # expired producers linger in the head until its next write; they are not active
        expiry = int(time.time() * 1000) - self.settings.producer_expiry_ms
        return {pid: state for pid, state in part.producers.items() if part.producer_used.get(pid, expiry) >= expiry}

    # -- producer ids -------------------------------------------------------------------------

    async def init_producer_id(self, producer_id: int = -1, producer_epoch: int = -1) -> tuple[int, int]:
        # KIP-360: a producer giving its current (id, epoch) gets the epoch bumped (partitions'
        # heads reset its sequence when they see the higher epoch with sequence 0); a stale epoch
        # or an unknown id gets a fresh id. Epochs live under producer-epochs/, on a lease that
        # expires them with the producer state (producer_expiry_ms).
        tx = self._client.transactions
        if producer_id >= 0 and 0 <= producer_epoch < MAX_EPOCH:
            key = self.keys.producer_epoch(producer_id)
            lease = await self._epoch_lease()
            ok, _ = await self._txn([tx.value(key) == str(producer_epoch).encode()], [tx.put(key, str(producer_epoch + 1).encode(), lease=lease)])
            if ok:
                return producer_id, producer_epoch + 1
        async with self._pid_lock:
            if self._pid_next >= self._pid_end:
                await self._allocate_producer_ids()
            pid = self._pid_next
            self._pid_next += 1
        lease = await self._epoch_lease()
        await self._txn([], [tx.put(self.keys.producer_epoch(pid), b"0", lease=lease)])
        return pid, 0

    async def _epoch_lease(self):
        """A lease for new producer-epoch keys, renewed hourly so each key lives at least the
        producer expiry and at most an hour longer."""
        now = time.monotonic()
        if self._epoch_lease_obj is None or now - self._epoch_lease_at > 3600:
            ttl = max(self.settings.producer_expiry_ms // 1000, 60) + 3600
            self._epoch_lease_obj = await asyncio.wait_for(self._client.lease(ttl), self.settings.timeout)
            self._epoch_lease_at = now
            self.ops += 1
        return self._epoch_lease_obj

    async def _allocate_producer_ids(self) -> None:
        tx = self._client.transactions
        key = self.keys.producer_ids
        for _ in range(self.settings.commit_attempts):
            got = await self._client.get(key)
            self.ops += 1
            current = int(got.value) if got is not None else 0
            compare = [tx.mod(key) == got.mod_revision] if got is not None else [tx.create(key) == 0]
            ok, _ = await self._txn(compare, [tx.put(key, str(current + PRODUCER_ID_BLOCK).encode())])
            if ok:
                self._pid_next, self._pid_end = current, current + PRODUCER_ID_BLOCK
                return
        raise MetadataUnavailable("could not allocate producer ids")

    # -- consumer groups ------------------------------------------------------------------------

    async def commit_offsets(self, group: str, offsets: Mapping[tuple[uuid.UUID, int], CommittedOffset]) -> None:
        tx = self._client.transactions
        puts = [
            tx.put(self.keys.offset(group, tid, p), json.dumps([o.offset, o.leader_epoch, o.metadata, o.commit_timestamp]).encode())
            for (tid, p), o in offsets.items()
        ]
        if len(puts) > MAX_OPS:
            # More partitions than one transaction holds: each put is still atomic on its own key,
            # and a group's commit names each partition once.
            await asyncio.gather(*(self._txn([], puts[i : i + MAX_OPS]) for i in range(0, len(puts), MAX_OPS)))
        elif puts:
            await self._txn([], puts)

    async def fetch_offsets(self, group: str) -> dict[tuple[uuid.UUID, int], CommittedOffset]:
        prefix = self.keys.offsets(group)
        result = await self._read(self._client.get_prefix(prefix))
        out = {}
        for kv in result:
            topic_hex, partition = kv.key[len(prefix) :].decode().split("/")
            offset, epoch, metadata, ts = json.loads(kv.value)
            out[(uuid.UUID(hex=topic_hex), int(partition))] = CommittedOffset(offset, epoch, metadata, ts)
        return out

    async def delete_offsets(self, group: str, partitions=None) -> None:
        tx = self._client.transactions
        if partitions is None:
            prefix = self.keys.offsets(group)
            await self._txn([], [tx.delete(prefix, _prefix_end(prefix))])
            return
        deletes = [tx.delete(self.keys.offset(group, tid, p)) for tid, p in partitions]
        for i in range(0, len(deletes), MAX_OPS):
            await self._txn([], deletes[i : i + MAX_OPS])

    async def save_group(self, group: str, state: bytes | None) -> None:
        tx = self._client.transactions
        key = self.keys.group(group)
        await self._txn([], [tx.delete(key) if state is None else tx.put(key, state)])

    async def load_group(self, group: str) -> bytes | None:
        got = await self._read(self._client.get(self.keys.group(group)))
        return None if got is None else bytes(got.value)

    async def list_groups(self) -> list[str]:
        names = set()
        for kind in ("groups/", "offsets/"):
            prefix = self.keys.prefix(kind)
            for kv in await self._read(self._client.get_prefix(prefix, keys_only=True)):
                names.add(unquote(kv.key[len(prefix) :].decode().split("/", 1)[0]))
        return sorted(names)

    async def _read(self, call):
        self.ops += 1
        try:
            return await asyncio.wait_for(call, self.settings.timeout)
        except Exception as e:
            raise MetadataUnavailable(f"etcd read failed: {e!r}") from e

    # -- brokers ------------------------------------------------------------------------------

    async def register_broker(self, broker: BrokerRegistration) -> None:
        await self._register(broker)
        self._tasks.append(asyncio.create_task(self._keep_alive()))

    async def _register(self, broker: BrokerRegistration) -> None:
        self._registration = broker
        self._lease = await self._client.lease(self.settings.lease_ttl)
        value = json.dumps({"host": broker.host, "port": broker.port, "zone": broker.zone}).encode()
        put = await self._client.put(self.keys.broker(broker.node_id), value, lease=self._lease)
        self.ops += 2
        self._brokers[broker.node_id] = broker
        self._broker_revisions[broker.node_id] = put.header.revision

    async def _keep_alive(self) -> None:
        interval = self.settings.lease_ttl / 3
        while not self._closed:
            await asyncio.sleep(interval)
            try:
                reply = await asyncio.wait_for(self._lease.refresh(), self.settings.timeout)
                ttl = getattr(reply, "TTL", 1)
                if ttl <= 0:
                    raise RuntimeError("lease expired")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("broker_lease_lost", extra={"error": repr(e)})
                try:
                    await self._register(self._registration)
                except Exception as again:
                    log.warning("broker_register_failed", extra={"error": repr(again)})

    # -- housekeeping -------------------------------------------------------------------------

    async def _current_revision(self) -> int:
        """etcd's newest revision, from the header of a one-key read. (aetcd's `status()` carries
        no header: compacting from it failed on an AttributeError, logged at debug level, so the
        history was never compacted.)"""
        from aetcd import rpc

        await self._client.connect()
        self.ops += 1
        reply = await self._client.kvstub.Range(rpc.RangeRequest(key=self.keys.producer_ids, limit=1, keys_only=True), timeout=self.settings.timeout, metadata=self._client.metadata)
        return reply.header.revision

    async def _compact_history(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.settings.compact_interval_s)
            try:
                target = await self._current_revision() - self.settings.keep_revisions
                if target > 0:
                    await self._client.compact(target)
                    log.info("etcd_history_compacted", extra={"revision": target})
            except asyncio.CancelledError:
                raise
            except Exception as e:  # another broker compacted further already, or etcd is away
                log.info("etcd_compact_skipped", extra={"error": repr(e)})


class _RevisionCompacted(Exception):
    """A paged load's revision was compacted away before its last page was read."""


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])

"""The etcd store's view: loaded in pages at one revision, then kept current by one watch on the
root, each event applied as it comes; and the waits for the view to reach a revision."""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import uuid

import orjson

from ..model import AbortedTransaction, BrokerRegistration, CommittedTransaction, TopicInfo
from ..sequencer import ProducerState
from ..store import MetadataUnavailable, resolved_within
from ..view import WAL, PartitionView
from .keys import _decode_entry, _decode_topic, _Keys, _prefix_end, _split_key, decode_producer

log = logging.getLogger("neve.metadata.etcd")

# Loading the view: only the key families it holds, in pages (etcd has no byte limit on a range
# read, gRPC has one on a message). The first page of each family is small; later pages hold up to
# PAGE_BYTES of the largest value seen so far in it; gRPC's limit (store.GRPC_MAX_MESSAGE_BYTES)
# is set well above that.
LOADED_KINDS = ("topics/", "brokers/", "heads/", "producers/", "index/", "wal-index/", "security/")
FIRST_PAGE_KEYS = 16
MAX_PAGE_KEYS = 4096
PAGE_BYTES = 4 * 1024 * 1024
LOAD_ATTEMPTS = 5
TXN_READS = 128  # gets per read-only transaction: etcd's default --max-txn-ops


def _return_freed_memory() -> None:
    """Hand the memory a load freed back to the system (glibc's malloc_trim). A load holds every
    page it read (gRPC's responses, the raw values) until the view is built; freed, glibc keeps
    most of it mapped for later, and a broker's resident memory would stay at its load's peak."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return  # not glibc
    trim(0)


class _PartitionState(PartitionView):
    """PartitionView plus what the sequencer and the compare need, and its head's key (made once:
    a commit names the head of every partition it touches three times). Each idempotent
    producer's state is a key of its own (`producers/`), with its mod revision for the compare."""

    __slots__ = ("producers", "mod_revision", "producer_used", "producer_revisions", "head_key")

    def __init__(self, head_key: bytes) -> None:
        super().__init__()
        self.producers: dict[int, ProducerState] = {}
        self.producer_used: dict[int, int] = {}
        self.producer_revisions: dict[int, int] = {}
        self.mod_revision = 0
        self.head_key = head_key

    def take_producer(self, producer_id: int, state: ProducerState, used: int, revision: int) -> None:
        if revision > self.producer_revisions.get(producer_id, 0):
            self.producers[producer_id], self.producer_used[producer_id], self.producer_revisions[producer_id] = state, used, revision
            self.set_transaction_start(producer_id, state.txn_first_offset)

    def drop_producer(self, producer_id: int, revision: int) -> None:
        if revision >= self.producer_revisions.get(producer_id, 0):
            self.producers.pop(producer_id, None)
            self.producer_used.pop(producer_id, None)
            self.producer_revisions.pop(producer_id, None)
            self.set_transaction_start(producer_id, -1)


class _RevisionCompacted(Exception):
    """A paged load's revision was compacted away before its last page was read."""


class _Follower:
    """Loading and following, mixed into EtcdMetadataStore. Keeps the view's state, which the
    store's __init__ makes: `_topics`, `_topics_by_id`, `_topic_created`, `_partitions` (and the
    per-topic views, through IndexReads' `_view_added` and `_views_dropped`), `_by_path`,
    `_brokers`, `_broker_revisions`, `_security`, `_security_version`, `_revision`, `_revision_waiters`, `_loaded`, `_watching`, and
    `_own_revisions` and `_commits_in_flight` (commits.py adds to both). Uses the store's `keys`
    and the key prefixes it made, `settings`, `_client`, `_delete_type`, `ops`, `notifier`,
    `_closed`, `_registration` and `_register` (leases.py)."""

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
        heads, producers, entries, wal_indexes = [], [], [], []
        security: dict[str, bytes] = {}
        revision = 0
        async for _kind, kvs in self._read_pages(LOADED_KINDS):
            for kv in kvs:
                revision = max(revision, kv.mod_revision)
                self._load_one(kv, topics, created, heads, producers, entries, wal_indexes, brokers, broker_revisions, security)
        revision = max(revision, self._loading_revision)
        self._adopt_loaded(revision, topics, created, heads, producers, entries, wal_indexes, brokers, broker_revisions, security)
        del heads, producers, entries, wal_indexes
        _return_freed_memory()
        return revision

    def _load_one(self, kv, topics, created, heads, producers, entries, wal_indexes, brokers, broker_revisions, security) -> None:
        """Sort one key-value of a load into the collections `_adopt_loaded` builds the view from."""
        kind, rest = _split_key(kv.key)
        if kind == "topics":
            info = _decode_topic(rest, kv.value)
            topics[info.name] = info
            created[info.topic_id] = kv.create_revision
        elif kind == "heads":
            heads.append((rest, kv))
        elif kind == "producers":
            producers.append((rest, kv))
        elif kind == "wal-index":
            wal_indexes.append(kv.value)
        elif kind == "index":
            entries.append((rest, kv))
        elif kind == "brokers":
            b = json.loads(kv.value)
            brokers[int(rest)] = BrokerRegistration.from_fields(int(rest), b)
            broker_revisions[int(rest)] = kv.mod_revision
        elif kind == "security":
            security[rest] = bytes(kv.value)

    def _adopt_loaded(self, revision, topics, created, heads, producers, entries, wal_indexes, brokers, broker_revisions, security) -> None:
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
        for rest, kv in producers:
            self._apply_producer(rest, kv.value, kv.mod_revision)
        for raw in wal_indexes:
            self._apply_wal_index(raw)
        for rest, kv in entries:
            self._apply_entry(rest, kv.value)
        self._brokers, self._broker_revisions = brokers, broker_revisions
        self._security = security
        # the version is the revision of the family's last change the view holds: a change while
        # the watch was broken has a revision above the one before, and at most the load's
        self._security_version = max(self._security_version, revision)
        self._loaded.set()
        log.info("etcd_view_loaded", extra={"revision": revision, "topics": len(topics), "brokers": sorted(brokers), "wal_index_records": len(wal_indexes)})

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
        if key.startswith(self._producers_prefix):
            rest = key[len(self._producers_prefix) :].decode()
            if deleted:  # its lease expired: the producer was idle for producer_expiry_ms
                path, _, pid = rest.rpartition("/")
                found = self._by_path.get(path)
                if found is not None:
                    found[1].drop_producer(int(pid), kv.mod_revision)
            else:
                self._apply_producer(rest, kv.value, kv.mod_revision)
            return None
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
        if key.startswith(self._security_prefix):
            rest = key[len(self._security_prefix) :].decode()
            if deleted:
                self._security.pop(rest, None)
            else:
                self._security[rest] = bytes(kv.value)
            self._security_version = max(self._security_version, kv.mod_revision)
            return None
        kind, rest = _split_key(key)
        if kind == "topics":
            if deleted:
                info = self._topics.pop(rest, None)
                if info is not None:
                    self._forget_topic(info)
            else:
                self._adopt_topic(_decode_topic(rest, event.kv.value), kv.create_revision)
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
                self._brokers[node_id] = BrokerRegistration.from_fields(node_id, b)
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
        return tp

    def _apply_producer(self, rest: str, raw: bytes, mod_revision: int) -> None:
        """A producer key `<partition path>/<producer id>`: its state, if newer than the view's."""
        path, _, pid = rest.rpartition("/")
        found = self._by_path.get(path)
        if found is not None:
            state, used = decode_producer(raw)
            found[1].take_producer(int(pid), state, used, mod_revision)

    def _index_key(self, rest: str) -> tuple[_PartitionState | None, int]:
        """The partition (None if unknown) and base offset an index key names."""
        path, _, base = rest.rpartition("/")
        found = self._by_path.get(path)
        return (found[1] if found is not None else None), int(base)

    def _apply_wal_index(self, raw: bytes) -> None:
        """A wal-index record's entries into their partitions' views, field by field (the layout
        is `encode_wal_index`'s; no IndexEntry is made per entry)."""
        key, topics, *aborted = orjson.loads(raw)
        by_path = self._by_path
        for topic, rows in topics:
            prefix = topic + "/"
            for partition, base, last, start, size, max_ts in rows:
                found = by_path.get(prefix + partition)
                if found is not None:
                    found[1].add_fields(base, last, key, WAL, start, size, max_ts)
        for path, last, first, pid in aborted[0] if aborted else ():
            found = by_path.get(path)
            if found is not None:
                found[1].add_aborted(AbortedTransaction(last, first, pid))
        for path, last, first, pid, generation in aborted[1] if len(aborted) > 1 else ():
            found = by_path.get(path)
            if found is not None:
                found[1].add_committed(CommittedTransaction(last, first, pid, generation))

    def _apply_entry(self, rest: str, raw: bytes) -> None:
        """A per-entry key: it takes the place of whatever the view holds for its offsets (the
        wal-index entries a range replace superseded; loads apply wal-index records first)."""
        part, base = self._index_key(rest)
        if part is not None:
            part.replace(_decode_entry(base, raw))

    def is_current(self) -> bool:
        return self._watching and not self._closed

    async def view_caught_up(self) -> None:
        import grpc
        from aetcd import rpc

        self.ops += 1
        try:
            await self._client.connect()
            # a count of one key's range: only the response header's revision is wanted
            response = await self._client.kvstub.Range(rpc.RangeRequest(key=self.keys.prefix("caught-up"), count_only=True), timeout=self.settings.timeout, metadata=self._client.metadata)
        except grpc.aio.AioRpcError as e:
            raise MetadataUnavailable(f"etcd read failed: {e.code().name} {e.details()}") from e
        if not await self._view_reaches(response.header.revision, self.settings.timeout * 2):
            raise MetadataUnavailable(f"the view did not reach revision {response.header.revision} within {self.settings.timeout * 2:.0f} s")

    async def durable_high_watermarks(self, partitions) -> dict[tuple[uuid.UUID, int], int]:
        """The heads' next offsets as etcd holds them: one read-only transaction of up to
        TXN_READS gets (etcd's default operation limit), so a Fetch beyond the view's high
        watermark in many partitions costs one request. Nothing is applied to the view: a head
        read alone, without the index entries its commit added, would make offsets readable
        that the view cannot find."""
        tx = self._client.transactions
        known = [(tp, part) for tp in partitions if (part := self._partitions.get(tp)) is not None]
        found = {tp: 0 for tp in partitions}
        for i in range(0, len(known), TXN_READS):
            chunk = known[i : i + TXN_READS]
            _, responses = await self._txn([], [tx.get(part.head_key) for _, part in chunk])
            for (tp, _), got in zip(chunk, responses, strict=True):
                if got:
                    found[tp] = orjson.loads(got[0][0])["n"]
        return found

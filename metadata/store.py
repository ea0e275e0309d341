"""The metadata interface, in Kafka terms. Every backend implements MetadataStore; the broker and
(later) the compactor only ever talk to this.

Reads (`topics`, `high_watermark`, `entries`, ...) are synchronous and served from an in-memory
view that each backend keeps current (the embedded store owns it; the etcd store follows a watch).
Writes are coroutines that return once durable. `wait_for_commit` lets long-poll fetches sleep
until a partition grows.
"""

from __future__ import annotations

import abc
import asyncio
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Container, Iterable, Mapping, Sequence
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from .model import AppendResult, BrokerRegistration, CommittedOffset, IndexEntry, ObjectCommit, TopicInfo
from .sequencer import ProducerState
from .view import PartitionView


class MetadataError(Exception):
    """Base of the errors below; `error_code` is the Kafka error to answer with."""

    error_code = ErrorCode.unknown_server_error


class TopicAlreadyExists(MetadataError):
    error_code = ErrorCode.topic_already_exists


class UnknownTopic(MetadataError):
    error_code = ErrorCode.unknown_topic_or_partition


class InvalidPartitions(MetadataError):
    error_code = ErrorCode.invalid_partitions


class MetadataUnavailable(MetadataError):
    """The store could not be reached or the write could not be made durable (retriable)."""

    error_code = ErrorCode.request_timed_out


class Fenced(MetadataError):
    """The write carried a leadership's fence (`Fence`) and that leadership has changed hands (or
    lapsed) since: nothing was written. The writer is no longer the leader and must stop."""


class ObjectFenced(MetadataUnavailable):
    """The commit names an object the orphan sweeper has fenced off (it may be deleted already):
    nothing of it was committed; the producers retry into a new object."""


TopicPartition = tuple[uuid.UUID, int]


class RegistryItem(NamedTuple):
    """One key of the schema registry's storage (`MetadataStore.registry_*`): its value and the
    revision of its last write, which `registry_write` compares (0 stands for "absent")."""

    key: str
    value: bytes
    revision: int


PRODUCER_EXPIRY_MS = 24 * 3600 * 1000  # Kafka's producer.id.expiration.ms


# The security family (`MetadataStore.security_*`) is followed by every broker's view, so it must
# stay small: each key and value is bounded, and so is one write, which the etcd store makes one
# transaction (within etcd's operations and bytes per request).
MAX_SECURITY_KEY_BYTES = 1024
MAX_SECURITY_VALUE_BYTES = 64 * 1024
MAX_SECURITY_WRITE_KEYS = 100
MAX_SECURITY_WRITE_BYTES = 1024 * 1024


def checked_security_writes(writes: Mapping[str, bytes | None]) -> dict[str, bytes | None]:
    """A copy of a `security_write`'s writes; ValueError if a key is empty or over
    MAX_SECURITY_KEY_BYTES (UTF-8), a value is not bytes or over MAX_SECURITY_VALUE_BYTES, or the
    write as a whole is over MAX_SECURITY_WRITE_KEYS keys or MAX_SECURITY_WRITE_BYTES."""
    checked: dict[str, bytes | None] = {}
    total = 0
    for key, value in writes.items():
        size = len(key.encode())
        if not 0 < size <= MAX_SECURITY_KEY_BYTES:
            raise ValueError(f"a security key takes 1 to {MAX_SECURITY_KEY_BYTES} bytes, {key[:64]!r}... has {size}")
        if value is not None:
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise ValueError(f"the security value of {key[:64]!r} is a {type(value).__name__}, not bytes")
            value = bytes(value)
            if len(value) > MAX_SECURITY_VALUE_BYTES:
                raise ValueError(f"a security value takes at most {MAX_SECURITY_VALUE_BYTES} bytes, that of {key[:64]!r} has {len(value)}")
            size += len(value)
        total += size
        checked[key] = value
    if len(checked) > MAX_SECURITY_WRITE_KEYS:
        raise ValueError(f"one security write changes at most {MAX_SECURITY_WRITE_KEYS} keys, not {len(checked)}")
    if total > MAX_SECURITY_WRITE_BYTES:
        raise ValueError(f"one security write holds at most {MAX_SECURITY_WRITE_BYTES} bytes, not {total}")
    return checked


def security_matching(items: Mapping[str, bytes], prefix: str) -> dict[str, bytes]:
    """The items of a store's security family whose key starts with `prefix` (a scan: the family
    is small)."""
    return {key: value for key, value in items.items() if key.startswith(prefix)}


def check_replacement(replaced: Sequence[IndexEntry], replacement: IndexEntry) -> None:
    """ValueError unless `replaced` are entries that follow one another and `replacement` covers
    exactly their offsets (`MetadataStore.replace_entries`)."""
    if not replaced:
        raise ValueError("nothing to replace")
    for before, after in zip(replaced, replaced[1:]):
        if after.base_offset != before.last_offset + 1:
            raise ValueError(f"entries {before.base_offset}-{before.last_offset} and {after.base_offset}-{after.last_offset} do not follow one another")
    if (replacement.base_offset, replacement.last_offset) != (replaced[0].base_offset, replaced[-1].last_offset):
        raise ValueError(
            f"the replacement holds offsets {replacement.base_offset}-{replacement.last_offset}, the entries replaced {replaced[0].base_offset}-{replaced[-1].last_offset}"
        )


async def resolved_within(fut: asyncio.Future, timeout: float) -> bool:
    """True if `fut` is resolved within `timeout` seconds; False (and `fut` cancelled) if not."""
    try:
        await asyncio.wait_for(fut, timeout)
        return True
    except TimeoutError:
        return False


class CommitNotifier:
    """Wakes coroutines waiting for any of a set of partitions to grow. Backends call `notify`
    after applying a commit to their in-memory view. Waiters are kept by topic, each with the set
    of its partitions: a Fetch of 10,000 partitions registers once, not 10,000 times."""

    def __init__(self) -> None:
        self._waiters: dict[uuid.UUID, list[tuple[asyncio.Future, Container[int]]]] = {}

    def notify(self, partitions: Iterable[TopicPartition]) -> None:
        waiters = self._waiters
        if not waiters:
            return
        for topic_id, partition in partitions:
            for fut, watched in waiters.get(topic_id, ()):
                if partition in watched and not fut.done():
                    fut.set_result((topic_id, partition))

    async def wait(self, partitions: Iterable[TopicPartition], timeout: float) -> bool:
        """True if one of `partitions` was committed to before `timeout` seconds passed."""
        by_topic: dict[uuid.UUID, set[int]] = {}
        for topic_id, partition in partitions:
            by_topic.setdefault(topic_id, set()).add(partition)
        return await self.wait_in(by_topic.items(), timeout)

    async def wait_in(self, topics: Iterable[tuple[uuid.UUID, Collection[int]]], timeout: float) -> bool:
        """`wait`, for partitions given by topic: (topic id, its partitions)."""
        fut = asyncio.get_running_loop().create_future()
        registered = []
        for topic_id, partitions in topics:
            entry = (fut, partitions if isinstance(partitions, (set, frozenset, range)) else frozenset(partitions))
            self._waiters.setdefault(topic_id, []).append(entry)
            registered.append((topic_id, entry))
        try:
            return await resolved_within(fut, timeout)
        finally:
            for topic_id, entry in registered:
                waiters = self._waiters.get(topic_id)
                if waiters is not None:
                    waiters.remove(entry)
                    if not waiters:
                        del self._waiters[topic_id]


class Fence(NamedTuple):
    """A leader's proof on a write (`MetadataStore.replace_entries`): the write happens only while
    the leadership `name` is still held by the lead that `epoch` numbers (`Leadership.fence`)."""

    name: str
    epoch: int


class Holder(NamedTuple):
    """A live leadership as the store sees it (`MetadataStore.holders`): its name, who holds it,
    and its epoch (`Leadership.epoch`, `Fence`)."""

    name: str
    holder: str
    epoch: int


class Leadership:
    """A holder's claim on a named leadership (`MetadataStore.campaign`): of every holder
    campaigning for one name, through the stores on one storage, at most one leads at a time. The
    store campaigns in the background until `resign` (or its close): it takes the lead when no one
    holds it, keeps it alive, and campaigns again after losing it. A holder that finds itself not
    leading stops what only the leader does; `is_leader` turns False, on the holder's own clock,
    before any other holder can take the lead (the etcd store's lease is held at least as long)."""

    def __init__(self, name: str, holder: str) -> None:
        self.name, self.holder = name, holder
        self._until = 0.0  # time.monotonic() until which the lead is assured
        self.epoch = 0  # which lead this is: another lead of the name (even this holder's next) has another
        self._leading = asyncio.Event()
        self.resigned = False
        self._resign: Callable[[], Awaitable[None]] | None = None  # the store's part of stepping down

    def is_leader(self) -> bool:
        return time.monotonic() < self._until

    def fence(self) -> Fence:
        """The fence of the current lead: writes carrying it fail (Fenced) once the lead is lost,
        even when this holder's clock has not noticed yet."""
        return Fence(self.name, self.epoch)

    async def wait_leading(self, timeout: float) -> bool:
        """True once this holder leads, False if it does not within `timeout` seconds."""
        try:
            await asyncio.wait_for(self._leading.wait(), timeout)
        except TimeoutError:
            return False
        return self.is_leader()

    async def resign(self) -> None:
        """Step down (another holder may take the lead at once) and stop campaigning."""
        if self.resigned:
            return
        self.resigned = True
        self._lose()
        if self._resign is not None:
            await self._resign()

    def _lead(self, until: float = math.inf, epoch: int | None = None) -> None:
        self._until = until
        if epoch is not None:
            self.epoch = epoch
        self._leading.set()

    def _lose(self) -> None:
        self._until = 0.0
        self._leading.clear()


class MetadataStore(abc.ABC):
    def __init__(self) -> None:
        self.notifier = CommitNotifier()
        self._brokers: dict[int, BrokerRegistration] = {}
        self._campaigns: dict[str, list[Leadership]] = {}  # by name, the first leads (`campaign`, one process)
        self._epochs = 0  # the last lead's epoch, of any name (`campaign`, one process)
        self._security: dict[str, bytes] = {}  # the security family in the view (the backends keep it)
        self._security_version = 0

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Connect / load state. Called once before use."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release resources."""

    # -- topics ---------------------------------------------------------------------------------

    @abc.abstractmethod
    async def create_topic(self, name: str, partitions: int, configs: Mapping[str, str] | None = None) -> TopicInfo:
        """Raises TopicAlreadyExists, InvalidPartitions."""

    @abc.abstractmethod
    async def delete_topic(self, name: str) -> TopicInfo:
        """Raises UnknownTopic. The topic's index entries become unreachable."""

    @abc.abstractmethod
    async def update_topic(self, name: str, partitions: int | None = None, configs: Mapping[str, str | None] | None = None) -> TopicInfo:
        """CreatePartitions and AlterConfigs: grow the partition count (never shrink: raises
        InvalidPartitions) and set configs (a None value removes the key). Raises UnknownTopic."""

    @abc.abstractmethod
    def topics(self) -> Mapping[str, TopicInfo]:
        """All live topics by name."""

    @abc.abstractmethod
    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None: ...

    # -- the sequencer ----------------------------------------------------------------------------

    @abc.abstractmethod
    async def commit(self, commit: ObjectCommit) -> list[AppendResult]:
        """Assign offsets to every append of one WAL object, atomically per partition, check and
        record idempotent-producer state, and append index entries (one per contiguous run of
        stored appends of a partition). Returns one result per append, in order. Safe to call
        concurrently; concurrent commits to one partition get gap-free, non-overlapping offsets.
        Raises MetadataUnavailable if nothing could be made durable (then nothing was applied)."""

    @abc.abstractmethod
    async def init_producer_id(self, producer_id: int = -1, producer_epoch: int = -1) -> tuple[int, int]:
        """A new producer id with epoch 0, or (KIP-360) the same id with its epoch bumped when a
        known (id, epoch) is given. Returns (producer_id, producer_epoch)."""

    @abc.abstractmethod
    def producer_state(self, topic_id: uuid.UUID, partition: int, producer_id: int) -> ProducerState | None:
        """The producer's state on the partition as the sequencer reads it (expired or not), from
        the in-memory view: the produce handler takes a transactional batch's guard from it."""

    @abc.abstractmethod
    def producer_last_used(self, topic_id: uuid.UUID, partition: int, producer_id: int) -> int | None:
        """When (ms, the committing broker's clock) the producer's state on the partition last
        changed, as stored with it; None: no state. The transaction sweep dates a hanging
        transaction from it, whichever broker leads the sweep."""

    @abc.abstractmethod
    def producer_states(self, topic_id: uuid.UUID, partition: int) -> dict[int, ProducerState]:
        """The idempotent producers the sequencer remembers on one partition, by producer id
        (DescribeProducers); empty for an unknown partition. Served from the in-memory view."""

    # -- the offset index -------------------------------------------------------------------------

    @abc.abstractmethod
    def high_watermark(self, topic_id: uuid.UUID, partition: int) -> int:
        """The next offset to be assigned (= log end offset)."""

    @abc.abstractmethod
    def log_start_offset(self, topic_id: uuid.UUID, partition: int) -> int: ...

    @abc.abstractmethod
    def entries(self, topic_id: uuid.UUID, partition: int, offset: int, max_entries: int = 64) -> list[IndexEntry]:
        """Index entries in offset order, starting with the one holding `offset` (or the first
        after it), at most `max_entries`."""

    @abc.abstractmethod
    def topic_views(self, topic_id: uuid.UUID) -> Sequence[PartitionView | None]:
        """The live views of a topic's partitions by partition index, empty for an unknown topic:
        the reads above for many partitions of one topic at once (a Fetch of all of them).
        Read them, never change them."""

    @abc.abstractmethod
    async def advance_log_start(self, topic_id: uuid.UUID, partition: int, offset: int) -> int:
        """DeleteRecords and retention: move the log start offset forward to `offset` (clamped to
        the high watermark; never backward). Returns the new log start offset. The Kafka view
        hides what lies before it; the data itself is not deleted."""

    @abc.abstractmethod
    def entry_for_timestamp(self, topic_id: uuid.UUID, partition: int, timestamp: int) -> IndexEntry | None:
        """The first entry whose max_timestamp >= timestamp, or None."""

    @abc.abstractmethod
    async def replace_entries(self, topic_id: uuid.UUID, partition: int, replaced: Sequence[IndexEntry], replacement: IndexEntry, fence: Fence | None = None) -> bool:
        """Compaction's index swap: the consecutive entries `replaced`, as the caller read them
        from this store, become the one entry `replacement` (a PARQUET object's row range, or a
        merged object), which must cover exactly their offsets. Atomic for the partition, and
        however many entries it replaces, within etcd's limits per transaction. True once
        durable; False, changing nothing, if the partition's entries over that range are no
        longer exactly `replaced` (another replace won). An object no entry refers to any more
        drops out of `referenced_objects`. With a `fence`, the replace happens in the same atomic
        step as a check that its leadership is still held by that lead (a deposed compactor's swap
        changes nothing). Raises ValueError for a replacement that does not fit `replaced`,
        UnknownTopic, Fenced, MetadataUnavailable."""

    def referenced_objects(self) -> set[str]:
        """Keys of every object some index entry points at (the orphan sweeper keeps these)."""
        keys: set[str] = set()
        for info in list(self.topics().values()):
            for p in range(info.partitions):
                offset = self.log_start_offset(info.topic_id, p)
                while batch := self.entries(info.topic_id, p, offset, max_entries=4096):
                    keys.update(e.object_key for e in batch)
                    offset = batch[-1].last_offset + 1
        return keys

    @abc.abstractmethod
    async def fence_objects(self, object_keys: Collection[str]) -> set[str]:
        """For the orphan sweeper: fence these objects off, so that no commit naming one of them
        can land from now on (it raises ObjectFenced, having committed nothing), and return
        those no commit named before: the objects that may be deleted. An object a commit named
        first stays referenced and is not returned. When the store cannot tell (its view lags
        behind the fence), it returns nothing."""

    def is_current(self) -> bool:
        """Whether the in-memory view is known to reflect every durable commit (the embedded
        store always; the etcd store while its watch is connected)."""
        return True

    async def view_caught_up(self) -> None:  # noqa: B027 - a store whose view is always current needs nothing
        """Return once the in-memory view reflects every write made durable before the call (a
        reader that pairs the view with a durable read, as the compactor does with transaction
        states). The embedded store's view always does; the etcd store reads the current revision
        and waits for its watch to reach it. Raises MetadataUnavailable."""

    async def durable_high_watermarks(self, partitions: Collection[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark of each partition as the store holds it now, which a view that
        lags may not show yet: Fetch asks it, once per request and only beyond the view's high
        watermark, before answering OFFSET_OUT_OF_RANGE there (a partition it does not know: 0).
        A store whose view is always current answers from its view (no I/O); the etcd store reads
        the partitions' heads. Raises MetadataUnavailable."""
        return {tp: self.high_watermark(*tp) for tp in partitions}

    async def wait_for_commit(self, partitions: Iterable[TopicPartition], timeout: float) -> bool:
        """True if one of `partitions` grew before `timeout` seconds passed."""
        return await self.notifier.wait(partitions, timeout)

    async def wait_for_commit_in(self, topics: Iterable[tuple[uuid.UUID, Collection[int]]], timeout: float) -> bool:
        """`wait_for_commit` for partitions given by topic, (topic id, its partitions): a long-poll
        Fetch of many partitions."""
        return await self.notifier.wait_in(topics, timeout)

    # -- consumer groups ------------------------------------------------------------------------
    # Committed offsets are durable facts; group membership is an opaque blob the coordinator
    # saves at each generation, so another broker can take a group over from the store.

    @abc.abstractmethod
    async def commit_offsets(self, group: str, offsets: Mapping[TopicPartition, CommittedOffset], if_unchanged: Mapping[str, int] | None = None) -> bool:
        """Durably record the group's positions (all or nothing); True once recorded. With
        `if_unchanged` (registry key -> revision, as registry_write's `expect`), only while every
        key there is at its revision, checked atomically with the write (a transaction's offsets,
        written only while it is the one that decided them); False, and nothing written, if not."""

    @abc.abstractmethod
    async def fetch_offsets(self, group: str) -> dict[TopicPartition, CommittedOffset]:
        """The group's committed positions, read from the durable store (not a cache)."""

    @abc.abstractmethod
    async def delete_offsets(self, group: str, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Forget the group's positions for `partitions` (all when None)."""

    @abc.abstractmethod
    async def save_group(self, group: str, state: bytes | None) -> None:
        """Store the coordinator's state of a group (None deletes it)."""

    @abc.abstractmethod
    async def load_group(self, group: str) -> bytes | None: ...

    @abc.abstractmethod
    async def list_groups(self) -> list[str]:
        """Groups with stored state or committed offsets, sorted."""

    # -- the schema registry's storage -----------------------------------------------------------
    # Small keys with compare-and-write: the registry (registry/store.py) lays its subjects,
    # versions, ids and configs out over them and makes each registration one atomic write, so
    # brokers registering at once agree on ids and versions. Read straight from the durable store.

    @abc.abstractmethod
    async def registry_get(self, key: str) -> RegistryItem | None:
        """The item at `key`, or None."""

    @abc.abstractmethod
    async def registry_items(self, prefix: str) -> list[RegistryItem]:
        """Every item whose key starts with `prefix`, in key order."""

    @abc.abstractmethod
    async def registry_write(self, writes: Mapping[str, bytes | None], expect: Mapping[str, int]) -> bool:
        """Atomically: if every key of `expect` is at its revision there (0: the key is absent),
        put each value of `writes` (None deletes the key) and return True; otherwise change
        nothing and return False. Raises MetadataUnavailable."""

    # -- the security family ------------------------------------------------------------------
    # Small keys every broker follows in its view: SCRAM credentials under "scram/", ACL bindings
    # under "acls/". Reads are served from the view; a broker derives its caches (an ACL table,
    # credentials) from the items and rebuilds them when `security_version` moves.

    # Both stores keep the family in their view as `_security` (key -> value) and
    # `_security_version`: reads are the view's.
    def security_items(self, prefix: str) -> dict[str, bytes]:
        """The family's items whose key starts with `prefix`, from this store's view (a write by
        any broker is seen here within the watch's delay, well under a second)."""
        return security_matching(self._security, prefix)

    @abc.abstractmethod
    async def security_write(self, writes: Mapping[str, bytes | None]) -> None:
        """Put each value (None deletes the key) in one atomic write, seen in this store's view
        once it returns. Raises ValueError for a write over the family's bounds
        (`checked_security_writes`), MetadataUnavailable."""

    def security_version(self) -> int:
        """Grows whenever the family changes in this store's view (and when the view is loaded):
        a cache derived from the items is rebuilt when it moved."""
        return self._security_version

    # -- brokers ------------------------------------------------------------------------------

    async def register_broker(self, broker: BrokerRegistration) -> None:
        """Announce this broker as live for as long as it runs (the etcd store ties this to a
        lease, so a dead broker disappears within the lease TTL). The embedded store, having one
        broker, just remembers it."""
        self._brokers[broker.node_id] = broker

    def registration_revision(self) -> int:
        """This broker's registration as the store holds it, a number that changes whenever the
        broker registers again (after its lease lapsed: a long pause, a cut-off); 0 for a store
        whose one broker never lapses. Group state this broker kept in memory under an earlier
        registration may have moved away and back meanwhile, and is to be read again."""
        return 0

    def live_brokers(self) -> list[BrokerRegistration]:
        """The live brokers, by node id."""
        return [self._brokers[k] for k in sorted(self._brokers)]

    # -- leaders ------------------------------------------------------------------------------
    # Work one node does for the cluster (the WAL sweeper) is done by the holder of a named
    # leadership. Holders are free-form names (a node id and address), for logs and inspection.

    async def campaign(self, name: str, holder: str) -> Leadership:
        """Campaign for the leadership `name` as `holder`, in the background, until the returned
        Leadership resigns or the store closes. The embedded store has one process: the first
        holder of a name leads at once, the next when it resigns. The etcd store holds the lead on
        a lease (`lease_ttl_s`) under `leaders/<name>`: a holder that dies loses it when the lease
        expires, and one that resigns or closes revokes it."""
        leadership = Leadership(name, holder)
        holders = self._campaigns.setdefault(name, [])
        holders.append(leadership)
        if len(holders) == 1:
            leadership._lead(epoch=self._next_epoch())

        async def resign() -> None:
            was_first = holders[0] is leadership
            holders.remove(leadership)
            if was_first and holders:
                holders[0]._lead(epoch=self._next_epoch())

        leadership._resign = resign
        return leadership

    async def holders(self, prefix: str) -> list[Holder]:
        """The leaderships held now whose name starts with `prefix`, by name: for a group of
        processes that each lead a name of their own (e.g. the compactors sharing the topics, each
        leading `compactor-members/<its id>`), the live members. One that resigns, closes or (etcd)
        whose lease expires is no longer listed."""
        return sorted(Holder(name, holders[0].holder, holders[0].epoch) for name, holders in self._campaigns.items() if name.startswith(prefix) and holders and holders[0].is_leader())

    def _next_epoch(self) -> int:
        self._epochs += 1
        return self._epochs

    def _check_fence(self, fence: Fence | None) -> None:
        """Fenced unless `fence` is None or its lead still holds its name (one process's campaigns)."""
        if fence is None:
            return
        holders = self._campaigns.get(fence.name)
        if not holders or holders[0].epoch != fence.epoch:
            raise Fenced(f"leadership {fence.name!r} epoch {fence.epoch} is no longer held")


def load_metadata_store(url: str, *, timeout_ms: int = 5000, lease_ttl_s: int = 5, compact_interval_s: int = 300, producer_expiry_ms: int = PRODUCER_EXPIRY_MS) -> MetadataStore:
    """Pick the backend from the URL scheme: `sqlite:///path/meta.db` (embedded, durable),
    `memory://` (embedded, for unit tests), `etcd://host:port[/root][?query]` (production), or
    `etcd://h1:p1,h2:p2,h3:p3[/root][?query]` for several members of one etcd cluster (IPv4
    addresses; the client uses one and moves to another when its connection fails).

    An etcd URL's query secures the connection: `ca=<file>` (the authority etcd's certificate is
    checked with; `tls=true` alone uses the system's), `cert=<file>&key=<file>` (the client
    certificate, when etcd asks for one: --client-cert-auth), any of them turning TLS on;
    `user=<name>&password_file=<file>` (etcd's authentication; the password is read from the
    file, a mounted secret, never written in the URL). A half-given certificate, a user without
    a password file, a password in the URL or an unknown parameter is a ValueError."""
    from urllib.parse import parse_qs, urlparse

    parsed = urlparse(url)
    if parsed.scheme in ("sqlite", "memory"):
        from .embedded import EmbeddedMetadataStore

        return EmbeddedMetadataStore(None if parsed.scheme == "memory" else parsed.path, producer_expiry_ms=producer_expiry_ms)
    if parsed.scheme == "etcd":
        try:  # imported lazily: aetcd and orjson are only needed for etcd
            import aetcd  # noqa: F401

            from .etcd import EtcdMetadataStore, EtcdSecurity, EtcdSettings
        except ImportError as e:
            raise ImportError(f"the etcd metadata store needs aetcd and orjson: pip install 'neve[etcd]' ({e})") from e

        if parsed.password is not None:
            raise ValueError("an etcd:// URL takes no password: give user= and password_file=, a file holding it")
        query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        security = EtcdSecurity.from_query(query)
        settings = EtcdSettings(timeout=timeout_ms / 1000, lease_ttl=lease_ttl_s, compact_interval_s=compact_interval_s, producer_expiry_ms=producer_expiry_ms)
        root = parsed.path.strip("/") or "neve"
        if "," in parsed.netloc:  # several members: etcd://h1:p1,h2:p2,h3:p3/root, each an IPv4 address and port
            from .etcd.client import split_endpoints

            members = ",".join(f"{h}:{p}" for h, p in split_endpoints(parsed.netloc))
            return EtcdMetadataStore(members, 0, root=root, settings=settings, security=security)
        return EtcdMetadataStore(parsed.hostname or "127.0.0.1", parsed.port or 2379, root=root, settings=settings, security=security)
    raise ValueError(f"unsupported metadata URL {url!r} (use sqlite:///path, memory:// or etcd://host:port)")

"""Plain values that cross the metadata interface, named in Kafka terms."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field

# What an Append holds (`Append.control`): records, or one transaction marker (a control batch,
# whose control record's type is 0 for an abort and 1 for a commit, as Kafka's ControlRecordType).
NOT_CONTROL, ABORT_MARKER, COMMIT_MARKER = -1, 0, 1


class ObjectType(enum.IntEnum):
    WAL = 0  # a WAL object: start/size are a byte range of stored record batches
    PARQUET = 1  # a compacted Parquet file: start/size are a row range
    EXPIRED = 2  # offsets below the log start of a topic without a table: no object holds them any more (object key "")


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A consumer group's committed position in one partition (OffsetCommit / OffsetFetch)."""

    offset: int
    leader_epoch: int = -1
    metadata: str | None = None
    commit_timestamp: int = -1  # ms since the epoch


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """A live broker, as registered under a lease: where clients reach it (its first listener's
    address; and each listener's by name), its zone, and the port its zone's brokers ask it for
    cache chunks on (0: it serves none)."""

    node_id: int
    host: str
    port: int
    zone: str | None = None
    cache_port: int = 0
    listeners: tuple[tuple[str, str, int], ...] = ()  # (listener name, advertised host, port); () when only one

    def endpoint(self, listener: str) -> tuple[str, int]:
        """Where a client that came in through `listener` reaches this broker: the listener of that
        name, else the first listener."""
        for name, host, port in self.listeners:
            if name == listener:
                return host, port
        return self.host, self.port

    def fields(self) -> dict:
        """The registration as stored (JSON), `node_id` aside; optional fields only when set, as
        brokers without them write it."""
        out: dict = {"host": self.host, "port": self.port, "zone": self.zone}
        if self.cache_port:
            out["cache_port"] = self.cache_port
        if self.listeners:
            out["listeners"] = [list(item) for item in self.listeners]
        return out

    @classmethod
    def from_fields(cls, node_id: int, b: dict) -> BrokerRegistration:
        listeners = tuple((str(n), str(h), int(p)) for n, h, p in b.get("listeners", ()))
        return cls(node_id, b["host"], b["port"], b.get("zone"), b.get("cache_port", 0), listeners)


# The values made once per partition-append (an Append, its AppendResult, its IndexEntry) are not
# frozen: a frozen dataclass sets each field through object.__setattr__, and its __init__ took
# 0.70 us against 0.15 (7 fields), a few per produce request and one per index entry a broker
# follows. They are hashed as before and nothing assigns their fields.
@dataclass(slots=True, unsafe_hash=True)
class IndexEntry:
    """Offsets [base_offset, last_offset] of one partition live in this slice of one object."""

    base_offset: int
    last_offset: int  # inclusive
    object_key: str
    object_type: ObjectType
    start: int
    size: int
    max_timestamp: int

    @property
    def record_count(self) -> int:
        return self.last_offset - self.base_offset + 1


@dataclass(slots=True, unsafe_hash=True)
class Append:
    """The records of one produce partition inside a WAL object, to be given offsets."""

    topic_id: uuid.UUID
    partition: int
    start: int  # byte position within the object
    size: int
    record_count: int
    max_timestamp: int
    producer_id: int = -1  # -1: not idempotent, no sequence checks
    producer_epoch: int = -1
    base_sequence: int = -1
    transactional: bool = False  # the batches belong to the producer's open transaction on the partition
    control: int = NOT_CONTROL  # a transaction marker ends that transaction: ABORT_MARKER or COMMIT_MARKER
    # A transactional batch's guard (sequencer.ProducerState.last_marker): the producer's last
    # marker offset on the partition as the broker saw it before verifying the batch; stored only
    # if no marker came since. A marker's: the first offset of the open transaction it ends (the
    # sweep's abort of a hanging one, which has no generation to name it by); applied only to
    # that one. None: no guard (the broker's own writes, tests).
    txn_guard: int | None = None
    # The coordinator's generation of the transaction a marker ends, or that a transactional batch
    # was verified for (sequencer.ProducerState.txn_generation); -1: unnamed.
    txn_generation: int = -1


@dataclass(frozen=True, slots=True)
class ObjectCommit:
    """One WAL object and the appends it holds, in object order (a partition's appends are
    adjacent, in arrival order)."""

    object_key: str
    object_size: int
    appends: tuple[Append, ...]


@dataclass(slots=True, unsafe_hash=True)
class AppendResult:
    """The answer for one Append. error_code 0: stored (or a retried duplicate, answered with the
    offset it was first stored at); otherwise a Kafka error code and base_offset -1."""

    error_code: int
    base_offset: int = -1
    log_start_offset: int = 0
    duplicate: bool = False


@dataclass(frozen=True, slots=True, order=True)
class AbortedTransaction:
    """A transaction a producer aborted on one partition: its records lie in [first_offset,
    last_offset], the last being the abort marker's offset. Read-committed fetches return those
    their range meets, for clients to skip that producer's batches there (Kafka's aborted
    transaction index)."""

    last_offset: int
    first_offset: int
    producer_id: int


@dataclass(frozen=True, slots=True, order=True)
class CommittedTransaction:
    """A transaction a producer committed on one partition: its records lie in [first_offset,
    last_offset], the last being the commit marker's offset; `generation` names it (the
    coordinator's count of its transactional id's transactions, -1: unnamed), so that its records
    on every partition are known together. Kept while its marker is in a WAL entry: the compactor
    takes a transaction into the table on all its partitions in one cycle or on none."""

    last_offset: int
    first_offset: int
    producer_id: int
    generation: int

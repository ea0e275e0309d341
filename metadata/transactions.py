"""One transactional id's transaction state, as the metadata store keeps it (one of its
compare-and-write items, `MetadataStore.registry_*`): the value every step of the broker's
transaction coordinator (broker/transactions/coordinator.py) reads and replaces by
compare-and-write, so that whichever broker takes the next step starts from the last durable one;
and that the compactor reads to keep a transaction's partitions out of a snapshot while its
markers are being written (`ending_partitions`).

The states are Kafka's (TransactionState.scala): Empty (a producer id, no transaction yet),
Ongoing (partitions or a group added), PrepareCommit / PrepareAbort (the outcome decided and
durable, the markers being written), CompleteCommit / CompleteAbort (markers written; the next
transaction may begin)."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import quote, unquote

# The metadata store's compare-and-write items of transactions: one per transactional id, the id
# quoted whole (any string a client sends makes one key of its own, never a path).
KEY_PREFIX = "transactions/"


def key_of(transactional_id: str) -> str:
    return KEY_PREFIX + quote(transactional_id, safe="")


def id_of(key: str) -> str:
    return unquote(key[len(KEY_PREFIX) :])


class Status(enum.StrEnum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        return self in (Status.PREPARE_COMMIT, Status.PREPARE_ABORT)

    @property
    def complete(self) -> bool:
        return self in (Status.EMPTY, Status.COMPLETE_COMMIT, Status.COMPLETE_ABORT)


@dataclass(frozen=True, slots=True)
class PendingOffset:
    """An offset a transaction commits for a group when it commits (TxnOffsetCommit)."""

    group: str
    topic_id: str  # hex
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = None


@dataclass(frozen=True, slots=True)
class Transaction:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    status: Status = Status.EMPTY
    # (topic id hex, partition), in the order added: where the markers go
    partitions: tuple[tuple[str, int], ...] = ()
    groups: tuple[str, ...] = ()  # AddOffsetsToTxn's groups
    offsets: tuple[PendingOffset, ...] = ()  # the last of each (group, partition) counts
    started_ms: int = -1  # when it became Ongoing; -1 when not
    updated_ms: int = 0
    # The epoch the producer held before the coordinator bumped it to fence a zombie or abort a
    # timed-out transaction: that producer may still init again with it (KIP-360); -1: none.
    previous_epoch: int = -1
    # How many transactions the id has begun: the name of the open (or last) one, carried by the
    # batch that opens it on a partition and by its markers (metadata/sequencer.py), so that a
    # late marker or a late batch of one transaction never ends or joins another.
    generation: int = 0
    extra: dict = field(default_factory=dict, compare=False)  # fields of a newer version, kept as read

    def with_(self, **changes) -> Transaction:
        return replace(self, **changes)

    def encode(self) -> bytes:
        return json.dumps(
            {
                **self.extra,
                "pid": self.producer_id,
                "epoch": self.producer_epoch,
                "timeout_ms": self.timeout_ms,
                "status": str(self.status),
                "partitions": [list(p) for p in self.partitions],
                "groups": list(self.groups),
                "offsets": [[o.group, o.topic_id, o.partition, o.offset, o.leader_epoch, o.metadata] for o in self.offsets],
                "started_ms": self.started_ms,
                "updated_ms": self.updated_ms,
                "previous_epoch": self.previous_epoch,
                "generation": self.generation,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Transaction:
        d = json.loads(raw)
        known = ("pid", "epoch", "timeout_ms", "status", "partitions", "groups", "offsets", "started_ms", "updated_ms", "previous_epoch", "generation")
        return cls(
            producer_id=d["pid"],
            producer_epoch=d["epoch"],
            timeout_ms=d["timeout_ms"],
            status=Status(d["status"]),
            partitions=tuple((t, p) for t, p in d.get("partitions", ())),
            groups=tuple(d.get("groups", ())),
            offsets=tuple(PendingOffset(*o) for o in d.get("offsets", ())),
            started_ms=d.get("started_ms", -1),
            updated_ms=d.get("updated_ms", 0),
            previous_epoch=d.get("previous_epoch", -1),
            generation=d.get("generation", 0),
            extra={k: v for k, v in d.items() if k not in known},
        )


def ending_partitions(before: Mapping[str, tuple[bytes, int]], after: Mapping[str, tuple[bytes, int]]) -> set[tuple[str, int]]:
    """The partitions (topic id hex, partition) whose view may hold only some of a transaction's
    markers, given the stored transactions (value, revision by transactional id) read `before`
    and `after` a reading of the view that reflects at least what `before` saw: those of every
    transaction deciding in either read (its markers being written), or that changed between them
    (it may have decided and completed in between). A transaction's decision is stored before its
    first marker and its completion after its last, so one whose markers the view holds only in
    part is one of these."""
    ending: set[tuple[str, int]] = set()
    for transactional_id in before.keys() | after.keys():
        old, new = before.get(transactional_id), after.get(transactional_id)
        changed = old is None or new is None or old[1] != new[1]
        for raw, _ in [read for read in (old, new) if read is not None]:
            txn = Transaction.decode(raw)
            if changed or txn.status.preparing:
                ending.update(txn.partitions)
    return ending

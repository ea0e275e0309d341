"""The etcd store's key layout (`_Keys`, laid out in the package's docstring), the codecs of the
values under it, and the etcd limits a transaction is cut to fit."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote

import orjson  # the values every broker decodes per partition-append it follows: 7x faster than json here

from ..model import AbortedTransaction, CommittedTransaction, IndexEntry, ObjectType, TopicInfo
from ..sequencer import BatchSequence, ProducerState
from ..view import OBJECT_TYPES

MAX_OPS = 120  # etcd's default --max-txn-ops is 128 per branch; keep headroom
PARTITIONS_PER_TXN = MAX_OPS - 2  # a commit transaction's branches: an operation per partition, two more
MAX_TXN_BYTES = 1024 * 1024  # etcd's default --max-request-bytes is 1.5 MiB
PRODUCERS_PER_TXN = MAX_OPS - 4  # one partition's producers in one transaction: its head, topic, fence and record besides


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
        """A per-entry index key: a range replace's entry (compaction), which stands for every
        offset it covers, whatever wal-index records still hold for them. (Versions before
        wal-index records wrote every entry this way; those are read as such.)"""
        return f"/{self.root}/index/{topic_id.hex}/{partition:06d}/{base_offset:020d}".encode()

    def producer(self, topic_id: uuid.UUID, partition: int, producer_id: int) -> bytes:
        """One idempotent producer's state on one partition (`encode_producer`)."""
        return f"/{self.root}/producers/{topic_id.hex}/{partition:06d}/{producer_id}".encode()

    def partition_index(self, topic_id: uuid.UUID, partition: int) -> bytes:
        """The prefix of one partition's per-entry index keys."""
        return f"/{self.root}/index/{topic_id.hex}/{partition:06d}/".encode()

    def wal_indexes(self, object_key: str) -> bytes:
        """The prefix of the wal-index records of one WAL object (one per commit transaction)."""
        return f"/{self.root}/wal-index/{object_key}/".encode()

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

    def leader(self, name: str) -> bytes:
        """A named leadership's key: its holder, on the holder's lease (`leaders.py`)."""
        return f"/{self.root}/leaders/{quote(name, safe='')}".encode()

    def producer_epoch(self, producer_id: int) -> bytes:
        return f"/{self.root}/producer-epochs/{producer_id}".encode()

    def registry(self, key: str) -> bytes:
        """One item of the schema registry (its own layout below this prefix: registry/store.py)."""
        return f"/{self.root}/registry/{key}".encode()

    def security(self, key: str) -> bytes:
        """One item of the security family (credentials, ACLs: `security.py`)."""
        return f"/{self.root}/security/{key}".encode()

    @property
    def producer_ids(self) -> bytes:
        return f"/{self.root}/producer-ids".encode()

    def prefix(self, kind: str = "") -> bytes:
        return f"/{self.root}/{kind}".encode()


def encode_wal_index(
    object_key: str,
    entries: Mapping[tuple[uuid.UUID, int], list[IndexEntry]],
    aborted: Mapping[tuple[uuid.UUID, int], list[AbortedTransaction]] | None = None,
    committed: Mapping[tuple[uuid.UUID, int], list[CommittedTransaction]] | None = None,
) -> bytes:
    """A wal-index record, the entries of one commit transaction, all in the WAL object
    `object_key`: `[object key, [[topic id hex, [[partition:06d, base offset, last offset, start,
    size, max timestamp], ...]], ...]]`. The partition is a string, so that a topic's id and it
    join into the partition's path (`_Keys.partition_path`) without formatting a number. When the
    commit's abort markers aborted transactions, a third element lists them: `[[partition path,
    marker offset, first offset, producer id], ...]` (they live as long as the record: until
    compaction has replaced every entry of it, and the aborted records with them); when its commit
    markers committed some, a fourth lists those: `[[partition path, marker offset, first offset,
    producer id, generation], ...]`."""
    by_topic: dict[uuid.UUID, list[str]] = {}
    for (topic_id, partition), partition_entries in entries.items():
        rows = by_topic.get(topic_id)
        if rows is None:
            rows = by_topic[topic_id] = []
        for e in partition_entries:
            rows.append(f'["{partition:06d}",{e.base_offset:d},{e.last_offset:d},{e.start:d},{e.size:d},{e.max_timestamp:d}]')
    topics = ",".join(f'["{topic_id.hex}",[{",".join(rows)}]]' for topic_id, rows in by_topic.items())
    if aborted or committed:
        txns = ",".join(f'["{topic_id.hex}/{partition:06d}",{a.last_offset:d},{a.first_offset:d},{a.producer_id:d}]' for (topic_id, partition), txns in (aborted or {}).items() for a in txns)
        if committed:
            ended = ",".join(f'["{topic_id.hex}/{partition:06d}",{c.last_offset:d},{c.first_offset:d},{c.producer_id:d},{c.generation:d}]' for (topic_id, partition), txns in committed.items() for c in txns)
            return f"[{json.dumps(object_key)},[{topics}],[{txns}],[{ended}]]".encode()
        return f"[{json.dumps(object_key)},[{topics}],[{txns}]]".encode()
    return f"[{json.dumps(object_key)},[{topics}]]".encode()


def decode_wal_index(raw: bytes) -> tuple[str, list[tuple[str, IndexEntry]]]:
    """The object key and the (partition path, entry) pairs of a wal-index record."""
    key, topics, *_aborted = orjson.loads(raw)
    wal = ObjectType.WAL
    return key, [(topic + "/" + partition, IndexEntry(base, last, key, wal, start, size, max_ts)) for topic, rows in topics for partition, base, last, start, size, max_ts in rows]


def encode_producer(state: ProducerState, last_used_ms: int) -> bytes:
    """A producer key's value: `[epoch, [[first seq, last seq, base offset] x<=5], last used ms]`,
    then the first offset of its open transaction (-1: none), its last marker's offset and its
    transaction's generation, as far as any is known."""
    if state.txn_generation >= 0:
        return orjson.dumps([state.epoch, [list(b) for b in state.batches], last_used_ms, state.txn_first_offset, state.last_marker, state.txn_generation])
    if state.last_marker >= 0:
        return orjson.dumps([state.epoch, [list(b) for b in state.batches], last_used_ms, state.txn_first_offset, state.last_marker])
    if state.txn_first_offset >= 0:
        return orjson.dumps([state.epoch, [list(b) for b in state.batches], last_used_ms, state.txn_first_offset])
    return orjson.dumps([state.epoch, [list(b) for b in state.batches], last_used_ms])


def decode_producer(raw: bytes) -> tuple[ProducerState, int]:
    """A producer key's state and last-used time."""
    epoch, batches, used, *txn = orjson.loads(raw)
    return ProducerState(epoch, tuple(BatchSequence(*b) for b in batches), *txn), used


def encode_entry(entry: IndexEntry) -> bytes:
    """A per-entry index key's value: `[last offset, object key, type, start, size, max timestamp]`."""
    return orjson.dumps([entry.last_offset, entry.object_key, int(entry.object_type), entry.start, entry.size, entry.max_timestamp])


def _decode_entry(base: int, raw: bytes) -> IndexEntry:
    last, key, kind, start, size, max_ts = orjson.loads(raw)
    return IndexEntry(base, last, key, OBJECT_TYPES[kind], start, size, max_ts)


def _split_key(key: bytes) -> tuple[str, str]:
    """A key's kind (its family: "topics", "heads", ...) and the rest of it after the root."""
    parts = key.decode().split("/", 3)  # "", root, kind, rest
    return (parts[2], parts[3]) if len(parts) == 4 else (parts[-1], "")


def _encode_topic(info: TopicInfo) -> bytes:
    return json.dumps({"id": info.topic_id.hex, "partitions": info.partitions, "configs": info.configs}).encode()


def _decode_topic(name: str, raw: bytes) -> TopicInfo:
    d = json.loads(raw)
    return TopicInfo(name, uuid.UUID(hex=d["id"]), d["partitions"], d.get("configs", {}))


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])

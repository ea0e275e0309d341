"""A compaction cycle's manifest: for each Kafka partition the cycle compacted, the WAL byte ranges
(index entries) it replaced and where its rows now are in the table (Parquet files and row
ranges). The compactor writes it before its Iceberg commit and names it in the snapshot's summary;
the PARQUET index entry of each partition names it. So a restarted compactor finds what to swap,
and the read path finds a compacted partition's data.

The PARQUET entry's byte range is a range of the manifest's *replaced bytes*: the replaced WAL
ranges of every partition laid end to end in manifest order, each partition's taking
`partition_range(p)`. `resolve` maps such a range back to WAL byte ranges, so a read of a
compacted entry returns exactly the record batches that were produced (and the byte sizes the
index reports, for fetch budgets and retention, stay those of the records). Serving compacted
offsets from the Parquet files instead, and deleting the WAL objects, is the next step; until then
the WAL objects a manifest names are kept (`wal_objects`, the orphan sweeper's business).

A partition's rows in one file are one run of rows (files are sorted by partition, then offset),
but its offsets may be spread over several files (one per partition-spec value, e.g. a day of the
record timestamps, which Kafka does not keep in order): a reader of the rows merges by offset.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

FORMAT_VERSION = 1
PREFIX = "compacted/"
REMOVED_PREFIX = "removed/"


@dataclass(frozen=True, slots=True)
class WalRange:
    """One replaced WAL index entry: offsets [base_offset, last_offset] at bytes [start, start + size)
    of a WAL object."""

    object_key: str
    start: int
    size: int
    base_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class FileSlice:
    """The rows of one Kafka partition in one Parquet file: rows [first_row, first_row + rows)."""

    path: str
    first_row: int
    rows: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class Removal:
    """Offsets of one Kafka partition whose rows a compacted topic's cycles removed from its table:
    rows [first_row, first_row + rows) of the removal object `key` (removal_key), each an offset
    and the time (ms) from which Kafka readers no longer see it: 0 at once (a record a newer one of
    its key superseded), or a tombstone's end of `delete.retention.ms`."""

    key: str
    first_row: int
    rows: int


@dataclass(frozen=True, slots=True)
class PartitionCompaction:
    """What one cycle did to one Kafka partition: `replaced` (consecutive WAL entries, exactly as the
    index held them) became the rows in `slices`. A compacted topic's part also names the
    `removed` offsets (of its own rows or of rows before them) its readers skip."""

    partition: int
    replaced: tuple[WalRange, ...]
    slices: tuple[FileSlice, ...]
    removed: tuple[Removal, ...] = ()

    @property
    def first_offset(self) -> int:
        return self.replaced[0].base_offset

    @property
    def last_offset(self) -> int:
        return self.replaced[-1].last_offset

    @property
    def max_timestamp(self) -> int:
        return max(r.max_timestamp for r in self.replaced)

    @property
    def size(self) -> int:
        return sum(r.size for r in self.replaced)


@dataclass(frozen=True, slots=True)
class CycleManifest:
    cycle_id: str
    topic_id: uuid.UUID
    topic: str
    table: str  # "namespace.name" in the catalog
    partitions: tuple[PartitionCompaction, ...]

    @property
    def key(self) -> str:
        """The object-store key it is written under (never overwritten: a cycle id is a uuid)."""
        return manifest_key(self.topic_id, self.cycle_id)

    def offsets(self) -> dict[int, tuple[int, int]]:
        """Partition -> (first offset, last offset) the cycle covers."""
        return {p.partition: (p.first_offset, p.last_offset) for p in self.partitions}

    def partition_range(self, partition: int) -> tuple[int, int]:
        """(start, size) of `partition`'s replaced bytes: the byte range its PARQUET entry names."""
        start = 0
        for p in self.partitions:
            if p.partition == partition:
                return start, p.size
            start += p.size
        raise KeyError(partition)

    def resolve(self, start: int, size: int) -> list[tuple[str, int, int]]:
        """The WAL byte ranges (object key, start, size), in order, holding replaced bytes
        [start, start + size). Raises ValueError for a range beyond them."""
        end = start + size
        out = []
        at = 0
        for p in self.partitions:
            for r in p.replaced:
                lo, hi = max(start, at), min(end, at + r.size)
                if lo < hi:
                    out.append((r.object_key, r.start + lo - at, hi - lo))
                at += r.size
        if end > at or start < 0:
            raise ValueError(f"bytes {start}-{end} of manifest {self.key}, which replaces {at}")
        return out

    def wal_objects(self) -> set[str]:
        """The WAL objects the manifest replaced (a compacted topic's merged part names none: the
        manifests it merged named them)."""
        return {r.object_key for p in self.partitions for r in p.replaced if r.object_key}

    def encode(self) -> bytes:
        doc = {
            "version": FORMAT_VERSION,
            "cycle": self.cycle_id,
            "topic_id": str(self.topic_id),
            "topic": self.topic,
            "table": self.table,
            "partitions": [
                {
                    "partition": p.partition,
                    "replaced": [[r.object_key, r.start, r.size, r.base_offset, r.last_offset, r.max_timestamp] for r in p.replaced],
                    "slices": [[s.path, s.first_row, s.rows, s.first_offset, s.last_offset] for s in p.slices],
                    **({"removed": [[r.key, r.first_row, r.rows] for r in p.removed]} if p.removed else {}),
                }
                for p in self.partitions
            ],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes | memoryview) -> CycleManifest:
        doc = json.loads(bytes(data))
        if doc.get("version") != FORMAT_VERSION:
            raise ValueError(f"cycle manifest version {doc.get('version')!r}, this neve reads {FORMAT_VERSION}")
        return cls(
            cycle_id=doc["cycle"],
            topic_id=uuid.UUID(doc["topic_id"]),
            topic=doc["topic"],
            table=doc["table"],
            partitions=tuple(
                PartitionCompaction(
                    p["partition"], tuple(WalRange(*r) for r in p["replaced"]), tuple(FileSlice(*s) for s in p["slices"]), tuple(Removal(*r) for r in p.get("removed", ()))
                )
                for p in doc["partitions"]
            ),
        )


def manifest_key(topic_id: uuid.UUID, cycle_id: str) -> str:
    return f"{PREFIX}{topic_id}/{cycle_id}.json"


def removal_key(topic_id: uuid.UUID, name: str) -> str:
    """Where a compacted topic's removal object `name` is stored (never overwritten)."""
    return f"{REMOVED_PREFIX}{topic_id}/{name}.arrow"


def is_manifest(key: str) -> bool:
    return key.startswith(PREFIX)


def new_cycle_id() -> str:
    return uuid.uuid4().hex

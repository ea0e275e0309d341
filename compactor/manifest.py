"""A compaction cycle's manifest: for each Kafka partition the cycle compacted, the WAL index entries
it replaces and where its rows now are (Parquet files and row ranges). Written to the object store
before the Iceberg commit and named in that snapshot's summary, it is the PARQUET index entry's
object: a Kafka read of compacted offsets finds its files here, and a compactor restarted between
the Iceberg commit and the index swap finds here what to swap.

A partition's rows in a file are one run of rows (files are sorted by partition, then offset), but
one partition's offsets may be spread over several files (one per partition-spec value, e.g. a day
of the record timestamps, which Kafka does not keep in order): a reader merges them by offset.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from metadata.model import IndexEntry, ObjectType

FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class FileSlice:
    """The rows of one Kafka partition in one Parquet file: rows [first_row, first_row + rows)."""

    path: str
    first_row: int
    rows: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class PartitionCompaction:
    """What one cycle did to one Kafka partition: `replaced` (consecutive WAL entries, exactly as the
    index held them) became the rows in `slices`. Offsets of `replaced` without a row are the
    offsets no record holds (a batch's offset range is whole; none are skipped today)."""

    partition: int
    replaced: tuple[IndexEntry, ...]
    slices: tuple[FileSlice, ...]

    @property
    def first_offset(self) -> int:
        return self.replaced[0].base_offset

    @property
    def last_offset(self) -> int:
        return self.replaced[-1].last_offset

    @property
    def max_timestamp(self) -> int:
        return max(e.max_timestamp for e in self.replaced)


@dataclass(frozen=True, slots=True)
class CycleManifest:
    cycle_id: str
    topic_id: uuid.UUID
    topic: str
    table: str  # "namespace.name" in the catalog
    partitions: tuple[PartitionCompaction, ...]

    @property
    def key(self) -> str:
        """The object-store key the manifest is written under (never overwritten: a cycle id is a uuid)."""
        return manifest_key(self.topic_id, self.cycle_id)

    def offsets(self) -> dict[int, tuple[int, int]]:
        """Partition -> (first offset, last offset) the cycle covers: what the snapshot summary records."""
        return {p.partition: (p.first_offset, p.last_offset) for p in self.partitions}

    def replacement(self, part: PartitionCompaction, size: int) -> IndexEntry:
        """The PARQUET index entry standing for `part`'s offsets: this manifest's object, whole."""
        return IndexEntry(part.first_offset, part.last_offset, self.key, ObjectType.PARQUET, 0, size, part.max_timestamp)

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
                    "replaced": [[e.base_offset, e.last_offset, e.object_key, int(e.object_type), e.start, e.size, e.max_timestamp] for e in p.replaced],
                    "slices": [[s.path, s.first_row, s.rows, s.first_offset, s.last_offset] for s in p.slices],
                }
                for p in self.partitions
            ],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> CycleManifest:
        doc = json.loads(data)
        if doc.get("version") != FORMAT_VERSION:
            raise ValueError(f"cycle manifest version {doc.get('version')!r}, this neve reads {FORMAT_VERSION}")
        return cls(
            cycle_id=doc["cycle"],
            topic_id=uuid.UUID(doc["topic_id"]),
            topic=doc["topic"],
            table=doc["table"],
            partitions=tuple(
                PartitionCompaction(
                    partition=p["partition"],
                    replaced=tuple(IndexEntry(base, last, key, ObjectType(kind), start, size, ts) for base, last, key, kind, start, size, ts in p["replaced"]),
                    slices=tuple(FileSlice(*s) for s in p["slices"]),
                )
                for p in doc["partitions"]
            ),
        )


def manifest_key(topic_id: uuid.UUID, cycle_id: str) -> str:
    return f"compacted/{topic_id}/{cycle_id}.json"


def new_cycle_id() -> str:
    return uuid.uuid4().hex

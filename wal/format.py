"""The WAL object format: one immutable object per flush, holding record batches of many partitions.

Layout (integers big-endian):

    header   8 B   magic b"NEVW" · version u16 (=1) · flags u16 (=0)
    sections       the stored batches, grouped per partition, sorted by (topic id bytes, partition);
                   within a partition, chunks keep the order they were added in
    footer         u32 section count, then per section 48 B:
                   topic id 16 B · partition i32 · start u64 · length u32 · batch count u32 ·
                   record count u32 · max timestamp i64 · crc32c u32 of the section bytes
    trailer 16 B   footer length u32 · footer crc32c u32 · version u16 · flags u16 · magic b"NEVW"

The trailer has a fixed size so a reader can fetch it (and then the footer) with ranged GETs. A
new version bumps `version`; readers reject versions they do not know.
"""

# IMPLEMENTATION PENDING (helper): see the function docstrings for the contract.

from __future__ import annotations

import uuid
from dataclasses import dataclass

MAGIC = b"NEVW"
VERSION = 1
HEADER_SIZE = 8
TRAILER_SIZE = 16
SECTION_ENTRY_SIZE = 48


class CorruptObject(ValueError):
    """The bytes are not a valid WAL object of a known version (bad magic, checksum or bounds)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """The records of one produce partition, as appended by the flush pipeline."""

    topic_id: uuid.UUID
    partition: int
    data: bytes
    batch_count: int
    record_count: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class Section:
    topic_id: uuid.UUID
    partition: int
    start: int
    length: int
    batch_count: int
    record_count: int
    max_timestamp: int
    crc: int


@dataclass(frozen=True, slots=True)
class EncodedObject:
    data: bytes
    sections: list[Section]
    chunk_starts: list[int]  # byte position of chunks[i] within data, in the order given


def encode(chunks: list[Chunk]) -> EncodedObject:
    """Build one object from chunks given in arrival order (sorted stably into sections)."""
    raise NotImplementedError


def decode_footer(data: bytes | memoryview, object_size: int | None = None) -> list[Section]:
    """Sections of a whole object (`object_size=None`), or of a tail of it: then `data` is the
    last len(data) bytes of an object of `object_size` bytes and must include footer and trailer
    (raise CorruptObject naming the needed tail length if it does not). Checks magic, version,
    footer checksum and section bounds."""
    raise NotImplementedError


def verify(data: bytes | memoryview) -> list[Section]:
    """decode_footer plus the crc32c of every section; raises CorruptObject."""
    raise NotImplementedError

"""The WAL object format: one immutable object per flush, holding record batches of many partitions.

Layout (integers big-endian):

    header   8 B   magic b"NEVW" · version u16 (=1) · flags u16 (=0)
    sections       the stored batches, grouped per partition, sorted by (topic id bytes, partition);
                   within a partition, chunks keep the order they were added in
    footer         u32 section count, then per section 52 B:
                   topic id 16 B · partition i32 · start u64 · length u32 · batch count u32 ·
                   record count u32 · max timestamp i64 · crc32c u32 of the section bytes
    trailer 16 B   footer length u32 · footer crc32c u32 · version u16 · flags u16 · magic b"NEVW"

The trailer has a fixed size so a reader can fetch it (and then the footer) with ranged GETs. A
new version bumps `version`; readers reject versions they do not know. In version 1 the sections
tile the bytes between header and footer exactly, which is what lets a reader check them.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from crc32c import crc32c

MAGIC = b"NEVW"
VERSION = 1
HEADER_SIZE = 8
TRAILER_SIZE = 16

_HEADER = struct.Struct(">4sHH")
_COUNT = struct.Struct(">I")
_ENTRY = struct.Struct(">16siQIIIqI")
_TRAILER = struct.Struct(">IIHH4s")
SECTION_ENTRY_SIZE = _ENTRY.size  # 52: the fields listed above (the first draft said 48)
_MAX_U32 = 0xFFFFFFFF


class CorruptObject(ValueError):
    """The bytes are not a valid WAL object of a known version (bad magic, checksum or bounds).

    `needed` is set when the object may be fine but a tail given to decode_footer was too short:
    it is the tail length to fetch instead."""

    def __init__(self, message: str, needed: int | None = None) -> None:
        super().__init__(message)
        self.needed = needed


@dataclass(slots=True, unsafe_hash=True)  # made per batch: not frozen, which costs 4x in __init__ (metadata/model.py)
class Chunk:
    """The records of one produce partition, as appended by the flush pipeline."""

    topic_id: uuid.UUID
    partition: int
    data: bytes
    batch_count: int
    record_count: int
    max_timestamp: int


@dataclass(slots=True, unsafe_hash=True)  # made per batch: not frozen, which costs 4x in __init__ (metadata/model.py)
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
    """An object as the parts it is made of: the header, the chunks' own bytes (not copies) in
    section order, the footer and trailer. It is stored from its parts (ObjectStore.put_parts),
    so it is never joined into one buffer on the write path."""

    parts: list[bytes]
    size: int
    sections: list[Section]
    chunk_starts: list[int]  # byte position of chunks[i] within the object, in the order given

    @property
    def data(self) -> bytes:
        """The object's bytes, joined: a copy, for tests and tools (nothing on the write or read path uses it)."""
        return b"".join(self.parts)


def encode(chunks: list[Chunk]) -> EncodedObject:
    """Build one object from chunks given in arrival order (sorted stably into sections)."""
    # A UUID's 16 big-endian bytes order as its int does; `.bytes` is computed on every access.
    order = sorted(range(len(chunks)), key=lambda i: (chunks[i].topic_id.int, chunks[i].partition))
    parts: list[bytes] = [_HEADER.pack(MAGIC, VERSION, 0)]
    chunk_starts = [0] * len(chunks)
    sections: list[Section] = []
    pos = HEADER_SIZE
    run: list[Chunk] = []  # the chunks of the section being built
    start = crc = 0
    for i in order:
        chunk = chunks[i]
        if run and (chunk.topic_id, chunk.partition) != (run[0].topic_id, run[0].partition):
            sections.append(_section(run, start, pos - start, crc))
            run = []
        if not run:
            start, crc = pos, 0
        run.append(chunk)
        chunk_starts[i] = pos
        # Chained over the section's chunks: each byte is hashed once and never copied for it.
        crc = crc32c(chunk.data, crc)
        parts.append(chunk.data)
        pos += len(chunk.data)
    if run:
        sections.append(_section(run, start, pos - start, crc))
    id_bytes: dict[uuid.UUID, bytes] = {}  # an object's sections share a few topics
    for s in sections:
        if s.topic_id not in id_bytes:
            id_bytes[s.topic_id] = s.topic_id.bytes
    pack = _ENTRY.pack
    footer = b"".join(
        [_COUNT.pack(len(sections)), *(pack(id_bytes[s.topic_id], s.partition, s.start, s.length, s.batch_count, s.record_count, s.max_timestamp, s.crc) for s in sections)]
    )
    parts.append(footer)
    parts.append(_TRAILER.pack(len(footer), crc32c(footer), VERSION, 0, MAGIC))
    return EncodedObject(parts=parts, size=pos + len(footer) + TRAILER_SIZE, sections=sections, chunk_starts=chunk_starts)


def _section(run: list[Chunk], start: int, length: int, crc: int) -> Section:
    first = run[0]
    if len(run) == 1:  # the common case with many partitions: a produce request's one chunk
        batches, records, max_timestamp = first.batch_count, first.record_count, first.max_timestamp
    else:
        batches = sum(c.batch_count for c in run)
        records = sum(c.record_count for c in run)
        max_timestamp = max(c.max_timestamp for c in run)
    # The footer stores these as u32; a flush is far smaller, so overflowing is a caller's bug.
    if length > _MAX_U32 or batches > _MAX_U32 or records > _MAX_U32:
        raise ValueError(f"section {first.topic_id}/{first.partition} overflows a u32 field of the footer")
    return Section(first.topic_id, first.partition, start, length, batches, records, max_timestamp, crc)


def decode_footer(data: bytes | memoryview, object_size: int | None = None) -> list[Section]:
    """Sections of a whole object (`object_size=None`), or of a tail of it: then `data` is the
    last len(data) bytes of an object of `object_size` bytes and must include footer and trailer
    (raise CorruptObject naming the needed tail length if it does not). Checks magic, version,
    footer checksum and section bounds (and the header too when `data` is the whole object)."""
    view = memoryview(data).cast("B")
    have = len(view)
    size = have if object_size is None else object_size
    if have > size:
        raise CorruptObject(f"a tail of {have} bytes cannot come from an object of {size} bytes")
    if size < HEADER_SIZE + _COUNT.size + TRAILER_SIZE:
        raise CorruptObject(f"{size} bytes is too small for a WAL object")
    if have < TRAILER_SIZE:
        raise CorruptObject(f"need at least the last {TRAILER_SIZE} bytes, got {have}", needed=TRAILER_SIZE)
    footer_length, footer_crc, version, flags, magic = _TRAILER.unpack_from(view, have - TRAILER_SIZE)
    if magic != MAGIC:
        raise CorruptObject(f"bad trailer magic {magic!r}")
    if version != VERSION:
        raise CorruptObject(f"unknown WAL object version {version}")
    if flags != 0:
        raise CorruptObject(f"unknown WAL object flags {flags:#x}")
    footer_start = size - TRAILER_SIZE - footer_length
    if footer_length < _COUNT.size or (footer_length - _COUNT.size) % SECTION_ENTRY_SIZE or footer_start < HEADER_SIZE:
        raise CorruptObject(f"footer length {footer_length} does not fit an object of {size} bytes")
    needed = footer_length + TRAILER_SIZE
    if have < needed:
        raise CorruptObject(f"need the last {needed} bytes for footer and trailer, got {have}", needed=needed)
    footer = view[have - needed : have - TRAILER_SIZE]
    if crc32c(footer) != footer_crc:
        raise CorruptObject("footer checksum mismatch")
    (count,) = _COUNT.unpack_from(footer, 0)
    if _COUNT.size + count * SECTION_ENTRY_SIZE != footer_length:
        raise CorruptObject(f"footer of {footer_length} bytes cannot hold {count} sections")
    if have == size:
        _check_header(view, version)
    sections = []
    expected_start = HEADER_SIZE
    for i in range(count):
        topic, partition, start, length, batches, records, max_ts, crc = _ENTRY.unpack_from(footer, _COUNT.size + i * SECTION_ENTRY_SIZE)
        if start != expected_start:
            raise CorruptObject(f"section {i} starts at {start}, expected {expected_start}")
        expected_start = start + length
        sections.append(Section(uuid.UUID(bytes=topic), partition, start, length, batches, records, max_ts, crc))
    if expected_start != footer_start:
        raise CorruptObject(f"sections end at {expected_start}, the footer starts at {footer_start}")
    return sections


def _check_header(view: memoryview, trailer_version: int) -> None:
    magic, version, flags = _HEADER.unpack_from(view, 0)
    if magic != MAGIC or version != trailer_version or flags != 0:
        raise CorruptObject(f"bad header {bytes(view[:HEADER_SIZE])!r}")


def verify(data: bytes | memoryview) -> list[Section]:
    """decode_footer plus the crc32c of every section; raises CorruptObject."""
    view = memoryview(data).cast("B")
    sections = decode_footer(view)
    for s in sections:
        if crc32c(view[s.start : s.start + s.length]) != s.crc:
            raise CorruptObject(f"section {s.topic_id}/{s.partition} at {s.start} fails its checksum")
    return sections

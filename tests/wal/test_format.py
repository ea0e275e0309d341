"""wal.format: WAL objects round-trip, sort their sections, and detect every corruption they claim to."""

from __future__ import annotations

import struct
import uuid

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from wal.format import (
    HEADER_SIZE,
    MAGIC,
    SECTION_ENTRY_SIZE,
    TRAILER_SIZE,
    VERSION,
    Chunk,
    CorruptObject,
    Section,
    decode_footer,
    encode,
    verify,
)

TOPIC_A = uuid.UUID("00000000-0000-0000-0000-00000000000a")
TOPIC_B = uuid.UUID("ffffffff-0000-0000-0000-000000000000")


def chunk(topic, partition, data, batches=1, records=1, max_ts=0) -> Chunk:
    return Chunk(topic, partition, data, batches, records, max_ts)


CHUNKS = [
    chunk(TOPIC_B, 0, b"b0-first", 1, 3, 300),
    chunk(TOPIC_A, 2, b"a2", 2, 5, 100),
    chunk(TOPIC_B, 0, b"b0-second!", 1, 4, 250),
    chunk(TOPIC_A, 1, b"a1-only", 1, 1, 50),
    chunk(TOPIC_A, 2, b"a2-again", 3, 6, 700),
]


def test_sections_are_sorted_and_chunks_keep_their_order():
    obj = encode(CHUNKS)
    body = b"a1-only" + b"a2" + b"a2-again" + b"b0-first" + b"b0-second!"
    assert obj.data[:HEADER_SIZE] == MAGIC + struct.pack(">HH", VERSION, 0)
    assert obj.data[HEADER_SIZE : HEADER_SIZE + len(body)] == body
    assert obj.sections == [
        Section(TOPIC_A, 1, 8, 7, 1, 1, 50, crc32c(b"a1-only")),
        Section(TOPIC_A, 2, 15, 10, 5, 11, 700, crc32c(b"a2a2-again")),
        Section(TOPIC_B, 0, 25, 18, 2, 7, 300, crc32c(b"b0-firstb0-second!")),
    ]
    assert obj.chunk_starts == [25, 15, 33, 8, 17]
    for c, start in zip(CHUNKS, obj.chunk_starts, strict=True):
        assert obj.data[start : start + len(c.data)] == c.data
    # stored from its parts: the chunks' own bytes (never copies) between header and footer
    assert obj.size == len(obj.data) == sum(len(p) for p in obj.parts)
    assert [id(p) for p in obj.parts[1:-2]] == [id(CHUNKS[i].data) for i in (3, 1, 4, 0, 2)]


def test_sections_sort_by_topic_id_bytes_then_partition():
    low, high = uuid.UUID(int=1), uuid.UUID(int=2**127)
    obj = encode([chunk(high, 0, b"x"), chunk(low, 10, b"y"), chunk(low, 9, b"z"), chunk(low, -1, b"w")])
    assert [(s.topic_id, s.partition) for s in obj.sections] == [(low, -1), (low, 9), (low, 10), (high, 0)]


def test_object_sizes_are_exact():
    obj = encode(CHUNKS)
    assert SECTION_ENTRY_SIZE == 52
    assert len(obj.data) == HEADER_SIZE + 35 + 4 + 3 * SECTION_ENTRY_SIZE + TRAILER_SIZE
    footer_length, footer_crc, version, flags, magic = struct.unpack(">IIHH4s", obj.data[-TRAILER_SIZE:])
    assert (footer_length, version, flags, magic) == (4 + 3 * 52, VERSION, 0, MAGIC)
    assert footer_crc == crc32c(obj.data[-TRAILER_SIZE - footer_length : -TRAILER_SIZE])


def test_an_object_without_chunks_round_trips():
    obj = encode([])
    assert (obj.sections, obj.chunk_starts, len(obj.data)) == ([], [], HEADER_SIZE + 4 + TRAILER_SIZE)
    assert verify(obj.data) == []


def test_decode_footer_and_verify_return_the_encoded_sections():
    obj = encode(CHUNKS)
    assert decode_footer(obj.data) == obj.sections
    assert decode_footer(memoryview(obj.data)) == obj.sections
    assert verify(obj.data) == obj.sections


def test_decode_footer_from_a_tail():
    obj = encode(CHUNKS)
    needed = 4 + 3 * SECTION_ENTRY_SIZE + TRAILER_SIZE
    for tail_length in (needed, needed + 1, len(obj.data)):
        assert decode_footer(obj.data[-tail_length:], len(obj.data)) == obj.sections


def test_a_short_tail_names_the_length_it_needs():
    obj = encode(CHUNKS)
    needed = 4 + 3 * SECTION_ENTRY_SIZE + TRAILER_SIZE
    with pytest.raises(CorruptObject) as info:
        decode_footer(obj.data[-TRAILER_SIZE:], len(obj.data))
    assert (str(info.value), info.value.needed) == (f"need the last {needed} bytes for footer and trailer, got {TRAILER_SIZE}", needed)
    with pytest.raises(CorruptObject) as info:
        decode_footer(obj.data[-needed + 1 :], len(obj.data))
    assert info.value.needed == needed
    with pytest.raises(CorruptObject) as info:
        decode_footer(obj.data[-3:], len(obj.data))
    assert info.value.needed == TRAILER_SIZE


def test_a_tail_longer_than_the_object_is_rejected():
    obj = encode(CHUNKS)
    with pytest.raises(CorruptObject):
        decode_footer(obj.data, len(obj.data) - 1)


def test_every_footer_or_trailer_byte_is_protected():
    obj = encode(CHUNKS)
    footer_start = len(obj.data) - TRAILER_SIZE - 4 - 3 * SECTION_ENTRY_SIZE
    for position in range(footer_start, len(obj.data)):
        for flip in (0x01, 0x80, 0xFF):
            data = bytearray(obj.data)
            data[position] ^= flip
            with pytest.raises(CorruptObject):
                decode_footer(bytes(data))
            with pytest.raises(CorruptObject):  # and from a tail, where the header is out of reach
                decode_footer(bytes(data[footer_start - 5 :]), len(data))


def test_every_header_byte_is_checked_in_a_whole_object():
    obj = encode(CHUNKS)
    for position in range(HEADER_SIZE):
        data = bytearray(obj.data)
        data[position] ^= 0x01
        with pytest.raises(CorruptObject):
            decode_footer(bytes(data))


def test_every_section_byte_is_checked_by_verify():
    obj = encode(CHUNKS)
    for position in range(HEADER_SIZE, obj.sections[-1].start + obj.sections[-1].length):
        data = bytearray(obj.data)
        data[position] ^= 0x04
        assert decode_footer(bytes(data)) == obj.sections  # the footer alone cannot see it
        with pytest.raises(CorruptObject, match="fails its checksum"):
            verify(bytes(data))


def _with_trailer(data: bytes, version: int = VERSION, flags: int = 0) -> bytes:
    footer_length, footer_crc = struct.unpack(">II", data[-TRAILER_SIZE : -TRAILER_SIZE + 8])
    return data[:-TRAILER_SIZE] + struct.pack(">IIHH4s", footer_length, footer_crc, version, flags, MAGIC)


@pytest.mark.parametrize("version", [0, 2, 0xFFFF])
def test_unknown_versions_are_rejected(version):
    data = _with_trailer(encode(CHUNKS).data, version=version)
    with pytest.raises(CorruptObject, match=f"unknown WAL object version {version}"):
        decode_footer(data)


def test_unknown_flags_are_rejected():
    with pytest.raises(CorruptObject, match="unknown WAL object flags 0x1"):
        decode_footer(_with_trailer(encode(CHUNKS).data, flags=1))


def test_sections_outside_the_object_are_rejected_even_with_a_good_checksum():
    obj = encode([chunk(TOPIC_A, 0, b"abc")])
    footer = struct.pack(">I", 1) + struct.pack(">16siQIIIqI", TOPIC_A.bytes, 0, 8, 4, 1, 1, 0, crc32c(b"abc"))
    forged = obj.data[:11] + footer + struct.pack(">IIHH4s", len(footer), crc32c(footer), VERSION, 0, MAGIC)
    with pytest.raises(CorruptObject, match="sections end at 12, the footer starts at 11"):
        decode_footer(forged)


def test_counts_overflowing_the_footer_are_refused():
    with pytest.raises(ValueError, match="overflows a u32 field"):
        encode([chunk(TOPIC_A, 0, b"", records=2**32 - 1), chunk(TOPIC_A, 0, b"", records=1)])


@pytest.mark.parametrize("data", [b"", b"NEVW", MAGIC * 7])
def test_too_small_objects_are_corrupt(data):
    with pytest.raises(CorruptObject):
        verify(data)


chunk_strategy = st.builds(
    Chunk,
    topic_id=st.sampled_from([TOPIC_A, TOPIC_B, uuid.UUID(int=7)]),
    partition=st.integers(-1, 3),
    data=st.binary(max_size=40),
    batch_count=st.integers(0, 2**28),
    record_count=st.integers(0, 2**28),
    max_timestamp=st.integers(-(2**63), 2**63 - 1),
)


@settings(max_examples=300)
@given(st.lists(chunk_strategy, max_size=12))
def test_round_trip(chunks):
    obj = encode(chunks)
    assert verify(obj.data) == obj.sections
    keys = [(s.topic_id.bytes, s.partition) for s in obj.sections]
    assert keys == sorted(set(keys))
    for c, start in zip(chunks, obj.chunk_starts, strict=True):
        assert obj.data[start : start + len(c.data)] == c.data
    for s in obj.sections:
        members = [i for i, c in enumerate(chunks) if (c.topic_id, c.partition) == (s.topic_id, s.partition)]
        # a section is its chunks, in the order given, back to back
        assert [obj.chunk_starts[i] for i in members] == sorted(obj.chunk_starts[i] for i in members)
        assert obj.data[s.start : s.start + s.length] == b"".join(chunks[i].data for i in members)
        assert (s.batch_count, s.record_count, s.max_timestamp) == (
            sum(chunks[i].batch_count for i in members),
            sum(chunks[i].record_count for i in members),
            max(chunks[i].max_timestamp for i in members),
        )
    tail = len(obj.data) - (obj.sections[-1].start + obj.sections[-1].length if obj.sections else HEADER_SIZE)
    assert decode_footer(obj.data[-tail:], len(obj.data)) == obj.sections

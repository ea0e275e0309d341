"""wal.record_walk: the compiled record walk answers every batch as the Python walk it replaced did
(tests/wal/python_walk.py), and the compactor's record starts are where the records begin."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.batches import CODECS, NONE, SNAPPY, compress, edited, encode_records, frame_batch, xerial_snappy
from tests.wal import python_walk
from wal import batch as wal_batch
from wal.batch import InvalidRecords, validate
from wal.record_walk import as_array, record_starts

XERIAL = -1  # snappy as the Java client frames it

# a key in nine records of ten: a keyless record ends a compacted topic's walk at once
some_key = st.tuples(st.binary(max_size=200), st.integers(0, 9)).map(lambda pair: pair[0] if pair[1] else None)
record = st.tuples(
    some_key,
    st.none() | st.binary(max_size=200),
    st.lists(st.tuples(st.text(max_size=4), st.none() | st.binary(max_size=12)), max_size=3),
    st.integers(-(2**45), 2**45),
)
# Over 64 records the offset deltas take two bytes, over 8,192 three: both are walked differently.
tiny = st.tuples(st.none() | st.binary(max_size=2), st.none() | st.binary(max_size=3), st.just([]), st.integers(0, 300))
sections = st.one_of(st.lists(record, min_size=1, max_size=8), st.lists(tiny, min_size=60, max_size=140))
edit = st.tuples(st.integers(0, 10**6), st.sampled_from(["set", "insert", "delete"]), st.integers(0, 255))


@contextmanager
def python_walk_in_place():
    saved = wal_batch._check_records
    wal_batch._check_records = python_walk.check_records
    try:
        yield
    finally:
        wal_batch._check_records = saved


def outcome(data: bytes, keyed: bool, max_expanded: int | None = None):
    try:
        return validate(data, keyed=keyed, max_expanded=max_expanded)
    except InvalidRecords as e:
        return e.error_code, str(e), e.keyless


def framed(section: bytes, count: int, codec: int) -> bytes:
    payload = xerial_snappy(section, block_size=64) if codec == XERIAL else compress(codec, section)
    attributes = SNAPPY if codec == XERIAL else codec
    return frame_batch(payload, record_count=count, last_offset_delta=count - 1, base_timestamp=1, max_timestamp=9, attributes=attributes)


# too_slow: generating 140 records an example is slow on a busy machine; that is no failure
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sections,
    st.sampled_from([*CODECS, XERIAL]),
    st.booleans(),
    st.lists(edit, max_size=3),
    st.sampled_from([0, 0, 0, -1, 1]),
    st.booleans(),
    st.booleans(),
)
def test_the_compiled_walk_answers_as_the_python_walk(recs, codec, keyed, edits, miscount, before, after):
    """Records of any fields (keyed and keyless), any codec, the section mutated in place, inserted
    into or cut, then compressed and framed with a right CRC (so that the walk, not the CRC,
    judges it), with a header count that may be off by one, alone in the request or between
    valid batches (reads past a batch's end see the next batch's bytes): the new walk and the old
    one give the same summary, or the same Kafka error with the same words."""
    data = edited(encode_records(recs, 0), edits)
    count = max(len(recs) + miscount, 1)
    valid = framed(encode_records(recs[:1], 0), 1, NONE)
    request = (valid if before else b"") + framed(data, count, codec) + (valid if after else b"")
    new = outcome(request, keyed, max_expanded=1 << 20)  # as produce calls it: decompressed within a bound
    with python_walk_in_place():
        old = outcome(request, keyed)
    assert new == old


def body(*parts: bytes) -> bytes:
    """A record of these bytes after its length (attributes first)."""
    fields = b"".join(parts)
    return encode_varint(len(fields)) + fields


def encode_varint(value: int) -> bytes:
    raw, out = (value << 1) ^ (value >> 63), bytearray()
    while raw >= 0x80:
        out.append(raw & 0x7F | 0x80)
        raw >>= 7
    return bytes([*out, raw])


# Sections that random edits seldom make: (bytes, record count)
CRAFTED = {
    "timestamp delta of 10 bytes": (body(b"\x00", b"\x80" * 9 + b"\x01", b"\x00", b"\x02k", b"\x02v", b"\x00"), 1),
    "timestamp delta of 11 bytes": (body(b"\x00", b"\x80" * 10 + b"\x01", b"\x00", b"\x02k", b"\x02v", b"\x00"), 1),
    "offset delta 0 in two bytes": (body(b"\x00", b"\x00", b"\x80\x00", b"\x02k", b"\x02v", b"\x00"), 1),
    "offset delta 0 in six bytes": (body(b"\x00", b"\x00", b"\x80" * 5 + b"\x00", b"\x02k", b"\x02v", b"\x00"), 1),
    "a length in six bytes": (b"\x80" * 5 + b"\x00" + b"\x00" * 6, 1),
    "a key length in three bytes": (body(b"\x00", b"\x00", b"\x00", b"\x82\x80\x00k", b"\x02v", b"\x00"), 1),
    "a null key written -2": (body(b"\x00", b"\x00", b"\x00", b"\x03", b"\x02v", b"\x00"), 1),
    "header count -1": (body(b"\x00", b"\x00", b"\x00", b"\x02k", b"\x02v", b"\x01"), 1),
    "a header key of length -1": (body(b"\x00", b"\x00", b"\x00", b"\x02k", b"\x02v", b"\x02", b"\x01", b"\x00"), 1),
    "a header past its record": (body(b"\x00", b"\x00", b"\x00", b"\x02k", b"\x02v", b"\x02", b"\x02h", b"\x7e"), 1),
    "many headers of nothing": (body(b"\x00", b"\x00", b"\x00", b"\x02k", b"\x02v", b"\xfe\xff\xff\xff\x0f", b"\x00\x00" * 3), 1),
}


@pytest.mark.parametrize("name", list(CRAFTED))
@pytest.mark.parametrize("codec", [NONE, *CODECS[1:]])
def test_the_walks_agree_on_crafted_records(name, codec):
    section, count = CRAFTED[name]
    valid = framed(encode_records([(b"k", b"v", [], 0)], 0), 1, NONE)
    for request in (framed(section, count, codec), framed(section, count, codec) + valid):
        for keyed in (False, True):
            new = outcome(request, keyed)
            with python_walk_in_place():
                assert outcome(request, keyed) == new, name


def test_the_walks_agree_on_records_of_thousands():
    """Offset deltas of three bytes (past 8,192 records), keyed and not."""
    recs = [(b"k", b"v", [], i) for i in range(8300)]
    section = encode_records(recs, 0)
    for keyed in (False, True):
        new = outcome(framed(section, len(recs), NONE), keyed)
        with python_walk_in_place():
            assert outcome(framed(section, len(recs), NONE), keyed) == new
        assert new.record_count == 8300


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(record, min_size=1, max_size=6), min_size=1, max_size=4), st.lists(edit, max_size=2), st.integers(-1, 1))
def test_record_starts_are_where_each_record_begins(batches, edits, miscount):
    """Sections laid end to end: each section's starts are the positions an independent reading
    finds its records at, or the section is refused (-1) when its records do not fill it."""
    sections = [bytearray(encode_records(recs, 0)) for recs in batches]
    for where, how, value in edits:  # the last section mutated
        data = sections[-1]
        where %= len(data) + 1
        if how == "insert":
            data[where:where] = bytes([value])
        elif where < len(data) and how == "set":
            data[where] = value
    counts = [len(recs) for recs in batches]
    counts[-1] = max(counts[-1] + miscount, 0)
    joined = b"".join(sections)
    ends = np.cumsum([len(s) for s in sections]).astype(np.int64)
    begins = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    out = np.zeros(sum(counts), dtype=np.int64)
    found = np.zeros(len(sections), dtype=np.int64)
    written = record_starts(as_array(joined), begins, ends, np.array(counts, dtype=np.int64), out, found)
    want: list[int] = []
    for k, section in enumerate(sections):
        starts = lengths_walk(bytes(section), counts[k])
        assert found[k] == (-1 if starts is None else counts[k])
        want += [int(begins[k]) + s for s in starts or []]
    assert out[:written].tolist() == want


def lengths_walk(section: bytes, count: int) -> list[int] | None:
    """The records' starts by their lengths alone (a length of at least 6 that fits, the section
    filled exactly by `count` records), or None."""
    starts, pos = [], 0
    while len(starts) < count:
        start, value, shift = pos, 0, 0
        while True:
            if pos >= len(section) or shift > 63:
                return None
            b = section[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        length = (value >> 1) ^ -(value & 1)
        if length < 6 or pos + length > len(section):
            return None
        pos += length
        starts.append(start)
    return starts if pos == len(section) else None


@pytest.mark.parametrize("codec", [*CODECS[1:], XERIAL])
def test_a_batch_that_expands_past_the_bound_is_too_large(codec):
    """Decompression stops at the bound (MESSAGE_TOO_LARGE), where a batch of the same records
    within it is walked as ever; a section that does not decompress is still CORRUPT_MESSAGE."""
    recs = [(b"k", bytes(4000), [], i) for i in range(300)]  # about 1.2 MB decompressed
    batch = framed(encode_records(recs, 0), len(recs), codec)
    assert len(batch) < (1 << 20) // 4
    assert validate(batch, max_expanded=2 << 20).record_count == 300
    for bound in (1 << 20, 1):
        assert outcome(batch, False, max_expanded=bound) == (10, f"batch 0: its records expand past {bound} bytes", ())
    garbage = frame_batch(b"not compressed at all" * 3, record_count=1, last_offset_delta=0, base_timestamp=1, max_timestamp=1, attributes=SNAPPY if codec == XERIAL else codec)
    assert outcome(garbage, False, max_expanded=1 << 20)[0] == 2

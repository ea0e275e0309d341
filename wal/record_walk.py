"""Walking a records section (the records of one v2 batch, decompressed), compiled: the one place
that steps from record to record, for the produce path (`check_records`: every record's framing,
as Kafka's record reader checks it; `keyless_records`: which records of a compacted topic's batch
have no key) and for the compactor (`record_starts`: where each record begins, for its column
decoder to read every field of all records at once).

A record's start depends on the length of the one before it, so no array operation finds record
boundaries; numba compiles these loops to machine code (about 10 ns a record, where the same loop
in Python took most of a microsecond). They are compiled when this module is first imported and
cached on disk (a later process loads them in a fraction of a second), never on a request, and
release the GIL while they run. They take the bytes as a numpy array (`as_array`).

v2 record: length varint, then (the length's bytes) attributes i8 · timestampDelta varlong ·
offsetDelta varint · keyLength varint · key · valueLength varint · value · headerCount varint ·
headers (keyLength varint · key · valueLength varint · value). Varints are zigzag-encoded; a
negative key or value length is null.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# What check_records found (its first result); the next three are the record's index and two
# figures for the message (`outcome_message`).
OK = 0  # a: the records walked
TRAILING = 1  # a: the bytes after the last of `count` records
LENGTH = 2  # a: the record's length, b: the bytes that remain
VARINT_TOO_LONG = 3
TIMESTAMP_TOO_LONG = 4
OFFSET_DELTA = 5  # a: the delta read
NO_KEY = 6
HEADER_COUNT = 7  # a: the count read
HEADER_KEY = 8  # a: the header key's length
FIELDS_END = 9  # a: where the fields ended, from the record's end
TRUNCATED = 10

_BYTES = "Array(uint8, 1, 'C', readonly=True)"


def _compiled(signature: str):
    """numba's njit for `signature`, cached on disk where numba finds a writable place (beside this
    file, or the user's cache directory); else compiled anew in each process."""

    def compile_(fn):
        try:
            return njit(signature, cache=True, nogil=True)(fn)
        except RuntimeError:  # numba: "cannot cache function ...: no locator available"
            return njit(signature, nogil=True)(fn)

    return compile_


def as_array(data) -> np.ndarray:
    """The bytes of `data` (bytes, a memoryview, a cramjam buffer) as the array these walk, without
    a copy."""
    return np.frombuffer(data, dtype=np.uint8)


@_compiled(f"UniTuple(int64, 3)({_BYTES}, int64)")
def _varint5(data, pos):
    """A zigzag varint of at most 5 bytes at `pos`: (status, value, position after it); status
    TRUNCATED if it runs past the data, VARINT_TOO_LONG if it has no last byte within 5."""
    value = 0
    shift = 0
    limit = pos + 5
    size = len(data)
    while pos < limit:
        if pos >= size:
            return TRUNCATED, 0, pos
        b = np.int64(data[pos])
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return OK, (value >> 1) ^ -(value & 1), pos
        shift += 7
    return VARINT_TOO_LONG, 0, pos


@_compiled(f"UniTuple(int64, 4)({_BYTES}, int64, int64, int64, boolean)")
def check_records(data, pos, end, count, keyed):
    """Walks the records in data[pos:end] as Kafka's record reader does: each record's fields end
    exactly where its length says, offset deltas run 0, 1, 2, ..., at most `count` records, and
    (`keyed`, a compacted topic's) every record has a key. Keys, values and headers are skipped by
    their lengths. Reads past `end` see the bytes after it (the next batch of the request) and
    past the data end the walk (TRUNCATED).

    Returns (outcome, record index, a, b): OK with a = the records walked, or what stopped the
    walk (see the outcomes above; `outcome_message` words it)."""
    size = len(data)
    i = 0
    while pos < end:
        if i == count:
            return TRAILING, i, end - pos, 0
        # the length: one or two bytes (nearly all) read inline
        b = np.int64(data[pos])
        if b < 0x80:
            stop = pos + 1 + ((b >> 1) ^ -(b & 1))
            pos += 1
        else:
            if pos + 1 >= size:
                return TRUNCATED, i, 0, 0
            c = np.int64(data[pos + 1])
            if c < 0x80:
                v = (b & 0x7F) | (c << 7)
                stop = pos + 2 + ((v >> 1) ^ -(v & 1))
                pos += 2
            else:
                status, n, pos = _varint5(data, pos)
                if status != OK:
                    return status, i, 0, 0
                stop = pos + n
        # attributes, timestamp delta, offset delta, key, value and header count: a byte each at least
        if stop - pos < 6 or stop > end:
            return LENGTH, i, stop - pos, end - pos
        pos += 2  # attributes, and the timestamp delta's first byte: any delta is valid
        if data[pos - 1] >= 0x80:
            limit = pos + 9
            while True:
                if pos >= size:
                    return TRUNCATED, i, 0, 0
                if data[pos] < 0x80:
                    break
                pos += 1
                if pos == limit:
                    return TIMESTAMP_TOO_LONG, i, 0, 0
            pos += 1
        # the offset delta: record i's must be i
        if pos >= size:
            return TRUNCATED, i, 0, 0
        if i < 64:  # one byte, and only that byte (a longer encoding of i is refused too)
            if data[pos] != i << 1:
                status, n, pos = _varint5(data, pos)
                if status != OK:
                    return status, i, 0, 0
                return OFFSET_DELTA, i, n, 0
            pos += 1
        else:
            if i < 8192:  # two bytes, compared as a 16-bit word (read even when the varint is shorter)
                if pos + 1 >= size:
                    return TRUNCATED, i, 0, 0
                two = ((i << 1) & 0x7F | 0x80) | ((i << 1) >> 7) << 8
                if np.int64(data[pos]) | np.int64(data[pos + 1]) << 8 == two:
                    pos += 2
                    two = -1
            else:
                two = 0
            if two != -1:
                status, n, pos = _varint5(data, pos)
                if status != OK:
                    return status, i, 0, 0
                if n != i:
                    return OFFSET_DELTA, i, n, 0
        # the key's length and bytes, then the value's
        for field in range(2):
            if pos >= size:
                return TRUNCATED, i, 0, 0
            b = np.int64(data[pos])
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                if pos + 1 >= size:
                    return TRUNCATED, i, 0, 0
                c = np.int64(data[pos + 1])
                if c < 0x80:
                    v = (b & 0x7F) | (c << 7)
                    n = (v >> 1) ^ -(v & 1)
                    pos += 2
                else:
                    status, n, pos = _varint5(data, pos)
                    if status != OK:
                        return status, i, 0, 0
            if n > 0:
                pos += n
            elif n < 0 and keyed and field == 0:
                return NO_KEY, i, 0, 0
        # the headers
        if pos >= size:
            return TRUNCATED, i, 0, 0
        if data[pos]:
            status, headers, pos = _varint5(data, pos)
            if status != OK:
                return status, i, 0, 0
            if headers < 0:
                return HEADER_COUNT, i, headers, 0
            for _ in range(headers):
                status, n, pos = _varint5(data, pos)
                if status != OK:
                    return status, i, 0, 0
                if n < 0:
                    return HEADER_KEY, i, n, 0
                status, n, pos = _varint5(data, pos + n)
                if status != OK:
                    return status, i, 0, 0
                if n > 0:
                    pos += n
                if pos > stop:
                    break
        else:
            pos += 1
        if pos != stop:
            return FIELDS_END, i, pos - stop, 0
        i += 1
    return OK, i, i, 0


@_compiled(f"int64({_BYTES}, int64, int64, int64[::1])")
def keyless_records(data, pos, end, out):
    """The indices of the records in data[pos:end] whose key is null, written to `out` (room for
    every record); returns how many. For a section check_records walked (framing sound): only each
    record's length and the fields before its key are read. What a compacted topic's refusal
    names, record by record (Kafka's record_errors)."""
    found = 0
    i = 0
    while pos < end:
        status, n, body = _varint5(data, pos)
        if status != OK:
            return found
        pos = body + n  # the next record
        body += 1  # attributes
        while data[body] >= 0x80:  # the timestamp delta
            body += 1
        body += 1
        status, n, body = _varint5(data, body)  # the offset delta
        if status != OK:
            return found
        status, n, body = _varint5(data, body)  # the key's length
        if status != OK:
            return found
        if n < 0:
            out[found] = i
            found += 1
        i += 1
    return found


# check_records' outcomes in words, as the Python walk worded them
_MESSAGES = {
    TRAILING: "{a} bytes follow the last of {count} records",
    LENGTH: "record {index} has length {a}, {b} bytes remain",
    VARINT_TOO_LONG: "varint longer than 5 bytes",
    TIMESTAMP_TOO_LONG: "record {index} has a timestamp delta longer than 10 bytes",
    OFFSET_DELTA: "record {index} has offset delta {a}",
    NO_KEY: "record {index} has no key, and the topic is compacted",
    HEADER_COUNT: "record {index} has {a} headers",
    HEADER_KEY: "record {index} has a header key of length {a}",
    FIELDS_END: "record {index}'s fields end {a:+d} bytes from its length",
    TRUNCATED: "record {index} is truncated",
}


def outcome_message(outcome: int, index: int, a: int, b: int, count: int) -> str:
    """check_records' outcome (not OK) in words."""
    return _MESSAGES[outcome].format(index=index, a=a, b=b, count=count)


@_compiled(f"int64({_BYTES}, int64[::1], int64[::1], int64[::1], int64[::1], int64[::1])")
def record_starts(data, begins, ends, counts, out, found):
    """Where the records of many sections start: section k is data[begins[k]:ends[k]] with
    counts[k] records; their starts go to `out`, section after section. found[k] is the number of
    section k's records, or -1 when its records do not fill it exactly (a length under 6 or past
    its end, a length varint of more than 10 bytes or beyond 64 bits, bytes after the last
    record): such a section adds no start. Returns the starts written. Only a record's length is
    read; its fields are the caller's to decode."""
    written = 0
    for k in range(len(begins)):
        pos = begins[k]
        end = ends[k]
        count = counts[k]
        first = written
        ok = True
        if count <= 0:
            ok = pos == end
            count = 0
        done = 0
        while ok and done < count:
            start = pos
            if pos >= end:
                ok = False
                break
            n = np.int64(0)
            shift = 0
            while True:
                b = np.int64(data[pos])
                pos += 1
                if shift == 63 and (b & 0x7F) != 0:  # a length beyond 64 bits: past any section
                    ok = False
                    break
                n |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
                if pos >= end or shift > 63:
                    ok = False
                    break
            if not ok:
                break
            length = (n >> 1) ^ -(n & 1)
            if length < 6 or length > end - pos:
                ok = False
                break
            pos += length
            out[written] = start
            written += 1
            done += 1
        if ok and pos != end:
            ok = False
        if ok:
            found[k] = count
        else:
            found[k] = -1
            written = first
    return written

"""The produce path's record walk as it was in Python before it was compiled (wal/record_walk.py):
the reference the compiled walk is held equal to (tests/wal/test_record_walk.py). Kept as it ran,
one Python step a record, so that "the old path" stays runnable beside the new one."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from wal.batch import BATCH_HEADER_SIZE, InvalidRecords, decompress, keyless_message


def check_records(view, _array, pos: int, size: int, codec: int, count: int, keyed: bool, index: int, _max_expanded=None) -> None:
    """What wal.batch._check_records did: walks the records of the batch at `pos` (decompressed
    first); raises InvalidRecords."""
    data = view
    start = pos + BATCH_HEADER_SIZE
    end = pos + size
    try:
        if codec:
            data = decompress(codec, memoryview(data)[start:end])
            # cramjam's Buffer indexes slowly; bytes is the fastest thing to walk
            data = data if type(data) is bytes else bytes(data)
            start, end = 0, len(data)
        found, keyless = _walk_records(data, start, end, count, keyed)
    except InvalidRecords as e:
        raise InvalidRecords(e.error_code, f"batch {index}: {e}") from None
    except Exception as e:  # cramjam's DecompressionError
        raise InvalidRecords(ErrorCode.corrupt_message, f"batch {index} does not decompress: {e}") from None
    if found != count:
        raise InvalidRecords(ErrorCode.corrupt_message, f"batch {index} holds {found} records, its header says {count}")
    if keyless:  # named once the whole batch is known to be sound, as Kafka's record_errors
        raise InvalidRecords(ErrorCode.invalid_record, f"batch {index}: {keyless_message(tuple(keyless))}", tuple(keyless))


# The zigzag value of every varint of one or two bytes, indexed by its 7 or 14 payload bits: most
# of a record's varints are that short, and one list lookup is the cheapest read of them.
_ZIGZAG = [(v >> 1) ^ -(v & 1) for v in range(1 << 14)]
# Offset delta i (64 <= i < 8192) as its two varint bytes read little-endian: the first byte is
# (i << 1) & 0x7F with the continuation bit, the second (i << 1) >> 7.
_TWO_BYTE_DELTA = [((i << 1) & 0x7F | 0x80) | ((i << 1) >> 7) << 8 for i in range(8192)]


def _varint(data, pos: int, most: int) -> tuple[int, int]:
    """A zigzag varint of any length up to `most` bytes at `pos`: (value, position after it)."""
    value = shift = 0
    limit = pos + most
    while pos < limit:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
    raise InvalidRecords(ErrorCode.corrupt_message, f"varint longer than {most} bytes")


def _walk_records(data, pos: int, end: int, count: int, keyed: bool) -> tuple[int, list[int]]:
    """The number of records framed in data[pos:end] and (`keyed`) the indices of those without a
    key, checking as Kafka's record reader does that each record's fields end exactly where its
    length says and that offset deltas run 0, 1, 2, ... Stops with an error after `count` records
    if more bytes follow. Keys and values are skipped by their lengths, never read.

    This is the produce path's one loop per record, written for CPython: one- and two-byte varints
    (all but a few of them) are a lookup in _ZIGZAG, inline; the timestamp delta is skipped
    without being decoded; a record's overrun into the next one is caught by its end check, and a
    read past the data by IndexError."""
    zigzag = _ZIGZAG
    two_byte = _TWO_BYTE_DELTA
    key_nullable = (not keyed, True)  # a value may always be null
    keyless = []
    i = 0
    try:
        while pos < end:
            if i == count:
                raise InvalidRecords(ErrorCode.corrupt_message, f"{end - pos} bytes follow the last of {count} records")
            b = data[pos]
            if b < 0x80:
                stop = pos + 1 + zigzag[b]
                pos += 1
            elif data[pos + 1] < 0x80:
                stop = pos + 2 + zigzag[(b & 0x7F) | (data[pos + 1] << 7)]
                pos += 2
            else:
                n, pos = _varint(data, pos, 5)
                stop = pos + n
            # attributes, timestamp delta, offset delta, key, value and header count: a byte each at least
            if stop - pos < 6 or stop > end:
                raise InvalidRecords(ErrorCode.corrupt_message, f"record {i} has length {stop - pos}, {end - pos} bytes remain")
            pos += 2  # attributes, and the timestamp delta's first byte: any delta is valid
            if data[pos - 1] >= 0x80:
                limit = pos + 9
                while data[pos] >= 0x80:
                    pos += 1
                    if pos == limit:
                        raise InvalidRecords(ErrorCode.corrupt_message, f"record {i} has a timestamp delta longer than 10 bytes")
                pos += 1
            # the offset delta, compared with the encoding record i must have
            if i < 64:
                if data[pos] != i << 1:
                    raise InvalidRecords(ErrorCode.corrupt_message, f"record {i} has offset delta {_varint(data, pos, 5)[0]}")
                pos += 1
            elif i < 8192 and data[pos] | data[pos + 1] << 8 == two_byte[i]:
                pos += 2
            else:
                n, pos = _varint(data, pos, 5)
                if n != i:
                    raise InvalidRecords(ErrorCode.corrupt_message, f"record {i} has offset delta {n}")
            for nullable in key_nullable:  # the key's length and bytes, then the value's
                b = data[pos]
                if b < 0x80:
                    n = zigzag[b]
                    pos += 1
                elif data[pos + 1] < 0x80:
                    n = zigzag[(b & 0x7F) | (data[pos + 1] << 7)]
                    pos += 2
                else:
                    n, pos = _varint(data, pos, 5)
                if n > 0:
                    pos += n
                elif n < 0 and not nullable:
                    keyless.append(i)
            if data[pos]:  # headers
                headers, pos = _varint(data, pos, 5)
                if headers < 0:
                    raise InvalidRecords(ErrorCode.corrupt_message, f"record {i} has {headers} headers")
                for _ in range(headers):
                    n, pos = _varint(data, pos, 5)
                    if n < 0:
                        raise InvalidRecords(ErrorCode.corrupt_message, f"record {i} has a header key of length {n}")
                    n, pos = _varint(data, pos + n, 5)
                    if n > 0:
                        pos += n
                    if pos > stop:
                        break
            else:
                pos += 1
            if pos != stop:
                raise InvalidRecords(ErrorCode.corrupt_message, f"record {i}'s fields end {pos - stop:+d} bytes from its length")
            i += 1
    except IndexError:
        raise InvalidRecords(ErrorCode.corrupt_message, f"record {i} is truncated") from None
    return i, keyless

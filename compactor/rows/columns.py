"""Record batches of a topic without a value schema decoded straight into the table's raw columns
(Arrow): the varints of every record of many batches decoded by numpy at once, keys, values and
headers cut out of the decompressed bytes by Arrow, no Python object a record.

Only batches whose every record decodes are taken; the others are named, for records.py's
per-record path to keep as it keeps them (a malformed row, or rows if it reads them after all).
That path's records become the same columns here too (records_to_rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.stride_tricks import sliding_window_view

from table.layout import (
    BASE_SEQUENCE,
    BATCH_ATTRIBUTES,
    BATCH_BASE_OFFSET,
    BATCH_BASE_TIMESTAMP,
    BATCH_BASE_TIMESTAMP_MS,
    BATCH_COMPRESSION,
    BATCH_LEADER_EPOCH,
    BATCH_MAGIC,
    BATCH_MAX_TIMESTAMP,
    BATCH_MAX_TIMESTAMP_MS,
    FLAGGED_ATTRIBUTES,
    HEADER_KEY,
    HEADER_VALUE,
    HEADERS,
    IS_CONTROL,
    IS_TRANSACTIONAL,
    KAFKA,
    KEY_RAW,
    MAX_MS,
    MIN_MS,
    OFFSET,
    PARTITION,
    PRODUCER_EPOCH,
    PRODUCER_ID,
    RECORD_ATTRIBUTES,
    STORED_BATCH,
    TIMESTAMP,
    TIMESTAMP_MS,
    TIMESTAMP_TYPE,
    VALUE_RAW,
    VALUE_SCHEMA_ID,
    clamp_ms,
)
from wal.record_walk import record_starts

from .records import Batch, Record
from .translator import header_rows, timestamp_ms

# After the last payload: the reads of a record's fixed fields past its end stay inside the buffer
# (a record's position is checked once its fields are read; each varint moves it 10 bytes at most).
_PAD = bytes(128)
_MAX_HEADERS = 64  # records with more headers go the per-record way (one numpy step per header index)
_INT64_MAX = 2**63 - 1
_HIGH_BITS = np.uint64(0x8080808080808080)
_MAX_DELTA = 2**62  # an offset delta beyond it may overflow: records.py's path decides
# _uniform_fields reads the records of the commonest size under _UNIFORM_MAX_SIZE bytes at once
# when there are this many.
_UNIFORM_MIN, _UNIFORM_MAX_SIZE = 32, 1 << 16
_UNIFORM_HEAD = 24  # a key this short is read with the bytes around it (copied once a record)


@dataclass(frozen=True, slots=True)
class ValueSpans:
    """Where each row's value is in the decompressed records sections: buf[at:at + length]
    (length < 0: a null value); `buf` ends in at least 16 bytes past the last section."""

    buf: np.ndarray  # uint8
    at: np.ndarray  # int64, one per row
    length: np.ndarray  # int64, one per row

    def rows(self, index: slice | np.ndarray) -> ValueSpans:
        return ValueSpans(self.buf, self.at[index], self.length[index])

    @property
    def nulls(self) -> int:
        return int((self.length < 0).sum())


@dataclass(slots=True)
class RawRows:
    """The rows of consecutive batches of one Kafka partition: `rows` in the table's Arrow
    schema (value, value_schema_id and value_error null), with their offsets and timestamps (ms).
    With a `schema_id`, every row's value is instead in the value column alone (avro_columns.py:
    the translator's COLUMNS outcome), but for `tombstones` rows whose value_schema_id is null
    (TOMBSTONE: every value column null). With `values` (decode_batches(values_apart=
    True), for avro_columns.py to read), value_raw is not filled: the values are where `values`
    says, and the rows are not to be written as they are."""

    rows: pa.RecordBatch
    offsets: np.ndarray  # int64, one per row
    timestamps: np.ndarray  # int64 ms, one per row
    tombstones: int
    schema_id: int | None = None
    values: ValueSpans | None = None

    def __len__(self) -> int:
        return self.rows.num_rows

    def take(self, indices: np.ndarray) -> RawRows:
        rows = self.rows.take(pa.array(indices))
        values = self.values.rows(indices) if self.values is not None else None
        return RawRows(rows, self.offsets[indices], self.timestamps[indices], self._tombstones(rows, values), self.schema_id, values)

    def slice(self, start: int, stop: int) -> RawRows:
        rows = self.rows.slice(start, stop - start)
        values = self.values.rows(slice(start, stop)) if self.values is not None else None
        return RawRows(rows, self.offsets[start:stop], self.timestamps[start:stop], self._tombstones(rows, values), self.schema_id, values)

    def by_outcome(self) -> list[RawRows]:
        """These rows, those of a schema id apart from its tombstones (schema id None): a list of
        one or two, each with rows, in no particular order."""
        if self.schema_id is None or not self.tombstones:
            return [self]
        dead = self.rows.column(VALUE_SCHEMA_ID).is_null().to_numpy(zero_copy_only=False)
        values = [] if dead.all() else [self.take(np.flatnonzero(~dead))]
        tombstones = self if dead.all() else self.take(np.flatnonzero(dead))
        return [*values, RawRows(tombstones.rows, tombstones.offsets, tombstones.timestamps, len(tombstones))]

    def _tombstones(self, rows: pa.RecordBatch, values: ValueSpans | None) -> int:
        if self.schema_id is not None:
            return rows.column(VALUE_SCHEMA_ID).null_count
        return values.nulls if values is not None else rows.column(VALUE_RAW).null_count


def records_to_rows(kafka: dict[str, Any], records: Sequence[Record], schema: pa.Schema) -> RawRows:
    """What translate(record, kafka, None) makes of each of `records` (one batch's, decoded by
    records.py; `kafka` from kafka_columns), as rows of `schema`."""
    n = len(records)
    offsets = [r[0] for r in records]
    timestamps = [clamp_ms(r[1]) for r in records]
    kafka_type = schema.field(KAFKA).type
    kafka_arrays = []
    for f in kafka_type:
        if f.name == OFFSET:
            kafka_arrays.append(pa.array(offsets, type=f.type))
        elif f.name == TIMESTAMP:
            kafka_arrays.append(pa.array([t * 1000 for t in timestamps], type=f.type))  # Kafka's ms as timestamptz micros
        elif f.name == RECORD_ATTRIBUTES:
            kafka_arrays.append(pa.array([r[5] or None for r in records], type=f.type))  # null: 0
        elif f.name == TIMESTAMP_MS:
            kafka_arrays.append(pa.array([timestamp_ms(r[1], r[6]) for r in records], type=f.type))
        else:
            kafka_arrays.append(pa.array([kafka.get(f.name)] * n, type=f.type))
    values = [r[3] for r in records]
    columns = {
        KAFKA: pa.StructArray.from_arrays(kafka_arrays, fields=list(kafka_type)),
        HEADERS: pa.array([header_rows(r[4]) if r[4] else [] for r in records], type=schema.field(HEADERS).type),
        KEY_RAW: pa.array([r[2] for r in records], type=schema.field(KEY_RAW).type),
        VALUE_RAW: pa.array(values, type=schema.field(VALUE_RAW).type),
    }
    arrays = [columns[f.name] if f.name in columns else pa.nulls(n, type=f.type) for f in schema]
    rows = pa.RecordBatch.from_arrays(arrays, schema=schema)
    return RawRows(rows, np.array(offsets, dtype=np.int64), np.array(timestamps, dtype=np.int64), values.count(None))


def decode_batches(partition: int, batches: Sequence[Batch], payloads: Sequence[bytes | None], first_offset: int, schema: pa.Schema, values_apart: bool = False) -> tuple[RawRows, list[bool], list[int]]:
    """The rows of `batches` (headers from records.iter_batches, in order) whose records all decode,
    from their decompressed records sections `payloads` (None: did not decompress); records below
    `first_offset` left out. Also, per batch, whether it was taken, and how many rows it gave.
    `values_apart`: the values are left where they are (RawRows.values), not copied into value_raw
    (for avro_columns.py, which reads them from there into the value column)."""
    data = b"".join([*(p for p in payloads if p is not None), _PAD])
    buf = np.frombuffer(data, dtype=np.uint8)
    ok = [p is not None for p in payloads]
    # Where each batch's records start: the record walk's, section after section (none for a batch
    # whose records do not fill its section, which records.py's path takes).
    sizes = np.array([len(p) if p is not None else 0 for p in payloads], dtype=np.int64)
    ends = np.cumsum(sizes)
    begins = ends - sizes
    declared = np.array([b.record_count if p is not None else 0 for b, p in zip(batches, payloads, strict=True)], dtype=np.int64)
    # a record takes 7 bytes at least: a count beyond that fails the walk before it writes more
    record_at = np.empty(int(np.minimum(np.maximum(declared, 0), sizes // 7).sum()), dtype=np.int64)
    walked = np.empty(len(batches), dtype=np.int64)
    record_at = record_at[: record_starts(buf, begins, ends, declared, record_at, walked)]
    for i in np.flatnonzero(walked < 0).tolist():
        ok[i] = False
    found = np.maximum(walked, 0)
    batch_of = np.repeat(np.arange(len(batches), dtype=np.int64), found)
    # Where each record ends, as walked: where the next begins, or its batch's section ends.
    record_end = ends[batch_of]
    np.minimum(record_at[1:], record_end[:-1], out=record_end[:-1])
    fields = _decode_fields(buf, record_at, record_end, batch_of, batches)
    taken = np.array(ok, dtype=bool)
    taken[np.unique(batch_of[fields.bad])] = False
    buffer = pa.py_buffer(data)
    while True:
        keep = taken[batch_of] & (fields.offsets >= first_offset)
        header_keep = keep[fields.header_record]
        names = _binary(buffer, fields.name_at[header_keep], fields.name_length[header_keep])
        failed = _not_utf8(names, batch_of[fields.header_record[header_keep]])
        if not failed.size:
            break
        taken[failed] = False  # records.py's path names the batch
    counts = np.bincount(batch_of[keep], minlength=len(batches))
    rows = _to_arrow(partition, batches, buffer, fields, keep, header_keep, names, counts, schema, values_apart)
    return rows, taken.tolist(), counts.tolist()


def _varints(buf: np.ndarray, at: np.ndarray, bad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varints at positions `at` of `buf`: (values as int64, positions after them).
    Marks in `bad` those longer than 10 bytes or beyond 64 bits (records.py's path decides)."""
    b = buf[at]
    more = b >= 0x80
    if not more.any():  # all of one byte
        raw = b.astype(np.int64)
        values = raw >> 1
        values ^= -(raw & 1)
        return values, at + 1
    second = buf[at + 1]
    if not (more & (second >= 0x80)).any():  # none longer than 2 bytes: the common case, in whole passes
        raw = (b & 0x7F).astype(np.int64)
        raw |= (second & 0x7F).astype(np.int64) * more << 7
        values = raw >> 1
        values ^= -(raw & 1)
        return values, at + 1 + more
    # Some longer: up to 8 bytes, each value's 8 bytes as one little-endian word; longer ones
    # (rare: 9 or 10 bytes) a byte at a time.
    words = np.ascontiguousarray(sliding_window_view(buf, 8)[np.minimum(at, len(buf) - 8)]).view("<u8").reshape(len(at))
    stops = ~words & _HIGH_BITS  # the high bit of each byte that ends a varint
    if stops.all():
        first_stop = stops & (~stops + np.uint64(1))  # the lowest: the byte the value ends at
        words &= (first_stop << np.uint64(1)) - np.uint64(1)  # its bytes alone (the 8th's shift wraps to all ones)
        raw = words & np.uint64(0x7F)
        for k in range(1, 8):
            raw |= (words >> np.uint64(k)) & np.uint64(0x7F << (7 * k))
        raw = raw.view(np.int64)  # at most 56 bits
        values = raw >> 1
        values ^= -(raw & 1)
        return values, at + (np.bitwise_count(first_stop - np.uint64(1)) + 1) // 8
    raw = b.astype(np.int64)
    after = at + 1
    more = np.flatnonzero(more)
    raw[more] &= 0x7F
    top = None
    k = 1
    while more.size:
        if k == 10:
            bad[more] = True
            break
        b = buf[at[more] + k]
        bits = (b & 0x7F).astype(np.int64)
        if k == 9:
            bad[more[bits > 1]] = True
            top = more[bits == 1]  # bit 63: a negative int64, shifted right logically below
        raw[more] |= bits << (7 * k)
        stop = b < 0x80
        after[more[stop]] = at[more[stop]] + k + 1
        more = more[~stop]
        k += 1
    values = raw >> 1
    values ^= -(raw & 1)
    if top is not None and top.size:
        values[top] = ((raw[top] >> 1) & _INT64_MAX) ^ -(raw[top] & 1)
    return values, after


@dataclass(slots=True)
class _Fields:
    bad: np.ndarray  # bool per record: does not decode here
    offsets: np.ndarray
    timestamps: np.ndarray  # as the timestamp column holds them: clamped to MIN_MS..MAX_MS
    stored_timestamps: np.ndarray  # as the records hold them (baseTimestamp + delta)
    attributes: np.ndarray  # each record's attributes byte
    key_at: np.ndarray
    key_length: np.ndarray  # < 0: null
    value_at: np.ndarray
    value_length: np.ndarray
    header_count: np.ndarray
    # per header, records' headers in order: its record, name and value (length < 0: null)
    header_record: np.ndarray
    name_at: np.ndarray
    name_length: np.ndarray
    header_value_at: np.ndarray
    header_value_length: np.ndarray


def _decode_fields(buf: np.ndarray, record_at: np.ndarray, record_end: np.ndarray, batch_of: np.ndarray, batches: Sequence[Batch]) -> _Fields:
    """Every record's fields, each a step over all records at once (records.py's _decode, field by
    field). A record decodes when its fields end exactly where its length says (`record_end`, as
    the record walk found it). Records of one size laid out alike (most of a producer's) are read by
    _uniform_fields, the others here."""
    n = len(record_at)
    bad = np.zeros(n, dtype=bool)
    uniform = _uniform_fields(buf, record_at, record_end)
    if uniform is None:
        length, at = _varints(buf, record_at, bad)
        fields = _record_fields(buf, at, at + length, bad)
    else:
        covered, per_record = uniform
        rest = np.flatnonzero(~covered)
        if rest.size:
            rest_bad = bad[rest]
            length, at = _varints(buf, record_at[rest], rest_bad)
            fields = _record_fields(buf, at, at + length, rest_bad)
            bad[rest] = rest_bad
            for into, part in zip(per_record, fields[:7], strict=True):
                into[rest] = part
            fields = (*per_record, rest[fields[7]], *fields[8:])  # headers: of the records' own indices
        else:
            fields = (*per_record, *(np.zeros(0, dtype=np.int64) for _ in range(5)))
    timestamp_delta, offset_delta, key_at, key_length, value_at, value_length, header_count, header_record, name_at, name_length, header_value_at, header_value_length = fields
    try:
        header = np.array([(b.base_offset, b.base_timestamp, b.max_timestamp, b.attributes) for b in batches], dtype=np.int64).reshape(-1, 4)
    except OverflowError:  # a base offset past int64 (the header's own fields are in range): clamped, so bad below
        header = np.array([(min(max(b.base_offset, -_MAX_DELTA), _MAX_DELTA), b.base_timestamp, b.max_timestamp, b.attributes) for b in batches], dtype=np.int64).reshape(-1, 4)
    base_offset = np.clip(header[:, 0], -_MAX_DELTA, _MAX_DELTA)
    if n and (offset_delta.max() >= _MAX_DELTA or offset_delta.min() <= -_MAX_DELTA or base_offset.max() >= _MAX_DELTA or base_offset.min() <= -_MAX_DELTA):
        wide = base_offset[batch_of]
        bad |= (wide >= _MAX_DELTA) | (wide <= -_MAX_DELTA) | (offset_delta >= _MAX_DELTA) | (offset_delta <= -_MAX_DELTA)  # none overflows below
        offset_delta = np.where(bad, 0, offset_delta)
    offsets = base_offset[batch_of] + offset_delta
    # a record past its batch's lastOffsetDelta would take an offset of the batch after it
    last_delta = np.array([b.last_offset_delta for b in batches], dtype=np.int64)
    bad |= (offset_delta < 0) | (offset_delta > last_delta[batch_of])
    # Any int64 timestamp becomes a row: the column holds it clamped, the exact one beside it.
    base_ts, max_ts = header[:, 1], header[:, 2]
    with np.errstate(over="ignore"):
        stored = base_ts[batch_of] + timestamp_delta  # wrapped, as Kafka adds them (Java longs)
    log_append = (header[:, 3] & 0x08) != 0
    timestamps = np.where(log_append[batch_of], max_ts[batch_of], stored) if log_append.any() else stored
    timestamps = np.clip(timestamps, MIN_MS, MAX_MS)
    _, attributes_at = _varints(buf, record_at, np.zeros(n, dtype=bool))
    if n:
        bad |= ~_canonical(record_at, attributes_at, record_end, timestamp_delta, offset_delta, key_length, value_length, header_count, header_record, name_length, header_value_length)
    return _Fields(
        bad, offsets, timestamps, stored, buf[attributes_at], key_at, key_length, value_at, value_length, header_count,
        header_record, name_at, name_length, header_value_at, header_value_length,
    )  # fmt: skip


def _widths(values: np.ndarray) -> np.ndarray:
    """The bytes of each value's zigzag varint as Kafka writes it (the shortest)."""
    v = values.astype(np.int64, copy=False)
    if not len(v):
        return np.ones(0, dtype=np.int64)
    lo, hi = int(v.min()), int(v.max())
    if lo >= -64 and hi < 64:  # all one byte: most deltas, counts and null lengths
        return np.ones(len(v), dtype=np.int64)
    z = ((v << 1) ^ (v >> 63)).view(np.uint64)
    top = max((lo << 1) ^ (lo >> 63), (hi << 1) ^ (hi >> 63))
    widths = np.ones(len(v), dtype=np.int64)
    for k in range(1, 10):
        if top < 1 << (7 * k):
            break
        widths += z >= np.uint64(1 << (7 * k))
    return widths


def _canonical(record_at, attributes_at, record_end, timestamp_delta, offset_delta, key_length, value_length, header_count, header_record, name_length, header_value_length) -> np.ndarray:
    """Whether each record is written as the rebuild writes it (records.py's _canonical): every
    varint in its shortest form, every null length -1. A record that is not (which Kafka reads,
    and produce accepts) is left to records.py's path, which keeps its batch as stored."""
    body = record_end - attributes_at
    expected = 1 + _widths(timestamp_delta) + _widths(offset_delta) + _widths(key_length) + np.maximum(key_length, 0)
    expected += _widths(value_length) + np.maximum(value_length, 0) + _widths(header_count)
    ok = (key_length >= -1) & (value_length >= -1) & (attributes_at - record_at == _widths(body))
    if len(header_record):
        each = _widths(name_length) + np.maximum(name_length, 0) + _widths(header_value_length) + np.maximum(header_value_length, 0)
        expected += np.bincount(header_record, weights=each, minlength=len(body)).astype(np.int64)
        ok &= np.bincount(header_record, weights=header_value_length < -1, minlength=len(body)) == 0
    return ok & (expected == body)


def _uniform_fields(buf: np.ndarray, record_at: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """The fields after the length of the records of the commonest size laid out as the middle one
    of them (a producer's records mostly are): that one is read in Python (_layout), then every
    record's first bytes compared with its at once (the same length, key length, value length and
    header count, deltas of the same widths), and the deltas read a byte position at a time.
    Returns which records it read and, for those, _record_fields' first seven arrays (the other
    records' entries are to be filled); None when it read none."""
    n = len(record_at)
    if n < _UNIFORM_MIN:
        return None
    sizes = end - record_at
    counts = np.bincount(np.minimum(sizes, _UNIFORM_MAX_SIZE))[:_UNIFORM_MAX_SIZE]
    if not counts.size:
        return None
    size = int(counts.argmax())
    if counts[size] < _UNIFORM_MIN:
        return None
    of_size = np.flatnonzero(sizes == size)
    model = int(record_at[of_size[len(of_size) // 2]])  # the middle one: a batch's first records are often odd
    layout = _layout(buf[model : model + size].tobytes())
    if layout is None:
        return None
    length_bytes, ts_bytes, offset_bytes, key_length_bytes, key_length, value_length_bytes, value_length, count_bytes = layout
    before_key = length_bytes + 1 + ts_bytes + offset_bytes + key_length_bytes
    value_length_at = before_key + max(key_length, 0)
    # Every record's first bytes (up to its value when its key is short), a row a byte position:
    # past a smaller record's end they are the next one's (or the pad), and it is not taken.
    width = value_length_at + value_length_bytes if value_length_at <= _UNIFORM_HEAD else before_key
    rows = np.ascontiguousarray(sliding_window_view(buf, width)[record_at].T)
    template = buf[model : model + width].tolist()
    covered = sizes == size
    checks = [*range(length_bytes), *range(before_key - key_length_bytes, before_key)]  # length, key length
    if width > before_key:
        checks += range(value_length_at, width)  # value length
    else:
        for j in range(value_length_at, value_length_at + value_length_bytes):
            covered &= buf.take(record_at + j, mode="clip") == int(buf[model + j])
    for j in checks:
        covered &= rows[j] == template[j]
    for j in range(length_bytes + 1, before_key - key_length_bytes):  # the deltas' widths
        covered &= (rows[j] & 0x80) == (template[j] & 0x80)
    for j in range(size - count_bytes, size):  # header count (none); clipped: past a smaller record's end
        covered &= buf.take(record_at + j, mode="clip") == int(buf[model + j])
    if not covered.any():
        return None
    out = [
        _row_varint(rows, length_bytes + 1, ts_bytes),
        _row_varint(rows, length_bytes + 1 + ts_bytes, offset_bytes),
        record_at + before_key,
        np.full(n, key_length, dtype=np.int64),
        record_at + (value_length_at + value_length_bytes),
        np.full(n, value_length, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
    ]
    return covered, out


def _layout(record: bytes) -> tuple[int, ...] | None:
    """A record's layout for _uniform_fields: the widths of its length, deltas and key length, its
    key length, the width of its value length, its value length, the width of its header count;
    None unless it decodes (records.py's way) with no header and varints of 8 bytes at most."""
    pos = 0

    def varint() -> tuple[int, int]:
        nonlocal pos
        start, raw, shift = pos, 0, 0
        while True:
            if pos >= len(record) or pos - start >= 8:
                raise ValueError
            b = record[pos]
            pos += 1
            raw |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return (raw >> 1) ^ -(raw & 1), pos - start

    try:
        length, length_bytes = varint()
        if length_bytes + length != len(record):
            return None
        pos += 1  # attributes
        _, ts_bytes = varint()
        _, offset_bytes = varint()
        key_length, key_length_bytes = varint()
        pos += max(key_length, 0)
        value_length, value_length_bytes = varint()
        pos += max(value_length, 0)
        count, count_bytes = varint()
    except ValueError:
        return None
    if count != 0 or pos != len(record):
        return None
    return length_bytes, ts_bytes, offset_bytes, key_length_bytes, key_length, value_length_bytes, value_length, count_bytes


def _row_varint(rows: np.ndarray, start: int, width: int) -> np.ndarray:
    """The zigzag varints of `width` bytes (8 at most) at rows `start`.. of `rows` (a record a
    column), as int64; those of 4 bytes or fewer worked out in int32."""
    kind = np.int32 if width <= 4 else np.int64
    raw = (rows[start] & 0x7F).astype(kind)
    for j in range(1, width):
        raw |= (rows[start + j] & 0x7F).astype(kind) << (7 * j)
    values = raw >> 1
    values ^= -(raw & 1)
    return values.astype(np.int64)


def _record_fields(buf: np.ndarray, at: np.ndarray, end: np.ndarray, bad: np.ndarray) -> tuple[np.ndarray, ...]:
    """The fields after the length of the records at `at` (ending at `end`), field by field over
    all of them (`bad` marks those that do not decode): their timestamp and offset deltas, key and
    value positions and lengths, header counts; then, per header, its record, name position and
    length, value position and length."""
    n = len(at)
    limit = end + 1  # a position past the record: the record is bad, reads stay in `buf`

    def varint() -> np.ndarray:
        nonlocal at
        value, at = _varints(buf, at, bad)
        return value

    def skip(length: np.ndarray) -> np.ndarray:
        nonlocal at
        start = at
        size = np.maximum(length, 0)
        over = size > end - at
        if over.any():
            bad[over] = True
            at = np.where(over, limit, at + np.where(over, 0, size))
        else:
            at = at + size
        return start

    at = at + 1  # attributes: unused in v2
    timestamp_delta = varint()
    offset_delta = varint()
    key_length = varint()
    key_at = skip(key_length)
    value_length = varint()
    value_at = skip(value_length)
    header_count = varint()
    bad[header_count < 0] = True  # records.py refuses it: a rebuild would write a count of 0
    header_count = np.maximum(header_count, 0)
    # Each header takes 2 bytes at least: a count the record cannot hold is bad (and bounds the loop).
    over = (header_count > (end - at) // 2) | (header_count > _MAX_HEADERS)
    bad[over] = True
    header_count[over] = 0
    firsts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(header_count, out=firsts[1:])
    total = int(firsts[-1])
    header_record = np.repeat(np.arange(n, dtype=np.int64), header_count)
    name_at = np.zeros(total, dtype=np.int64)
    name_length = np.zeros(total, dtype=np.int64)
    header_value_at = np.zeros(total, dtype=np.int64)
    header_value_length = np.zeros(total, dtype=np.int64)
    rest = np.flatnonzero(header_count)
    if rest.size:
        np.minimum(at, limit, out=at)  # from here on each record's reads are kept to it
    j = 0
    while rest.size:
        into = firsts[rest] + j
        pos, rest_bad, rest_end, rest_limit = at[rest], np.zeros(rest.size, dtype=bool), end[rest], limit[rest]
        for target_at, target_length in ((name_at, name_length), (header_value_at, header_value_length)):
            value, pos = _varints(buf, pos, rest_bad)
            np.minimum(pos, rest_limit, out=pos)
            target_at[into] = pos
            target_length[into] = value
            size = np.maximum(value, 0)
            over = size > rest_end - pos
            rest_bad |= over
            pos = np.where(over, rest_limit, pos + np.where(over, 0, size))
        rest_bad |= name_length[into] < 0  # a header key is never null
        at[rest] = pos
        bad[rest] |= rest_bad
        j += 1
        rest = rest[header_count[rest] > j]
    bad |= at != end
    return timestamp_delta, offset_delta, key_at, key_length, value_at, value_length, header_count, header_record, name_at, name_length, header_value_at, header_value_length


def _binary(data: pa.Buffer, at: np.ndarray, length: np.ndarray) -> pa.Array:
    """The byte strings data[at:at + length] (length < 0: null) as one large_binary array: an
    array of them and the gaps between them, over `data` itself, of which every other is taken."""
    n = len(at)
    if not n:
        return pa.array([], type=pa.large_binary())
    nulls = length < 0
    if nulls.all():  # null keys, most topics': nothing to cut out
        return pa.nulls(n, type=pa.large_binary())
    size = np.maximum(length, 0)
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2] = at
    bounds[1::2] = at + size
    both = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 2 * n - 1, [None, pa.py_buffer(bounds), data])
    taken = both.take(pa.array(np.arange(0, 2 * n - 1, 2, dtype=np.int64)))
    if not nulls.any():
        return taken
    validity = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [validity, *taken.buffers()[1:]], null_count=int(nulls.sum()))


def _same_size(n: int, size: int, data: pa.Buffer, type: pa.DataType) -> pa.Array:
    """n values of `size` bytes each, one after the other in `data`, as an array of `type` laid out
    as Arrow's take lays it out (a validity bitmap, all valid): the writer cuts row groups by the
    rows' nbytes, so the files stay byte for byte those a take made."""
    offsets = np.arange(0, (n + 1) * size, size, dtype=np.int64)
    valid = np.full((n + 7) // 8, 0xFF, dtype=np.uint8)
    return pa.Array.from_buffers(type, n, [pa.py_buffer(valid), pa.py_buffer(offsets), data])


def _not_utf8(names: pa.Array, batch_of_name: np.ndarray) -> np.ndarray:
    """The batches (indices) with a header name Python does not decode as UTF-8 (records.py's
    test, made once per distinct name)."""
    if not len(names):
        return np.zeros(0, dtype=np.int64)
    failed = []
    for name in names.unique().to_pylist():
        try:
            name.decode()
        except UnicodeDecodeError:
            failed.append(name)
    if not failed:
        return np.zeros(0, dtype=np.int64)
    hit = np.asarray(pc.is_in(names, value_set=pa.array(failed, pa.large_binary())))
    return np.unique(batch_of_name[hit])


def _kafka_fields(batches: Sequence[Batch]) -> dict[str, Any]:
    """translator.kafka_columns' batch-level fields of `batches`, each as an array (a list for
    batch_compression), in one pass over the batches (kafka_columns a batch is a dict a batch:
    most of the time of batches of one record). tests/compactor/test_columns.py holds the two equal."""
    names = (TIMESTAMP_TYPE, BATCH_BASE_OFFSET, BATCH_LEADER_EPOCH, BATCH_MAGIC, BATCH_BASE_TIMESTAMP, BATCH_MAX_TIMESTAMP, PRODUCER_ID, PRODUCER_EPOCH, BASE_SEQUENCE, IS_CONTROL, IS_TRANSACTIONAL, BATCH_ATTRIBUTES)
    rows = [(b.timestamp_type, b.base_offset, b.partition_leader_epoch, b.magic, b.base_timestamp, b.max_timestamp, b.producer_id, b.producer_epoch, b.base_sequence, b.is_control, b.is_transactional, b.attributes) for b in batches]
    table = np.array(rows, dtype=np.int64).reshape(-1, len(names))
    fields: dict[str, Any] = {name: table[:, i] for i, name in enumerate(names)}
    for name, exact in ((BATCH_BASE_TIMESTAMP, BATCH_BASE_TIMESTAMP_MS), (BATCH_MAX_TIMESTAMP, BATCH_MAX_TIMESTAMP_MS)):
        fields[exact] = fields[name]  # as the batch holds it: kept where the column's is clamped
        fields[name] = np.clip(fields[name], MIN_MS, MAX_MS) * 1000  # ms as timestamptz micros
    fields[IS_CONTROL] = fields[IS_CONTROL].astype(bool)
    fields[IS_TRANSACTIONAL] = fields[IS_TRANSACTIONAL].astype(bool)
    fields[BATCH_COMPRESSION] = [b.codec_name for b in batches]
    return fields


def _exact(stored: np.ndarray, held: np.ndarray, type: pa.DataType) -> pa.Array:
    """A *_ms column: `stored` where its timestamp column does not hold it (`held` false), else null."""
    if held.all():
        return pa.nulls(len(stored), type)
    return pa.array(stored, mask=held, type=type)


def _to_arrow(partition: int, batches: Sequence[Batch], buffer: pa.Buffer, fields: _Fields, keep: np.ndarray, header_keep: np.ndarray, names: pa.Array, counts: np.ndarray, schema: pa.Schema, values_apart: bool) -> RawRows:
    """The kept records as rows of `schema` (`names`: the kept records' header names; `counts`:
    the kept records of each batch, which come batch after batch); `values_apart`: the values left
    in `buffer`, value_raw not filled."""
    if keep.all():
        kept = slice(None)
        n = len(keep)
    else:
        kept = np.flatnonzero(keep)
        n = len(kept)
    offsets, timestamps = fields.offsets[kept], fields.timestamps[kept]
    kafka_type = schema.field(KAFKA).type
    live = np.flatnonzero(counts)
    per_batch = _kafka_fields([batches[i] for i in live.tolist()])
    repeats = counts[live]
    kafka_arrays = []
    for f in kafka_type:
        if f.name == OFFSET:
            kafka_arrays.append(pa.array(offsets, type=f.type))
        elif f.name == TIMESTAMP:
            kafka_arrays.append(pa.array(timestamps * 1000).view(f.type))
        elif f.name == PARTITION:
            kafka_arrays.append(pa.array(np.full(n, partition, dtype=np.int32), type=f.type))
        elif f.name == RECORD_ATTRIBUTES:
            attributes = fields.attributes[kept]
            kafka_arrays.append(pa.array(attributes.astype(np.int32), mask=attributes == 0, type=f.type) if attributes.any() else pa.nulls(n, f.type))
        elif f.name == BATCH_ATTRIBUTES:
            attributes = per_batch[f.name]
            plain = (attributes & ~FLAGGED_ATTRIBUTES) == 0
            kafka_arrays.append(pa.nulls(n, f.type) if plain.all() else pa.array(np.repeat(attributes, repeats).astype(np.int32), mask=np.repeat(plain, repeats), type=f.type))
        elif f.name == TIMESTAMP_MS:
            stored = fields.stored_timestamps[kept]
            kafka_arrays.append(_exact(stored, stored == timestamps, f.type))
        elif f.name in (BATCH_BASE_TIMESTAMP_MS, BATCH_MAX_TIMESTAMP_MS):
            stored = per_batch[f.name]
            held = (stored >= MIN_MS) & (stored <= MAX_MS)
            kafka_arrays.append(pa.nulls(n, f.type) if held.all() else _exact(np.repeat(stored, repeats), np.repeat(held, repeats), f.type))
        elif f.name == STORED_BATCH:
            kafka_arrays.append(pa.nulls(n, f.type))
        else:
            values = per_batch[f.name]
            if pa.types.is_large_string(f.type):
                name = values[0].encode() if values else b""
                if name and len(set(values)) == 1:  # one codec: its name n times
                    kafka_arrays.append(_same_size(n, len(name), pa.py_buffer(name * n), f.type))
                else:
                    kafka_arrays.append(pa.array(values, type=f.type).take(pa.array(np.repeat(np.arange(len(live)), repeats))))
            elif pa.types.is_timestamp(f.type):
                kafka_arrays.append(pa.array(np.repeat(values, repeats)).view(f.type))
            else:  # repeated in the column's own width: Arrow takes the array as it is, no cast
                kafka_arrays.append(pa.array(np.repeat(values.astype(f.type.to_pandas_dtype()), repeats), type=f.type))
    header_type = schema.field(HEADERS).type
    element = header_type.value_type
    firsts = np.zeros(n + 1, dtype=np.int64)
    if len(names):  # else none has a header: every list starts at 0
        np.cumsum(fields.header_count[kept], out=firsts[1:])
    header_values = _binary(buffer, fields.header_value_at[header_keep], fields.header_value_length[header_keep])
    header_fields = {HEADER_KEY: names.view(element.field(HEADER_KEY).type), HEADER_VALUE: header_values.cast(element.field(HEADER_VALUE).type)}
    # a key that is not UTF-8 takes records.py's path: key_bytes is null here
    structs = pa.StructArray.from_arrays([header_fields.get(f.name, pa.nulls(len(names), f.type)) for f in element], fields=list(element))
    columns = {
        KAFKA: pa.StructArray.from_arrays(kafka_arrays, fields=list(kafka_type)),
        HEADERS: pa.LargeListArray.from_arrays(pa.array(firsts), structs, type=header_type),
        KEY_RAW: _binary(buffer, fields.key_at[kept], fields.key_length[kept]).cast(schema.field(KEY_RAW).type),
    }
    spans = None
    if not values_apart:
        values = _binary(buffer, fields.value_at[kept], fields.value_length[kept])
        columns[VALUE_RAW] = values.cast(schema.field(VALUE_RAW).type)
        tombstones = values.null_count
    else:  # the values stay where they are: a copy of them all saved, when they are read into columns
        spans = ValueSpans(np.frombuffer(buffer, dtype=np.uint8), fields.value_at[kept], fields.value_length[kept])
        tombstones = spans.nulls
    arrays = [columns[f.name] if f.name in columns else pa.nulls(n, type=f.type) for f in schema]
    return RawRows(pa.RecordBatch.from_arrays(arrays, schema=schema), offsets, timestamps, tombstones, values=spans)

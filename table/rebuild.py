"""Kafka record batches rebuilt from the table's rows, every batch's records encoded at once.

The rows of a window (one partition, offset order) hold, per record, its offset, timestamp, key,
value and headers, and per original batch (kafka.batch_*, repeated on each of its rows) the header
fields. A records section (wal/batch.py's layout) is, per record:

    length attributes timestampDelta offsetDelta keyLength key valueLength value headerCount headers

every integer a zigzag varint. Here each varint column is encoded for all rows at once (numpy), a
record's varints before its key (or value) packed as one piece, after room for a header before
each batch's first record; the pieces of every record are joined by Arrow
(binary_join_element_wise: one pass, no Python object per record), and Python runs once
per batch, never once per record: an uncompressed batch's header and CRC are written into that
room, so the joined buffer is the batches, end to end, served as it is; a compressed batch is
framed apart (wal.batch_builder.frame_batch: codec, header, CRC).

Values come from value_raw, or for Avro values kept as columns from the writer schema's encoder
(table/avro_values.py, one Python call per such value: the only per-record work left).

What the fields cannot say is kept beside them and used here: each record's attributes byte, the
batch's attribute bits above the control bit, a header key's bytes when it is not UTF-8, the
exact ms of a timestamp its field holds clamped (or, in a LogAppendTime batch, the timestamp the
record itself holds); and a batch whose records are no rows (stored_batch) is its stored bytes,
served with the offset a fetch injects.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from crc32c import crc32c

from wal.batch import BATCH_HEADER, BATCH_HEADER_SIZE, CODEC_NAMES, LOG_OVERHEAD, inject_offsets
from wal.batch_builder import LOG_APPEND_TIME, NONE, codec_for, frame_batch, zigzag_varint

from .avro_values import ValueEncoder
from .layout import (
    BASE_SEQUENCE,
    BATCH_ATTRIBUTES,
    BATCH_BASE_OFFSET,
    BATCH_BASE_TIMESTAMP,
    BATCH_COMPRESSION,
    BATCH_MAX_TIMESTAMP,
    EXACT_MS,
    FLAGGED_ATTRIBUTES,
    HEADER_KEY,
    HEADER_KEY_BYTES,
    HEADER_VALUE,
    HEADERS,
    IS_CONTROL,
    IS_TRANSACTIONAL,
    KAFKA,
    KEY_RAW,
    OFFSET,
    PARTITION,
    PRODUCER_EPOCH,
    PRODUCER_ID,
    RECORD_ATTRIBUTES,
    STORED_BATCH,
    TIMESTAMP,
    TIMESTAMP_TYPE,
    VALUE,
    VALUE_RAW,
    VALUE_SCHEMA_ID,
)

_MAX_VARINT = 10  # bytes of a 64-bit zigzag varint
# Kafka's batch header (wal/batch.py's layout): the attribute bits besides the codec, and where
# the CRC-32C sits (it covers the attributes to the batch's end)
ATTRIBUTE_LOG_APPEND_TIME, ATTRIBUTE_TRANSACTIONAL, ATTRIBUTE_CONTROL = 0x08, 0x10, 0x20
CRC_POSITION, ATTRIBUTES_POSITION = 17, 21
# the header's fields (BATCH_HEADER's), big-endian and packed: every batch's header at once
_HEADER = np.dtype(
    [("base_offset", ">i8"), ("length", ">i4"), ("leader_epoch", ">i4"), ("magic", "i1"), ("crc", ">u4"), ("attributes", ">i2"), ("last_offset_delta", ">i4"),
     ("base_timestamp", ">i8"), ("max_timestamp", ">i8"), ("producer_id", ">i8"), ("producer_epoch", ">i2"), ("base_sequence", ">i4"), ("count", ">i4")]
)  # fmt: skip
assert _HEADER.itemsize == BATCH_HEADER.size == BATCH_HEADER_SIZE
_CODEC_NAMES = pa.array(CODEC_NAMES)


@dataclass(slots=True)
class _Zigzag:
    """A column of zigzagged values (unsigned, 32-bit when they fit: half the bytes to shift) and
    each one's varint width (a byte each), `most` the widest; `same` the one varint when every
    value is the same (a null key's length, a fixed-size value's: copied, not encoded)."""

    z: np.ndarray
    widths: np.ndarray
    most: int
    varying: bool  # not every width is `most`
    same: bytes | None = None
    value: int = 0  # every value, with `same`

    def width(self) -> np.ndarray | int:
        return self.widths if self.same is None else len(self.same)


def _zigzag(values: np.ndarray) -> _Zigzag:
    n = np.asarray(values, dtype=np.int64)
    if not len(n):
        return _Zigzag(n.view(np.uint64), np.ones(0, dtype=np.uint8), 1, False)
    lo, hi = int(n.min()), int(n.max())
    if lo == hi:
        same = zigzag_varint(lo)
        return _Zigzag(n.view(np.uint64), np.full(len(n), len(same), dtype=np.uint8), len(same), False, same, lo)
    top = max((lo << 1) ^ (lo >> 63), (hi << 1) ^ (hi >> 63))
    if top < 1 << 32:  # the values fit 32 bits signed: zigzagged there, half the bytes to go over
        n = n.astype(np.int32)
    # a non-negative value's zigzag is twice it (an add: far cheaper than numpy's shifts)
    z = (n + n if lo >= 0 else (n << 1) ^ (n >> (n.itemsize * 8 - 1))).view(np.uint32 if n.itemsize == 4 else np.uint64)
    widths = np.ones(len(z), dtype=np.uint8)
    for k in range(1, _MAX_VARINT):
        if top < 1 << (7 * k):
            break
        widths += z >= z.dtype.type(1 << (7 * k))
    most = int(widths.max())
    return _Zigzag(z, widths, most, int(widths.min()) != most)


def _packed(pieces: list[_Zigzag | bytes | np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, widths): each row's pieces (varints, the same bytes on every row, or a byte a row
    as a uint8 array) one after another, the rows end to end, row i taking widths[i] bytes. Each piece has a slot of its widest
    varint in an n-row matrix, filled a column at a time; the bytes past a row's varint are
    dropped at the end (one boolean selection), only when some piece's widths vary."""
    pieces = [p.same if isinstance(p, _Zigzag) and p.same is not None else p for p in pieces]
    slots = sum(p.most if isinstance(p, _Zigzag) else 1 if isinstance(p, np.ndarray) else len(p) for p in pieces)
    matrix = np.empty((n, slots), dtype=np.uint8)
    keep = np.ones((n, slots), dtype=bool) if any(isinstance(p, _Zigzag) and p.varying for p in pieces) else None
    widths = np.full(n, sum(1 if isinstance(p, np.ndarray) else len(p) for p in pieces if not isinstance(p, _Zigzag)), dtype=np.int64)
    at = 0
    for piece in pieces:
        if isinstance(piece, np.ndarray):  # a byte a row (the records' attributes)
            matrix[:, at] = piece
            at += 1
            continue
        if not isinstance(piece, _Zigzag):
            for byte in piece:  # a column at a time (numpy copies a row of a few bytes n times slowly)
                matrix[:, at] = byte
                at += 1
            continue
        z, w, most, seven = piece.z, piece.widths, piece.most, piece.z.dtype.type(7)
        for k in range(most):
            group = z.astype(np.uint8)  # its low byte, of which the low 7 bits are this group
            group &= 0x7F
            if k < most - 1:  # every byte but a varint's last carries the continuation bit
                if piece.varying:
                    more = w > k + 1
                    keep[:, at + k + 1] = more
                    group |= more.view(np.uint8) << 7
                else:
                    group |= 0x80
                z = z >> seven
            matrix[:, at + k] = group
        widths += w
        at += most
    return (matrix.reshape(-1) if keep is None else matrix[keep]), widths


def varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, widths): each value (signed 64-bit) as Kafka's zigzag varint, all written one after
    another into `bytes`, value i taking widths[i] of them."""
    return _packed([_zigzag(values)], len(values))


def _binary(data: np.ndarray, widths: np.ndarray) -> pa.Array:
    """Variable-width pieces laid end to end in `data` as one binary array."""
    offsets = np.zeros(len(widths) + 1, dtype=np.int32)
    np.cumsum(widths, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(widths), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _varint_column(values: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    data, widths = varints(values)
    return _binary(data, widths), widths


def _roomy(data: np.ndarray, widths: np.ndarray, starts: np.ndarray, room: int, tail: bool) -> pa.Array:
    """Rows laid end to end in `data` (row i widths[i] bytes) as one binary array, `room` zero
    bytes put in before each row of `starts` (part of that row's value); with `tail`, one more
    row after them, a zero byte."""
    n = len(widths)
    before = np.zeros(n, dtype=np.int64)
    before[starts] = room
    offsets = np.zeros(n + 1 + tail, dtype=np.int64)
    np.cumsum(widths + before, out=offsets[1 : n + 1])
    if tail:
        offsets[-1] = offsets[-2] + 1
    out = np.zeros(int(offsets[-1]), dtype=np.uint8)
    mine = np.ones(len(out), dtype=bool)
    mine[(offsets[starts][:, None] + np.arange(room)).reshape(-1)] = False
    if tail:
        mine[-1] = False
    out[mine] = data
    return pa.Array.from_buffers(pa.binary(), n + tail, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(out)])


def _one_more(column: pa.Array) -> pa.Array:
    """A binary array (no nulls) and one more value after it, empty: new offsets, the same data."""
    offsets = _offsets(column)
    data = column.buffers()[2] or pa.py_buffer(b"")
    return pa.Array.from_buffers(pa.binary(), len(column) + 1, [None, pa.py_buffer(np.append(offsets, offsets[-1])), data])


def _array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array (a copy only when it has several chunks)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _offsets(column: pa.Array) -> np.ndarray:
    """The value offsets of a binary array (len + 1 of them, into its data buffer)."""
    return np.frombuffer(column.buffers()[1], dtype=np.int32, count=len(column) + 1, offset=column.offset * 4)


def _lengths(column: pa.Array) -> np.ndarray:
    """Byte length of each binary value; -1 for null (Kafka's null key, value or header value)."""
    n = len(column)
    if column.null_count == n:
        return np.full(n, -1, dtype=np.int64)
    large = column.type in (pa.large_binary(), pa.large_string())
    kind = np.int64 if large else np.int32
    lengths = np.diff(np.frombuffer(column.buffers()[1], dtype=kind, count=n + 1, offset=column.offset * np.dtype(kind).itemsize)).astype(np.int64)
    if column.null_count:
        lengths[~column.is_valid().to_numpy(zero_copy_only=False)] = -1
    return lengths


def _bytes(column: pa.Array) -> pa.Array:
    """The column as plain (32-bit offset) binary, nulls as empty values (their length says null)."""
    if column.type != pa.binary():
        column = column.cast(pa.binary())
    return pc.fill_null(column, b"") if column.null_count else column


def _headers(rows: pa.Table) -> tuple[pa.Array | bytes, np.ndarray | int]:
    """(each record's headerCount and headers as one binary value, their byte lengths); a
    constant count of zero (one byte) when no record has a header."""
    n = len(rows)
    if HEADERS not in rows.column_names:
        return b"\x00", 1
    column = _array(rows.column(HEADERS))
    bounds = column.offsets  # no record has a header when the first record's start is the last's end
    if not n or bounds[0] == bounds[n]:
        return b"\x00", 1
    counts = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(column)
    keys, values = _bytes(flat.field(HEADER_KEY)), flat.field(HEADER_VALUE)
    if flat.type.get_field_index(HEADER_KEY_BYTES) >= 0:
        exact = flat.field(HEADER_KEY_BYTES)
        if exact.null_count < len(exact):  # keys that are not UTF-8: their bytes, not the text
            keys = pc.if_else(exact.is_valid(), exact.cast(pa.binary()), keys)
    key_lengths, value_lengths = _lengths(keys), _lengths(values)
    key_prefix, key_widths = _varint_column(key_lengths)
    value_prefix, value_widths = _varint_column(value_lengths)
    each = pc.binary_join_element_wise(key_prefix, keys, value_prefix, _bytes(values), b"")
    # a record's headers are adjacent in `each`: its bytes run from its first header's start to the
    # next record's, so the concatenation is new offsets over the same data
    starts = _offsets(each)[np.concatenate(([0], np.cumsum(counts)))]
    spans = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(np.ascontiguousarray(starts)), each.buffers()[2]])
    count_prefix, count_widths = _varint_column(counts)
    return pc.binary_join_element_wise(count_prefix, spans, b""), count_widths + np.diff(starts)


@dataclass(slots=True)
class Batches:
    """Rebuilt batches laid end to end in one buffer: batch k is data[bounds[k]:bounds[k + 1]],
    holding offsets up to lasts[k]. A run of them goes out as one slice, not joined again."""

    lasts: list[int]
    data: memoryview
    bounds: list[int]

    def __len__(self) -> int:
        return len(self.lasts)

    def batch(self, k: int) -> memoryview:
        return self.data[self.bounds[k] : self.bounds[k + 1]]

    def part(self, i: int, j: int) -> Batches:
        """Batches i to j (not j), a view of the same buffer."""
        lo = self.bounds[i]
        return Batches(self.lasts[i:j], self.data[lo : self.bounds[j]], [b - lo for b in self.bounds[i : j + 1]])


_NO_BATCHES = Batches([], memoryview(b""), [0])


def rebuild_batches(rows: pa.Table, compression: str, encoders: dict[int, ValueEncoder | None], complete: bool) -> tuple[list[int], list[memoryview]]:
    """(last offsets, batches) of the rows' batches, in offset order; the last batch left out
    unless `complete` (its rows may go on beyond these)."""
    built = rebuild_run(rows, compression, encoders, complete)
    return built.lasts, [built.batch(k) for k in range(len(built))]


def rebuild_run(rows: pa.Table, compression: str, encoders: dict[int, ValueEncoder | None], complete: bool) -> Batches:
    """The rows' batches, in offset order, in one buffer; the last batch left out unless
    `complete` (its rows may go on beyond these)."""
    if len(rows) == 0:
        return _NO_BATCHES
    kafka = _array(rows.column(KAFKA))
    bases = kafka.field(BATCH_BASE_OFFSET).to_numpy(zero_copy_only=False)
    starts = np.concatenate(([0], np.flatnonzero(bases[1:] != bases[:-1]) + 1))
    if not complete:
        rows, kafka, bases = rows.slice(0, int(starts[-1])), kafka.slice(0, int(starts[-1])), bases[: starts[-1]]
        starts = starts[:-1]
        if not len(starts):
            return _NO_BATCHES
    return _encode(rows, kafka, bases, starts, compression, encoders)


def rebuild_partitions(rows: pa.Table, compression: str, encoders: dict[int, ValueEncoder | None]) -> tuple[np.ndarray, Batches]:
    """(each batch's first row, the batches) of rows that run partition by partition, each
    partition's in offset order (a row group of neve's files), every batch taken as whole: each
    is byte for byte what rebuild_batches makes of that partition's rows."""
    if len(rows) == 0:
        return np.zeros(0, dtype=np.int64), _NO_BATCHES
    kafka = _array(rows.column(KAFKA))
    bases = kafka.field(BATCH_BASE_OFFSET).to_numpy(zero_copy_only=False)
    partitions = kafka.field(PARTITION).to_numpy(zero_copy_only=False)
    starts = np.concatenate(([0], np.flatnonzero((bases[1:] != bases[:-1]) | (partitions[1:] != partitions[:-1])) + 1))
    return starts, _encode(rows, kafka, bases, starts, compression, encoders)


def _encode(rows: pa.Table, kafka: pa.Array, bases: np.ndarray, starts: np.ndarray, compression: str, encoders: dict[int, ValueEncoder | None]) -> Batches:
    """The batches whose rows begin at `starts` (each runs to the next). Their records are joined
    with room for a header before each batch's first record: an uncompressed batch's header is
    written into that room, so the join's one buffer is every batch, copied no more."""
    n = len(rows)
    ends = np.append(starts[1:], n)
    first_rows = pa.array(starts, pa.int64())

    def millis(name: str, rows: pa.Array | None = None) -> np.ndarray:
        """A timestamp field's ms, or its exact ms where the field holds it clamped."""
        column = kafka.field(name) if rows is None else kafka.field(name).take(rows)
        ms = column.cast(pa.int64()).to_numpy(zero_copy_only=False) // 1000
        if kafka.type.get_field_index(EXACT_MS[name]) < 0:  # a table's rows from before *_ms
            return ms
        exact = kafka.field(EXACT_MS[name]) if rows is None else kafka.field(EXACT_MS[name]).take(rows)
        if exact.null_count == len(exact):
            return ms
        return np.where(exact.is_valid().to_numpy(zero_copy_only=False), exact.fill_null(0).to_numpy(zero_copy_only=False), ms)

    offsets = np.asarray(kafka.field(OFFSET).to_numpy(zero_copy_only=False), dtype=np.int64)
    base_ts = millis(BATCH_BASE_TIMESTAMP, first_rows)
    max_ts = millis(BATCH_MAX_TIMESTAMP, first_rows)
    keys = _array(rows.column(KEY_RAW)) if KEY_RAW in rows.column_names else pa.nulls(n, pa.binary())
    values = _values(rows, encoders)
    key_lengths, value_lengths = _lengths(keys), _lengths(values)
    headers, header_sizes = _headers(rows)

    with np.errstate(over="ignore"):  # Kafka's delta is a Java long's difference: wrapped
        timestamp = _zigzag(millis(TIMESTAMP) - np.repeat(base_ts, ends - starts))
    attributes = _optional(kafka, RECORD_ATTRIBUTES, 0).astype(np.uint8)
    offset_delta = _zigzag(offsets - bases)
    key_prefix, value_prefix = _zigzag(key_lengths), _zigzag(value_lengths)
    # the record's length counts everything after itself: attributes (1 byte) to its last header
    # (summed in place, the widths and lengths the same on every row added once)
    sizes = np.full(n, 1 + sum(max(c.value, 0) for c in (key_prefix, value_prefix) if c.same is not None), dtype=np.int64)
    for part in (timestamp.width(), offset_delta.width(), key_prefix.width(), value_prefix.width(), header_sizes):
        sizes += part
    for column, lengths in ((key_prefix, key_lengths), (value_prefix, value_lengths)):
        if column.same is None:
            sizes += np.maximum(lengths, 0)
    # a record's fields up to its key (or, with no key bytes anywhere, up to its value) are
    # varints and the attributes byte: packed here as one piece a record, after room for a header
    # before each batch's first record, so the join takes few pieces (its cost is per piece)
    keyless = key_prefix.value <= 0 if key_prefix.same is not None else not (key_lengths > 0).any()
    # with no header anywhere, a record ends in the same byte (headerCount 0), packed as the next
    # record's first (the room before a batch is zeros too, so before or after it is the same),
    # the last record's as one more row: the join takes a piece fewer
    trailing = isinstance(headers, bytes)
    attribute = attributes if attributes.any() else b"\x00"
    lead: list[_Zigzag | bytes | np.ndarray] = [*([headers] if trailing else []), _zigzag(sizes), attribute, timestamp, offset_delta, key_prefix, *([value_prefix] if keyless else [])]
    data, widths = _packed(lead, n)
    if trailing:  # the first record follows no other
        data, widths[0] = data[1:], widths[0] - 1
    pieces = [_roomy(data, widths, starts, BATCH_HEADER_SIZE, trailing)]
    if not keyless:
        pieces += [_bytes(keys), _binary(*_packed([value_prefix], n))]
    pieces.append(_bytes(values))
    if trailing:
        pieces[1:] = [_one_more(p) for p in pieces[1:]]
    else:
        pieces.append(headers)
    records = pc.binary_join_element_wise(*pieces, b"")
    record_starts = _offsets(records)
    # each batch's bytes from its room to its last record's end (the next record's first byte)
    bounds = np.append(record_starts[starts] + (trailing & (starts > 0)), record_starts[-1]).astype(np.int64)
    # the join's own new buffer, nothing else holds it: written in place
    data = memoryview(records.buffers()[2]).cast("B")  # as bytes (Arrow exports signed chars)

    def first(name: str) -> np.ndarray:
        return kafka.field(name).take(first_rows).to_numpy(zero_copy_only=False)

    names = kafka.field(BATCH_COMPRESSION).take(first_rows)
    named = pc.index_in(names, value_set=_CODEC_NAMES)  # each batch's codec as its index, no Python string a batch
    if named.null_count:
        raise ValueError(f"batch compression {pc.filter(names, named.is_null())[0]} is none of {', '.join(CODEC_NAMES)}")
    codecs = np.array([codec_for(compression, i) for i in range(len(CODEC_NAMES))])[named.to_numpy(zero_copy_only=False)]
    head = np.zeros(len(starts), dtype=_HEADER)
    head["base_offset"] = bases[starts]
    head["length"] = np.diff(bounds) - LOG_OVERHEAD
    head["magic"] = 2
    # the bits Kafka has no flag for here (above the control bit) as produced
    extra = _optional(kafka, BATCH_ATTRIBUTES, 0, first_rows) & ~FLAGGED_ATTRIBUTES
    head["attributes"] = np.where(first(TIMESTAMP_TYPE) == LOG_APPEND_TIME, ATTRIBUTE_LOG_APPEND_TIME, 0) | ATTRIBUTE_TRANSACTIONAL * first(IS_TRANSACTIONAL) | ATTRIBUTE_CONTROL * first(IS_CONTROL) | extra
    head["last_offset_delta"] = offsets[ends - 1] - bases[starts]
    head["base_timestamp"], head["max_timestamp"] = base_ts, max_ts
    head["producer_id"], head["producer_epoch"], head["base_sequence"] = first(PRODUCER_ID), first(PRODUCER_EPOCH), first(BASE_SEQUENCE)
    head["count"] = ends - starts
    # the uncompressed batches' headers, all at once, then each one's CRC (it covers the header's
    # fields after it): the bytes frame_batch would make of them
    plain = np.flatnonzero(codecs == NONE)
    written = np.frombuffer(data, dtype=np.uint8)
    at = bounds[plain]
    written[at[:, None] + np.arange(BATCH_HEADER_SIZE)] = head[plain].view(np.uint8).reshape(-1, BATCH_HEADER_SIZE)
    crcs = [crc32c(data[lo + CRC_POSITION + 4 : hi]) for lo, hi in zip(at.tolist(), bounds[plain + 1].tolist(), strict=True)]
    written[at[:, None] + np.arange(CRC_POSITION, CRC_POSITION + 4)] = np.array(crcs, dtype=">u4").view(np.uint8).reshape(-1, 4)
    lasts = offsets[ends - 1].tolist()
    stored = _optional(kafka, STORED_BATCH, False, first_rows).astype(bool)
    if len(plain) == len(starts) and not stored.any():
        return Batches(lasts, data[: int(bounds[-1])], bounds.tolist())
    raw = _array(rows.column(VALUE_RAW)).take(first_rows) if stored.any() else None
    framed: list[bytes | memoryview] = []  # the batches, the compressed ones framed apart
    for k, (lo, hi, codec) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), codecs.tolist(), strict=True)):
        if stored[k]:  # a batch whose records are no rows: as stored, with the offset a fetch injects
            assert raw is not None
            framed.append(inject_offsets(raw[k].as_py(), int(bases[starts[k]])))
            continue
        if codec == NONE:
            framed.append(data[lo:hi])
            continue
        h = head[k]
        framed.append(
            frame_batch(
                data[lo + BATCH_HEADER_SIZE : hi], int(h["count"]), codec=codec, timestamp_type=LOG_APPEND_TIME if h["attributes"] & ATTRIBUTE_LOG_APPEND_TIME else 0,
                base_timestamp=int(h["base_timestamp"]), max_timestamp=int(h["max_timestamp"]), last_offset_delta=int(h["last_offset_delta"]),
                producer_id=int(h["producer_id"]), producer_epoch=int(h["producer_epoch"]), base_sequence=int(h["base_sequence"]),
                is_transactional=bool(h["attributes"] & ATTRIBUTE_TRANSACTIONAL), is_control=bool(h["attributes"] & ATTRIBUTE_CONTROL),
                partition_leader_epoch=0, base_offset=int(h["base_offset"]),
            )
        )  # fmt: skip
        if extra[k]:  # frame_batch sets the bits it has flags for: the others, and the CRC again
            batch = bytearray(framed[-1])
            struct.pack_into(">h", batch, ATTRIBUTES_POSITION, int(h["attributes"]) | int(codec) if int(h["count"]) else int(h["attributes"]))
            struct.pack_into(">I", batch, CRC_POSITION, crc32c(memoryview(batch)[ATTRIBUTES_POSITION:]))
            framed[-1] = bytes(batch)
    return Batches(lasts, memoryview(b"".join(framed)), [0, *np.cumsum([len(b) for b in framed]).tolist()])


def _optional(kafka: pa.Array, name: str, default, rows: pa.Array | None = None) -> np.ndarray:
    """An optional kafka field's values (of `rows`), `default` where null or where the rows are
    from before the field."""
    n = len(kafka) if rows is None else len(rows)
    if kafka.type.get_field_index(name) < 0:
        return np.full(n, default)
    column = kafka.field(name) if rows is None else kafka.field(name).take(rows)
    if column.null_count == n:
        return np.full(n, default)
    return column.fill_null(default).to_numpy(zero_copy_only=False)


def _values(rows: pa.Table, encoders: dict[int, ValueEncoder | None]) -> pa.Array:
    """Each row's value bytes: value_raw where kept; the columns re-encoded where the value has a
    schema id and no raw bytes; null for a tombstone (neither)."""
    names = rows.column_names
    raw = _array(rows.column(VALUE_RAW)).cast(pa.binary()) if VALUE_RAW in names else pa.nulls(len(rows), pa.binary())
    if VALUE_SCHEMA_ID not in names or VALUE not in names:
        return raw
    ids = _array(rows.column(VALUE_SCHEMA_ID))
    wanted = np.flatnonzero(pc.and_(raw.is_null(), ids.is_valid()).to_numpy(zero_copy_only=False))
    if not len(wanted):
        return raw
    taken = pa.array(wanted, pa.int64())
    columns = rows.column(VALUE).take(taken).to_pylist()
    encoded = []
    for i, schema_id, column in zip(wanted.tolist(), ids.take(taken).to_pylist(), columns, strict=True):
        encoder = encoders.get(schema_id)
        if encoder is None:
            raise ValueError(f"offset row {i}: schema id {schema_id} of a value kept as columns is not in the registry")
        encoded.append(encoder.encode(column))
    mask = np.zeros(len(raw), dtype=bool)
    mask[wanted] = True
    return pc.replace_with_mask(raw, pa.array(mask), pa.array(encoded, pa.binary()))

"""Kafka record batches rebuilt from the table's rows, every batch's records encoded at once.

The rows of a window (one partition, offset order) hold, per record, its offset, timestamp, key,
value and headers, and per original batch (kafka.batch_*, repeated on each of its rows) the header
fields. A records section (wal/batch.py's layout) is, per record:

    length attributes timestampDelta offsetDelta keyLength key valueLength value headerCount headers

every integer a zigzag varint. Here each varint column is encoded for all rows at once (numpy), the
pieces of every record are joined by Arrow (binary_join_element_wise: one pass, no Python object
per record), and a batch's section is then a slice of that one buffer: Python runs once per batch
(wal.batch_builder.frame_batch: codec, header, CRC), never once per record.

Values come from value_raw, or for Avro values kept as columns from the writer schema's encoder
(table/avro_values.py, one Python call per such value: the only per-record work left).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wal.batch import CODEC_NAMES
from wal.batch_builder import codec_for, frame_batch

from .avro_values import ValueEncoder

_BATCH_FIELDS = ("timestamp_type", "batch_compression", "producer_id", "producer_epoch", "base_sequence", "is_control", "is_transactional")
_MAX_VARINT = 10  # bytes of a 64-bit zigzag varint


def varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, widths): each value (signed 64-bit) as Kafka's zigzag varint, all written one after
    another into `bytes`, value i taking widths[i] of them."""
    n = np.asarray(values, dtype=np.int64)
    z = ((n << 1) ^ (n >> 63)).view(np.uint64)
    widths = np.ones(len(z), dtype=np.int64)
    top = int(z.max()) if len(z) else 0
    for k in range(1, _MAX_VARINT):
        if top < 1 << (7 * k):
            break
        widths += z >= np.uint64(1 << (7 * k))
    most = int(widths.max()) if len(z) else 1
    groups = ((z[:, None] >> (np.arange(most, dtype=np.uint64) * np.uint64(7))) & np.uint64(0x7F)).astype(np.uint8)
    place = np.arange(most)
    groups[place < widths[:, None] - 1] |= 0x80  # every byte but a varint's last carries the continuation bit
    return groups[place < widths[:, None]], widths


def _binary(data: np.ndarray, widths: np.ndarray) -> pa.Array:
    """Variable-width pieces laid end to end in `data` as one binary array."""
    offsets = np.zeros(len(widths) + 1, dtype=np.int32)
    np.cumsum(widths, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(widths), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _varint_column(values: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    data, widths = varints(values)
    return _binary(data, widths), widths


def _array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array (a copy only when it has several chunks)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _offsets(column: pa.Array) -> np.ndarray:
    """The value offsets of a binary array (len + 1 of them, into its data buffer)."""
    return np.frombuffer(column.buffers()[1], dtype=np.int32, count=len(column) + 1, offset=column.offset * 4)


def _lengths(column: pa.Array) -> np.ndarray:
    """Byte length of each binary value; -1 for null (Kafka's null key, value or header value)."""
    return pc.fill_null(pc.binary_length(column), -1).to_numpy(zero_copy_only=False).astype(np.int64)


def _bytes(column: pa.Array) -> pa.Array:
    """The column as plain (32-bit offset) binary, nulls as empty values (their length says null)."""
    if column.type != pa.binary():
        column = column.cast(pa.binary())
    return pc.fill_null(column, b"") if column.null_count else column


def _headers(rows: pa.Table) -> tuple[pa.Array | bytes, np.ndarray]:
    """(each record's headerCount and headers as one binary value, their byte lengths); a
    constant count of zero when no record has a header."""
    n = len(rows)
    if "headers" not in rows.column_names:
        return b"\x00", np.ones(n, dtype=np.int64)
    column = _array(rows.column("headers"))
    counts = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
    if not counts.any():
        return b"\x00", np.ones(n, dtype=np.int64)
    flat = pc.list_flatten(column)
    keys, values = _bytes(flat.field("key")), flat.field("value")
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


def rebuild_batches(rows: pa.Table, compression: str, encoders: dict[int, ValueEncoder | None], complete: bool) -> tuple[list[int], list[bytes]]:
    """(last offsets, batches) of the rows' batches, in offset order; the last batch left out
    unless `complete` (its rows may go on beyond these)."""
    if len(rows) == 0:
        return [], []
    kafka = _array(rows.column("kafka"))
    bases = kafka.field("batch_base_offset").to_numpy(zero_copy_only=False)
    starts = np.concatenate(([0], np.flatnonzero(bases[1:] != bases[:-1]) + 1))
    if not complete:
        rows, kafka, bases = rows.slice(0, int(starts[-1])), kafka.slice(0, int(starts[-1])), bases[: starts[-1]]
        starts = starts[:-1]
        if not len(starts):
            return [], []
    return _encode(rows, kafka, bases, starts, compression, encoders)


def rebuild_partitions(rows: pa.Table, compression: str, encoders: dict[int, ValueEncoder | None]) -> tuple[np.ndarray, list[int], list[bytes]]:
    """(each batch's first row, last offsets, batches) of rows that run partition by partition,
    each partition's in offset order (a row group of neve's files), every batch taken as whole:
    each is byte for byte what rebuild_batches makes of that partition's rows."""
    if len(rows) == 0:
        return np.zeros(0, dtype=np.int64), [], []
    kafka = _array(rows.column("kafka"))
    bases = kafka.field("batch_base_offset").to_numpy(zero_copy_only=False)
    partitions = kafka.field("partition").to_numpy(zero_copy_only=False)
    starts = np.concatenate(([0], np.flatnonzero((bases[1:] != bases[:-1]) | (partitions[1:] != partitions[:-1])) + 1))
    lasts, batches = _encode(rows, kafka, bases, starts, compression, encoders)
    return starts, lasts, batches


def _encode(rows: pa.Table, kafka: pa.Array, bases: np.ndarray, starts: np.ndarray, compression: str, encoders: dict[int, ValueEncoder | None]) -> tuple[list[int], list[bytes]]:
    """(last offsets, batches) of the batches whose rows begin at `starts` (each runs to the next)."""
    n = len(rows)
    ends = np.append(starts[1:], n)
    first_rows = pa.array(starts, pa.int64())
    batch_of = np.repeat(np.arange(len(starts)), ends - starts)

    def millis(column: pa.Array) -> np.ndarray:
        return column.cast(pa.int64()).to_numpy(zero_copy_only=False) // 1000

    offsets = kafka.field("offset").to_numpy(zero_copy_only=False).astype(np.int64)
    base_ts = millis(kafka.field("batch_base_timestamp").take(first_rows))
    max_ts = millis(kafka.field("batch_max_timestamp").take(first_rows))
    keys = _array(rows.column("key_raw")) if "key_raw" in rows.column_names else pa.nulls(n, pa.binary())
    values = _values(rows, encoders)
    key_lengths, value_lengths = _lengths(keys), _lengths(values)
    headers, header_sizes = _headers(rows)

    timestamp, timestamp_widths = _varint_column(millis(kafka.field("timestamp")) - base_ts[batch_of])
    offset_delta, offset_widths = _varint_column(offsets - bases)
    key_prefix, key_widths = _varint_column(key_lengths)
    value_prefix, value_widths = _varint_column(value_lengths)
    # the record's length counts everything after itself: attributes (1 byte) to its last header
    sizes = 1 + timestamp_widths + offset_widths + key_widths + np.maximum(key_lengths, 0) + value_widths + np.maximum(value_lengths, 0) + header_sizes
    length, _ = _varint_column(sizes)
    records = pc.binary_join_element_wise(length, b"\x00", timestamp, offset_delta, key_prefix, _bytes(keys), value_prefix, _bytes(values), headers, b"")
    record_starts = _offsets(records)
    data = records.buffers()[2]

    meta = {name: kafka.field(name).take(first_rows).to_pylist() for name in _BATCH_FIELDS}
    lasts = offsets[ends - 1].tolist()
    last_deltas = (offsets[ends - 1] - bases[starts]).tolist()
    batches: list[bytes] = []
    for k, (start, stop) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        lo, hi = int(record_starts[start]), int(record_starts[stop])
        batches.append(
            frame_batch(
                memoryview(data)[lo:hi],
                stop - start,
                codec=codec_for(compression, CODEC_NAMES.index(meta["batch_compression"][k])),
                timestamp_type=meta["timestamp_type"][k],
                base_timestamp=int(base_ts[k]),
                max_timestamp=int(max_ts[k]),
                last_offset_delta=last_deltas[k],
                producer_id=meta["producer_id"][k],
                producer_epoch=meta["producer_epoch"][k],
                base_sequence=meta["base_sequence"][k],
                is_transactional=meta["is_transactional"][k],
                is_control=meta["is_control"][k],
                partition_leader_epoch=0,
                base_offset=int(bases[start]),
            )
        )
    return lasts, batches


def _values(rows: pa.Table, encoders: dict[int, ValueEncoder | None]) -> pa.Array:
    """Each row's value bytes: value_raw where kept; the columns re-encoded where the value has a
    schema id and no raw bytes; null for a tombstone (neither)."""
    names = rows.column_names
    raw = _array(rows.column("value_raw")).cast(pa.binary()) if "value_raw" in names else pa.nulls(len(rows), pa.binary())
    if "value_schema_id" not in names or "value" not in names:
        return raw
    ids = _array(rows.column("value_schema_id"))
    wanted = np.flatnonzero(pc.and_(raw.is_null(), ids.is_valid()).to_numpy(zero_copy_only=False))
    if not len(wanted):
        return raw
    taken = pa.array(wanted, pa.int64())
    columns = rows.column("value").take(taken).to_pylist()
    encoded = []
    for i, schema_id, column in zip(wanted.tolist(), ids.take(taken).to_pylist(), columns, strict=True):
        encoder = encoders.get(schema_id)
        if encoder is None:
            raise ValueError(f"offset row {i}: schema id {schema_id} of a value kept as columns is not in the registry")
        encoded.append(encoder.encode(column))
    mask = np.zeros(len(raw), dtype=bool)
    mask[wanted] = True
    return pc.replace_with_mask(raw, pa.array(mask), pa.array(encoded, pa.binary()))

"""Record batches of one index entry's WAL byte range, decoded to records: the batch header fields the
table keeps (offsets as assigned, as a fetch would serve them) and each record's offset, timestamp,
key, value and headers, through every codec. Control batches are decoded and flagged, never skipped.

Batches are stored as produced (wal/batch.py): their baseOffset is the producer's, so the offsets
here come from the index entry's base offset, batch after batch, as offset injection assigns them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from crc32c import crc32c

from wal.batch import BATCH_HEADER, BATCH_HEADER_SIZE, CODEC_NAMES, LOG_OVERHEAD, decompress

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
_CRC_START = 21
_MAGIC_POSITION = 16

_CODEC_MASK = 0x07
_LOG_APPEND_TIME = 0x08
_TRANSACTIONAL = 0x10
_CONTROL = 0x20

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# The leader epoch a fetch writes into every batch it serves (wal.batch.inject_offsets' default,
# which broker/handlers/api01_fetch.py uses): the table keeps what a consumer saw.
SERVED_LEADER_EPOCH = 0


class CorruptBatch(ValueError):
    """A batch whose header, checksum or records do not decode. Names the batch (its index in the
    range, byte position and assigned base offset) so the caller can record what it skipped."""

    def __init__(self, index: int, position: int, base_offset: int, reason: str) -> None:
        super().__init__(f"batch {index} at byte {position} (offset {base_offset}): {reason}")
        self.index = index
        self.position = position
        self.base_offset = base_offset
        self.reason = reason


class Record(NamedTuple):
    offset: int
    timestamp: int  # ms since the epoch (any int64); a LogAppendTime batch's maxTimestamp for each record
    key: bytes | None
    value: bytes | None
    # (key, value): a key that is not UTF-8 stays bytes (Kafka's header keys are any bytes)
    headers: tuple[tuple[str | bytes, bytes | None], ...]
    attributes: int = 0  # the record's attributes byte (Kafka defines no bit of it; kept as produced)
    # the timestamp the record itself holds (baseTimestamp + its delta), when `timestamp` is
    # another (a LogAppendTime batch's): the batch is rebuilt from it
    stored_timestamp: int | None = None


@dataclass(slots=True)
class Batch:
    """One stored batch: its header with the base offset and leader epoch it is served with."""

    index: int  # within the range
    position: int  # byte position within the range
    size: int
    base_offset: int  # as assigned, not as stored
    partition_leader_epoch: int
    magic: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    records: list[Record] = field(default_factory=list)  # filled by decode_records

    @property
    def codec(self) -> int:
        return self.attributes & _CODEC_MASK

    @property
    def codec_name(self) -> str:
        codec = self.codec
        return CODEC_NAMES[codec] if codec < len(CODEC_NAMES) else str(codec)

    @property
    def timestamp_type(self) -> int:
        """Kafka's TimestampType id: 0 CreateTime, 1 LogAppendTime."""
        return 1 if self.attributes & _LOG_APPEND_TIME else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


def iter_batches(data: bytes | memoryview, base_offset: int, leader_epoch: int = SERVED_LEADER_EPOCH) -> Iterator[Batch]:
    """The batches of one entry's byte range, headers only (records not yet decoded), with offsets
    assigned from `base_offset`. Checks framing, magic and CRC-32C; raises CorruptBatch for a batch
    whose framing is broken (nothing after it can be found)."""
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    total = len(view)
    pos = index = 0
    base = base_offset
    while pos < total:
        if total - pos < BATCH_HEADER_SIZE:
            raise CorruptBatch(index, pos, base, f"truncated: {total - pos} bytes left, a header is {BATCH_HEADER_SIZE}")
        (_stored_base, batch_length, _stored_epoch, magic, crc, attributes, last_offset_delta, base_timestamp,
         max_timestamp, producer_id, producer_epoch, base_sequence, record_count) = BATCH_HEADER.unpack_from(view, pos)
        if magic != 2:
            raise CorruptBatch(index, pos, base, f"magic {magic}, only 2 is stored")
        size = LOG_OVERHEAD + batch_length
        if size < BATCH_HEADER_SIZE or pos + size > total:
            raise CorruptBatch(index, pos, base, f"batchLength {batch_length} does not fit the {total - pos} bytes left")
        if crc32c(view[pos + _CRC_START : pos + size]) != crc:
            raise CorruptBatch(index, pos, base, "fails its CRC-32C")
        yield Batch(index, pos, size, base, leader_epoch, magic, attributes, last_offset_delta, base_timestamp,
                    max_timestamp, producer_id, producer_epoch, base_sequence, record_count)
        base += last_offset_delta + 1
        pos += size
        index += 1


def decode_records(data: bytes | memoryview, batch: Batch) -> list[Record]:
    """Decompress and decode `batch`'s records (from the same `data` iter_batches read it from),
    storing them in batch.records too. Raises CorruptBatch naming the batch."""
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    payload = view[batch.position + BATCH_HEADER_SIZE : batch.position + batch.size]
    try:
        buf = bytes(decompress(batch.codec, payload) if batch.codec else payload)
    except Exception as e:  # cramjam's DecompressionError, wal.batch.InvalidRecords
        raise CorruptBatch(batch.index, batch.position, batch.base_offset, f"{batch.codec_name} payload does not decompress: {e}") from e
    log_append = batch.max_timestamp if batch.attributes & _LOG_APPEND_TIME else None
    try:
        records = _decode(buf, batch.record_count, batch.base_offset, batch.base_timestamp, log_append)
    except (IndexError, ValueError) as e:
        raise CorruptBatch(batch.index, batch.position, batch.base_offset, f"records do not decode: {e}") from e
    batch.records = records
    return records


def decode_range(data: bytes | memoryview, base_offset: int, leader_epoch: int = SERVED_LEADER_EPOCH) -> list[Batch]:
    """Every batch of the range with its records; the first batch that does not decode raises
    CorruptBatch (loop over iter_batches and decode_records to keep going past it)."""
    batches = []
    for batch in iter_batches(data, base_offset, leader_epoch):
        decode_records(data, batch)
        batches.append(batch)
    return batches


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint (Kafka's varint and varlong alike) at `pos`: (value, position after it)."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    result = b & 0x7F
    shift = 7
    while True:
        pos += 1
        b = buf[pos]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos + 1
        shift += 7
        if shift > 63:
            raise ValueError(f"varint longer than 10 bytes at {pos}")


def _width(value: int) -> int:
    """The bytes of `value`'s zigzag varint as Kafka writes it (the shortest)."""
    z = (value << 1) ^ (value >> 63)
    return 1 if 0 <= z < 0x80 else max(1, (z.bit_length() + 6) // 7)


def _decode(buf: bytes, count: int, base_offset: int, base_timestamp: int, log_append: int | None) -> list[Record]:
    # One function with the common one-byte varints read inline: this runs once per record.
    varint = _varint
    # Record's own __new__ is a generated lambda: a tuple made directly is the same Record, faster.
    new_record = tuple.__new__
    end = len(buf)
    records = []
    append = records.append
    pos = 0
    for _ in range(count):
        start = pos
        length, pos = varint(buf, pos)
        record_end = pos + length
        if length < 6 or record_end > end:
            raise ValueError(f"record length {length} at byte {pos} overruns the {end}-byte payload")
        attributes = buf[pos]
        pos += 1
        timestamp_delta, pos = varint(buf, pos)
        offset_delta, pos = varint(buf, pos)
        key_length, pos = varint(buf, pos)
        if key_length < 0:
            key = None
        else:
            key = buf[pos : pos + key_length]
            pos += key_length
        value_length, pos = varint(buf, pos)
        if value_length < 0:
            value = None
        else:
            value = buf[pos : pos + value_length]
            pos += value_length
        header_count, pos = varint(buf, pos)
        # the bytes a record written as the rebuild writes it takes (shortest varints, nulls -1)
        canonical = 1 + _width(timestamp_delta) + _width(offset_delta) + _width(key_length) + max(key_length, 0)
        canonical += _width(value_length) + max(value_length, 0) + _width(header_count)
        if header_count < 0 or key_length < -1 or value_length < -1:
            raise ValueError(f"record at byte {start} has a length or header count that is negative but not -1")
        if header_count:
            headers = []
            for _ in range(header_count):
                name_length, pos = varint(buf, pos)
                if name_length < 0:
                    raise ValueError(f"header key of length {name_length}")
                name = buf[pos : pos + name_length]
                try:
                    name = name.decode()
                except UnicodeDecodeError:  # legal in Kafka: kept as the bytes it is
                    pass
                pos += name_length
                header_length, pos = varint(buf, pos)
                canonical += _width(name_length) + name_length + _width(header_length) + max(header_length, 0)
                if header_length < -1:
                    raise ValueError(f"header value length {header_length}")
                if header_length < 0:
                    header_value = None
                else:
                    header_value = buf[pos : pos + header_length]
                    pos += header_length
                headers.append((name, header_value))
            headers = tuple(headers)
        else:
            headers = ()
        if pos != record_end:
            raise ValueError(f"record of {length} bytes ends at byte {pos}, expected {record_end}")
        if canonical != length or record_end - start != _width(length) + length:
            # Kafka reads it, but it cannot be rebuilt byte for byte from its fields
            raise ValueError(f"record at byte {start} has a varint longer than it needs")
        own = base_timestamp + timestamp_delta
        if not _INT64_MIN <= own <= _INT64_MAX:  # Kafka adds them as Java longs: wrapped
            own = (own - _INT64_MIN) % (1 << 64) + _INT64_MIN
        if log_append is None:
            append(new_record(Record, (base_offset + offset_delta, own, key, value, headers, attributes, None)))
        else:
            append(new_record(Record, (base_offset + offset_delta, log_append, key, value, headers, attributes, None if own == log_append else own)))
    if pos != end:
        raise ValueError(f"{end - pos} bytes after the batch's {count} records")
    return records

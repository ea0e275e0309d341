"""Kafka record batches (magic v2) as the broker sees them: validated, never re-encoded.

The produce path checks framing, magic and CRC-32C, reads the header fields it needs (record
count, timestamps, producer id/epoch/sequence), and walks every record's framing (decompressing
the batch first) as Kafka does, without decoding keys or values. The fetch path rewrites
only the base offset and partition leader epoch of each stored batch (offset injection): both sit
before the CRC-covered region, so stored bytes stay valid. Record-level decoding (with every
compression codec) is only used for ListOffsets by timestamp and, later, compaction.

v2 record layout: length varint, then (the length's bytes) attributes i8 · timestampDelta varlong ·
offsetDelta varint · keyLength varint · key · valueLength varint · value · headerCount varint ·
headers (keyLength varint ≥ 0 · key · valueLength varint · value). Negative key and value
lengths are null. Varints are zigzag-encoded.

v2 header layout (big-endian), offsets in bytes:
    0 baseOffset i64 · 8 batchLength i32 · 12 partitionLeaderEpoch i32 · 16 magic i8 · 17 crc u32
    21 attributes i16 · 23 lastOffsetDelta i32 · 27 baseTimestamp i64 · 35 maxTimestamp i64
    43 producerId i64 · 51 producerEpoch i16 · 53 baseSequence i32 · 57 recordCount i32 · 61 records
CRC-32C covers bytes 21..end of the batch; batchLength counts bytes after offset 12.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import cramjam
import numpy as np
from crc32c import crc32c
from kio.schema.errors import ErrorCode
from kio.serial.readers import read_signed_varint, read_signed_varlong

from .record_walk import NO_KEY, OK, as_array, check_records, keyless_records, outcome_message

BATCH_HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: bytes not counted by batchLength

# The whole fixed header in one unpack: baseOffset, batchLength, partitionLeaderEpoch, magic, crc,
# attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch,
# baseSequence, recordCount. Readers of batches elsewhere (the compactor) use it too.
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
# The three fields offset injection rewrites; batchLength is written back unchanged so that one
# pack_into per batch suffices.
_PREFIX = struct.Struct(">qii")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_MAGIC_POSITION = 16
_CRC_START = 21  # CRC-32C covers attributes .. end of batch
_LAST_OFFSET_DELTA_POSITION = 23
_MIN_BATCH_LENGTH = BATCH_HEADER_SIZE - LOG_OVERHEAD

_CODEC_MASK = 0x07
# Each codec's name by its number (attributes & 0x7): the table's kafka.batch_compression values.
CODEC_NAMES = ("none", "gzip", "snappy", "lz4", "zstd")
_LOG_APPEND_TIME = 0x08
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_MAX_CODEC = 4  # zstd

# The Java client frames snappy like xerial's SnappyOutputStream: this magic, then a version and a
# minimum-compatible version (i32 each), then blocks of u32 length + raw snappy.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16
SEQUENCE_MODULUS = 2**31  # producer sequences wrap from Int.MaxValue to 0


class InvalidRecords(ValueError):
    """Records that fail validation. `error_code` is the Kafka error to answer with:
    2 CORRUPT_MESSAGE (bad CRC, lengths, truncation, records that do not parse or whose count or
    offset deltas disagree with the header), 43 UNSUPPORTED_FOR_MESSAGE_FORMAT (magic != 2),
    87 INVALID_RECORD (well-framed but inconsistent, e.g. record count != lastOffsetDelta + 1, empty,
    a control batch sent by a client, batches of more than one producer or epoch, or records
    without a key for a compacted topic: then `keyless` holds their indices within their batch),
    45 OUT_OF_ORDER_SEQUENCE_NUMBER (an idempotent producer's batches whose sequences do not follow
    one another), 10 MESSAGE_TOO_LARGE (a batch over `max_size`), 76 UNSUPPORTED_COMPRESSION_TYPE
    (a codec id other than 0-4)."""

    def __init__(self, error_code: int, message: str, keyless: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.keyless = keyless


def keyless_message(keyless: tuple[int, ...]) -> str:
    """A batch's records without a key (their indices within it, one at least) in words."""
    if len(keyless) == 1:
        return f"record {keyless[0]} has no key, and the topic is compacted"
    shown = ", ".join(map(str, keyless[:3]))
    more = f" and {len(keyless) - 3} more" if len(keyless) > 3 else ""
    return f"records {shown}{more} have no key, and the topic is compacted"


@dataclass(slots=True, unsafe_hash=True)  # made per batch: not frozen, which costs 4x in __init__ (metadata/model.py)
class RecordsSummary:
    """What the sequencer needs to know about the records of one produce partition (1+ batches)."""

    batch_count: int
    record_count: int  # sum over batches of lastOffsetDelta + 1
    first_timestamp: int  # baseTimestamp of the first batch
    max_timestamp: int  # max over batches of maxTimestamp
    producer_id: int  # of the first batch; -1 when not idempotent
    producer_epoch: int
    base_sequence: int  # of the first batch; -1 when not idempotent
    transactional: bool  # attributes bit 4 of any batch
    compression: int  # attributes & 0x7 of the first batch
    control: int = -1  # a transaction marker the broker wrote: its control type (0 abort, 1 commit); clients' batches -1
    txn_guard: int | None = None  # a transactional batch's guard, set by the produce handler (metadata.model.Append)
    txn_generation: int = -1  # the transaction a marker ends or a verified batch opens (metadata.model.Append)


@dataclass(slots=True, unsafe_hash=True)  # made per batch: not frozen, which costs 4x in __init__ (metadata/model.py)
class BatchHeader:
    position: int  # where the batch starts within the buffer given
    size: int  # LOG_OVERHEAD + batchLength
    base_offset: int
    last_offset_delta: int
    attributes: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int


def _bytes_view(data: bytes | memoryview) -> memoryview:
    view = memoryview(data)
    # A caller's memoryview may be cast to another item format; everything below indexes bytes.
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def validate(records: bytes | memoryview, max_size: int | None = None, keyed: bool = False, max_expanded: int | None = None) -> RecordsSummary:
    """Validate one or more concatenated v2 batches (the `records` field of a produce partition)
    and summarise them. Raises InvalidRecords.

    Every record's framing is walked (record_walk.check_records): its fields fill its length exactly,
    the batch holds recordCount of them with offset deltas 0..n-1, and with `keyed` (a topic whose
    cleanup.policy compacts) each has a key: the first batch with keyless records (and sound
    otherwise) raises INVALID_RECORD naming them all (InvalidRecords.keyless), as Kafka's
    record_errors do. Keys, values and headers are not decoded.

    The batches are one producer's (id and epoch), and an idempotent producer's sequences run on
    from batch to batch, so the summary's first sequence and record count describe every batch
    the sequencer checks for duplicates and gaps.

    `max_size` bounds each batch (LOG_OVERHEAD + batchLength), as Kafka's max.message.bytes does;
    `max_expanded` each compressed batch's records section once decompressed (MESSAGE_TOO_LARGE
    beyond it: Java producers split such a batch and send it again)."""
    view = _bytes_view(records)
    array = as_array(view)  # what the record walk reads
    total = len(view)
    if total == 0:
        raise InvalidRecords(ErrorCode.invalid_record, "no record batch")
    first: tuple | None = None
    batch_count = record_count = 0
    max_timestamp = -1
    transactional = False
    pos = 0
    while pos < total:
        remaining = total - pos
        # Legacy (v0/v1) messages keep their magic at the same position, so look at it before
        # trusting any v2 field: an old client deserves "unsupported format", not "corrupt".
        if remaining <= _MAGIC_POSITION:
            raise InvalidRecords(ErrorCode.corrupt_message, f"batch {batch_count} truncated at {remaining} bytes")
        magic = view[pos + _MAGIC_POSITION]
        if magic != 2:
            raise InvalidRecords(ErrorCode.unsupported_for_message_format, f"batch {batch_count} has magic {magic}, only 2 is supported")
        if remaining < BATCH_HEADER_SIZE:
            raise InvalidRecords(ErrorCode.corrupt_message, f"batch {batch_count} truncated at {remaining} bytes")
        fields = BATCH_HEADER.unpack_from(view, pos)
        batch_length = fields[1]
        if batch_length < _MIN_BATCH_LENGTH:
            raise InvalidRecords(ErrorCode.corrupt_message, f"batch {batch_count} has batchLength {batch_length}")
        size = LOG_OVERHEAD + batch_length
        if size > remaining:
            raise InvalidRecords(ErrorCode.corrupt_message, f"batch {batch_count} claims {size} bytes, {remaining} remain")
        if max_size is not None and size > max_size:
            raise InvalidRecords(ErrorCode.message_too_large, f"batch {batch_count} is {size} bytes, the limit is {max_size}")
        if crc32c(view[pos + _CRC_START : pos + size]) != fields[4]:
            raise InvalidRecords(ErrorCode.corrupt_message, f"batch {batch_count} fails its CRC-32C")
        attributes = fields[5]
        if attributes & _CODEC_MASK > _MAX_CODEC:
            raise InvalidRecords(ErrorCode.unsupported_compression_type, f"batch {batch_count} has compression codec {attributes & _CODEC_MASK}")
        if attributes & _CONTROL:
            raise InvalidRecords(ErrorCode.invalid_record, "clients may not write control batches")
        last_offset_delta, count = fields[6], fields[12]
        if count <= 0 or count != last_offset_delta + 1:
            raise InvalidRecords(ErrorCode.invalid_record, f"batch {batch_count} has {count} records but lastOffsetDelta {last_offset_delta}")
        _check_records(view, array, pos, size, attributes & _CODEC_MASK, count, keyed, batch_count, max_expanded)
        if first is None:
            first = fields
        elif fields[9] != first[9] or fields[10] != first[10]:
            # The sequencer checks one producer's sequence range per partition and request: a
            # second producer's batch would be stored unchecked. No client sends one.
            raise InvalidRecords(ErrorCode.invalid_record, f"batch {batch_count} is from producer {fields[9]} epoch {fields[10]}, batch 0 from producer {first[9]} epoch {first[10]}")
        elif first[9] >= 0 and fields[11] != (next_sequence := (first[11] + record_count) % SEQUENCE_MODULUS):
            raise InvalidRecords(ErrorCode.out_of_order_sequence_number, f"batch {batch_count} has base sequence {fields[11]}, {next_sequence} follows the batches before it")
        batch_count += 1
        record_count += count
        if fields[8] > max_timestamp:
            max_timestamp = fields[8]
        transactional = transactional or bool(attributes & _TRANSACTIONAL)
        pos += size
    assert first is not None
    return RecordsSummary(
        batch_count=batch_count,
        record_count=record_count,
        first_timestamp=first[7],
        max_timestamp=max_timestamp,
        producer_id=first[9],
        producer_epoch=first[10],
        base_sequence=first[11],
        transactional=transactional,
        compression=first[5] & _CODEC_MASK,
    )


def _check_records(view: memoryview, array, pos: int, size: int, codec: int, count: int, keyed: bool, index: int, max_expanded: int | None = None) -> None:
    """Walks the records of the batch at `pos` (decompressed first, into `max_expanded` bytes at
    most); raises InvalidRecords. `array` is `view` as record_walk reads it."""
    start = pos + BATCH_HEADER_SIZE
    end = pos + size
    try:
        if codec:
            array = decompress(codec, view[start:end], max_expanded) if max_expanded is not None else as_array(decompress(codec, view[start:end]))
            start, end = 0, len(array)
    except InvalidRecords as e:
        raise InvalidRecords(e.error_code, f"batch {index}: {e}") from None
    except Exception as e:  # cramjam's DecompressionError
        raise InvalidRecords(ErrorCode.corrupt_message, f"batch {index} does not decompress: {e}") from None
    outcome, record, a, b = check_records(array, start, end, count, keyed)
    if outcome == NO_KEY:
        # Kafka names every keyless record of the batch (record_errors), once the whole batch is
        # known to be sound: a record that does not parse makes it corrupt, keys or not. A walk
        # again, only for a batch refused anyway.
        outcome, record, a, b = check_records(array, start, end, count, False)
        if outcome == OK and a == count:
            out = np.empty(count, dtype=np.int64)
            keyless = tuple(out[: keyless_records(array, start, end, out)].tolist())
            raise InvalidRecords(ErrorCode.invalid_record, f"batch {index}: {keyless_message(keyless)}", keyless)
    if outcome != OK:
        raise InvalidRecords(ErrorCode.corrupt_message, f"batch {index}: {outcome_message(outcome, record, a, b, count)}")
    if a != count:
        raise InvalidRecords(ErrorCode.corrupt_message, f"batch {index} holds {a} records, its header says {count}")


def iter_headers(data: bytes | memoryview) -> Iterator[BatchHeader]:
    """Headers of the consecutive batches in `data` (assumed already validated)."""
    view = _bytes_view(data)
    total = len(view)
    pos = 0
    while pos < total:
        if total - pos < BATCH_HEADER_SIZE:
            raise InvalidRecords(ErrorCode.corrupt_message, f"stored batch at {pos} truncated")
        (base_offset, batch_length, _epoch, _magic, _crc, attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, record_count) = BATCH_HEADER.unpack_from(view, pos)
        size = LOG_OVERHEAD + batch_length
        # A length below the header would loop forever or overlap the next batch.
        if batch_length < _MIN_BATCH_LENGTH or pos + size > total:
            raise InvalidRecords(ErrorCode.corrupt_message, f"stored batch at {pos} has batchLength {batch_length}")
        yield BatchHeader(
            position=pos,
            size=size,
            base_offset=base_offset,
            last_offset_delta=last_offset_delta,
            attributes=attributes,
            base_timestamp=base_timestamp,
            max_timestamp=max_timestamp,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            record_count=record_count,
        )
        pos += size


def inject_offsets(data: bytes | memoryview, base_offset: int, leader_epoch: int = 0) -> bytearray:
    """A copy of consecutive stored batches with each batch's baseOffset set (the first to
    `base_offset`, each next one to the previous base + lastOffsetDelta + 1) and its
    partitionLeaderEpoch set to `leader_epoch`. CRCs stay valid."""
    out = bytearray(data)
    total = len(out)
    pos = 0
    base = base_offset
    while pos < total:
        if total - pos < BATCH_HEADER_SIZE:
            raise InvalidRecords(ErrorCode.corrupt_message, f"stored batch at {pos} truncated")
        (batch_length,) = _I32.unpack_from(out, pos + 8)
        if batch_length < _MIN_BATCH_LENGTH or pos + LOG_OVERHEAD + batch_length > total:
            raise InvalidRecords(ErrorCode.corrupt_message, f"stored batch at {pos} has batchLength {batch_length}")
        (last_offset_delta,) = _I32.unpack_from(out, pos + _LAST_OFFSET_DELTA_POSITION)
        _PREFIX.pack_into(out, pos, base, batch_length, leader_epoch)
        base += last_offset_delta + 1
        pos += LOG_OVERHEAD + batch_length
    return out


def offset_for_timestamp(data: bytes | memoryview, base_offset: int, timestamp: int) -> tuple[int, int] | None:
    """Within consecutive stored batches whose first offset is `base_offset`, the (offset,
    timestamp) of the first record with timestamp >= `timestamp`, or None. Decodes records
    (decompressing gzip, snappy raw or xerial-framed, lz4 frame, zstd) only for a batch whose
    maxTimestamp reaches the target. Raises InvalidRecords if such a batch does not decode."""
    view = _bytes_view(data)
    base = base_offset
    for header in iter_headers(view):
        if header.max_timestamp >= timestamp:
            found = _first_record_at(view, header, base, timestamp)
            if found is not None:
                return found
        base += header.last_offset_delta + 1
    return None


def _first_record_at(view: memoryview, header: BatchHeader, base: int, target: int) -> tuple[int, int] | None:
    payload = view[header.position + BATCH_HEADER_SIZE : header.position + header.size]
    codec = header.attributes & _CODEC_MASK
    # With LogAppendTime every record's timestamp is the batch's maxTimestamp, whatever it carries.
    log_append = header.attributes & _LOG_APPEND_TIME
    try:
        records = decompress(codec, payload) if codec else payload
        end = len(records)
        pos = 0
        for _ in range(header.record_count):
            length, size = read_signed_varint(records, pos)
            body = pos + size
            pos = body + length
            # attributes, timestampDelta, offsetDelta, key, value and header count: a byte each at least
            if length < 6 or pos > end:
                raise InvalidRecords(ErrorCode.corrupt_message, f"record length {length} overruns the batch at {header.position}")
            timestamp_delta, size = read_signed_varlong(records, body + 1)
            offset_delta, _ = read_signed_varint(records, body + 1 + size)
            record_timestamp = header.max_timestamp if log_append else header.base_timestamp + timestamp_delta
            if record_timestamp >= target:
                return base + offset_delta, record_timestamp
    except InvalidRecords:
        raise
    except Exception as e:  # kio's BufferUnderflow/ValueError, cramjam's DecompressionError
        raise InvalidRecords(ErrorCode.corrupt_message, f"batch at {header.position} does not decode: {e}") from e
    return None


def decompress(codec: int, payload: memoryview, limit: int | None = None):
    """A compressed batch's records section, decompressed (codec: attributes & 0x7; 1 gzip, 2 snappy
    plain or xerial-framed as the Java client writes it, 3 lz4 frame, 4 zstd).

    With a `limit`: the section as a numpy array, written into `limit` bytes reserved for it, so
    that a batch that would expand past them stops there (InvalidRecords MESSAGE_TOO_LARGE) instead
    of taking the memory it claims; untouched reserved pages cost nothing."""
    if limit is not None:
        return _decompress_within(codec, payload, limit)
    if codec == 1:
        return cramjam.gzip.decompress(payload)
    if codec == 2:
        if payload[: len(_XERIAL_MAGIC)] == _XERIAL_MAGIC:
            return b"".join([cramjam.snappy.decompress_raw(block) for block in _xerial_blocks(payload)])
        return cramjam.snappy.decompress_raw(payload)
    if codec == 3:
        return cramjam.lz4.decompress(payload)
    if codec == 4:
        return cramjam.zstd.decompress(payload)
    raise InvalidRecords(ErrorCode.unsupported_compression_type, f"compression codec {codec}")


# cramjam's words when the output it was given is full (its DecompressionError covers both this and
# input that does not decompress)
_OUTPUT_FULL = ("failed to write whole buffer", "smaller than required")
_DECOMPRESS_INTO = {1: cramjam.gzip.decompress_into, 2: cramjam.snappy.decompress_raw_into, 3: cramjam.lz4.decompress_into, 4: cramjam.zstd.decompress_into}


def _decompress_within(codec: int, payload: memoryview, limit: int) -> np.ndarray:
    into = _DECOMPRESS_INTO.get(codec)
    if into is None:
        raise InvalidRecords(ErrorCode.unsupported_compression_type, f"compression codec {codec}")
    out = np.empty(limit, dtype=np.uint8)
    try:
        if codec == 2 and payload[: len(_XERIAL_MAGIC)] == _XERIAL_MAGIC:
            size = 0
            for block in _xerial_blocks(payload):
                size += into(block, out[size:])
        else:
            size = into(payload, out)
    except Exception as e:
        if any(words in str(e) for words in _OUTPUT_FULL):
            raise InvalidRecords(ErrorCode.message_too_large, f"its records expand past {limit} bytes") from None
        raise
    view = out[:size]
    view.flags.writeable = False  # as the walk reads bytes
    return view


def _xerial_blocks(payload: memoryview):
    """The raw snappy blocks of a xerial-framed payload, in order."""
    pos = _XERIAL_HEADER_SIZE
    end = len(payload)
    while pos < end:
        if end - pos < 4:
            raise InvalidRecords(ErrorCode.corrupt_message, "xerial snappy block length truncated")
        (length,) = _U32.unpack_from(payload, pos)
        pos += 4
        if pos + length > end:
            raise InvalidRecords(ErrorCode.corrupt_message, "xerial snappy block truncated")
        yield payload[pos : pos + length]
        pos += length

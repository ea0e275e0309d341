"""Kafka record batches (magic v2) built from records: the fetch path's encoder for batches that are
no longer stored as produced (rebuilt from the table's rows), compressed with any Kafka codec.

Everything else in neve serves batches byte for byte as produced (wal/batch.py); this module is
the one place that writes records, so the layout described there is written here in reverse:
records section (zigzag varints), then the codec, then the header and its CRC-32C. Each codec is
framed as the Java client frames it, the one framing every client reads: snappy in xerial's
stream format, lz4 as an LZ4 frame of independent 64 KiB blocks (the Java reader refuses linked
blocks, which cramjam's frame encoder writes), gzip and zstd as single standard streams.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import cramjam
from crc32c import crc32c

from wal.batch import BATCH_HEADER, BATCH_HEADER_SIZE, LOG_OVERHEAD

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CREATE_TIME, LOG_APPEND_TIME = 0, 1

# Kafka's compression.type values (topic and producer), in the order its error message lists them,
# and the codec each means; `producer` keeps the codec the batch was produced with.
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
_CODEC_OF_TYPE = {"uncompressed": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}

# (offset_delta, timestamp_ms, key, value, headers): compactor.rows.records.Record's fields, with the
# offset relative to the batch's base offset.
BuildRecord = tuple[int, int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]

_LOG_APPEND_TIME = 0x08
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_CRC_START = 21
_CRC = struct.Struct(">I")

# Kafka's defaults (KIP-390): gzip 6 is also cramjam's; zstd's 3 is not (cramjam's is slower).
_ZSTD_LEVEL = 3

# xerial's SnappyOutputStream as the Java client uses it: version 1, compatible version 1, blocks
# of at most 32 KiB of input, each a u32 length then raw snappy (wal.batch.decompress reads it).
_XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024
_U32_BE = struct.Struct(">I")

# The LZ4 frame the Java client writes: magic, FLG 0x60 (version 1, independent blocks, no
# checksums, no content size), BD 0x40 (64 KiB blocks), and the descriptor's checksum byte
# (xxh32 of FLG and BD, second byte). A block that does not shrink is stored raw, its length's
# top bit set; a zero length ends the frame.
_LZ4_HEADER = b"\x04\x22\x4d\x18\x60\x40\x82"
_LZ4_BLOCK = 64 * 1024
_LZ4_RAW_BLOCK = 0x80000000
_LZ4_END = b"\x00\x00\x00\x00"
_U32_LE = struct.Struct("<I")


def codec_for(compression_type: str, original_codec: int) -> int:
    """The codec (attributes & 0x7) of a batch rebuilt for a topic whose compression.type is
    `compression_type`: that codec, or for `producer` the one the batch was produced with."""
    if compression_type == "producer":
        return original_codec
    try:
        return _CODEC_OF_TYPE[compression_type]
    except KeyError:
        raise ValueError(f"compression.type {compression_type!r} is none of {', '.join(COMPRESSION_TYPES)}") from None


def zigzag_varint(n: int) -> bytes:
    """n (a signed 64-bit value) as Kafka's zigzag varint/varlong."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


# Every non-negative value of one or two varint bytes, encoded: lengths, offset deltas and most
# timestamp deltas are this small, and a list index is the cheapest way to write one.
_SMALL = [zigzag_varint(n) for n in range(1 << 13)]
_SMALL_LIMIT = len(_SMALL)
_NULL = zigzag_varint(-1)  # the length of a null key, value or header value
_NO_HEADERS = _SMALL[0]


def _encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    """The header count and headers of one record."""
    small, limit, slow = _SMALL, _SMALL_LIMIT, zigzag_varint
    n = len(headers)
    parts = [small[n] if n < limit else slow(n)]
    append = parts.append
    for name, value in headers:
        raw = name.encode()
        n = len(raw)
        append(small[n] if n < limit else slow(n))
        append(raw)
        if value is None:
            append(_NULL)
        else:
            n = len(value)
            append(small[n] if n < limit else slow(n))
            append(value)
    return b"".join(parts)


def _encode_records(records: Sequence[BuildRecord], base_timestamp: int) -> bytes:
    """The records section. Runs once per record on the fetch path: varints come from _SMALL
    inline, each record is sized before its parts are listed (its length prefix needs no second
    pass), and one join copies every part once."""
    small, limit, null, no_headers = _SMALL, _SMALL_LIMIT, _NULL, _NO_HEADERS
    slow = zigzag_varint
    parts: list[bytes] = []
    extend = parts.extend
    for offset_delta, timestamp, key, value, headers in records:
        delta = timestamp - base_timestamp
        t = small[delta] if 0 <= delta < limit else slow(delta)
        o = small[offset_delta] if 0 <= offset_delta < limit else slow(offset_delta)
        if key is None:
            k, key = null, b""
        else:
            n = len(key)
            k = small[n] if n < limit else slow(n)
        if value is None:
            v, value = null, b""
        else:
            n = len(value)
            v = small[n] if n < limit else slow(n)
        h = _encode_headers(headers) if headers else no_headers
        size = 1 + len(t) + len(o) + len(k) + len(key) + len(v) + len(value) + len(h)
        # b"\x00": the record's attributes, unused in v2
        extend((small[size] if size < limit else slow(size), b"\x00", t, o, k, key, v, value, h))
    return b"".join(parts)


def _xerial_snappy(data: bytes) -> bytes:
    parts = [_XERIAL_HEADER]
    view = memoryview(data)
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK])
        parts.append(_U32_BE.pack(len(block)))
        parts.append(bytes(block))
    return b"".join(parts)


def _lz4_frame(data: bytes) -> bytes:
    parts = [_LZ4_HEADER]
    view = memoryview(data)
    for start in range(0, len(view), _LZ4_BLOCK):
        chunk = view[start : start + _LZ4_BLOCK]
        block = cramjam.lz4.compress_block(chunk, store_size=False)
        if len(block) < len(chunk):
            parts.append(_U32_LE.pack(len(block)))
            parts.append(bytes(block))
        else:
            parts.append(_U32_LE.pack(len(chunk) | _LZ4_RAW_BLOCK))
            parts.append(bytes(chunk))
    parts.append(_LZ4_END)
    return b"".join(parts)


def _compress(codec: int, data: bytes) -> bytes:
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == SNAPPY:
        return _xerial_snappy(data)
    if codec == LZ4:
        return _lz4_frame(data)
    return bytes(cramjam.zstd.compress(data, level=_ZSTD_LEVEL))


def build_batch(
    records: Sequence[BuildRecord],
    *,
    codec: int = NONE,
    timestamp_type: int = CREATE_TIME,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
    last_offset_delta: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    partition_leader_epoch: int = 0,
    base_offset: int = 0,
) -> bytes:
    """One v2 record batch holding `records` (offset_delta, timestamp_ms, key, value, headers),
    in the order given, compressed with `codec` (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), its
    CRC-32C computed.

    Header fields the records do not determine are the caller's, so a rebuilt batch can carry
    the original's exactly. Left out: `base_timestamp` is the first record's timestamp and
    `max_timestamp` the largest (Kafka's producer does the same; -1 for no records; give them
    for a LogAppendTime batch, whose maxTimestamp is the append time), and `last_offset_delta`
    is the last record's offset delta. Give it when later records of the original batch are
    gone (as Kafka's log cleaner keeps it), and for an empty batch. An empty batch is written as
    Kafka's cleaner writes one: no records section, codec none whatever `codec` says."""
    if not 0 <= codec <= ZSTD:
        raise ValueError(f"compression codec {codec}: Kafka's are 0-4")
    if timestamp_type not in (CREATE_TIME, LOG_APPEND_TIME):
        raise ValueError(f"timestamp type {timestamp_type}: 0 CreateTime or 1 LogAppendTime")
    count = len(records)
    if last_offset_delta is None:
        if not count:
            raise ValueError("an empty batch needs its last_offset_delta")
        last_offset_delta = records[-1][0]
    if count > last_offset_delta + 1:
        raise ValueError(f"{count} records cannot fit offset deltas 0..{last_offset_delta}")
    if base_timestamp is None:
        base_timestamp = records[0][1] if count else -1
    if max_timestamp is None:
        max_timestamp = max(r[1] for r in records) if count else -1
    section = _encode_records(records, base_timestamp)
    return frame_batch(
        section,
        count,
        codec=codec,
        timestamp_type=timestamp_type,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        last_offset_delta=last_offset_delta,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=is_transactional,
        is_control=is_control,
        partition_leader_epoch=partition_leader_epoch,
        base_offset=base_offset,
    )


def frame_batch(
    section,
    count: int,
    *,
    codec: int,
    timestamp_type: int,
    base_timestamp: int,
    max_timestamp: int,
    last_offset_delta: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    is_transactional: bool,
    is_control: bool,
    partition_leader_epoch: int,
    base_offset: int,
) -> bytes:
    """A v2 batch around an uncompressed records section (any buffer) of `count` records: the
    section compressed with `codec`, the header written and its CRC-32C computed. build_batch's
    second half, and the whole of it for a section encoded elsewhere (table/rebuild.py encodes
    many batches' records at once, from columns)."""
    if count and codec != NONE:
        section = _compress(codec, section)
    elif not count:
        codec = NONE
    attributes = codec
    if timestamp_type == LOG_APPEND_TIME:
        attributes |= _LOG_APPEND_TIME
    if is_transactional:
        attributes |= _TRANSACTIONAL
    if is_control:
        attributes |= _CONTROL
    header = bytearray(BATCH_HEADER_SIZE)
    BATCH_HEADER.pack_into(
        header,
        0,
        base_offset,
        BATCH_HEADER_SIZE - LOG_OVERHEAD + len(section),
        partition_leader_epoch,
        2,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    # the CRC runs on from the header's covered part into the section: no copy to checksum it whole
    _CRC.pack_into(header, _CRC_START - 4, crc32c(section, crc32c(memoryview(header)[_CRC_START:])))
    return b"".join((header, section))

"""Builders of Kafka v2 record batches for tests: valid by default (CRC-32C, lengths, every codec),
with the framing exposed so tests can also build precisely wrong ones."""

from __future__ import annotations

import io
import struct

import cramjam
from crc32c import crc32c
from kio.records.writers import write_signed_compact_bytes
from kio.serial.writers import write_signed_varint, write_signed_varlong

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODECS = (NONE, GZIP, SNAPPY, LZ4, ZSTD)
TRANSACTIONAL = 0x10
CONTROL = 0x20
LOG_APPEND_TIME = 0x08

# baseOffset .. magic, then (after the CRC) attributes .. recordCount
_PRE_CRC = struct.Struct(">qiib")
_POST_CRC = struct.Struct(">hiqqqhii")
_COMPRESS = {
    GZIP: cramjam.gzip.compress,
    SNAPPY: cramjam.snappy.compress_raw,
    LZ4: cramjam.lz4.compress,
    ZSTD: cramjam.zstd.compress,
}


def encode_records(records: list[Record], base_timestamp: int) -> bytes:
    """The uncompressed record section: each record with offsetDelta = its index."""
    out = io.BytesIO()
    for delta, (key, value, headers, timestamp) in enumerate(records):
        body = io.BytesIO()
        body.write(b"\x00")  # record attributes are unused in v2
        write_signed_varlong(body, timestamp - base_timestamp)
        write_signed_varint(body, delta)
        write_signed_compact_bytes(body, key)
        write_signed_compact_bytes(body, value)
        write_signed_varint(body, len(headers))
        for name, header_value in headers:
            write_signed_compact_bytes(body, name.encode())
            write_signed_compact_bytes(body, header_value)
        write_signed_varint(out, body.tell())
        out.write(body.getvalue())
    return out.getvalue()


def compress(codec: int, payload: bytes) -> bytes:
    return payload if codec == NONE else bytes(_COMPRESS[codec](payload))


def xerial_snappy(payload: bytes, block_size: int = 32 * 1024) -> bytes:
    """Snappy as the Java client frames it: magic, version 1, compatible version 1, then blocks."""
    out = [b"\x82SNAPPY\x00", struct.pack(">ii", 1, 1)]
    for i in range(0, len(payload), block_size):
        block = bytes(cramjam.snappy.compress_raw(payload[i : i + block_size]))
        out += [struct.pack(">I", len(block)), block]
    return b"".join(out)


def frame_batch(
    payload: bytes,
    *,
    record_count: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    attributes: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    magic: int = 2,
) -> bytes:
    """A batch around an already-encoded (and compressed) record payload, with a correct CRC."""
    post = _POST_CRC.pack(attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, record_count) + payload
    batch_length = 4 + 1 + 4 + len(post)  # partitionLeaderEpoch + magic + crc + the rest
    return _PRE_CRC.pack(base_offset, batch_length, partition_leader_epoch, magic) + struct.pack(">I", crc32c(post)) + post


def make_batch(
    records: list[Record],
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    compression: int = 0,
    base_timestamp: int | None = None,
    base_offset: int = 0,
    attributes: int = 0,
) -> bytes:
    """A valid magic-2 batch of `records` (key, value, headers, timestamp_ms) compressed with
    `compression` (0 none, 1 gzip, 2 snappy raw, 3 lz4 frame, 4 zstd). `base_timestamp` defaults
    to the first record's timestamp; `attributes` adds flag bits (TRANSACTIONAL, CONTROL, ...)."""
    if base_timestamp is None:
        base_timestamp = records[0][3] if records else -1
    max_timestamp = max((r[3] for r in records), default=-1)
    payload = compress(compression, encode_records(records, base_timestamp))
    return frame_batch(
        payload,
        record_count=len(records),
        last_offset_delta=len(records) - 1,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        attributes=attributes | compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        base_offset=base_offset,
    )


def edited(data: bytes, edits) -> bytes:
    """`data` with each edit (position, "set" | "insert" | "delete", byte) applied in turn, the
    position taken modulo the length (+1, so that an insert may append)."""
    out = bytearray(data)
    for where, how, value in edits:
        where %= len(out) + 1
        if how == "insert":
            out[where:where] = bytes([value])
        elif where < len(out):
            if how == "set":
                out[where] = value
            else:
                del out[where]
    return bytes(out)

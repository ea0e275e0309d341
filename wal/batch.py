"""Kafka record batches (magic v2) as the broker sees them: validated, never re-encoded.

The produce path checks framing, magic and CRC-32C and reads the header fields it needs (record
count, timestamps, producer id/epoch/sequence) without decoding records. The fetch path rewrites
only the base offset and partition leader epoch of each stored batch (offset injection): both sit
before the CRC-covered region, so stored bytes stay valid. Record-level decoding (with every
compression codec) is only used for ListOffsets by timestamp and, later, compaction.

v2 header layout (big-endian), offsets in bytes:
    0 baseOffset i64 · 8 batchLength i32 · 12 partitionLeaderEpoch i32 · 16 magic i8 · 17 crc u32
    21 attributes i16 · 23 lastOffsetDelta i32 · 27 baseTimestamp i64 · 35 maxTimestamp i64
    43 producerId i64 · 51 producerEpoch i16 · 53 baseSequence i32 · 57 recordCount i32 · 61 records
CRC-32C covers bytes 21..end of the batch; batchLength counts bytes after offset 12.
"""

# IMPLEMENTATION PENDING (helper): see the function docstrings for the contract.

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

BATCH_HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: bytes not counted by batchLength


class InvalidRecords(ValueError):
    """Records that fail validation. `error_code` is the Kafka error to answer with:
    2 CORRUPT_MESSAGE (bad CRC, lengths, truncation), 43 UNSUPPORTED_FOR_MESSAGE_FORMAT (magic != 2),
    87 INVALID_RECORD (well-framed but inconsistent, e.g. record count != lastOffsetDelta + 1, empty)."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


def validate(records: bytes | memoryview, max_size: int | None = None) -> RecordsSummary:
    """Validate one or more concatenated v2 batches (the `records` field of a produce partition)
    and summarise them. Raises InvalidRecords. Does not decompress or decode records."""
    raise NotImplementedError


def iter_headers(data: bytes | memoryview) -> Iterator[BatchHeader]:
    """Headers of the consecutive batches in `data` (assumed already validated)."""
    raise NotImplementedError


def inject_offsets(data: bytes | memoryview, base_offset: int, leader_epoch: int = 0) -> bytearray:
    """A copy of consecutive stored batches with each batch's baseOffset set (the first to
    `base_offset`, each next one to the previous base + lastOffsetDelta + 1) and its
    partitionLeaderEpoch set to `leader_epoch`. CRCs stay valid."""
    raise NotImplementedError


def offset_for_timestamp(data: bytes | memoryview, base_offset: int, timestamp: int) -> tuple[int, int] | None:
    """Within consecutive stored batches whose first offset is `base_offset`, the (offset,
    timestamp) of the first record with timestamp >= `timestamp`, or None. Decodes records
    (decompressing gzip, snappy raw or xerial-framed, lz4 frame, zstd) only for a batch whose
    maxTimestamp reaches the target."""
    raise NotImplementedError

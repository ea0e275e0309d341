"""The table format of a topic, by name: its columns, the `kafka` struct's fields in their order and
the header struct's, as the compactor writes them and the rebuild and readers read them. The
compactor's layout (compactor/files/layout.py) gives them Iceberg types and field ids; nothing else
spells a column name out.

A row is one Kafka record: `kafka` (where it sits and the batch it came in), `headers`, `key_raw`,
and its value as `value_raw` (the exact bytes), `value` (columns laid out from the Avro writer
schema), or both; `value_schema_id` and `value_error` say which and why.
"""

from __future__ import annotations

# -- columns, in table order (`value` only for a topic with a registered schema) ------------------
KAFKA = "kafka"
HEADERS = "headers"
KEY_RAW = "key_raw"
VALUE_RAW = "value_raw"
VALUE_SCHEMA_ID = "value_schema_id"
VALUE_ERROR = "value_error"
VALUE = "value"
RAW_COLUMNS = (KAFKA, HEADERS, KEY_RAW, VALUE_RAW, VALUE_SCHEMA_ID, VALUE_ERROR)

# -- the kafka struct ------------------------------------------------------------------------------
PARTITION = "partition"
OFFSET = "offset"
TIMESTAMP = "timestamp"  # Kafka's ms as a timestamp (micros), clamped to MIN_MS..MAX_MS
TIMESTAMP_TYPE = "timestamp_type"  # Kafka's TimestampType: 0 CreateTime, 1 LogAppendTime
BATCH_BASE_OFFSET = "batch_base_offset"
BATCH_LEADER_EPOCH = "batch_leader_epoch"
BATCH_MAGIC = "batch_magic"
BATCH_COMPRESSION = "batch_compression"  # one of wal.batch.CODEC_NAMES
BATCH_BASE_TIMESTAMP = "batch_base_timestamp"
BATCH_MAX_TIMESTAMP = "batch_max_timestamp"
PRODUCER_ID = "producer_id"
PRODUCER_EPOCH = "producer_epoch"
BASE_SEQUENCE = "base_sequence"
IS_CONTROL = "is_control"
IS_TRANSACTIONAL = "is_transactional"
# Optional, added after the fields above (a table made before them gains them by union; a null
# reads as "nothing beyond what the fields above say"):
RECORD_ATTRIBUTES = "record_attributes"  # the record's attributes byte, when not 0 (null: 0)
# the batch's attributes as produced, when they have bits above FLAGGED_ATTRIBUTES (null: only the
# bits the fields above give)
BATCH_ATTRIBUTES = "batch_attributes"
# A timestamp's exact ms where the timestamp field could not hold it (a nanosecond timestamp sent
# as ms, a year outside 1-9999): the field is then clamped, and this is what Kafka serves.
TIMESTAMP_MS = "timestamp_ms"
BATCH_BASE_TIMESTAMP_MS = "batch_base_timestamp_ms"
BATCH_MAX_TIMESTAMP_MS = "batch_max_timestamp_ms"
# True: value_raw holds the whole batch as stored, because its records could not be made rows;
# the row sits at the batch's last offset and Kafka reads serve the batch itself.
STORED_BATCH = "stored_batch"

KAFKA_FIELDS = (
    PARTITION, OFFSET, TIMESTAMP, TIMESTAMP_TYPE, BATCH_BASE_OFFSET, BATCH_LEADER_EPOCH, BATCH_MAGIC, BATCH_COMPRESSION,
    BATCH_BASE_TIMESTAMP, BATCH_MAX_TIMESTAMP, PRODUCER_ID, PRODUCER_EPOCH, BASE_SEQUENCE, IS_CONTROL, IS_TRANSACTIONAL,
    RECORD_ATTRIBUTES, BATCH_ATTRIBUTES, TIMESTAMP_MS, BATCH_BASE_TIMESTAMP_MS, BATCH_MAX_TIMESTAMP_MS, STORED_BATCH,
)  # fmt: skip
# The fields a table made before the optional ones has, in order.
KAFKA_FIELDS_FIRST = KAFKA_FIELDS[: KAFKA_FIELDS.index(RECORD_ATTRIBUTES)]
# The batch attribute bits the kafka fields above say: the codec, timestamp type, transactional and
# control bits.
FLAGGED_ATTRIBUTES = 0x3F
# Each timestamp field with the field keeping its exact ms when it is clamped.
EXACT_MS = {TIMESTAMP: TIMESTAMP_MS, BATCH_BASE_TIMESTAMP: BATCH_BASE_TIMESTAMP_MS, BATCH_MAX_TIMESTAMP: BATCH_MAX_TIMESTAMP_MS}

# -- a header (the elements of `headers`) ----------------------------------------------------------
HEADER_KEY = "key"  # the key as text; lossy (U+FFFD) when the key is not UTF-8
HEADER_VALUE = "value"
HEADER_KEY_BYTES = "key_bytes"  # the key's exact bytes, set only when they are not UTF-8
HEADER_FIELDS = (HEADER_KEY, HEADER_VALUE, HEADER_KEY_BYTES)

# The span of timestamps the timestamp fields hold: Iceberg's years 1-9999, in Kafka's ms. Kafka
# takes any int64; one outside is clamped and kept exact in its *_ms field.
MIN_MS, MAX_MS = -62_135_596_800_000, 253_402_300_799_999


def clamp_ms(ms: int) -> int:
    return MIN_MS if ms < MIN_MS else MAX_MS if ms > MAX_MS else ms


def exact_ms(ms: int) -> int | None:
    """What a *_ms field holds for a timestamp of `ms`: None when the timestamp field holds it."""
    return None if MIN_MS <= ms <= MAX_MS else ms

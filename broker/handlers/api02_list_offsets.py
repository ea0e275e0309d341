"""ListOffsets (key 2), v1-v9: earliest (-2), latest (-1), max timestamp (-3, KIP-734) and by
timestamp: the first offset whose record timestamp is at or after the target, or -1 when none is.
Every answer follows the log start offset (DeleteRecords, retention): nothing before it is found.
The offset index narrows the search to one entry by its max timestamp; only that entry's batches
are read, and only the batch that reaches the target is decoded. A compacted topic's entry keeps
the max timestamp of records compaction removed: by timestamp then goes on to the next entry, and
max timestamp reads the records still there, as Kafka's cleaner gives a rebuilt batch the largest
timestamp of the records it keeps.

Under read_committed (isolation_level 1, v2+) the log ends at the last stable offset, as in Kafka:
latest answers it, and by timestamp and max timestamp find only offsets below it (-1 otherwise,
as for a timestamp past the end). Earliest is the same for both.

The two that read objects (by timestamp, max timestamp) answer a partition whose object-store
read fails (ObjectStoreError: the S3 backend turns its I/O failures and timeouts into it, after
its retries) with KAFKA_STORAGE_ERROR, offset and timestamp -1, and go on with the request's
other partitions. It is Kafka's own answer when a log read fails, retriable in Kafka, librdkafka
and the Java client (they refresh metadata and ask again), and what Fetch and Produce answer
when the object store fails. Each failure is logged and counted in
neve_object_read_failures_total. Stored records that do not decode (a batch whose CRC was right but
whose records were not: produce checks batches, not each record) answer CORRUPT_MESSAGE for the
partition, as Kafka's CorruptRecordException does; other exceptions are bugs, and still close the
connection. With ACLs, a topic the principal may not DESCRIBE answers TOPIC_AUTHORIZATION_FAILED."""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from metadata.model import ObjectType
from wal.batch import InvalidRecords, offset_for_timestamp
from wal.store import ObjectStoreError

from ..authorization import DESCRIBE, TOPIC, allowed_names
from ..codec import NO_THROTTLE, build, has_field
from ..metrics import LIST_OFFSETS_READ_FAILURES
from ..registry import handles

log = logging.getLogger("neve.broker.list_offsets")

LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3


async def _by_timestamp(s, topic_id, partition, timestamp) -> tuple[int, int]:
    store = s.metadata
    log_start = store.log_start_offset(topic_id, partition)
    entry = store.entry_for_timestamp(topic_id, partition, timestamp)
    if entry is not None and entry.last_offset < log_start:
        entry = _first_reaching(store, topic_id, partition, log_start, timestamp)  # only what the Kafka view shows
    while entry is not None:
        found = await _in_entry(s, topic_id, partition, entry, timestamp)
        if found is not None:
            # A record hidden by a log start inside its batch (DeleteRecords mid-batch) answers the
            # log start: the first offset a consumer can read there.
            return (found[0], found[1]) if found[0] >= log_start else (log_start, found[1])
        entry = _first_reaching(store, topic_id, partition, entry.last_offset + 1, timestamp)
    return -1, -1


def _first_reaching(store, topic_id, partition, offset: int, timestamp: int):
    """The first entry from `offset` on whose max timestamp reaches `timestamp`, or None."""
    while batch := store.entries(topic_id, partition, offset, max_entries=256):
        for e in batch:
            if e.max_timestamp >= timestamp:
                return e
        offset = batch[-1].last_offset + 1
    return None


async def _max_timestamp(s, topic_id, partition) -> tuple[int, int]:
    """The first offset with the partition's largest record timestamp. An entry's max timestamp
    is its largest record's, unless compaction removed that record: then the entry's records
    still there are searched, and the entries whose max timestamp could still beat the best found
    (a compacted topic's merged entry counts its removed records' timestamps)."""
    store = s.metadata
    entries = []
    offset = store.log_start_offset(topic_id, partition)
    while batch := store.entries(topic_id, partition, offset, max_entries=1024):
        entries.extend(batch)
        offset = batch[-1].last_offset + 1
    best = None
    for e in sorted(entries, key=lambda e: (-e.max_timestamp, e.base_offset)):
        if best is not None and e.max_timestamp < best[1]:
            break
        if best is not None and e.max_timestamp == best[1] and e.base_offset > best[0]:
            continue  # a tie goes to the first offset, and this entry's are all after it
        found = await _in_entry(s, topic_id, partition, e, e.max_timestamp)
        if found is None and e.object_type == ObjectType.PARQUET and s.compacted is not None:
            found = await s.compacted.max_timestamp(topic_id, partition, e)
        if found is not None and (best is None or found[1] > best[1] or (found[1] == best[1] and found[0] < best[0])):
            best = found
    return best if best is not None else (-1, -1)


async def _in_entry(s, topic_id, partition: int, entry, timestamp: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the entry's first record at or after `timestamp`, or None."""
    if entry.object_type == ObjectType.PARQUET and s.compacted is not None:
        return await s.compacted.offset_for_timestamp(topic_id, partition, entry, timestamp)
    data = await s.reader.read(entry.object_key, entry.start, entry.size)
    return offset_for_timestamp(data, entry.base_offset, timestamp)


def _stable(store, topic_id, partition: int) -> int:
    """The partition's last stable offset (0 for a partition without a view yet, as its high
    watermark)."""
    views = store.topic_views(topic_id)
    view = views[partition] if partition < len(views) else None
    return view.last_stable_offset if view is not None else 0


@handles(2, "ListOffsets", 1, 9)
async def list_offsets(ctx, request):
    s = ctx.services
    store = s.metadata
    r = ctx.response
    topics = store.topics()
    read_committed = has_field(request, "isolation_level") and request.isolation_level == 1
    names = [t.name for t in request.topics]
    described = allowed_names(ctx, DESCRIBE, TOPIC, names) if s.authorizer is not None else None
    out = []
    for topic in request.topics:
        info = topics.get(topic.name)
        parts = []
        for p in topic.partitions:
            code, offset, ts = ErrorCode.none, -1, -1
            if described is not None and topic.name not in described:
                code = ErrorCode.topic_authorization_failed
            elif info is None or not 0 <= p.partition_index < info.partitions:
                code = ErrorCode.unknown_topic_or_partition
            elif p.timestamp == LATEST:
                offset = _stable(store, info.topic_id, p.partition_index) if read_committed else store.high_watermark(info.topic_id, p.partition_index)
            elif p.timestamp == EARLIEST:
                offset = store.log_start_offset(info.topic_id, p.partition_index)
            elif p.timestamp < 0 and p.timestamp != MAX_TIMESTAMP:
                code = ErrorCode.invalid_request
            else:
                try:
                    if p.timestamp == MAX_TIMESTAMP:
                        offset, ts = await _max_timestamp(s, info.topic_id, p.partition_index)
                    else:
                        offset, ts = await _by_timestamp(s, info.topic_id, p.partition_index, p.timestamp)
                    if read_committed and offset >= _stable(store, info.topic_id, p.partition_index):
                        offset, ts = -1, -1
                except ObjectStoreError as e:
                    code, offset, ts = ErrorCode.kafka_storage_error, -1, -1
                    LIST_OFFSETS_READ_FAILURES.inc()
                    log.warning("list_offsets_read_failed", extra={"topic": topic.name, "partition": p.partition_index, "timestamp": p.timestamp, "error": repr(e)})
                except InvalidRecords as e:
                    code, offset, ts = ErrorCode.corrupt_message, -1, -1
                    log.warning("list_offsets_corrupt_records", extra={"topic": topic.name, "partition": p.partition_index, "timestamp": p.timestamp, "error": str(e)})
            parts.append(build(r.ListOffsetsPartitionResponse, partition_index=p.partition_index, error_code=code, timestamp=ts, offset=offset, leader_epoch=0 if code == ErrorCode.none else -1))
        out.append(build(r.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(parts)))
    return build(r.ListOffsetsResponse, throttle_time=NO_THROTTLE, topics=tuple(out))

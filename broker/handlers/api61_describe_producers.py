"""DescribeProducers (key 61), v0: per partition, the idempotent producers the sequencer
remembers (metadata store `producer_states`): producer id, epoch and last sequence, and as last
timestamp the max timestamp of the producer's last stored batch, read from that batch's header in
the object store (-1 when its entry is no longer in the Kafka view), and the first offset of its
open transaction there (-1: none). The coordinator epoch is always -1 (neve's transaction
coordinator has no epochs: its steps are compare-and-writes of the stored state). Any broker answers for any partition
(no leaders); an unknown topic or partition answers UNKNOWN_TOPIC_OR_PARTITION. With ACLs: READ on
the topic, else TOPIC_AUTHORIZATION_FAILED."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from metadata.model import ObjectType
from wal.batch import iter_headers

from ..authorization import READ, TOPIC, allowed_names
from ..codec import NO_THROTTLE, build
from ..registry import handles


async def batch_max_timestamp(s, topic_id, partition: int, base_offset: int) -> int:
    """maxTimestamp of the stored batch starting at `base_offset`, or -1."""
    found = s.metadata.entries(topic_id, partition, base_offset, max_entries=1)
    if not found or found[0].object_type != ObjectType.WAL or not found[0].base_offset <= base_offset <= found[0].last_offset:
        return -1
    entry = found[0]
    try:
        data = await s.reader.read(entry.object_key, entry.start, entry.size)
    except Exception:  # the timestamp is informational: an unreadable object must not fail the answer
        return -1
    offset = entry.base_offset
    for h in iter_headers(data):
        if offset == base_offset:
            return h.max_timestamp
        offset += h.last_offset_delta + 1
    return -1


@handles(61, "DescribeProducers", 0, 0)
async def describe_producers(ctx, request):
    r = ctx.response
    s = ctx.services
    topics = s.metadata.topics()
    readable = allowed_names(ctx, READ, TOPIC, [t.name for t in request.topics])
    out = []
    for topic in request.topics:
        info = topics.get(topic.name)
        parts = []
        for p in topic.partition_indexes:
            if topic.name not in readable:
                parts.append(build(r.PartitionResponse, partition_index=p, error_code=ErrorCode.topic_authorization_failed, error_message=None, active_producers=()))
                continue
            if info is None or not 0 <= p < info.partitions:
                parts.append(build(r.PartitionResponse, partition_index=p, error_code=ErrorCode.unknown_topic_or_partition, error_message=None, active_producers=()))
                continue
            producers = []
            for pid, state in sorted(s.metadata.producer_states(info.topic_id, p).items()):
                # a producer whose last write here was a transaction marker at a newer epoch has no
                # batch of that epoch yet
                last = state.batches[-1] if state.batches else None
                producers.append(
                    build(
                        r.ProducerState,
                        producer_id=pid,
                        producer_epoch=state.epoch,
                        last_sequence=last.last_seq if last is not None else -1,
                        last_timestamp=await batch_max_timestamp(s, info.topic_id, p, last.base_offset) if last is not None else -1,
                        coordinator_epoch=-1,
                        current_txn_start_offset=state.txn_first_offset,
                    )
                )
            parts.append(build(r.PartitionResponse, partition_index=p, error_code=ErrorCode.none, error_message=None, active_producers=tuple(producers)))
        out.append(build(r.TopicResponse, name=topic.name, partitions=tuple(parts)))
    return build(r.DescribeProducersResponse, throttle_time=NO_THROTTLE, topics=tuple(out))

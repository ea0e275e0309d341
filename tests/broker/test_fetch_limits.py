"""Fetch byte limits never skip offsets: when partition_max_bytes cuts an index entry short, the
response ends there (regression: the next entry's first batch used to be appended, leaving a gap)."""

from __future__ import annotations

import datetime
import struct

import pytest
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic

from tests.batches import make_batch
from tests.scenarios.records import create_topic
from tests.scenarios.test_bad_input import Raw, produce_v9

pytestmark = pytest.mark.integration


def offsets_in(records: bytes) -> list[int]:
    pos, offsets = 0, []
    while pos < len(records):
        base, length = struct.unpack_from(">qi", records, pos)
        (delta,) = struct.unpack_from(">i", records, pos + 23)
        offsets += range(base, base + delta + 1)
        pos += 12 + length
    return offsets


def fetch(raw: Raw, topic: str, offset: int, partition_max_bytes: int) -> list[int]:
    request = FetchRequest(
        cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1, max_bytes=10_000_000,
        isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
        topics=(FetchTopic(topic=topic, partitions=(FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=partition_max_bytes),)),),
        forgotten_topics_data=(),
    )
    cid = raw.request(request)
    return offsets_in(raw.response(1, 12, cid).responses[0].partitions[0].records)


def test_partial_entry_ends_the_partition_data(neve_node):
    topic = create_topic(neve_node.bootstrap, 1, prefix="fetch-limits")
    raw = Raw(neve_node.port)
    try:
        check_limits(raw, topic)
    finally:
        raw.close()


def check_limits(raw: Raw, topic: str) -> None:
    big = lambda i: (b"k", b"x" * 1000, [], 1000 + i)  # noqa: E731
    # one produce (one index entry): two ~1 KB batches, offsets 0 and 1; then a small one, offset 2
    for records in (make_batch([big(0)]) + make_batch([big(1)]), make_batch([(b"k", b"small", [], 1002)])):
        cid = raw.request(produce_v9(topic, {0: records}))
        assert [p.error_code for t in raw.response(0, 9, cid).responses for p in t.partition_responses] == [0]
    assert fetch(raw, topic, 0, 1500) == [0]
    assert fetch(raw, topic, 1, 1500) == [1, 2]  # entry read to its end: the next one may follow
    assert fetch(raw, topic, 0, 100_000) == [0, 1, 2]
    assert fetch(raw, topic, 2, 10) == [2]  # the first batch is returned even if over the limit


def fetch_partitions(raw: Raw, topic: str, partitions: list[int], max_bytes: int) -> list[tuple[int, int, list[int]]]:
    """(partition, high watermark, offsets returned) of each partition, in the request's order."""
    request = FetchRequest(
        cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1, max_bytes=max_bytes,
        isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
        topics=(FetchTopic(topic=topic, partitions=tuple(FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1_000_000) for p in partitions)),),
        forgotten_topics_data=(),
    )  # fmt: skip
    cid = raw.request(request)
    return [(p.partition_index, p.high_watermark, offsets_in(p.records)) for p in raw.response(1, 12, cid).responses[0].partitions]


def test_a_full_response_stops_reading_partitions(neve_node):
    """Once the response's max_bytes runs out within a partition, the partitions after it are
    answered without records (their high watermarks still current), though a small batch of
    theirs might have fitted: finding out would cost a read per partition. The client's next
    Fetch, which starts elsewhere in its list, gets them."""
    topic = create_topic(neve_node.bootstrap, 4, prefix="fetch-full")
    raw = Raw(neve_node.port)
    try:
        sizes = {0: 1000, 1: 1000, 2: 1000, 3: 10}  # one batch each, offset 0
        cid = raw.request(produce_v9(topic, {p: make_batch([(b"k", b"x" * n, [], 1000)]) for p, n in sizes.items()}))
        assert sorted(p.error_code for t in raw.response(0, 9, cid).responses for p in t.partition_responses) == [0, 0, 0, 0]
        # room for two ~1 KB batches: partition 2's does not fit, and partition 3 is not read
        assert fetch_partitions(raw, topic, [0, 1, 2, 3], 2500) == [(0, 1, [0]), (1, 1, [0]), (2, 1, []), (3, 1, [])]
        assert fetch_partitions(raw, topic, [3, 2, 1, 0], 2500) == [(3, 1, [0]), (2, 1, [0]), (1, 1, [0]), (0, 1, [])]
        assert fetch_partitions(raw, topic, [0, 1, 2, 3], 10_000) == [(0, 1, [0]), (1, 1, [0]), (2, 1, [0]), (3, 1, [0])]
    finally:
        raw.close()


def test_min_bytes_zero_is_answered_at_once(neve_node):
    """A Fetch asking for no data is answered without the long poll, data or not (Kafka does so):
    with max_wait far beyond the client's read timeout, any answer at all shows it did not wait."""
    topic = create_topic(neve_node.bootstrap, 2, prefix="fetch-min0")
    raw = Raw(neve_node.port)
    try:
        cid = raw.request(produce_v9(topic, {1: make_batch([(b"k", b"v", [], 1000)])}))
        assert [p.error_code for t in raw.response(0, 9, cid).responses for p in t.partition_responses] == [0]
        for min_bytes, partitions, expected in [(0, [0], [(0, 0, [])]), (0, [0, 1], [(0, 0, []), (1, 1, [0])])]:
            request = FetchRequest(
                cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(seconds=60), min_bytes=min_bytes, max_bytes=1_000_000,
                isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
                topics=(FetchTopic(topic=topic, partitions=tuple(FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1_000_000) for p in partitions)),),
                forgotten_topics_data=(),
            )  # fmt: skip
            cid = raw.request(request)
            answer = raw.response(1, 12, cid)  # within the client's 10 s read timeout, not max_wait's 60
            assert [(p.partition_index, p.high_watermark, offsets_in(p.records)) for p in answer.responses[0].partitions] == expected
    finally:
        raw.close()

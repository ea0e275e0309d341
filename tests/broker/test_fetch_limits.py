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

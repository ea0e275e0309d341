"""How a Fetch reads the object store: one ranged GET per WAL object for all the partitions it
asks for (not one per partition slice), with the exact stored bytes, offsets injected."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic

from tests.batches import make_batch
from tests.fixtures import free_port
from tests.neve.test_metrics import scrape
from tests.raw import Raw, produce_v9
from tests.scenarios.records import create_topic

pytestmark = pytest.mark.integration

PARTITIONS = 10


def fetch_all(raw: Raw, topic: str, partitions: int) -> dict[int, bytes]:
    request = FetchRequest(
        cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1, max_bytes=10_000_000,
        isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
        topics=(
            FetchTopic(
                topic=topic,
                partitions=tuple(
                    FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1_000_000)
                    for p in range(partitions)
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    cid = raw.request(request)
    response = raw.response(1, 12, cid).responses[0]
    assert [p.error_code for p in response.partitions] == [0] * partitions
    return {p.partition_index: p.records for p in response.partitions}


def served(batch: bytes, base_offset: int) -> bytes:
    """A stored batch as Fetch serves it: its assigned base offset and leader epoch 0 injected."""
    return base_offset.to_bytes(8, "big") + batch[8:12] + (0).to_bytes(4, "big") + batch[16:]


def test_one_get_per_object_for_every_partition_in_it(neve_factory):
    metrics_port = free_port()
    # No recent-objects cache: every read goes to the object store.
    node = neve_factory(env={"NEVE_BROKER_METRICS_PORT": str(metrics_port), "NEVE_WAL_LINGER_MS": "5", "NEVE_WAL_RECENT_OBJECTS_BYTES": "0"})
    topic = create_topic(node.bootstrap, PARTITIONS, prefix="fetch-reads")
    raw = Raw(node.port)
    try:
        # Two produce requests, the second sent after the first is answered: two WAL objects,
        # each with a batch of three records for every partition.
        batches = {
            (obj, p): make_batch([(b"k%d" % p, b"object %d partition %d record %d" % (obj, p, i) * 20, [], 1_700_000_000_000 + i) for i in range(3)])
            for obj in range(2)
            for p in range(PARTITIONS)
        }
        start = scrape(metrics_port)
        for obj in range(2):
            cid = raw.request(produce_v9(topic, {p: batches[(obj, p)] for p in range(PARTITIONS)}))
            answers = raw.response(0, 9, cid).responses[0].partition_responses
            assert [(a.index, a.error_code, a.base_offset) for a in answers] == [(p, 0, 3 * obj) for p in range(PARTITIONS)]
        before = scrape(metrics_port)

        got = fetch_all(raw, topic, PARTITIONS)

        after = scrape(metrics_port)
        expected = {p: served(batches[(0, p)], 0) + served(batches[(1, p)], 3) for p in range(PARTITIONS)}
        assert got == expected
        assert after["neve_object_gets_total"] - before["neve_object_gets_total"] == 2
        # the request and byte counters count exactly what was answered
        produce_requests = 'neve_requests_total{api="Produce"}'
        fetch_requests = 'neve_requests_total{api="Fetch"}'
        assert before[produce_requests] - start.get(produce_requests, 0) == 2
        assert after[fetch_requests] - before.get(fetch_requests, 0) == 1
        assert before["neve_produce_bytes_total"] - start["neve_produce_bytes_total"] == sum(len(b) for b in batches.values())
        assert after["neve_fetch_bytes_total"] - before["neve_fetch_bytes_total"] == sum(len(b) for b in got.values())
        assert after["neve_object_get_bytes_total"] - before["neve_object_get_bytes_total"] >= sum(len(b) for b in batches.values())
    finally:
        raw.close()

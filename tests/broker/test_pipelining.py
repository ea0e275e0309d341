"""A connection's pipelined produce requests are all taken in while earlier ones wait for their WAL
object: librdkafka sends one partition per ProduceRequest, so a producer writing to many
partitions has one request in flight per partition, and each waits for the broker's linger. A
broker that stopped reading after a few dozen would hold such a producer to a few dozen requests
per linger (the 10,000-partition benchmark ran at 1% of the 10-partition rate for that reason).

The node's WAL seals an object only when every request's batch is in the buffer (flush size =
the sum of the batches, linger one minute), so the answers arrive in time only if the broker
read all the requests before answering any.

Other requests (Fetch above all, whose answers can be large) stay limited to 64 per connection.
"""

from __future__ import annotations

import pytest

from tests.batches import make_batch
from tests.raw import Raw, fetch_v12, produce_v9
from tests.scenarios.records import create_topic

pytestmark = pytest.mark.integration

REQUESTS = 500  # well over the old per-connection limit of 64
BATCH = make_batch([(None, b"v" * 100, [], 1_700_000_000_000)])


def test_pipelined_produce_requests_share_one_object(neve_factory):
    node = neve_factory(env={"NEVE_WAL_LINGER_MS": "60000", "NEVE_WAL_FLUSH_BYTES": str(REQUESTS * len(BATCH))})
    topic = create_topic(node.bootstrap, REQUESTS)
    raw = Raw(node.port)
    try:
        sent = [raw.request(produce_v9(topic, {p: BATCH})) for p in range(REQUESTS)]
        answers = [raw.response(0, 9, cid) for cid in sent]
    finally:
        raw.close()
    got = [(r.responses[0].name, [(pr.index, pr.error_code, pr.base_offset) for pr in r.responses[0].partition_responses]) for r in answers]
    assert got == [(topic, [(p, 0, 0)]) for p in range(REQUESTS)]
    stored = [f for f in (node.data_dir / "objects").rglob("*") if f.is_file() and ".tmp-" not in f.name]
    assert len(stored) == 1, stored


OTHER_LIMIT = 64  # NEVE_BROKER_MAX_INFLIGHT_REQUESTS, the default
FETCHES = 100


def test_other_requests_stay_limited_per_connection(neve_factory):
    """100 long-polling fetches, then a produce, on one connection. The broker reads the first 64
    fetches and stops reading; they can only time out, empty. Then it reads the rest and the
    produce, whose record wakes fetches 65-100. Without the limit the produce would be read at
    once and every fetch would answer with the record."""
    node = neve_factory(env={"NEVE_WAL_LINGER_MS": "5"})
    topic = create_topic(node.bootstrap, 1)
    raw = Raw(node.port)
    try:
        fetches = [raw.request(fetch_v12(topic, 0, 0, max_wait_ms=1500)) for _ in range(FETCHES)]
        produced = raw.request(produce_v9(topic, {0: BATCH}))
        answers = [raw.response(1, 12, cid) for cid in fetches]
        produce_answer = raw.response(0, 9, produced)
    finally:
        raw.close()
    assert [(pr.index, pr.error_code, pr.base_offset) for pr in produce_answer.responses[0].partition_responses] == [(0, 0, 0)]
    got = []
    for answer in answers:
        [partition] = answer.responses[0].partitions
        assert partition.error_code == 0
        got.append(not partition.records)
    assert got == [True] * OTHER_LIMIT + [False] * (FETCHES - OTHER_LIMIT), f"empty answers: {sum(got)}"

"""Produce enforces a topic's max.message.bytes per record batch (Kafka's rule), falling back to
the broker's limit, through a stock client: a batch over the limit is refused with
MESSAGE_TOO_LARGE and nothing of it is stored; smaller batches, and other topics, are unaffected."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.scenarios.records import LOG

pytestmark = pytest.mark.integration
T = 30


def produce_one(bootstrap: str, topic: str, value: bytes) -> tuple[KafkaError | None, int]:
    """(delivery error or None, offset) of one uncompressed record sent alone in its batch."""
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "none", "linger.ms": 0, "logger": LOG, "message.timeout.ms": T * 1000})
    outcome = []
    producer.produce(topic, value=value, partition=0, on_delivery=lambda err, msg: outcome.append((err, msg.offset())))
    assert producer.flush(T) == 0
    return outcome[0]


def test_topic_max_message_bytes_is_enforced_per_batch(neve_node):
    admin = AdminClient({"bootstrap.servers": neve_node.bootstrap, "logger": LOG})
    futures = admin.create_topics([NewTopic("small", 1, config={"max.message.bytes": "2000"}), NewTopic("default", 1)])
    for f in futures.values():
        f.result(T)

    err, _ = produce_one(neve_node.bootstrap, "small", b"x" * 5000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    # A batch under the topic's limit is stored, at offset 0: the refused one took no offset.
    assert produce_one(neve_node.bootstrap, "small", b"y" * 500) == (None, 0)
    # Another topic keeps the broker's limit (10 MiB by default).
    assert produce_one(neve_node.bootstrap, "default", b"z" * 5000) == (None, 0)


def test_a_batch_that_decompresses_past_the_bound_is_too_large_and_the_rest_is_stored(neve_node):
    """A zstd batch of 12 KB whose records section decompresses to 300 MiB, past the broker's
    256 MiB bound (NEVE_BROKER_MAX_DECOMPRESSED_BATCH_BYTES): MESSAGE_TOO_LARGE for its partition,
    without the broker taking the 300 MiB; the request's other partition is stored, and the
    connection goes on serving."""
    import cramjam

    from tests.batches import ZSTD, frame_batch, make_batch
    from tests.raw import Raw, assert_still_serving, produce_v9
    from tests.scenarios.records import create_topic

    topic = create_topic(neve_node.bootstrap, 2, prefix="expands")
    bomb = frame_batch(bytes(cramjam.zstd.compress(bytes(300 * 2**20))), record_count=1, last_offset_delta=0, base_timestamp=1, max_timestamp=1, attributes=ZSTD)
    assert len(bomb) < 100_000
    raw = Raw(neve_node.port)
    try:
        cid = raw.request(produce_v9(topic, {0: bomb, 1: make_batch([(b"k", b"v", [], 1)])}))
        answers = {p.index: (p.error_code, p.base_offset) for t in raw.response(0, 9, cid).responses for p in t.partition_responses}
        assert answers == {0: (10, -1), 1: (0, 0)}
        assert_still_serving(raw)
    finally:
        raw.close()

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

"""Produce validates every record, as Kafka does: a batch whose CRC is right but whose records do
not parse answers its partition CORRUPT_MESSAGE, a record without a key sent to a compacted topic
answers INVALID_RECORD (librdkafka's test 0011 expects it) naming each keyless record, so that
librdkafka fails exactly those records and the others of their batch as refused for another's
sake; nothing of either is stored, and a stock consumer then reads exactly the good records at
the offsets their produces answered."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.batches import GZIP, ZSTD, encode_records, frame_batch, make_batch
from tests.raw import Raw, produce_v9

CORRUPT_MESSAGE, INVALID_RECORD = 2, 87
T0 = 1_700_000_000_000


def create(bootstrap: str, configs: dict[str, str]) -> str:
    topic = f"validated-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1, config=configs)], operation_timeout=30)[topic].result(timeout=30)
    return topic


def batch(tag: bytes, n: int, key: bool = True, compression: int = 0) -> bytes:
    return make_batch([(b"k-%s-%d" % (tag, i) if key else None, b"%s-%d" % (tag, i), [], T0 + i) for i in range(n)], compression=compression)


def produce(raw: Raw, topic: str, partitions: dict[int, bytes]) -> list[tuple[int, int]]:
    """(error code, base offset) of each partition, in the order given."""
    cid = raw.request(produce_v9(topic, partitions))
    return [(p.error_code, p.base_offset) for t in raw.response(0, 9, cid).responses for p in t.partition_responses]


def consume_all(bootstrap: str, topic: str, partition: int, expected: int) -> list[tuple[int, bytes | None, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False, "check.crcs": True})
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        got: list[tuple[int, bytes | None, bytes]] = []
        for _ in range(600):  # 0.1 s polls: a minute at most
            if len(got) >= expected:
                break
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.offset(), msg.key(), msg.value()))
        # nothing beyond the expected records
        extra = consumer.poll(1.0)
        assert extra is None or extra.error() is not None, (extra.offset(), extra.value())
        return got
    finally:
        consumer.close()


@pytest.mark.integration
def test_unparseable_records_and_keyless_records_on_a_compacted_topic_are_refused(neve_node):
    bootstrap = neve_node.bootstrap
    plain = create(bootstrap, {})
    compacted = create(bootstrap, {"cleanup.policy": "compact"})
    good = encode_records([(b"k", b"v-%d" % i, [], T0 + i) for i in range(3)], T0)
    unparseable = [
        frame_batch(b"\x7f" * 40, record_count=3, last_offset_delta=2, base_timestamp=T0, max_timestamp=T0 + 2),
        frame_batch(good[:-1], record_count=3, last_offset_delta=2, base_timestamp=T0, max_timestamp=T0 + 2),  # one byte short
        frame_batch(good, record_count=4, last_offset_delta=3, base_timestamp=T0, max_timestamp=T0 + 2),  # a record missing
    ]
    raw = Raw(neve_node.port)
    try:
        assert produce(raw, plain, {0: batch(b"a", 2)}) == [(0, 0)]
        for bad in unparseable:
            # the bad partition refused, the good one beside it in the same request stored
            assert produce(raw, plain, {0: bad, 1: batch(b"x", 1)})[0] == (CORRUPT_MESSAGE, -1)
        # a good batch followed by a bad one in the same partition: neither is stored
        assert produce(raw, plain, {0: batch(b"lost", 1) + unparseable[0]}) == [(CORRUPT_MESSAGE, -1)]
        assert produce(raw, plain, {0: batch(b"b", 2, compression=GZIP)}) == [(0, 2)]
        assert produce(raw, plain, {0: batch(b"keyless-but-plain", 1, key=False)}) == [(0, 4)]

        assert produce(raw, compacted, {0: batch(b"c", 2)}) == [(0, 0)]
        keyless = make_batch([(b"k", b"has-key", [], T0), (None, b"no-key", [], T0 + 1)], compression=ZSTD)
        assert produce(raw, compacted, {0: keyless, 1: batch(b"y", 1)}) == [(INVALID_RECORD, -1), (0, 0)]
        assert produce(raw, compacted, {0: batch(b"d", 1, compression=ZSTD)}) == [(0, 2)]
    finally:
        raw.close()

    assert consume_all(bootstrap, plain, 0, 5) == [
        (0, b"k-a-0", b"a-0"),
        (1, b"k-a-1", b"a-1"),
        (2, b"k-b-0", b"b-0"),
        (3, b"k-b-1", b"b-1"),
        (4, None, b"keyless-but-plain-0"),
    ]
    assert consume_all(bootstrap, plain, 1, 3) == [(i, b"k-x-0", b"x-0") for i in range(3)]
    assert consume_all(bootstrap, compacted, 0, 3) == [(0, b"k-c-0", b"c-0"), (1, b"k-c-1", b"c-1"), (2, b"k-d-0", b"d-0")]


KEYLESS = (0, 7, 42, 43, 99)


@pytest.mark.integration
def test_librdkafka_fails_exactly_the_keyless_records_of_a_batch(neve_node):
    """100 records in one batch to a compacted topic, five without a key: the broker names those
    five (record_errors), so librdkafka fails them with INVALID_RECORD and the 95 others with its
    INVALID_DIFFERENT_RECORD; none is stored, and keyed records sent next are read back exactly."""
    bootstrap = neve_node.bootstrap
    topic = create(bootstrap, {"cleanup.policy": "compact"})
    # a linger far beyond the test: flush() sends at once, so the 100 records travel as one batch
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 60_000, "enable.idempotence": False, "retries": 0})
    reports: dict[int, tuple[int | None, int]] = {}

    def report(i: int):
        def on_delivery(err, msg):
            reports[i] = (None if err is None else err.code(), msg.offset())

        return on_delivery

    for i in range(100):
        producer.produce(topic, value=b"first-%d" % i, key=None if i in KEYLESS else b"k-%d" % i, partition=0, on_delivery=report(i))
    assert producer.flush(60) == 0
    assert {i: code for i, (code, _) in reports.items()} == {i: KafkaError.INVALID_RECORD if i in KEYLESS else KafkaError._INVALID_DIFFERENT_RECORD for i in range(100)}

    reports.clear()
    for i in range(100):
        producer.produce(topic, value=b"second-%d" % i, key=b"k-%d" % i, partition=0, on_delivery=report(i))
    assert producer.flush(60) == 0
    assert reports == {i: (None, i) for i in range(100)}
    assert consume_all(bootstrap, topic, 0, 100) == [(i, b"k-%d" % i, b"second-%d" % i) for i in range(100)]

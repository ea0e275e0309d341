"""Transactions against `neve dev` with librdkafka (confluent-kafka): a transactional producer
commits, aborts and commits over several partitions of two topics; a read_committed consumer
reads exactly the committed records, in order, and a read_uncommitted one every record; the
markers take offsets; a transaction still open is invisible to read_committed readers; and a
second producer with the same transactional id fences the first."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

LINGER = {"NEVE_WAL_LINGER_MS": "5"}
PARTITIONS = 3
TIMEOUT = 60.0


def create_topics(bootstrap: str, *names: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(n, partitions, 1) for n in names], operation_timeout=30).values():
        fut.result(timeout=30)


def transactional_producer(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5})
    producer.init_transactions(TIMEOUT)
    return producer


def send(producer: Producer, topic: str, values: list[str]) -> None:
    for i, value in enumerate(values):
        producer.produce(topic, key=value.encode(), value=value.encode(), partition=i % PARTITIONS)
    producer.flush(TIMEOUT)


def consume_all(bootstrap: str, topics: list[str], isolation: str, expect: int) -> dict[tuple[str, int], list[tuple[int, str]]]:
    """Every record of `topics` from the start, by partition: (offset, value), until `expect`
    records arrived and the consumer reached each partition's end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"txn-reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(t, p, 0) for t in topics for p in range(PARTITIONS)])
    got: dict[tuple[str, int], list[tuple[int, str]]] = {}
    at_end: set[tuple[str, int]] = set()
    count = 0
    try:
        for _ in range(2000):
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add((msg.topic(), msg.partition()))
                    if count >= expect and len(at_end) == len(topics) * PARTITIONS:
                        break
                    continue
                raise KafkaException(msg.error())
            got.setdefault((msg.topic(), msg.partition()), []).append((msg.offset(), msg.value().decode()))
            count += 1
            at_end.discard((msg.topic(), msg.partition()))
    finally:
        consumer.close()
    return got


def values_of(got: dict) -> list[str]:
    return sorted(v for records in got.values() for _, v in records)


def test_commit_abort_commit_over_two_topics(neve_factory):
    node = neve_factory(env=LINGER)
    first, second = f"txn-a-{uuid.uuid4().hex[:6]}", f"txn-b-{uuid.uuid4().hex[:6]}"
    create_topics(node.bootstrap, first, second)
    producer = transactional_producer(node.bootstrap, f"tid-{uuid.uuid4().hex[:6]}")

    committed = []
    for n, commit in enumerate((True, False, True)):
        producer.begin_transaction()
        batch = [f"t{n}-{i}" for i in range(30)]
        send(producer, first, batch[:20])
        send(producer, second, batch[20:])
        if commit:
            producer.commit_transaction(TIMEOUT)
            committed += batch
        else:
            producer.abort_transaction(TIMEOUT)

    read_committed = consume_all(node.bootstrap, [first, second], "read_committed", len(committed))
    assert values_of(read_committed) == sorted(committed)
    everything = consume_all(node.bootstrap, [first, second], "read_uncommitted", 90)
    assert len(values_of(everything)) == 90
    for (topic, partition), records in everything.items():
        offsets = [o for o, _ in records]
        # each transaction's records on a partition, then its marker's offset: a gap of one
        assert offsets == sorted(offsets)
        n = len(offsets) // 3
        assert offsets == [*range(0, n), *range(n + 1, 2 * n + 1), *range(2 * n + 2, 3 * n + 2)], (topic, partition)
        # in send order within the partition
        assert [v for _, v in records] == sorted((v for _, v in records), key=lambda v: (int(v.split("-")[0][1:]), int(v.split("-")[1])))
    producer.flush(TIMEOUT)


def test_an_open_transaction_is_invisible_to_read_committed_until_it_commits(neve_factory):
    node = neve_factory(env=LINGER)
    topic = f"txn-open-{uuid.uuid4().hex[:6]}"
    create_topics(node.bootstrap, topic)
    producer = transactional_producer(node.bootstrap, f"tid-{uuid.uuid4().hex[:6]}")
    plain = Producer({"bootstrap.servers": node.bootstrap, "enable.idempotence": True})
    producer.begin_transaction()
    send(producer, topic, [f"open-{i}" for i in range(9)])
    send(plain, topic, [f"plain-{i}" for i in range(3)])  # after the open transaction's records
    assert consume_all(node.bootstrap, [topic], "read_committed", 0) == {}
    assert len(values_of(consume_all(node.bootstrap, [topic], "read_uncommitted", 12))) == 12
    producer.commit_transaction(TIMEOUT)
    assert values_of(consume_all(node.bootstrap, [topic], "read_committed", 12)) == sorted([f"open-{i}" for i in range(9)] + [f"plain-{i}" for i in range(3)])


def test_a_second_producer_with_the_same_id_fences_the_first(neve_factory):
    node = neve_factory(env=LINGER)
    topic = f"txn-fence-{uuid.uuid4().hex[:6]}"
    create_topics(node.bootstrap, topic)
    tid = f"tid-{uuid.uuid4().hex[:6]}"
    zombie = transactional_producer(node.bootstrap, tid)
    zombie.begin_transaction()
    send(zombie, topic, [f"zombie-{i}" for i in range(6)])
    successor = transactional_producer(node.bootstrap, tid)  # aborts the zombie's transaction
    successor.begin_transaction()
    send(successor, topic, [f"new-{i}" for i in range(6)])
    successor.commit_transaction(TIMEOUT)
    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction(TIMEOUT)
    assert fenced.value.args[0].fatal()
    assert values_of(consume_all(node.bootstrap, [topic], "read_committed", 6)) == sorted(f"new-{i}" for i in range(6))


def test_a_transaction_open_past_its_timeout_is_aborted(neve_factory):
    node = neve_factory(env={**LINGER, "NEVE_BROKER_TRANSACTION_CHECK_INTERVAL_MS": "200"})
    topic = f"txn-timeout-{uuid.uuid4().hex[:6]}"
    create_topics(node.bootstrap, topic)
    producer = Producer({"bootstrap.servers": node.bootstrap, "transactional.id": f"tid-{uuid.uuid4().hex[:6]}", "transaction.timeout.ms": 2000, "linger.ms": 5})
    producer.init_transactions(TIMEOUT)
    producer.begin_transaction()
    send(producer, topic, [f"late-{i}" for i in range(6)])  # two records on each partition, then nothing
    reader = Consumer({"bootstrap.servers": node.bootstrap, "group.id": f"w-{uuid.uuid4().hex[:6]}", "isolation.level": "read_committed"})
    try:
        # the sweep aborts it: an abort marker after the two records, and the last stable offset
        # moves past it (read_committed's end offset is the LSO)
        deadline = 600
        while deadline and any(reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] != 3 for p in range(PARTITIONS)):
            deadline -= 1
            reader.poll(0.1)
        assert deadline, "the transaction was not aborted within a minute"
    finally:
        reader.close()
    assert consume_all(node.bootstrap, [topic], "read_committed", 0) == {}
    assert values_of(consume_all(node.bootstrap, [topic], "read_uncommitted", 6)) == sorted(f"late-{i}" for i in range(6))
    with pytest.raises(KafkaException):  # its producer was fenced by the abort
        producer.commit_transaction(TIMEOUT)


def test_kafkajs_transactions_commit_abort_commit(neve_factory, artifacts_dir):
    from tests.clients.kafkajs_client import txn_produce

    node = neve_factory(env=LINGER)
    first, second = f"kjs-a-{uuid.uuid4().hex[:6]}", f"kjs-b-{uuid.uuid4().hex[:6]}"
    create_topics(node.bootstrap, first, second)
    sent = txn_produce(node.bootstrap, [first, second], PARTITIONS, f"tid-{uuid.uuid4().hex[:6]}", "c30,a30,c30", log_path=artifacts_dir / "kafkajs.log")
    assert [outcome for outcome, *_ in sent].count("committed") == 60 and len(sent) == 90
    committed = {(topic, p): sorted((offset, value) for outcome, t, p2, offset, value in sent if outcome == "committed" and (t, p2) == (topic, p)) for topic in (first, second) for p in range(PARTITIONS)}
    got = consume_all(node.bootstrap, [first, second], "read_committed", 60)
    assert got == {tp: records for tp, records in committed.items() if records}  # exact offsets, in order
    assert len(values_of(consume_all(node.bootstrap, [first, second], "read_uncommitted", 90))) == 90

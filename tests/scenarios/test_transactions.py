"""Transactions against `neve dev` with librdkafka (confluent-kafka): a transactional producer
commits, aborts and commits over several partitions of two topics; a read_committed consumer
reads exactly the committed records, in order, and a read_uncommitted one every record; the
markers take offsets; a transaction still open is invisible to read_committed readers; and a
second producer with the same transactional id fences the first."""

from __future__ import annotations

import threading
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


class Transformer(threading.Thread):
    """librdkafka consume-transform-produce, exactly once: in `group`, read `source`
    (read_committed), write each record to `sink` (same partition, same key and value) and send
    the consumed positions with the transaction (send_offsets_to_transaction); every
    `abort_every`'th transaction is aborted instead and its records read again from the group's
    committed offsets. After `hold_after` transactions it stays in the group reading nothing until
    `resume` is set. Ends when the group's committed offsets reach `end` ("done"), or when fenced."""

    def __init__(self, bootstrap: str, source: str, sink: str, group: str, transactional_id: str, end: dict[int, int], abort_every: int, hold_after: int = 0) -> None:
        super().__init__(daemon=True)
        self.args = (bootstrap, source, sink, group, transactional_id)
        self.end, self.abort_every, self.hold_after = end, abort_every, hold_after
        self.resume, self.holding, self.started_transactions = threading.Event(), threading.Event(), threading.Event()
        self.outcome: str | None = None
        self.committed = self.aborted = 0

    def run(self) -> None:
        try:
            self.outcome = self._run()
        except Exception as e:  # reported by the test
            self.outcome = f"error {e!r}"

    def _run(self) -> str:
        bootstrap, source, sink, group, transactional_id = self.args
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed", "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5})
        try:
            producer.init_transactions(TIMEOUT)
            self.started_transactions.set()
            consumer.subscribe([source])
            n = 0
            for _ in range(4000):
                holding = self.hold_after and n >= self.hold_after and not self.resume.is_set()
                if holding:
                    consumer.pause(consumer.assignment())
                    self.holding.set()
                    consumer.poll(0.1)
                    continue
                consumer.resume(consumer.assignment())
                msgs = consumer.consume(50, 0.3)
                if not msgs:
                    committed = consumer.committed([TopicPartition(source, p) for p in self.end], timeout=TIMEOUT)
                    if all(tp.offset >= self.end[tp.partition] for tp in committed):
                        return "done"
                    continue
                try:
                    producer.begin_transaction()
                    for m in msgs:
                        producer.produce(sink, key=m.key(), value=m.value(), partition=m.partition())
                    producer.send_offsets_to_transaction(consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), TIMEOUT)
                    if self.abort_every and n % self.abort_every == self.abort_every - 1:
                        producer.abort_transaction(TIMEOUT)
                        self.aborted += 1
                        for tp in consumer.committed(consumer.assignment(), timeout=TIMEOUT):
                            consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))
                    else:
                        producer.commit_transaction(TIMEOUT)
                        self.committed += 1
                except KafkaException as e:
                    error = e.args[0]
                    if error.fatal() or error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
                        return "fenced"
                    raise
                n += 1
            return "gave up"
        finally:
            consumer.close()


def test_librdkafka_consume_transform_produce_exactly_once_with_a_fenced_instance(neve_factory):
    node = neve_factory(env=LINGER)
    source, sink = f"src-{uuid.uuid4().hex[:6]}", f"sink-{uuid.uuid4().hex[:6]}"
    create_topics(node.bootstrap, source, sink)
    plain = Producer({"bootstrap.servers": node.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    send(plain, source, [f"in-{i}" for i in range(600)])
    inputs = consume_all(node.bootstrap, [source], "read_committed", 600)
    end = {p: records[-1][0] + 1 for (_, p), records in inputs.items()}
    group, tid = f"g-{uuid.uuid4().hex[:6]}", f"tid-{uuid.uuid4().hex[:6]}"

    first = Transformer(node.bootstrap, source, sink, group, tid, end, abort_every=3, hold_after=4)
    first.start()
    assert first.holding.wait(TIMEOUT), first.outcome
    second = Transformer(node.bootstrap, source, sink, group, tid, end, abort_every=4)
    second.start()
    assert second.started_transactions.wait(TIMEOUT), second.outcome  # initialized: the first is fenced
    first.resume.set()
    first.join(TIMEOUT * 2)
    second.join(TIMEOUT * 2)
    assert (first.outcome, second.outcome) == ("fenced", "done")
    assert first.aborted + second.aborted > 0

    output = consume_all(node.bootstrap, [sink], "read_committed", 600)
    # each input record exactly once, in input order, in its partition
    assert {p: [v for _, v in records] for (_, p), records in output.items()} == {p: [v for _, v in records] for (_, p), records in inputs.items()}

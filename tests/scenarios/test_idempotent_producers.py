"""Idempotent producers against `neve dev`: the Java client (its defaults: idempotence on, acks=all)
and librdkafka (enable.idempotence, 5 requests in flight) each produce 20,000 records over 3
partitions and read them back with no duplicate and no gap, every record at its acknowledged offset
and in send order per partition; then again while the broker drops every Nth produce response
after committing it, so the clients retry batches that are already stored."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.clients.java_client import Ack, Consumed

COUNT = 20_000
PARTITIONS = 3
LINGER = {"NEVE_WAL_LINGER_MS": "10"}
DROP_EVERY = 7
DROP_ENV = "NEVE_FAULTS_DROP_PRODUCE_RESPONSE_EVERY"  # neve/config.py: [faults] drop_produce_response_every
FAULT = {**LINGER, DROP_ENV: str(DROP_EVERY)}
FAULT_EVENT = "fault_drop_produce_response"
FLUSH_TIMEOUT = 150.0
# Small batches under the fault, so 20,000 records take a few hundred produce requests and the
# broker drops many responses (with the defaults they fit in a handful of requests).
SMALL_BATCHES = {"java": {"batch.size": "1024"}, "librdkafka": {"batch.num.messages": "100"}}


def create_topic(bootstrap: str, partitions: int) -> str:
    topic = f"idem-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future: its handle serves it
    admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30)[topic].result(timeout=30)
    return topic


def produce_librdkafka(bootstrap: str, topic: str, log_path: Path, config: dict[str, str] | None = None) -> list[Ack]:
    """Records 0..COUNT-1 to partition seq % PARTITIONS (key = value = seq as text)."""
    acks: list[Ack] = []
    failures: list[KafkaError] = []
    fatal: list[KafkaError] = []
    logger = logging.getLogger(f"librdkafka.{topic}")
    logger.propagate = False
    handler = logging.FileHandler(log_path)
    logger.addHandler(handler)

    def on_delivery(err: KafkaError | None, msg) -> None:
        if err is not None:
            failures.append(err)
        else:
            acks.append(Ack(msg.partition(), msg.offset(), int(msg.value())))

    def on_error(err: KafkaError) -> None:
        if err.fatal():
            fatal.append(err)

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "neve-librdkafka-test",
            "enable.idempotence": True,
            "max.in.flight.requests.per.connection": 5,
            "acks": "all",
            "error_cb": on_error,
            "logger": logger,
            **(config or {}),
        }
    )
    try:
        for seq in range(COUNT):
            text = str(seq).encode()
            producer.produce(topic, value=text, key=text, partition=seq % PARTITIONS, on_delivery=on_delivery)
            producer.poll(0)
        remaining = producer.flush(FLUSH_TIMEOUT)
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert not fatal, f"librdkafka fatal error: {fatal[0]}"
    assert remaining == 0, f"{remaining} records unacknowledged after {FLUSH_TIMEOUT}s; see {log_path}"
    assert not failures, f"{len(failures)} records failed; first: {failures[0]}"
    return acks


def produce(client: str, java_client, bootstrap: str, topic: str, artifacts_dir: Path, config: dict[str, str] | None = None) -> list[Ack]:
    if client == "java":
        return java_client.produce(bootstrap, topic, COUNT, PARTITIONS, config=config, log_path=artifacts_dir / "java-produce.log")
    return produce_librdkafka(bootstrap, topic, artifacts_dir / "librdkafka.log", config)


def differences(name: str, actual: dict, expected: dict, limit: int = 5) -> list[str]:
    """A short account of how two big maps differ, instead of a 20,000-entry diff."""
    missing = sorted(expected.keys() - actual.keys())
    extra = sorted(actual.keys() - expected.keys())
    wrong = sorted(k for k in expected.keys() & actual.keys() if actual[k] != expected[k])
    out = []
    if missing:
        out.append(f"{name}: {len(missing)} missing, first {missing[:limit]}")
    if extra:
        out.append(f"{name}: {len(extra)} unexpected, first {[(k, actual[k]) for k in extra[:limit]]}")
    if wrong:
        out.append(f"{name}: {len(wrong)} differ, first {[(k, actual[k], expected[k]) for k in wrong[:limit]]}")
    return out


def assert_exactly_once(acks: list[Ack], consumed: Consumed) -> None:
    """Each seq acknowledged once; partition p holds exactly seqs p, p+P, p+2P, ... at offsets
    0, 1, 2, ... (no gap, no duplicate, send order kept); each acknowledged offset is where the
    record is read."""
    seen = Counter(a.seq for a in acks)
    twice = sorted(s for s, n in seen.items() if n > 1)
    assert not twice, f"{len(twice)} seqs acknowledged more than once, first {twice[:5]}"
    sizes = {p: len(range(p, COUNT, PARTITIONS)) for p in range(PARTITIONS)}
    expected = {(p, o): str(p + PARTITIONS * o) for p, n in sizes.items() for o in range(n)}
    read = {(r.partition, r.offset): r.value for r in consumed.records}
    served_twice = len(consumed.records) - len(read)
    problems = [f"end offsets {consumed.end_offsets}, expected {sizes}"] if consumed.end_offsets != sizes else []
    problems += [f"{served_twice} offsets served more than once"] if served_twice else []
    problems += differences("read", read, expected)
    problems += differences("acknowledged", {(a.partition, a.offset): str(a.seq) for a in acks}, expected)
    assert not problems, "\n".join(problems)


@pytest.mark.integration
@pytest.mark.parametrize("client", ["java", "librdkafka"])
def test_idempotent_producer_exactly_once(client, java_client, neve_factory, artifacts_dir):
    node = neve_factory(env=LINGER)
    topic = create_topic(node.bootstrap, PARTITIONS)

    acks = produce(client, java_client, node.bootstrap, topic, artifacts_dir)
    consumed = java_client.consume(node.bootstrap, topic, PARTITIONS, expect=COUNT, log_path=artifacts_dir / "java-consume.log")

    assert_exactly_once(acks, consumed)


@pytest.mark.integration
@pytest.mark.parametrize("client", ["java", "librdkafka"])
def test_retried_committed_batches_are_stored_once(client, java_client, neve_factory, artifacts_dir):
    node = neve_factory(env=FAULT)
    topic = create_topic(node.bootstrap, PARTITIONS)

    acks = produce(client, java_client, node.bootstrap, topic, artifacts_dir, SMALL_BATCHES[client])
    consumed = java_client.consume(node.bootstrap, topic, PARTITIONS, expect=COUNT, log_path=artifacts_dir / "java-consume.log")

    dropped = sum(FAULT_EVENT in line for line in node.log_path.read_text().splitlines())
    assert dropped > 0, f"the broker never dropped a produce response; is {DROP_ENV} honoured? log: {node.log_path}"
    assert_exactly_once(acks, consumed)

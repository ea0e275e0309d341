"""Consumer groups with stock clients against a `neve dev` node: membership churn while consuming
(librdkafka and aiokafka), commit-close-resume, static membership, the admin group APIs, and bad
group requests on a raw socket.

Records are `b"<partition>:<index>"` so what was consumed can be checked exactly. Waits are for
events (assignments, records) with deadlines, never fixed sleeps."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.scenarios.records import LOG, create_topic

pytestmark = pytest.mark.integration

ENV = {"NEVE_WAL_LINGER_MS": "5"}
DEADLINE = 45.0


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    """`per_partition` records into each partition, values `p:i`, all acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "logger": LOG})
    failures = []
    for i in range(per_partition):
        for p in range(partitions):
            producer.produce(topic, value=f"{p}:{i}".encode(), partition=p, on_delivery=lambda err, msg: err and failures.append(err))
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not failures


def consumer_config(bootstrap: str, group: str, **extra) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "max.poll.interval.ms": 20000,
        "logger": LOG,
        **extra,
    }


def wait_for(condition, timeout: float = DEADLINE, what: str = "condition", step=None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        if step is not None:
            step()
        else:
            time.sleep(0.02)


def poll_assignment(consumer: Consumer, timeout: float = DEADLINE) -> list[TopicPartition]:
    """Poll until the consumer has an assignment (the on_assign callback ran)."""
    wait_for(lambda: consumer.assignment(), timeout, "an assignment", step=lambda: consumer.poll(0.1))
    return consumer.assignment()


# --- 2. commit, close, resume -------------------------------------------------------------------


def test_commit_close_resume(neve_factory) -> None:
    node = neve_factory(env=ENV)
    topic = create_topic(node.bootstrap, 3)
    produce(node.bootstrap, topic, 3, 10)
    group = f"g-{uuid.uuid4().hex[:8]}"

    first = Consumer(consumer_config(node.bootstrap, group))
    first.subscribe([topic])
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    wait_for(lambda: all(len(v) >= 4 for v in seen.values()), what="4 records per partition", step=lambda: _record(first.poll(0.2), seen))
    committed_at = {0: 4, 1: 7, 2: 0}
    first.commit(offsets=[TopicPartition(topic, p, o) for p, o in committed_at.items()], asynchronous=False)
    assert {tp.partition: tp.offset for tp in first.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)} == committed_at
    first.close()

    second = Consumer(consumer_config(node.bootstrap, group))
    second.subscribe([topic])
    resumed: dict[int, list[int]] = {0: [], 1: [], 2: []}
    wait_for(lambda: sum(map(len, resumed.values())) >= 30 - sum(committed_at.values()), what="the rest of the records", step=lambda: _record(second.poll(0.2), resumed))
    second.close()
    assert resumed == {p: list(range(committed_at[p], 10)) for p in range(3)}


def _record(msg, into: dict[int, list[int]]) -> None:
    if msg is None:
        return
    assert msg.error() is None, msg.error()
    p, i = msg.value().decode().split(":")
    assert int(p) == msg.partition() and int(i) == msg.offset()
    into[msg.partition()].append(msg.offset())

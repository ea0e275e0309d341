"""Transactions when their coordinator dies, on a three-broker cluster (real etcd and SeaweedFS),
with librdkafka: the broker coordinating a transaction is killed with SIGKILL
- between its AddPartitionsToTxn and its EndTxn: a new producer with the transactional id, on
  another broker, aborts the transaction (none of its records ever reaches read_committed
  readers) and goes on; the old producer is fenced;
- in the middle of its EndTxn (a test fault: the decision is durable, one partition's marker is
  stored, the others are not): the producer's retried commit is completed by another broker from
  the stored decision, so every record of the transaction is committed, none half; and a new
  producer with the id goes on."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaException, Producer
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest

from tests.scenarios.test_bad_input import Raw
from tests.scenarios.test_consumer_groups import call
from tests.scenarios.test_transactions import TIMEOUT, consume_all, create_topics, send, transactional_producer, values_of

pytestmark = pytest.mark.integration

ENV = {"NEVE_WAL_LINGER_MS": "10", "NEVE_METADATA_LEASE_TTL_S": "2"}


def transaction_coordinator(port: int, transactional_id: str) -> int:
    raw = Raw(port)
    try:
        answer = call(raw, FindCoordinatorRequest(key_type=1, coordinator_keys=(transactional_id,))).coordinators[0]
    finally:
        raw.close()
    assert answer.error_code == ErrorCode.none, answer
    return answer.node_id


def test_coordinator_killed_between_add_partitions_and_end_txn(cluster_factory):
    cluster = cluster_factory(env=ENV)
    topic = f"txn-kill-{uuid.uuid4().hex[:6]}"
    create_topics(cluster.bootstrap, topic)
    tid = f"tid-{uuid.uuid4().hex[:6]}"
    zombie = transactional_producer(cluster.bootstrap, tid)
    zombie.begin_transaction()
    send(zombie, topic, [f"lost-{i}" for i in range(9)])  # AddPartitionsToTxn done, records stored
    coordinator = transaction_coordinator(cluster.nodes[0].port, tid)
    cluster.nodes[coordinator].kill9()
    live = ",".join(f"127.0.0.1:{n.port}" for i, n in enumerate(cluster.nodes) if i != coordinator)

    successor = transactional_producer(live, tid)  # another broker aborts the open transaction
    successor.begin_transaction()
    send(successor, topic, [f"kept-{i}" for i in range(9)])
    successor.commit_transaction(TIMEOUT)
    assert values_of(consume_all(live, [topic], "read_committed", 9)) == sorted(f"kept-{i}" for i in range(9))
    assert len(values_of(consume_all(live, [topic], "read_uncommitted", 18))) == 18
    with pytest.raises(KafkaException):
        zombie.commit_transaction(TIMEOUT)


def test_coordinator_killed_during_end_txn(cluster_factory):
    tid = f"tid-{uuid.uuid4().hex[:6]}"
    cluster = cluster_factory(env={**ENV, "NEVE_FAULTS_KILL_DURING_END_TXN": tid})
    topic = f"txn-kill-end-{uuid.uuid4().hex[:6]}"
    create_topics(cluster.bootstrap, topic)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid, "linger.ms": 5})
    producer.init_transactions(TIMEOUT)
    producer.begin_transaction()
    send(producer, topic, [f"whole-{i}" for i in range(9)])
    for _attempt in range(20):  # librdkafka: a commit whose coordinator died is retriable
        try:
            producer.commit_transaction(TIMEOUT)
            break
        except KafkaException as e:
            assert e.args[0].retriable(), e
    else:
        raise AssertionError("the commit was not completed after 20 attempts")
    dead = [i for i, node in enumerate(cluster.nodes) if node.process.poll() is not None]
    assert len(dead) == 1, dead  # the coordinator killed itself mid-commit; another completed it
    live = ",".join(f"127.0.0.1:{n.port}" for i, n in enumerate(cluster.nodes) if i not in dead)
    assert values_of(consume_all(live, [topic], "read_committed", 9)) == sorted(f"whole-{i}" for i in range(9))

    successor = transactional_producer(live, tid)
    successor.begin_transaction()
    send(successor, topic, [f"next-{i}" for i in range(3)])
    successor.commit_transaction(TIMEOUT)
    assert values_of(consume_all(live, [topic], "read_committed", 12)) == sorted([f"whole-{i}" for i in range(9)] + [f"next-{i}" for i in range(3)])

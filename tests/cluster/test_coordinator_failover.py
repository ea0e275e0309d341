"""Coordinator failover on a three-zone cluster (real etcd and SeaweedFS): a librdkafka group
consumes, its coordinator broker is killed with SIGKILL, the group is taken over by another broker
from the stored state, consumption goes on, and no committed offset is lost."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup

from tests.scenarios.records import LOG, create_topic
from tests.scenarios.test_bad_input import Raw
from tests.scenarios.test_consumer_groups import call, consumer_config, produce, wait_for

pytestmark = pytest.mark.integration

PARTITIONS = 4
PER_PARTITION = 100
DEADLINE = 45.0


def find_coordinator(port: int, group: str) -> int:
    raw = Raw(port)
    try:
        answer = call(raw, FindCoordinatorRequest(key_type=0, coordinator_keys=(group,))).coordinators[0]
    finally:
        raw.close()
    assert answer.error_code == ErrorCode.none, answer
    return answer.node_id


def fetch_offsets(port: int, group: str) -> dict[tuple[str, int], int]:
    raw = Raw(port)
    try:
        answer = call(raw, OffsetFetchRequest(groups=(OffsetFetchRequestGroup(group_id=group, topics=None),), require_stable=True)).groups[0]
    finally:
        raw.close()
    assert answer.error_code == ErrorCode.none, answer
    return {(t.name, p.partition_index): p.committed_offset for t in answer.topics for p in t.partitions}


class Members:
    """Two consumer threads that commit synchronously after every batch; they process records
    only while fewer than `limit` distinct records were seen."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.lock = threading.Lock()
        self.seen: dict[tuple[int, int], int] = {}
        self.committed: dict[int, int] = {}  # partition -> highest offset committed successfully
        self.failed_commits = 0
        self.limit = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(f"m{i}",), daemon=True) for i in range(2)]

    def _run(self, name: str) -> None:
        consumer = Consumer(consumer_config(self.bootstrap, self.group, **{"client.id": name, "session.timeout.ms": 10000}))
        consumer.subscribe([self.topic])
        paused: set[int] = set()
        try:
            while not self.stop.is_set():
                owned = {tp.partition for tp in consumer.assignment()}
                paused &= owned
                gated = len(self.seen) >= self.limit
                if gated and owned - paused:
                    consumer.pause([TopicPartition(self.topic, p) for p in owned - paused])
                    paused = set(owned)
                elif not gated and paused:
                    consumer.resume([TopicPartition(self.topic, p) for p in paused])
                    paused = set()
                upto: dict[int, int] = {}
                for msg in consumer.consume(20, 0.05):
                    if msg.error() is None:
                        with self.lock:
                            self.seen[(msg.partition(), msg.offset())] = self.seen.get((msg.partition(), msg.offset()), 0) + 1
                        upto[msg.partition()] = msg.offset() + 1
                for p, offset in upto.items():
                    try:
                        consumer.commit(offsets=[TopicPartition(self.topic, p, offset)], asynchronous=False)
                        with self.lock:
                            self.committed[p] = max(self.committed.get(p, 0), offset)
                    except KafkaException as e:
                        LOG.info("%s commit %d@%d failed: %s", name, p, offset, e)
                        with self.lock:
                            self.failed_commits += 1
        finally:
            consumer.close()

    def all_committed(self) -> bool:
        with self.lock:
            done: dict[int, int] = {}
            for p, o in self.seen:
                done[p] = max(done.get(p, 0), o + 1)
            return done == self.committed


def test_coordinator_failover_keeps_group_and_offsets(cluster_factory) -> None:
    cluster = cluster_factory(zones=("a", "b", "c"), env={"NEVE_METADATA_LEASE_TTL_S": "2", "NEVE_WAL_LINGER_MS": "10"})
    topic = create_topic(cluster.bootstrap, PARTITIONS)
    produce(cluster.bootstrap, topic, PARTITIONS, PER_PARTITION)
    group = f"g-{uuid.uuid4().hex[:8]}"
    ports = {i: node.port for i, node in enumerate(cluster.nodes)}
    coordinator = find_coordinator(ports[0], group)
    assert all(find_coordinator(port, group) == coordinator for port in ports.values())  # one coordinator, whatever the zone

    members = Members(cluster.bootstrap, topic, group)
    members.limit = PARTITIONS * PER_PARTITION // 2
    for t in members.threads:
        t.start()
    try:
        wait_for(lambda: len(members.seen) >= members.limit and members.all_committed(), DEADLINE, "half the records consumed and committed")
        before = fetch_offsets(ports[coordinator], group)
        assert before == {(topic, p): o for p, o in members.committed.items()}
        assert sum(before.values()) >= members.limit

        cluster.nodes[coordinator].kill9()
        survivors = {i: port for i, port in ports.items() if i != coordinator}
        wait_for(lambda: find_coordinator(next(iter(survivors.values())), group) != coordinator, DEADLINE, "the coordinator's lease to expire")
        new_coordinator = find_coordinator(next(iter(survivors.values())), group)
        assert all(find_coordinator(port, group) == new_coordinator for port in survivors.values())
        assert fetch_offsets(survivors[new_coordinator], group) == before  # nothing committed was lost

        members.limit = PARTITIONS * PER_PARTITION + 1
        wait_for(lambda: len(members.seen) == PARTITIONS * PER_PARTITION and members.all_committed(), DEADLINE, "every record consumed after the failover")
    finally:
        members.stop.set()
        for t in members.threads:
            t.join(DEADLINE)
    assert set(members.seen) == {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}
    duplicates = sum(n - 1 for n in members.seen.values())
    assert duplicates <= members.failed_commits * 20, (duplicates, members.failed_commits)  # only batches whose commit failed come again
    assert fetch_offsets(survivors[new_coordinator], group) == {(topic, p): PER_PARTITION for p in range(PARTITIONS)}
    # The new coordinator took the group over from its stored state (not from scratch).
    loaded = [json.loads(line) for line in cluster.nodes[new_coordinator].log_path.read_text().splitlines() if '"group_loaded"' in line]
    assert any(e["group"] == group and e["generation"] >= 1 and e["members"] == 2 for e in loaded), loaded

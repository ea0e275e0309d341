"""The planted bugs (chaos/plants.py) do what they say when their variable turns them on, and are
off by default: `neve config` lists each with its off default, and every variable a plant sets is
a neve option. Each broker plant is shown on a `neve dev` node through confluent-kafka, as the
harness's clients would meet it: a read_committed consumer reading an open transaction
(fetch-past-lso) and an aborted one's records (marker-lost), a record read twice after one
acknowledgement (batch-twice), an acknowledged commit the group does not keep
(offset-commit-dropped). The compactor's plant: tests/compactor/test_planted_fault.py."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from broker.config import FaultsConfig
from chaos.plants import PLANTS
from compactor.config import CompactorConfig
from neve.config import Config, load_config

TIMEOUT = 30.0
LINGER = {"NEVE_WAL_LINGER_MS": "5"}
PLANTED = {"marker_lost_every": 0, "fetch_past_lso": False, "batch_twice_every": 0, "offset_commit_dropped_every": 0}


# -- the registry and the settings (no node) ------------------------------------------------------


def test_every_plant_is_off_by_default_and_neve_config_lists_it():
    assert {name: getattr(FaultsConfig(), name) for name in PLANTED} == PLANTED
    assert CompactorConfig().fault_drop_row_every == 0
    listed = subprocess.run([sys.executable, "-m", "neve", "config"], capture_output=True, text=True, check=True, timeout=60).stdout
    for line in ("marker_lost_every = 0    # NEVE_FAULTS_MARKER_LOST_EVERY: Planted bug, test only", "fetch_past_lso = False    # NEVE_FAULTS_FETCH_PAST_LSO: Planted bug, test only",
                 "batch_twice_every = 0    # NEVE_FAULTS_BATCH_TWICE_EVERY: Planted bug, test only", "offset_commit_dropped_every = 0    # NEVE_FAULTS_OFFSET_COMMIT_DROPPED_EVERY: Planted bug, test only",
                 "fault_drop_row_every = 0    # NEVE_COMPACTOR_FAULT_DROP_ROW_EVERY: Planted bug, test only"):  # fmt: skip
        assert any(listed_line.startswith(line) for listed_line in listed.splitlines()), line


def test_each_plant_names_real_options_that_turn_it_on():
    assert set(PLANTS) == {"marker-lost", "fetch-past-lso", "batch-twice", "offset-commit-dropped", "table-row-dropped"}
    default = Config()
    for plant in PLANTS.values():
        assert plant.description and "\n" not in plant.description and plant.expect and plant.workloads
        assert set(plant.workloads) <= {"queue", "txn", "compacted"}
        env = {**plant.broker_env, **plant.compactor_env}
        assert env and all(name.startswith(("NEVE_FAULTS_", "NEVE_COMPACTOR_FAULT_")) for name in env), plant.name
        config = load_config(env=env)  # an unknown NEVE_* variable is refused
        changed = {(section.name, f.name) for section in dataclasses.fields(Config) if dataclasses.is_dataclass(getattr(config, section.name))
                   for f in dataclasses.fields(getattr(config, section.name)) if getattr(getattr(config, section.name), f.name) != getattr(getattr(default, section.name), f.name)}  # fmt: skip
        assert len(changed) == len(env), (plant.name, changed)
        assert {s for s, _ in changed} == ({"faults"} if plant.broker_env else set()) | ({"compactor"} if plant.compactor_env else set()), plant.name


# -- the broker's plants on a node ----------------------------------------------------------------


def create_topic(bootstrap: str, partitions: int) -> str:
    name = f"plant-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30).values():
        fut.result(timeout=30)
    return name


def transactional_producer(bootstrap: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tid-{uuid.uuid4().hex[:6]}", "linger.ms": 5})
    producer.init_transactions(TIMEOUT)
    return producer


def send(producer: Producer, topic: str, values: list[str], partition_of=lambda i: 0) -> None:
    for i, value in enumerate(values):
        producer.produce(topic, value=value.encode(), partition=partition_of(i))
    assert producer.flush(TIMEOUT) == 0


def read(bootstrap: str, topic: str, partitions: int, isolation: str) -> dict[int, list[tuple[int, str]]]:
    """Every record a consumer of `isolation` reads from offset 0 until each partition's end, by
    partition: (offset, value)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}", "isolation.level": isolation, "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[int, list[tuple[int, str]]] = {p: [] for p in range(partitions)}
    at_end: set[int] = set()
    try:
        for _ in range(200):
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(msg.error())
                at_end.add(msg.partition())
                if len(at_end) == partitions:
                    break
                continue
            got[msg.partition()].append((msg.offset(), msg.value().decode()))
            at_end.discard(msg.partition())
        else:
            raise AssertionError(f"partitions {set(range(partitions)) - at_end} never reached their end")
    finally:
        consumer.close()
    return got


def values(got: dict[int, list[tuple[int, str]]]) -> list[str]:
    return sorted(v for records in got.values() for _, v in records)


def test_fetch_past_lso_serves_an_open_transaction_to_read_committed(neve_factory):
    node = neve_factory(env={**LINGER, "NEVE_FAULTS_FETCH_PAST_LSO": "true"})
    topic = create_topic(node.bootstrap, 1)
    producer = transactional_producer(node.bootstrap)
    producer.begin_transaction()
    send(producer, topic, [f"open-{i}" for i in range(5)])
    # open: a correct broker serves none of it under read_committed (its last stable offset is 0)
    assert values(read(node.bootstrap, topic, 1, "read_committed")) == [f"open-{i}" for i in range(5)]
    producer.abort_transaction(TIMEOUT)
    # aborted: no aborted transaction is listed, so the client keeps the records
    assert values(read(node.bootstrap, topic, 1, "read_committed")) == [f"open-{i}" for i in range(5)]


def test_marker_lost_makes_one_partition_of_an_aborted_transaction_visible(neve_factory):
    node = neve_factory(env={**LINGER, "NEVE_FAULTS_MARKER_LOST_EVERY": "1"})
    topic = create_topic(node.bootstrap, 3)
    producer = transactional_producer(node.bootstrap)
    producer.begin_transaction()
    send(producer, topic, [f"aborted-{i}" for i in range(9)], partition_of=lambda i: i % 3)
    producer.abort_transaction(TIMEOUT)  # the client sees a normal abort
    producer.begin_transaction()
    send(producer, topic, ["committed"])
    producer.commit_transaction(TIMEOUT)
    got = read(node.bootstrap, topic, 3, "read_committed")
    # one partition took a commit marker: its aborted records are read as committed, the others'
    # are skipped (a torn transaction); the marker and the commit after it end every partition
    leaked = [p for p, records in got.items() if any(v.startswith("aborted-") for _, v in records)]
    assert len(leaked) == 1, got
    assert sorted(v for _, v in got[leaked[0]] if v.startswith("aborted-")) == sorted(f"aborted-{i}" for i in range(9) if i % 3 == leaked[0])
    assert "committed" in values(got)
    assert len(values(read(node.bootstrap, topic, 3, "read_uncommitted"))) == 10


def test_batch_twice_stores_every_nth_idempotent_batch_twice_acknowledged_once(neve_factory):
    node = neve_factory(env={**LINGER, "NEVE_FAULTS_BATCH_TWICE_EVERY": "2"})
    topic = create_topic(node.bootstrap, 1)
    producer = Producer({"bootstrap.servers": node.bootstrap, "enable.idempotence": True, "linger.ms": 0})
    acked: list[tuple[int, str]] = []

    def on_delivery(err, msg) -> None:
        assert err is None, err
        acked.append((msg.offset(), msg.value().decode()))

    for i in range(6):  # one batch each
        producer.produce(topic, value=f"v{i}".encode(), on_delivery=on_delivery)
        assert producer.flush(TIMEOUT) == 0
    assert [v for _, v in acked] == [f"v{i}" for i in range(6)]  # one acknowledgement each
    records = read(node.bootstrap, topic, 1, "read_uncommitted")[0]
    by_value: dict[str, list[int]] = {}
    for offset, value in records:
        by_value.setdefault(value, []).append(offset)
    # the 2nd, 4th and 6th batches twice, at two offsets, the first of them the acknowledged one
    assert {v: len(offsets) for v, offsets in by_value.items()} == {"v0": 1, "v1": 2, "v2": 1, "v3": 2, "v4": 1, "v5": 2}
    assert all(by_value[v][0] == offset for offset, v in acked)


def test_offset_commit_dropped_acknowledges_every_nth_commit_without_storing_it(neve_factory):
    node = neve_factory(env={**LINGER, "NEVE_FAULTS_OFFSET_COMMIT_DROPPED_EVERY": "2"})
    topic = create_topic(node.bootstrap, 1)
    send(Producer({"bootstrap.servers": node.bootstrap}), topic, [f"v{i}" for i in range(5)])
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    try:
        seen = []
        for offset in (1, 2, 3, 4):
            answer = consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
            assert [(tp.offset, tp.error) for tp in answer] == [(offset, None)]  # acknowledged
            (stored,) = consumer.committed([TopicPartition(topic, 0)], timeout=TIMEOUT)
            seen.append(stored.offset)
    finally:
        consumer.close()
    # the 2nd and 4th commits were dropped: the group went on holding the offset before each
    assert seen == [1, 1, 3, 3]

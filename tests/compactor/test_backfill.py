"""Backfill (issue 22): switching Iceberg on for a topic that already holds data converts its
history too, not only what arrives after. 100,000 records are produced to a topic with
`neve.iceberg.enabled=false` while the compactor runs (it leaves the topic alone: the index stays
WAL); after `neve.iceberg.enabled=true` the table holds every one of them, once, and the offset index
names the table for all of them."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from metadata.model import ObjectType
from tests.compactor.produced import Produced
from tests.compactor.test_service import index_types, node_env, table_offsets, wait_for_table
from tests.fixtures import free_port

RECORDS = 100_000
PARTITIONS = 4


@pytest.mark.timeout(900)  # 51 s on a quiet machine, over 300 s under make test-slow
def test_switching_iceberg_on_converts_the_history_already_produced(neve_factory):
    node = neve_factory(env=node_env(free_port()))
    data_dir = Path(node.data_dir).resolve()
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    topic = f"backfill-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config={"neve.iceberg.enabled": "false"})])[topic].result(60)

    acked: dict[tuple[int, int], None] = {}

    def on_delivery(err, msg) -> None:
        assert err is None, err
        acked[(msg.partition(), msg.offset())] = None

    producer = Producer({"bootstrap.servers": node.bootstrap, "acks": "all", "linger.ms": 20, "compression.type": "lz4"})
    for i in range(RECORDS):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % PARTITIONS, on_delivery=on_delivery)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0
    assert len(acked) == RECORDS

    # Another topic, Iceberg on, compacted meanwhile: the compactor ran, and left this one alone.
    other = f"other-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(other, 1, 1)])[other].result(60)
    mark: dict = {}
    producer.produce(other, value=b"x", on_delivery=lambda err, msg: mark.update({(msg.partition(), msg.offset()): None}))
    assert producer.flush(60) == 0
    wait_for_table(data_dir, Produced(other, mark, {}))
    assert table_offsets(data_dir, topic) == []

    on = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry("neve.iceberg.enabled", "true", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([on])[on].result(60)
    wait_for_table(data_dir, Produced(topic, acked, {}))
    assert node.stop() == 0
    assert index_types(data_dir, topic) == {ObjectType.PARQUET}
    assert table_offsets(data_dir, topic) == sorted(acked)

"""The compaction service end to end, inside `neve dev` as a user runs it: records that confluent-kafka
produced (raw values and Avro ones from its AvroSerializer against neve's registry, through every
codec, tombstones and malformed values among them) become exactly one row per acknowledged offset
in each topic's table, the index then names the cycle manifests, and the Kafka view is what it was:
every record consumed again byte for byte, also after a restart. kill -9 of the node after a cycle's
Parquet write, after its Iceberg commit and after its index swap: each restart finishes or redoes
the cycle, and the table holds each offset exactly once.

The tasks run in the node's process here (runner in-process); tests/compactor/test_job.py runs the
same tasks on Spark."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from pyiceberg.catalog.sql import SqlCatalog

from metadata.model import ObjectType
from metadata.store import load_metadata_store
from tests.compactor.produced import PARTITIONS, Produced, produce_avro, produce_raw
from tests.fixtures import free_port

WAIT_S = 240.0  # an event awaited (every row in the table): generous for a slow, busy machine


def node_env(registry_port: int, **extra: str) -> dict[str, str]:
    return {
        "NEVE_REGISTRY_PORT": str(registry_port),
        "NEVE_WAL_LINGER_MS": "5",
        "NEVE_COMPACTOR_IN_NODE": "true",
        "NEVE_COMPACTOR_RUNNER": "in-process",
        "NEVE_COMPACTOR_FRESHNESS_MS": "200",
        "NEVE_COMPACTOR_INTERVAL_MS": "200",
        **extra,
    }


def consume_all(bootstrap: str, topic: str, counts: dict[int, int]) -> dict[tuple[int, int], tuple]:
    """Every record of `topic` from offset 0, by (partition, offset): (key, value, headers, timestamp)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}", "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: dict[tuple[int, int], tuple] = {}
    deadline = time.monotonic() + WAIT_S
    try:
        while any(sum(1 for (p, _) in got if p == part) < n for part, n in counts.items()):
            assert time.monotonic() < deadline, f"consumed {len(got)} of {sum(counts.values())}"
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got[(msg.partition(), msg.offset())] = (msg.key(), msg.value(), msg.headers() or [], msg.timestamp()[1])
    finally:
        consumer.close()
    return got


def table_offsets(data_dir: Path, topic: str) -> list[tuple[int, int]]:
    catalog = SqlCatalog("neve", uri=f"sqlite:///{data_dir / 'catalog.db'}", warehouse=f"file://{data_dir / 'warehouse'}")
    identifier = "neve." + topic.replace("-", "_")
    if not (data_dir / "catalog.db").exists() or not catalog.table_exists(identifier):
        return []
    kafka = catalog.load_table(identifier).scan(selected_fields=("kafka",)).to_arrow().column("kafka").to_pylist()
    return sorted((k["partition"], k["offset"]) for k in kafka)


def wait_for_table(data_dir: Path, p: Produced) -> float:
    """Seconds until the table holds every acknowledged offset; fails on a duplicate or a stranger."""
    started = time.monotonic()
    want = sorted(p.want)
    while True:
        got = table_offsets(data_dir, p.topic)
        assert len(got) == len(set(got)), "an offset is in the table twice"
        assert set(got) <= set(want), "the table holds an offset nobody produced"
        if got == want:
            return time.monotonic() - started
        assert time.monotonic() - started < WAIT_S, f"{len(got)} of {len(want)} rows after {WAIT_S} s"
        time.sleep(0.2)


def index_types(data_dir: Path, topic: str) -> set[ObjectType]:
    async def read():
        store = load_metadata_store(f"sqlite:///{data_dir / 'metadata.db'}")
        await store.start()
        try:
            info = store.topics()[topic]
            return {e.object_type for p in range(info.partitions) for e in store.entries(info.topic_id, p, 0, max_entries=10_000)}
        finally:
            await store.close()

    return asyncio.run(read())


def produce_both(node, registry_port: int) -> list[Produced]:
    return [produce_raw(node.bootstrap), produce_avro(node.bootstrap, f"http://127.0.0.1:{registry_port}")]


def counts_of(p: Produced) -> dict[int, int]:
    counts: dict[int, int] = {}
    for partition, _ in p.want:
        counts[partition] = counts.get(partition, 0) + 1
    return counts


def test_neve_dev_compacts_every_acknowledged_record_once_and_the_kafka_view_is_unchanged(neve_factory):
    registry_port = free_port()
    node = neve_factory(env=node_env(registry_port, NEVE_COMPACTOR_IN_NODE="false"))
    produced = produce_both(node, registry_port)
    before = {p.topic: consume_all(node.bootstrap, p.topic, counts_of(p)) for p in produced}
    for p in produced:
        assert sorted(before[p.topic]) == sorted(p.want)

    node.env["NEVE_COMPACTOR_IN_NODE"] = "true"
    node.restart()
    data_dir = Path(node.data_dir).resolve()
    for p in produced:
        wait_for_table(data_dir, p)
    for p in produced:  # served through the cycle manifests the index names now
        assert consume_all(node.bootstrap, p.topic, counts_of(p)) == before[p.topic]

    assert node.stop() == 0
    for p in produced:
        assert index_types(data_dir, p.topic) == {ObjectType.PARQUET}
    node.env["NEVE_COMPACTOR_IN_NODE"] = "false"
    node.start()
    for p in produced:
        assert consume_all(node.bootstrap, p.topic, counts_of(p)) == before[p.topic]
        assert table_offsets(data_dir, p.topic) == sorted(p.want)


@pytest.mark.parametrize("point", ["written", "committed", "swapped"])
def test_a_node_killed_in_a_cycle_finishes_or_redoes_it_on_restart_with_each_offset_once(neve_factory, point):
    registry_port = free_port()
    node = neve_factory(env=node_env(registry_port, NEVE_COMPACTOR_IN_NODE="false"))
    produced = [produce_raw(node.bootstrap)]
    p = produced[0]
    before = consume_all(node.bootstrap, p.topic, counts_of(p))

    node.env.update({"NEVE_COMPACTOR_IN_NODE": "true", "NEVE_COMPACTOR_FAULT_KILL_AFTER": point})
    node.restart()
    assert node.process.wait(WAIT_S) == -9  # the first cycle with work killed it at `point`
    data_dir = Path(node.data_dir).resolve()
    got = table_offsets(data_dir, p.topic)
    assert got == ([] if point == "written" else sorted(p.want))

    del node.env["NEVE_COMPACTOR_FAULT_KILL_AFTER"]
    node.start()
    wait_for_table(data_dir, p)
    assert consume_all(node.bootstrap, p.topic, counts_of(p)) == before
    assert node.stop() == 0
    assert index_types(data_dir, p.topic) == {ObjectType.PARQUET}
    assert table_offsets(data_dir, p.topic) == sorted(p.want)

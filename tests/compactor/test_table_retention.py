"""After a re-index (rewrites.py replaced a cycle's PARQUET entries by an entry naming a new
manifest), a restart finds the compactor's last cycle swapped: no error, nothing conflicting."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from compactor import service as service_module
from compactor.catalog import load_catalog
from compactor.reindex import finish_last_cycle
from compactor.translator import RAW
from tests.compactor.produced import PARTITIONS, Produced, Want, headers_of, key_of, produce
from tests.compactor.test_maintenance import compact_in_cycles, with_service
from tests.compactor.test_service import WAIT_S
from tests.fixtures import NeveNode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

DAY_MS = 86_400_000
OLD, NEW = 30, 12  # records per partition: days old, then recent
KEEP_MS = DAY_MS  # the table retention the tests set


def create_topic(bootstrap: str, prefix: str, **configs: str) -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1, config={"retention.ms": "-1", **configs})])[topic].result(30)
    return topic


def set_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the answer: a destroyed client fails its futures
    admin.incremental_alter_configs([resource])[resource].result(30)


def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)


def produce_days(bootstrap: str, topic: str) -> Produced:
    """Per partition: OLD records 2 and 3 days old (two table partitions), NEW an hour old; then
    one more in partition 0 with a 3-day-old timestamp. Returns what was acknowledged."""
    now = int(time.time() * 1000)
    want: dict = {}

    def item(partition: int, j: int, timestamp: int, codec: str):
        value = b"retained %d " % j * (j % 7 + 1)
        return partition, Want(codec, key_of(j, j), headers_of(j), timestamp, RAW, value_raw=value), value

    old = [item(j % PARTITIONS, j, now - (2 + j % 2) * DAY_MS - j, "none") for j in range(OLD * PARTITIONS)]
    produce(bootstrap, topic, "none", old, want)
    new = [item(j % PARTITIONS, j, now - 3_600_000 + j, "lz4") for j in range(OLD * PARTITIONS, (OLD + NEW) * PARTITIONS)]
    produce(bootstrap, topic, "lz4", new, want)
    produce(bootstrap, topic, "none", [item(0, 10_000, now - 3 * DAY_MS + 5, "none")], want)
    return Produced(topic, want, {})


def kept_of(p: Produced) -> tuple[Produced, dict[int, int]]:
    """What table retention of KEEP_MS keeps, and each partition's first kept offset: from each
    partition's first recent record on (the late old record after it stays)."""
    cutoff = int(time.time() * 1000) - KEEP_MS
    starts = {part: min(o for (q, o), w in p.want.items() if q == part and w.timestamp >= cutoff) for part in range(PARTITIONS)}
    return Produced(p.topic, {(q, o): w for (q, o), w in p.want.items() if o >= starts[q]}, {}), starts


def consume_from_zero(bootstrap: str, topic: str, counts: dict[int, int]) -> dict[tuple[int, int], tuple]:
    """Every record a consumer assigned at offset 0 of each partition gets (auto.offset.reset
    earliest), by (partition, offset), until `counts` are reached and a second passes with nothing."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ret-{time.monotonic_ns()}", "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: dict[tuple[int, int], tuple] = {}
    deadline = time.monotonic() + WAIT_S
    try:
        while True:
            msg = consumer.poll(1.0)
            if msg is None:
                if all(sum(1 for (q, _) in got if q == part) >= n for part, n in counts.items()):
                    return got
                assert time.monotonic() < deadline, f"consumed {len(got)} of {sum(counts.values())}"
                continue
            assert msg.error() is None, msg.error()
            got[(msg.partition(), msg.offset())] = (msg.key(), msg.value(), msg.headers() or [], msg.timestamp()[1])
    finally:
        consumer.close()


def as_consumed(p: Produced) -> dict[tuple[int, int], tuple]:
    return {k: (w.key, w.value_raw, [(h, v) for h, v in w.headers], w.timestamp) for k, w in p.want.items()}


def wait_until(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"no {what} after {WAIT_S} s"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def produced(tmp_path_factory) -> tuple[Path, Produced]:
    """produce_days through `neve dev` (its compactor off), the node stopped."""
    root = tmp_path_factory.mktemp("retention")
    (root / "node").mkdir()
    node = NeveNode(data_dir=root / "node", log_path=root / "node.log", env={"NEVE_WAL_LINGER_MS": "5", "NEVE_COMPACTOR_IN_NODE": "false"})
    with contextlib.ExitStack() as running:
        running.callback(lambda: node.stop() == 0 or pytest.fail("the node did not stop cleanly"))
        p = produce_days(node.start().bootstrap, create_topic(node.bootstrap, "ret"))
    return root / "node", p


def copy_of(produced, tmp_path: Path, iceberg, **settings):
    """The produced data dir copied, compacted a WAL entry a cycle into a namespace of its own."""
    data_dir, p = produced
    copy = tmp_path / "node"
    shutil.copytree(data_dir, copy)
    config = dataclasses.replace(iceberg.config, namespace=f"r{uuid.uuid4().hex[:8]}", maintenance_interval_ms=0, **settings)
    compact_in_cycles(copy, config, p.topic)
    return copy, config, f"{config.namespace}.{p.topic.replace('-', '_')}"


@pytest.fixture
def one_entry_a_cycle(monkeypatch):
    monkeypatch.setattr(service_module, "MAX_ENTRIES_PER_PARTITION", 1)


# -- the restart after a re-index -------------------------------------------------------------------


def test_a_restart_after_a_reindex_finds_the_last_cycle_swapped(produced, sqlite_catalog, tmp_path, one_entry_a_cycle, caplog):
    p = produced[1]
    data_dir, config, identifier = copy_of(produced, tmp_path, sqlite_catalog)
    merging = dataclasses.replace(config, runner="in-process", maintenance_interval_ms=1, merge_min_files=2)

    async def merge(service, metadata, objects):
        return await service.maintain_topic(metadata.topics()[p.topic])

    assert asyncio.run(with_service(data_dir, merging, None, merge)).reindexed_partitions == PARTITIONS

    async def restart(service, metadata, objects):
        table = load_catalog(config).load_table(identifier)
        return await finish_last_cycle(metadata, objects, table)

    with caplog.at_level(logging.INFO, logger="neve.compactor"):
        outcome = asyncio.run(with_service(data_dir, config, None, restart))
    assert outcome is not None and outcome.conflicts == [] and outcome.swapped == []
    assert outcome.already  # the last cycle's partitions, covered by the re-index's entries
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]



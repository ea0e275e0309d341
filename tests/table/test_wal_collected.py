"""WAL garbage collection beside the table (issue 22), in `neve dev` with a sweeper every second:
- once a topic is compacted and the read grace has passed, none of its WAL objects remains, and
  a consumer from offset 0 still reads every acknowledged record (from the table);
- records that DeleteRecords hid from the Kafka view before the compactor took them still reach
  the table (their index entries, and so their WAL objects, stay until the compactor replaces
  them)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.compactor.produced import Produced
from tests.compactor.test_service import WAIT_S, consume_all, node_env, table_offsets, wait_for_table
from tests.fixtures import free_port

GC_ENV = {"NEVE_WAL_SWEEP_INTERVAL_S": "1", "NEVE_WAL_READ_GRACE_S": "1", "NEVE_WAL_ORPHAN_GRACE_S": "8"}


def wal_files(data_dir: Path) -> set[Path]:
    root = data_dir / "objects" / "wal"
    return {p for p in root.rglob("*") if p.is_file() and ".tmp-" not in p.name} if root.exists() else set()


def produce(bootstrap: str, topic: str, count: int) -> dict[tuple[int, int], None]:
    acked: dict[tuple[int, int], None] = {}

    def on_delivery(err, msg) -> None:
        assert err is None, err
        acked[(msg.partition(), msg.offset())] = None

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, key=b"k%d" % i, value=b"value %d" % i, partition=i % 2, on_delivery=on_delivery)
    assert producer.flush(60) == 0
    assert len(acked) == count
    return acked


def wait_until(what: str, check) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"{what} after {WAIT_S} s"
        time.sleep(0.2)


def test_compacted_wal_objects_are_deleted_and_hidden_records_still_reach_the_table(neve_factory):
    node = neve_factory(env=node_env(free_port(), NEVE_COMPACTOR_IN_NODE="false", **GC_ENV))
    data_dir = Path(node.data_dir).resolve()
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    tabled, kept = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("tabled", "kept"))
    for topic in (tabled, kept):
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(60)

    hidden_acked = produce(node.bootstrap, tabled, 200)
    tabled_objects = wal_files(data_dir)
    assert tabled_objects
    for future in admin.delete_records([TopicPartition(tabled, p, -1) for p in range(2)], request_timeout=60).values():
        future.result(60)
    # Sweeps go on (one a second) past the orphan grace, and the hidden records' objects stay.
    time_to_be_swept = time.time() + float(GC_ENV["NEVE_WAL_ORPHAN_GRACE_S"]) + 3
    wait_until("the orphan grace passed", lambda: time.time() > time_to_be_swept)
    assert tabled_objects <= wal_files(data_dir)

    kept_acked = produce(node.bootstrap, kept, 300)
    node.env["NEVE_COMPACTOR_IN_NODE"] = "true"
    node.restart()
    wait_for_table(data_dir, Produced(tabled, hidden_acked, {}))
    wait_for_table(data_dir, Produced(kept, kept_acked, {}))
    # compacted, then the read grace: no WAL object is left
    wait_until("every compacted WAL object deleted", lambda: not wal_files(data_dir))

    counts = {p: sum(1 for part, _ in kept_acked if part == p) for p in range(2)}
    consumed = consume_all(node.bootstrap, kept, counts)
    assert sorted(consumed) == sorted(kept_acked)
    assert all(value == b"value %d" % int(key[1:]) for key, value, _, _ in consumed.values())
    assert table_offsets(data_dir, tabled) == sorted(hidden_acked)


def test_a_compactor_in_the_node_reads_the_wal_through_the_nodes_reader(neve_factory):
    """Compacting what the node just wrote costs no GET: the in-node compactor's tasks read through
    the node's reader, whose recent objects hold the WAL objects it wrote."""
    from tests.neve.test_metrics import scrape

    metrics_port = free_port()
    node = neve_factory(env=node_env(free_port(), NEVE_COMPACTOR_IN_NODE="true", NEVE_BROKER_METRICS_PORT=str(metrics_port)))
    topic = f"near-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(60)
    acked = produce(node.bootstrap, topic, 500)
    wait_for_table(Path(node.data_dir).resolve(), Produced(topic, acked, {}))
    samples = scrape(metrics_port)
    assert samples['neve_cache_lookups_total{layer="recent",result="hit"}'] >= 1
    assert samples.get("neve_object_gets_total", 0) == 0

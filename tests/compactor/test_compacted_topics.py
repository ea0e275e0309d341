"""`cleanup.policy=compact` through `neve dev` with the compactor in the node, produced and consumed
by librdkafka (confluent-kafka): 200 keys x 50 updates, 20 keys then deleted by tombstones, over 4
partitions. After compaction the table holds exactly one row per live key with its latest value
(pyiceberg, DuckDB), and a consumer reading from offset 0 gets exactly one record per live key
(its latest, at the offset it was acknowledged at) and the 20 tombstones, offsets increasing;
once `delete.retention.ms` has passed, no record of the 20 keys. Records younger than
`min.compaction.lag.ms` all stay: a key updated in that head is read twice."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.compactor.test_service import WAIT_S, node_env
from tests.compactor.test_transactions_clients import catalog
from tests.fixtures import free_port
from tests.readers import rows_duckdb, rows_pyiceberg

PARTITIONS = 4
KEYS, UPDATES, DELETED = 200, 50, 20
TIMEOUT = 60.0

Record = tuple[int, int, bytes, bytes | None]  # partition, offset, key, value (None: a tombstone)


def key(k: int) -> bytes:
    return b"key-%03d" % k


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]], timestamp: int = 0) -> list[Record]:
    """Each (key, value) to partition (key number % PARTITIONS), in order: the records as
    acknowledged."""
    acked: list[Record] = []

    def delivered(err, msg) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for k, v in records:
        producer.produce(topic, key=k, value=v, partition=int(k[4:]) % PARTITIONS, on_delivery=delivered, timestamp=timestamp)
        producer.poll(0)
    assert producer.flush(TIMEOUT) == 0
    assert len(acked) == len(records)
    return acked


def updates_then_deletes(bootstrap: str, topic: str) -> list[Record]:
    updates = [(key(k), b"v%02d-%03d" % (u, k)) for u in range(UPDATES) for k in range(KEYS)]
    return produce(bootstrap, topic, updates) + produce(bootstrap, topic, [(key(k), None) for k in range(DELETED)])


def latest_per_key(acked: list[Record]) -> list[Record]:
    """The last acknowledged record of each (partition, key), in (partition, offset) order."""
    last: dict[tuple[int, bytes], Record] = {}
    for r in sorted(acked, key=lambda r: (r[0], r[1])):
        last[(r[0], r[2])] = r
    return sorted(last.values(), key=lambda r: (r[0], r[1]))


def after_retention(want: list[Record]) -> list[Record]:
    """What a consumer reads of `want` (latest_per_key) once delete.retention.ms has passed: no
    tombstone but a partition's last record, which stays until a later record is compacted (as
    Kafka's cleaner never takes the newest record: it is in the active segment)."""
    last = {p: max(o for q, o, _, _ in want if q == p) for p in {r[0] for r in want}}
    return [r for r in want if r[3] is not None or r[1] == last[r[0]]]


def consume(bootstrap: str, topic: str) -> list[Record]:
    """Every record from offset 0, partition after partition in offset order, up to each end."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"compacted-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        return read_to_end(consumer)
    finally:
        consumer.close()


def read_to_end(consumer: Consumer, partitions: int = PARTITIONS) -> list[Record]:
    """Every record `consumer` (assigned, with enable.partition.eof) polls until it is at the end
    of each of the `partitions`, in (partition, offset) order, offsets checked strictly
    increasing as served."""
    got: list[Record] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + WAIT_S
    while len(at_end) < partitions:
        assert time.monotonic() < deadline, f"{len(got)} records, at the end of {sorted(at_end)} after {WAIT_S} s"
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(msg.partition())
                continue
            raise KafkaException(msg.error())
        got.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
        at_end.discard(msg.partition())
    for p in range(partitions):
        offsets = [o for q, o, _, _ in got if q == p]
        assert all(a < b for a, b in zip(offsets, offsets[1:], strict=False)), f"partition {p}: offsets not strictly increasing"
    return sorted(got, key=lambda r: (r[0], r[1]))


def wait_for_view(bootstrap: str, topic: str, want: list[Record]) -> None:
    """Until a consumer from offset 0 reads exactly `want` (compaction and its index merge are
    under way until then): each read must hold every record of `want`, and nothing but records
    acknowledged."""
    deadline = time.monotonic() + WAIT_S
    while (got := consume(bootstrap, topic)) != want:
        assert set(want) <= set(got), f"records missing from the Kafka view: {sorted(set(want) - set(got))[:5]}"
        assert time.monotonic() < deadline, f"the Kafka view still holds {len(got)} records ({len(want)} wanted) after {WAIT_S} s"
        time.sleep(0.5)


def wait_for_table(data_dir: Path, topic: str, want: list[Record]) -> None:
    """Until the topic's table holds exactly the rows of `want` (one per live key)."""
    rows_wanted = sorted((p, o, k, v) for p, o, k, v in want if v is not None)
    deadline = time.monotonic() + WAIT_S
    while True:
        cat = catalog(data_dir)
        if (data_dir / "catalog.db").exists() and cat.table_exists(f"neve.{topic}"):
            table = cat.load_table(f"neve.{topic}")
            got = sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["key_raw"], r["value_raw"]) for r in rows_pyiceberg(table))
            if got == rows_wanted:
                assert sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["key_raw"], r["value_raw"]) for r in rows_duckdb(table)) == rows_wanted
                return
            assert len({(p, k) for p, _, k, _ in got}) == len(got), "a key has two rows"
        assert time.monotonic() < deadline, f"the table is not one row per live key after {WAIT_S} s"
        time.sleep(0.3)


def create(bootstrap: str, topic: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config={"cleanup.policy": "compact", **configs})])[topic].result(TIMEOUT)


def test_a_compacted_topic_reads_one_record_per_live_key_and_its_table_one_row(neve_factory):
    node = neve_factory(env=node_env(free_port()))
    data_dir = Path(node.data_dir).resolve()
    create(node.bootstrap, "kept", **{"delete.retention.ms": "3600000"})  # tombstones served for an hour
    create(node.bootstrap, "gone", **{"delete.retention.ms": "1000"})
    want = {}
    for topic in ("kept", "gone"):
        acked = updates_then_deletes(node.bootstrap, topic)
        assert len(acked) == KEYS * UPDATES + DELETED
        want[topic] = latest_per_key(acked)
        assert len(want[topic]) == KEYS and sum(v is None for *_, v in want[topic]) == DELETED

    for topic in ("kept", "gone"):
        wait_for_table(data_dir, topic, want[topic])  # 180 rows, the latest values; no deleted key
    # tombstones are served while delete.retention.ms has not passed, none of their keys' earlier values
    wait_for_view(node.bootstrap, "kept", want["kept"])
    # and once it has, no record of the deleted keys but each partition's last (a tombstone here)
    gone = after_retention(want["gone"])
    assert sum(v is None for *_, v in gone) == PARTITIONS
    wait_for_view(node.bootstrap, "gone", gone)
    # a record after them: then no record of the deleted keys at all
    more = produce(node.bootstrap, "gone", [(key(KEYS + p), b"after") for p in range(PARTITIONS)])
    wait_for_view(node.bootstrap, "gone", sorted([r for r in want["gone"] if r[3] is not None] + more, key=lambda r: (r[0], r[1])))


def test_records_younger_than_min_compaction_lag_all_stay(neve_factory):
    node = neve_factory(env=node_env(free_port()))
    data_dir = Path(node.data_dir).resolve()
    create(node.bootstrap, "lagged", **{"min.compaction.lag.ms": "3600000"})
    two_hours_ago = int(time.time() * 1000) - 7_200_000
    old = produce(node.bootstrap, "lagged", [(key(k), b"old%d-%03d" % (u, k)) for u in range(3) for k in range(8)], timestamp=two_hours_ago)
    head = produce(node.bootstrap, "lagged", [(key(k), b"new-%03d" % k) for k in range(4)])  # now: younger than the lag
    compacted = latest_per_key(old)
    wait_for_table(data_dir, "lagged", compacted)  # the old records compacted, the head waits in the WAL
    # the keys updated in the head are read twice: their compacted value, then the head's
    wait_for_view(node.bootstrap, "lagged", sorted(compacted + head, key=lambda r: (r[0], r[1])))

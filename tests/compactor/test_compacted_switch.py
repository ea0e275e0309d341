"""A topic's cleanup.policy switched between `delete` and `compact` (IncrementalAlterConfigs by
librdkafka's AdminClient) through `neve dev` with the compactor in the node: every acknowledged
record stays readable as its new policy has it, in the Kafka view and in the table.

- `delete` → `compact`: the table stays the same table, converted by the first cycle after the
  switch: every key's earlier rows, written under `delete`, are deleted (those of keys not written
  since too, as Kafka's cleaner compacts the whole log), and so are their records in the Kafka
  view; each cycle from then on upserts the keys it writes. Records without key stay (Kafka's
  cleaner would drop them: neve loses no record).
- `compact` → `delete`: new records append (several rows per key again); nothing a compacted cycle
  removed comes back, and a tombstone still served stays served for its delete.retention.ms.

And `compact,delete`: retention.ms moves the log start past records older than it, as for a
`delete` topic, while the table is still upserted."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from tests.compactor.test_compacted_semantics import from_beginning
from tests.compactor.test_compacted_topics import PARTITIONS, TIMEOUT, Record, consume, create, key, latest_per_key, produce, wait_for_table, wait_for_view
from tests.compactor.test_service import WAIT_S, node_env
from tests.compactor.test_transactions_clients import catalog
from tests.fixtures import free_port
from tests.readers import rows_duckdb, rows_pyiceberg

KEYS = 16

Row = tuple[int, int, bytes, bytes]  # partition, offset, key, value


def alter_policy(bootstrap: str, topic: str, policy: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    change = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([change])[change].result(TIMEOUT)
    described = ConfigResource(ResourceType.TOPIC, topic)
    assert admin.describe_configs([described])[described].result(TIMEOUT)["cleanup.policy"].value == policy


def table_rows(data_dir: Path, topic: str, reader=rows_pyiceberg) -> list[Row]:
    """The table's rows as (partition, offset, key, value), sorted; none before it is made."""
    cat = catalog(data_dir)
    if not (data_dir / "catalog.db").exists() or not cat.table_exists(f"neve.{topic}"):
        return []
    return sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["key_raw"], r["value_raw"]) for r in reader(cat.load_table(f"neve.{topic}")))


def wait_for_rows(data_dir: Path, topic: str, want: list[Record]) -> None:
    """Until the topic's table holds exactly the rows `want` (pyiceberg, then DuckDB the same)."""
    rows = sorted(want)
    deadline = time.monotonic() + WAIT_S
    while (got := table_rows(data_dir, topic)) != rows:
        assert time.monotonic() < deadline, f"the table holds {len(got)} rows ({len(rows)} wanted) after {WAIT_S} s: missing {sorted(set(rows) - set(got))[:5]}, extra {sorted(set(got) - set(rows))[:5]}"
        time.sleep(0.3)
    assert table_rows(data_dir, topic, rows_duckdb) == rows


def keyless(bootstrap: str, topic: str) -> list[Record]:
    """A record without key to each partition: the records as acknowledged."""
    acked: list[Record] = []

    def delivered(err, msg) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    producer = Producer({"bootstrap.servers": bootstrap})
    for p in range(PARTITIONS):
        producer.produce(topic, value=b"no key %d" % p, partition=p, on_delivery=delivered)
    assert producer.flush(TIMEOUT) == 0 and len(acked) == PARTITIONS
    return acked


def in_order(records: list[Record]) -> list[Record]:
    return sorted(records, key=lambda r: (r[0], r[1]))


def test_a_topic_switched_to_compact_and_back_keeps_every_record_its_policy_keeps(neve_factory):
    node = neve_factory(env=node_env(free_port()))
    data_dir = Path(node.data_dir).resolve()
    create(node.bootstrap, "switched", **{"cleanup.policy": "delete", "delete.retention.ms": "3600000"})

    # under `delete`: every update is a row and a record; and a record without key per partition
    appended = produce(node.bootstrap, "switched", [(key(k), b"d%d-%03d" % (u, k)) for u in range(3) for k in range(KEYS)]) + keyless(node.bootstrap, "switched")
    wait_for_rows(data_dir, "switched", appended)
    assert consume(node.bootstrap, "switched") == in_order(appended)

    # switched to `compact`: the first cycle converts the table. The keys written after the switch
    # (0-7 updated, 15 deleted) are upserted; keys 8-14 keep their latest row and record only; the
    # records without key stay (Kafka's cleaner would drop them: neve loses no record)
    alter_policy(node.bootstrap, "switched", "compact")
    upserted = produce(node.bootstrap, "switched", [(key(k), b"c-%03d" % k) for k in range(8)] + [(key(15), None)])
    written = {r[2] for r in upserted}
    before = [r for r in appended if r[2] not in written]
    untouched = latest_per_key([r for r in before if r[2] is not None]) + [r for r in before if r[2] is None]
    assert len(untouched) == 7 + PARTITIONS
    compacted = latest_per_key(upserted)
    wait_for_rows(data_dir, "switched", untouched + [r for r in compacted if r[3] is not None])
    view = in_order(untouched + compacted)  # the tombstone served for delete.retention.ms
    wait_for_view(node.bootstrap, "switched", view)

    # back to `delete`: new records append; what compaction removed stays removed
    alter_policy(node.bootstrap, "switched", "delete")
    again = produce(node.bootstrap, "switched", [(key(k), b"a-%03d" % k) for k in range(KEYS)])
    wait_for_rows(data_dir, "switched", untouched + [r for r in compacted if r[3] is not None] + again)
    assert consume(node.bootstrap, "switched") == in_order(view + again)
    per_key = {k: sum(1 for r in table_rows(data_dir, "switched") if r[2] == key(k)) for k in range(KEYS)}
    assert per_key == {**dict.fromkeys(range(15), 2), 15: 1}


def test_compact_delete_applies_retention_ms_and_still_upserts_the_table(neve_factory):
    node = neve_factory(env=node_env(free_port(), NEVE_BROKER_RETENTION_CHECK_INTERVAL_MS="200"))
    data_dir = Path(node.data_dir).resolve()
    create(node.bootstrap, "both", **{"cleanup.policy": "compact,delete", "retention.ms": "600000"})
    two_hours_ago = int(time.time() * 1000) - 7_200_000
    old = produce(node.bootstrap, "both", [(key(k), b"old%d-%03d" % (u, k)) for u in range(2) for k in range(8)], timestamp=two_hours_ago)
    wait_for_table(data_dir, "both", latest_per_key(old))  # compacted: one row per key
    new = produce(node.bootstrap, "both", [(key(k), b"new-%03d" % k) for k in range(4)])
    # the table: the new rows of keys 0-3, the old ones of keys 4-7 (retention.ms leaves rows)
    wait_for_table(data_dir, "both", latest_per_key(old + new))
    # the Kafka view: retention moved each log start past the old records, to the new ones
    starts = {p: min(o for q, o, _, _ in new if q == p) for p in range(PARTITIONS)}
    deadline = time.monotonic() + WAIT_S
    while (got := from_beginning(node.bootstrap, "both")) != in_order(new):
        assert set(got) <= set(old + new)
        assert time.monotonic() < deadline, f"the Kafka view still holds {got} after {WAIT_S} s"
        time.sleep(0.3)
    assert log_starts(node.bootstrap, "both") == starts


def log_starts(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "starts"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT)[0] for p in range(PARTITIONS)}
    finally:
        consumer.close()

"""A compacted topic on the cluster: three brokers (zones a, b, c) on etcd and SeaweedFS, `neve
compactor` beside them with its catalog on PostgreSQL and its table files on S3. librdkafka
produces 200 keys x 50 updates, then tombstones for 20 keys, over 4 partitions, through broker 0
(zone a). After compaction pyiceberg, DuckDB and Spark 3.5 read exactly 180 rows, each live key's
latest value, and a consumer reading from offset 0 through broker 1 (zone b, so no byte comes from
the producer's broker) gets exactly one record per live key and the 20 tombstones
(`delete.retention.ms` has not passed), offsets strictly increasing."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.test_one_copy import compactor_env, start_compactor
from tests.compactor.test_compacted_topics import DELETED, KEYS, PARTITIONS, TIMEOUT, UPDATES, Record, key, latest_per_key, read_to_end
from tests.readers import rows_duckdb, rows_pyiceberg, rows_spark

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("spark")]

WAIT_S = 240.0  # an event awaited (the table one row per live key): generous for a slow, busy machine
TOPIC = "kept"


def leaders(client: Producer | Consumer) -> dict[int, int]:
    return {p: pm.leader for p, pm in client.list_topics(TOPIC, timeout=TIMEOUT).topics[TOPIC].partitions.items()}


def produce(bootstrap: str, client_id: str, records: list[tuple[bytes, bytes | None]]) -> tuple[list[Record], dict[int, int]]:
    """Each (key, value) to partition (key number % PARTITIONS), in order, by one idempotent
    producer: the records as acknowledged, and the leaders its Metadata named."""
    acked: list[Record] = []

    def delivered(err, msg) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5, "enable.idempotence": True})
    named = leaders(producer)
    for k, v in records:
        while True:
            try:
                producer.produce(TOPIC, key=k, value=v, partition=int(k[4:]) % PARTITIONS, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(TIMEOUT) == 0
    assert len(acked) == len(records)
    return acked, named


def consume(bootstrap: str, client_id: str) -> tuple[list[Record], dict[int, int]]:
    """Every record from offset 0 up to each partition's end, in (partition, offset) order (offsets
    checked strictly increasing as served), and the leaders the consumer's Metadata named."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "client.id": client_id, "group.id": f"reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        named = leaders(consumer)
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        return read_to_end(consumer), named
    finally:
        consumer.close()


def as_records(rows: list[dict]) -> list[Record]:
    return sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["key_raw"], r["value_raw"]) for r in rows)


# three brokers, etcd, SeaweedFS, PostgreSQL, the compactor and Spark's JVM start in it: on a busy
# 2-core machine their start alone has taken half of the suite's 300 s
@pytest.mark.timeout(600)
def test_a_compacted_topic_on_the_cluster_reads_one_row_and_one_record_per_live_key(cluster_factory, postgres_db, artifacts_dir, spark_session):
    from compactor.catalog import catalog_target, load_catalog
    from compactor.config import CompactorConfig
    from compactor.files.spark import register_catalog
    from tests.fixtures import S3_KEY, S3_SECRET

    cluster = cluster_factory(zones=("a", "b", "c"))
    writer, reader = cluster.nodes[0], cluster.nodes[1]
    # a catalog name of this test's own: the one Spark session keeps a catalog's first settings
    env = {**compactor_env(cluster, postgres_db), "NEVE_COMPACTOR_CATALOG_NAME": f"neve_{uuid.uuid4().hex[:8]}"}
    config = CompactorConfig(
        catalog_url=postgres_db, catalog_name=env["NEVE_COMPACTOR_CATALOG_NAME"], warehouse=env["NEVE_COMPACTOR_WAREHOUSE"],
        s3_endpoint=cluster.s3.endpoint, s3_access_key_id=S3_KEY, s3_secret_access_key=S3_SECRET,
    )  # fmt: skip
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config={"cleanup.policy": "compact", "delete.retention.ms": "3600000"})])[TOPIC].result(TIMEOUT)
    compactor = start_compactor(env, artifacts_dir / "compactor.log")
    try:
        updates = [(key(k), b"v%02d-%03d" % (u, k)) for u in range(UPDATES) for k in range(KEYS)]
        acked, named = produce(writer.bootstrap, "writer,zone_id=a", updates)
        assert named == {p: 0 for p in range(PARTITIONS)}  # zone a's only broker takes every record
        deletes, _ = produce(writer.bootstrap, "writer,zone_id=a", [(key(k), None) for k in range(DELETED)])
        want = latest_per_key(acked + deletes)
        live = [r for r in want if r[3] is not None]
        assert len(want) == KEYS and len(live) == KEYS - DELETED

        # the table: one row per live key (never two of a key on the way), the latest values
        catalog = load_catalog(config)
        identifier = f"neve.{TOPIC}"
        deadline = time.monotonic() + WAIT_S
        while True:
            if catalog.table_exists(identifier):
                rows = as_records(rows_pyiceberg(catalog.load_table(identifier)))
                if rows == live:
                    break
                assert len({(p, k) for p, _, k, _ in rows}) == len(rows), "a key has two rows"
            assert time.monotonic() < deadline, f"the table is not one row per live key after {WAIT_S} s"
            time.sleep(0.5)
        table = catalog.load_table(identifier)
        assert as_records(rows_duckdb(table)) == live
        assert as_records(rows_spark(spark_session, register_catalog(spark_session, catalog_target(config)), identifier)) == live

        # the Kafka view through another broker: one record per live key and the tombstones
        deadline = time.monotonic() + WAIT_S
        while True:
            got, named = consume(reader.bootstrap, "reader,zone_id=b")
            assert named == {p: 1 for p in range(PARTITIONS)}  # zone b's only broker serves every byte
            if got == want:
                break
            assert set(want) <= set(got), f"records missing from the Kafka view: {sorted(set(want) - set(got))[:5]}"
            assert set(got) <= set(acked + deletes), "a record never acknowledged"
            assert time.monotonic() < deadline, f"the Kafka view still holds {len(got)} records ({len(want)} wanted) after {WAIT_S} s"
            time.sleep(0.5)
    finally:
        compactor.terminate()
        assert compactor.wait(60) == 0

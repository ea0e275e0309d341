"""One copy on real servers (issue 22): two brokers on etcd and SeaweedFS, `neve compactor` beside
them (its catalog on PostgreSQL, its table files on the same S3 bucket as the WAL), the leader's
sweeper every second. After compaction and the read grace no WAL object remains (listed from S3),
and every acknowledged record is read back exactly once, byte for byte, through both brokers:
from the table's files alone."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.workload import s3_client, wait_until
from tests.fixtures import free_port
from tests.neve.test_metrics import scrape

PARTITIONS = 3
RECORDS = 3_000
WAIT_S = 240.0
GC_ENV = {"NEVE_WAL_SWEEP_INTERVAL_S": "1", "NEVE_WAL_READ_GRACE_S": "1"}  # the orphan grace stays an hour: compacted objects wait the read grace only


def produce(bootstrap: str, topic: str) -> dict[tuple[int, int], tuple]:
    acked: dict[tuple[int, int], tuple] = {}
    failures: list[str] = []
    for n, codec in enumerate(("none", "gzip", "snappy", "lz4", "zstd")):
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 10, "compression.type": codec})

        def delivered(record: tuple):
            def on_delivery(err, msg) -> None:
                if err is not None:
                    failures.append(str(err))
                else:
                    acked[(msg.partition(), msg.offset())] = record

            return on_delivery

        for i in range(RECORDS // 5):
            j = n * RECORDS + i
            key, value, headers = b"k%d" % j, None if j % 17 == 0 else b"%d " % j * (j % 9 + 1), [("h", b"%d" % j)]
            producer.produce(topic, key=key, value=value, partition=j % PARTITIONS, headers=headers, on_delivery=delivered((key, value, tuple(headers))))
            producer.poll(0)
        assert producer.flush(60) == 0
    assert not failures, failures[:3]
    return acked


def consume(bootstrap: str, topic: str, want: int) -> dict[tuple[int, int], tuple]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}", "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([KafkaPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: dict[tuple[int, int], tuple] = {}
    deadline = time.monotonic() + WAIT_S
    try:
        while len(got) < want:
            assert time.monotonic() < deadline, f"consumed {len(got)} of {want}"
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            assert (msg.partition(), msg.offset()) not in got, "a record twice"
            got[(msg.partition(), msg.offset())] = (msg.key(), msg.value(), tuple(msg.headers() or ()))
    finally:
        consumer.close()
    return got


def compactor_env(cluster, postgres_db: str) -> dict[str, str]:
    return {
        **cluster.nodes[0].env,
        "NEVE_COMPACTOR_CATALOG_URL": postgres_db,
        "NEVE_COMPACTOR_WAREHOUSE": f"s3://{cluster.s3.bucket}/{cluster.prefix}/warehouse",
        "NEVE_COMPACTOR_S3_ENDPOINT": cluster.s3.endpoint,
        "NEVE_COMPACTOR_RUNNER": "in-process",
        "NEVE_COMPACTOR_FRESHNESS_MS": "200",
        "NEVE_COMPACTOR_INTERVAL_MS": "200",
    }


def start_compactor(env: dict[str, str], log_path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "neve", "compactor"], stdout=log, stderr=subprocess.STDOUT, env=env)


@pytest.mark.integration
def test_after_compaction_and_collection_the_table_is_the_only_copy(cluster_factory, postgres_db, artifacts_dir):
    cluster = cluster_factory(zones=("a", "b"), env=GC_ENV)
    s3 = s3_client(cluster)
    bucket, prefix = cluster.s3.bucket, cluster.prefix

    def wal_keys() -> set[str]:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/wal/")
        return {o["Key"] for page in pages for o in page.get("Contents", ())}

    topic = f"one-copy-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)
    acked = produce(cluster.bootstrap, topic)
    assert len(acked) == RECORDS and wal_keys()
    assert consume(cluster.nodes[0].bootstrap, topic, RECORDS) == acked

    metrics_port = free_port()
    compactor = start_compactor({**compactor_env(cluster, postgres_db), "NEVE_COMPACTOR_METRICS_PORT": str(metrics_port)}, artifacts_dir / "compactor.log")
    try:
        # compacted, swapped, then collected by the leader's sweeper: no WAL object is left
        wait_until(lambda: not wal_keys(), timeout=WAIT_S, what="every WAL object collected", interval=0.5)
        # the compactor (zone a, its tasks in process) read the WAL through zone a's chunk owner
        samples = scrape(metrics_port)
        assert samples['neve_cache_peer_bytes_total{direction="received"}'] > 0
        assert samples["neve_cache_direct_reads_total"] == 0
    finally:
        compactor.terminate()
        assert compactor.wait(60) == 0
    for node in cluster.nodes:
        assert consume(node.bootstrap, topic, RECORDS) == acked


def table_offsets(cluster, postgres_db: str, topic: str) -> list[tuple[int, int]]:
    from compactor.catalog import load_catalog
    from compactor.config import CompactorConfig
    from tests.fixtures import S3_KEY, S3_SECRET

    env = compactor_env(cluster, postgres_db)
    config = CompactorConfig(catalog_url=postgres_db, warehouse=env["NEVE_COMPACTOR_WAREHOUSE"], s3_endpoint=cluster.s3.endpoint, s3_access_key_id=S3_KEY, s3_secret_access_key=S3_SECRET)
    catalog = load_catalog(config)
    identifier = "neve." + topic.replace("-", "_")
    if not catalog.table_exists(identifier):
        return []
    kafka = catalog.load_table(identifier).scan(selected_fields=("kafka",)).to_arrow().column("kafka").to_pylist()
    return sorted((k["partition"], k["offset"]) for k in kafka)


@pytest.mark.integration
def test_a_second_compactor_stands_by_and_takes_over_when_the_first_dies(cluster_factory, postgres_db, artifacts_dir):
    cluster = cluster_factory(zones=("a",))
    topic = f"two-compactors-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)
    env = {**compactor_env(cluster, postgres_db), "NEVE_METADATA_LEASE_TTL_S": "3"}
    first = start_compactor(env, artifacts_dir / "compactor-first.log")
    second = None
    try:
        acked = produce(cluster.bootstrap, topic)
        wait_until(lambda: table_offsets(cluster, postgres_db, topic) == sorted(acked), timeout=WAIT_S, what="the first batch in the table", interval=0.5)
        second = start_compactor(env, artifacts_dir / "compactor-second.log")
        wait_until(lambda: "compactor_standing_by" in (artifacts_dir / "compactor-second.log").read_text(), timeout=WAIT_S, what="the second compactor standing by")
        first.kill()
        first.wait(60)
        more = produce(cluster.bootstrap, topic)
        acked.update(more)
        wait_until(lambda: table_offsets(cluster, postgres_db, topic) == sorted(acked), timeout=WAIT_S, what="the second batch in the table, each row once", interval=0.5)
        assert "compactor_leading" in (artifacts_dir / "compactor-second.log").read_text()
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.terminate()
                assert process.wait(60) == 0

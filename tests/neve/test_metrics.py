"""Prometheus metrics of a running node: served as soon as Kafka clients can connect, and counting
what the node really stored."""

from __future__ import annotations

import os
import urllib.request

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.servers import parse_prometheus
from tests.fixtures import free_port

pytestmark = pytest.mark.integration


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return parse_prometheus(r.read().decode())


def stored_objects(objects_dir) -> tuple[int, int]:
    count = size = 0
    for dirpath, _dirs, files in os.walk(objects_dir):
        for name in files:
            if ".tmp-" not in name:
                count += 1
                size += os.path.getsize(os.path.join(dirpath, name))
    return count, size


def test_metrics_served_from_the_first_connection_and_count_stored_objects(neve_factory):
    port = free_port()
    node = neve_factory(env={"NEVE_BROKER_METRICS_PORT": str(port), "NEVE_WAL_LINGER_MS": "5"})
    # the Kafka port accepts (neve_factory waited for it): the metrics endpoint must answer already
    before = scrape(port)
    assert before["neve_wal_object_puts_total"] == 0 and before["neve_wal_commits_total"] == 0
    assert before["neve_offset_index_entries"] == 0

    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    admin.create_topics([NewTopic("m", 2)])["m"].result(10)
    producer = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 0, "acks": "all"})
    acked = []
    for i in range(50):
        producer.produce("m", value=b"v%d" % i, partition=i % 2, on_delivery=lambda err, msg: acked.append(err))
        producer.flush(10)  # one request at a time: several objects
    assert acked == [None] * 50

    after = scrape(port)
    count, size = stored_objects(node.data_dir / "objects")
    assert count >= 2
    assert after["neve_wal_object_puts_total"] == count
    assert after["neve_wal_commits_total"] == count
    assert after["neve_wal_object_bytes_total"] == size
    # one record per object: an index entry each, 57 bytes of columns (six 8-byte numbers, a
    # reference to its object's key, its object type)
    assert after["neve_offset_index_entries"] == count
    assert after["neve_offset_index_bytes"] == 57 * count
    # every PUT and every commit timed
    assert after["neve_wal_put_seconds_count"] == count and after["neve_wal_put_seconds_sum"] > 0
    assert after["neve_wal_commit_seconds_count"] == count and after["neve_wal_commit_seconds_sum"] > 0

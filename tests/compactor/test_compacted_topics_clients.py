"""`cleanup.policy=compact` through `neve dev` with the compactor in the node, with the stock Java
client and kafkajs: 200 keys x 50 updates, 20 keys then deleted by tombstones, over 4 partitions,
produced by the Java client. After compaction the table holds one row per live key (pyiceberg,
DuckDB), and a consumer reading from offset 0 — the Java client's and kafkajs's — gets exactly one
record per live key (its latest value, at the offset the Java producer was acknowledged) and the 20
tombstones, offsets strictly increasing per partition; once `delete.retention.ms` has passed, no
record of the 20 keys."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.clients import kafkajs_client
from tests.compactor.test_compacted_topics import DELETED, KEYS, PARTITIONS, UPDATES, Record, after_retention, create, key, latest_per_key, wait_for_table
from tests.compactor.test_service import WAIT_S, node_env
from tests.fixtures import free_port


def updates_then_deletes() -> list[tuple[int, bytes, bytes | None]]:
    """(partition, key, value): every key's 50 updates, then a tombstone for the first 20 keys."""
    updates = [(k % PARTITIONS, key(k), b"v%02d-%03d" % (u, k)) for u in range(UPDATES) for k in range(KEYS)]
    return updates + [(k % PARTITIONS, key(k), None) for k in range(DELETED)]


def increasing(records: list[Record], who: str) -> list[Record]:
    """`records` in (partition, offset) order, once each partition's offsets are strictly
    increasing in the order the client handed them over."""
    for p in range(PARTITIONS):
        offsets = [o for q, o, _, _ in records if q == p]
        assert all(a < b for a, b in zip(offsets, offsets[1:], strict=False)), f"{who}: partition {p}: offsets not strictly increasing"
    return sorted(records, key=lambda r: (r[0], r[1]))


def wait_for_view(read: Callable[[], list[Record]], want: list[Record], who: str) -> None:
    """Until `read()` (a consumer from offset 0) gets exactly `want`; each read must hold every
    record of `want` (compaction only removes what `want` lacks)."""
    deadline = time.monotonic() + WAIT_S
    while (got := read()) != want:
        assert set(want) <= set(got), f"{who}: records missing from the Kafka view: {sorted(set(want) - set(got))[:5]}; extra: {sorted(set(got) - set(want))[:5]}; {len(got)} read"
        assert time.monotonic() < deadline, f"{who}: the Kafka view still holds {len(got)} records ({len(want)} wanted) after {WAIT_S} s"
        time.sleep(0.5)


def test_java_produces_and_java_and_kafkajs_read_one_record_per_live_key(neve_factory, java_client, artifacts_dir):
    node = neve_factory(env=node_env(free_port()))
    data_dir = Path(node.data_dir).resolve()
    create(node.bootstrap, "kept", **{"delete.retention.ms": "3600000"})  # tombstones served for an hour
    create(node.bootstrap, "gone", **{"delete.retention.ms": "1000"})
    want = {}
    for topic in ("kept", "gone"):
        acked = java_client.produce_keyed(node.bootstrap, topic, updates_then_deletes(), log_path=artifacts_dir / "java-produce.log")
        assert len(acked) == KEYS * UPDATES + DELETED
        want[topic] = latest_per_key(acked)
        assert len(want[topic]) == KEYS and sum(v is None for *_, v in want[topic]) == DELETED

    def java(topic: str) -> Callable[[], list[Record]]:
        def read() -> list[Record]:
            rows = java_client.consume_bytes(node.bootstrap, topic, PARTITIONS, log_path=artifacts_dir / "java-consume.log")
            return increasing([(p, o, k, v) for p, o, _, _, k, v, _ in rows], "java")

        return read

    shorts: dict[str, dict[int, int]] = {}

    def kafkajs(topic: str) -> Callable[[], list[Record]]:
        def read() -> list[Record]:
            got = kafkajs_client.consume_all(node.bootstrap, topic, log_path=artifacts_dir / "kafkajs.log")
            shorts[topic] = got.short
            return increasing(got.records, "kafkajs")

        return read

    for topic in ("kept", "gone"):
        wait_for_table(data_dir, topic, want[topic])  # 180 rows, the latest values; no deleted key

    # tombstones are served while delete.retention.ms has not passed, none of their keys' earlier values
    wait_for_view(java("kept"), want["kept"], "java")
    wait_for_view(kafkajs("kept"), want["kept"], "kafkajs")
    assert shorts["kept"] == {}  # each partition's last record is a tombstone, still served

    # and once it has, no record of the deleted keys but each partition's last, which stays (as
    # Kafka's newest record does) until a later one is compacted: every consumer reaches the end
    gone = after_retention(want["gone"])
    wait_for_view(java("gone"), gone, "java")
    wait_for_view(kafkajs("gone"), gone, "kafkajs")
    assert shorts["gone"] == {}

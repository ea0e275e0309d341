"""Retention for the Kafka view: retention.ms and retention.bytes advance the log start offset by
whole index entries (broker/retention.py). The decision function over hand-built entries, then a
real node with a short check interval: ListOffsets earliest, Fetch and a consumer follow the log
start."""

from __future__ import annotations

import datetime
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, OffsetSpec, ResourceType
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic

from broker.retention import enforce_once, retention_target
from metadata.embedded import EmbeddedMetadataStore
from metadata.model import IndexEntry, ObjectType
from tests.batches import make_batch
from tests.metadata.helpers import append, commit
from tests.scenarios.records import LOG, create_topic
from tests.scenarios.test_bad_input import Raw, produce_v9

T = 30
NOW = 1_800_000_000_000
OFFSET_OUT_OF_RANGE = 1


def entry(base: int, last: int, max_ts: int, size: int = 100) -> IndexEntry:
    return IndexEntry(base, last, f"wal/{base}", ObjectType.WAL, 0, size, max_ts)


# -- the decision, over hand-built entries ----------------------------------------------------------

ENTRIES = [entry(0, 9, NOW - 5000, 100), entry(10, 14, NOW - 4000, 50), entry(15, 29, NOW - 500, 200), entry(30, 30, NOW - 9000, 10)]


@pytest.mark.parametrize(
    "retention_ms, retention_bytes, expected",
    [
        (-1, -1, None),  # no limits
        (10_000, -1, None),  # nothing old enough
        (4500, -1, 10),  # the first entry only
        (3000, -1, 15),  # up to the first entry that has not expired; the old one after it waits
        (600, -1, 15),
        (100, -1, 31),  # every entry expired: up to the high watermark
        (-1, 360, None),  # 360 bytes in all: nothing over
        (-1, 260, 10),  # hiding the first leaves 260 >= 260
        (-1, 259, 10),  # hiding the second too would leave 210 < 259
        (-1, 210, 15),
        (-1, 11, 15),  # the last entries hold 210: hiding the third would leave 10 < 11
        (-1, 10, 30),
        (-1, 0, 31),  # everything: the log start reaches the high watermark
        (4500, 210, 15),  # both limits: the furthest wins
    ],
)
def test_retention_target(retention_ms, retention_bytes, expected):
    assert retention_target(ENTRIES, NOW, retention_ms, retention_bytes) == expected


def test_retention_target_edges():
    assert retention_target([], NOW, 0, 0) is None
    all_old = [entry(0, 4, NOW - 10), entry(5, 9, NOW - 10)]
    assert retention_target(all_old, NOW, 5, -1) == 10  # every entry expired: up to the high watermark
    assert retention_target(all_old, NOW, 10, -1) is None  # exactly retention.ms old is kept (Kafka: older than)


async def test_enforce_once_over_a_store():
    """The loop over an embedded store: per partition, per topic policy, idempotent."""
    store = EmbeddedMetadataStore(None)
    await store.start()
    try:
        timed = (await store.create_topic("timed", 2, {"retention.ms": "1000"})).topic_id
        sized = (await store.create_topic("sized", 1, {"retention.bytes": "100", "retention.ms": "-1"})).topic_id
        compact = (await store.create_topic("compact", 1, {"retention.ms": "1000", "cleanup.policy": "compact"})).topic_id
        for tid in (timed, sized, compact):
            await store.commit(commit(append(tid, 0, 0, 100, 3, max_ts=NOW - 5000)))  # 0..2, old
            await store.commit(commit(append(tid, 0, 0, 100, 2, max_ts=NOW)))  # 3..4, new
        await store.commit(commit(append(timed, 1, 0, 100, 4, max_ts=NOW - 5000)))  # 0..3, old
        assert await enforce_once(store, NOW) == 3
        starts = [store.log_start_offset(t, p) for t, p in ((timed, 0), (timed, 1), (sized, 0), (compact, 0))]
        assert starts == [3, 4, 3, 0]
        assert await enforce_once(store, NOW) == 0  # nothing more to hide
    finally:
        await store.close()


# -- a real node -------------------------------------------------------------------------------------

ENV = {"NEVE_WAL_LINGER_MS": "10", "NEVE_BROKER_RETENTION_CHECK_INTERVAL_MS": "200"}


def produce_entries(raw: Raw, topic: str, timestamps: list[list[int]]) -> None:
    """One produce request (one WAL object, one index entry) per inner list, a record per timestamp."""
    n = 0
    for group in timestamps:
        records = [(b"k", f"v{n + i}".encode(), [], ts) for i, ts in enumerate(group)]
        n += len(group)
        cid = raw.request(produce_v9(topic, {0: make_batch(records)}))
        assert [p.error_code for t in raw.response(0, 9, cid).responses for p in t.partition_responses] == [0]


def set_config(client: AdminClient, topic: str, name: str, value: str) -> None:
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
    client.incremental_alter_configs([resource])[resource].result(T)


def earliest(client: AdminClient, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    return client.list_offsets({tp: OffsetSpec.earliest()}, request_timeout=T)[tp].result(T).offset


def wait_for_log_start(client: AdminClient, topic: str, timeout: float = T) -> int:
    """The earliest offset, once it has moved from 0 (polled: retention runs on its own schedule)."""
    deadline = time.monotonic() + timeout
    while (offset := earliest(client, topic)) == 0:
        assert time.monotonic() < deadline, "retention did not advance the log start in time"
        time.sleep(0.1)
    return offset


def raw_fetch(raw: Raw, topic: str, offset: int):
    request = FetchRequest(
        cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10), min_bytes=1, max_bytes=1_000_000,
        isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
        topics=(FetchTopic(topic=topic, partitions=(FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1_000_000),)),),
        forgotten_topics_data=(),
    )
    return raw.response(1, 12, raw.request(request)).responses[0].partitions[0]


def consume_from_zero(bootstrap: str, topic: str, count: int) -> list[tuple[int, bytes]]:
    """A consumer asked for offset 0 that is out of range resets to the earliest (the log start)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "auto.offset.reset": "earliest", "enable.auto.commit": False, "logger": LOG})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    try:
        deadline = time.monotonic() + T
        while len(got) < count and time.monotonic() < deadline:
            for m in consumer.consume(count - len(got), timeout=0.5):
                assert m.error() is None, m.error()
                got.append((m.offset(), m.value()))
    finally:
        consumer.close()
    return got


@pytest.mark.integration
def test_retention_ms_hides_old_entries(neve_factory):
    node = neve_factory(env=ENV)
    client = AdminClient({"bootstrap.servers": node.bootstrap, "logger": LOG})
    topic = create_topic(node.bootstrap, 1, prefix="ret-ms")
    now = int(time.time() * 1000)
    old = now - 3_600_000
    raw = Raw(node.port)
    try:
        # entries: [0..2] old, [3..4] old, [5..6] new, [7..8] old (kept: it follows a new one)
        produce_entries(raw, topic, [[old, old + 1, old + 2], [old + 3, old + 4], [now, now + 1], [old, old]])
        assert earliest(client, topic) == 0  # the default retention (7 days) keeps hour-old records
        set_config(client, topic, "retention.ms", "600000")
        assert wait_for_log_start(client, topic) == 5
        tp = TopicPartition(topic, 0)
        by_time = client.list_offsets({tp: OffsetSpec.for_timestamp(old)}, request_timeout=T)[tp].result(T)
        assert (by_time.offset, by_time.timestamp) == (5, now)  # hidden records are not found by time either

        below = raw_fetch(raw, topic, 4)
        assert (below.error_code, below.log_start_offset, below.high_watermark, below.records) == (OFFSET_OUT_OF_RANGE, 5, 9, b"")
        at = raw_fetch(raw, topic, 5)
        assert (at.error_code, at.log_start_offset) == (0, 5) and len(at.records) > 0
    finally:
        raw.close()
    assert consume_from_zero(node.bootstrap, topic, 4) == [(5, b"v5"), (6, b"v6"), (7, b"v7"), (8, b"v8")]


@pytest.mark.integration
def test_retention_bytes_keeps_whole_entries_from_the_end(neve_factory):
    node = neve_factory(env=ENV)
    client = AdminClient({"bootstrap.servers": node.bootstrap, "logger": LOG})
    topic = create_topic(node.bootstrap, 1, prefix="ret-bytes")
    now = int(time.time() * 1000)
    groups = [[now, now + 1] for _ in range(4)]  # four entries of two records, equal sizes
    size = len(make_batch([(b"k", b"v0", [], now), (b"k", b"v1", [], now + 1)]))
    raw = Raw(node.port)
    try:
        produce_entries(raw, topic, groups)
    finally:
        raw.close()
    set_config(client, topic, "retention.bytes", str(2 * size + 1))  # two entries are not enough: keep three
    assert wait_for_log_start(client, topic) == 2
    assert consume_from_zero(node.bootstrap, topic, 6) == [(i, f"v{i}".encode()) for i in range(2, 8)]


@pytest.mark.integration
def test_compact_only_topics_keep_everything(neve_factory):
    """cleanup.policy=compact: no retention (as in Kafka), even with retention.ms set. A witness
    topic with the delete policy shows when retention has run: its second advance happens in a later
    pass than its first, so by then one whole pass has seen the compact topic's new configs."""
    node = neve_factory(env=ENV)
    client = AdminClient({"bootstrap.servers": node.bootstrap, "logger": LOG})
    compacted = create_topic(node.bootstrap, 1, prefix="ret-compact")
    witness = create_topic(node.bootstrap, 1, prefix="ret-witness")
    old = int(time.time() * 1000) - 3_600_000
    raw = Raw(node.port)
    try:
        for topic in (compacted, witness):
            produce_entries(raw, topic, [[old], [old]])
        both = [ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET), ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)]
        resource = ConfigResource(ResourceType.TOPIC, compacted, incremental_configs=both)
        client.incremental_alter_configs([resource])[resource].result(T)
        set_config(client, witness, "retention.ms", "1000")
        assert wait_for_log_start(client, witness) == 2
        produce_entries(raw, witness, [[old]])
    finally:
        raw.close()
    deadline = time.monotonic() + T
    while earliest(client, witness) != 3:
        assert time.monotonic() < deadline, "retention did not run again"
        time.sleep(0.1)
    assert earliest(client, compacted) == 0


@pytest.mark.integration
def test_retention_in_a_cluster(cluster_factory):
    """Two brokers over etcd: the config is altered through one broker, every broker runs retention,
    and both answer the same log start (each client names a zone, so it talks to its zone's broker)."""
    cluster = cluster_factory(zones=("a", "b"), env={"NEVE_BROKER_RETENTION_CHECK_INTERVAL_MS": "200"})
    first, second = cluster.nodes
    topic = create_topic(first.bootstrap, 1, prefix="ret-cluster")
    now = int(time.time() * 1000)
    old = now - 3_600_000
    raw = Raw(first.port)
    try:
        produce_entries(raw, topic, [[old, old], [old], [now, now]])
    finally:
        raw.close()
    set_config(AdminClient({"bootstrap.servers": second.bootstrap, "logger": LOG}), topic, "retention.ms", "600000")
    for zone in ("a", "b"):
        client = AdminClient({"bootstrap.servers": cluster.bootstrap, "client.id": f"zone_id={zone}", "logger": LOG})
        assert wait_for_log_start(client, topic) == 3

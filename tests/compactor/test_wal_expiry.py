"""A topic without a table lets go of what retention hid (compactor/maintenance/wal_expiry.py): its entries
below the log start become one EXPIRED entry per partition, on every backend; the objects they
alone named are no longer referenced (the sweeper collects them), an object another partition
still names stays, and a wal-index record in etcd goes once no partition refers to it."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from compactor.maintenance.wal_expiry import expire_topic, expired_runs
from metadata.embedded import EmbeddedMetadataStore
from metadata.model import IndexEntry, ObjectType
from tests.metadata.helpers import append, commit, open_etcd_store

WAL, PARQUET, EXPIRED = ObjectType.WAL, ObjectType.PARQUET, ObjectType.EXPIRED


def e(base: int, last: int, kind=WAL, key: str = "wal/x") -> IndexEntry:
    return IndexEntry(base, last, "" if kind == EXPIRED else key, kind, 0, 1, 5)


def test_runs_are_the_whole_entries_below_the_log_start():
    entries = [e(0, 4, EXPIRED), e(5, 9), e(10, 14), e(15, 19)]
    assert expired_runs(entries, 12) == [[e(0, 4, EXPIRED), e(5, 9)]]  # 10-14 holds the log start: kept
    assert expired_runs(entries, 15) == [entries[:3]]
    assert expired_runs(entries[:1], 10) == []  # already one EXPIRED entry: nothing to do
    assert expired_runs([e(0, 4), e(5, 9, PARQUET, "table/f"), e(10, 14)], 20) == [[e(0, 4)], [e(10, 14)]]
    assert expired_runs([e(0, 4)], 4) == []


async def until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _scenario(store, follower=None):
    """Partitions 0 and 1 of a topic share objects wal/a and wal/b; wal/c holds partition 0 only.
    The log start of partition 0 moves past wal/a's and wal/c's records, then past wal/b's."""
    info = await store.create_topic(f"t-{uuid.uuid4().hex[:6]}", 2)
    t = info.topic_id
    await store.commit(commit(append(t, 0, 0, 10, 3), append(t, 1, 10, 10, 2), key="wal/a"))
    await store.commit(commit(append(t, 0, 0, 10, 4), key="wal/c"))
    await store.commit(commit(append(t, 0, 0, 10, 5), append(t, 1, 10, 10, 2), key="wal/b"))
    assert [(x.base_offset, x.last_offset, x.object_key) for x in store.entries(t, 0, 0)] == [(0, 2, "wal/a"), (3, 6, "wal/c"), (7, 11, "wal/b")]

    assert await expire_topic(store, info) == 0  # log start 0: nothing hidden
    await store.advance_log_start(t, 0, 8)  # wal/b's entry holds offset 8: it stays
    assert await expire_topic(store, info) == 2
    assert [(x.base_offset, x.last_offset, x.object_key, x.object_type) for x in store.entries(t, 0, 0)] == [(0, 6, "", EXPIRED), (7, 11, "wal/b", WAL)]
    # wal/c is named by nothing now; wal/a still by partition 1
    assert store.referenced_objects() >= {"wal/a", "wal/b"} and "wal/c" not in store.referenced_objects() and "" not in store.referenced_objects()
    assert await expire_topic(store, info) == 0  # done once

    await store.advance_log_start(t, 0, 12)
    await store.advance_log_start(t, 1, 4)
    assert await expire_topic(store, info) == 3
    assert [(x.base_offset, x.last_offset, x.object_type) for x in store.entries(t, 0, 0)] == [(0, 11, EXPIRED)]
    assert [(x.base_offset, x.last_offset, x.object_type) for x in store.entries(t, 1, 0)] == [(0, 3, EXPIRED)]
    assert not {"wal/a", "wal/b", "wal/c"} & store.referenced_objects()
    # reads from the log start on are untouched: the high watermark, nothing else
    assert store.entries(t, 0, 12) == [] and store.high_watermark(t, 0) == 12
    assert store.entry_for_timestamp(t, 0, 0) is None
    if follower is not None:
        await until(lambda: [(x.base_offset, x.last_offset, x.object_type) for x in follower.entries(t, 0, 0)] == [(0, 11, EXPIRED)], "the other broker to see the expiry")
        assert not {"wal/a", "wal/b", "wal/c"} & follower.referenced_objects()
    return t


@pytest.mark.parametrize("durable", [False, True])
async def test_embedded_store(tmp_path, durable):
    path = str(tmp_path / "meta.db") if durable else None
    store = EmbeddedMetadataStore(path)
    await store.start()
    try:
        t = await _scenario(store)
    finally:
        await store.close()
    if durable:
        again = EmbeddedMetadataStore(path)
        await again.start()
        try:
            assert [(x.base_offset, x.last_offset, x.object_type) for x in again.entries(t, 0, 0)] == [(0, 11, EXPIRED)]
        finally:
            await again.close()


@pytest.mark.integration
async def test_etcd_store_and_its_wal_index_records(etcd_server):
    store = await open_etcd_store(etcd_server, "wal-expiry")
    other = await open_etcd_store(etcd_server, "wal-expiry")
    try:
        t = await _scenario(store, follower=other)

        async def records() -> list[bytes]:
            return [kv.key for kv in await store._client.get_prefix(store.keys.prefix("wal-index/"))]

        # every wal-index record went with its last entry
        assert await records() == []
        fresh = await open_etcd_store(etcd_server, "wal-expiry")
        try:
            assert [(x.base_offset, x.last_offset, x.object_type) for x in fresh.entries(t, 0, 0)] == [(0, 11, EXPIRED)]
            assert [(x.base_offset, x.last_offset, x.object_type) for x in fresh.entries(t, 1, 0)] == [(0, 3, EXPIRED)]
        finally:
            await fresh.close()
    finally:
        await other.close()
        await store.close()


@pytest.mark.integration
def test_a_table_less_topic_s_deleted_records_free_their_wal_objects(neve_factory):
    """In `neve dev` (the compactor in the node, a sweeper every second): DeleteRecords on a topic
    with `neve.iceberg.enabled=false` deletes the WAL objects of the records it hid; the records
    produced after are read from the new log start, every one."""
    from pathlib import Path

    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.compactor.test_service import consume_all, node_env
    from tests.fixtures import free_port
    from tests.table.test_wal_collected import GC_ENV, produce, wait_until, wal_files

    node = neve_factory(env=node_env(free_port(), **GC_ENV))
    data_dir = Path(node.data_dir).resolve()
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    topic = f"plain-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 2, 1, config={"neve.iceberg.enabled": "false"})])[topic].result(60)
    produce(node.bootstrap, topic, 200)
    hidden = wal_files(data_dir)
    assert hidden
    for future in admin.delete_records([TopicPartition(topic, p, -1) for p in range(2)], request_timeout=60).values():
        future.result(60)
    wait_until("the hidden records' WAL objects deleted", lambda: not hidden & wal_files(data_dir))

    kept = produce(node.bootstrap, topic, 60)
    assert sorted(kept) == [(p, 100 + i) for p in range(2) for i in range(30)]
    consumed = consume_all(node.bootstrap, topic, {0: 30, 1: 30})  # from offset 0: reset to the log start, 100
    assert sorted(consumed) == sorted(kept)

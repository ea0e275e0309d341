"""Contract: committed offsets, group state, topic updates and the log start offset, on every
backend (fixtures from conftest.py: `store` per backend, `open_store` for durable ones)."""

from __future__ import annotations

import pytest

from metadata.model import CommittedOffset
from metadata.store import InvalidPartitions, UnknownTopic

from .helpers import append, commit


async def test_committed_offsets_round_trip_and_delete(store):
    t = (await store.create_topic("orders", 3)).topic_id
    await store.commit_offsets("g1", {(t, 0): CommittedOffset(5, 0, "m", 1000), (t, 1): CommittedOffset(7)})
    await store.commit_offsets("g1", {(t, 0): CommittedOffset(9, 1, None, 2000)})
    await store.commit_offsets("g/with slash", {(t, 2): CommittedOffset(1)})
    assert await store.fetch_offsets("g1") == {(t, 0): CommittedOffset(9, 1, None, 2000), (t, 1): CommittedOffset(7)}
    assert await store.fetch_offsets("g/with slash") == {(t, 2): CommittedOffset(1)}
    assert await store.fetch_offsets("nobody") == {}
    await store.delete_offsets("g1", [(t, 1)])
    assert await store.fetch_offsets("g1") == {(t, 0): CommittedOffset(9, 1, None, 2000)}
    assert await store.list_groups() == ["g/with slash", "g1"]
    await store.delete_offsets("g1")
    assert await store.fetch_offsets("g1") == {}
    assert await store.list_groups() == ["g/with slash"]


async def test_many_partitions_commit_in_one_call(store):
    t = (await store.create_topic("wide", 300)).topic_id
    offsets = {(t, p): CommittedOffset(p * 10) for p in range(300)}
    await store.commit_offsets("wide-group", offsets)
    assert await store.fetch_offsets("wide-group") == offsets


async def test_offsets_committed_only_while_a_registry_key_is_unchanged(store):
    """A transaction's offsets are written only while its stored state is the decision they
    belong to (the transaction coordinator's `_complete`): the compare and the write are one
    step, in one call and in one spanning several etcd transactions."""
    t = (await store.create_topic("cond", 300)).topic_id
    assert await store.registry_write({"transactions/x": b"prepared"}, {})
    revision = (await store.registry_get("transactions/x")).revision
    assert await store.commit_offsets("g", {(t, 0): CommittedOffset(41)}, if_unchanged={"transactions/x": revision})
    assert await store.registry_write({"transactions/x": b"complete"}, {"transactions/x": revision})
    assert not await store.commit_offsets("g", {(t, 0): CommittedOffset(12)}, if_unchanged={"transactions/x": revision})
    wide = {(t, p): CommittedOffset(p) for p in range(300)}
    assert not await store.commit_offsets("g", wide, if_unchanged={"transactions/x": revision})
    assert await store.fetch_offsets("g") == {(t, 0): CommittedOffset(41)}
    now = (await store.registry_get("transactions/x")).revision
    assert await store.commit_offsets("g", wide, if_unchanged={"transactions/x": now})
    assert await store.fetch_offsets("g") == wide


async def test_group_state_blob(store):
    assert await store.load_group("g") is None
    await store.save_group("g", b"\x00generation 1")
    await store.save_group("g", b"\x00generation 2")
    assert await store.load_group("g") == b"\x00generation 2"
    assert await store.list_groups() == ["g"]
    await store.save_group("g", None)
    assert await store.load_group("g") is None and await store.list_groups() == []


async def test_update_topic_grows_partitions_and_merges_configs(store):
    info = await store.create_topic("t", 2, {"retention.ms": "1000", "cleanup.policy": "delete"})
    updated = await store.update_topic("t", partitions=4, configs={"retention.ms": "5000", "cleanup.policy": None, "max.message.bytes": "10"})
    assert updated.topic_id == info.topic_id and updated.partitions == 4
    assert updated.configs == {"retention.ms": "5000", "max.message.bytes": "10"}
    assert store.topics()["t"] == updated
    results = await store.commit(commit(append(info.topic_id, 3, 0, 10, 2)))
    assert [r.base_offset for r in results] == [0]
    with pytest.raises(InvalidPartitions):
        await store.update_topic("t", partitions=3)
    with pytest.raises(UnknownTopic):
        await store.update_topic("missing", configs={"a": "b"})


async def test_log_start_advances_forward_only_and_within_the_log(store):
    t = (await store.create_topic("t", 1)).topic_id
    await store.commit(commit(append(t, 0, 0, 10, 10)))
    assert await store.advance_log_start(t, 0, 4) == 4
    assert store.log_start_offset(t, 0) == 4
    assert await store.advance_log_start(t, 0, 2) == 4  # never backward
    assert await store.advance_log_start(t, 0, 99) == 10  # clamped to the high watermark
    results = await store.commit(commit(append(t, 0, 0, 10, 1)))
    assert (results[0].base_offset, results[0].log_start_offset) == (10, 10)
    assert store.high_watermark(t, 0) == 11


async def test_groups_offsets_and_log_start_survive_a_restart(open_store):
    store = await open_store()
    t = (await store.create_topic("t", 2)).topic_id
    await store.commit(commit(append(t, 0, 0, 10, 10)))
    await store.advance_log_start(t, 0, 6)
    await store.update_topic("t", partitions=3, configs={"retention.ms": "1"})
    await store.commit_offsets("g", {(t, 0): CommittedOffset(8, 0, "x", 5)})
    await store.save_group("g", b"state")
    await store.close()
    store = await open_store()
    assert store.log_start_offset(t, 0) == 6 and store.topics()["t"].partitions == 3
    assert store.topics()["t"].configs == {"retention.ms": "1"}
    assert await store.fetch_offsets("g") == {(t, 0): CommittedOffset(8, 0, "x", 5)}
    assert await store.load_group("g") == b"state"

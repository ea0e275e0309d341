"""The orphan sweeper deletes only old objects that no index entry names and that the metadata
store fenced off as uncommitted."""

from __future__ import annotations

import time

from wal.store import MemoryObjectStore
from wal.sweeper import sweep_once


async def aged(store: MemoryObjectStore, keys: list[str], young: list[str]) -> float:
    """Put `keys` and `young`; every one but the young is backdated an hour. Returns now."""
    for key in keys + young:
        await store.put(key, b"x")
    now = time.time()
    for key in keys:
        data, _ = store._objects[key]
        store._objects[key] = (data, now - 3600)
    return now


async def test_only_old_unreferenced_fenced_objects_are_deleted():
    store = MemoryObjectStore()
    now = await aged(store, ["wal/orphan", "wal/committed", "wal/committed-meanwhile", "other/not-wal"], young=["wal/young-orphan"])
    fenced = []

    async def fence(keys):
        fenced.append(sorted(keys))
        return {k for k in keys if k != "wal/committed-meanwhile"}  # its commit landed before the fence

    deleted = await sweep_once(store, lambda: {"wal/committed"}, fence, grace_s=600, now=now)
    assert deleted == ["wal/orphan"]
    assert fenced == [["wal/committed-meanwhile", "wal/orphan"]]  # only old, unreferenced objects are fenced
    assert sorted([o.key async for o in store.list()]) == ["other/not-wal", "wal/committed", "wal/committed-meanwhile", "wal/young-orphan"]


async def test_references_are_read_after_listing_and_nothing_referenced_is_fenced():
    store = MemoryObjectStore()
    await store.put("wal/a", b"x")
    calls = []

    def referenced():
        calls.append("refs")
        return {"wal/a"}

    async def fence(keys):
        calls.append(("fence", sorted(keys)))
        return set(keys)

    assert await sweep_once(store, referenced, fence, grace_s=0, now=time.time() + 1) == []
    assert calls == ["refs"]


async def test_references_may_be_awaited_and_what_they_name_is_kept():
    store = MemoryObjectStore()
    now = await aged(store, ["wal/compacted", "wal/orphan"], young=[])

    async def referenced():  # e.g. the WAL objects of the cycle manifests compacted entries name
        return {"wal/compacted"}

    async def fence(keys):
        return set(keys)

    assert await sweep_once(store, referenced, fence, grace_s=600, now=now) == ["wal/orphan"]
    assert [o.key async for o in store.list()] == ["wal/compacted"]

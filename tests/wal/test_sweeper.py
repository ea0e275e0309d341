"""The orphan sweeper deletes only old, unreferenced WAL objects."""

from __future__ import annotations

import time

from wal.store import MemoryObjectStore
from wal.sweeper import sweep_once


async def test_only_old_unreferenced_objects_are_deleted():
    store = MemoryObjectStore()
    for key in ("wal/orphan", "wal/committed", "wal/young-orphan", "other/not-wal"):
        await store.put(key, b"x")
    now = time.time()
    # pretend everything but the young orphan was written an hour ago
    for key in ("wal/orphan", "wal/committed", "other/not-wal"):
        data, _ = store._objects[key]
        store._objects[key] = (data, now - 3600)
    deleted = await sweep_once(store, lambda: {"wal/committed"}, grace_s=600, now=now)
    assert deleted == ["wal/orphan"]
    assert sorted([o.key async for o in store.list()]) == ["other/not-wal", "wal/committed", "wal/young-orphan"]


async def test_references_are_read_after_listing():
    store = MemoryObjectStore()
    await store.put("wal/a", b"x")
    calls = []

    def referenced():
        calls.append("refs")
        return {"wal/a"}

    assert await sweep_once(store, referenced, grace_s=0, now=time.time() + 1) == []
    assert calls == ["refs"]

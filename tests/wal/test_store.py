"""The object-store contract, written once and run against every local backend."""

from __future__ import annotations

import os

import pytest

from wal.store import FileObjectStore, MemoryObjectStore, NullObjectStore, ObjectExists, ObjectNotFound, ObjectStore, load_object_store


@pytest.fixture(params=["memory", "file"])
async def store(request, tmp_path):
    backend: ObjectStore = MemoryObjectStore() if request.param == "memory" else FileObjectStore(str(tmp_path / "objects"))
    yield backend
    await backend.close()


async def listing(store: ObjectStore, prefix: str = "") -> list[tuple[str, int]]:
    return [(info.key, info.size) async for info in store.list(prefix)]


async def test_put_then_get_whole_object(store):
    await store.put("wal/0001", b"hello, object")
    assert await store.get("wal/0001") == b"hello, object"


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [(0, None, b"0123456789"), (3, None, b"3456789"), (0, 4, b"0123"), (2, 5, b"234"), (9, 10, b"9"), (4, 4, b""), (8, 100, b"89"), (10, None, b""), (12, 20, b"")],
)
async def test_get_byte_ranges(store, start, end, expected):
    await store.put("ranges", b"0123456789")
    assert await store.get("ranges", start, end) == expected


async def test_empty_objects_are_objects(store):
    await store.put("empty", b"")
    assert await store.get("empty") == b""
    assert await listing(store) == [("empty", 0)]


async def test_get_missing_raises_not_found(store):
    with pytest.raises(ObjectNotFound):
        await store.get("nope")
    with pytest.raises(ObjectNotFound):
        await store.get("nope", 2, 5)


async def test_put_never_overwrites(store):
    await store.put("once", b"first")
    with pytest.raises(ObjectExists):
        await store.put("once", b"second")
    assert await store.get("once") == b"first"
    assert await listing(store) == [("once", 5)]


async def test_put_parts_stores_the_parts_joined_and_never_overwrites(store):
    parts = [b"head", os.urandom(70_000), b"", memoryview(b"xxtail")[2:], bytearray(b"!")]
    await store.put_parts("wal/parts", parts)
    joined = b"".join(bytes(p) for p in parts)
    assert await store.get("wal/parts") == joined
    assert await store.get("wal/parts", 2, 10) == joined[2:10]
    with pytest.raises(ObjectExists):
        await store.put_parts("wal/parts", [b"other"])
    with pytest.raises(ObjectExists):
        await store.put("wal/parts", b"other")
    assert await listing(store) == [("wal/parts", len(joined))]


async def test_put_accepts_any_bytes_like(store):
    await store.put("view", memoryview(b"xxpayload")[2:])
    await store.put("array", bytearray(b"abc"))
    assert (await store.get("view"), await store.get("array")) == (b"payload", b"abc")


async def test_delete_removes_and_tolerates_missing_keys(store):
    await store.put("a/1", b"x")
    await store.delete("a/1")
    with pytest.raises(ObjectNotFound):
        await store.get("a/1")
    await store.delete("a/1")
    await store.delete("never/existed")
    assert await listing(store) == []
    await store.put("a/1", b"again")  # a deleted key can be used again
    assert await store.get("a/1") == b"again"


async def test_list_is_in_key_order_with_sizes(store):
    for key, data in [("wal/b", b"22"), ("wal/a/2", b"4444"), ("index", b"1"), ("wal/a/1", b"333"), ("wal/c", b"")]:
        await store.put(key, data)
    assert await listing(store) == [("index", 1), ("wal/a/1", 3), ("wal/a/2", 4), ("wal/b", 2), ("wal/c", 0)]
    infos = [info async for info in store.list()]
    assert all(isinstance(info.modified, float) for info in infos)


async def test_list_filters_by_prefix(store):
    for key in ["wal/0001", "wal/0002", "walrus", "meta/wal/x", "wal2/1"]:
        await store.put(key, b"x")
    assert await listing(store, "wal/") == [("wal/0001", 1), ("wal/0002", 1)]
    assert await listing(store, "wal") == [("wal/0001", 1), ("wal/0002", 1), ("wal2/1", 1), ("walrus", 1)]
    assert await listing(store, "wal/0002") == [("wal/0002", 1)]
    assert await listing(store, "none") == []


# --- FileObjectStore specifics ---------------------------------------------------------------


async def test_file_store_never_overwrites_across_instances(tmp_path):
    root = str(tmp_path / "shared")
    first, second = FileObjectStore(root), FileObjectStore(root)
    try:
        await first.put("wal/obj", b"original")
        with pytest.raises(ObjectExists):
            await second.put("wal/obj", b"replacement")
        assert await second.get("wal/obj") == b"original"
        assert sorted(os.listdir(os.path.join(root, "wal"))) == ["obj"]  # no temporary file left
    finally:
        await first.close()
        await second.close()


async def test_file_store_keeps_objects_across_restarts(tmp_path):
    root = str(tmp_path / "durable")
    before = FileObjectStore(root)
    await before.put("a/b/c", b"kept")
    await before.close()
    after = FileObjectStore(root)
    try:
        assert await after.get("a/b/c", 1) == b"ept"
        assert await listing(after) == [("a/b/c", 4)]
    finally:
        await after.close()


@pytest.mark.parametrize("key", ["/etc/passwd", "../outside", "a/../../outside"])
async def test_file_store_refuses_keys_outside_its_root(tmp_path, key):
    store = FileObjectStore(str(tmp_path / "root"))
    try:
        with pytest.raises(ValueError, match="bad object key"):
            await store.put(key, b"x")
    finally:
        await store.close()
    assert not (tmp_path / "outside").exists()


async def test_null_store_acknowledges_puts_and_keeps_nothing():
    store = load_object_store("null://")
    assert isinstance(store, NullObjectStore)
    payload = os.urandom(4096)
    await store.put("wal/0001", payload)
    await store.put("wal/0001", payload)  # nothing is kept, so nothing can be overwritten
    await store.put("view", memoryview(payload)[10:])
    await store.put_parts("wal/0001", [payload, payload])
    with pytest.raises(ObjectNotFound):
        await store.get("wal/0001")
    with pytest.raises(ObjectNotFound):
        await store.get("wal/0001", 0, 10)
    await store.delete("wal/0001")
    assert await listing(store) == []
    await store.close()

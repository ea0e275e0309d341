"""The object-store contract, written once and run against every local backend."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import stat
import threading

import pytest

from wal.store import FileObjectStore, MemoryObjectStore, NullObjectStore, ObjectExists, ObjectNotFound, ObjectStore, ObjectStoreError, load_object_store


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


# --- FileObjectStore: concurrent puts of one key (a PUT and its hedge) and durability ---------


def is_temporary(name: str) -> bool:
    return ".tmp-" in name


def record_fsyncs(monkeypatch) -> list[tuple[int, int, bool]]:
    """Every fsync from now on, as (device, inode, is a directory)."""
    seen: list[tuple[int, int, bool]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        seen.append((st.st_dev, st.st_ino, stat.S_ISDIR(st.st_mode)))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def identity(path) -> tuple[int, int, bool]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, True)


async def test_file_store_a_put_and_its_hedge_of_the_same_parts_share_no_temporary_file(tmp_path, monkeypatch):
    # The writer's hedge passes the very same parts to a second put while the first is still
    # writing: the first is held after writing its temporary file until the hedge has finished.
    store = FileObjectStore(str(tmp_path / "objects"))
    parts = [b"header", os.urandom(100_000), b"footer"]
    written, release = threading.Event(), threading.Event()
    real = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode) and not written.is_set():
            written.set()
            release.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    first = asyncio.ensure_future(store.put_parts("wal/obj", parts))
    try:
        while not written.is_set():
            await asyncio.sleep(0.005)
        assert await listing(store) == []  # an upload in progress is not an object
        await store.put_parts("wal/obj", parts)  # the hedge
        assert await listing(store) == [("wal/obj", 100_012)]
    finally:
        release.set()
        with pytest.raises(ObjectExists):
            await first
        await store.close()
    assert (tmp_path / "objects" / "wal" / "obj").read_bytes() == b"".join(parts)
    assert os.listdir(tmp_path / "objects" / "wal") == ["obj"]


async def test_file_store_concurrent_puts_of_one_key_store_exactly_one_of_them_whole(tmp_path):
    store = FileObjectStore(str(tmp_path / "objects"))
    try:
        for round_ in range(40):
            key = f"wal/{round_:04}"
            mine, theirs = [os.urandom(64), os.urandom(300_000)], [os.urandom(300_000), os.urandom(64)]
            outcomes = await asyncio.gather(
                store.put_parts(key, mine), store.put_parts(key, mine), store.put_parts(key, theirs), store.put(key, b"".join(theirs)), return_exceptions=True
            )
            assert [o for o in outcomes if not isinstance(o, ObjectExists)] == [None], outcomes
            winner = mine if outcomes.index(None) < 2 else theirs
            assert await store.get(key) == b"".join(winner)
        names = os.listdir(tmp_path / "objects" / "wal")
        assert len(names) == 40 and not [n for n in names if is_temporary(n)]
    finally:
        await store.close()


async def test_file_store_removes_the_temporary_file_of_a_failed_put_and_a_retry_succeeds(tmp_path, monkeypatch):
    store = FileObjectStore(str(tmp_path / "objects"))
    parts = [b"payload"]
    real, failed = os.fsync, []

    def fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode) and not failed:
            failed.append(fd)
            raise OSError(errno.EIO, "injected write-back failure")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    try:
        with pytest.raises(ObjectStoreError, match="injected"):
            await store.put_parts("wal/obj", parts)
        assert os.listdir(tmp_path / "objects" / "wal") == []
        await store.put_parts("wal/obj", parts)  # the writer retries with the same parts
        assert await store.get("wal/obj") == b"payload"
        assert os.listdir(tmp_path / "objects" / "wal") == ["obj"]
    finally:
        await store.close()


async def test_file_store_makes_every_directory_it_creates_durable_in_its_parent(tmp_path, monkeypatch):
    root = tmp_path / "objects"
    store = FileObjectStore(str(root))
    fsyncs = record_fsyncs(monkeypatch)
    try:
        await store.put("wal/a/b/obj", b"x")
        directories = {f for f in fsyncs if f[2]}
        # wal/a/b holds the new name; wal/a, wal and the root hold new directories; and the
        # root was itself created by the store, so its parent's entry for it is synced too.
        for parent in [root / "wal" / "a" / "b", root / "wal" / "a", root / "wal", root, tmp_path]:
            assert identity(parent) in directories, parent
        fsyncs.clear()
        await store.put("wal/a/b/next", b"y")  # a known directory costs one fsync, not a chain
        assert [f for f in fsyncs if f[2]] == [identity(root / "wal" / "a" / "b")]
    finally:
        await store.close()


async def test_file_store_object_exists_means_the_existing_object_is_durable(tmp_path, monkeypatch):
    # A hedge (or a retry) that finds the object in place reports it stored, and the writer then
    # commits it: the name it found must be durable even if the PUT that linked it has not yet
    # synced the directory.
    root = tmp_path / "objects"
    store = FileObjectStore(str(root))
    try:
        await store.put("wal/obj", b"first")
        fsyncs = record_fsyncs(monkeypatch)
        with pytest.raises(ObjectExists):
            await store.put("wal/obj", b"first")
        assert identity(root / "wal") in fsyncs
    finally:
        await store.close()


async def test_file_store_recreates_and_syncs_directories_removed_under_it(tmp_path, monkeypatch):
    root = tmp_path / "objects"
    store = FileObjectStore(str(root))
    try:
        await store.put("wal/first", b"1")
        shutil.rmtree(root / "wal")  # a cleared root (benchmarks do this between runs)
        fsyncs = record_fsyncs(monkeypatch)
        await store.put("wal/second", b"2")
        assert identity(root) in fsyncs  # the new wal/ is a new entry in the root again
        assert await listing(store) == [("wal/second", 1)]
    finally:
        await store.close()

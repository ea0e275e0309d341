"""The object-store interface every WAL writer and reader uses, and the factory that picks a backend
by URL scheme (`memory://`, `file:///path`, `s3://bucket/prefix`, and `null://` for benchmarks).

Objects are immutable: `put` never overwrites (a second put of the same key fails), so a name is a
promise about its bytes. Every backend keeps blocking work off the event loop.
"""

from __future__ import annotations

import abc
import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlparse


class ObjectStoreError(Exception):
    """The object store failed; the operation may succeed if retried."""


class ObjectExists(ObjectStoreError):
    """A put named a key that already exists (objects are never overwritten)."""


class ObjectNotFound(ObjectStoreError):
    """A get or delete named a key that does not exist."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    modified: float  # seconds since the epoch


class ObjectStore(abc.ABC):
    """Immutable named byte strings. Keys are '/'-separated relative paths."""

    @abc.abstractmethod
    async def put(self, key: str, data: bytes) -> None:
        """Store `data` durably under a new `key`; raise ObjectExists if the key is taken."""

    async def put_parts(self, key: str, parts: Sequence[bytes]) -> None:
        """`put` of the object whose bytes are `parts` joined. Backends that can send or write the
        parts as they are override this, so a WAL object is never joined into one more copy."""
        await self.put(key, b"".join(parts))

    @abc.abstractmethod
    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of the object (`end=None`: to the end)."""

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Remove the object; deleting a missing key is not an error."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Objects whose key starts with `prefix`, in key order."""

    async def size(self, key: str) -> int:
        """The object's size in bytes; raises ObjectNotFound. (A listing of the key's prefix here;
        backends with a cheaper request override it.)"""
        async for info in self.list(key):
            if info.key == key:
                return info.size
        raise ObjectNotFound(key)

    async def probe(self) -> None:  # noqa: B027 - optional hook
        """Check at start-up that the store can be used; raises ObjectStoreError saying why.
        Local stores have nothing to check."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""


class MemoryObjectStore(ObjectStore):
    """For unit tests: a dict, with the same semantics as the durable backends."""

    def __init__(self) -> None:
        self._objects: dict[str, tuple[bytes, float]] = {}

    async def put(self, key: str, data: bytes) -> None:
        if key in self._objects:
            raise ObjectExists(key)
        self._objects[key] = (bytes(data), time.time())

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        try:
            data = self._objects[key][0]
        except KeyError:
            raise ObjectNotFound(key) from None
        return data[start:end]

    async def delete(self, key: str) -> None:
        self._objects.pop(key, None)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        for key in sorted(self._objects):
            if key.startswith(prefix):
                data, modified = self._objects[key]
                yield ObjectInfo(key, len(data), modified)


class FileObjectStore(ObjectStore):
    """The single-node default: one file per object under a root directory.

    A put writes a temporary file of its own, fsyncs it, links it into place (link fails if the
    name exists, which is what makes objects never-overwritten) and fsyncs the directory; every
    directory the store creates is fsynced in its parent before a name inside it is promised. So
    an acknowledged object survives a power cut. All file work runs on a small thread pool.
    """

    def __init__(self, root: str, threads: int = 8) -> None:
        self.root = os.path.abspath(root)
        # Directories whose own entry, and every entry above it, is known to be on disk. That is
        # assumed of the nearest directory that existed before the store (it is the operator's);
        # what makedirs adds for the root is synced by the first put, so that no fsync runs on
        # the caller's thread (often the event loop's).
        existing = self.root
        while not os.path.isdir(existing) and os.path.dirname(existing) != existing:
            existing = os.path.dirname(existing)
        self._already_durable = frozenset({existing})
        self._durable_dirs: set[str] = set(self._already_durable)
        os.makedirs(self.root, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="file-store")

    def _path(self, key: str) -> str:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"bad object key {key!r}")
        return os.path.join(self.root, key)

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _make_durable_directory(self, directory: str) -> None:
        """Create `directory` if needed and fsync the parent of it and of each directory above
        it, up to one known durable: a name in a directory whose own entry is not on disk is
        lost with it. Done once per directory and store, so also for directories an earlier
        process created and may have died before syncing."""
        if directory in self._durable_dirs:
            return
        os.makedirs(directory, exist_ok=True)
        chain = []
        while directory not in self._durable_dirs and os.path.dirname(directory) != directory:
            chain.append(directory)
            directory = os.path.dirname(directory)
        for new in chain:
            _fsync_directory(os.path.dirname(new))
        # Only now: a concurrent put that finds these here returns without syncing them itself.
        self._durable_dirs.update(chain)

    def _open_temporary(self, directory: str, tmp: str) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        self._make_durable_directory(directory)
        try:
            return os.open(tmp, flags, 0o644)
        except FileNotFoundError:
            # The directory went away under a running store (a cleared root): what was known
            # durable is no longer there, so learn it again.
            self._durable_dirs = set(self._already_durable)
            self._make_durable_directory(directory)
            return os.open(tmp, flags, 0o644)

    def _put_sync(self, key: str, parts: Sequence[bytes]) -> None:
        path = self._path(key)
        directory = os.path.normpath(os.path.dirname(path))
        # A temporary name per PUT, never derived from the key or the parts alone: the writer's
        # hedge puts the same key with the same parts while the first PUT may still be writing.
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        fd = self._open_temporary(directory, tmp)
        try:
            try:
                for part in parts:
                    view = memoryview(part)
                    while view:
                        view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)
                exists = False
            except FileExistsError:
                exists = True
        finally:
            os.unlink(tmp)
        # Also when the name was taken: the put that linked it may not have synced the directory
        # yet, and a caller told "exists" treats the object as stored (the writer's hedge does).
        _fsync_directory(directory)
        if exists:
            raise ObjectExists(key)

    async def size(self, key: str) -> int:
        try:
            return (await self._run(os.stat, self._path(key))).st_size
        except FileNotFoundError:
            raise ObjectNotFound(key) from None

    def _get_sync(self, key: str, start: int, end: int | None) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read() if end is None else f.read(max(0, end - start))
        except FileNotFoundError:
            raise ObjectNotFound(key) from None

    def _delete_sync(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def _list_sync(self, prefix: str) -> list[ObjectInfo]:
        found = []
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if ".tmp-" in name:
                    continue
                full = os.path.join(dirpath, name)
                key = os.path.relpath(full, self.root).replace(os.sep, "/")
                if key.startswith(prefix):
                    st = os.stat(full)
                    found.append(ObjectInfo(key, st.st_size, st.st_mtime))
        found.sort(key=lambda o: o.key)
        return found

    async def put(self, key: str, data: bytes) -> None:
        await self.put_parts(key, (data,))

    async def put_parts(self, key: str, parts: Sequence[bytes]) -> None:
        try:
            await self._run(self._put_sync, key, parts)
        except ObjectExists:
            raise
        except OSError as e:
            raise ObjectStoreError(f"put {key}: {e}") from e

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        try:
            return await self._run(self._get_sync, key, start, end)
        except ObjectNotFound:
            raise
        except OSError as e:
            raise ObjectStoreError(f"get {key}: {e}") from e

    async def delete(self, key: str) -> None:
        await self._run(self._delete_sync, key)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        for info in await self._run(self._list_sync, prefix):
            yield info

    async def close(self) -> None:
        self._pool.shutdown(wait=True)


def _fsync_directory(directory: str) -> None:
    """Make the entries of `directory` (names created, linked or unlinked in it) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class NullObjectStore(ObjectStore):
    """A sink for benchmarks: every put succeeds at once and keeps nothing, so the whole broker path
    runs while storage costs nothing (bench/ measures "the client's rate against a sink that
    acknowledges without storing" this way). Reads fail: there is nothing to read. Never use it
    for data you want back."""

    async def put(self, key: str, data: bytes) -> None:
        return None

    async def put_parts(self, key: str, parts: Sequence[bytes]) -> None:
        return None

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        raise ObjectNotFound(f"{key} (the null object store keeps nothing)")

    async def delete(self, key: str) -> None:
        return None

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        return
        yield  # an async generator that yields nothing


def load_object_store(url: str) -> ObjectStore:
    """Pick the backend from the URL scheme: memory://, file:///abs/path, s3://bucket/prefix?endpoint=...,
    null:// (a benchmark sink)."""
    parsed = urlparse(url)
    if parsed.scheme == "memory":
        return MemoryObjectStore()
    if parsed.scheme == "null":
        return NullObjectStore()
    if parsed.scheme == "file":
        return FileObjectStore(parsed.path)
    if parsed.scheme == "s3":
        from .s3 import from_url  # imported lazily: obstore is only needed for S3

        return from_url(url)
    raise ValueError(f"unsupported object store URL {url!r} (use memory://, file:///path, s3://bucket/prefix or null://)")

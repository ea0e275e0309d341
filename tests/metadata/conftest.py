"""Metadata backends for the contract suite. Each backend is a factory that opens a store on a
storage location shared by every store the same test opens, so a durable backend can be closed
and reopened; add a backend (etcd) by adding a factory here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from metadata.embedded import EmbeddedMetadataStore
from metadata.store import MetadataStore, load_metadata_store


def _etcd(tmp: Path, request) -> MetadataStore:
    # the real etcd of this worker; the test's tmp dir name is unique, so it makes a private root
    server = request.getfixturevalue("etcd_server")
    return load_metadata_store(f"{server.url}/contract-{tmp.name}")


BACKENDS: dict[str, Callable[[Path, pytest.FixtureRequest], MetadataStore]] = {
    "memory": lambda tmp, request: EmbeddedMetadataStore(None),
    "sqlite": lambda tmp, request: EmbeddedMetadataStore(str(tmp / "meta.db")),
    "etcd": _etcd,
}
DURABLE = ["sqlite", "etcd"]  # backends whose state survives close() and a new store on the same location

OpenStore = Callable[[], Awaitable[MetadataStore]]


def _opener(backend: str, tmp_path: Path, opened: list[MetadataStore], request) -> OpenStore:
    async def open_store() -> MetadataStore:
        store = BACKENDS[backend](tmp_path, request)
        await store.start()
        opened.append(store)
        return store

    return open_store


@pytest.fixture(params=list(BACKENDS))
async def store(request, tmp_path):
    opened: list[MetadataStore] = []
    yield await _opener(request.param, tmp_path, opened, request)()
    for s in opened:
        await s.close()


@pytest.fixture(params=DURABLE)
async def open_store(request, tmp_path):
    """Opens a fresh store on the same storage each call; every store is closed at teardown
    (closing twice is allowed)."""
    opened: list[MetadataStore] = []
    yield _opener(request.param, tmp_path, opened, request)
    for s in opened:
        await s.close()

"""What only the embedded store promises: all-or-nothing persistence, cancellation safety, the
SQLite file's settings, and the URL factory."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from metadata.embedded import EmbeddedMetadataStore
from metadata.model import ABORT_MARKER, AppendResult, IndexEntry, ObjectType
from metadata.store import MetadataUnavailable, load_metadata_store

from .helpers import append, commit, marker_append, txn_append


@pytest.fixture(params=["memory", "sqlite"])
async def embedded(request, tmp_path):
    store = EmbeddedMetadataStore(None if request.param == "memory" else str(tmp_path / "meta.db"))
    await store.start()
    yield store
    await store.close()


def failing_disk(*args):
    raise sqlite3.OperationalError("disk I/O error")


async def test_failed_persist_applies_nothing(embedded, monkeypatch):
    t = (await embedded.create_topic("t", 1)).topic_id
    await embedded.commit(commit(append(t, 0, 0, 10, 2, pid=1, epoch=0, seq=0), key="a"))

    monkeypatch.setattr(embedded, "_transaction", failing_disk)
    waiter = asyncio.create_task(embedded.wait_for_commit([(t, 0)], timeout=0.1))
    with pytest.raises(MetadataUnavailable) as e:
        await embedded.commit(commit(append(t, 0, 0, 10, 3, pid=1, epoch=0, seq=2), key="b"))
    assert e.value.error_code == 7
    with pytest.raises(MetadataUnavailable):
        await embedded.create_topic("u", 1)
    with pytest.raises(MetadataUnavailable):
        await embedded.init_producer_id()
    assert await waiter is False
    assert list(embedded.topics()) == ["t"]
    assert embedded.high_watermark(t, 0) == 2
    assert embedded.entries(t, 0, 0) == [IndexEntry(0, 1, "a", ObjectType.WAL, 0, 10, 0)]

    monkeypatch.undo()
    # The failed batch was not recorded: its retry is new, not a duplicate; the id counter did not move.
    assert await embedded.commit(commit(append(t, 0, 0, 10, 3, pid=1, epoch=0, seq=2), key="c")) == [AppendResult(0, 2, 0)]
    assert await embedded.init_producer_id() == (0, 0)


async def test_cancelled_caller_does_not_lose_the_commit(embedded):
    t = (await embedded.create_topic("t", 1)).topic_id
    first = asyncio.create_task(embedded.commit(commit(append(t, 0, 0, 10, 4), key="a")))
    await asyncio.sleep(0)  # let it start its write
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    # The write finished regardless, so memory and disk agree and offsets carry on after it.
    assert await embedded.commit(commit(append(t, 0, 0, 10, 1), key="b")) == [AppendResult(0, 4, 0)]
    assert [e.object_key for e in embedded.entries(t, 0, 0)] == ["a", "b"]


async def test_unstarted_store_is_unavailable():
    store = EmbeddedMetadataStore(None)
    with pytest.raises(MetadataUnavailable):
        await store.create_topic("t", 1)


async def test_unopenable_database_is_unavailable(tmp_path):
    store = EmbeddedMetadataStore(str(tmp_path / "missing-dir" / "meta.db"))
    with pytest.raises(MetadataUnavailable, match="missing-dir"):
        await store.start()
    with pytest.raises(MetadataUnavailable, match="not started"):  # nothing left running
        await store.init_producer_id()


async def test_sqlite_file_is_durable_by_configuration(tmp_path):
    path = tmp_path / "meta.db"
    store = EmbeddedMetadataStore(str(path))
    await store.start()
    await store.create_topic("t", 1)
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("SELECT name, partitions FROM topics").fetchall() == [("t", 1)]
    finally:
        db.close()
    await store.close()


def test_urls_pick_the_embedded_store(tmp_path):
    memory = load_metadata_store("memory://")
    assert isinstance(memory, EmbeddedMetadataStore) and memory.path is None
    durable = load_metadata_store(f"sqlite://{tmp_path}/meta.db")
    assert isinstance(durable, EmbeddedMetadataStore) and durable.path == f"{tmp_path}/meta.db"


async def test_a_producer_with_an_open_transaction_is_never_expired():
    """Issue 42 finding 7: a producer idle past the expiry with a transaction open here kept the
    last stable offset only in its state; expiring it let read_committed readers past the
    transaction's records. It is kept (as Kafka keeps it) until its marker, then expires."""
    now = [1_000_000.0]
    store = EmbeddedMetadataStore(None, producer_expiry_ms=60_000, clock=lambda: now[0])
    await store.start()
    try:
        t = (await store.create_topic("t", 1)).topic_id
        assert await store.commit(commit(txn_append(t, 0, 2, pid=9, seq=0), append(t, 0, 10, 10, 1, pid=7, epoch=0, seq=0))) == [AppendResult(0, 0, 0), AppendResult(0, 2, 0)]
        view = store.topic_views(t)[0]
        assert (view.last_stable_offset, view.next_offset) == (0, 3)
        now[0] += 120  # both idle past the expiry; the next commit's check expires the idle ones
        assert await store.commit(commit(append(t, 0, 0, 10, 1))) == [AppendResult(0, 3, 0)]
        assert sorted(store.producer_states(t, 0)) == [9]
        assert (view.last_stable_offset, view.next_offset) == (0, 4)
        assert await store.commit(commit(marker_append(t, 0, pid=9, kind=ABORT_MARKER))) == [AppendResult(0, 4, 0)]
        assert view.last_stable_offset == 5
        now[0] += 120
        assert await store.commit(commit(append(t, 0, 0, 10, 1))) == [AppendResult(0, 5, 0)]
        assert store.producer_states(t, 0) == {}
    finally:
        await store.close()


async def test_an_idle_producers_state_expires_and_stays_forgotten(tmp_path):
    """Kafka's producer.id.expiration.ms: a producer idle that long is forgotten (its next batch is
    taken at any sequence), in memory and in the database; one that keeps writing is kept."""
    now = [1_000_000.0]
    path = str(tmp_path / "meta.db")
    store = EmbeddedMetadataStore(path, producer_expiry_ms=60_000, clock=lambda: now[0])
    await store.start()
    t = (await store.create_topic("t", 1)).topic_id
    assert await store.commit(commit(append(t, 0, 0, 10, 2, pid=7, epoch=0, seq=0), append(t, 0, 10, 10, 1, pid=8, epoch=0, seq=0))) == [AppendResult(0, 0, 0), AppendResult(0, 2, 0)]
    now[0] += 50
    assert await store.commit(commit(append(t, 0, 0, 10, 1, pid=8, epoch=0, seq=1))) == [AppendResult(0, 3, 0)]
    assert await store.commit(commit(append(t, 0, 0, 10, 1, pid=7, epoch=0, seq=5))) == [AppendResult(45, -1, 0)]  # a gap: still known
    now[0] += 20  # 7 idle for 70 s, 8 for 20 s
    assert sorted(store.producer_states(t, 0)) == [8]
    assert await store.commit(commit(append(t, 0, 0, 10, 1, pid=7, epoch=0, seq=5))) == [AppendResult(0, 4, 0)]  # forgotten: taken
    assert await store.commit(commit(append(t, 0, 0, 10, 1, pid=8, epoch=0, seq=9))) == [AppendResult(45, -1, 0)]
    await store.close()
    reopened = EmbeddedMetadataStore(path, producer_expiry_ms=60_000, clock=lambda: now[0])
    await reopened.start()
    try:
        assert {pid: s.batches[-1].last_seq for pid, s in reopened.producer_states(t, 0).items()} == {7: 5, 8: 1}
    finally:
        await reopened.close()

"""The security family (credentials, ACL bindings): written once, read from every broker's view.
The contract runs on every backend (conftest.BACKENDS); the etcd tests below it open two stores on
one root, as two brokers do."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid

import pytest

from metadata.embedded import EmbeddedMetadataStore
from metadata.store import MAX_SECURITY_KEY_BYTES, MAX_SECURITY_VALUE_BYTES, MAX_SECURITY_WRITE_KEYS, MetadataStore, MetadataUnavailable
from tests.metadata.helpers import open_etcd_store

SEEN_WITHIN_S = 30.0  # generous: another broker sees a write within the watch's delay, well under a second


async def seen(store: MetadataStore, prefix: str, expected: dict[str, bytes]) -> None:
    """Wait until `store`'s view holds exactly `expected` under `prefix`, checking each time its
    version moves (there is no event to await for another broker's write)."""
    deadline = time.monotonic() + SEEN_WITHIN_S
    version = -1
    while True:
        if store.security_version() != version:
            version = store.security_version()
            if store.security_items(prefix) == expected:
                return
        assert time.monotonic() < deadline, f"after {SEEN_WITHIN_S} s the view holds {store.security_items(prefix)}, not {expected}"
        await asyncio.sleep(0.01)


# -- the contract, on every backend -------------------------------------------------------------


async def test_write_read_delete_by_prefix(store):
    assert store.security_items("") == {}
    await store.security_write({"scram/SCRAM-SHA-256/alice": b"a1", "scram/SCRAM-SHA-512/alice": b"a5", "acls/topic/LITERAL/orders/0": b"acl0", "acls/topic/LITERAL/orders/1": b"acl1"})
    assert store.security_items("scram/") == {"scram/SCRAM-SHA-256/alice": b"a1", "scram/SCRAM-SHA-512/alice": b"a5"}
    assert store.security_items("acls/topic/LITERAL/orders/") == {"acls/topic/LITERAL/orders/0": b"acl0", "acls/topic/LITERAL/orders/1": b"acl1"}
    assert store.security_items("scram/SCRAM-SHA-256/") == {"scram/SCRAM-SHA-256/alice": b"a1"}
    assert store.security_items("acls/group/") == {}
    assert len(store.security_items("")) == 4

    # a put replaces, None deletes (an absent key too), in one write
    await store.security_write({"scram/SCRAM-SHA-256/alice": b"a2", "acls/topic/LITERAL/orders/0": None, "acls/topic/LITERAL/absent": None})
    assert store.security_items("") == {"scram/SCRAM-SHA-256/alice": b"a2", "scram/SCRAM-SHA-512/alice": b"a5", "acls/topic/LITERAL/orders/1": b"acl1"}


async def test_keys_are_matched_by_prefix_not_pattern(store):
    """Keys hold whatever principals and resource names hold: `%`, `_`, `/`, non-ASCII."""
    items = {"acls/topic/PREFIXED/a%b": b"1", "acls/topic/PREFIXED/a_b": b"2", "acls/topic/PREFIXED/axb": b"3", "scram/SCRAM-SHA-256/zoë/x": b"4"}
    await store.security_write(items)
    assert store.security_items("acls/topic/PREFIXED/a%") == {"acls/topic/PREFIXED/a%b": b"1"}
    assert store.security_items("acls/topic/PREFIXED/a_") == {"acls/topic/PREFIXED/a_b": b"2"}
    assert store.security_items("scram/SCRAM-SHA-256/zoë/") == {"scram/SCRAM-SHA-256/zoë/x": b"4"}
    assert store.security_items("") == items


async def test_version_grows_with_every_change(store):
    versions = [store.security_version()]
    await store.security_write({"acls/a": b"1"})
    versions.append(store.security_version())
    await store.security_write({"acls/a": b"2", "acls/b": b"3"})
    versions.append(store.security_version())
    await store.security_write({"acls/a": None})
    versions.append(store.security_version())
    assert versions == sorted(set(versions)), f"not strictly growing: {versions}"
    assert store.security_items("acls/") == {"acls/b": b"3"}
    await store.security_write({})  # nothing to write: nothing changes
    assert store.security_version() == versions[-1]


async def test_bounds(store):
    largest = {"k" * MAX_SECURITY_KEY_BYTES: b"v" * MAX_SECURITY_VALUE_BYTES}
    await store.security_write(largest)
    assert store.security_items("k") == largest
    version = store.security_version()
    over = [
        {"acls/fine": b"1", "k" * (MAX_SECURITY_KEY_BYTES + 1): b"v"},
        {"acls/fine": b"1", "é" * (MAX_SECURITY_KEY_BYTES // 2 + 1): b"v"},  # the bound is in UTF-8 bytes
        {"acls/fine": b"1", "acls/big": b"v" * (MAX_SECURITY_VALUE_BYTES + 1)},
        {"acls/fine": b"1", "": b"v"},
        {"acls/fine": b"1", "acls/text": "not bytes"},
        {f"acls/{i}": b"1" for i in range(MAX_SECURITY_WRITE_KEYS + 1)},
        {f"acls/{i}": b"v" * MAX_SECURITY_VALUE_BYTES for i in range(17)},  # over a write's bytes
    ]
    for writes in over:
        with pytest.raises(ValueError):
            await store.security_write(writes)
    assert store.security_items("") == largest, "a refused write changed something"
    assert store.security_version() == version


async def test_durable_across_a_restart(open_store):
    first = await open_store()
    await first.security_write({"scram/SCRAM-SHA-256/alice": b"cred", "acls/topic/LITERAL/t/0": b"acl", "acls/gone": b"x"})
    await first.security_write({"acls/gone": None})
    await first.close()

    again = await open_store()
    assert again.security_items("") == {"scram/SCRAM-SHA-256/alice": b"cred", "acls/topic/LITERAL/t/0": b"acl"}
    assert again.security_version() > 0  # a cache built before any version is rebuilt from the loaded items


# -- atomicity --------------------------------------------------------------------------------


async def test_embedded_write_that_fails_changes_nothing(tmp_path):
    """A write the database refuses (another process holds it locked) leaves the family as it
    was, in memory and on disk: no key of it lands."""
    path = str(tmp_path / "meta.db")
    store = EmbeddedMetadataStore(path)
    await store.start()
    try:
        await store.security_write({"acls/a": b"1", "acls/b": b"1"})
        version = store.security_version()
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(MetadataUnavailable):
                await store.security_write({"acls/a": b"2", "acls/b": b"2", "acls/c": b"2"})
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert store.security_items("acls/") == {"acls/a": b"1", "acls/b": b"1"}
        assert store.security_version() == version
    finally:
        await store.close()
    reopened = EmbeddedMetadataStore(path)
    await reopened.start()
    try:
        assert reopened.security_items("acls/") == {"acls/a": b"1", "acls/b": b"1"}
    finally:
        await reopened.close()


# -- two brokers on one etcd ----------------------------------------------------------------------


@pytest.mark.integration
async def test_a_write_by_one_broker_is_seen_by_another(etcd_server):
    root = f"security-{uuid.uuid4().hex[:8]}"
    one = await open_etcd_store(etcd_server, root)
    two = await open_etcd_store(etcd_server, root)
    try:
        await one.security_write({"scram/SCRAM-SHA-256/alice": b"cred", "acls/topic/LITERAL/t/0": b"allow"})
        await seen(two, "", {"scram/SCRAM-SHA-256/alice": b"cred", "acls/topic/LITERAL/t/0": b"allow"})
        # the other way, and a delete
        await two.security_write({"acls/topic/LITERAL/t/0": None, "acls/topic/LITERAL/t/1": b"deny"})
        expected = {"scram/SCRAM-SHA-256/alice": b"cred", "acls/topic/LITERAL/t/1": b"deny"}
        assert two.security_items("") == expected  # the writer sees its own write once it returns
        await seen(one, "", expected)

        # a broker (re)started after the writes loads them with its view
        await two.close()
        await one.security_write({"scram/SCRAM-SHA-512/bob": b"bob", "scram/SCRAM-SHA-256/alice": None})
        restarted = await open_etcd_store(etcd_server, root)
        try:
            assert restarted.security_items("") == {"acls/topic/LITERAL/t/1": b"deny", "scram/SCRAM-SHA-512/bob": b"bob"}
            assert restarted.security_version() > 0
            # and follows what comes after
            await one.security_write({"acls/topic/LITERAL/t/2": b"allow"})
            await seen(restarted, "acls/", {"acls/topic/LITERAL/t/1": b"deny", "acls/topic/LITERAL/t/2": b"allow"})
        finally:
            await restarted.close()
    finally:
        await one.close()
        await two.close()


@pytest.mark.integration
async def test_another_broker_sees_a_write_whole_or_not_at_all(etcd_server):
    """One broker rewrites every key of a group at once, round after round, each once the other
    broker has seen the one before; the other, checking its view each time its version moves,
    never finds the keys of two rounds mixed."""
    root = f"security-{uuid.uuid4().hex[:8]}"
    writer = await open_etcd_store(etcd_server, root)
    reader = await open_etcd_store(etcd_server, root)
    keys = [f"acls/topic/LITERAL/t/{i:03d}" for i in range(MAX_SECURITY_WRITE_KEYS)]
    observed: list[set[bytes]] = []
    version = -1
    try:
        for r in range(20):
            await writer.security_write(dict.fromkeys(keys, str(r).encode()))
            deadline = time.monotonic() + SEEN_WITHIN_S
            while not observed or observed[-1] != {str(r).encode()}:
                if reader.security_version() != version:
                    version = reader.security_version()
                    observed.append(set(reader.security_items("acls/").values()))
                    assert len(reader.security_items("acls/")) in (0, len(keys)), "a key of the write is missing"
                assert time.monotonic() < deadline, f"round {r} not seen within {SEEN_WITHIN_S} s"
                await asyncio.sleep(0.001)
        mixed = [values for values in observed if len(values) > 1]
        assert mixed == [], f"the reader saw rounds mixed: {mixed[:3]}"
        assert len(observed) >= 20
        assert reader.security_items("acls/") == dict.fromkeys(keys, b"19")
    finally:
        await writer.close()
        await reader.close()

"""The schema registry's storage contract (`MetadataStore.registry_*`), written once and run against
every backend (see conftest.BACKENDS): compare-and-write, prefixes, durability, and concurrent
writers agreeing through the compare."""

from __future__ import annotations

import asyncio

from metadata.store import RegistryItem


async def test_get_put_and_items_in_key_order(store):
    assert await store.registry_get("schemas/1") is None
    assert await store.registry_items("schemas/") == []
    assert await store.registry_write({"schemas/2": b"two", "schemas/1": b"one", "subjects/a": b"x"}, {})
    one = await store.registry_get("schemas/1")
    assert (one.key, one.value) == ("schemas/1", b"one") and one.revision > 0
    items = await store.registry_items("schemas/")
    assert [(i.key, i.value) for i in items] == [("schemas/1", b"one"), ("schemas/2", b"two")]
    assert [i.key for i in await store.registry_items("")] == ["schemas/1", "schemas/2", "subjects/a"]


async def test_prefix_is_literal(store):
    # subject names are free text: % and _ must not act as wildcards, and a longer name is not a prefix match of a shorter one's items
    await store.registry_write({"s/a%b/1": b"1", "s/axb/1": b"2", "s/a_/1": b"3", "s/ab/1": b"4"}, {})
    assert [i.key for i in await store.registry_items("s/a%b/")] == ["s/a%b/1"]
    assert [i.key for i in await store.registry_items("s/a_/")] == ["s/a_/1"]


async def test_compare_on_revision_and_absence(store):
    assert await store.registry_write({"k": b"v1"}, {"k": 0})
    first = await store.registry_get("k")
    assert not await store.registry_write({"k": b"again"}, {"k": 0}), "absent expected, but present"
    assert await store.registry_write({"k": b"v2"}, {"k": first.revision})
    second = await store.registry_get("k")
    assert second.value == b"v2" and second.revision > first.revision
    assert not await store.registry_write({"k": b"v3", "other": b"o"}, {"k": first.revision}), "stale revision"
    assert await store.registry_get("other") is None, "a failed write changes nothing"
    assert (await store.registry_get("k")).value == b"v2"


async def test_delete_and_revisions_of_other_keys(store):
    await store.registry_write({"a": b"1", "b": b"2"}, {})
    a = await store.registry_get("a")
    assert await store.registry_write({"b": None}, {"a": a.revision})
    assert await store.registry_get("b") is None
    assert await store.registry_write({"b": b"again"}, {"b": 0})
    assert (await store.registry_get("a")) == RegistryItem("a", b"1", a.revision), "untouched keys keep their revision"


async def test_concurrent_writers_one_wins(store):
    # the registry's id allocation: read the counter, write counter+1 comparing it; every writer retries until it wins
    await store.registry_write({"ids": b"0"}, {})

    async def allocate() -> int:
        while True:
            item = await store.registry_get("ids")
            n = int(item.value) + 1
            if await store.registry_write({"ids": str(n).encode(), f"schemas/{n:04d}": b""}, {"ids": item.revision}):
                return n

    got = await asyncio.gather(*(allocate() for _ in range(20)))
    assert sorted(got) == list(range(1, 21))
    assert [i.key for i in await store.registry_items("schemas/")] == [f"schemas/{n:04d}" for n in range(1, 21)]


async def test_durable_across_reopen(open_store):
    first = await open_store()
    await first.registry_write({"schemas/7": b"seven"}, {})
    item = await first.registry_get("schemas/7")
    await first.close()
    second = await open_store()
    assert await second.registry_get("schemas/7") == item
    assert not await second.registry_write({"schemas/7": b"x"}, {"schemas/7": 0})


async def test_two_etcd_stores_on_one_root_see_each_others_writes(tmp_path, request):
    # Brokers share etcd; one SQLite file has one owner process (the node's data-dir lock), so
    # only etcd has two stores on one location.
    from tests.metadata.conftest import _opener

    opened: list = []
    open_store = _opener("etcd", tmp_path, opened, request)
    a, b = await open_store(), await open_store()
    await a.registry_write({"x": b"from a"}, {})
    item = await b.registry_get("x")
    assert item.value == b"from a"
    assert not await b.registry_write({"x": b"from b"}, {"x": 0})
    assert await b.registry_write({"x": b"from b"}, {"x": item.revision})
    assert (await a.registry_get("x")).value == b"from b"
    for store in opened:
        await store.close()

"""Registrations racing each other (registry/service.py over the metadata store's compare-and-write):
many registrars on one store, and two stores on one etcd root as two brokers are, agree on one id
per schema and one version per schema in a subject, with ids given out without gaps."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from metadata.embedded import EmbeddedMetadataStore
from metadata.store import load_metadata_store
from registry.model import Compatibility, Schema, SchemaType
from registry.service import Registry
from registry.store import RegistryStore


def schema(n: int) -> Schema:
    return Schema(SchemaType.AVRO, json.dumps({"type": "record", "name": "R", "fields": [{"name": f"f{i}", "type": "int", "default": 0} for i in range(n)]}))


@pytest.fixture(params=["memory", "etcd"])
async def registries(request):
    """Two registries: on one embedded store (one process), or on two etcd stores sharing a root."""
    if request.param == "memory":
        store = EmbeddedMetadataStore(None)
        stores = [store]
        await store.start()
        pair = [Registry(RegistryStore(store)), Registry(RegistryStore(store))]
    else:
        url = f"{request.getfixturevalue('etcd_server').url}/registry-{uuid.uuid4().hex[:8]}"
        stores = [load_metadata_store(url), load_metadata_store(url)]
        for s in stores:
            await s.start()
        pair = [Registry(RegistryStore(s)) for s in stores]
    yield pair
    for s in stores:
        await s.close()


async def test_racing_registrations_agree(registries):
    a, b = registries
    await a.set_config(None, Compatibility.NONE)
    # each of 6 schemas registered 4 times at once, in a shared subject and in a subject of its own
    calls = [(r, subject, n) for n in range(6) for r in (a, b, a, b) for subject in ("shared", f"own-{n}")]
    ids = await asyncio.gather(*(r.register(subject, schema(n)) for r, subject, n in calls))
    by_schema: dict[int, set[int]] = {}
    for (_r, _subject, n), schema_id in zip(calls, ids, strict=True):
        by_schema.setdefault(n, set()).add(schema_id)
    assert all(len(found) == 1 for found in by_schema.values()), by_schema
    assert sorted(found.pop() for found in by_schema.values()) == list(range(1, 7)), "ids without gaps or doubles"
    for r in (a, b):
        assert await r.versions("shared") == list(range(1, 7)), "one version per schema"
        assert sorted([(await r.version("shared", str(v))).version.schema_id for v in range(1, 7)]) == list(range(1, 7))
        assert [await r.versions(f"own-{n}") for n in range(6)] == [[1]] * 6


async def test_of_two_racing_schemas_incompatible_with_each_other_one_lands(registries):
    a, b = registries

    def with_b(kind: str) -> Schema:
        return Schema(SchemaType.AVRO, json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}, {"name": "b", "type": kind, "default": 0 if kind == "int" else ""}]}))

    await a.register("s", Schema(SchemaType.AVRO, json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})))
    # each follows v1 (BACKWARD), but not the other: the one that loses the race is checked
    # again against the winner and refused
    got = await asyncio.gather(a.register("s", with_b("int")), b.register("s", with_b("string")), return_exceptions=True)
    assert sorted(type(g).__name__ for g in got) == ["IncompatibleSchema", "int"], got
    assert await b.versions("s") == [1, 2]

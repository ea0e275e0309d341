"""Schema by id for the registry's readers (registry/client.py): from the metadata store, and from a
registry's REST API by URL (here neve's own, served on loopback), each cached."""

from __future__ import annotations

import json

import pytest

from metadata.embedded import EmbeddedMetadataStore
from registry.client import StoreLookup, UrlLookup, load_lookup
from registry.config import RegistryConfig
from registry.model import Reference, Schema, SchemaType
from registry.server import RegistryServer

ADDRESS = json.dumps({"type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"}]})
PERSON = json.dumps({"type": "record", "name": "Person", "fields": [{"name": "home", "type": "Address"}]})


@pytest.fixture
async def served():
    """neve's registry over an in-memory metadata store, served on loopback: (metadata, server)."""
    metadata = EmbeddedMetadataStore(None)
    await metadata.start()
    server = RegistryServer(metadata, "127.0.0.1", 0)
    await server.start()
    yield metadata, server
    await server.stop()
    await metadata.close()


async def test_store_and_url_lookups_agree_and_cache(served):
    metadata, server = served
    registry = server.registry
    address_id = await registry.register("address", Schema(SchemaType.AVRO, ADDRESS))
    person = Schema(SchemaType.AVRO, PERSON, (Reference("Address", "address", 1),))
    person_id = await registry.register("person", person)
    local = load_lookup(RegistryConfig(), metadata)
    remote = load_lookup(RegistryConfig(url=server.url + "/"), metadata)
    assert isinstance(local, StoreLookup) and isinstance(remote, UrlLookup)
    for lookup in (local, remote):
        assert await lookup.schema(address_id) == Schema(SchemaType.AVRO, ADDRESS.replace(" ", ""))
        assert await lookup.schema(person_id) == Schema(SchemaType.AVRO, PERSON.replace(" ", ""), (Reference("Address", "address", 1),))
        assert await lookup.schema(999) is None
    await server.stop()
    # what was read is cached: answered with the registry gone
    assert (await remote.schema(person_id)).references == (Reference("Address", "address", 1),)
    await remote.close()


async def test_a_subjects_schemas_come_in_version_order_with_soft_deleted_ones_from_both_lookups(served):
    metadata, server = served
    registry = server.registry
    v1 = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})
    v2 = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}, {"name": "b", "type": ["null", "string"], "default": None}]})
    id1 = await registry.register("orders-value", Schema(SchemaType.AVRO, v1))
    id2 = await registry.register("orders-value", Schema(SchemaType.AVRO, v2))
    await registry.delete_version("orders-value", "1", permanent=False)
    for lookup in (StoreLookup(metadata), UrlLookup(server.url)):
        got = await lookup.subject_schemas("orders-value")
        assert [(version, schema_id, json.loads(schema.text)) for version, schema_id, schema in got] == [(1, id1, json.loads(v1)), (2, id2, json.loads(v2))]
        assert await lookup.subject_schemas("nothing-value") == []
        await lookup.close()

"""The REST resources (registry/http/) through aiohttp's test client over an in-memory metadata
store: routes, bodies and Confluent's error codes and statuses, for what the official client does
not exercise (modes, IMPORT, references, text sub-resources, the framework's own errors)."""

from __future__ import annotations

import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from metadata.embedded import EmbeddedMetadataStore
from registry.http import make_app
from registry.service import Registry
from registry.store import RegistryStore

CT = "application/vnd.schemaregistry.v1+json"
USER = json.dumps({"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"}]})
USER_V2 = json.dumps({"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int", "default": 0}]})
USER_BAD = json.dumps({"type": "record", "name": "User", "fields": [{"name": "name", "type": "int"}]})


@pytest.fixture
async def client():
    metadata = EmbeddedMetadataStore(None)
    await metadata.start()
    async with TestClient(TestServer(make_app(Registry(RegistryStore(metadata))))) as c:
        yield c
    await metadata.close()


async def call(client, method, path, body=None, status=200):
    response = await client.request(method, path, data=None if body is None else json.dumps(body), headers={"Content-Type": CT})
    assert response.status == status, await response.text()
    assert response.content_type == CT
    text = await response.text()
    try:
        return json.loads(text)
    except ValueError:
        return text


async def test_register_get_and_text_resources(client):
    assert await call(client, "POST", "/subjects/u/versions", {"schema": USER}) == {"id": 1}
    assert await call(client, "POST", "/subjects/u/versions", {"schema": USER, "schemaType": "AVRO"}) == {"id": 1}
    assert await call(client, "GET", "/subjects/u/versions/1") == {"subject": "u", "version": 1, "id": 1, "schema": USER.replace(" ", ""), "references": []}
    assert await call(client, "GET", "/subjects/u/versions/latest/schema") == json.loads(USER)
    assert await call(client, "GET", "/schemas/ids/1/schema") == json.loads(USER)
    assert await call(client, "GET", "/schemas/types") == ["JSON", "PROTOBUF", "AVRO"]
    assert await call(client, "GET", "/") == {}


async def test_error_codes_and_statuses(client):
    assert (await call(client, "GET", "/subjects/none/versions", status=404))["error_code"] == 40401
    await call(client, "POST", "/subjects/u/versions", {"schema": USER})
    assert (await call(client, "GET", "/subjects/u/versions/9", status=404))["error_code"] == 40402
    assert (await call(client, "GET", "/subjects/u/versions/0", status=422))["error_code"] == 42202
    assert (await call(client, "GET", "/subjects/u/versions/x", status=422))["error_code"] == 42202
    assert (await call(client, "GET", "/schemas/ids/99", status=404))["error_code"] == 40403
    assert (await call(client, "POST", "/subjects/u/versions", {"schema": "{nope"}, status=422))["error_code"] == 42201
    assert (await call(client, "POST", "/subjects/u/versions", {"schema": '{"type": "wat"}'}, status=422))["error_code"] == 42201
    assert (await call(client, "POST", "/subjects/u/versions", {"schema": USER_BAD}, status=409))["error_code"] == 409
    assert (await call(client, "PUT", "/config", {"compatibility": "SIDEWAYS"}, status=422))["error_code"] == 42203
    assert (await call(client, "PUT", "/mode", {"mode": "SIDEWAYS"}, status=422))["error_code"] == 42204
    assert (await call(client, "GET", "/config/u", status=404))["error_code"] == 40408
    assert (await call(client, "GET", "/mode/u", status=404))["error_code"] == 40409
    assert await call(client, "GET", "/no/such/path", status=404) == {"error_code": 404, "message": "HTTP 404 Not Found"}
    response = await client.post("/subjects/u/versions", data=b"not json", headers={"Content-Type": CT})
    assert response.status == 400 and (await response.json(content_type=None))["error_code"] == 400


async def test_soft_then_hard_delete_of_versions_and_subjects(client):
    await call(client, "POST", "/subjects/u/versions", {"schema": USER})
    await call(client, "POST", "/subjects/u/versions", {"schema": USER_V2})
    assert (await call(client, "DELETE", "/subjects/u/versions/1?permanent=true", status=404))["error_code"] == 40407
    assert await call(client, "DELETE", "/subjects/u/versions/1") == 1
    assert (await call(client, "DELETE", "/subjects/u/versions/1", status=404))["error_code"] == 40406
    assert await call(client, "GET", "/subjects/u/versions") == [2]
    assert await call(client, "GET", "/subjects/u/versions?deleted=true") == [1, 2]
    assert (await call(client, "GET", "/subjects/u/versions/1?deleted=true"))["id"] == 1
    assert (await call(client, "DELETE", "/subjects/u?permanent=true", status=404))["error_code"] == 40405
    assert await call(client, "DELETE", "/subjects/u") == [2]
    assert (await call(client, "DELETE", "/subjects/u", status=404))["error_code"] == 40404
    assert await call(client, "GET", "/subjects") == []
    assert await call(client, "GET", "/subjects?deleted=true") == ["u"]
    assert await call(client, "DELETE", "/subjects/u?permanent=true") == [1, 2]
    assert await call(client, "GET", "/subjects?deleted=true") == []
    # ids stay resolvable: records framed with them are still in topics (docs/GAPS.md)
    assert (await call(client, "GET", "/schemas/ids/2"))["schema"] == USER_V2.replace(" ", "")
    assert await call(client, "POST", "/subjects/u/versions", {"schema": USER_V2}) == {"id": 2}
    assert await call(client, "GET", "/subjects/u/versions") == [1], "a subject deleted for good starts again at version 1"


async def test_config_levels_and_default_to_global(client):
    assert await call(client, "GET", "/config") == {"compatibilityLevel": "BACKWARD"}
    assert await call(client, "PUT", "/config/u", {"compatibility": "none"}) == {"compatibility": "NONE"}
    assert await call(client, "GET", "/config/u") == {"compatibilityLevel": "NONE"}
    assert await call(client, "GET", "/config/other?defaultToGlobal=true") == {"compatibilityLevel": "BACKWARD"}
    await call(client, "POST", "/subjects/u/versions", {"schema": USER})
    assert await call(client, "POST", "/subjects/u/versions", {"schema": USER_BAD}) == {"id": 2}, "NONE takes anything"
    assert await call(client, "DELETE", "/config/u") == {"compatibilityLevel": "NONE"}
    assert await call(client, "PUT", "/config", {"compatibility": "FULL_TRANSITIVE"}) == {"compatibility": "FULL_TRANSITIVE"}
    assert await call(client, "GET", "/config/u?defaultToGlobal=true") == {"compatibilityLevel": "FULL_TRANSITIVE"}
    assert await call(client, "DELETE", "/config") == {"compatibilityLevel": "FULL_TRANSITIVE"}
    assert await call(client, "GET", "/config") == {"compatibilityLevel": "BACKWARD"}


async def test_compatibility_resource(client):
    await call(client, "POST", "/subjects/u/versions", {"schema": USER})
    assert await call(client, "POST", "/compatibility/subjects/u/versions/latest", {"schema": USER_V2}) == {"is_compatible": True}
    got = await call(client, "POST", "/compatibility/subjects/u/versions/1?verbose=true", {"schema": USER_BAD})
    assert got["is_compatible"] is False and any("TYPE_MISMATCH" in m for m in got["messages"])
    assert await call(client, "POST", "/compatibility/subjects/u/versions", {"schema": USER_BAD}) == {"is_compatible": False}
    assert await call(client, "POST", "/compatibility/subjects/new/versions/latest", {"schema": USER_BAD}) == {"is_compatible": True}
    assert (await call(client, "POST", "/compatibility/subjects/new/versions/3", {"schema": USER}, status=404))["error_code"] == 40401
    assert (await call(client, "POST", "/compatibility/subjects/u/versions/3", {"schema": USER}, status=404))["error_code"] == 40402


async def test_modes_readonly_and_import(client):
    assert await call(client, "GET", "/mode") == {"mode": "READWRITE"}
    assert await call(client, "PUT", "/mode", {"mode": "IMPORT"}) == {"mode": "IMPORT"}
    assert await call(client, "POST", "/subjects/u/versions", {"schema": USER, "id": 42, "version": 3}) == {"id": 42}
    assert await call(client, "GET", "/subjects/u/versions") == [3]
    assert (await call(client, "POST", "/subjects/v/versions", {"schema": USER_V2, "id": 42}, status=422))["error_code"] == 42205
    assert await call(client, "PUT", "/mode", {"mode": "READWRITE"}) == {"mode": "READWRITE"}
    assert (await call(client, "PUT", "/mode", {"mode": "IMPORT"}, status=422))["error_code"] == 42205, "IMPORT needs an empty registry"
    assert await call(client, "POST", "/subjects/v/versions", {"schema": USER_V2}) == {"id": 43}, "ids continue after imported ones"
    assert (await call(client, "POST", "/subjects/v/versions", {"schema": USER, "id": 7}, status=422))["error_code"] == 42205
    assert await call(client, "PUT", "/mode/u", {"mode": "READONLY"}) == {"mode": "READONLY"}
    assert (await call(client, "POST", "/subjects/u/versions", {"schema": USER_V2}, status=422))["error_code"] == 42205
    assert (await call(client, "DELETE", "/subjects/u", status=422))["error_code"] == 42205
    assert await call(client, "GET", "/mode/u") == {"mode": "READONLY"}
    assert await call(client, "DELETE", "/mode/u") == {"mode": "READONLY"}
    assert await call(client, "GET", "/mode/u?defaultToGlobal=true") == {"mode": "READWRITE"}


async def test_references_lookup_and_referencedby(client):
    address = json.dumps({"type": "record", "name": "Address", "namespace": "x", "fields": [{"name": "city", "type": "string"}]})
    person = json.dumps({"type": "record", "name": "Person", "namespace": "x", "fields": [{"name": "home", "type": "x.Address"}]})
    assert await call(client, "POST", "/subjects/address/versions", {"schema": address}) == {"id": 1}
    assert (await call(client, "POST", "/subjects/person/versions", {"schema": person}, status=422))["error_code"] == 42201, "unknown type without the reference"
    refs = [{"name": "x.Address", "subject": "address", "version": 1}]
    assert await call(client, "POST", "/subjects/person/versions", {"schema": person, "references": refs}) == {"id": 2}
    assert (await call(client, "GET", "/schemas/ids/2"))["references"] == refs
    assert await call(client, "GET", "/subjects/address/versions/1/referencedby") == [2]
    assert (await call(client, "DELETE", "/subjects/address/versions/1", status=422))["error_code"] == 42206
    found = await call(client, "POST", "/subjects/person", {"schema": person, "references": refs})
    assert (found["subject"], found["version"], found["id"]) == ("person", 1, 2)
    assert (await call(client, "POST", "/subjects/person", {"schema": address}, status=404))["error_code"] == 40403
    assert (await call(client, "POST", "/subjects/nobody", {"schema": address}, status=404))["error_code"] == 40401
    assert await call(client, "GET", "/schemas/ids/1/versions") == [{"subject": "address", "version": 1}]
    assert await call(client, "GET", "/schemas/ids/1/subjects") == ["address"]


async def test_json_and_protobuf_are_stored_as_text(client):
    assert await call(client, "POST", "/subjects/j/versions", {"schema": '{"type": "object"}', "schemaType": "JSON"}) == {"id": 1}
    assert await call(client, "POST", "/subjects/j/versions", {"schema": '{"type": "string"}', "schemaType": "JSON"}) == {"id": 2}, "no JSON Schema compatibility yet"
    assert (await call(client, "GET", "/schemas/ids/1"))["schemaType"] == "JSON"
    proto = 'syntax = "proto3"; message M { string a = 1; }'
    assert await call(client, "POST", "/subjects/p/versions", {"schema": proto, "schemaType": "PROTOBUF"}) == {"id": 3}
    assert (await call(client, "GET", "/subjects/p/versions/1"))["schema"] == proto
    assert (await call(client, "POST", "/subjects/p/versions", {"schema": "  ", "schemaType": "PROTOBUF"}, status=422))["error_code"] == 42201
    assert (await call(client, "POST", "/subjects/j/versions", {"schema": "[1", "schemaType": "JSON"}, status=422))["error_code"] == 42201

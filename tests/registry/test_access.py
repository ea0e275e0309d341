"""The registry over HTTPS with HTTP Basic users (registry/access.py), served on loopback with
certificates from trustme: 401 for no or wrong credentials, 403 past a role or a subject prefix,
listings filtered, SCRAM users through an injected password check, client certificates, and
confluent-kafka's SchemaRegistryClient and the compactor's lookup authenticating."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl

import aiohttp
import pytest
import trustme
from confluent_kafka.schema_registry import Schema as ClientSchema
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from prometheus_client import REGISTRY as METRICS

from metadata.embedded import EmbeddedMetadataStore
from registry.access import load_access, parse_users
from registry.client import UrlLookup, load_lookup
from registry.config import RegistryConfig
from registry.model import Schema, SchemaType, StoreError
from registry.server import load_server

CT = "application/vnd.schemaregistry.v1+json"
USER = json.dumps({"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"}]})
ORDER = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]})
USERS_FILE = """\
# role per user; passwords in plain text
reader: reader-pw,read
writer: writer-pw,write
admin: admin-pw,admin
orders: orders-pw,write,prefix:orders-,prefix:billing-
orders-admin: oa-pw,admin,prefix:orders-
nobody: nobody-pw
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """(CA file, server cert file, server key file, the CA itself) for 127.0.0.1."""
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    (d / "server.pem").write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(d / "server.key"))
    return str(d / "ca.pem"), str(d / "server.pem"), str(d / "server.key"), ca


@pytest.fixture
async def serve(tmp_path, pki):
    """`await serve(**settings)`: neve's registry over an in-memory metadata store on loopback,
    HTTPS with the test CA's certificate and the users above unless told otherwise; the started
    server. Everything is stopped at teardown."""
    ca_file, cert_file, key_file, _ = pki
    users_file = tmp_path / "users.properties"
    users_file.write_text(USERS_FILE)
    metadata = EmbeddedMetadataStore(None)
    await metadata.start()
    started = []

    async def make(check_password=None, **settings):
        base = {"host": "127.0.0.1", "port": 0, "tls_cert_file": cert_file, "tls_key_file": key_file, "users_file": str(users_file)}
        server = await load_server(RegistryConfig(**{**base, **settings}), metadata, check_password)
        await server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        await server.stop()
    await metadata.close()


@pytest.fixture
async def http(pki):
    """An aiohttp session trusting the test CA; `call(server, method, path, user, body)` ->
    (status, decoded body, headers)."""
    context = ssl.create_default_context(cafile=pki[0])
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:

        async def call(server, method, path, user=None, body=None):
            headers = {"Content-Type": CT} | ({"Authorization": aiohttp.encode_basic_auth(*user.split(":", 1))} if user else {})
            data = None if body is None else json.dumps(body)
            async with session.request(method, server.url + path, data=data, headers=headers) as response:
                return response.status, json.loads(await response.text()), response.headers

        yield call


def failures(reason: str) -> float:
    return METRICS.get_sample_value("neve_registry_auth_failures_total", {"reason": reason}) or 0.0


async def test_no_credentials_and_wrong_ones_are_401_with_the_realm_and_counted_without_the_password(serve, http, caplog):
    server = await serve()
    assert server.url.startswith("https://")
    before = {r: failures(r) for r in ("no_credentials", "bad_credentials", "malformed")}
    caplog.set_level(logging.WARNING, logger="neve.registry")
    for user in (None, "reader:wrong-pw", "stranger:reader-pw", "reader:"):
        status, body, headers = await http(server, "GET", "/subjects", user)
        assert (status, body["error_code"], headers["WWW-Authenticate"]) == (401, 40101, 'Basic realm="neve-registry"'), user
    assert failures("no_credentials") - before["no_credentials"] == 1
    assert failures("bad_credentials") - before["bad_credentials"] == 3
    logged = [r for r in caplog.records if r.getMessage() == "registry_auth_failed"]
    assert [(r.reason, r.user) for r in logged] == [("no_credentials", None), ("bad_credentials", "reader"), ("bad_credentials", "stranger"), ("bad_credentials", "reader")]
    assert not any("wrong-pw" in repr(r.__dict__) or "reader-pw" in repr(r.__dict__) for r in caplog.records)
    assert (await http(server, "GET", "/subjects", "reader:reader-pw"))[:2] == (200, [])


async def test_a_malformed_authorization_header_is_401(serve, pki):
    server = await serve()
    before = failures("malformed")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=pki[0]))) as session:
        for header in ("Bearer abc", "Basic !!!", "Basic dXNlcm9ubHk="):  # the last: "useronly", no colon
            async with session.get(server.url + "/subjects", headers={"Authorization": header}) as response:
                assert response.status == 401 and (await response.json(content_type=None))["error_code"] == 40101
    assert failures("malformed") - before == 3


async def test_roles_read_write_admin(serve, http):
    server = await serve()
    before = failures("forbidden")
    schema = {"schema": USER}
    status, body, _ = await http(server, "POST", "/subjects/users-value/versions", "reader:reader-pw", schema)
    assert (status, body) == (403, {"error_code": 40301, "message": "User reader cannot access the resource."})
    assert (await http(server, "POST", "/subjects/users-value/versions", "writer:writer-pw", schema))[:2] == (200, {"id": 1})
    # reads, a lookup and a compatibility test are a reader's
    assert (await http(server, "GET", "/subjects/users-value/versions", "reader:reader-pw"))[:2] == (200, [1])
    assert (await http(server, "POST", "/subjects/users-value", "reader:reader-pw", schema))[1]["id"] == 1
    assert (await http(server, "POST", "/compatibility/subjects/users-value/versions/latest", "reader:reader-pw", schema))[:2] == (200, {"is_compatible": True})
    assert (await http(server, "GET", "/config", "reader:reader-pw"))[:2] == (200, {"compatibilityLevel": "BACKWARD"})
    # configuration, modes and deletes are an admin's
    for method, path, body in (("PUT", "/config", {"compatibility": "NONE"}), ("PUT", "/mode/users-value", {"mode": "READONLY"}), ("DELETE", "/subjects/users-value", None)):
        assert (await http(server, method, path, "writer:writer-pw", body))[:2] == (403, {"error_code": 40301, "message": "User writer cannot access the resource."}), path
    assert (await http(server, "PUT", "/config", "admin:admin-pw", {"compatibility": "NONE"}))[:2] == (200, {"compatibility": "NONE"})
    assert (await http(server, "DELETE", "/subjects/users-value", "admin:admin-pw"))[:2] == (200, [1])
    # a user with no role authenticates and may do nothing
    assert (await http(server, "GET", "/subjects", "nobody:nobody-pw"))[0] == 403
    assert failures("forbidden") - before == 5
    assert (await http(server, "GET", "/subjects", "reader:reader-pw"))[:2] == (200, [])


async def test_subject_prefixes_limit_reads_writes_and_listings(serve, http):
    server = await serve()
    registry = server.registry
    user_id = await registry.register("users-value", Schema(SchemaType.AVRO, USER))
    await registry.register("billing-value", Schema(SchemaType.AVRO, USER))  # the same schema: one id, two subjects
    orders = "orders:orders-pw"
    assert (await http(server, "POST", "/subjects/orders-value/versions", orders, {"schema": ORDER}))[:2] == (200, {"id": user_id + 1})
    assert (await http(server, "POST", "/subjects/users-value/versions", orders, {"schema": ORDER}))[:2] == (403, {"error_code": 40301, "message": "User orders cannot access the resource."})
    assert (await http(server, "GET", "/subjects/users-value/versions/latest", orders))[0] == 403
    assert (await http(server, "POST", "/subjects/users-value", orders, {"schema": USER}))[0] == 403
    assert (await http(server, "GET", "/subjects", orders))[:2] == (200, ["billing-value", "orders-value"])
    assert (await http(server, "GET", "/subjects", "reader:reader-pw"))[:2] == (200, ["billing-value", "orders-value", "users-value"])
    # by id: readable through a subject the user sees, and only those subjects are named
    assert (await http(server, "GET", f"/schemas/ids/{user_id}", orders))[:2] == (200, {"schema": USER.replace(" ", ""), "references": []})
    assert (await http(server, "GET", f"/schemas/ids/{user_id}/subjects", orders))[:2] == (200, ["billing-value"])
    assert (await http(server, "GET", f"/schemas/ids/{user_id}/versions", orders))[:2] == (200, [{"subject": "billing-value", "version": 1}])
    assert (await http(server, "GET", "/schemas/ids/999", orders))[1]["error_code"] == 40403
    await registry.delete_subject("billing-value", False)
    await registry.delete_subject("billing-value", True)
    assert (await http(server, "GET", f"/schemas/ids/{user_id}", orders))[0] == 403, "held by users-value alone now"
    assert (await http(server, "GET", f"/schemas/ids/{user_id}/subjects", orders))[:2] == (200, [])
    # an admin within prefixes: its subjects' settings, not the global ones
    assert (await http(server, "PUT", "/config/orders-value", "orders-admin:oa-pw", {"compatibility": "FULL"}))[:2] == (200, {"compatibility": "FULL"})
    assert (await http(server, "PUT", "/config/users-value", "orders-admin:oa-pw", {"compatibility": "FULL"}))[0] == 403
    assert (await http(server, "PUT", "/config", "orders-admin:oa-pw", {"compatibility": "NONE"}))[0] == 403
    assert (await http(server, "PUT", "/mode", "orders-admin:oa-pw", {"mode": "READONLY"}))[0] == 403
    assert (await http(server, "GET", "/config", "reader:reader-pw"))[1] == {"compatibilityLevel": "BACKWARD"}


async def test_a_reference_reaches_only_subjects_the_caller_sees(serve, http):
    """Issue 43, finding 9: a schema registered, looked up or tested under a subject the caller may
    write could reference a subject its prefixes hide: the registry resolved it, telling whether
    it existed and taking its types. Such a reference is answered as one to no subject."""
    server = await serve()
    await server.registry.register("users-value", Schema(SchemaType.AVRO, USER))
    await server.registry.register("orders-user", Schema(SchemaType.AVRO, USER))
    order = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "who", "type": "User"}]})
    hidden = {"schema": order, "references": [{"name": "User", "subject": "users-value", "version": 1}]}
    seen = {"schema": order, "references": [{"name": "User", "subject": "orders-user", "version": 1}]}
    not_found = {"error_code": 42201, "message": "Invalid schema: reference User to subject 'users-value' version 1 not found"}
    orders = "orders:orders-pw"
    for method, path in (("POST", "/subjects/orders-value/versions"), ("POST", "/subjects/orders-value"), ("POST", "/compatibility/subjects/orders-value/versions/latest")):
        assert (await http(server, method, path, orders, hidden))[:2] == (422, not_found), path
    assert (await http(server, "POST", "/subjects/orders-value/versions", orders, seen))[0] == 200  # within its prefixes: resolved
    assert (await http(server, "POST", "/subjects/orders-other/versions", "writer:writer-pw", hidden))[0] == 200  # a user without prefixes: as before


async def test_scram_users_through_the_password_check_and_anonymous_roles(serve, http):
    scram = {"kafka-app": "scram-pw", "reader": "scram-reader-pw"}
    asked: list[str] = []

    async def check_password(user: str, password: str) -> bool:
        asked.append(user)
        await asyncio.sleep(0)  # an awaited check, as the SCRAM store's
        return scram.get(user) == password

    server = await serve(check_password, scram_users=True, scram_roles="write,prefix:app-", anonymous="read")
    assert (await http(server, "POST", "/subjects/app-value/versions", "kafka-app:scram-pw", {"schema": USER}))[:2] == (200, {"id": 1})
    assert (await http(server, "POST", "/subjects/other-value/versions", "kafka-app:scram-pw", {"schema": USER}))[0] == 403
    assert (await http(server, "GET", "/subjects", "kafka-app:wrong"))[0] == 401
    # the users file's users are checked there only: a SCRAM password of the same name does not open it
    assert (await http(server, "GET", "/subjects", "reader:scram-reader-pw"))[0] == 401
    assert asked == ["kafka-app", "kafka-app", "kafka-app"]
    # anonymous="read": no credentials reads, and may not write
    assert (await http(server, "GET", "/subjects"))[:2] == (200, ["app-value"])
    assert (await http(server, "POST", "/subjects/x/versions", None, {"schema": USER}))[:2] == (403, {"error_code": 40301, "message": "User ANONYMOUS cannot access the resource."})


async def test_client_certificates_when_a_client_ca_is_set(serve, pki, tmp_path):
    ca_file, _, _, ca = pki
    server = await serve(tls_client_ca_file=ca_file, users_file="", anonymous="")
    context = ssl.create_default_context(cafile=ca_file)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(server.url + "/subjects") as response:
                await response.read()
    ca.issue_cert("client@example.com").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "client.pem"))
    context.load_cert_chain(str(tmp_path / "client.pem"))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session, session.get(server.url + "/subjects") as response:
        assert (response.status, await response.json(content_type=None)) == (200, [])


def test_users_file_and_settings_errors(tmp_path):
    assert parse_users("a: p\n", "f")["a"].grant.role is None
    assert parse_users(" a : p , read ,prefix:x-\n", "f")["a"].password == "p"
    for text, message in (
        ("a: OBF:1v2j1uum1xtv1zej\n", "f:1: user 'a': obfuscated or hashed passwords"),
        ("# c\na: MD5:164c88b302622e17050af52c89945d44\n", "f:2: user 'a': obfuscated or hashed"),
        ("a: p,superuser\n", "f:1: unknown role 'superuser'"),
        ("a:\n", "f:1: user 'a' has no password"),
        ("just a name\n", "f:1: not `user: password,role,...`"),
    ):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("`", ".")):
            parse_users(text, "f")
    with pytest.raises(ValueError, match="scram_users needs the SCRAM store"):
        load_access(scram_users=True)
    assert load_access() is None, "no users, no anonymous limit: the registry is open"
    assert load_access(anonymous="read") is not None


async def test_tls_settings_that_cannot_be_served_are_refused(pki, tmp_path):
    ca_file, cert_file, key_file, _ = pki
    for settings, message in (
        ({"tls_cert_file": cert_file}, "tls_cert_file and registry.tls_key_file go together"),
        ({"tls_client_ca_file": ca_file}, "tls_client_ca_file needs HTTPS"),
    ):
        with pytest.raises(ValueError, match=message):
            await load_server(RegistryConfig(**settings), None)
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(str(tmp_path / "other.key"))
    with pytest.raises(ssl.SSLError):  # a key that is not the certificate's
        await load_server(RegistryConfig(tls_cert_file=cert_file, tls_key_file=str(tmp_path / "other.key")), None)


async def test_confluent_schema_registry_client_with_basic_auth_over_https(serve, pki):
    server = await serve()
    made: list[SchemaRegistryClient] = []

    def client(user_info: str) -> SchemaRegistryClient:
        made.append(SchemaRegistryClient({"url": server.url, "basic.auth.user.info": user_info, "ssl.ca.location": pki[0]}))
        return made[-1]

    def scenario():
        writer = client("writer:writer-pw")
        schema_id = writer.register_schema("users-value", ClientSchema(USER, "AVRO"))
        reader = client("reader:reader-pw")
        fetched = reader.get_schema(schema_id)
        latest = reader.get_latest_version("users-value")
        errors = []
        for call in (lambda: client("reader:reader-pw").register_schema("users-value", ClientSchema(ORDER, "AVRO")), lambda: client("writer:nope").get_subjects()):
            with pytest.raises(SchemaRegistryError) as raised:
                call()
            errors.append((raised.value.http_status_code, raised.value.error_code))
        return schema_id, fetched, latest, errors

    try:
        schema_id, fetched, latest, errors = await asyncio.to_thread(scenario)  # the client is blocking; the server is on this loop
    finally:
        for c in made:
            c.close()
    assert schema_id == 1
    assert json.loads(fetched.schema_str) == json.loads(USER)
    assert (latest.subject, latest.version, latest.schema_id) == ("users-value", 1, 1)
    assert errors == [(403, 40301), (401, 40101)]


async def test_the_compactors_lookup_authenticates_over_https(serve, pki):
    server = await serve()
    schema_id = await server.registry.register("orders-value", Schema(SchemaType.AVRO, ORDER))
    ca_file = pki[0]
    lookup = load_lookup(RegistryConfig(url=server.url, basic_auth_user_info="orders:orders-pw", url_ca_file=ca_file), None)
    assert isinstance(lookup, UrlLookup)
    try:
        assert await lookup.schema(schema_id) == Schema(SchemaType.AVRO, ORDER.replace(" ", ""))
        assert [(v, i) for v, i, _ in await lookup.subject_schemas("orders-value")] == [(1, schema_id)]
    finally:
        await lookup.close()
    for refused, message in (
        (UrlLookup(server.url, ca_file=ca_file), "refused a request without credentials (401)"),
        (UrlLookup(server.url, user_info="orders:wrong", ca_file=ca_file), "refused the credentials (401)"),
        (UrlLookup(server.url, user_info="orders:orders-pw"), "certificate verify failed"),  # the system's CAs do not know the test CA
    ):
        try:
            with pytest.raises(StoreError, match=message.replace("(", r"\(").replace(")", r"\)")):
                await refused.schema(schema_id)
        finally:
            await refused.close()

"""The SASL handlers on a connection's session: SaslHandshake picks the mechanism (or refuses),
SaslAuthenticate runs the exchange to a principal and a session lifetime, closes after a failure,
and re-authenticates only the same principal (KIP-368); DescribeUserScramCredentials and
AlterUserScramCredentials answer as Kafka does, and a user created through them logs in."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from types import SimpleNamespace

import pytest
from kio.schema.alter_user_scram_credentials.v0 import request as alter_v0
from kio.schema.describe_user_scram_credentials.v0 import request as describe_v0
from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v0.request import SaslAuthenticateRequest as AuthenticateV0
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest as AuthenticateV2
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from prometheus_client import REGISTRY
from scramp import ScramClient

from auth.authorizer import Authorizer
from auth.credentials import ScramCredentials
from auth.sasl import SaslMechanisms
from auth.session import Session
from broker.codec import encode_response, response_module
from broker.context import RequestContext
from broker.handlers.api17_sasl_handshake import sasl_handshake
from broker.handlers.api36_sasl_authenticate import sasl_authenticate
from broker.handlers.api50_describe_user_scram_credentials import describe_user_scram_credentials
from broker.handlers.api51_alter_user_scram_credentials import alter_user_scram_credentials
from broker.registry import load_handlers
from metadata.store import load_metadata_store
from tests.metadata.helpers import open_etcd_store

SHA256, SHA512 = 1, 2  # Kafka's SCRAM mechanism ids
REAUTH_MS = 60_000


async def services(store, reauth_ms: int = REAUTH_MS, authorizer=None):
    creds = ScramCredentials(store)
    await creds.bootstrap("alice", "alice-pw", "SCRAM-SHA-512", 4096)
    sasl = SaslMechanisms(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"], creds, connections_max_reauth_ms=reauth_ms)
    return SimpleNamespace(sasl=sasl, authorizer=authorizer, metadata=store)


async def call(handler, api_key: int, version: int, svc, session: Session, request):
    ctx = RequestContext(svc, api_key, version, "client-1", response_module(api_key, version), session=session)
    response = await handler(ctx, request)
    assert encode_response(api_key, version, 7, response)  # every answer is one the wire can carry
    return response


async def handshake(svc, session, mechanism, version=1):
    return await call(sasl_handshake, 17, version, svc, session, SaslHandshakeRequest(mechanism=mechanism))


async def authenticate(svc, session, data: bytes, version=2):
    request = (AuthenticateV2 if version else AuthenticateV0)(auth_bytes=data)
    return await call(sasl_authenticate, 36, version, svc, session, request)


async def scram_login(svc, session, user, password, mechanism="SCRAM-SHA-512"):
    """Handshake and SCRAM through the handlers; the last SaslAuthenticate response."""
    assert (await handshake(svc, session, mechanism)).error_code == ErrorCode.none
    client = ScramClient([mechanism], user, password)
    first = await authenticate(svc, session, client.get_client_first().encode())
    assert first.error_code == ErrorCode.none
    client.set_server_first(first.auth_bytes.decode())
    final = await authenticate(svc, session, client.get_client_final().encode())
    if final.error_code == ErrorCode.none:
        client.set_server_final(final.auth_bytes.decode())
    return final


@pytest.fixture
async def store():
    s = load_metadata_store("memory://")
    await s.start()
    yield s
    await s.close()


async def seen(store, prefix: str, keys: list[str]) -> None:
    """Wait until a broker's view of the security family holds exactly `keys` under `prefix`,
    looking each time its version moves (another broker's write raises no event to await)."""
    deadline = time.monotonic() + 30  # generous: the watch's delay is well under a second
    while sorted(store.security_items(prefix)) != keys:
        assert time.monotonic() < deadline, f"the view holds {sorted(store.security_items(prefix))}, not {keys}"
        version = store.security_version()
        while store.security_version() == version and time.monotonic() < deadline:
            await asyncio.sleep(0.01)


def sasl_session() -> Session:
    return Session("SASL_SSL", "EXTERNAL", "10.0.0.9")


def counted(mechanism: str, result: str) -> float:
    return REGISTRY.get_sample_value("neve_sasl_authentications_total", {"mechanism": mechanism, "result": result}) or 0.0


async def test_handshake_picks_an_offered_mechanism_and_refuses_others(store):
    svc = await services(store)
    session = sasl_session()
    answer = await handshake(svc, session, "SCRAM-SHA-512")
    assert (answer.error_code, answer.mechanisms) == (ErrorCode.none, ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"))
    assert session.mechanism == "SCRAM-SHA-512" and session.exchange is not None and not session.close_after_reply

    other = sasl_session()
    answer = await handshake(svc, other, "GSSAPI", version=0)
    assert (answer.error_code, answer.mechanisms, other.close_after_reply) == (ErrorCode.unsupported_sasl_mechanism, ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"), True)
    assert other.exchange is None

    plaintext = Session()
    assert (await handshake(svc, plaintext, "PLAIN")).error_code == ErrorCode.illegal_sasl_state
    assert plaintext.exchange is None and plaintext.principal == "User:ANONYMOUS" and not plaintext.close_after_reply

    nothing_offered = SimpleNamespace(sasl=None, authorizer=None)
    assert (await handshake(nothing_offered, sasl_session(), "PLAIN")).error_code == ErrorCode.unsupported_sasl_mechanism


@pytest.mark.parametrize("version", [0, 1, 2])
async def test_scram_through_the_handlers_sets_the_principal_and_the_session_lifetime(store, version):
    svc = await services(store)
    session = sasl_session()
    before = counted("SCRAM-SHA-512", "success")
    assert (await handshake(svc, session, "SCRAM-SHA-512")).error_code == ErrorCode.none
    client = ScramClient(["SCRAM-SHA-512"], "alice", "alice-pw")
    first = await authenticate(svc, session, client.get_client_first().encode(), version)
    assert (first.error_code, first.error_message, session.authenticated) == (ErrorCode.none, None, False)
    client.set_server_first(first.auth_bytes.decode())
    started = time.monotonic()
    final = await authenticate(svc, session, client.get_client_final().encode(), version)
    client.set_server_final(final.auth_bytes.decode())
    assert (final.error_code, session.principal, session.authenticated, session.exchange) == (ErrorCode.none, "User:alice", True, None)
    if version >= 1:
        assert final.session_lifetime.total_seconds() * 1000 == REAUTH_MS
    assert started + 59 <= session.expires_at <= time.monotonic() + 60
    assert counted("SCRAM-SHA-512", "success") == before + 1


async def test_a_failed_authentication_answers_without_the_secret_and_closes(store, caplog):
    svc = await services(store)
    session = sasl_session()
    before = counted("PLAIN", "failure")
    assert (await handshake(svc, session, "PLAIN")).error_code == ErrorCode.none
    with caplog.at_level(logging.INFO, logger="neve.broker.sasl"):
        answer = await authenticate(svc, session, b"\0alice\0not-alices-password")
    assert (answer.error_code, answer.error_message) == (ErrorCode.sasl_authentication_failed, "Authentication failed: Invalid username or password")
    assert session.close_after_reply and not session.authenticated and session.principal == "User:ANONYMOUS" and session.exchange is None
    assert counted("PLAIN", "failure") == before + 1
    [record] = caplog.records
    assert (record.getMessage(), record.mechanism, record.host, record.reason) == ("sasl_authentication_failed", "PLAIN", "10.0.0.9", answer.error_message)
    assert "not-alices-password" not in repr(vars(record))

    session = sasl_session()
    answer = await scram_login(svc, session, "alice", "wrong-pw")
    assert answer.error_code == ErrorCode.sasl_authentication_failed and "wrong-pw" not in answer.error_message
    assert session.close_after_reply and not session.authenticated


async def test_authenticate_before_a_handshake_is_an_illegal_state(store):
    svc = await services(store)
    session = sasl_session()
    answer = await authenticate(svc, session, b"\0alice\0alice-pw")
    assert (answer.error_code, session.close_after_reply, session.authenticated) == (ErrorCode.illegal_sasl_state, True, False)


async def test_reauthentication_keeps_the_principal_and_moves_the_deadline(store):
    svc = await services(store)
    session = sasl_session()
    assert (await scram_login(svc, session, "alice", "alice-pw")).error_code == ErrorCode.none
    first_deadline = session.expires_at
    assert (await scram_login(svc, session, "alice", "alice-pw")).error_code == ErrorCode.none
    assert session.expires_at > first_deadline and session.principal == "User:alice" and not session.close_after_reply
    # The same connection may not change principals, nor mechanisms.
    await ScramCredentials(svc.metadata).bootstrap("bob", "bob-pw", "SCRAM-SHA-512", 4096)
    assert (await handshake(svc, session, "PLAIN")).error_code == ErrorCode.illegal_sasl_state and session.close_after_reply
    session.close_after_reply = False
    answer = await scram_login(svc, session, "bob", "bob-pw")
    assert (answer.error_code, answer.error_message) == (ErrorCode.sasl_authentication_failed, "Cannot change principals during re-authentication from User:alice: User:bob")
    assert session.close_after_reply and not session.authenticated


async def test_no_second_handshake_when_the_session_has_no_lifetime(store):
    svc = await services(store, reauth_ms=0)
    session = sasl_session()
    answer = await scram_login(svc, session, "alice", "alice-pw")
    assert (answer.error_code, answer.session_lifetime.total_seconds(), session.expires_at) == (ErrorCode.none, 0, None)
    assert (await handshake(svc, session, "SCRAM-SHA-512")).error_code == ErrorCode.illegal_sasl_state
    assert session.authenticated and session.principal == "User:alice" and not session.close_after_reply
    assert (await authenticate(svc, session, b"x")).error_code == ErrorCode.illegal_sasl_state and not session.close_after_reply


def upsert(name, mechanism=SHA512, iterations=4096, password="pw", salt=b"a-salt-from-the-client"):
    algorithm = {SHA256: "sha256", SHA512: "sha512"}.get(mechanism, "sha512")
    salted = hashlib.pbkdf2_hmac(algorithm, password.encode(), salt, iterations)
    return alter_v0.ScramCredentialUpsertion(name=name, mechanism=mechanism, iterations=iterations, salt=salt, salted_password=salted)


async def alter(svc, deletions=(), upsertions=()):
    response = await call(alter_user_scram_credentials, 51, 0, svc, Session(), alter_v0.AlterUserScramCredentialsRequest(deletions=tuple(deletions), upsertions=tuple(upsertions)))
    return [(r.user, r.error_code) for r in response.results], response


async def describe(svc, users):
    request = describe_v0.DescribeUserScramCredentialsRequest(users=None if users is None else tuple(describe_v0.UserName(name=u) for u in users))
    response = await call(describe_user_scram_credentials, 50, 0, svc, Session(), request)
    assert response.error_code == ErrorCode.none
    return [(r.user, r.error_code, [(c.mechanism, c.iterations) for c in r.credential_infos]) for r in response.results]


async def test_alter_and_describe_scram_credentials(store):
    svc = await services(store)
    results, _ = await alter(svc, upsertions=[upsert("carol", SHA256, 8192, "carol-pw"), upsert("carol", SHA512, 4096, "carol-pw"), upsert("dave")])
    assert results == [("carol", ErrorCode.none), ("dave", ErrorCode.none)]
    assert await describe(svc, None) == [("alice", ErrorCode.none, [(SHA512, 4096)]), ("carol", ErrorCode.none, [(SHA256, 8192), (SHA512, 4096)]), ("dave", ErrorCode.none, [(SHA512, 4096)])]
    assert await describe(svc, ["carol", "nobody", "dave", "dave"]) == [
        ("carol", ErrorCode.none, [(SHA256, 8192), (SHA512, 4096)]),
        ("nobody", ErrorCode.resource_not_found, []),
        ("dave", ErrorCode.duplicate_resource, []),
    ]
    # carol logs in with the password her admin client salted, by either mechanism
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        session = sasl_session()
        assert (await scram_login(svc, session, "carol", "carol-pw", mechanism)).error_code == ErrorCode.none and session.principal == "User:carol"

    results, _ = await alter(svc, deletions=[alter_v0.ScramCredentialDeletion(name="carol", mechanism=SHA512)])
    assert results == [("carol", ErrorCode.none)]
    assert await describe(svc, ["carol"]) == [("carol", ErrorCode.none, [(SHA256, 8192)])]
    assert (await scram_login(svc, sasl_session(), "carol", "carol-pw", "SCRAM-SHA-512")).error_code == ErrorCode.sasl_authentication_failed


async def test_alter_refuses_as_kafka_does_and_applies_the_rest(store):
    svc = await services(store)
    version = svc.metadata.security_version()
    results, response = await alter(
        svc,
        deletions=[alter_v0.ScramCredentialDeletion(name="ghost", mechanism=SHA256), alter_v0.ScramCredentialDeletion(name="alice", mechanism=SHA512)],
        upsertions=[
            upsert("few", iterations=4095),
            upsert("many", iterations=16385),
            upsert(""),
            upsert("odd", mechanism=3),
            upsert("twice"),
            upsert("twice", password="other"),
            upsert("salty", salt=b"short"),
            upsert("erin", SHA256, 16384),
        ],
    )
    assert results == [
        ("ghost", ErrorCode.resource_not_found),
        ("alice", ErrorCode.none),
        ("few", ErrorCode.unacceptable_credential),
        ("many", ErrorCode.unacceptable_credential),
        ("", ErrorCode.unacceptable_credential),
        ("odd", ErrorCode.unsupported_sasl_mechanism),
        ("twice", ErrorCode.duplicate_resource),
        ("salty", ErrorCode.unacceptable_credential),
        ("erin", ErrorCode.none),
    ]
    messages = {r.user: r.error_message for r in response.results}
    assert (messages["few"], messages["many"], messages["alice"]) == ("Too few iterations: 4095 (at least 4096)", "Too many iterations: 16385 (at most 16384)", None)
    assert svc.metadata.security_version() == version + 1  # the accepted changes, in one write
    assert await describe(svc, None) == [("erin", ErrorCode.none, [(SHA256, 16384)])]


async def test_scram_admin_without_sasl_offered_and_behind_an_authorizer(store):
    svc = await services(store)
    plain_broker = SimpleNamespace(sasl=None, authorizer=None, metadata=svc.metadata)  # no SASL listener yet
    assert (await alter(plain_broker, upsertions=[upsert("frank")]))[0] == [("frank", ErrorCode.none)]
    assert [u for u, _, _ in await describe(svc, None)] == ["alice", "frank"]  # seen through the SASL store too
    guarded = SimpleNamespace(sasl=svc.sasl, authorizer=Authorizer(svc.metadata, ["User:admin"]), metadata=svc.metadata)  # no ACLs: only the super user
    assert (await alter(guarded, upsertions=[upsert("gina")]))[0] == [("gina", ErrorCode.cluster_authorization_failed)]
    response = await call(describe_user_scram_credentials, 50, 0, guarded, Session(), describe_v0.DescribeUserScramCredentialsRequest(users=None))
    assert (response.error_code, response.results) == (ErrorCode.cluster_authorization_failed, ())
    admin = Session(principal="User:admin")
    upserted = await call(alter_user_scram_credentials, 51, 0, guarded, admin, alter_v0.AlterUserScramCredentialsRequest(deletions=(), upsertions=(upsert("gina"),)))
    assert [(r.user, r.error_code) for r in upserted.results] == [("gina", ErrorCode.none)]


async def test_alter_of_many_users_goes_in_writes_the_store_takes(store):
    svc = await services(store)
    version = svc.metadata.security_version()
    names = [f"user-{i:03}" for i in range(120)]
    results, _ = await alter(svc, upsertions=[upsert(n, mechanism) for n in names for mechanism in (SHA256, SHA512)] + [upsert("x" * 2000)])
    assert results == [(n, ErrorCode.none) for n in names] + [("x" * 2000, ErrorCode.unacceptable_credential)]
    assert svc.metadata.security_version() == version + 3  # 50 users (100 keys) a write
    described = await describe(svc, None)
    assert [u for u, _, _ in described] == ["alice", *names]
    assert all(infos == [(SHA256, 4096), (SHA512, 4096)] for u, _, infos in described[1:])


def test_the_handlers_advertise_their_versions():
    handlers = load_handlers()
    assert [(k, handlers[k].name, handlers[k].min_version, handlers[k].max_version) for k in (17, 36, 50, 51)] == [
        (17, "SaslHandshake", 0, 1),
        (36, "SaslAuthenticate", 0, 2),
        (50, "DescribeUserScramCredentials", 0, 0),
        (51, "AlterUserScramCredentials", 0, 0),
    ]


@pytest.mark.integration
async def test_a_user_altered_through_one_broker_logs_in_on_another(etcd_server):
    root = f"scram-{uuid.uuid4().hex[:8]}"
    one, two = await open_etcd_store(etcd_server, root), await open_etcd_store(etcd_server, root)
    try:
        first = SimpleNamespace(sasl=None, authorizer=None, metadata=one)
        second = SimpleNamespace(sasl=SaslMechanisms(["SCRAM-SHA-512"], ScramCredentials(two)), authorizer=None, metadata=two)
        assert (await alter(first, upsertions=[upsert("hank", password="hank-pw")]))[0] == [("hank", ErrorCode.none)]
        await seen(two, "scram/", ["scram/SCRAM-SHA-512/hank"])
        session = sasl_session()
        assert (await scram_login(second, session, "hank", "hank-pw")).error_code == ErrorCode.none and session.principal == "User:hank"

        assert (await alter(second, deletions=[alter_v0.ScramCredentialDeletion(name="hank", mechanism=SHA512)]))[0] == [("hank", ErrorCode.none)]
        await seen(one, "scram/", [])
        assert await describe(first, ["hank"]) == [("hank", ErrorCode.resource_not_found, [])]
    finally:
        await one.close()
        await two.close()


FORGED = "mallory\x1fneve-relay@10.0.0.1\x1fUser:admin"  # a name that would read as another's through the relay mark


async def test_a_name_holding_a_control_character_is_refused_whatever_the_mechanism(store, tmp_path):
    """Issue 43, finding 2: an OAUTHBEARER token's subject, or a PLAIN user, holding the relay
    mark's separator authenticates no one (SCRAM's names refuse control characters already:
    SASLprep)."""
    from auth.sasl import JwtValidation
    from tests.auth.test_oauthbearer import initial_response, jwks, rsa_key, token

    key = rsa_key()
    (tmp_path / "jwks.json").write_text(jwks(key, "k1"))
    (tmp_path / "plain-users").write_text("mallory\x1fadmin:mallory-pw\nbob:bob-pw\n")  # the file's names hold no colon
    sasl = SaslMechanisms(["OAUTHBEARER", "PLAIN"], plain_users_file=str(tmp_path / "plain-users"), jwt=JwtValidation(jwks_file=str(tmp_path / "jwks.json")))
    svc = SimpleNamespace(sasl=sasl, authorizer=None, metadata=store)
    logins = [
        ("OAUTHBEARER", initial_response(token(key, sub=FORGED)), False),
        ("OAUTHBEARER", initial_response(token(key, sub="svc-orders")), True),
        ("PLAIN", b"\0mallory\x1fadmin\0mallory-pw", False),
        ("PLAIN", b"\0bob\0bob-pw", True),
    ]
    for mechanism, data, ok in logins:
        session = sasl_session()
        assert (await handshake(svc, session, mechanism)).error_code == ErrorCode.none
        answer = await authenticate(svc, session, data)
        assert (answer.error_code == ErrorCode.none, session.authenticated, session.close_after_reply) == (ok, ok, not ok), (mechanism, ok)
        if not ok:
            assert answer.error_message == "the authenticated name holds a control character"

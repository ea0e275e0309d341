"""Real clients on a secured `neve dev` node (tests/scenarios/secure_node.py: PLAINTEXT on
loopback, SASL_SSL with SCRAM-SHA-512/256, PLAIN and OAUTHBEARER, SSL requiring a client
certificate), each test on its own topics:
- the Java client, librdkafka, kafkajs and aiokafka each produce and consume exact records over
  SASL_SSL with SCRAM-SHA-512 and over SSL with a client certificate;
- librdkafka (its token callback) and Java (Kafka's OAuth login against a token endpoint) produce
  and consume over OAUTHBEARER with signed tokens;
- a wrong password, an expired token and an untrusted certificate each fail the way the client
  expects, and the node goes on serving the others."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.helpers import create_ssl_context
from confluent_kafka import KafkaError

from tests.clients import kafkajs_client
from tests.clients.java_client import JavaClientError
from tests.scenarios.secure_node import (
    WAIT_S,
    SecureNode,
    TokenEndpoint,
    rdkafka_consume,
    rdkafka_produce,
    rdkafka_refusal,
    start_secure_node,
)


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """One node for the module: its tests use their own topics, and the refusals leave it serving."""
    node = start_secure_node(tmp_path_factory.mktemp("secure-node"))
    yield node
    node.node.stop()


def values_of(name: str, count: int) -> list[bytes]:
    return [f"{name}-{i}".encode() for i in range(count)]


# -- librdkafka ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_librdkafka_produces_and_consumes_over_sasl_ssl(secure: SecureNode, mechanism):
    topic = f"rdkafka-{mechanism.lower()}"
    config = secure.rdkafka_sasl(mechanism)
    values = values_of(topic, 40)
    assert rdkafka_produce(config, topic, values) == [(0, i) for i in range(40)]
    assert rdkafka_consume(config, topic, 40) == values


def test_librdkafka_produces_and_consumes_with_a_client_certificate(secure: SecureNode):
    config = secure.rdkafka_mtls(secure.certs.client("carol"))
    values = values_of("rdkafka-mtls", 40)
    assert rdkafka_produce(config, "rdkafka-mtls", values) == [(0, i) for i in range(40)]
    assert rdkafka_consume(config, "rdkafka-mtls", 40) == values


def test_librdkafka_produces_and_consumes_with_signed_oauth_tokens(secure: SecureNode):
    asked: list[str] = []

    def token():
        asked.append("token")
        return secure.issuer.token("dave"), time.time() + 3600

    config = secure.rdkafka_oauth(token)
    values = values_of("rdkafka-oauth", 40)
    assert rdkafka_produce(config, "rdkafka-oauth", values) == [(0, i) for i in range(40)]
    assert rdkafka_consume(config, "rdkafka-oauth", 40) == values
    assert asked  # the tokens came from the callback
    dave = [e for e in secure.log_events("sasl_authenticated") if e["mechanism"] == "OAUTHBEARER"]
    assert dave and {e["principal"] for e in dave} == {"User:dave"}


# -- the Java client -------------------------------------------------------------------------------


def java_roundtrip(java_client, bootstrap: str, topic: str, config: dict[str, str], log_path) -> None:
    acks = java_client.produce(bootstrap, topic, 30, 1, config=config, log_path=log_path)
    assert sorted((a.partition, a.offset, a.seq) for a in acks) == [(0, i, i) for i in range(30)]
    consumed = java_client.consume(bootstrap, topic, 1, expect=30, config=config, log_path=log_path)
    assert consumed.end_offsets == {0: 30}
    assert [(r.partition, r.offset, r.value) for r in consumed.records] == [(0, i, str(i)) for i in range(30)]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
def test_java_produces_and_consumes_over_sasl_ssl_with_scram(secure: SecureNode, java_client, mechanism):
    topic = f"java-{mechanism.lower()}"
    java_roundtrip(java_client, secure.sasl_bootstrap, topic, secure.java_scram(mechanism=mechanism), secure.directory / f"{topic}.log")


def test_java_produces_and_consumes_with_a_client_certificate(secure: SecureNode, java_client):
    config = secure.java_mtls(secure.certs.client("erin"))
    java_roundtrip(java_client, secure.ssl_bootstrap, "java-mtls", config, secure.directory / "java-mtls.log")


def test_java_produces_and_consumes_with_tokens_from_a_token_endpoint(secure: SecureNode, java_client):
    endpoint = TokenEndpoint(secure.issuer)
    try:
        config = secure.java_oauth(endpoint, "frank")
        java_roundtrip(java_client, secure.sasl_bootstrap, "java-oauth", config, secure.directory / "java-oauth.log")
    finally:
        endpoint.close()
    assert endpoint.issued and set(endpoint.issued) == {"frank"}
    assert "User:frank" in {e["principal"] for e in secure.log_events("sasl_authenticated") if e["mechanism"] == "OAUTHBEARER"}


# -- kafkajs ---------------------------------------------------------------------------------------


def kafkajs_roundtrip(bootstrap: str, topic: str, security: dict, log_path) -> None:
    acks = kafkajs_client.produce(bootstrap, topic, 30, 1, chunk=10, security=security, log_path=log_path)
    assert sorted((a.partition, a.offset, a.seq) for a in acks) == [(0, i, i) for i in range(30)]
    read = kafkajs_client.consume_all(bootstrap, topic, security=security, log_path=log_path)
    assert read.end_offsets == {0: 30} and read.short == {}
    assert read.records == [(0, i, str(i).encode(), str(i).encode()) for i in range(30)]


def test_kafkajs_produces_and_consumes_over_sasl_ssl_with_scram(secure: SecureNode):
    kafkajs_roundtrip(secure.sasl_bootstrap, "kafkajs-scram", secure.kafkajs_scram(), secure.directory / "kafkajs-scram.log")


def test_kafkajs_produces_and_consumes_with_a_client_certificate(secure: SecureNode):
    security = secure.kafkajs_mtls(secure.certs.client("grace"))
    kafkajs_roundtrip(secure.ssl_bootstrap, "kafkajs-mtls", security, secure.directory / "kafkajs-mtls.log")


# -- aiokafka --------------------------------------------------------------------------------------


async def aiokafka_roundtrip(bootstrap: str, topic: str, values: list[bytes], security: dict) -> tuple[list[tuple[int, int]], list[bytes]]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, request_timeout_ms=30_000, **security)
    await producer.start()
    try:
        acked = []
        for value in values:
            meta = await (await producer.send(topic, value))
            acked.append((meta.partition, meta.offset))
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False, **security)
    await consumer.start()
    got: list[bytes] = []
    try:
        async with asyncio.timeout(WAIT_S):
            while len(got) < len(values):
                for records in (await consumer.getmany(timeout_ms=1000)).values():
                    got.extend(r.value for r in records)
    finally:
        await consumer.stop()
    return acked, got


def test_aiokafka_produces_and_consumes_over_sasl_ssl_with_scram(secure: SecureNode):
    security = {
        "security_protocol": "SASL_SSL",
        "ssl_context": secure.aiokafka_sasl_tls(),
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "bob",
        "sasl_plain_password": "bob-secret",
    }
    values = values_of("aiokafka-scram", 30)
    acked, got = asyncio.run(aiokafka_roundtrip(secure.sasl_bootstrap, "aiokafka-scram", values, security))
    assert acked == [(0, i) for i in range(30)]
    assert got == values


def test_aiokafka_produces_and_consumes_with_a_client_certificate(secure: SecureNode):
    cert, key = secure.certs.client("heidi")
    security = {"security_protocol": "SSL", "ssl_context": create_ssl_context(cafile=secure.certs.ca_file, certfile=cert, keyfile=key)}
    values = values_of("aiokafka-mtls", 30)
    acked, got = asyncio.run(aiokafka_roundtrip(secure.ssl_bootstrap, "aiokafka-mtls", values, security))
    assert acked == [(0, i) for i in range(30)]
    assert got == values


# -- refusals: each fails as its client expects, and the node goes on serving ---------------------


def still_served(secure: SecureNode, topic: str) -> None:
    """A good client produces on the node right after a refusal, and its record is there."""
    assert rdkafka_produce(secure.rdkafka_sasl("SCRAM-SHA-512", "bob"), topic, [b"still served"]) == [(0, 0)]


def test_a_wrong_password_fails_librdkafka_with_an_authentication_error(secure: SecureNode):
    error = rdkafka_refusal(secure.rdkafka_sasl("SCRAM-SHA-512", "alice", "not-her-password"), "refused-rdkafka-password")
    assert error.code() == KafkaError._AUTHENTICATION, error
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in error.str()
    failed = [e for e in secure.log_events("sasl_authentication_failed") if e["mechanism"] == "SCRAM-SHA-512"]
    assert failed
    still_served(secure, "after-rdkafka-password")


def test_a_wrong_password_fails_java_with_sasl_authentication_failed(secure: SecureNode, java_client):
    config = secure.java_scram("alice", "not-her-password") | {"max.block.ms": "30000"}
    with pytest.raises(JavaClientError) as caught:
        java_client.produce(secure.sasl_bootstrap, "refused-java-password", 1, 1, config=config, timeout=WAIT_S)
    assert "SaslAuthenticationException" in str(caught.value)
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in str(caught.value)
    still_served(secure, "after-java-password")


def test_an_expired_token_fails_librdkafka_with_an_authentication_error(secure: SecureNode):
    # expired an hour ago by its own claims (well past the broker's clock skew), while librdkafka
    # is told it is still good: librdkafka itself refuses to send a token it knows has expired
    config = secure.rdkafka_oauth(lambda: (secure.issuer.token("dave", lifetime_s=600, issued_ago_s=4200), time.time() + 3600))
    error = rdkafka_refusal(config, "refused-expired-token")
    assert error.code() == KafkaError._AUTHENTICATION, error
    assert "the token has expired" in error.str()
    still_served(secure, "after-expired-token")


@pytest.mark.parametrize("client", ["untrusted", "none"])
def test_an_untrusted_client_certificate_is_refused_at_the_handshake(secure: SecureNode, client):
    cert = secure.certs.foreign_client("mallory") if client == "untrusted" else None
    config = {"bootstrap.servers": secure.ssl_bootstrap, "security.protocol": "SSL", "ssl.ca.location": secure.certs.ca_file}
    if cert is not None:
        config |= {"ssl.certificate.location": cert[0], "ssl.key.location": cert[1]}
    error = rdkafka_refusal(config, f"refused-{client}-certificate")
    # the broker ends the handshake: librdkafka logs the SSL connection closed by its peer and tells
    # the application its brokers are down (2.16; older versions said the transport failed)
    assert error.code() in (KafkaError._TRANSPORT, KafkaError._SSL, KafkaError._ALL_BROKERS_DOWN), error
    still_served(secure, f"after-{client}-certificate")
    # and on the same listener, a certificate of the deployment's authority still gets in
    assert rdkafka_produce(secure.rdkafka_mtls(secure.certs.client("carol")), f"after-{client}-certificate", [b"mtls"]) == [(0, 1)]


def test_a_sasl_ssl_client_needs_no_client_certificate(secure: SecureNode):
    """Kafka asks for client certificates (ssl.client.auth) on SSL listeners only: a SASL_SSL
    client authenticates by SASL alone."""
    config = secure.rdkafka_sasl("SCRAM-SHA-512", "bob")
    assert "ssl.certificate.location" not in config
    assert rdkafka_produce(config, "sasl-without-certificate", [b"by SASL alone"]) == [(0, 0)]

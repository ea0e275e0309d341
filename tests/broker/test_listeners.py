"""Listeners and TLS, on `neve dev` with confluent-kafka (librdkafka):
- listeners are read as Kafka writes them, and settings that would expose a broker by mistake
  (PLAINTEXT off loopback, TLS without a certificate) stop it at start with a clear message;
- a broker with a PLAINTEXT and an SSL listener asking for client certificates serves both: a
  client with a certificate the deployment's authority issued produces and consumes over SSL, and
  each listener's Metadata names the brokers on that listener's advertised address;
- an untrusted certificate, or none, is refused at the handshake and the broker keeps serving;
- a renewed certificate is used for new connections without a restart."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic, ResourcePatternType, ResourceType

from auth.tls import MappingRule, map_subject, parse_mapping_rules
from broker.config import BrokerConfig
from broker.listeners import ListenerError, check_listeners, listeners_of
from tests.fixtures import Certificates, free_port
from tests.scenarios.secure_node import rdkafka_consume as consume
from tests.scenarios.secure_node import rdkafka_produce as produce

WAIT_S = 120


def test_listeners_are_read_as_kafka_writes_them():
    settings = BrokerConfig(
        listeners="SASL_SSL://0.0.0.0:9093,INTERNAL://10.0.0.5:9094,PLAINTEXT://127.0.0.1:0",
        advertised_listeners="SASL_SSL://kafka.example.com:443",
        listener_security_protocol_map="INTERNAL:SSL",
        advertised_host="broker-1.internal",
    )
    got = [(item.name, item.protocol, item.host, item.port, item.advertised_host, item.advertised_port) for item in listeners_of(settings)]
    assert got == [
        ("SASL_SSL", "SASL_SSL", "0.0.0.0", 9093, "kafka.example.com", 443),
        ("INTERNAL", "SSL", "10.0.0.5", 9094, "broker-1.internal", 0),
        ("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 0, "broker-1.internal", 0),
    ]
    # no listeners: one PLAINTEXT listener on host:port, as before listeners existed
    assert [(item.name, item.host, item.port, item.advertised_host) for item in listeners_of(BrokerConfig(port=9200))] == [("PLAINTEXT", "127.0.0.1", 9200, "127.0.0.1")]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (BrokerConfig(host="0.0.0.0"), "PLAINTEXT (no authentication, no encryption) on 0.0.0.0"),
        (BrokerConfig(listeners="PLAINTEXT://:9092"), "NEVE_BROKER_ALLOW_INSECURE_LISTENERS"),
        (BrokerConfig(listeners="SSL://127.0.0.1:9093"), "set broker.ssl_certfile and broker.ssl_keyfile"),
        (BrokerConfig(listeners="SASL_SSL://127.0.0.1:9093", ssl_certfile="c", ssl_keyfile="k", sasl_enabled_mechanisms=""), "sasl_enabled_mechanisms is empty"),
        (BrokerConfig(listeners="INTERNAL://127.0.0.1:9093"), "not a security protocol"),
        (BrokerConfig(listeners="PLAINTEXT://127.0.0.1:9093", advertised_listeners="SSL://x:1"), "name no listener: SSL"),
        (BrokerConfig(listeners="PLAINTEXT//127.0.0.1:9093"), "is not NAME://host:port"),
        (BrokerConfig(inter_broker_listener_name="INTERNAL"), "inter broker listener INTERNAL: no such listener"),
    ],
)
def test_settings_that_would_expose_a_broker_by_mistake_are_refused(settings, message):
    with pytest.raises(ListenerError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_listeners(listeners_of(settings), settings)
    # said explicitly, a PLAINTEXT listener off loopback is accepted
    check_listeners(listeners_of(BrokerConfig(host="0.0.0.0", allow_insecure_listeners=True)), BrokerConfig(allow_insecure_listeners=True))
    check_listeners(listeners_of(BrokerConfig(host="0.0.0.0")), BrokerConfig(), cluster=False)  # `neve dev` in a container


def test_a_certificate_subject_names_its_user_through_the_mapping_rules():
    rules = parse_mapping_rules(r"RULE:^CN=(.*?),OU=ops,.*$/$1-admin/U, RULE:^CN=([^,]*),OU=(.*?),.*$/$1@$2/L, DEFAULT")
    assert map_subject("CN=alice,OU=ops,O=acme", rules) == "ALICE-ADMIN"
    assert map_subject("CN=Bob,OU=Eng,O=acme", rules) == "bob@eng"
    assert map_subject("O=acme", rules) == "O=acme"  # DEFAULT: the whole name
    assert map_subject("CN=carol", [MappingRule(parse_mapping_rules("RULE:^CN=x$/y/")[0].pattern, "y")]) is None  # no rule matched
    assert parse_mapping_rules("") == [MappingRule(None)]


def test_a_certificate_subject_holding_a_control_character_names_no_one():
    """Issue 43, finding 2: a client certificate whose subject holds the relay mark's separator (a
    name that read as another principal through a relayed group request) is refused as an
    unmapped one is."""
    import datetime
    from types import SimpleNamespace

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from broker.connection import _session
    from broker.listeners import Listener

    def session_of(common_name: str):
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.UTC)
        cert = x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key()).serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256())
        der = cert.public_bytes(serialization.Encoding.DER)
        ssl_object = SimpleNamespace(getpeercert=lambda binary_form: der)
        stream = SimpleNamespace(peer=("127.0.0.1", 5555), transport=SimpleNamespace(get_extra_info=lambda what: ssl_object if what == "ssl_object" else None))
        return _session(stream, Listener("SSL", "SSL", "127.0.0.1", 9093, "127.0.0.1"), [MappingRule(None)])

    assert session_of("mallory").principal == "User:CN=mallory"
    assert session_of("mallory\x1fneve-relay@10.0.0.1\x1fUser:alice").principal is None  # the connection is refused


def test_a_plaintext_listener_off_loopback_stops_a_cluster_broker_at_start(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "neve", "broker", "--port", str(free_port())],
        env={
            "PATH": "/usr/bin:/bin",
            "NEVE_METADATA_URL": f"sqlite://{tmp_path / 'data' / 'metadata.db'}",
            "NEVE_WAL_OBJECT_STORE": f"file://{tmp_path / 'data' / 'objects'}",
            "NEVE_BROKER_HOST": "0.0.0.0",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "PLAINTEXT (no authentication, no encryption) on 0.0.0.0, not loopback" in done.stderr
    assert not (tmp_path / "data" / "metadata.db").exists()  # refused before anything started


@pytest.fixture
def tls_node(neve_factory, tmp_path):
    certs = Certificates(tmp_path / "certs")
    ssl_port = free_port()
    env = {
        "NEVE_BROKER_LISTENERS": f"PLAINTEXT://127.0.0.1:{{port}},SSL://127.0.0.1:{ssl_port}",
        "NEVE_BROKER_ADVERTISED_LISTENERS": f"SSL://localhost:{ssl_port}",
        "NEVE_BROKER_SSL_CERTFILE": certs.server_cert,
        "NEVE_BROKER_SSL_KEYFILE": certs.server_key,
        "NEVE_BROKER_SSL_CAFILE": certs.ca_file,
        "NEVE_BROKER_SSL_CLIENT_AUTH": "required",
    }
    node = neve_factory(env=env)
    return node, certs, ssl_port


def ssl_config(certs: Certificates, port: int, client: tuple[str, str] | None, **more) -> dict:
    config = {"bootstrap.servers": f"localhost:{port}", "security.protocol": "SSL", "ssl.ca.location": certs.ca_file, **more}
    if client is not None:
        config |= {"ssl.certificate.location": client[0], "ssl.key.location": client[1]}
    return config


def refused(config: dict) -> str:
    """What a client that cannot complete the TLS handshake is told (it never gets Metadata)."""
    with pytest.raises(KafkaException) as caught:
        AdminClient({**config, "socket.timeout.ms": 5000}).list_topics(timeout=10)
    return str(caught.value)


def test_a_client_certificate_from_the_deployments_authority_produces_and_consumes_over_ssl(tls_node):
    node, certs, ssl_port = tls_node
    alice = ssl_config(certs, ssl_port, certs.client("alice"))
    values = [f"tls-{i}".encode() for i in range(50)]
    acked = produce(alice, "over-tls", values)
    assert sorted(acked) == [(0, i) for i in range(50)]
    assert consume(alice, "over-tls", 50) == values
    # each listener names the brokers on its own advertised address
    over_ssl = AdminClient(alice).list_topics(timeout=30)
    assert [(b.host, b.port) for b in over_ssl.brokers.values()] == [("localhost", ssl_port)]
    plain = AdminClient({"bootstrap.servers": node.bootstrap}).list_topics(timeout=30)
    assert [(b.host, b.port) for b in plain.brokers.values()] == [("127.0.0.1", node.port)]
    assert consume({"bootstrap.servers": node.bootstrap}, "over-tls", 50) == values  # one log, both listeners


def test_an_untrusted_certificate_or_none_is_refused_and_the_broker_keeps_serving(tls_node):
    node, certs, ssl_port = tls_node
    for bad in (certs.foreign_client("mallory"), None):
        message = refused(ssl_config(certs, ssl_port, bad))
        assert "Timed out" in message or "TRANSPORT" in message or "SSL" in message, message
    # a client that does not trust the broker's authority is refused on its side
    stranger = {"bootstrap.servers": f"localhost:{ssl_port}", "security.protocol": "SSL", "ssl.ca.location": certs.foreign_client("x")[0]}
    refused(stranger)
    # the others still work, over both listeners
    assert produce(ssl_config(certs, ssl_port, certs.client("alice")), "after-refusals", [b"a", b"b"]) == [(0, 0), (0, 1)]
    assert produce({"bootstrap.servers": node.bootstrap}, "after-refusals", [b"c"]) == [(0, 2)]


def test_a_renewed_certificate_serves_new_connections_without_a_restart(tls_node, tmp_path):
    node, certs, ssl_port = tls_node
    alice = certs.client("alice")
    assert produce(ssl_config(certs, ssl_port, alice), "renewed", [b"before"]) == [(0, 0)]
    renewed = Certificates(tmp_path / "renewed")  # a new authority: only a renewed server certificate satisfies its clients
    for old, new in ((certs.server_cert, renewed.server_cert), (certs.server_key, renewed.server_key), (certs.ca_file, renewed.ca_file)):
        Path(old).write_bytes(Path(new).read_bytes())  # the authority too: client certificates are now checked against the new one
    new_client = ssl_config(renewed, ssl_port, renewed.client("alice"))
    deadline = time.monotonic() + WAIT_S
    while True:  # the broker looks at the files every few seconds; each try is a new connection
        try:
            AdminClient({**new_client, "socket.timeout.ms": 5000}).list_topics(timeout=10)
            break
        except KafkaException:
            assert time.monotonic() < deadline, "the renewed certificate was not used"
    assert produce(new_client, "renewed", [b"after"]) == [(0, 1)]
    assert consume(new_client, "renewed", 2) == [b"before", b"after"]


def test_a_client_certificate_names_the_principal_the_acls_are_checked_against(neve_factory, tmp_path):
    """ssl_principal_mapping_rules make `CN=alice,OU=clients,...` the user `alice`; with the
    authorizer on, alice may write where an ACL lets her, bob (another certificate) may not, and
    the admin (a super user, by its certificate) manages the ACLs."""
    certs = Certificates(tmp_path / "certs")
    ssl_port = free_port()
    node = neve_factory(
        env={
            "NEVE_BROKER_LISTENERS": f"PLAINTEXT://127.0.0.1:{{port}},SSL://127.0.0.1:{ssl_port}",
            "NEVE_BROKER_ADVERTISED_LISTENERS": f"SSL://localhost:{ssl_port}",
            "NEVE_BROKER_SSL_CERTFILE": certs.server_cert,
            "NEVE_BROKER_SSL_KEYFILE": certs.server_key,
            "NEVE_BROKER_SSL_CAFILE": certs.ca_file,
            "NEVE_BROKER_SSL_CLIENT_AUTH": "required",
            "NEVE_BROKER_SSL_PRINCIPAL_MAPPING_RULES": "RULE:^CN=([^,]+),OU=clients,.*$/$1/L",
            "NEVE_BROKER_AUTHORIZER_ENABLED": "true",
            "NEVE_BROKER_SUPER_USERS": "User:admin;User:ANONYMOUS",  # the PLAINTEXT listener is the test's own
            "NEVE_BROKER_AUTO_CREATE_TOPICS": "false",
        }
    )
    plain = AdminClient({"bootstrap.servers": node.bootstrap})
    for topic in ("alice-topic", "other-topic"):
        plain.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
    admin = AdminClient(ssl_config(certs, ssl_port, certs.client("Admin")))
    binding = AclBinding(ResourceType.TOPIC, "alice-", ResourcePatternType.PREFIXED, "User:alice", "*", AclOperation.WRITE, AclPermissionType.ALLOW)
    admin.create_acls([binding])[binding].result(60)

    alice = ssl_config(certs, ssl_port, certs.client("Alice"))
    assert produce(alice, "alice-topic", [b"a0", b"a1"]) == [(0, 0), (0, 1)]
    for who, topic in (("alice", "other-topic"), ("bob", "alice-topic")):
        config = ssl_config(certs, ssl_port, certs.client(who))
        producer = Producer({**config, "acks": "all", "message.timeout.ms": 30_000})
        errors: list = []
        producer.produce(topic, b"x", on_delivery=lambda err, msg, errors=errors: errors.append(err))
        producer.flush(WAIT_S)
        assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED], (who, topic, errors)
    assert consume({"bootstrap.servers": node.bootstrap}, "alice-topic", 2) == [b"a0", b"a1"]

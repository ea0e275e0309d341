"""deploy/compose/compose.secure.yaml (over compose.yaml) and `make certs` checked offline: the
generator writes a CA, a server certificate naming every address a client is told, a client
certificate, the chunk secret and the SCRAM users, and keeps them when run again; the merged
file validates with `docker compose config -q`; every neve setting in it is one `neve config`
prints and loads; every broker listener is SASL_SSL with its TLS files loading (certificate
and key matching, as the broker loads them) and the inter-broker user a super user among those
the users file creates; the authorizer is on, closed by default; no insecure flag is left on;
the chunk port would start off loopback with the generated secret and mutual TLS; and the
registry has its certificate and users (test_compose_runs.py runs the variant for real)."""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from tests.deploy.compose import COMPOSE_FILE, SECURE_FILE, compose_args, dev_certs, is_neve, neve_env_names, resolved
from tests.deploy.tools import run

BROKERS = ("broker-a1", "broker-a2", "broker-b1")
CERTS_MOUNT = "/etc/neve/certs"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    return directory, dev_certs(directory)


@pytest.fixture(scope="module")
def model(certs):
    return resolved(COMPOSE_FILE, SECURE_FILE, variables=certs[1])


def local_env(spec: dict) -> dict[str, str]:
    """A service's environment with its bind-mounted files' paths made the host's."""
    mounts = {m["target"]: m["source"] for m in spec.get("volumes", ()) if m["type"] == "bind"}
    env = {}
    for key, value in (spec.get("environment") or {}).items():
        for target, source in mounts.items():
            if value.startswith(target + "/"):
                value = source + value[len(target) :]
        env[key] = value
    return env


def test_make_certs_writes_a_ca_its_certificates_and_secrets_and_keeps_them(tmp_path):
    dev_certs(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) >= {"ca.crt", "server.crt", "server.key", "client.crt", "client.key", "chunk-secret", "scram-users", "registry-users", "broker.env", "admin.password", "broker.password"}
    ca = x509.load_pem_x509_certificate(before["ca.crt"])
    for name in ("server", "client"):
        cert = x509.load_pem_x509_certificate(before[f"{name}.crt"])
        cert.verify_directly_issued_by(ca)  # raises unless the CA signed it
        ssl.create_default_context().load_cert_chain(tmp_path / f"{name}.crt", tmp_path / f"{name}.key")  # the key is the certificate's
    server = x509.load_pem_x509_certificate(before["server.crt"]).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(server.get_values_for_type(x509.DNSName)) >= {*BROKERS, "registry", "localhost"}
    assert ipaddress.ip_address("127.0.0.1") in server.get_values_for_type(x509.IPAddress)
    admin, broker = before["admin.password"].decode().strip(), before["broker.password"].decode().strip()
    assert len({admin, broker}) == 2 and min(len(admin), len(broker)) >= 24
    assert before["scram-users"].decode().splitlines() == [f"admin:{admin}", f"neve-broker:{broker}"]
    assert f"NEVE_BROKER_INTER_BROKER_SASL_PASSWORD={broker}" in before["broker.env"].decode().splitlines()
    assert before["registry-users"].decode().splitlines() == [f"admin: {admin},admin"]
    assert len(before["chunk-secret"].strip()) >= 32
    other = tmp_path / "other"
    dev_certs(other)
    assert (other / "admin.password").read_bytes() != before["admin.password"]  # random, not fixed
    dev_certs(tmp_path)  # again: a running cluster's passwords and certificates stay as they are
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != "other"} == before


def test_docker_compose_config_validates_the_secure_variant(certs):
    done = run([*compose_args(COMPOSE_FILE, SECURE_FILE), "config", "-q"], env={"PATH": "/usr/bin:/bin", **certs[1]})
    assert done.returncode == 0, done.stderr


def test_every_neve_setting_is_known_and_loads(model):
    from neve.config import load_config

    known = neve_env_names()
    neve_services = {n: s for n, s in model["services"].items() if is_neve(s)}
    assert set(neve_services) == {*BROKERS, "registry", "compactor"}
    for name, spec in neve_services.items():
        used = {k for k in spec["environment"] if k.startswith("NEVE_")}
        assert used <= known, f"{name}: {used - known} are not neve settings"
        load_config(env=local_env(spec))


def test_brokers_listen_sasl_ssl_only_with_the_authorizer_on(model):
    from auth.tls import ReloadingServerContext, TlsFiles
    from broker.listeners import check_listeners, listeners_of
    from neve.config import load_config

    for name in BROKERS:
        spec = model["services"][name]
        env = local_env(spec)
        assert not {"NEVE_BROKER_ALLOW_INSECURE_LISTENERS", "NEVE_CACHE_PEER_INSECURE"} & set(env), name
        b = load_config(env=env).broker
        listeners = listeners_of(b)
        check_listeners(listeners, b, cluster=True)  # what a cluster broker refuses to start with
        assert [(item.name, item.protocol, item.host) for item in listeners] == [("CLIENT", "SASL_SSL", "0.0.0.0"), ("INTERNAL", "SASL_SSL", "0.0.0.0")]
        published = {int(p["target"]) for p in spec["ports"]}
        exposed = {int(p) for p in spec["expose"]}
        assert {listeners[0].port} == published and listeners[1].port in exposed  # clients on the host's port; brokers among themselves
        assert all(item.advertised_host == name for item in listeners)
        assert b.inter_broker_listener_name == "INTERNAL" and "SCRAM-SHA-512" in b.sasl_enabled_mechanisms.split(",")
        ReloadingServerContext(TlsFiles(b.ssl_certfile, b.ssl_keyfile, b.ssl_cafile, b.ssl_client_auth))  # raises TlsError if they do not load
        sans = x509.load_pem_x509_certificate(Path(b.ssl_certfile).read_bytes()).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert name in sans.get_values_for_type(x509.DNSName)  # clients check the name they are told
        assert b.authorizer_enabled and not b.allow_everyone_if_no_acl_found
        supers = set(b.super_users.split(";"))
        users = dict(line.split(":", 1) for line in Path(b.sasl_scram_users_file).read_text().splitlines())
        assert supers == {"User:admin", f"User:{b.inter_broker_sasl_username}"} and b.inter_broker_sasl_username == "neve-broker"
        assert users == {"admin": users["admin"], "neve-broker": b.inter_broker_sasl_password}


def test_the_chunk_port_has_the_secret_and_mutual_tls(model):
    from cache.peerauth import check_chunk_port, load_peer_secret, peer_tls
    from neve.config import load_config

    secrets = set()
    for name in (*BROKERS, "compactor"):
        cache = load_config(env=local_env(model["services"][name])).cache
        secret = load_peer_secret(cache)
        assert secret is not None and not cache.peer_insecure
        check_chunk_port("0.0.0.0", cache, secret)  # raises PeerSecurityError for an open port off loopback
        assert peer_tls(cache) is not None
        secrets.add(secret)
    assert len(secrets) == 1  # one deployment, one secret


def test_the_registry_serves_https_to_its_users(model):
    from neve.config import load_config

    registry = load_config(env=local_env(model["services"]["registry"])).registry
    ssl.create_default_context().load_cert_chain(registry.tls_cert_file, registry.tls_key_file)  # the key is the certificate's
    sans = x509.load_pem_x509_certificate(Path(registry.tls_cert_file).read_bytes()).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "registry" in sans.get_values_for_type(x509.DNSName)
    users = dict(line.split(": ", 1) for line in Path(registry.users_file).read_text().splitlines())
    assert set(users) == {"admin"} and users["admin"].endswith(",admin") and registry.anonymous in ("", "none")

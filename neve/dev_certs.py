"""Development credentials for the secure compose variant (`make certs`): a CA, a server
certificate for the brokers, registry and compactor (the compose service names, localhost and
127.0.0.1), a client certificate, the chunk port's shared secret, the SCRAM users and the
schema registry's users, with random passwords. Written into one directory (deploy/certs/, gitignored); nothing here is ever
committed or meant for production, where certificates come from cert-manager or the
organisation's CA and secrets from a secret store.

    python -m neve.dev_certs [DIR]    (`make certs`: DIR deploy/certs)

Files already there are kept, so running it again does not change the passwords a running
cluster already stored; delete the directory to start over. Every file is readable by other
users: the containers' own user (uid 10001) reads them through a bind mount."""

from __future__ import annotations

import datetime
import ipaddress
import secrets
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_DIR = Path("deploy") / "certs"
# every name a neve service is reached by in compose, and on the host
SERVER_NAMES = ("broker-a1", "broker-a2", "broker-b1", "registry", "compactor", "localhost")
SERVER_ADDRESSES = ("127.0.0.1", "::1")
ADMIN_USER = "admin"  # the first administrator: a super user
BROKER_USER = "neve-broker"  # the brokers' own user between each other: a super user
CLIENT_CN = ADMIN_USER  # the client certificate's subject: the admin, for mTLS
VALID_DAYS = 365


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "neve development"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # a container's clock a little behind
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def make_ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    name = _name("neve development CA")
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_leaf(ca_key, ca_cert: x509.Certificate, common_name: str, names: tuple[str, ...] = (), addresses: tuple[str, ...] = (), server: bool = True) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A certificate signed by the CA: for servers (`names` and `addresses` as its SANs; also
    usable as a client, for the brokers between each other and the chunk port's mutual TLS) or
    for a client only."""
    key = _key()
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        _builder(_name(common_name), ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    sans = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o644)


def generate(directory: Path) -> list[str]:
    """Write what is missing into `directory`; the names of the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    written: list[str] = []

    def put(name: str, data: bytes) -> None:
        _write(directory / name, data)
        written.append(name)

    ca_key_path, ca_path = directory / "ca.key", directory / "ca.crt"
    if ca_key_path.exists() and ca_path.exists():
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(ca_path.read_bytes())
        renew = False
    else:
        ca_key, ca_cert = make_ca()
        put("ca.key", pem_key(ca_key))
        put("ca.crt", pem_cert(ca_cert))
        renew = True  # certificates of another CA are of no use any more
    for stem, common_name, names, addresses, server in (
        ("server", "neve", SERVER_NAMES, SERVER_ADDRESSES, True),
        ("client", CLIENT_CN, (), (), False),
    ):
        if renew or not (directory / f"{stem}.crt").exists() or not (directory / f"{stem}.key").exists():
            key, cert = make_leaf(ca_key, ca_cert, common_name, names, addresses, server)
            put(f"{stem}.key", pem_key(key))
            put(f"{stem}.crt", pem_cert(cert))

    def secret(name: str, value: str) -> str:
        path = directory / name
        if not path.exists():
            put(name, value.encode() + b"\n")
        return path.read_text().strip()

    secret("chunk-secret", secrets.token_hex(32))
    admin = secret("admin.password", secrets.token_urlsafe(24))
    broker = secret("broker.password", secrets.token_urlsafe(24))
    # the SCRAM users the brokers create at start (broker.sasl_scram_users_file), and the
    # broker's own password as a variable for compose's env_file
    if not (directory / "scram-users").exists():
        put("scram-users", f"{ADMIN_USER}:{admin}\n{BROKER_USER}:{broker}\n".encode())
    # the schema registry's users (registry.users_file, Jetty's format): the admin with every role
    if not (directory / "registry-users").exists():
        put("registry-users", f"{ADMIN_USER}: {admin},admin\n".encode())
    if not (directory / "broker.env").exists():
        put("broker.env", f"NEVE_BROKER_INTER_BROKER_SASL_USERNAME={BROKER_USER}\nNEVE_BROKER_INTER_BROKER_SASL_PASSWORD={broker}\n".encode())
    # the admin's client settings as librdkafka names them (kcat -F client.properties)
    put("client.properties", f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username={ADMIN_USER}\nsasl.password={admin}\nssl.ca.location={(directory / 'ca.crt').resolve()}\n".encode())
    return written


def main(argv: list[str]) -> int:
    directory = Path(argv[0]) if argv else DEFAULT_DIR
    written = generate(directory)
    print(f"{directory}: {', '.join(written) if written else 'nothing to add'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

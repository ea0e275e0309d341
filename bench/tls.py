"""Development certificates for a benchmark run: an authority and a broker certificate for
127.0.0.1 and localhost it issued, written as PEM files into the run's own directory (made fresh
each run, never committed). Made with `cryptography`, which neve already depends on."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

VALID_FOR = datetime.timedelta(days=2)
# x509.KeyUsage's flags besides the two an authority needs (key_cert_sign, crl_sign)
KEY_USAGES = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement", "encipher_only", "decipher_only")


@dataclass(frozen=True)
class DevCertificates:
    ca_file: str  # what clients trust (librdkafka's ssl.ca.location)
    cert_file: str  # the broker's certificate chain (NEVE_BROKER_SSL_CERTFILE)
    key_file: str  # its key (NEVE_BROKER_SSL_KEYFILE)


def make_certificates(directory: Path) -> DevCertificates:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "neve bench"), x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def builder(subject: x509.Name, issuer: x509.Name, key) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID_FOR)
        )

    # P-256 keys: the handshake is cheap; the record layer's cipher costs the same whatever the key
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("neve bench authority")
    ca = (
        builder(ca_name, ca_name, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(**dict.fromkeys(KEY_USAGES, False), key_cert_sign=True, crl_sign=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        builder(name("broker"), ca_name, key)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_file, cert_file, key_file = directory / "ca.pem", directory / "broker.pem", directory / "broker.key"
    ca_file.write_bytes(ca.public_bytes(pem))
    cert_file.write_bytes(leaf.public_bytes(pem) + ca.public_bytes(pem))
    key_file.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    key_file.chmod(0o600)
    return DevCertificates(str(ca_file), str(cert_file), str(key_file))

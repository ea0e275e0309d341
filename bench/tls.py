"""Development certificates for a benchmark run: an authority and a broker certificate for
127.0.0.1 and localhost it issued (`make certs`' generator, neve/dev_certs.py), written as PEM
files into the run's own directory (made fresh each run, never committed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DevCertificates:
    ca_file: str  # what clients trust (librdkafka's ssl.ca.location)
    cert_file: str  # the broker's certificate chain (NEVE_BROKER_SSL_CERTFILE)
    key_file: str  # its key (NEVE_BROKER_SSL_KEYFILE)


def make_certificates(directory: Path) -> DevCertificates:
    from neve.dev_certs import make_ca, make_leaf, pem_cert, pem_key

    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca = make_ca()
    key, leaf = make_leaf(ca_key, ca, "broker", names=("localhost",), addresses=("127.0.0.1",))
    ca_file, cert_file, key_file = directory / "ca.pem", directory / "broker.pem", directory / "broker.key"
    ca_file.write_bytes(pem_cert(ca))
    cert_file.write_bytes(pem_cert(leaf) + pem_cert(ca))
    key_file.write_bytes(pem_key(key))
    key_file.chmod(0o600)
    return DevCertificates(str(ca_file), str(cert_file), str(key_file))

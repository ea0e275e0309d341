"""TLS contexts for the registry's HTTPS, from PEM files, with the standard library's ssl. Loading
reads files: build them off the event loop."""

from __future__ import annotations

import ssl


def server_context(cert_file: str, key_file: str, client_ca_file: str = "") -> ssl.SSLContext:
    """Serves `cert_file`'s certificate (and chain); with `client_ca_file`, every client presents
    a certificate signed by one of its CAs."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        context.load_verify_locations(cafile=client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca_file: str = "") -> ssl.SSLContext:
    """Verifies the server's certificate and host name against `ca_file`'s CAs (the system's when empty)."""
    context = ssl.create_default_context(cafile=ca_file or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context

"""TLS for the Kafka listeners (and anything else that serves or dials with the deployment's
certificates): server contexts that pick up renewed certificate files without a restart, client
contexts, and the principal a client certificate names.

A renewed certificate (cert-manager rewriting a mounted Secret) is loaded into a new context; the
listener's context hands each new connection to the newest one from its SNI callback, so
connections made after the files changed use them and those already open keep theirs."""

from __future__ import annotations

import logging
import os
import re
import ssl
import time
from dataclasses import dataclass

from cryptography import x509

log = logging.getLogger("neve.auth.tls")

CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
RELOAD_CHECK_S = 5.0  # how often a handshake looks at the files' modification times, at most


class TlsError(ValueError):
    """A TLS setting that cannot be used (a missing file, a key that does not match)."""


@dataclass(frozen=True)
class TlsFiles:
    certfile: str
    keyfile: str
    cafile: str = ""  # the authorities client certificates are checked against (mTLS)
    client_auth: str = "none"  # none | requested | required (Kafka's ssl.client.auth)
    password: str = ""  # of the key file, if it is encrypted

    def stamp(self) -> tuple[float, ...]:
        return tuple(os.stat(p).st_mtime_ns if p and os.path.exists(p) else 0 for p in (self.certfile, self.keyfile, self.cafile))


def _server_context(files: TlsFiles) -> ssl.SSLContext:
    if files.client_auth not in CLIENT_AUTH:
        raise TlsError(f"ssl client auth {files.client_auth!r}: one of {', '.join(CLIENT_AUTH)}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(files.certfile, files.keyfile, password=files.password or None)
        if files.cafile:
            ctx.load_verify_locations(files.cafile)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"TLS certificate {files.certfile}, key {files.keyfile}, CA {files.cafile or '-'}: {e}") from None
    if files.client_auth != "none" and not files.cafile:
        raise TlsError("client certificates are asked for (ssl client auth) but no CA file checks them")
    ctx.verify_mode = CLIENT_AUTH[files.client_auth]
    return ctx


class ReloadingServerContext:
    """A server SSLContext whose certificate, key and CA follow their files. `context` is what
    the listener is given; each handshake's SNI callback moves the connection onto the newest
    context, reloaded when the files changed (looked at every RELOAD_CHECK_S at most). A reload
    that fails (a half-written file) keeps the previous context and is retried."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._current = _server_context(files)
        self._stamp = files.stamp()
        self._checked = time.monotonic()
        self.reloads = 0
        self.context = _server_context(files)
        self.context.sni_callback = self._on_hello

    def _on_hello(self, sslobj: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        self.maybe_reload()
        sslobj.context = self._current
        return None

    def maybe_reload(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < RELOAD_CHECK_S:
            return
        self._checked = now
        stamp = self.files.stamp()
        if stamp == self._stamp:
            return
        try:
            self._current = _server_context(self.files)
        except TlsError as e:
            log.warning("tls_reload_failed", extra={"reason": str(e)})
            return
        self._stamp = stamp
        self.reloads += 1
        log.info("tls_reloaded", extra={"certfile": self.files.certfile})


def client_context(cafile: str = "", certfile: str = "", keyfile: str = "", check_hostname: bool = True) -> ssl.SSLContext:
    """A context to dial a TLS listener: the server checked against `cafile` (the system's
    authorities when empty), presenting a client certificate when one is given."""
    ctx = ssl.create_default_context(cafile=cafile or None)
    ctx.check_hostname = check_hostname
    if certfile:
        ctx.load_cert_chain(certfile, keyfile or None)
    return ctx


# -- principals from client certificates ----------------------------------------------------------

_RULE = re.compile(r"RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU]?)")


@dataclass(frozen=True)
class MappingRule:
    pattern: re.Pattern | None  # None: DEFAULT, the whole distinguished name
    replacement: str = ""
    case: str = ""  # "L" lower, "U" upper, "" as is


def parse_mapping_rules(text: str) -> list[MappingRule]:
    """Kafka's ssl.principal.mapping.rules: `RULE:<regex>/<replacement>/[L|U]` items and `DEFAULT`,
    separated by commas or newlines, tried in order; the first whose regex matches the whole
    distinguished name (RFC 2253 form, e.g. `CN=alice,OU=eng,O=acme`) names the user."""
    rules: list[MappingRule] = []
    rest = text.strip() or "DEFAULT"
    while rest:
        rest = rest.lstrip(" ,\n\t")
        if not rest:
            break
        if rest.startswith("DEFAULT"):
            rules.append(MappingRule(None))
            rest = rest[len("DEFAULT") :]
            continue
        m = _RULE.match(rest)
        if m is None:
            raise TlsError(f"ssl principal mapping rules: cannot read {rest[:60]!r} (RULE:regex/replacement/[L|U] or DEFAULT)")
        try:
            pattern = re.compile(m.group(1).replace("\\/", "/"))
        except re.error as e:
            raise TlsError(f"ssl principal mapping rule {m.group(0)!r}: {e}") from None
        rules.append(MappingRule(pattern, m.group(2).replace("\\/", "/"), m.group(3)))
        rest = rest[m.end() :]
    return rules


def certificate_subject(der: bytes) -> str:
    """The subject of a DER certificate as an RFC 2253 distinguished name (as Java's X500Principal
    names it: most specific first)."""
    return x509.load_der_x509_certificate(der).subject.rfc4514_string()


def map_subject(subject: str, rules: list[MappingRule]) -> str | None:
    """The user name the first matching rule gives; None when none matches."""
    for rule in rules:
        if rule.pattern is None:
            return subject
        m = rule.pattern.fullmatch(subject)
        if m is None:
            continue
        # Kafka's replacements name groups $1..$9
        name = re.sub(r"\$(\d)", lambda g, m=m: m.group(int(g.group(1))) or "", rule.replacement)
        return name.lower() if rule.case == "L" else name.upper() if rule.case == "U" else name
    return None

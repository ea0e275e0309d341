"""One connection's security state: the listener's protocol, the principal once known, and the
SASL exchange in progress. The broker makes one per connection; the SASL handlers move it on."""

from __future__ import annotations

from typing import Any

ANONYMOUS = "User:ANONYMOUS"
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def has_control_character(name: str) -> bool:
    """Whether a principal's name holds a control character (C0, DEL or C1). Such a name is refused
    at authentication: no user is named so, and one (from a certificate subject or a token's
    claim) could otherwise pass for a separator where the broker writes principals down."""
    return any(c < " " or "\x7f" <= c <= "\x9f" for c in name)


class Session:
    """`principal` is Kafka's "User:<name>" form: ANONYMOUS on PLAINTEXT, the certificate's mapped
    subject on SSL with a client certificate, the authenticated SASL identity on SASL listeners.
    `authenticated` is False on a SASL listener until SaslAuthenticate succeeds: until then the
    connection serves ApiVersions, SaslHandshake and SaslAuthenticate only."""

    __slots__ = ("protocol", "listener", "host", "principal", "authenticated", "mechanism", "exchange", "expires_at", "close_after_reply")

    def __init__(self, protocol: str = "PLAINTEXT", listener: str = "PLAINTEXT", host: str = "", principal: str = ANONYMOUS) -> None:
        self.protocol = protocol
        self.listener = listener  # the listener's name, as in `listeners` (PLAINTEXT, SASL_SSL, INTERNAL, ...)
        self.host = host  # the client's address, as ACLs match it
        self.principal = principal
        self.authenticated = not protocol.startswith("SASL_")
        self.mechanism: str | None = None  # chosen by SaslHandshake
        self.exchange: Any = None  # the mechanism's server state while SaslAuthenticate goes on
        self.expires_at: float | None = None  # monotonic deadline of the authentication (KIP-368), None: never
        self.close_after_reply = False  # a failed authentication: answer, then close the connection

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

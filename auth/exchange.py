"""What every SASL mechanism's server side offers the broker: a per-connection exchange driven one
client message at a time, and the one error it raises when the client is not who it claims."""

from __future__ import annotations

import time


class AuthenticationFailed(Exception):
    """The client did not authenticate. The message is shown to the client and logged: it never
    holds a password, a token or a proof."""


class SaslExchange:
    """One connection's authentication with one mechanism. `step` takes the client's bytes and
    answers (server bytes, done, user name once done), or raises AuthenticationFailed."""

    mechanism = ""

    def __init__(self, connections_max_reauth_ms: int = 0) -> None:
        self.connections_max_reauth_ms = connections_max_reauth_ms
        # Wall-clock (epoch seconds) end of the credential itself, where it has one (a token's exp).
        self.credential_expires_at: float | None = None

    async def step(self, client: bytes) -> tuple[bytes, bool, str | None]:
        raise NotImplementedError

    def session_lifetime_ms(self) -> int:
        """How long the authenticated session may last before the client re-authenticates
        (KIP-368): the credential's remaining life, capped by connections_max_reauth_ms; 0: no
        limit (Kafka's meaning of a zero session lifetime)."""
        limits = [self.connections_max_reauth_ms] if self.connections_max_reauth_ms > 0 else []
        if self.credential_expires_at is not None:
            limits.append(max(1, int((self.credential_expires_at - time.time()) * 1000)))
        return min(limits, default=0)

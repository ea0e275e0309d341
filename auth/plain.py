"""PLAIN (RFC 4616): the client sends `authzid NUL authcid NUL password` in one message, checked
against an operator's credentials file (`user:password` a line) or, without one, against the
SCRAM credentials in the metadata store. The authorization id is empty or the user itself."""

from __future__ import annotations

import asyncio
import hmac
import os
from collections.abc import Awaitable, Callable

from .exchange import AuthenticationFailed, SaslExchange

INVALID = "Authentication failed: Invalid username or password"


class PlainUsersFile:
    """Users and passwords from a file, one `user:password` a line (blank lines and lines starting
    with # are skipped). Read again when the file changes, so an operator rotates passwords
    without a restart."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._users: dict[str, bytes] = {}
        self._reload()  # a missing or unreadable file is a configuration error, found at start

    def _reload(self) -> None:
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        users = {}
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                line = line.rstrip("\r\n")
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                user, sep, password = line.partition(":")
                if sep and user:
                    users[user] = password.encode()
        self._users, self._stamp = users, stamp

    async def check_password(self, user: str, password: str) -> bool:
        try:
            await asyncio.to_thread(self._reload)
        except OSError:
            pass  # keep the last good contents while the file is being replaced
        expected = self._users.get(user)
        # Compared in constant time, and compared at all for an unknown user, so the answer's
        # timing tells neither the password nor whether the user exists.
        same = hmac.compare_digest(expected if expected is not None else b"\0" * 32, password.encode())
        return same and expected is not None


class PlainExchange(SaslExchange):
    mechanism = "PLAIN"

    def __init__(self, check_password: Callable[[str, str], Awaitable[bool]], connections_max_reauth_ms: int = 0) -> None:
        super().__init__(connections_max_reauth_ms)
        self._check_password = check_password
        self._done = False

    async def step(self, client: bytes) -> tuple[bytes, bool, str | None]:
        if self._done:
            raise AuthenticationFailed("Unexpected PLAIN message after the exchange ended")
        self._done = True
        try:
            text = client.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: not UTF-8") from None
        parts = text.split("\0")
        if len(parts) != 3:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: expected 3 tokens separated by NUL")
        authzid, user, password = parts
        if not user:
            raise AuthenticationFailed("Authentication failed: username not specified")
        if not password:
            raise AuthenticationFailed("Authentication failed: password not specified")
        if authzid and authzid != user:
            raise AuthenticationFailed("Authentication failed: Client requested an authorization id that is different from username")
        if not await self._check_password(user, password):
            raise AuthenticationFailed(INVALID)
        return b"", True, user

"""The SASL mechanisms a broker's SASL listeners offer, and the start of one connection's exchange
with the mechanism its SaslHandshake chose."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable

from .credentials import MECHANISM_IDS, ScramCredentials
from .exchange import AuthenticationFailed, SaslExchange
from .oauthbearer import JwtValidation, JwtValidator, OAuthBearerExchange
from .plain import PlainExchange, PlainUsersFile
from .scram import ScramExchange

SUPPORTED = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
FAILURE_WINDOW_S = 60.0  # failures from one address counted together (SaslMechanisms.failed_from)
MAX_FAILED_DELAY_S = 5.0
MAX_ADDRESSES = 10_000  # addresses whose failures are remembered (the least recent forgotten)

__all__ = ["SUPPORTED", "AuthenticationFailed", "JwtValidation", "SaslExchange", "SaslMechanisms"]


class SaslMechanisms:
    """`enabled`: the mechanisms offered, by Kafka's names. `credentials`: the SCRAM store, needed
    by SCRAM and by PLAIN without `plain_users_file`. `jwt`: how OAUTHBEARER checks tokens.
    `connections_max_reauth_ms`: the longest an authenticated session lasts before the client
    must re-authenticate (KIP-368); 0: no limit but an OAUTHBEARER token's own expiry.
    `failed_delay_ms`: how long a failed authentication's answer waits (Kafka's
    connection.failed.authentication.delay.ms), doubled for each other failure from the same
    address within FAILURE_WINDOW_S, up to MAX_FAILED_DELAY_S: a password guesser from one address
    slows down, and its connections wait, not the hashing pool."""

    def __init__(
        self,
        enabled: Iterable[str],
        credentials: ScramCredentials | None = None,
        *,
        plain_users_file: str | None = None,
        jwt: JwtValidation | None = None,
        connections_max_reauth_ms: int = 0,
        failed_delay_ms: int = 100,
    ) -> None:
        self.enabled = tuple(dict.fromkeys(enabled))
        self.failed_delay_ms = failed_delay_ms
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()  # address -> (failures, first in the window)
        unknown = [m for m in self.enabled if m not in SUPPORTED]
        if unknown:
            raise ValueError(f"unsupported SASL mechanisms {unknown}: neve offers {list(SUPPORTED)}")
        if credentials is None and (any(m in MECHANISM_IDS for m in self.enabled) or ("PLAIN" in self.enabled and plain_users_file is None)):
            raise ValueError("SCRAM (and PLAIN without a credentials file) need the SCRAM credential store")
        if "OAUTHBEARER" in self.enabled and jwt is None:
            raise ValueError("OAUTHBEARER needs its token validation settings")
        if connections_max_reauth_ms < 0:
            raise ValueError("connections_max_reauth_ms must be 0 (no limit) or more")
        self.credentials = credentials
        self.connections_max_reauth_ms = connections_max_reauth_ms
        self._plain_file = PlainUsersFile(plain_users_file) if plain_users_file and "PLAIN" in self.enabled else None
        self._jwt = JwtValidator(jwt) if jwt is not None and "OAUTHBEARER" in self.enabled else None

    def failed_from(self, host: str, now: float | None = None) -> float:
        """Count a failed authentication from `host`: the seconds its answer waits."""
        now = time.monotonic() if now is None else now
        count, since = self._failures.pop(host, (0, now))
        if now - since > FAILURE_WINDOW_S:
            count, since = 0, now
        self._failures[host] = (count + 1, since)
        while len(self._failures) > MAX_ADDRESSES:
            self._failures.popitem(last=False)
        return min(self.failed_delay_ms / 1000 * 2 ** min(count, 16), MAX_FAILED_DELAY_S) if self.failed_delay_ms > 0 else 0.0

    def offers(self, mechanism: str) -> bool:
        return mechanism in self.enabled

    def start(self, mechanism: str) -> SaslExchange:
        """A new server-side exchange; `mechanism` must be one `offers`."""
        if not self.offers(mechanism):
            raise ValueError(f"SASL mechanism {mechanism!r} is not enabled")
        reauth = self.connections_max_reauth_ms
        if mechanism in MECHANISM_IDS:
            assert self.credentials is not None
            return ScramExchange(mechanism, self.credentials, reauth)
        if mechanism == "PLAIN":
            source = self._plain_file if self._plain_file is not None else self.credentials
            assert source is not None
            return PlainExchange(source.check_password, reauth)
        assert self._jwt is not None
        return OAuthBearerExchange(self._jwt, reauth)

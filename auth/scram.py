"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), the server side by scramp, with Kafka's
variations: the client-first message may carry extensions (Kafka's `tokenauth`, for delegation
tokens, which neve does not issue: refused), and no authorization id is taken.
An unknown user is answered like a known one with a wrong password: the exchange goes on with a
made-up credential and fails on the proof, so user names cannot be probed. The made-up salt is
the same from every broker (a key the cluster keeps: `ScramCredentials.unknown_user_key`), of the
size and iteration count of the credentials neve makes. A user created through a client with other
choices (kafka-configs' 4096 iterations) is told apart from an unknown name by its iterations, as
on Kafka, which refuses unknown names at once."""

from __future__ import annotations

import hashlib
import hmac
import re

from scramp import ScramMechanism
from scramp.utils import ScramException

from .credentials import DEFAULT_ITERATIONS, ScramCredentials
from .exchange import AuthenticationFailed, SaslExchange

# An extension attribute of the client-first message: a name longer than one letter (RFC 5802's
# attributes are single letters; Kafka adds `tokenauth=true`).
_EXTENSION = re.compile(r"^[A-Za-z]{2,}=")


class ScramExchange(SaslExchange):
    def __init__(self, mechanism: str, credentials: ScramCredentials, connections_max_reauth_ms: int = 0) -> None:
        super().__init__(connections_max_reauth_ms)
        self.mechanism = mechanism
        self._credentials = credentials
        self._server = ScramMechanism(mechanism).make_server(self._auth_info)
        self._user: str | None = None
        self._known = False
        self._stage = 0

    @property
    def _failed(self) -> AuthenticationFailed:
        return AuthenticationFailed(f"Authentication failed during authentication due to invalid credentials with SASL mechanism {self.mechanism}")

    def _auth_info(self, user: str):
        self._user = user
        credential = self._credentials.lookup(self.mechanism, user)
        self._known = credential is not None
        if credential is None:
            # The same salt from every broker every time for the same name, of the size and with
            # the iterations of the credentials neve makes (`ScramCredentials.bootstrap`).
            digest = hmac.digest(self._credentials.unknown_user_key(), f"{self.mechanism}/{user}".encode(), "sha512")
            return digest[:32], hashlib.sha256(digest).digest(), digest[32:], DEFAULT_ITERATIONS
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    async def step(self, client: bytes) -> tuple[bytes, bool, str | None]:
        try:
            text = client.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailed(f"Malformed {self.mechanism} message: not UTF-8") from None
        if self._stage == 0:
            return self._client_first(text)
        if self._stage == 1:
            return self._client_final(text)
        raise AuthenticationFailed(f"Unexpected {self.mechanism} message after the exchange ended")

    def _client_first(self, text: str) -> tuple[bytes, bool, str | None]:
        rest = text.partition(",")[2]  # after the channel binding flag, which scramp checks
        authzid, _, bare = rest.partition(",")
        extensions = [a.partition("=")[0] for a in bare.split(",") if _EXTENSION.match(a)]
        if "tokenauth" in extensions:
            raise AuthenticationFailed("Delegation tokens are not supported: tokenauth is refused")
        if extensions:
            raise AuthenticationFailed(f"Unsupported SCRAM extensions: {', '.join(sorted(extensions))}")
        if authzid:
            # Kafka accepts an authorization id equal to the user; scramp takes none, and Kafka's
            # clients and librdkafka never send one.
            user = next((a[2:] for a in bare.split(",") if a.startswith("n=")), None)
            if authzid[2:] != user:
                raise AuthenticationFailed("Authentication failed: Client requested an authorization id that is different from username")
            raise AuthenticationFailed("Authorization ids are not supported with SCRAM: send none")
        try:
            self._server.set_client_first(text)
            server_first = self._server.get_server_first()
        except ScramException as e:
            raise AuthenticationFailed(f"Malformed {self.mechanism} client-first message: {e.args[0]}") from None
        self._stage = 1
        return server_first.encode(), False, None

    def _client_final(self, text: str) -> tuple[bytes, bool, str | None]:
        self._stage = 2
        try:
            self._server.set_client_final(text)
            server_final = self._server.get_server_final()
        except ScramException:
            raise self._failed from None
        if not self._known:  # cannot happen (the made-up keys match no proof); never let it through
            raise self._failed
        return server_final.encode(), True, self._user

"""OAUTHBEARER (RFC 7628, Kafka's KIP-255): the client sends a GS2 header and `auth=Bearer <JWT>`
(KIP-342's extensions beside it are ignored). The token is a signed JWT verified against a JWKS
(a file, read again when it changes, or a URL, fetched off the event loop and cached), with its
issuer, audience and expiry checked; or, for development only, an unsecured JWT (`alg: none`).
The principal is a claim of the token (`sub` by default, KIP-768). A refused token is answered
with RFC 7628's error JSON; the client acknowledges it and the authentication then fails."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

import jwt

from .exchange import AuthenticationFailed, SaslExchange

ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
_ERROR_JSON = json.dumps({"status": "invalid_token"}).encode()
_KVSEP = "\x01"


@dataclass(frozen=True)
class JwtValidation:
    """How OAUTHBEARER tokens are checked. A signed token needs `jwks_file` or `jwks_url`;
    `allow_unsecured` accepts tokens without a signature (anyone can then be anyone: development only)."""

    allow_unsecured: bool = False
    jwks_file: str | None = None
    jwks_url: str | None = None
    issuer: str | None = None  # None: any issuer
    audience: str | None = None  # None: any audience
    principal_claim: str = "sub"
    clock_skew_s: float = 30.0
    algorithms: tuple[str, ...] = ASYMMETRIC_ALGORITHMS
    jwks_refresh_s: float = 300.0  # how long a JWKS fetched from jwks_url is used before it is fetched again

    def __post_init__(self) -> None:
        if self.jwks_file and self.jwks_url:
            raise ValueError("OAUTHBEARER takes a JWKS file or a JWKS URL, not both")
        if not (self.allow_unsecured or self.jwks_file or self.jwks_url):
            raise ValueError("OAUTHBEARER needs a JWKS file or URL to verify tokens with (or unsecured tokens allowed, for development)")
        if any(a == "none" or a.startswith("HS") for a in self.algorithms):
            raise ValueError("OAUTHBEARER verifies signatures with public keys only: none and HS* are not allowed algorithms")


class InvalidToken(Exception):
    """Why a token is refused, in words that never include the token."""


class JwtValidator:
    """Checks tokens and answers (principal, expiry as epoch seconds)."""

    def __init__(self, validation: JwtValidation) -> None:
        self.validation = validation
        self._client = jwt.PyJWKClient(validation.jwks_url, cache_keys=True, lifespan=validation.jwks_refresh_s) if validation.jwks_url else None
        self._file_stamp: tuple[int, int] | None = None
        self._file_keys: jwt.PyJWKSet | None = None
        if validation.jwks_file:
            self._load_file()  # a missing or malformed file is a configuration error, found at start

    def _load_file(self) -> None:
        path = self.validation.jwks_file
        assert path is not None
        st = os.stat(path)
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._file_stamp:
            with open(path, encoding="utf-8") as f:
                self._file_keys = jwt.PyJWKSet.from_json(f.read())
            self._file_stamp = stamp

    def _signing_key(self, token: str, header: dict[str, Any]) -> jwt.PyJWK:
        """Blocking (a file or a URL): called off the event loop."""
        try:
            if self._client is not None:
                return self._client.get_signing_key_from_jwt(token)
            try:
                self._load_file()
            except (OSError, ValueError, jwt.PyJWTError):
                if self._file_keys is None:
                    raise
                # keep the last good key set while the file is being replaced
            assert self._file_keys is not None
            keys = list(self._file_keys)
            kid = header.get("kid")
            matching = [k for k in keys if k.key_id == kid] if kid is not None else keys
            if len(matching) != 1:
                raise InvalidToken("no key of the JWKS matches the token's key id")
            return matching[0]
        except jwt.PyJWKClientError:
            raise InvalidToken("no key of the JWKS matches the token's key id (or the JWKS could not be fetched)") from None

    async def validate(self, token: str) -> tuple[str, float]:
        v = self.validation
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise InvalidToken("the token is not a JWT") from None
        alg = header.get("alg")
        required = ["exp", v.principal_claim]
        options: dict[str, Any] = {"require": required, "verify_aud": v.audience is not None, "verify_iss": v.issuer is not None}
        try:
            if alg == "none":
                if not v.allow_unsecured:
                    raise InvalidToken("unsecured tokens are not accepted")
                options |= {"verify_signature": False, "verify_exp": True, "verify_nbf": True, "verify_iat": True}
                claims = jwt.decode(token, options=options, audience=v.audience, issuer=v.issuer, leeway=v.clock_skew_s)  # type: ignore[arg-type]
            else:
                if self._client is None and self._file_keys is None:
                    raise InvalidToken("signed tokens are not accepted: no JWKS is configured")
                if alg not in v.algorithms:
                    raise InvalidToken(f"the token's algorithm {alg!r} is not accepted")
                key = await asyncio.to_thread(self._signing_key, token, header)
                claims = jwt.decode(token, key, algorithms=[alg], options=options, audience=v.audience, issuer=v.issuer, leeway=v.clock_skew_s)  # type: ignore[arg-type]
        except jwt.ExpiredSignatureError:
            raise InvalidToken("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise InvalidToken("the token is not valid yet") from None
        except jwt.InvalidIssuerError:
            raise InvalidToken("the token's issuer is not the trusted one") from None
        except jwt.InvalidAudienceError:
            raise InvalidToken("the token's audience is not this cluster") from None
        except jwt.MissingRequiredClaimError as e:
            raise InvalidToken(f"the token has no {e.claim} claim") from None
        except jwt.InvalidSignatureError:
            raise InvalidToken("the token's signature does not verify") from None
        except (jwt.InvalidAlgorithmError, jwt.InvalidKeyError):
            raise InvalidToken("the token's algorithm does not match its key") from None
        except jwt.PyJWTError:
            raise InvalidToken("the token is malformed") from None
        principal = claims[v.principal_claim]
        if not isinstance(principal, str) or not principal:
            raise InvalidToken(f"the token's {v.principal_claim} claim is not a name")
        return principal, float(claims["exp"])


class OAuthBearerExchange(SaslExchange):
    mechanism = "OAUTHBEARER"

    def __init__(self, validator: JwtValidator, connections_max_reauth_ms: int = 0) -> None:
        super().__init__(connections_max_reauth_ms)
        self._validator = validator
        self._refused: str | None = None  # set once the error JSON was sent: the next message ends it
        self._done = False

    async def step(self, client: bytes) -> tuple[bytes, bool, str | None]:
        if self._refused is not None:
            # RFC 7628 3.2.3: the client answers the error with a single %x01, then fails.
            raise AuthenticationFailed(self._refused)
        if self._done:
            raise AuthenticationFailed("Unexpected OAUTHBEARER message after the exchange ended")
        self._done = True
        authzid, token = _parse_initial_response(client)
        try:
            principal, expires_at = await self._validator.validate(token)
        except InvalidToken as e:
            self._refused = f"Authentication failed: {e}"
            return _ERROR_JSON, False, None
        if authzid and authzid != principal:
            self._refused = "Authentication failed: the authorization id is not the token's principal"
            return _ERROR_JSON, False, None
        self.credential_expires_at = expires_at
        return b"", True, principal


def _parse_initial_response(client: bytes) -> tuple[str, str]:
    """(authzid, token) of `gs2-header %x01 *(key=value %x01) %x01`; raises AuthenticationFailed."""
    try:
        text = client.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationFailed("Invalid OAUTHBEARER initial response: not UTF-8") from None
    flag, sep1, rest = text.partition(",")
    authzid, sep2, rest = rest.partition(",")
    if flag not in ("n", "y") or not (sep1 and sep2) or (authzid and not authzid.startswith("a=")):
        raise AuthenticationFailed("Invalid OAUTHBEARER initial response: bad GS2 header")
    if not (rest.startswith(_KVSEP) and rest.endswith(_KVSEP * 2)):
        raise AuthenticationFailed("Invalid OAUTHBEARER initial response: bad key-value separators")
    pairs = {}
    for pair in rest[1:-2].split(_KVSEP) if len(rest) > 2 else ():
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise AuthenticationFailed("Invalid OAUTHBEARER initial response: bad key-value pair")
        pairs[key] = value
    scheme, _, token = pairs.get("auth", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed("Invalid OAUTHBEARER initial response: no auth=Bearer token")
    return authzid[2:].replace("=2C", ",").replace("=3D", "="), token.strip()

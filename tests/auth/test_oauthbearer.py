"""OAUTHBEARER with RS256 tokens signed by a key made here and its JWKS (a file, or a URL served on
loopback): the principal and session lifetime of a good token; an expired one, a foreign issuer or
audience, a bad signature refused with RFC 7628's error JSON and then a failure that never quotes
the token; unsecured tokens only when allowed."""

from __future__ import annotations

import http.server
import json
import threading
import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from auth.sasl import AuthenticationFailed, JwtValidation, SaslMechanisms

ISSUER, AUDIENCE = "https://idp.example", "neve-cluster"
ERROR_JSON = {"status": "invalid_token"}


def rsa_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwks(key, kid: str) -> str:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return json.dumps({"keys": [{**jwk, "kid": kid, "alg": "RS256", "use": "sig"}]})


@pytest.fixture(scope="module")
def signing_key():
    return rsa_key()


@pytest.fixture
def jwks_file(tmp_path, signing_key):
    path = tmp_path / "jwks.json"
    path.write_text(jwks(signing_key, "k1"))
    return str(path)


def token(key, *, kid="k1", lifetime_s=600.0, **claims) -> str:
    now = time.time()
    payload = {"sub": "svc-orders", "iss": ISSUER, "aud": AUDIENCE, "iat": int(now), "exp": int(now + lifetime_s), **claims}
    return jwt.encode(payload, key, algorithm="RS256", headers={"kid": kid})


def unsecured(lifetime_s=600.0, **claims) -> str:
    return jwt.encode({"sub": "dev-user", "exp": int(time.time() + lifetime_s), **claims}, None, algorithm="none")


def initial_response(tok: str, authzid: str = "") -> bytes:
    # As Kafka's client writes it, with a KIP-342 extension beside the token.
    return f"n,{'a=' + authzid if authzid else ''},\x01auth=Bearer {tok}\x01traceId=42\x01\x01".encode()


def mechanisms(**validation) -> SaslMechanisms:
    return SaslMechanisms(["OAUTHBEARER"], jwt=JwtValidation(**validation))


async def refused(sasl: SaslMechanisms, message: bytes) -> str:
    """The failure message of a refused token, after the error JSON and the client's %x01."""
    exchange = sasl.start("OAUTHBEARER")
    answer, done, who = await exchange.step(message)
    assert (json.loads(answer), done, who) == (ERROR_JSON, False, None)
    with pytest.raises(AuthenticationFailed) as failure:
        await exchange.step(b"\x01")
    text = str(failure.value)
    assert message.split(b"Bearer ")[1].split(b"\x01")[0].decode() not in text
    return text


async def test_a_signed_token_authenticates_its_subject_until_it_expires(jwks_file, signing_key):
    sasl = SaslMechanisms(["OAUTHBEARER"], jwt=JwtValidation(jwks_file=jwks_file, issuer=ISSUER, audience=AUDIENCE), connections_max_reauth_ms=3_600_000)
    exchange = sasl.start("OAUTHBEARER")
    assert await exchange.step(initial_response(token(signing_key, lifetime_s=600))) == (b"", True, "svc-orders")
    assert 590_000 <= exchange.session_lifetime_ms() <= 600_000  # the token's own expiry, under the reauth cap
    capped = SaslMechanisms(["OAUTHBEARER"], jwt=JwtValidation(jwks_file=jwks_file), connections_max_reauth_ms=60_000).start("OAUTHBEARER")
    assert await capped.step(initial_response(token(signing_key), authzid="svc-orders")) == (b"", True, "svc-orders")
    assert capped.session_lifetime_ms() == 60_000


async def test_the_principal_comes_from_the_configured_claim(jwks_file, signing_key):
    sasl = mechanisms(jwks_file=jwks_file, principal_claim="client_id")
    assert (await sasl.start("OAUTHBEARER").step(initial_response(token(signing_key, client_id="billing"))))[2] == "billing"
    assert await refused(sasl, initial_response(token(signing_key))) == "Authentication failed: the token has no client_id claim"


@pytest.mark.parametrize(
    ("claims", "why"),
    [
        ({"lifetime_s": -120}, "the token has expired"),
        ({"iss": "https://evil.example"}, "the token's issuer is not the trusted one"),
        ({"aud": "another-cluster"}, "the token's audience is not this cluster"),
        ({"kid": "unknown"}, "no key of the JWKS matches the token's key id"),
    ],
)
async def test_refused_tokens(jwks_file, signing_key, claims, why):
    sasl = mechanisms(jwks_file=jwks_file, issuer=ISSUER, audience=AUDIENCE, clock_skew_s=30)
    assert await refused(sasl, initial_response(token(signing_key, **claims))) == f"Authentication failed: {why}"


async def test_a_token_signed_by_another_key_is_refused(jwks_file):
    sasl = mechanisms(jwks_file=jwks_file)
    assert await refused(sasl, initial_response(token(rsa_key()))) == "Authentication failed: the token's signature does not verify"


async def test_the_clock_skew_tolerates_a_just_expired_token(jwks_file, signing_key):
    sasl = mechanisms(jwks_file=jwks_file, clock_skew_s=60)
    assert (await sasl.start("OAUTHBEARER").step(initial_response(token(signing_key, lifetime_s=-10))))[1:] == (True, "svc-orders")


async def test_a_foreign_authorization_id_is_refused(jwks_file, signing_key):
    sasl = mechanisms(jwks_file=jwks_file)
    assert await refused(sasl, initial_response(token(signing_key), authzid="admin")) == "Authentication failed: the authorization id is not the token's principal"


async def test_unsecured_tokens_only_when_allowed(jwks_file, signing_key):
    dev = mechanisms(allow_unsecured=True)
    exchange = dev.start("OAUTHBEARER")
    assert await exchange.step(initial_response(unsecured())) == (b"", True, "dev-user")
    assert await refused(dev, initial_response(unsecured(lifetime_s=-3600))) == "Authentication failed: the token has expired"
    assert await refused(dev, initial_response(token(signing_key))) == "Authentication failed: signed tokens are not accepted: no JWKS is configured"
    secure = mechanisms(jwks_file=jwks_file)
    assert await refused(secure, initial_response(unsecured())) == "Authentication failed: unsecured tokens are not accepted"
    hs256 = jwt.encode({"sub": "x", "exp": int(time.time() + 60)}, "a-shared-secret-of-at-least-32-bytes!", algorithm="HS256", headers={"kid": "k1"})
    assert await refused(secure, initial_response(hs256)) == "Authentication failed: the token's algorithm 'HS256' is not accepted"


async def test_a_malformed_initial_response_fails_at_once(jwks_file):
    sasl = mechanisms(jwks_file=jwks_file)
    for message in (b"n,,auth=Bearer x\x01\x01", b"p=tls,,\x01auth=Bearer x\x01\x01", b"n,,\x01auth=Basic x\x01\x01", b"n,,\x01\x01"):
        with pytest.raises(AuthenticationFailed, match="Invalid OAUTHBEARER initial response"):
            await sasl.start("OAUTHBEARER").step(message)


async def test_jwks_fetched_from_a_url(signing_key):
    body = jwks(signing_key, "k1").encode()
    fetched = []

    class Jwks(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            fetched.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Jwks)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        sasl = mechanisms(jwks_url=f"http://127.0.0.1:{server.server_address[1]}/jwks.json", issuer=ISSUER)
        for _ in range(2):
            assert (await sasl.start("OAUTHBEARER").step(initial_response(token(signing_key))))[1:] == (True, "svc-orders")
        assert await refused(sasl, initial_response(token(rsa_key()))) == "Authentication failed: the token's signature does not verify"
        assert fetched == ["/jwks.json"]  # once, then cached
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_the_settings_refuse_an_http_jwks_url_and_a_missing_audience_unless_relaxed(jwks_file):
    """Issue 43, finding 11: the broker does not start with OAUTHBEARER checking tokens against an
    http:// JWKS URL, or accepting any audience, unless told to."""
    from broker.config import BrokerConfig
    from broker.security import sasl_mechanisms

    def settings(**more) -> BrokerConfig:
        return BrokerConfig(sasl_enabled_mechanisms="OAUTHBEARER", **more)

    with pytest.raises(ValueError, match="is not https"):
        sasl_mechanisms(settings(sasl_oauthbearer_jwks="http://idp.example/jwks.json", sasl_oauthbearer_audience="kafka"), None)
    with pytest.raises(ValueError, match="needs broker.sasl_oauthbearer_audience"):
        sasl_mechanisms(settings(sasl_oauthbearer_jwks=jwks_file), None)
    assert sasl_mechanisms(settings(sasl_oauthbearer_jwks=jwks_file, sasl_oauthbearer_audience="kafka"), None).enabled == ("OAUTHBEARER",)
    assert sasl_mechanisms(settings(sasl_oauthbearer_jwks=jwks_file, sasl_oauthbearer_allow_any_audience=True), None).enabled == ("OAUTHBEARER",)
    relaxed = settings(sasl_oauthbearer_jwks="http://idp.example/jwks.json", sasl_oauthbearer_allow_http_jwks=True, sasl_oauthbearer_audience="kafka")
    assert sasl_mechanisms(relaxed, None).enabled == ("OAUTHBEARER",)
    assert sasl_mechanisms(settings(sasl_oauthbearer_allow_unsecured=True), None).enabled == ("OAUTHBEARER",)  # development tokens: no keys, no audience

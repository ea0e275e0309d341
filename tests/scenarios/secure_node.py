"""A `neve dev` node with every way in a client may authenticate, for the secure-client scenarios:
a PLAINTEXT listener on loopback, a SASL_SSL listener offering SCRAM-SHA-512, SCRAM-SHA-256,
PLAIN and OAUTHBEARER (tokens signed by an RSA key the tests hold, checked against a JWKS file),
and an SSL listener that requires a client certificate from the deployment's authority. Also the
client settings each of the four clients (Java, librdkafka, kafkajs, aiokafka) needs to reach it."""

from __future__ import annotations

import json
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jwt
from aiokafka.helpers import create_ssl_context
from confluent_kafka import Consumer, KafkaError, Producer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.fixtures import Certificates, NeveNode, free_port

WAIT_S = 120
ISSUER = "https://issuer.neve.test"
AUDIENCE = "neve-tests"
USERS = {"alice": "alice-secret", "bob": "bob-secret"}


class TokenIssuer:
    """An identity provider's signing key: JWTs it signs, and the JWKS that verifies them."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = uuid.uuid4().hex

    def jwks(self) -> str:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return json.dumps({"keys": [public | {"kid": self.kid, "use": "sig", "alg": "RS256"}]})

    def token(self, subject: str, lifetime_s: float = 3600, issued_ago_s: float = 0) -> str:
        """A signed token for `subject`, issued `issued_ago_s` ago and valid for `lifetime_s` from
        its issue (a negative remaining life: an expired token)."""
        issued = time.time() - issued_ago_s
        claims = {"sub": subject, "iss": ISSUER, "aud": AUDIENCE, "iat": int(issued), "exp": int(issued + lifetime_s), "scope": "kafka"}
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid})


class TokenEndpoint:
    """An OAuth token endpoint on loopback (client_credentials): answers every POST with a token
    the issuer signed for the client id of its Basic credentials, and counts what it handed out."""

    def __init__(self, issuer: TokenIssuer, lifetime_s: float = 3600) -> None:
        endpoint = self
        self.issued: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                import base64

                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length).decode()
                client_id = base64.b64decode(self.headers["Authorization"].split(" ", 1)[1]).decode().split(":", 1)[0]
                if "grant_type=client_credentials" not in body:
                    self.send_response(400)
                    self.end_headers()
                    return
                token = issuer.token(client_id, lifetime_s)
                endpoint.issued.append(client_id)
                answer = json.dumps({"access_token": token, "token_type": "Bearer", "expires_in": int(lifetime_s)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        self._thread = threading.Thread(target=self.server.serve_forever, name="token-endpoint", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)


@dataclass
class SecureNode:
    node: NeveNode
    certs: Certificates
    issuer: TokenIssuer
    sasl_port: int
    ssl_port: int
    directory: Path

    @property
    def sasl_bootstrap(self) -> str:
        return f"localhost:{self.sasl_port}"

    @property
    def ssl_bootstrap(self) -> str:
        return f"localhost:{self.ssl_port}"

    def log_events(self, event: str) -> list[dict]:
        """The node's structured log lines naming `event`, in order."""
        out = []
        for line in self.node.log_path.read_text().splitlines():
            if line.startswith("{") and f'"{event}"' in line:
                item = json.loads(line)
                if item.get("event") == event:
                    out.append(item)
        return out

    # -- librdkafka (confluent-kafka) --------------------------------------------------------
    # SASL_SSL clients present no certificate: ssl_client_auth applies to SSL listeners only
    def rdkafka_sasl_tls(self) -> dict:
        return {"bootstrap.servers": self.sasl_bootstrap, "security.protocol": "SASL_SSL", "ssl.ca.location": self.certs.ca_file}

    def rdkafka_sasl(self, mechanism: str = "SCRAM-SHA-512", user: str = "alice", password: str | None = None) -> dict:
        return {**self.rdkafka_sasl_tls(), "sasl.mechanisms": mechanism, "sasl.username": user, "sasl.password": USERS[user] if password is None else password}

    def rdkafka_oauth(self, token) -> dict:
        """`token()` is called for every token librdkafka asks for: (JWT, lifetime end in epoch
        seconds as librdkafka is told)."""
        return {**self.rdkafka_sasl_tls(), "sasl.mechanisms": "OAUTHBEARER", "oauth_cb": lambda _config: token()}

    def rdkafka_mtls(self, cert: tuple[str, str]) -> dict:
        return {"bootstrap.servers": self.ssl_bootstrap, "security.protocol": "SSL", "ssl.ca.location": self.certs.ca_file, "ssl.certificate.location": cert[0], "ssl.key.location": cert[1]}

    # -- Java --------------------------------------------------------------------------------
    def java_trust(self) -> dict[str, str]:
        return {"ssl.truststore.type": "PEM", "ssl.truststore.location": self.certs.ca_file}

    def java_sasl_tls(self) -> dict[str, str]:
        return self.java_trust()

    def java_scram(self, user: str = "alice", password: str | None = None, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
        password = USERS[user] if password is None else password
        jaas = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";'
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": mechanism, "sasl.jaas.config": jaas, **self.java_sasl_tls()}

    def java_mtls(self, cert: tuple[str, str]) -> dict[str, str]:
        return {"security.protocol": "SSL", **self.java_keystore(cert), **self.java_trust()}

    def java_keystore(self, cert: tuple[str, str]) -> dict[str, str]:
        """Kafka's PEM keystore given inline: the private key (PKCS#8 only: trustme writes EC keys
        in SEC1's form) and the chain.
        The file form (ssl.keystore.location) wants the key encrypted with ssl.key.password, and
        the JDK 17 Kafka runs on cannot open PBES2 (what `cryptography` and OpenSSL 3 write)."""
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.key": pkcs8(Path(cert[1]).read_bytes()),
            "ssl.keystore.certificate.chain": Path(cert[0]).read_text(),
        }

    def java_oauth(self, endpoint: TokenEndpoint, client_id: str) -> dict[str, str]:
        """Kafka's own OAUTHBEARER login: a client_credentials token from `endpoint`."""
        jaas = f'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required clientId="{client_id}" clientSecret="{client_id}-secret";'
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.jaas.config": jaas,
            "sasl.login.callback.handler.class": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
            "sasl.oauthbearer.token.endpoint.url": endpoint.url,
            **self.java_sasl_tls(),
        }

    # -- kafkajs -----------------------------------------------------------------------------
    def kafkajs_scram(self, user: str = "alice") -> dict:
        return {"ssl": {"ca": self.certs.ca_file}, "sasl": {"mechanism": "scram-sha-512", "username": user, "password": USERS[user]}}

    def aiokafka_sasl_tls(self) -> ssl.SSLContext:
        return create_ssl_context(cafile=self.certs.ca_file)

    def kafkajs_mtls(self, cert: tuple[str, str]) -> dict:
        return {"ssl": {"ca": self.certs.ca_file, "cert": cert[0], "key": cert[1]}}


def pkcs8(pem_key: bytes) -> str:
    key = serialization.load_pem_private_key(pem_key, password=None)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()


def start_secure_node(directory: Path, extra_env: dict[str, str] | None = None) -> SecureNode:
    directory.mkdir(parents=True, exist_ok=True)
    certs = Certificates(directory / "certs")
    issuer = TokenIssuer()
    jwks = directory / "jwks.json"
    jwks.write_text(issuer.jwks())
    users = directory / "scram-users"
    users.write_text("".join(f"{user}:{password}\n" for user, password in USERS.items()))
    sasl_port, ssl_port = free_port(), free_port()
    env = {
        "NEVE_BROKER_LISTENERS": f"PLAINTEXT://127.0.0.1:{{port}},SASL_SSL://127.0.0.1:{sasl_port},SSL://127.0.0.1:{ssl_port}",
        "NEVE_BROKER_ADVERTISED_LISTENERS": f"SASL_SSL://localhost:{sasl_port},SSL://localhost:{ssl_port}",
        "NEVE_BROKER_SSL_CERTFILE": certs.server_cert,
        "NEVE_BROKER_SSL_KEYFILE": certs.server_key,
        "NEVE_BROKER_SSL_CAFILE": certs.ca_file,
        "NEVE_BROKER_SSL_CLIENT_AUTH": "required",
        "NEVE_BROKER_SASL_ENABLED_MECHANISMS": "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN,OAUTHBEARER",
        "NEVE_BROKER_SASL_SCRAM_USERS_FILE": str(users),
        "NEVE_BROKER_SASL_OAUTHBEARER_JWKS": str(jwks),
        "NEVE_BROKER_SASL_OAUTHBEARER_ISSUER": ISSUER,
        "NEVE_BROKER_SASL_OAUTHBEARER_AUDIENCE": AUDIENCE,
        **(extra_env or {}),
    }
    node = NeveNode(data_dir=directory / "data", log_path=directory / "node.log", env=env)
    node.start()
    return SecureNode(node, certs, issuer, sasl_port, ssl_port, directory)


# -- librdkafka helpers ----------------------------------------------------------------------------


def rdkafka_produce(config: dict, topic: str, values: list[bytes]) -> list[tuple[int, int]]:
    """(partition, offset) of each value, acknowledged with acks=all."""
    acked: list[tuple[int, int]] = []
    errors: list[str] = []
    producer = Producer({**config, "acks": "all", "message.timeout.ms": WAIT_S * 1000})

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append((msg.partition(), msg.offset()))

    for value in values:
        producer.produce(topic, value, on_delivery=on_delivery)
    assert producer.flush(WAIT_S) == 0
    assert errors == []
    return acked


def rdkafka_consume(config: dict, topic: str, count: int) -> list[bytes]:
    """The first `count` values of `topic` from its start (fewer if they do not come in time)."""
    consumer = Consumer({**config, "group.id": f"g-{topic}-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
    finally:
        consumer.close()
    return got


def rdkafka_refusal(config: dict, topic: str) -> KafkaError:
    """The error a producer that cannot authenticate is told (through its error callback); its
    record is never acknowledged."""
    errors: list[KafkaError] = []
    producer = Producer({**config, "message.timeout.ms": 20_000, "error_cb": errors.append})
    producer.produce(topic, b"never")
    deadline = time.monotonic() + WAIT_S
    while not errors and time.monotonic() < deadline:
        producer.poll(0.5)
    producer.purge()
    producer.flush(10)
    assert errors, "the client was told nothing"
    return errors[0]

"""The etcd store against an etcd that serves clients over TLS only, asks each for a certificate
its authority signed, and has authentication on (a user allowed the keys under `/sec-` only):
the settings an etcd:// URL takes, a store that loads, writes and follows so, the clear and
prompt refusals, and a store living past etcd forgetting its login token."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bench.servers import Etcd, EtcdTls
from metadata.model import BrokerRegistration
from metadata.store import MetadataStore, MetadataUnavailable, load_metadata_store
from tests.fixtures import Certificates
from tests.metadata.helpers import append, commit

USER, PASSWORD = "neve", "correct horse battery staple"
TOKEN_TTL_S = 1  # etcd's --auth-token-ttl: a login token unused this long is forgotten
SEEN_WITHIN_S = 30.0  # generous: another store sees a write within its watch's delay
PROMPT_S = 10.0  # a refused store fails at once, well before the 30 s request timeout it is given


class SecuredEtcd:
    """A TLS etcd with client certificates and authentication, and the files a store needs."""

    def __init__(self, directory: Path) -> None:
        self.certs = Certificates(directory / "certs")
        admin = self.certs.client("root")
        tls = EtcdTls(self.certs.ca_file, self.certs.server_cert, self.certs.server_key, client_cert_auth=True, admin_cert=admin[0], admin_key=admin[1])
        self.server = Etcd(directory / "etcd", directory / "etcd.log", tls=tls, auth_token_ttl_s=TOKEN_TTL_S)
        self.server.start()
        self.server.enable_auth(USER, PASSWORD, prefix="/sec-")
        self.password_file = directory / "password"
        self.password_file.write_text(PASSWORD + "\n")  # as a mounted secret holds it, newline and all
        self.cert, self.key = self.certs.client(USER)

    def url(self, root: str, **query: str) -> str:
        """The URL of a store under `root` (`sec-<root>`); by default with the trusted authority,
        the client certificate and the user: a keyword replaces one, None leaves it out."""
        settings = {"ca": self.certs.ca_file, "cert": self.cert, "key": self.key, "user": USER, "password_file": str(self.password_file), **query}
        return f"etcd://{self.server.endpoint}/sec-{root}?" + "&".join(f"{k}={v}" for k, v in settings.items() if v is not None)

    async def open(self, root: str, timeout_ms: int = 30_000, **query: str) -> MetadataStore:
        store = load_metadata_store(self.url(root, **query), timeout_ms=timeout_ms)
        await store.start()
        return store


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    etcd = SecuredEtcd(tmp_path_factory.mktemp("secured-etcd"))
    yield etcd
    etcd.server.stop()


async def committed_once_reachable(store: MetadataStore, object_commit) -> list:
    """`store.commit`, tried again while etcd refuses the connection: a store's first request after
    etcd's restart can meet gRPC's reconnect backoff, which fails it at once (UNAVAILABLE, nothing
    written; a producer's retry does the same). Any other failure is the test's."""
    deadline = time.monotonic() + SEEN_WITHIN_S
    while True:
        try:
            return await asyncio.wait_for(store.commit(object_commit), SEEN_WITHIN_S)
        except MetadataUnavailable as e:
            if "UNAVAILABLE" not in str(e) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def seen(condition, what: str) -> None:
    """Until `condition()` holds: another store's write reaches this one through its watch, and
    the view offers no event for every kind of item, so it is checked every 10 ms."""
    deadline = time.monotonic() + SEEN_WITHIN_S
    while not condition():
        assert time.monotonic() < deadline, f"not seen within {SEEN_WITHIN_S} s: {what}"
        await asyncio.sleep(0.01)


# -- the URL's settings -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("cert=/c.pem", "needs both cert= and key="),
        ("key=/c.key&ca=/ca.pem", "needs both cert= and key="),
        ("user=neve", "etcd user 'neve' needs password_file="),
        ("password_file=/pw", "password_file= needs user="),
        ("user=neve&password=secret", "takes no password"),
        ("tls=yes", "tls in an etcd:// URL is true or false"),
        ("cacert=/ca.pem", "unknown etcd:// URL parameter(s) cacert"),
    ],
)
def test_url_settings_refused(query, message):
    with pytest.raises(ValueError) as refused:
        load_metadata_store(f"etcd://127.0.0.1:2379/neve?{query}")
    assert message in str(refused.value)
    assert "secret" not in str(refused.value)


def test_password_in_the_url_authority_refused():
    with pytest.raises(ValueError) as refused:
        load_metadata_store("etcd://neve:secret@127.0.0.1:2379/neve")
    assert "takes no password" in str(refused.value) and "secret" not in str(refused.value)


def test_url_settings_read():
    store = load_metadata_store("etcd://etcd.internal:2380/prod?ca=/s/ca.pem&cert=/s/tls.crt&key=/s/tls.key&user=neve&password_file=/s/password")
    s = store.security
    assert (store.host, store.port, store.keys.root) == ("etcd.internal", 2380, "prod")
    assert (s.uses_tls, s.ca_file, s.cert_file, s.key_file, s.user, s.password_file) == (True, "/s/ca.pem", "/s/tls.crt", "/s/tls.key", "neve", "/s/password")
    system_cas = load_metadata_store("etcd://etcd.internal:2379/prod?tls=true").security
    assert (system_cas.uses_tls, system_cas.ca_file, system_cas.user) == (True, None, None)
    assert not load_metadata_store("etcd://etcd.internal:2379/prod").security.uses_tls


# -- a secured etcd ---------------------------------------------------------------------------


@pytest.mark.integration
async def test_loads_writes_and_follows_over_tls_with_a_login(secured):
    writer = await secured.open("follow")
    follower = await secured.open("follow")
    try:
        topic = (await writer.create_topic("orders", 2)).topic_id
        results = await writer.commit(commit(append(topic, 0, 0, 100, 5), append(topic, 1, 100, 50, 2)))
        assert [(r.error_code, r.base_offset) for r in results] == [(0, 0), (0, 0)]
        await writer.security_write({"scram/SCRAM-SHA-256/alice": b"salted"})

        await seen(lambda: follower.high_watermark(topic, 0) == 5 and follower.high_watermark(topic, 1) == 2, "the writer's commit")
        await seen(lambda: follower.security_items("scram/") == {"scram/SCRAM-SHA-256/alice": b"salted"}, "the writer's credential")
        assert follower.topics()["orders"].partitions == 2
        assert [(e.base_offset, e.last_offset, e.start, e.size) for e in follower.entries(topic, 1, 0)] == [(0, 1, 100, 50)]

        # the follower writes too, the writer follows
        results = await follower.commit(commit(append(topic, 0, 0, 10, 3)))
        assert [(r.error_code, r.base_offset) for r in results] == [(0, 5)]
        await seen(lambda: writer.high_watermark(topic, 0) == 8, "the follower's commit")
    finally:
        await writer.close()
        await follower.close()

    loaded = await secured.open("follow")  # a store started now loads it all
    try:
        assert loaded.high_watermark(topic, 0) == 8 and loaded.high_watermark(topic, 1) == 2
        assert [(e.base_offset, e.last_offset) for e in loaded.entries(topic, 0, 0)] == [(0, 4), (5, 7)]
        assert loaded.security_items("") == {"scram/SCRAM-SHA-256/alice": b"salted"}
    finally:
        await loaded.close()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("case", "query", "message"),
    [
        ("no client certificate", {"cert": None, "key": None}, "BAD_CERTIFICATE"),
        ("a certificate of another authority", "foreign", "BAD_CERTIFICATE"),
        ("etcd's authority not trusted", {"ca": None, "tls": "true"}, "CERTIFICATE_VERIFY_FAILED"),
        ("no TLS", {"ca": None, "cert": None, "key": None}, "unreachable without TLS"),
        ("a wrong password", "wrong password", "refused the login of user 'neve': etcdserver: authentication failed"),
        ("no password file", {"password_file": "/nonexistent/password"}, "etcd password file /nonexistent/password: No such file"),
    ],
)
async def test_refused_promptly_and_clearly(secured, tmp_path, case, query, message):
    if query == "foreign":
        cert, key = secured.certs.foreign_client(USER)
        query = {"cert": cert, "key": key}
    elif query == "wrong password":
        (tmp_path / "password").write_text("Tr0ub4dor&3\n")
        query = {"password_file": str(tmp_path / "password")}
    started = time.monotonic()
    with pytest.raises(MetadataUnavailable) as refused:
        await secured.open("refused", **query)
    assert time.monotonic() - started < PROMPT_S, f"{case}: refused only after {time.monotonic() - started:.1f} s"
    assert message in str(refused.value), f"{case}: {refused.value}"
    assert str(refused.value).startswith(f"etcd at {secured.server.endpoint}: ")
    assert PASSWORD not in str(refused.value)


@pytest.mark.integration
async def test_a_forgotten_token_means_a_new_login_not_a_stall(secured):
    """etcd forgets a login token unused for --auth-token-ttl (here 1 s; 300 s by default): the
    stores log in again and the request goes through, where aetcd alone would fail every one
    from then on. Both stores stay idle past the TTL; there is nothing to await but time."""
    writer = await secured.open("expiry")
    follower = await secured.open("expiry")
    try:
        await writer.register_broker(BrokerRegistration(1, "127.0.0.1", 9092))
        topic = (await writer.create_topic("t", 1)).topic_id
        await seen(lambda: follower.topics().get("t") is not None, "the topic")
        logins = (writer._client.logins, follower._client.logins)
        assert logins == (1, 1)

        await asyncio.sleep(TOKEN_TTL_S * 3)  # etcd checks its tokens' TTLs once a second

        results = await writer.commit(commit(append(topic, 0, 0, 100, 4)))
        assert [(r.error_code, r.base_offset) for r in results] == [(0, 0)]
        await writer.security_write({"acls/topic/LITERAL/t/0": b"binding"})
        assert writer._client.logins == 2  # the token was forgotten, once, and renewed, once
        # the follower's watch outlives its token: it sees both writes without a login
        await seen(lambda: follower.high_watermark(topic, 0) == 4, "the commit after the expiry")
        await seen(lambda: follower.security_items("acls/") == {"acls/topic/LITERAL/t/0": b"binding"}, "the binding after the expiry")
        assert follower._client.logins == 1
        # its own first request after the expiry logs in again
        results = await follower.commit(commit(append(topic, 0, 0, 10, 1)))
        assert [(r.error_code, r.base_offset) for r in results] == [(0, 4)]
        assert follower._client.logins == 2
        # the broker's registration lived on through its lease's keep-alives
        assert [(b.node_id, b.port) for b in follower.live_brokers()] == [(1, 9092)]
    finally:
        await writer.close()
        await follower.close()


@pytest.mark.integration
async def test_etcd_restarted_forgets_every_token_the_stores_log_in_again(artifacts_dir):
    """Simple tokens live in etcd's memory: after a restart every store's token is unknown and
    its watch is broken. Each store reloads (logging in again) and follows the other's writes."""
    secured = SecuredEtcd(artifacts_dir)
    try:
        a, b = await secured.open("restart"), await secured.open("restart")
        try:
            topic = (await a.create_topic("t", 1)).topic_id
            await seen(lambda: b.topics().get("t") is not None, "the topic")

            await asyncio.to_thread(secured.server.stop)
            await asyncio.to_thread(secured.server.start)

            results = await committed_once_reachable(a, commit(append(topic, 0, 0, 100, 3)))
            assert [(r.error_code, r.base_offset) for r in results] == [(0, 0)]
            await seen(lambda: b.high_watermark(topic, 0) == 3, "a's commit after the restart")
            results = await committed_once_reachable(b, commit(append(topic, 0, 0, 10, 2)))
            assert [(r.error_code, r.base_offset) for r in results] == [(0, 3)]
            await seen(lambda: a.high_watermark(topic, 0) == 5, "b's commit after the restart")
            assert a._client.logins >= 2 and b._client.logins >= 2
        finally:
            await a.close()
            await b.close()
    finally:
        secured.server.stop()

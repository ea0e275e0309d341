"""The chunk port's shared secret, over loopback: brokers sharing it exchange chunks (one handshake
a connection, however many requests); a broker without it, or with another, is refused by the
owner (counted, logged without the secret) and reads the object store directly instead, exact
bytes still; a stranger speaking no handshake is refused before any request is read; and a node
will not serve chunks beyond loopback without a secret unless told the network is trusted. With
mutual TLS, only a peer showing a certificate of the deployment's CA gets as far as the handshake."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random

import pytest
import trustme

from cache import metrics, peers
from cache.chunks import Member, ZoneChunks, owner_of
from cache.config import CacheConfig
from cache.peerauth import PeerSecurityError, check_chunk_port, load_peer_secret, peer_tls
from cache.peers import ChunkServer, PeerClient, PeerError, PeerRefused, encode_request
from cache.recent import RecentObjects
from wal.store import MemoryObjectStore

CHUNK = 64 * 1024
OBJECT = random.Random(36).randbytes(4 * CHUNK + 777)
SECRET = b"the deployment's secret, 32 byte"
OTHER = b"another deployment's secret here"


def counter(c) -> float:
    return c._value.get()


class CountingStore(MemoryObjectStore):
    def __init__(self) -> None:
        super().__init__()
        self.gets: list[tuple[str, int, int | None]] = []

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.gets.append((key, start, end))
        return await super().get(key, start, end)


class Pair:
    """Two brokers of a zone on one object store: 0 asks, 1 owns and serves; each with its own
    idea of the secret."""

    def __init__(self, asker_secret: bytes | None, owner_secret: bytes | None) -> None:
        self.secrets = (asker_secret, owner_secret)
        self.store = CountingStore()
        self.nodes: list[ZoneChunks] = []
        self.server: ChunkServer | None = None

    def members(self) -> list[Member]:
        return [Member(1, "127.0.0.1", self.server.port)]

    async def __aenter__(self) -> Pair:
        await self.store.put("a", OBJECT)
        for i, secret in enumerate(self.secrets):
            self.nodes.append(ZoneChunks(self.store, RecentObjects(0), node_id=i, members=self.members, chunk_bytes=CHUNK, memory_bytes=100 * CHUNK, peer_secret=secret))
        self.server = ChunkServer(self.nodes[1].serve, "127.0.0.1", 0, CHUNK, secret=self.secrets[1])
        await self.server.start()
        return self

    async def __aexit__(self, *exc) -> None:
        for node in self.nodes:
            await node.close()
        await self.server.stop()


def owned_by_1() -> int:
    c = next(c for c in range(0, len(OBJECT), CHUNK) if owner_of("a", c, [Member(0, "", 0), Member(1, "", 0)]).node_id == 1)
    return c


async def test_brokers_sharing_the_secret_exchange_chunks_over_one_authenticated_connection():
    async with Pair(SECRET, SECRET) as pair:
        c = owned_by_1()
        direct, served = counter(metrics.DIRECT_READS), counter(metrics.PEER_BYTES_IN)
        spans = [(c + i * 1000, c + i * 1000 + 100 + i) for i in range(40)]
        got = await asyncio.gather(*(pair.nodes[0].get("a", lo, hi) for lo, hi in spans))
        assert [bytes(g) for g in got] == [OBJECT[lo:hi] for lo, hi in spans]
        assert pair.store.gets == [("a", c, c + CHUNK)]  # the owner's one GET, nothing direct
        assert counter(metrics.DIRECT_READS) == direct
        assert counter(metrics.PEER_BYTES_IN) - served == sum(hi - lo for lo, hi in spans)
        assert len(pair.server._connections) == 1  # one connection, so one handshake, for 40 requests


@pytest.mark.parametrize(
    ("asker", "owner", "server_reason"),
    [
        pytest.param(None, SECRET, "no_secret", id="asker-without-secret"),
        pytest.param(OTHER, SECRET, "wrong_secret", id="asker-with-another-secret"),
        pytest.param(SECRET, None, None, id="owner-without-secret"),
    ],
)
async def test_brokers_not_sharing_the_secret_read_the_store_directly(caplog, asker, owner, server_reason):
    caplog.set_level(logging.INFO)
    async with Pair(asker, owner) as pair:
        c = owned_by_1()
        direct, refused_asks = counter(metrics.DIRECT_READS), counter(metrics.PEER_FAILURES.labels("refused"))
        refused = {r: counter(metrics.PEER_REFUSED.labels(r)) for r in ("no_secret", "wrong_secret")}
        served = counter(metrics.PEER_BYTES_OUT)
        assert bytes(await pair.nodes[0].get("a", c + 5, c + 5005)) == OBJECT[c + 5 : c + 5005]
        assert pair.store.gets == [("a", c + 5, c + 5005)]  # the asker's own GET of just its range
        assert counter(metrics.DIRECT_READS) - direct == 1
        assert counter(metrics.PEER_FAILURES.labels("refused")) - refused_asks == 1
        assert counter(metrics.PEER_BYTES_OUT) == served  # not one chunk byte left the owner
        for reason, before in refused.items():  # the owner counted the refusal, when it was the one refusing
            assert counter(metrics.PEER_REFUSED.labels(reason)) - before == (reason == server_reason)
        await asyncio.gather(*(t for t in pair.server._connections))  # the refused connection is closed and gone
        assert not pair.server._connections
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "chunk_owner_failed" in logged
    if server_reason:
        assert "chunk_peer_refused" in logged
    for secret in (SECRET, OTHER):
        assert secret.decode() not in logged and secret.hex() not in logged


async def test_a_client_with_the_wrong_secret_is_refused_on_each_connection_and_a_right_one_served_after():
    server = ChunkServer(lambda key, start, size, lo, hi: _slice(lo, hi), "127.0.0.1", 0, CHUNK, secret=SECRET)
    await server.start()
    wrong, right = PeerClient("127.0.0.1", server.port, CHUNK, secret=OTHER), PeerClient("127.0.0.1", server.port, CHUNK, secret=SECRET)
    try:
        before = counter(metrics.PEER_REFUSED.labels("wrong_secret"))
        for _ in range(2):
            with pytest.raises(PeerRefused, match="refused this broker's secret"):
                await wrong.get("k", 0, CHUNK, 0, 10, 5)
        assert counter(metrics.PEER_REFUSED.labels("wrong_secret")) - before == 2
        assert await right.get("k", 0, CHUNK, 10, 20, 5) == (OBJECT[10:20], False)
    finally:
        await wrong.close()
        await right.close()
        await server.stop()


async def _slice(lo: int, hi: int):
    return OBJECT[lo:hi], False


async def test_a_stranger_sending_requests_without_a_handshake_is_closed_unanswered():
    server = ChunkServer(lambda key, start, size, lo, hi: _slice(lo, hi), "127.0.0.1", 0, CHUNK, secret=SECRET)
    await server.start()
    try:
        before, bad = counter(metrics.PEER_REFUSED.labels("no_handshake")), counter(metrics.BAD_FRAMES)
        for data in (encode_request(1, "k", 0, CHUNK, 0, 10), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(data)
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, not one byte of an answer
            writer.close()
        assert counter(metrics.PEER_REFUSED.labels("no_handshake")) - before == 2
        assert counter(metrics.BAD_FRAMES) == bad
    finally:
        await server.stop()


async def test_a_connection_that_never_proves_itself_is_closed_at_the_handshake_deadline(monkeypatch):
    monkeypatch.setattr(peers, "HANDSHAKE_TIMEOUT_S", 0.2)
    server = ChunkServer(lambda key, start, size, lo, hi: _slice(lo, hi), "127.0.0.1", 0, CHUNK, secret=SECRET)
    await server.start()
    try:
        before = counter(metrics.PEER_REFUSED.labels("timeout"))
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the server hung up on the silent client
        writer.close()
        assert counter(metrics.PEER_REFUSED.labels("timeout")) - before == 1
    finally:
        await server.stop()


# -- start-up --------------------------------------------------------------------------------------


def test_the_secret_is_read_from_its_file_without_surrounding_whitespace(tmp_path):
    assert load_peer_secret(CacheConfig()) is None
    path = tmp_path / "secret"
    path.write_bytes(b"  " + SECRET + b"\n")
    assert load_peer_secret(CacheConfig(peer_secret_file=str(path))) == SECRET
    path.write_bytes(b"short\n")
    with pytest.raises(PeerSecurityError, match="holds 5 bytes; at least 16"):
        load_peer_secret(CacheConfig(peer_secret_file=str(path)))
    with pytest.raises(PeerSecurityError, match="missing"):
        load_peer_secret(CacheConfig(peer_secret_file=str(tmp_path / "missing")))


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost"])
def test_a_loopback_chunk_port_needs_no_secret(host):
    check_chunk_port(host, CacheConfig(), None)


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "10.0.0.7", "broker-0.neve.svc"])
def test_a_reachable_chunk_port_without_a_secret_refuses_to_start_unless_declared_insecure(host):
    with pytest.raises(PeerSecurityError, match="NEVE_CACHE_PEER_SECRET_FILE"):
        check_chunk_port(host, CacheConfig(), None)
    check_chunk_port(host, CacheConfig(), SECRET)
    check_chunk_port(host, CacheConfig(peer_insecure=True), None)
    check_chunk_port(host, CacheConfig(enabled=False), None)  # no cache, no chunk port


# -- mutual TLS ------------------------------------------------------------------------------------


def tls_files(tmp_path, ca, name: str) -> CacheConfig:
    """A broker's chunk-port TLS settings: its certificate from `ca`, and `ca` as the one trusted."""
    cert = ca.issue_cert("127.0.0.1", "broker.neve.test")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / f"{name}.crt"))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(tmp_path / f"{name}.crt"), append=True)
    cert.private_key_pem.write_to_path(str(tmp_path / f"{name}.key"))
    ca.cert_pem.write_to_path(str(tmp_path / f"{name}-ca.crt"))
    return CacheConfig(peer_tls_cert_file=str(tmp_path / f"{name}.crt"), peer_tls_key_file=str(tmp_path / f"{name}.key"), peer_tls_ca_file=str(tmp_path / f"{name}-ca.crt"))


async def test_chunks_flow_over_mutual_tls_and_a_peer_of_another_ca_is_refused(tmp_path):
    deployment = trustme.CA()
    server_tls, _ = peer_tls(tls_files(tmp_path, deployment, "owner"))
    _, client_tls = peer_tls(tls_files(tmp_path, deployment, "asker"))
    stranger_files = tls_files(tmp_path, trustme.CA(), "stranger")
    _, stranger_tls = peer_tls(stranger_files)
    # a certificate of another CA shown to a server it trusts: the server must refuse it
    _, impostor_tls = peer_tls(dataclasses.replace(stranger_files, peer_tls_ca_file=str(tmp_path / "owner-ca.crt")))
    server = ChunkServer(lambda key, start, size, lo, hi: _slice(lo, hi), "127.0.0.1", 0, CHUNK, secret=SECRET, tls=server_tls)
    await server.start()
    asker = PeerClient("127.0.0.1", server.port, CHUNK, secret=SECRET, tls=client_tls)
    stranger = PeerClient("127.0.0.1", server.port, CHUNK, secret=SECRET, tls=stranger_tls)  # even knowing the secret
    impostor = PeerClient("127.0.0.1", server.port, CHUNK, secret=SECRET, tls=impostor_tls)
    plain = PeerClient("127.0.0.1", server.port, CHUNK, secret=SECRET)
    try:
        got = await asyncio.gather(*(asker.get("k", 0, CHUNK, i * 100, i * 100 + 50, 5) for i in range(20)))
        assert [bytes(d) for d, _ in got] == [OBJECT[i * 100 : i * 100 + 50] for i in range(20)]
        assert len(server._connections) == 1
        for client in (stranger, impostor, plain):
            with pytest.raises(PeerError):
                await client.get("k", 0, CHUNK, 0, 10, 5)
        assert len(server._connections) == 1  # neither got past TLS to a connection of the chunk protocol
    finally:
        for client in (asker, stranger, impostor, plain):
            await client.close()
        await server.stop()


def test_tls_settings_are_all_or_nothing_and_must_load(tmp_path):
    assert peer_tls(CacheConfig()) is None
    with pytest.raises(PeerSecurityError, match="NEVE_CACHE_PEER_TLS_KEY_FILE, NEVE_CACHE_PEER_TLS_CA_FILE not set"):
        peer_tls(CacheConfig(peer_tls_cert_file="/x.crt"))
    with pytest.raises(PeerSecurityError, match="TLS files"):
        peer_tls(CacheConfig(peer_tls_cert_file=str(tmp_path / "no.crt"), peer_tls_key_file=str(tmp_path / "no.key"), peer_tls_ca_file=str(tmp_path / "no-ca.crt")))


class Tamperer:
    """A proxy on loopback between a chunk client and its server that flips one byte of the
    server's stream at `offset` (past the handshake: its challenge and verdict frames are 73 bytes)."""

    def __init__(self, upstream_port: int, offset: int) -> None:
        self.upstream_port, self.offset = upstream_port, offset
        self.flipped = False

    async def __aenter__(self) -> Tamperer:
        self.server = await asyncio.start_server(self._proxy, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _proxy(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def pump(reader, writer, tamper: bool) -> None:
            seen = 0
            try:
                while data := await reader.read(65536):
                    if tamper and not self.flipped and seen <= self.offset < seen + len(data):
                        data = bytearray(data)
                        data[self.offset - seen] ^= 0x01
                        self.flipped = True
                    seen += len(data)
                    writer.write(bytes(data))
                    await writer.drain()
            except ConnectionError:
                pass
            finally:
                writer.close()

        await asyncio.gather(pump(client_reader, server_writer, False), pump(server_reader, client_writer, True))


@pytest.mark.parametrize("offset", [73 + 4 + 3, 73 + 4 + 6 + 500, 73 + 4 + 6 + 1000 + 5], ids=["response-id", "chunk-bytes", "tag"])
async def test_a_byte_changed_on_the_way_after_the_handshake_is_caught(offset):
    """Issue 43, finding 10: past its handshake the chunk protocol carried no integrity without
    peer TLS: whoever sat on the path could change a chunk's bytes, and the asking broker served
    them to its consumers. Every frame now carries a tag under the connection's key: a changed
    response fails its request (the broker then reads the object store) and ends the connection."""
    async def serve(key, chunk_start, chunk_size, lo, hi):
        return OBJECT[lo:hi], False

    server = ChunkServer(serve, "127.0.0.1", 0, CHUNK, secret=SECRET)
    await server.start()
    try:
        async with Tamperer(server.port, offset) as proxy:
            client = PeerClient("127.0.0.1", proxy.port, CHUNK, secret=SECRET)
            try:
                with pytest.raises(PeerError, match="tag does not match"):
                    await client.get("a", 0, CHUNK, 0, 1000, timeout=30)
                assert proxy.flipped
                # the proxy flips one byte only: a new connection serves exact bytes
                assert (await client.get("a", 0, CHUNK, 0, 1000, timeout=30))[0] == OBJECT[:1000]
            finally:
                await client.close()
    finally:
        await server.stop()

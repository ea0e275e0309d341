"""Who may use a chunk port: the brokers of one deployment share a secret (a file, e.g. a mounted
Kubernetes Secret), and each connection to a chunk server opens with a challenge-response that
proves, both ways, that the two ends know it without sending it. Chunks can be any topic's
records, so a port anyone can reach and ask must not serve them.

    client  hello     := HELLO u8 | client nonce (32)
    server  challenge := server nonce (32) | server proof (32; absent when the server has no secret)
    client  proof     := client proof (32; absent when the client has no secret)
    server  verdict   := ACCEPTED | REFUSED (u8), then chunk requests flow, or the server closes

    server proof = HMAC-SHA256(secret, "neve chunk server" 0 | client nonce | server nonce)
    client proof = HMAC-SHA256(secret, "neve chunk client" 0 | client nonce | server nonce)

Each frame is length-prefixed like the chunk protocol's (peers.py). HELLO is not the chunk
protocol's version byte, so a server of an older protocol closes on it at once. A client with a
secret refuses a server that proves nothing (or the wrong thing): its chunks would not be
trusted. The handshake is once per connection. With a secret, both ends then derive the
connection's key, and every frame after the handshake carries a tag of its body under it
(`FrameTags`): a byte changed on the way, or a frame of another connection, fails its check and
closes the connection (the asker reads the object store instead).

    session key = HMAC-SHA256(secret, "neve chunk session" 0 | client nonce | server nonce)
    frame tag   = HMAC-SHA256(session key, direction | body)[:TAG_BYTES]

A frame is not numbered: a response is matched to its request by its id, used once on a
connection, so a frame played again answers nothing.

Without a secret (`neve dev`: one node on loopback) the handshake still runs and proves nothing;
a broker serving chunks on an address other than loopback must have a secret unless its
operator says otherwise (`check_chunk_port`). Mutual TLS with the deployment's CA (`peer_tls`)
may wrap the connection besides: it hides the chunks from the network, and binds the handshake
to a peer holding a certificate of the CA."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import secrets
import ssl
import struct

from .config import CacheConfig

HELLO = 0xA7
ACCEPTED, REFUSED = 0, 1
NONCE_BYTES = 32
PROOF_BYTES = hashlib.sha256().digest_size
MIN_SECRET_BYTES = 16
HANDSHAKE_MAX_BYTES = 1 + NONCE_BYTES + PROOF_BYTES
HANDSHAKE_TIMEOUT_S = 10.0
"""A connection that has not proved itself within this long is closed (a server keeps no
half-open strangers)."""
LENGTH = struct.Struct(">I")
SERVER_LABEL = b"neve chunk server\0"
CLIENT_LABEL = b"neve chunk client\0"
SESSION_LABEL = b"neve chunk session\0"
TAG_BYTES = 16
REQUEST_DIRECTION, RESPONSE_DIRECTION = b"q", b"r"
TAG_OFF_LOOP_BYTES = 64 * 1024  # a body at least this large is tagged on a thread (hashlib lets go of the GIL)


class FrameTags:
    """A connection's frame tags (see the module doc); None where the deployment has no secret."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def tag(self, direction: bytes, *pieces: bytes | memoryview) -> bytes:
        mac = hmac.new(self._key, direction, hashlib.sha256)
        for piece in pieces:
            mac.update(piece)
        return mac.digest()[:TAG_BYTES]

    async def tag_async(self, direction: bytes, *pieces: bytes | memoryview) -> bytes:
        if sum(len(p) for p in pieces) < TAG_OFF_LOOP_BYTES:
            return self.tag(direction, *pieces)
        return await asyncio.to_thread(self.tag, direction, *pieces)

    async def opened(self, direction: bytes, frame_body: bytes) -> bytes:
        """A received frame's body without its tag; FrameTagError if the tag does not match."""
        if len(frame_body) < TAG_BYTES:
            raise FrameTagError(f"a frame of {len(frame_body)} bytes holds no tag")
        body, tag = memoryview(frame_body)[:-TAG_BYTES], frame_body[-TAG_BYTES:]
        if not hmac.compare_digest(await self.tag_async(direction, body), tag):
            raise FrameTagError("a frame's tag does not match its bytes")
        return bytes(body)


class FrameTagError(ValueError):
    """A frame after the handshake whose tag does not match: changed on the way, or not this connection's."""


def session_tags(secret: bytes | None, client_nonce: bytes, server_nonce: bytes) -> FrameTags | None:
    return None if secret is None else FrameTags(proof(secret, SESSION_LABEL, client_nonce, server_nonce))


class PeerSecurityError(ValueError):
    """The chunk port's security settings cannot be used: the node must not start."""


class HandshakeRefused(Exception):
    """The other end of a chunk connection did not prove it knows the deployment's secret.
    `reason` labels the refusal in metrics; the message never holds the secret or a proof."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def proof(secret: bytes, label: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(secret, label + client_nonce + server_nonce, hashlib.sha256).digest()


def frame(body: bytes) -> bytes:
    return LENGTH.pack(len(body)) + body


async def read_handshake_frame(reader: asyncio.StreamReader) -> bytes:
    """One handshake frame's body (a stranger's bytes are never read past HANDSHAKE_MAX_BYTES);
    ConnectionResetError if the stream ends first."""
    try:
        (length,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
        if length > HANDSHAKE_MAX_BYTES:
            raise HandshakeRefused("no_handshake", f"a frame of {length} bytes where a handshake was due")
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ConnectionResetError("connection closed during the chunk port's handshake") from None


async def server_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes | None) -> FrameTags | None:
    """The chunk server's side: returns when the client may send requests, with the connection's
    frame tags (None without a secret); HandshakeRefused when it must be closed (told so first if
    it got as far as a proof)."""
    hello = await read_handshake_frame(reader)
    if len(hello) != 1 + NONCE_BYTES or hello[0] != HELLO:
        raise HandshakeRefused("no_handshake", "no handshake: not a chunk client of this version")
    client_nonce, server_nonce = hello[1:], secrets.token_bytes(NONCE_BYTES)
    mine = b"" if secret is None else proof(secret, SERVER_LABEL, client_nonce, server_nonce)
    writer.write(frame(server_nonce + mine))
    await writer.drain()
    theirs = await read_handshake_frame(reader)
    if secret is not None and not hmac.compare_digest(theirs, proof(secret, CLIENT_LABEL, client_nonce, server_nonce)):
        writer.write(frame(bytes([REFUSED])))
        await writer.drain()
        if not theirs:
            raise HandshakeRefused("no_secret", "the client has no secret")
        raise HandshakeRefused("wrong_secret", "the client proved another secret than this broker's")
    writer.write(frame(bytes([ACCEPTED])))
    await writer.drain()
    return session_tags(secret, client_nonce, server_nonce)


async def client_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes | None) -> FrameTags | None:
    """The requesting side: returns once the server accepted this client and, when this client
    has a secret, proved it has the same, with the connection's frame tags (None without a
    secret); HandshakeRefused otherwise. The client proves itself
    before it checks the server, so a server with another secret counts the refusal too."""
    client_nonce = secrets.token_bytes(NONCE_BYTES)
    writer.write(frame(bytes([HELLO]) + client_nonce))
    await writer.drain()
    challenge = await read_handshake_frame(reader)
    if len(challenge) not in (NONCE_BYTES, NONCE_BYTES + PROOF_BYTES):
        raise HandshakeRefused("no_handshake", f"a challenge of {len(challenge)} bytes: not a chunk server of this version")
    server_nonce, theirs = challenge[:NONCE_BYTES], challenge[NONCE_BYTES:]
    writer.write(frame(b"" if secret is None else proof(secret, CLIENT_LABEL, client_nonce, server_nonce)))
    await writer.drain()
    if await read_handshake_frame(reader) != bytes([ACCEPTED]):
        if secret is None:
            raise HandshakeRefused("no_secret", "the peer requires the deployment's secret and this broker has none")
        raise HandshakeRefused("wrong_secret", "the peer refused this broker's secret: the two differ")
    if secret is not None:
        if not theirs:
            raise HandshakeRefused("peer_without_secret", "the peer has no secret: this broker does not trust its chunks")
        if not hmac.compare_digest(theirs, proof(secret, SERVER_LABEL, client_nonce, server_nonce)):
            raise HandshakeRefused("wrong_secret", "the peer proved another secret than this broker's")
    return session_tags(secret, client_nonce, server_nonce)


def load_peer_secret(config: CacheConfig) -> bytes | None:
    """The deployment's chunk-port secret from `peer_secret_file` (surrounding whitespace
    dropped: a file written by `echo` ends in a newline), None when no file is set.
    PeerSecurityError when the file cannot be read or the secret is too short to resist guessing
    from a recorded handshake."""
    path = config.peer_secret_file
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            secret = f.read().strip()
    except OSError as e:
        raise PeerSecurityError(f"cache peer secret file {path}: {e.strerror or e}") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise PeerSecurityError(f"cache peer secret file {path} holds {len(secret)} bytes; at least {MIN_SECRET_BYTES} are needed (e.g. `openssl rand -base64 32`)")
    return secret


def is_loopback(host: str) -> bool:
    """Whether a listen address reaches only this machine. Empty and wildcard addresses listen on
    every interface; a host name other than localhost counts as reachable (it is not resolved:
    what it resolves to can change under a running node)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_chunk_port(host: str, config: CacheConfig, secret: bytes | None) -> None:
    """Refuse (PeerSecurityError, a message for the operator) to serve chunks on an address other
    than loopback without the deployment's secret, unless `peer_insecure` says the network is
    trusted; a node serving chunks calls this before it starts its chunk server."""
    if not config.enabled or secret is not None or config.peer_insecure or is_loopback(host):
        return
    raise PeerSecurityError(
        f"the cache's chunk port would listen on {host or 'every interface'} without a secret: any host reaching it could read every topic's data. "
        "Set NEVE_CACHE_PEER_SECRET_FILE to a file holding the deployment's shared secret (the same on every broker), "
        "or NEVE_CACHE_PEER_INSECURE=true if only trusted hosts can reach the port"
    )


def peer_tls(config: CacheConfig) -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
    """The chunk port's mutual TLS, (server context, client context), from the peer_tls_* files;
    None when none is set. PeerSecurityError when only some are set or one cannot be loaded."""
    files = {"peer_tls_cert_file": config.peer_tls_cert_file, "peer_tls_key_file": config.peer_tls_key_file, "peer_tls_ca_file": config.peer_tls_ca_file}
    if not any(files.values()):
        return None
    missing = [f"NEVE_CACHE_{name.upper()}" for name, value in files.items() if not value]
    if missing:
        raise PeerSecurityError(f"the chunk port's mutual TLS needs a certificate, its key and the CA: {', '.join(missing)} not set")
    contexts = []
    for purpose in (ssl.Purpose.CLIENT_AUTH, ssl.Purpose.SERVER_AUTH):
        try:
            context = ssl.create_default_context(purpose, cafile=config.peer_tls_ca_file)
            context.check_hostname = False  # any certificate of the deployment's CA: see peer_tls_ca_file
            context.verify_mode = ssl.CERT_REQUIRED
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(config.peer_tls_cert_file, config.peer_tls_key_file)
        except (OSError, ssl.SSLError) as e:
            where = f"{config.peer_tls_cert_file}, {config.peer_tls_key_file}, {config.peer_tls_ca_file}"
            raise PeerSecurityError(f"the chunk port's TLS files ({where}): {e.strerror if isinstance(e, OSError) and e.strerror else e}") from None
        contexts.append(context)
    return contexts[0], contexts[1]

"""The chunk protocol between the brokers of a zone: a broker asks a chunk's owner for bytes of it
on the owner's chunk port, and the owner answers from its chunk cache (cache/chunks.py).

Frames are length-prefixed (a 4-byte big-endian length, then the body) and bounded: a request
is at most REQUEST_MAX_BYTES, a response at most its header plus the largest chunk. Requests on
one connection are pipelined and answered in any order, matched by a request id.

    request  := version u8 | id u32 | chunk_start u64 | chunk_size u32 | lo u32 | hi u32 | key_len u16 | key utf-8
                (bytes [chunk_start + lo, chunk_start + hi) of the object `key`, cut in chunks of chunk_size)
    response := id u32 | status u8 | flags u8 | body
                status OK: body is the bytes (flags bit 0: the owner already held the chunk);
                NOT_FOUND / FAILED: body is the reason, utf-8

Each connection opens with the shared-secret handshake (peerauth.py), once: a client that does
not prove the deployment's secret is refused before any request is read. With a secret, every
frame after it ends with its tag (peerauth.FrameTags): one that does not match closes the
connection, as a malformed frame does. A server that reads a
malformed or oversized frame closes that connection (and counts it); it never lets a peer's bytes
raise out of the connection's task."""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from collections.abc import Awaitable, Callable

from wal.store import ObjectNotFound, ObjectStoreError

from . import metrics
from .peerauth import HANDSHAKE_TIMEOUT_S, REQUEST_DIRECTION, RESPONSE_DIRECTION, TAG_BYTES, FrameTagError, FrameTags, HandshakeRefused, client_handshake, server_handshake

log = logging.getLogger("neve.cache.peers")

VERSION = 1
LENGTH = struct.Struct(">I")
REQUEST = struct.Struct(">BIQIIIH")
RESPONSE = struct.Struct(">IBB")
OK, NOT_FOUND, FAILED = 0, 1, 2
HELD = 1  # response flag: the owner held the chunk already
MAX_KEY_BYTES = 1024
REQUEST_MAX_BYTES = REQUEST.size + MAX_KEY_BYTES
MAX_PIPELINED = 64  # requests a server works on at once per connection before it stops reading it

Serve = Callable[[str, int, int, int, int], Awaitable[tuple[bytes | memoryview, bool]]]
"""(key, chunk_start, chunk_size, lo, hi) -> (bytes [lo, hi) of the chunk, whether it was held)"""


class FrameError(ValueError):
    """A frame that breaks the protocol: its connection is closed."""


class PeerError(Exception):
    """A chunk request to a peer got no answer: unreachable, connection lost, or a broken answer."""


class PeerTimeout(PeerError):
    """The peer did not answer within the deadline."""


class PeerRefused(PeerError):
    """The peer and this broker do not share the deployment's secret (one has none, or they
    differ): a configuration fault, not a peer down; its chunks are read from the store."""


def encode_request(request_id: int, key: str, chunk_start: int, chunk_size: int, lo: int, hi: int) -> bytes:
    raw = key.encode()
    if len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"object key of {len(raw)} bytes: the chunk protocol takes at most {MAX_KEY_BYTES}")
    body = REQUEST.pack(VERSION, request_id, chunk_start, chunk_size, lo, hi, len(raw)) + raw
    return LENGTH.pack(len(body)) + body


def decode_request(body: bytes, max_chunk_bytes: int) -> tuple[int, str, int, int, int, int]:
    """(id, key, chunk_start, chunk_size, lo, hi) of a request body; FrameError if it is not one."""
    if len(body) < REQUEST.size:
        raise FrameError(f"request of {len(body)} bytes is shorter than its header")
    version, request_id, chunk_start, chunk_size, lo, hi, key_len = REQUEST.unpack_from(body)
    if version != VERSION:
        raise FrameError(f"protocol version {version}, not {VERSION}")
    if REQUEST.size + key_len != len(body):
        raise FrameError(f"key length {key_len} does not match a request of {len(body)} bytes")
    if not 0 < chunk_size <= max_chunk_bytes or not 0 <= lo < hi <= chunk_size or chunk_start % chunk_size:
        raise FrameError(f"range [{lo}, {hi}) of a chunk of {chunk_size} at {chunk_start} (chunks up to {max_chunk_bytes})")
    try:
        key = body[REQUEST.size :].decode()
    except UnicodeDecodeError:
        raise FrameError("object key is not utf-8") from None
    return request_id, key, chunk_start, chunk_size, lo, hi


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes | None:
    """One frame's body, or None at a clean end of stream; FrameError if it is larger than max_bytes."""
    try:
        head = await reader.readexactly(LENGTH.size)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise FrameError("stream ended inside a frame length") from None
        return None
    (length,) = LENGTH.unpack(head)
    if length > max_bytes:
        raise FrameError(f"frame of {length} bytes, at most {max_bytes} accepted")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise FrameError(f"stream ended inside a frame of {length} bytes") from None


async def opened(tags: FrameTags, direction: bytes, body: bytes) -> bytes:
    """A frame's body without its tag; FrameError if the tag does not match."""
    try:
        return await tags.opened(direction, body)
    except FrameTagError as e:
        raise FrameError(str(e)) from None


class ChunkServer:
    """Serves this broker's chunks to the zone's other brokers on `host`:`port` (0: any free port),
    to those proving they know `secret` (None: to any that completes the handshake), over TLS
    when given a server context (peerauth.peer_tls)."""

    def __init__(self, serve: Serve, host: str, port: int, max_chunk_bytes: int, *, secret: bytes | None = None, tls: ssl.SSLContext | None = None) -> None:
        self._serve = serve
        self._secret = secret
        self._tls = tls
        self.host = host
        self.port = port
        self.max_chunk_bytes = max_chunk_bytes
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, self.host, self.port, ssl=self._tls, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if self._tls else None)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        slots = asyncio.Semaphore(MAX_PIPELINED)
        working: set[asyncio.Task] = set()
        try:
            try:
                async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                    tags = await server_handshake(reader, writer, self._secret)
            except TimeoutError:
                raise HandshakeRefused("timeout", f"no handshake within {HANDSHAKE_TIMEOUT_S:.0f}s") from None
            while True:
                body = await read_frame(reader, REQUEST_MAX_BYTES + (TAG_BYTES if tags else 0))
                if body is None:
                    break
                if tags is not None:
                    body = await opened(tags, REQUEST_DIRECTION, body)
                request = decode_request(body, self.max_chunk_bytes)
                await slots.acquire()
                job = asyncio.create_task(self._answer(request, writer, slots, tags))
                working.add(job)
                job.add_done_callback(working.discard)
        except HandshakeRefused as e:
            metrics.PEER_REFUSED.labels(e.reason).inc()
            log.warning("chunk_peer_refused", extra={"peer": _peer_name(writer), "reason": e.reason, "error": str(e)})
        except FrameError as e:
            metrics.BAD_FRAMES.inc()
            log.warning("chunk_peer_bad_frame", extra={"peer": _peer_name(writer), "error": str(e)})
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            for job in working:
                job.cancel()
            writer.close()
            self._connections.discard(task)

    async def _answer(self, request: tuple[int, str, int, int, int, int], writer: asyncio.StreamWriter, slots: asyncio.Semaphore, tags: FrameTags | None = None) -> None:
        request_id, key, chunk_start, chunk_size, lo, hi = request
        try:
            try:
                data, held = await self._serve(key, chunk_start, chunk_size, lo, hi)
                head = RESPONSE.pack(request_id, OK, HELD if held else 0)
            except ObjectNotFound as e:
                data, head = str(e).encode(), RESPONSE.pack(request_id, NOT_FOUND, 0)
            except ObjectStoreError as e:
                data, head = str(e).encode(), RESPONSE.pack(request_id, FAILED, 0)
            except Exception as e:  # a bug here must not take the connection's other requests down
                log.exception("chunk_serve_failed", extra={"key": key, "chunk_start": chunk_start})
                data, head = repr(e).encode(), RESPONSE.pack(request_id, FAILED, 0)
            tag = b"" if tags is None else await tags.tag_async(RESPONSE_DIRECTION, head, data)
            if writer.is_closing():
                return
            writer.write(LENGTH.pack(len(head) + len(data) + len(tag)) + head)  # the three writes are one frame: no await between
            writer.write(data)
            writer.write(tag)
            if head[4] == OK:
                metrics.PEER_BYTES_OUT.inc(len(data))
            await writer.drain()
        except (ConnectionError, OSError):
            writer.close()
        finally:
            slots.release()


def _peer_name(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if peer else "?"


class PeerClient:
    """One connection to one peer's chunk server, requests pipelined over it; reconnects on the
    next request after the connection is lost. Each connection proves `secret` (the deployment's;
    None: none) once, before its first request, over TLS when given a client context."""

    def __init__(self, host: str, port: int, max_chunk_bytes: int, *, secret: bytes | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self._secret = secret
        self._tls = tls
        self.port = port
        self.max_response_bytes = RESPONSE.size + max(max_chunk_bytes, 4096)
        self._writer: asyncio.StreamWriter | None = None
        self._tags: FrameTags | None = None  # the connection's frame tags (peerauth.py)
        self._reading: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self._connecting = asyncio.Lock()
        self._closed = False

    async def get(self, key: str, chunk_start: int, chunk_size: int, lo: int, hi: int, timeout: float) -> tuple[bytes, bool]:
        """Bytes [lo, hi) of the chunk at `chunk_start` and whether the peer held it already.
        Raises PeerTimeout past `timeout` (connecting included), PeerRefused if the peer and this
        broker do not share the secret, PeerError if the peer cannot be reached or breaks the
        protocol, ObjectNotFound / ObjectStoreError as the peer's store did."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                writer, tags = await self._connected()
                self._next_id = (self._next_id + 1) & 0xFFFFFFFF
                request_id = self._next_id
                fut = loop.create_future()
                self._pending[request_id] = fut
                try:
                    request = encode_request(request_id, key, chunk_start, chunk_size, lo, hi)
                    if tags is not None:
                        body = request[LENGTH.size :]
                        request = LENGTH.pack(len(body) + TAG_BYTES) + body + tags.tag(REQUEST_DIRECTION, body)
                    writer.write(request)
                    await writer.drain()
                    status, flags, body = await fut
                finally:
                    self._pending.pop(request_id, None)
        except TimeoutError:
            raise PeerTimeout(f"no answer from {self.host}:{self.port} within {timeout:.3f}s") from None
        except (ConnectionError, OSError) as e:
            self._drop(PeerError(f"{self.host}:{self.port}: {e!r}"))
            raise PeerError(f"{self.host}:{self.port}: {e!r}") from e
        if status == OK:
            if len(body) > hi - lo:  # fewer is the object's end
                metrics.BAD_FRAMES.inc()
                error = PeerError(f"{self.host}:{self.port} answered {len(body)} bytes for a range of {hi - lo}")
                self._drop(error)
                raise error
            return body, bool(flags & HELD)
        reason = body.decode(errors="replace")
        if status == NOT_FOUND:
            raise ObjectNotFound(reason)
        raise ObjectStoreError(f"chunk owner {self.host}:{self.port}: {reason}")

    async def _connected(self) -> tuple[asyncio.StreamWriter, FrameTags | None]:
        async with self._connecting:
            if self._closed:
                raise PeerError("closed")
            if self._writer is None or self._writer.is_closing():
                reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self._tls)
                try:
                    tags = await client_handshake(reader, writer, self._secret)
                except HandshakeRefused as e:
                    writer.close()
                    raise PeerRefused(f"{self.host}:{self.port}: {e}") from None
                except BaseException:  # lost, or the request's deadline passed mid-handshake
                    writer.close()
                    raise
                self._writer, self._tags = writer, tags
                self._reading = asyncio.create_task(self._read(reader, writer, tags))
            return self._writer, self._tags

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tags: FrameTags | None = None) -> None:
        error: PeerError = PeerError(f"{self.host}:{self.port} closed the connection")
        try:
            while True:
                body = await read_frame(reader, self.max_response_bytes + (TAG_BYTES if tags else 0))
                if body is None:
                    break
                if tags is not None:
                    body = await opened(tags, RESPONSE_DIRECTION, body)
                if len(body) < RESPONSE.size:
                    raise FrameError(f"response of {len(body)} bytes is shorter than its header")
                request_id, status, flags = RESPONSE.unpack_from(body)
                fut = self._pending.pop(request_id, None)
                if fut is not None and not fut.done():  # None: its requester gave up (deadline)
                    fut.set_result((status, flags, body[RESPONSE.size :]))
        except FrameError as e:
            metrics.BAD_FRAMES.inc()
            error = PeerError(f"{self.host}:{self.port} broke the chunk protocol: {e}")
            log.warning("chunk_peer_bad_frame", extra={"peer": f"{self.host}:{self.port}", "error": str(e)})
        except (ConnectionError, OSError) as e:
            error = PeerError(f"{self.host}:{self.port}: {e!r}")
        except asyncio.CancelledError:
            error = PeerError("closed")
            raise
        finally:
            if self._writer is writer:
                self._drop(error)
            writer.close()

    def _drop(self, error: PeerError) -> None:
        """Forget the connection and fail the requests waiting on it."""
        if self._writer is not None:
            self._writer.close()
        self._writer = None
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(error)

    async def close(self) -> None:
        self._closed = True
        self._drop(PeerError("closed"))
        if self._reading is not None:
            self._reading.cancel()
            await asyncio.gather(self._reading, return_exceptions=True)

"""One client connection: decoding, concurrent handling, in-order replies, close (the frames
themselves come off the socket in framing.py).

A reader task reads frames and starts one handler task per request, in arrival order (so a
connection's produce requests reach the WAL buffer in the order they were sent); a writer task
sends the responses strictly in request order. Two error tiers: request-level failures are Kafka
error codes inside the response (the handler's job); a broken protocol (bad framing, undecodable
request, unknown API or version) closes the connection, and only this connection.

Each connection is placed by the zone its first request's client id names (a zone some live
broker is in, else none) and counts its bytes in and out under (client zone, this broker's zone),
so a scrape shows whether zoned clients stayed in their zone. Group requests go through the
listener's GroupForwarder (broker/forwarding.py), which relays a zoned client's to its group's
coordinator in another zone; a request another broker relayed here is answered here, and the
connection carrying them is counted as a broker's. Such a relay link is the one exception to
in-order replies: it carries many clients' requests, a JoinGroup among them may wait minutes for
its rebalance, and the relaying broker matches answers by correlation id, so each is sent as soon
as it is ready. Its requests in flight are bounded by the relaying broker (forwarding.MAX_IN_FLIGHT),
not by this connection's slots.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time

from auth.session import ANONYMOUS, Session, has_control_character
from auth.tls import MappingRule, certificate_subject, map_subject

from .codec import PRODUCE, MalformedRequest, decode_request, encode_response, peek_header, response_module
from .context import RequestContext, Services
from .forwarding import GROUP_APIS, MAX_IN_FLIGHT, BadRelayMark, GroupForwarder, relayed_for
from .framing import FrameRefused, FrameSizeError, FrameStream
from .handlers.api18_api_versions import unsupported_version_response
from .listeners import Listener
from .locality import known_zone
from .metrics import CLIENT_TRAFFIC, CONNECTIONS, PEER_BROKER, LoopCounter, requests_of
from .registry import HANDLERS

log = logging.getLogger("neve.broker.connection")

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
# what a SASL connection may ask before it has authenticated (and once its authentication expired)
BEFORE_AUTHENTICATION = frozenset((API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE))
SEND_BATCH_BYTES = 1024 * 1024  # ready responses are written once they add up to this much
MAX_CONTEXTS = 256  # request contexts kept per connection (see Connection._contexts)


class CloseReason(enum.Enum):
    CLIENT_CLOSED = "client closed"
    FRAME_TOO_LARGE = "frame larger than the limit"
    BAD_FRAME = "bad frame length"
    MALFORMED = "undecodable request"
    UNKNOWN_API = "unknown api key"
    UNSUPPORTED_VERSION = "unsupported api version"
    HANDLER_FAILED = "handler failed"
    NOT_AUTHENTICATED = "request before authentication"
    AUTHENTICATION_FAILED = "authentication failed"
    AUTHENTICATION_EXPIRED = "authentication expired"
    AUTHENTICATION_TIMEOUT = "not authenticated in time"
    CERTIFICATE_UNMAPPED = "no principal mapping rule matches the client certificate, or its name holds a control character"
    UNTRUSTED_RELAY = "a relayed request from a connection that is not a broker's"
    FAULT_INJECTED = "fault injection"
    SHUTDOWN = "broker shutting down"


class _Close(Exception):
    def __init__(self, reason: CloseReason, detail: str = "") -> None:
        super().__init__(detail or reason.value)
        self.reason = reason
        self.detail = detail


class Connection:
    def __init__(
        self,
        services: Services,
        stream: FrameStream,
        forwarder: GroupForwarder | None = None,
        listener: Listener | None = None,
        principal_rules: list[MappingRule] | None = None,
        relays: bool = True,
    ) -> None:
        self.services = services
        self.stream = stream
        self.forwarder = forwarder
        self.peer = stream.peer
        self.session = _session(stream, listener, principal_rules)
        stream.authenticated = lambda: self.session.authenticated  # a SASL listener's stream opens then (framing.Gate)
        settings = services.settings
        # Produce requests are bounded by the WAL buffer's bytes (`wal.room()`) and their own
        # count; the others, whose responses can be large, by a small count of their own.
        self._replies: asyncio.Queue = asyncio.Queue(maxsize=settings.max_inflight_requests + settings.max_inflight_produce_requests)
        self._other_slots = asyncio.Semaphore(settings.max_inflight_requests)
        self._produce_count = 0
        self._closed = asyncio.Event()
        self.close_reason: CloseReason | None = None
        # A context is the same for every request of one API version from one client id (it is
        # immutable): made once, not per request (thousands a second at many partitions).
        self._contexts: dict[tuple[int, int, str | None], RequestContext] = {}
        # Bytes in and out, counted here until the first decoded request places the connection
        # (an ApiVersions of a version too new is answered undecoded), then in its zones' counters.
        self._bytes_in = LoopCounter()
        self._bytes_out = LoopCounter()
        self._open: LoopCounter | None = None  # this connection's zones' open connections, once placed
        self._relay_link = False  # carries requests another broker relays (answered out of order)
        self._relays = relays  # on the listener brokers relay to: the only one a relay mark is trusted on
        self._relay_slots = asyncio.Semaphore(MAX_IN_FLIGHT)  # a relay link's requests in flight (the relaying broker's own bound)
        self._listener = listener.name if listener is not None else ""
        self._state = "authenticated" if self.session.authenticated else "authenticating"
        CONNECTIONS.labels(self._listener, self._state).inc()

    async def serve(self) -> None:
        sender = asyncio.create_task(self._send_replies())
        deadline = None
        if self.session.uses_sasl and not self.session.authenticated:
            deadline = asyncio.get_running_loop().call_later(self.services.settings.authentication_timeout_ms / 1000, self._authentication_deadline)
        try:
            if self.session.principal is None:
                raise _Close(CloseReason.CERTIFICATE_UNMAPPED)
            await self._read_requests()
        except _Close as e:
            self._note_close(e.reason, e.detail)
        except (ConnectionError, asyncio.IncompleteReadError):
            self._note_close(CloseReason.CLIENT_CLOSED)
        except asyncio.CancelledError:
            self._note_close(CloseReason.SHUTDOWN)
            raise
        finally:
            if deadline is not None:
                deadline.cancel()
            # Let already-accepted requests finish and be answered unless the protocol broke.
            if self.close_reason in (None, CloseReason.CLIENT_CLOSED):
                await self._replies.put(None)
                try:
                    await asyncio.wait_for(sender, timeout=self.services.settings.produce_timeout_ms / 1000 + 5)
                except (TimeoutError, asyncio.CancelledError, Exception):
                    sender.cancel()
            else:
                sender.cancel()
                self._drain_pending()
            self.stream.close()
            if self._open is not None:
                self._open.inc(-1)
            CONNECTIONS.labels(self._listener, self._state).dec()

    def _authentication_deadline(self) -> None:
        if not self.session.authenticated and self.close_reason is None:
            self._note_close(CloseReason.AUTHENTICATION_TIMEOUT, f"{self.services.settings.authentication_timeout_ms} ms")
            self._abort()

    def _note_close(self, reason: CloseReason, detail: str = "") -> None:
        if self.close_reason is None:
            self.close_reason = reason
            level = logging.DEBUG if reason in (CloseReason.CLIENT_CLOSED, CloseReason.SHUTDOWN) else logging.WARNING
            log.log(level, "connection_closed", extra={"peer": str(self.peer), "reason": reason.value, "detail": detail})

    def _drain_pending(self) -> None:
        while not self._replies.empty():
            item = self._replies.get_nowait()
            if item is not None:
                item[0].cancel()

    async def _read_requests(self) -> None:
        wal, replies = self.services.wal, self._replies
        while True:
            try:
                frame = await self.stream.read_frame()
            except FrameSizeError as e:
                if e.size < 8:
                    raise _Close(CloseReason.BAD_FRAME, f"frame length {e.size}") from None
                raise _Close(CloseReason.FRAME_TOO_LARGE, f"{e.size} > {e.limit}") from None
            except FrameRefused as e:  # Kafka closes a SASL connection that asks anything else first
                raise _Close(CloseReason.NOT_AUTHENTICATED, f"api {e.api_key}") from None
            produce = frame[:2] == b"\x00\x00"
            slotted = False
            if produce:  # wait while the WAL buffer is full
                if not wal.has_room():
                    await wal.room()
            elif not self._relay_link:  # a slot, given back when the handler is done (see _send_replies)
                await self._other_slots.acquire()
                slotted = True
            else:  # a relay link's: given back once its answer is sent (_answer_relayed)
                await self._relay_slots.acquire()
            task = self._dispatch(frame)
            self._bytes_in.inc(len(frame) + 4)
            self.stream.recycle(frame)  # decoded: kio copied out everything the handler uses
            if task is not None and self._relay_link:
                # the link's first relayed request took a client's slot; a produce request none
                slots = self._other_slots if slotted else None if produce else self._relay_slots
                task[0].add_done_callback(lambda done, item=task, slots=slots: self._answer_relayed(item, slots))
            elif task is not None:
                # no coroutine per request (thousands a second) unless the queue is full
                if replies.full():
                    await replies.put(task)
                else:
                    replies.put_nowait(task)
            elif slotted:
                self._other_slots.release()
            elif self._relay_link and not produce:
                self._relay_slots.release()
            if task is not None and task[1] in (SASL_HANDSHAKE, SASL_AUTHENTICATE) and not self.session.authenticated:
                # one exchange at a time before authentication, as Kafka's authenticator mutes the
                # channel meanwhile: pipelined attempts do not queue password hashes; after a
                # failed one nothing more is read (the reply is sent, then the connection closed)
                await asyncio.wait([task[0]])
                if self.session.close_after_reply:
                    self.stream.stop_reading()
                    return
                if self.session.authenticated:
                    CONNECTIONS.labels(self._listener, self._state).dec()
                    self._state = "authenticated"
                    CONNECTIONS.labels(self._listener, self._state).inc()

    def _dispatch(self, frame: bytes | memoryview):
        """Decode one frame and start its handler; returns (task, api_key, version, correlation id)."""
        api_key, version, correlation_id = peek_header(frame)
        session = self.session
        if api_key not in BEFORE_AUTHENTICATION and (not session.authenticated or (session.expires_at is not None and time.monotonic() > session.expires_at)):
            # Kafka closes a SASL connection that sends anything else before authenticating, or
            # after its session lifetime without re-authenticating (KIP-368)
            raise _Close(CloseReason.NOT_AUTHENTICATED if not session.authenticated else CloseReason.AUTHENTICATION_EXPIRED, f"api {api_key}")
        handler = HANDLERS.get(api_key)
        if handler is None:
            raise _Close(CloseReason.UNKNOWN_API, f"api key {api_key}")
        if not handler.min_version <= version <= handler.max_version:
            if api_key == API_VERSIONS:
                # KIP-511: answer in v0 with UNSUPPORTED_VERSION and our ranges so the client can retry.
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(unsupported_version_response())
                return fut, api_key, 0, correlation_id
            raise _Close(CloseReason.UNSUPPORTED_VERSION, f"api {api_key} v{version}")
        try:
            header, body = decode_request(frame, api_key, version)
        except MalformedRequest as e:
            raise _Close(CloseReason.MALFORMED, str(e)) from None
        requests_of(handler.name).inc()
        client_id = getattr(header, "client_id", None)
        relayed_host, relayed_principal = None, ""
        if api_key in GROUP_APIS:
            try:
                client_id, relayed_host, relayed_principal = relayed_for(client_id)
            except BadRelayMark as e:
                raise _Close(CloseReason.UNTRUSTED_RELAY, str(e)) from None
        if self._open is None and not (session.uses_sasl and api_key in BEFORE_AUTHENTICATION):
            # placed by its first request past authentication: a relay link's first marked request
            # comes after its SASL exchange, whose client id names no client
            self._place(client_id, relayed=relayed_host is not None)
        ctx = self._contexts.get((api_key, version, client_id))
        if relayed_host is not None:  # the member's own host and principal, not the relaying broker's
            if not self._relays:
                raise _Close(CloseReason.UNTRUSTED_RELAY, f"a relayed request on listener {self._listener}, not the inter-broker one")
            authorizer = self.services.authorizer
            if authorizer is not None and session.principal not in authorizer.super_users:
                # only a broker (a super user) may speak for a client it authenticated
                raise _Close(CloseReason.UNTRUSTED_RELAY, f"{session.principal} relayed for {relayed_principal or '?'}")
            self._relay_link = True
            member = Session(session.protocol, session.listener, relayed_host, relayed_principal or session.principal)
            ctx = RequestContext(self.services, api_key, version, client_id, response_module(api_key, version), (relayed_host, 0), member)
        elif ctx is None:
            if len(self._contexts) >= MAX_CONTEXTS:
                self._contexts.clear()
            ctx = self._contexts[(api_key, version, client_id)] = RequestContext(
                services=self.services,
                api_key=api_key,
                api_version=version,
                client_id=client_id,
                response=response_module(api_key, version),
                peer=self.peer,
                session=session,
            )
        try:
            if self.forwarder is not None and relayed_host is None and api_key in GROUP_APIS:
                answer = self.forwarder.answer(ctx, handler, body, bytes(frame))  # relayed, or handler.fn's
            else:
                answer = handler.fn(ctx, body)  # a coroutine, made a task; or Produce's own future
            if not isinstance(answer, asyncio.Future):
                answer = asyncio.ensure_future(answer)
        except Exception as e:  # a handler that is not a coroutine failed at once: as if its task had
            answer = asyncio.get_running_loop().create_future()
            answer.set_exception(e)
        return answer, api_key, version, correlation_id

    def _place(self, client_id: str | None, relayed: bool = False) -> None:
        services = self.services
        client_zone = PEER_BROKER if relayed else known_zone(client_id, services.live_brokers())
        bytes_in, bytes_out, self._open = CLIENT_TRAFFIC.counters(client_zone, services.settings.zone)
        bytes_in.inc(self._bytes_in.value)
        bytes_out.inc(self._bytes_out.value)
        self._bytes_in, self._bytes_out = bytes_in, bytes_out
        self._open.inc()

    def _answer_relayed(self, item, slots: asyncio.Semaphore | None) -> None:
        """Send the answer of a relay link's request as soon as it is ready (see the module doc)."""
        task, api_key, version, correlation_id = item
        if slots is not None:
            slots.release()
        if self.close_reason is not None or task.cancelled():
            return
        try:
            response = task.result()
            pieces = encode_response(api_key, version, correlation_id, response)
        except Exception as e:
            log.exception("handler_failed", extra={"api_key": api_key, "api_version": version, "peer": str(self.peer)})
            self._note_close(CloseReason.HANDLER_FAILED, repr(e))
            self._abort()
            return
        self._bytes_out.inc(sum(map(len, pieces)))
        self._send(pieces)

    async def _send_replies(self) -> None:
        """Answer the requests in order. Responses that are ready together (a WAL commit answers
        every produce request it holds at once) leave in one write: one system call for many
        responses, and fewer wake-ups for the client reading them."""
        drop_every = self.services.faults.drop_produce_response_every
        ready: list[bytes] = []
        ready_bytes = 0
        while True:
            if self._replies.empty():
                await self._flush(ready)
                ready_bytes = 0
                item = await self._replies.get()
            else:
                item = self._replies.get_nowait()
            if item is None:
                self._send(ready)
                return
            task, api_key, version, correlation_id = item
            if api_key != PRODUCE:
                task.add_done_callback(lambda _: self._other_slots.release())
            if not task.done():
                await self._flush(ready)
                ready_bytes = 0
            try:
                response = await task
            except Exception as e:
                log.exception("handler_failed", extra={"api_key": api_key, "api_version": version, "peer": str(self.peer)})
                self._send(ready)
                self._note_close(CloseReason.HANDLER_FAILED, repr(e))
                self._abort()
                return
            if response is None:  # acks=0
                continue
            if api_key == PRODUCE and drop_every:
                self._produce_count += 1
                if self._produce_count % drop_every == 0:
                    log.warning("fault_drop_produce_response", extra={"peer": str(self.peer), "correlation_id": correlation_id})
                    self._send(ready)
                    self._note_close(CloseReason.FAULT_INJECTED)
                    self._abort()
                    return
            try:
                pieces = encode_response(api_key, version, correlation_id, response)
            except Exception as e:
                log.exception("response_encoding_failed", extra={"api_key": api_key, "api_version": version})
                self._send(ready)
                self._note_close(CloseReason.HANDLER_FAILED, repr(e))
                self._abort()
                return
            ready += pieces
            size = sum(map(len, pieces))
            ready_bytes += size
            self._bytes_out.inc(size)
            if api_key == SASL_AUTHENTICATE and self.session.close_after_reply:
                # a failed authentication: the client reads its error, then the connection closes
                await self._flush(ready)
                self._note_close(CloseReason.AUTHENTICATION_FAILED, self.session.mechanism or "")
                self._drain_pending()
                self.stream.close()
                return
            if ready_bytes >= SEND_BATCH_BYTES:
                await self._flush(ready)
                ready_bytes = 0

    def _send(self, ready: list[bytes]) -> None:
        """Hand the ready responses to the transport in one write, and forget them."""
        if ready:
            self.stream.writelines(ready)
            ready.clear()

    async def _flush(self, ready: list[bytes]) -> None:
        """_send, then wait while the client leaves more than 4 MiB of responses unread."""
        self._send(ready)
        if self.stream.write_buffer_size() > 4 * 1024 * 1024:
            await self.stream.drain()

    def _abort(self) -> None:
        self._drain_pending()
        self.stream.abort()


def _session(stream: FrameStream, listener: Listener | None, rules: list[MappingRule] | None) -> Session:
    """The connection's security session. On an SSL listener a client certificate names the
    principal (through the mapping rules; None when no rule matches, and the connection is
    refused); on SASL listeners the principal comes with the authentication."""
    host = stream.peer[0] if isinstance(stream.peer, tuple) and stream.peer else ""
    if listener is None:
        return Session(host=host)
    session = Session(listener.protocol, listener.name, host)
    if listener.protocol == "SSL" and stream.transport is not None:
        sslobj = stream.transport.get_extra_info("ssl_object")
        der = sslobj.getpeercert(binary_form=True) if sslobj is not None else None
        if der:
            name = map_subject(certificate_subject(der), rules or [MappingRule(None)])
            # a name with a control character is refused as an unmapped one is (auth.session)
            session.principal = None if name is None or has_control_character(name) else f"User:{name}"  # type: ignore[assignment]
        else:
            session.principal = ANONYMOUS
    return session

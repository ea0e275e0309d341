"""Group requests relayed across zones: a zoned client is told a coordinator in its own zone
(FindCoordinator), and that broker, when the group's coordinator is in another zone, forwards the
client's group requests to it over a pooled broker-to-broker Kafka connection and relays the
answers. Client bytes stay in the client's zone; only the small group-protocol frames cross it.

Why relay and not send the client there: a zoned client's Metadata lists only its zone's
brokers, and clients do not keep a connection to a coordinator their Metadata does not list
(librdkafka drops and re-adds it on every refresh, aiokafka refuses it). A group still has one
coordinator (its live state, join barrier and generations are one broker's: groups/coordinator.py).

Which requests: those of a client whose hint names a live zone, for a group whose coordinator is
not this broker while this broker is the one FindCoordinator names to that client (rendezvous of
the group id over the client's zone's live brokers). Any other request for a group this broker
does not coordinate is answered here, NOT_COORDINATOR, and the client looks it up again.

On the wire: the frame goes as received, with two changes. Its correlation id is the link's own
(answers are matched by it, so one link carries many requests at once: a JoinGroup waiting for a
rebalance holds up no other group's heartbeat), and its client id carries the client's own client
id, host and principal, then RELAY_MARK and their three lengths (`mark`): read from its end, so
that nothing a client chose (a client id, a certificate subject or a token's subject holding the
mark) can move where the principal starts. The receiver strips the mark (the member keeps its own client id and host), never
forwards a marked request again (the loop guard: if it is not the coordinator either, it answers
NOT_COORDINATOR), and counts the link as a broker's connection, not a client's. The answer is
relayed as sent, with the client's correlation id put back. Nothing in a group answer names a
broker, so a relayed answer sends the client nowhere else.

A request that names several groups (OffsetFetch v8+, DescribeGroups, DeleteGroups,
ConsumerGroupDescribe) whose coordinators differ is split: one request per coordinator (the same
header, the body re-encoded with its groups), the answers merged in the request's order.

Each relayed request has a deadline (a JoinGroup: its rebalance timeout and then some); past it,
or when the link to the coordinator fails, the client gets the handler's own answer for
COORDINATOR_NOT_AVAILABLE, looks the coordinator up again and retries. Requests in flight per
link are bounded; one that finds no room waits within its deadline."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import io
import logging
import struct
from collections.abc import Sequence
from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from .authorization import DESCRIBE, GROUP, allowed
from .codec import OwnFrame, has_field, request_codec
from .groups.coordinator import coordinator_for
from .groups.group import GroupError
from .locality import known_zone
from .metrics import GROUP_FORWARD_BYTES, GROUP_FORWARD_FAILURES, GROUP_FORWARDS, GROUP_FORWARDS_IN_FLIGHT
from .peer_dial import PeerDialer

log = logging.getLogger("neve.broker.forwarding")

# Appended to a relayed request's client id, then the client's host. A unit separator: no client
# writes one, so a client cannot turn the guard on or off by accident.
RELAY_MARK = "\x1fneve-relay@"
JOIN_GROUP, SYNC_GROUP = 11, 14
# Every implemented API that names a group and is answered by its coordinator (FindCoordinator is
# answered here; ListGroups lists this broker's own groups).
GROUP_APIS = frozenset({8, 9, 11, 12, 13, 14, 15, 28, 42, 47, 68, 69})  # 28: TxnOffsetCommit, checked against the group's members
# Requests naming several groups: (request field listing them, response field answering them).
BATCHES = {9: ("groups", "groups"), 15: ("groups", "groups"), 42: ("groups_names", "results"), 69: ("group_ids", "groups")}
TIMEOUT_S = 30.0
# A SyncGroup waits for the leader's assignments, which may take the leader's whole rebalance
# timeout (Kafka's consumers default to max.poll.interval.ms, 5 minutes); its request says nothing of it.
SYNC_TIMEOUT_S = 300.0 + TIMEOUT_S
MAX_IN_FLIGHT = 1024  # per link
_SIZE = struct.Struct(">i")
_CLIENT_ID_LENGTH = struct.Struct(">h")


class BadRelayMark(ValueError):
    """A client id holding RELAY_MARK that `mark` did not make."""


def mark(client_id: str | None, host: str, principal: str) -> str:
    """The client id a relayed request carries: the client's own, its host and the principal it
    authenticated as on the relaying broker, then RELAY_MARK and the three lengths."""
    own = client_id or ""
    return f"{own}{host}{principal}{RELAY_MARK}{len(own)},{len(host)},{len(principal)}"


def relayed_for(client_id: str | None) -> tuple[str | None, str | None, str]:
    """(the client's own client id, its host, the principal it authenticated as, "" if unsaid) of
    a relayed request (`mark`); (client_id, None, "") otherwise. Raises BadRelayMark for a mark
    whose lengths do not add up (not made by `mark`)."""
    if not client_id or RELAY_MARK not in client_id:
        return client_id, None, ""
    head, _, lengths = client_id.rpartition(RELAY_MARK)
    try:
        own, host, principal = (int(n) for n in lengths.split(","))
    except ValueError:
        raise BadRelayMark(f"relay mark lengths {lengths[:40]!r}") from None
    if min(own, host, principal) < 0 or own + host + principal != len(head) or not lengths.replace(",", "").isdigit():
        raise BadRelayMark(f"relay mark lengths {lengths[:40]!r} against {len(head)} characters")
    return head[:own] or None, head[own : own + host], head[own + host :]


def with_client_id(frame: bytes, client_id: str) -> bytes:
    """The request frame (no length prefix) with its header's client id replaced."""
    (old,) = _CLIENT_ID_LENGTH.unpack_from(frame, 8)
    new = client_id.encode()
    return b"".join((frame[:8], _CLIENT_ID_LENGTH.pack(len(new)), new, frame[10 + max(old, 0) :]))


def group_ids(api_key: int, body: Any) -> list[str]:
    batch = BATCHES.get(api_key)
    if batch is not None and has_field(body, batch[0]):
        return [item if isinstance(item, str) else item.group_id for item in getattr(body, batch[0])]
    return [body.group_id]


class Relayed(OwnFrame):
    """The coordinator's answer as it sent it, under the client's correlation id."""

    __slots__ = ("answer",)

    def __init__(self, answer: bytes) -> None:
        self.answer = answer

    def frame(self, version: int, correlation_id: int) -> list[bytes | bytearray]:
        out = bytearray(4 + len(self.answer))
        out[4:] = self.answer
        _SIZE.pack_into(out, 0, len(self.answer))
        _SIZE.pack_into(out, 4, correlation_id)
        return [out]


class LinkLost(ConnectionError):
    """The link to a coordinator closed or failed with requests in flight."""


class PeerLink:
    """One pipelined Kafka connection to another broker: requests are written as they come, and
    each answer goes to the request whose correlation id it carries. Opened on first use; when it
    fails, every request in flight fails with it and the next request opens a new one."""

    def __init__(self, host: str, port: int, max_in_flight: int = MAX_IN_FLIGHT, dialer: PeerDialer | None = None) -> None:
        self.address = (host, port)
        self.dialer = dialer or PeerDialer()
        self._room = asyncio.Semaphore(max_in_flight)
        self._pending: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._opening: asyncio.Lock = asyncio.Lock()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def request(self, frame: bytes) -> bytes:
        """Send a request frame (no length prefix; its correlation id is replaced) and return the
        answer frame (no length prefix, the link's correlation id first). The caller bounds the
        wait; a request given up on leaves its late answer to be dropped."""
        async with self._room:
            writer = await self._open()
            self._next_id = correlation_id = (self._next_id + 1) & 0x7FFFFFFF
            answer = asyncio.get_running_loop().create_future()
            self._pending[correlation_id] = answer
            try:
                out = bytearray(4 + len(frame))
                out[4:] = frame
                _SIZE.pack_into(out, 0, len(frame))
                _SIZE.pack_into(out, 8, correlation_id)
                writer.write(out)
                await writer.drain()
                return await answer
            finally:
                self._pending.pop(correlation_id, None)

    async def _open(self) -> asyncio.StreamWriter:
        async with self._opening:
            if self._writer is None or self._writer.is_closing():
                reader, self._writer = await self.dialer.open(*self.address)
                self._reader_task = asyncio.create_task(self._read_answers(reader, self._writer))
            return self._writer

    async def _read_answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        error: BaseException = LinkLost(f"link to {self.address[0]}:{self.address[1]} closed")
        try:
            while True:
                (size,) = _SIZE.unpack(await reader.readexactly(4))
                answer = await reader.readexactly(size)
                (correlation_id,) = _SIZE.unpack_from(answer, 0)
                waiter = self._pending.pop(correlation_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(answer)
        except (OSError, asyncio.IncompleteReadError, struct.error) as e:
            error = LinkLost(f"link to {self.address[0]}:{self.address[1]} lost: {e!r}")
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = None
            for waiter in self._pending.values():
                if not waiter.done():
                    waiter.set_exception(error)
            self._pending.clear()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)


class _Unavailable:
    """A stand-in coordinator whose every operation fails COORDINATOR_NOT_AVAILABLE, so a
    handler builds its own answer for that code, in the request's version."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __getattr__(self, name: str):
        async def refuse(*args, **kwargs):
            raise GroupError(ErrorCode.coordinator_not_available, self.reason)

        return refuse


@functools.cache
def _response_readers(api_key: int, version: int):
    cls = load_response_schema(api_key, version)
    return entity_reader(cls.__header_schema__), entity_reader(cls)


def _decode_answer(api_key: int, version: int, answer: bytes) -> Any:
    read_header, read_body = _response_readers(api_key, version)
    _, used = read_header(answer, 0)
    body, _ = read_body(answer, used)
    return body


def _ms(value) -> float:
    return value.total_seconds() * 1000 if isinstance(value, datetime.timedelta) else float(value)


class GroupForwarder:
    """A broker's relay of group requests to their coordinators (one per Kafka listener)."""

    def __init__(
        self, services, *, timeout_s: float = TIMEOUT_S, sync_timeout_s: float = SYNC_TIMEOUT_S, max_in_flight: int = MAX_IN_FLIGHT, dialer: PeerDialer | None = None
    ) -> None:
        self.services = services
        self.dialer = dialer or PeerDialer()  # the inter-broker listener's address, TLS and SASL
        self.timeout_s = timeout_s
        self.sync_timeout_s = sync_timeout_s
        self.max_in_flight = max_in_flight
        self._links: dict[int, PeerLink] = {}
        self._closing: set[asyncio.Task] = set()  # links to a broker's old address, closing

    async def answer(self, ctx, handler, body: Any, frame: bytes) -> Any:
        """The answer to a group request: the handler's, or the coordinator's relayed."""
        live = self.services.live_brokers()
        zone = known_zone(ctx.client_id, live)
        if zone is None:
            return await handler.fn(ctx, body)
        groups = group_ids(ctx.api_key, body)
        targets = [await self._target(ctx, g, zone, live) for g in groups]
        if all(t is None for t in targets):
            return await handler.fn(ctx, body)
        marked = self._marked(ctx, frame)
        if marked is None:
            return await handler.fn(ctx, body)
        if len({t.node_id if t is not None else None for t in targets}) == 1:
            answer = await self._relay(ctx, handler.name, targets[0], body, marked)
            return Relayed(answer) if answer is not None else await self._refused(ctx, handler, body)
        return await self._split(ctx, handler, body, marked, groups, targets)

    async def _target(self, ctx, group_id: str, zone: str, live: Sequence):
        """The coordinator to relay `group_id`'s requests to, or None to answer them here. A
        principal that may not DESCRIBE the group is answered here (the handler refuses it)
        before its request can record the group's home zone."""
        if not group_id or not allowed(ctx, DESCRIBE, GROUP, group_id):
            return None
        coordinator = self.services.coordinator
        try:
            await coordinator.place(group_id, zone)
        except GroupError:
            return None  # the handler meets the same failure and answers it
        me = self.services.settings.node_id
        real = coordinator.coordinator(group_id)
        if real.node_id == me or coordinator_for(group_id, live, zone).node_id != me:
            return None
        return real

    def _marked(self, ctx, frame: bytes) -> bytes | None:
        host = str(ctx.peer[0]) if ctx.peer else ""
        client_id = mark(ctx.client_id, host, ctx.session.principal)
        if len(client_id.encode()) > 0x7FFF:
            return None
        return with_client_id(frame, client_id)

    def _link(self, broker) -> PeerLink:
        link = self._links.get(broker.node_id)
        address = self.dialer.endpoint(broker)
        if link is None or link.address != address:
            if link is not None:
                closing = asyncio.ensure_future(link.close())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
            link = self._links[broker.node_id] = PeerLink(*address, self.max_in_flight, self.dialer)
        return link

    def _deadline_s(self, api_key: int, body: Any) -> float:
        if api_key == JOIN_GROUP:
            wait = body.rebalance_timeout if has_field(body, "rebalance_timeout") else body.session_timeout
            return _ms(wait) / 1000 + self.timeout_s
        if api_key == SYNC_GROUP:
            return self.sync_timeout_s
        return self.timeout_s

    async def _relay(self, ctx, api: str, broker, body: Any, frame: bytes) -> bytes | None:
        """The coordinator's answer frame, or None (counted) when it failed or came too late."""
        GROUP_FORWARDS.labels(api).inc()
        GROUP_FORWARD_BYTES.labels(api, "out").inc(len(frame))
        deadline = self._deadline_s(ctx.api_key, body)
        GROUP_FORWARDS_IN_FLIGHT.inc()
        try:
            async with asyncio.timeout(deadline):
                answer = await self._link(broker).request(frame)
        except TimeoutError:  # before OSError: it is one
            GROUP_FORWARD_FAILURES.labels(api, "timeout").inc()
            log.warning("group_forward_timeout", extra={"api": api, "coordinator": broker.node_id, "deadline_s": deadline})
            return None
        except OSError as e:
            GROUP_FORWARD_FAILURES.labels(api, "connection").inc()
            log.warning("group_forward_failed", extra={"api": api, "coordinator": broker.node_id, "error": str(e)})
            return None
        finally:
            GROUP_FORWARDS_IN_FLIGHT.dec()
        GROUP_FORWARD_BYTES.labels(api, "in").inc(len(answer))
        return answer

    async def _refused(self, ctx, handler, body: Any) -> Any:
        unavailable = dataclasses.replace(self.services, coordinator=_Unavailable("the group's coordinator did not answer"))
        return await handler.fn(dataclasses.replace(ctx, services=unavailable), body)

    async def _split(self, ctx, handler, body: Any, marked: bytes, groups: list[str], targets: list) -> Any:
        """A request naming groups of several coordinators: one request to each (the local ones
        answered here), the answers merged in the request's order."""
        field, answers_field = BATCHES[ctx.api_key]
        items = getattr(body, field)
        by_target: dict[int | None, tuple[Any, list]] = {}
        for item, target in zip(items, targets, strict=True):
            by_target.setdefault(None if target is None else target.node_id, (target, []))[1].append(item)
        _, header_bytes = request_codec(ctx.api_key, ctx.api_version)[0](marked, 0)

        async def answer_part(target, part: list) -> Any:
            sub = dataclasses.replace(body, **{field: tuple(part)})
            if target is not None:
                encoded = io.BytesIO()
                entity_writer(type(body))(encoded, sub)
                answer = await self._relay(ctx, handler.name, target, sub, marked[:header_bytes] + encoded.getvalue())
                if answer is not None:
                    return _decode_answer(ctx.api_key, ctx.api_version, answer)
                return await self._refused(ctx, handler, sub)
            return await handler.fn(ctx, sub)

        parts = await asyncio.gather(*(answer_part(target, part) for target, part in by_target.values()))
        answered = {a.group_id: a for part in parts for a in getattr(part, answers_field)}
        return dataclasses.replace(parts[0], **{answers_field: tuple(answered[g] for g in groups)})

    async def close(self) -> None:
        links, self._links = list(self._links.values()), {}
        await asyncio.gather(*(link.close() for link in links), return_exceptions=True)

"""The Kafka listeners: each accepts connections and serves each until it closes; stops cleanly.
A broker has one listener or several (broker/listeners.py), each PLAINTEXT, SSL, SASL_PLAINTEXT
or SASL_SSL; the TLS ones share the broker's certificate (reloaded on change, auth/tls.py), and
only SSL listeners ask for client certificates (a SASL_SSL client is who it authenticates as)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from auth.tls import MappingRule, ReloadingServerContext

from .connection import BEFORE_AUTHENTICATION, Connection
from .connection_limits import ConnectionLimits
from .context import Services
from .forwarding import GroupForwarder
from .framing import FrameStream, Gate
from .listeners import Listener
from .metrics import CONNECTIONS_REFUSED
from .peer_dial import PeerDialer
from .registry import load_handlers

log = logging.getLogger("neve.broker.server")


class KafkaServer:
    """`listeners` default to one PLAINTEXT listener on the settings' host and port; `tls` serves
    the SSL and SASL_SSL listeners, a context by protocol, `principal_rules` name the users of client certificates."""

    def __init__(
        self,
        services: Services,
        listeners: list[Listener] | None = None,
        tls: Mapping[str, ReloadingServerContext] | None = None,
        principal_rules: list[MappingRule] | None = None,
        dialer: PeerDialer | None = None,
    ) -> None:
        self.services = services
        s = services.settings
        self.listeners = listeners or [Listener("PLAINTEXT", "PLAINTEXT", s.host, s.port, s.advertised())]
        self.tls = dict(tls or {})
        self.principal_rules = principal_rules or [MappingRule(None)]
        self._servers: dict[str, asyncio.Server] = {}
        self._tasks: set[asyncio.Task] = set()
        self.forwarder = GroupForwarder(services, dialer=dialer)  # zoned clients' group requests, to their coordinators
        # the listener other brokers relay group requests to: a relay mark is trusted there only
        named = s.inter_broker_listener_name.upper()
        self.inter_broker_listener = next((item.name for item in self.listeners if item.name == named), self.listeners[0].name)
        self.limits = ConnectionLimits(s)  # ValueError for overrides that do not parse
        load_handlers()

    async def start(self) -> None:
        s = self.services.settings
        loop = asyncio.get_running_loop()
        pause, seal_at = s.produce_read_pause_ms / 1000, self.services.wal.seal_at
        for listener in self.listeners:
            if listener.uses_tls and listener.protocol not in self.tls:
                raise ValueError(f"listener {listener.name} is {listener.protocol} and no TLS certificate is configured")
            ssl = self.tls[listener.protocol].context if listener.uses_tls else None

            gate = Gate(s.sasl_max_receive_bytes, BEFORE_AUTHENTICATION) if listener.uses_sasl else None

            def protocol(listener=listener, gate=gate) -> FrameStream:
                return FrameStream(s.max_frame_bytes, lambda stream: self._accept(stream, listener), pause, seal_at, gate)

            self._servers[listener.name] = await loop.create_server(protocol, listener.host, listener.port, reuse_address=True, ssl=ssl)

    @property
    def port(self) -> int:
        """The first listener's port."""
        return self.ports[self.listeners[0].name]

    @property
    def ports(self) -> dict[str, int]:
        """Each listener's bound port, by name."""
        return {name: server.sockets[0].getsockname()[1] for name, server in self._servers.items()}

    def _accept(self, stream: FrameStream, listener: Listener) -> None:
        host = stream.peer[0] if isinstance(stream.peer, tuple) and stream.peer else ""
        counted = not (listener.name == self.inter_broker_listener and len(self.listeners) > 1)  # other brokers' links are not bounded
        if counted:
            refused = self.limits.admit(host)
            if refused is not None:
                CONNECTIONS_REFUSED.labels(listener.name, refused).inc()
                log.debug("connection_refused", extra={"peer": host, "listener": listener.name, "reason": refused})
                stream.abort()
                return
        task = asyncio.get_running_loop().create_task(self._serve(stream, listener))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if counted:
            task.add_done_callback(lambda _: self.limits.release(host))

    async def _serve(self, stream: FrameStream, listener: Listener) -> None:
        try:
            relays = listener.name == self.inter_broker_listener
            await Connection(self.services, stream, self.forwarder, listener=listener, principal_rules=self.principal_rules, relays=relays).serve()
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("connection_failed")

    async def stop(self) -> None:
        for server in self._servers.values():
            server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.forwarder.close()
        for server in self._servers.values():
            await server.wait_closed()

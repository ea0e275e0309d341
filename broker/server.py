"""The Kafka listener: accepts connections and serves each until it closes; stops cleanly."""

from __future__ import annotations

import asyncio
import logging
import socket

from .connection import Connection
from .context import Services
from .registry import load_handlers

log = logging.getLogger("neve.broker.server")


class KafkaServer:
    def __init__(self, services: Services) -> None:
        self.services = services
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        load_handlers()

    async def start(self) -> None:
        s = self.services.settings
        self._server = await asyncio.start_server(self._accept, s.host, s.port, reuse_address=True, limit=1 << 20)
        for sock in self._server.sockets:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            await Connection(self.services, reader, writer).serve()
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("connection_failed")
        finally:
            self._tasks.discard(task)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

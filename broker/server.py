"""The Kafka listener: accepts connections and serves each until it closes; stops cleanly."""

from __future__ import annotations

import asyncio
import logging

from .connection import Connection
from .context import Services
from .forwarding import GroupForwarder
from .framing import FrameStream
from .registry import load_handlers

log = logging.getLogger("neve.broker.server")


class KafkaServer:
    def __init__(self, services: Services) -> None:
        self.services = services
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self.forwarder = GroupForwarder(services)  # zoned clients' group requests, to their coordinators
        load_handlers()

    async def start(self) -> None:
        s = self.services.settings
        loop = asyncio.get_running_loop()
        pause, seal_at = s.produce_read_pause_ms / 1000, self.services.wal.seal_at
        self._server = await loop.create_server(lambda: FrameStream(s.max_frame_bytes, self._accept, pause, seal_at), s.host, s.port, reuse_address=True)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    def _accept(self, stream: FrameStream) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(stream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, stream: FrameStream) -> None:
        try:
            await Connection(self.services, stream, self.forwarder).serve()
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("connection_failed")

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.forwarder.close()
        if self._server is not None:
            await self._server.wait_closed()

"""Serving the registry's REST API: an aiohttp server on the running event loop, started beside a
broker (neve/node.py) or alone (`neve registry`), over the node's metadata store."""

from __future__ import annotations

import logging

from aiohttp import web

from metadata.store import MetadataStore

from .http import make_app
from .service import Registry
from .store import RegistryStore

log = logging.getLogger("neve.registry")


class RegistryServer:
    def __init__(self, metadata: MetadataStore, host: str, port: int) -> None:
        self.registry = Registry(RegistryStore(metadata))
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Listen (OSError if the port is taken); `port` is then the bound one (0 picks one)."""
        runner = web.AppRunner(make_app(self.registry), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        server = site._server  # aiohttp exposes the bound address only here
        if server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        log.info("registry_started", extra={"listen": f"{self.host}:{self.port}"})

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

"""Serving the registry's REST API: an aiohttp server on the running event loop, started beside a
broker (neve/node.py) or alone (`neve registry`), over the node's metadata store; over HTTPS and
with HTTP Basic users when the settings say so (access.py)."""

from __future__ import annotations

import asyncio
import logging
import ssl

from aiohttp import web

from metadata.store import MetadataStore

from .access import Access, CheckPassword, load_access
from .config import RegistryConfig
from .http import make_app
from .service import Registry
from .store import RegistryStore
from .tls import server_context

log = logging.getLogger("neve.registry")


class RegistryServer:
    """`ssl_context`: serve HTTPS with it; `access`: who may do what (None: anyone, anything)."""

    def __init__(self, metadata: MetadataStore, host: str, port: int, ssl_context: ssl.SSLContext | None = None, access: Access | None = None) -> None:
        self.registry = Registry(RegistryStore(metadata))
        self.host, self.port = host, port
        self.ssl_context = ssl_context
        self.access = access
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Listen (OSError if the port is taken); `port` is then the bound one (0 picks one)."""
        runner = web.AppRunner(make_app(self.registry, self.access), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, ssl_context=self.ssl_context)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        server = site._server  # aiohttp exposes the bound address only here
        if server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        log.info("registry_started", extra={"listen": f"{self.host}:{self.port}", "tls": self.ssl_context is not None, "authentication": self.access is not None})

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context is not None else 'http'}://{self.host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def load_server(settings: RegistryConfig, metadata: MetadataStore, check_password: CheckPassword | None = None) -> RegistryServer:
    """A server as `settings` say (not started): its TLS context and users read off the event loop.
    `check_password`: the SCRAM store's, used when `settings.scram_users`. ValueError or OSError
    for settings that cannot be served (a missing file, a malformed users file, a key that does not
    match its certificate)."""
    context = None
    if settings.tls_cert_file or settings.tls_key_file:
        if not (settings.tls_cert_file and settings.tls_key_file):
            raise ValueError("registry.tls_cert_file and registry.tls_key_file go together")
        context = await asyncio.to_thread(server_context, settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file)
    elif settings.tls_client_ca_file:
        raise ValueError("registry.tls_client_ca_file needs HTTPS (registry.tls_cert_file and tls_key_file)")
    access = await asyncio.to_thread(load_access, settings.users_file, settings.scram_users, settings.scram_roles, settings.anonymous, check_password)
    return RegistryServer(metadata, settings.host, settings.port, context, access)

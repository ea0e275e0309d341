"""The registry's REST API as an aiohttp application, one module per Confluent resource: subjects,
versions, schemas, config, mode, compatibility. `common.py` holds what they share (bodies,
replies, flags); `gate.py` the access check when the registry has users; errors become
Confluent's `{"error_code", "message"}` with its HTTP status here."""

from __future__ import annotations

import logging

from aiohttp import web

from ..access import Access
from ..model import RegistryError
from ..service import Registry
from . import compatibility, config, mode, schemas, subjects, versions
from .common import REGISTRY, reply
from .gate import make_gate

log = logging.getLogger("neve.registry")


@web.middleware
async def _errors(request: web.Request, handler):
    try:
        return await handler(request)
    except RegistryError as e:
        return reply(e.to_json(), status=e.status)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        # Confluent's body for the framework's own errors (unknown path, wrong method)
        return reply({"error_code": e.status, "message": f"HTTP {e.status} {e.reason}"}, status=e.status)
    except Exception as e:
        log.exception("registry_request_failed", extra={"path": request.path})
        return reply({"error_code": 50001, "message": f"Error in the backend data store: {e!r}"}, status=500)


async def _root(_request: web.Request) -> web.Response:
    return reply({})


def make_app(registry: Registry, access: Access | None = None) -> web.Application:
    """`access`: who may do what (None: anyone, anything)."""
    app = web.Application(middlewares=[_errors] if access is None else [_errors, make_gate(access)])
    app[REGISTRY] = registry
    app.router.add_get("/", _root)
    for module in (subjects, versions, schemas, config, mode, compatibility):
        module.add_routes(app.router)
    return app


__all__ = ["make_app"]

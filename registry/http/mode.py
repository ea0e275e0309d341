"""/mode: READWRITE (the default), READONLY (registrations and deletes refused, 42205) or IMPORT
(registrations keep the id and version they give, with no compatibility check).

    GET /mode, PUT /mode?force= {"mode"}               the global mode (42204 unknown mode; IMPORT
                                                       needs an empty registry unless force=true)
    GET /mode/{s}?defaultToGlobal=, PUT, DELETE /mode/{s}   a subject's own (40409 none)
"""

from __future__ import annotations

from aiohttp import web

from .common import body, flag, registry, reply


def _subject(request: web.Request) -> str | None:
    return request.match_info.get("subject")


async def get(request: web.Request) -> web.Response:
    return reply({"mode": (await registry(request).get_mode(_subject(request), flag(request, "defaultToGlobal"))).value})


async def put(request: web.Request) -> web.Response:
    data = await body(request)
    return reply({"mode": (await registry(request).set_mode(_subject(request), data.get("mode"), flag(request, "force"))).value})


async def delete(request: web.Request) -> web.Response:
    return reply({"mode": (await registry(request).delete_mode(request.match_info["subject"])).value})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/mode", get)
    router.add_put("/mode", put)
    router.add_get("/mode/{subject}", get)
    router.add_put("/mode/{subject}", put)
    router.add_delete("/mode/{subject}", delete)

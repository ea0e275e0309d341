"""/config: the compatibility level, global and per subject (BACKWARD unless set).

    GET    /config                          {"compatibilityLevel"}
    PUT    /config                          {"compatibility"} -> the same (42203 unknown level)
    DELETE /config                          resets the global level; answers the one it had
    GET    /config/{s}?defaultToGlobal=     the subject's own level (40408 none, unless defaultToGlobal)
    PUT    /config/{s}, DELETE /config/{s}  as above, for the subject
"""

from __future__ import annotations

from aiohttp import web

from .common import body, flag, registry, reply


def _subject(request: web.Request) -> str | None:
    return request.match_info.get("subject")


async def get(request: web.Request) -> web.Response:
    level = await registry(request).config(_subject(request), flag(request, "defaultToGlobal"))
    return reply({"compatibilityLevel": level.value})


async def put(request: web.Request) -> web.Response:
    data = await body(request)
    level = await registry(request).set_config(_subject(request), data.get("compatibility", data.get("compatibilityLevel")))
    return reply({"compatibility": level.value})


async def delete(request: web.Request) -> web.Response:
    return reply({"compatibilityLevel": (await registry(request).delete_config(_subject(request))).value})


def add_routes(router: web.UrlDispatcher) -> None:
    for path in ("/config", "/config/{subject}"):
        router.add_get(path, get)
        router.add_put(path, put)
        router.add_delete(path, delete)

"""/compatibility: would a schema be accepted, at the subject's level, without registering it.

    POST /compatibility/subjects/{s}/versions/{v|latest}?verbose=   against that version (latest
                                                                    with a transitive level: all)
    POST /compatibility/subjects/{s}/versions?verbose=              against every version the level
                                                                    compares with
    -> {"is_compatible": bool, "messages": [...] with verbose=true}
"""

from __future__ import annotations

from aiohttp import web

from .common import body, flag, registry, reply, subject, visible_schema


async def test(request: web.Request) -> web.Response:
    result = await registry(request).test(subject(request), request.match_info.get("version"), visible_schema(request, await body(request)))
    out: dict = {"is_compatible": result.is_compatible}
    if flag(request, "verbose"):
        out["messages"] = result.messages
    return reply(out)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/compatibility/subjects/{subject}/versions/{version}", test)
    router.add_post("/compatibility/subjects/{subject}/versions", test)

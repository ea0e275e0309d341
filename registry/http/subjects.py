"""/subjects: list subjects, look a schema up in a subject, delete a subject.

    GET    /subjects?deleted=&subjectPrefix=   ["s1", ...]; soft-deleted ones only with deleted=true;
                                               those the caller may see
    POST   /subjects/{s}?deleted=              {"schema", ...} -> the version holding it
                                               (40401 no such subject, 40403 not in it)
    DELETE /subjects/{s}?permanent=            the versions deleted; soft first (40404 if soft-deleted
                                               already), then permanent (40405 unless soft-deleted first)
"""

from __future__ import annotations

from aiohttp import web

from .common import body, flag, registry, reply, subject, visible, visible_schema


async def list_subjects(request: web.Request) -> web.Response:
    return reply(visible(request, await registry(request).subjects(flag(request, "deleted"), request.query.get("subjectPrefix", ""))))


async def lookup(request: web.Request) -> web.Response:
    found = await registry(request).lookup(subject(request), visible_schema(request, await body(request)), flag(request, "deleted"))
    return reply(found.to_json())


async def delete(request: web.Request) -> web.Response:
    return reply(await registry(request).delete_subject(subject(request), flag(request, "permanent")))


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/subjects", list_subjects)
    router.add_post("/subjects/{subject}", lookup)
    router.add_delete("/subjects/{subject}", delete)

"""/schemas: schemas by id, and the schema types served.

    GET /schemas/ids/{id}            {"schema", "schemaType"?, "references"} (40403)
    GET /schemas/ids/{id}/schema     the schema's text alone
    GET /schemas/ids/{id}/versions   [{"subject", "version"}, ...] holding it (that the caller sees)
    GET /schemas/ids/{id}/subjects   the subjects holding it (that the caller sees)
    GET /schemas/types               ["AVRO", "JSON", "PROTOBUF"]
"""

from __future__ import annotations

from aiohttp import web

from ..model import SchemaNotFound, SchemaType
from .common import flag, registry, reply, text_reply, visible


def _id(request: web.Request) -> int:
    try:
        return int(request.match_info["id"])
    except ValueError:
        raise SchemaNotFound(request.match_info["id"]) from None


async def by_id(request: web.Request) -> web.Response:
    return reply((await registry(request).schema(_id(request))).to_json())


async def text_by_id(request: web.Request) -> web.Response:
    return text_reply((await registry(request).schema(_id(request))).text)


async def versions_of(request: web.Request) -> web.Response:
    found = await registry(request).subjects_of_schema(_id(request), flag(request, "deleted"))
    shown = set(visible(request, {v.subject for v in found}))
    return reply([{"subject": v.subject, "version": v.version} for v in found if v.subject in shown])


async def subjects_of(request: web.Request) -> web.Response:
    found = await registry(request).subjects_of_schema(_id(request), flag(request, "deleted"))
    return reply(sorted(visible(request, {v.subject for v in found})))


async def types(_request: web.Request) -> web.Response:
    return reply([t.value for t in (SchemaType.JSON, SchemaType.PROTOBUF, SchemaType.AVRO)])


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/schemas/ids/{id}", by_id)
    router.add_get("/schemas/ids/{id}/schema", text_by_id)
    router.add_get("/schemas/ids/{id}/versions", versions_of)
    router.add_get("/schemas/ids/{id}/subjects", subjects_of)
    router.add_get("/schemas/types", types)

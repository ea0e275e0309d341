"""/subjects/{s}/versions: a subject's versions; registering a schema.

    GET    /subjects/{s}/versions?deleted=           [1, 2, ...] (40401)
    POST   /subjects/{s}/versions                    {"schema", "schemaType"?, "references"?, "id"?,
                                                     "version"?} -> {"id"}: the same schema again gets
                                                     the same id; 409 incompatible, 42201 invalid,
                                                     42205 read-only mode (id and version: IMPORT mode)
    GET    /subjects/{s}/versions/{v|latest}         {"subject", "version", "id", "schema", ...} (40402, 42202)
    GET    /subjects/{s}/versions/{v}/schema         the schema's text alone
    GET    /subjects/{s}/versions/{v}/referencedby   ids of schemas referencing this version
    DELETE /subjects/{s}/versions/{v}?permanent=     the version (40406, 40407, 42206)
"""

from __future__ import annotations

from aiohttp import web

from .common import body, flag, registry, reply, subject, text_reply, visible_schema


def _version(request: web.Request) -> str:
    return request.match_info["version"]


async def list_versions(request: web.Request) -> web.Response:
    return reply(await registry(request).versions(subject(request), flag(request, "deleted")))


async def register(request: web.Request) -> web.Response:
    data = await body(request)
    schema_id = await registry(request).register(subject(request), visible_schema(request, data), _int(data.get("id")), _int(data.get("version")))
    return reply({"id": schema_id})


def _int(value: object) -> int | None:
    # Confluent's clients send -1 / 0 for "none given"
    return int(value) if isinstance(value, int) and value > 0 else None


async def get_version(request: web.Request) -> web.Response:
    found = await registry(request).version(subject(request), _version(request), flag(request, "deleted"))
    return reply(found.to_json())


async def get_schema_text(request: web.Request) -> web.Response:
    found = await registry(request).version(subject(request), _version(request), flag(request, "deleted"))
    return text_reply(found.schema.text)


async def referenced_by(request: web.Request) -> web.Response:
    return reply(await registry(request).referenced_by(subject(request), _version(request)))


async def delete(request: web.Request) -> web.Response:
    return reply(await registry(request).delete_version(subject(request), _version(request), flag(request, "permanent")))


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/subjects/{subject}/versions", list_versions)
    router.add_post("/subjects/{subject}/versions", register)
    router.add_get("/subjects/{subject}/versions/{version}", get_version)
    router.add_get("/subjects/{subject}/versions/{version}/schema", get_schema_text)
    router.add_get("/subjects/{subject}/versions/{version}/referencedby", referenced_by)
    router.add_delete("/subjects/{subject}/versions/{version}", delete)

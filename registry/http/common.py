"""What the REST resources share: the registry in the application, request bodies and query
flags read the way Confluent reads them, and replies in its content type."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ..access import Grant
from ..model import (
    BadRequest,
    InvalidSchema,
    Reference,
    Schema,
    SchemaType,
    UnprocessableRequest,
)
from ..service import Registry

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
REGISTRY: web.AppKey[Registry] = web.AppKey("registry", Registry)
GRANT: web.RequestKey[Grant] = web.RequestKey("grant", Grant)  # the caller's, when the registry has users


def visible(request: web.Request, subjects):
    """`subjects` less those the caller's prefixes hide, in their order."""
    grant: Grant | None = request.get(GRANT)
    return list(subjects) if grant is None or not grant.prefixes else [s for s in subjects if grant.sees(s)]


def registry(request: web.Request) -> Registry:
    return request.app[REGISTRY]


def reply(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data), status=status, content_type=CONTENT_TYPE)


def text_reply(text: str) -> web.Response:
    """The /schema sub-resources: the schema's own text, not wrapped in JSON."""
    return web.Response(text=text, content_type=CONTENT_TYPE)


async def body(request: web.Request) -> dict:
    try:
        data = json.loads(await request.read() or b"{}")
    except ValueError as e:
        raise BadRequest(f"Unexpected character in the request body: {e}") from None
    if not isinstance(data, dict):
        raise UnprocessableRequest("The request body is not a JSON object")
    return data


def flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").strip().lower() == "true"


def subject(request: web.Request) -> str:
    return request.match_info["subject"]


def visible_schema(request: web.Request, data: dict) -> Schema:
    """`schema_of` a request's body, its references limited to subjects the caller sees: one to a
    subject its prefixes hide is answered as one to a subject that does not exist (so that neither
    the other subject's schema nor its existence is learnt through it)."""
    schema = schema_of(data)
    grant: Grant | None = request.get(GRANT)
    for ref in schema.references:
        if grant is not None and grant.prefixes and not grant.sees(ref.subject):
            raise InvalidSchema(f"Invalid schema: reference {ref.name} to subject '{ref.subject}' version {ref.version} not found")
    return schema


def schema_of(data: dict) -> Schema:
    """A registration's or lookup's body: {"schema", "schemaType"?, "references"?}."""
    text = data.get("schema")
    if not isinstance(text, str):
        raise InvalidSchema('Invalid schema: the body has no "schema" string')
    try:
        kind = SchemaType(str(data.get("schemaType") or "AVRO").upper())
    except ValueError:
        raise InvalidSchema(f"Invalid schema type {data.get('schemaType')!r}") from None
    try:
        refs = tuple(Reference(str(r["name"]), str(r["subject"]), int(r["version"])) for r in data.get("references") or ())
    except (KeyError, TypeError, ValueError):
        raise UnprocessableRequest("Invalid references: each needs name, subject and version") from None
    return Schema(kind, text, refs)

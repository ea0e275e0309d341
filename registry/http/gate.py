"""The access check before every resource (the roles and prefixes are access.py's): authenticate
the request, then refuse what its grant does not reach, with Confluent's 401 / 403 bodies. The
grant stays on the request for the listings to filter by."""

from __future__ import annotations

from aiohttp import web

from ..access import REALM, Access, Grant, Role, Unauthenticated, refused
from ..model import SchemaNotFound
from .common import GRANT, registry, reply


def needed_role(request: web.Request) -> Role:
    if request.method in ("GET", "HEAD"):
        return Role.READ
    path = _route(request)
    if request.method == "POST":
        if path == "/subjects/{subject}" or path.startswith("/compatibility/"):
            return Role.READ  # a lookup, a compatibility test: they change nothing
        if path == "/subjects/{subject}/versions":
            return Role.WRITE
    return Role.ADMIN  # config and mode changes, deletes, and any route added later until placed here


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else ""


def make_gate(access: Access):
    @web.middleware
    async def gate(request: web.Request, handler):
        try:
            grant = await access.authenticate(request.headers.get("Authorization"))
        except Unauthenticated as e:
            refused(e.reason, e.user, request.remote, request.method, request.path)
            response = reply({"error_code": 40101, "message": "Unauthorized"}, status=401)
            response.headers["WWW-Authenticate"] = f'Basic realm="{REALM}"'
            return response
        if request.match_info.route.resource is not None and not await _allowed(request, grant):
            refused("forbidden", grant.user, request.remote, request.method, request.path)
            return reply({"error_code": 40301, "message": f"User {grant.user or 'ANONYMOUS'} cannot access the resource."}, status=403)
        request[GRANT] = grant
        return await handler(request)

    return gate


async def _allowed(request: web.Request, grant: Grant) -> bool:
    needed = needed_role(request)
    if not grant.may(needed):
        return False
    if not grant.prefixes:
        return True
    subject = request.match_info.get("subject")
    if subject is not None:
        return grant.sees(subject)
    if needed is Role.ADMIN:
        return False  # a global config or mode change reaches subjects outside the prefixes
    path = _route(request)
    if path in ("/schemas/ids/{id}", "/schemas/ids/{id}/schema"):
        return await _holds_visible(request, grant)
    return True  # the rest are listings (filtered) and subject-less reads


async def _holds_visible(request: web.Request, grant: Grant) -> bool:
    try:
        schema_id = int(request.match_info["id"])
    except ValueError:
        return True  # the resource answers 40403
    try:
        holders = await registry(request).subjects_of_schema(schema_id, True)
    except SchemaNotFound:
        return True  # nothing to hide: the resource answers 40403 to everyone
    return any(grant.sees(v.subject) for v in holders)

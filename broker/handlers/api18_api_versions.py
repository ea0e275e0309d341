"""ApiVersions (key 18), v0-v4: the API ranges this broker implements, read from the handler
registry so the advertisement cannot drift from the code. A request for a version we do not know
is answered in v0 with UNSUPPORTED_VERSION (KIP-511) by the connection, using
`unsupported_version_response`."""

from __future__ import annotations

from kio.schema.api_versions.v0 import response as v0
from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, build
from ..registry import HANDLERS, handles


def _ranges(module):
    return tuple(
        module.ApiVersion(api_key=h.api_key, min_version=h.min_version, max_version=h.max_version)
        for h in sorted(HANDLERS.values(), key=lambda h: h.api_key)
    )


def unsupported_version_response():
    return v0.ApiVersionsResponse(error_code=ErrorCode.unsupported_version, api_keys=_ranges(v0))


@handles(18, "ApiVersions", 0, 4)
async def api_versions(ctx, request):
    r = ctx.response
    return build(r.ApiVersionsResponse, error_code=ErrorCode.none, api_keys=_ranges(r), throttle_time=NO_THROTTLE)

"""DescribeUserScramCredentials (key 50), v0 (KIP-554): the SCRAM mechanisms and iteration counts
of the users asked for (every user with a credential when none is named), never a key or a salt.
An unknown user answers RESOURCE_NOT_FOUND, a user named twice DUPLICATE_RESOURCE; the request
needs DESCRIBE on the cluster (CLUSTER_AUTHORIZATION_FAILED otherwise)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from auth.credentials import MECHANISM_IDS

from ..codec import NO_THROTTLE, build
from ..registry import handles
from ..scram_admin import cluster_allowed, scram_credentials


@handles(50, "DescribeUserScramCredentials", 0, 0)
async def describe_user_scram_credentials(ctx, request):
    r = ctx.response
    if not cluster_allowed(ctx, "DESCRIBE"):
        return build(r.DescribeUserScramCredentialsResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.cluster_authorization_failed, error_message=None, results=())
    users = scram_credentials(ctx.services).users()
    asked = [u.name for u in request.users or ()]
    names = list(dict.fromkeys(asked)) if asked else sorted(users)

    def result(name):
        if asked.count(name) > 1:
            return build(r.DescribeUserScramCredentialsResult, user=name, error_code=ErrorCode.duplicate_resource, error_message=f"Cannot describe SCRAM credentials for the same user twice in a single request: {name}", credential_infos=())
        if name not in users:
            return build(r.DescribeUserScramCredentialsResult, user=name, error_code=ErrorCode.resource_not_found, error_message=f"Attempt to describe a user credential that does not exist: {name}", credential_infos=())
        infos = tuple(build(r.CredentialInfo, mechanism=MECHANISM_IDS[m], iterations=i) for m, i in sorted(users[name].items(), key=lambda mi: MECHANISM_IDS[mi[0]]))
        return build(r.DescribeUserScramCredentialsResult, user=name, error_code=ErrorCode.none, error_message=None, credential_infos=infos)

    return build(r.DescribeUserScramCredentialsResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, error_message=None, results=tuple(result(n) for n in names))

"""CreateAcls (key 30), v1-v3: store ACL bindings, each under its own key of the metadata store's
security family, so creations from several brokers at once all stay. Needs ALTER on the cluster
(else every creation answers CLUSTER_AUTHORIZATION_FAILED). Without an authorizer:
SECURITY_DISABLED, as Kafka answers. A binding Kafka refuses (unknown or ANY codes, an empty name,
a cluster not named kafka-cluster, delegation-token resources, which this cluster has no tokens
for): INVALID_REQUEST for that creation, the others stored. Creating an existing binding succeeds
and leaves one."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from auth.acls import AclBinding, InvalidAcl
from metadata.store import MetadataUnavailable

from ..authorization import ALTER, CLUSTER, allowed
from ..codec import NO_THROTTLE, build
from ..registry import handles


@handles(30, "CreateAcls", 1, 3)
async def create_acls(ctx, request):
    r = ctx.response

    def answer(results):
        return build(r.CreateAclsResponse, throttle_time=NO_THROTTLE, results=tuple(build(r.AclCreationResult, error_code=code, error_message=message) for code, message in results))

    n = len(request.creations)
    if not allowed(ctx, ALTER, CLUSTER):
        return answer([(ErrorCode.cluster_authorization_failed, "ALTER on the cluster is needed to create ACLs")] * n)
    authorizer = ctx.services.authorizer
    if authorizer is None:
        return answer([(ErrorCode.security_disabled, "no authorizer is configured")] * n)
    results: list = []
    valid = []
    for c in request.creations:
        binding = AclBinding.of(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal, c.host, c.operation, c.permission_type)
        try:
            binding.validate()
        except InvalidAcl as e:
            results.append((ErrorCode.invalid_request, str(e)))
            continue
        results.append((ErrorCode.none, None))
        valid.append(binding)
    try:
        await authorizer.create(valid)
    except MetadataUnavailable as e:
        results = [(ErrorCode.unknown_server_error, f"the ACLs could not be stored: {e}") if code is ErrorCode.none else (code, message) for code, message in results]
    return answer(results)

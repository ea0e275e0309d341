"""DescribeAcls (key 29), v1-v3: the ACL bindings a filter selects (auth/acls.py), grouped by
resource pattern. Needs DESCRIBE on the cluster. Without an authorizer configured the broker keeps
no ACLs: SECURITY_DISABLED, as Kafka answers. A filter with an unknown code: INVALID_REQUEST."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from auth.acls import AclFilter, InvalidAcl

from ..authorization import CLUSTER, DESCRIBE, allowed
from ..codec import NO_THROTTLE, build
from ..registry import handles


@handles(29, "DescribeAcls", 1, 3)
async def describe_acls(ctx, request):
    r = ctx.response

    def answer(code: ErrorCode, message: str | None = None, resources: tuple = ()):
        return build(r.DescribeAclsResponse, throttle_time=NO_THROTTLE, error_code=code, error_message=message, resources=resources)

    if not allowed(ctx, DESCRIBE, CLUSTER):
        return answer(ErrorCode.cluster_authorization_failed, "DESCRIBE on the cluster is needed to describe ACLs")
    authorizer = ctx.services.authorizer
    if authorizer is None:
        return answer(ErrorCode.security_disabled, "no authorizer is configured")
    selected = AclFilter.of(request.resource_type_filter, request.resource_name_filter, request.pattern_type_filter, request.principal_filter, request.host_filter, request.operation, request.permission_type)
    try:
        selected.validate()
    except InvalidAcl as e:
        return answer(ErrorCode.invalid_request, str(e))
    by_pattern: dict = {}
    for b in authorizer.bindings(selected):
        by_pattern.setdefault((b.resource_type, b.name, b.pattern_type), []).append(b)
    resources = tuple(
        build(
            r.DescribeAclsResource,
            resource_type=int(t),
            resource_name=name,
            pattern_type=int(p),
            acls=tuple(build(r.AclDescription, principal=b.principal, host=b.host, operation=int(b.operation), permission_type=int(b.permission)) for b in acls),
        )
        for (t, name, p), acls in sorted(by_pattern.items())
    )
    return answer(ErrorCode.none, None, resources)

"""DeleteAcls (key 31), v1-v3: remove the ACL bindings each filter matches, answering per filter
the bindings it removed (one matched by several filters is reported by the first). Needs ALTER on
the cluster. Without an authorizer: SECURITY_DISABLED, as Kafka answers. A filter with an unknown
code: INVALID_REQUEST for that filter."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from auth.acls import AclFilter, InvalidAcl
from metadata.store import MetadataUnavailable

from ..authorization import ALTER, CLUSTER, allowed
from ..codec import NO_THROTTLE, build
from ..registry import handles


@handles(31, "DeleteAcls", 1, 3)
async def delete_acls(ctx, request):
    r = ctx.response

    def result(code: ErrorCode, message: str | None = None, matched: tuple = ()):
        return build(r.DeleteAclsFilterResult, error_code=code, error_message=message, matching_acls=matched)

    def answer(results):
        return build(r.DeleteAclsResponse, throttle_time=NO_THROTTLE, filter_results=tuple(results))

    n = len(request.filters)
    if not allowed(ctx, ALTER, CLUSTER):
        return answer([result(ErrorCode.cluster_authorization_failed, "ALTER on the cluster is needed to delete ACLs")] * n)
    authorizer = ctx.services.authorizer
    if authorizer is None:
        return answer([result(ErrorCode.security_disabled, "no authorizer is configured")] * n)
    filters: list = []
    problems: dict[int, str] = {}
    for i, f in enumerate(request.filters):
        selected = AclFilter.of(f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter, f.principal_filter, f.host_filter, f.operation, f.permission_type)
        try:
            selected.validate()
            filters.append(selected)
        except InvalidAcl as e:
            problems[i] = str(e)
    try:
        removed = iter(await authorizer.delete(filters))
    except MetadataUnavailable as e:
        return answer([result(ErrorCode.invalid_request, problems[i]) if i in problems else result(ErrorCode.unknown_server_error, f"the ACLs could not be removed: {e}") for i in range(n)])
    results = []
    for i in range(n):
        if i in problems:
            results.append(result(ErrorCode.invalid_request, problems[i]))
            continue
        matched = tuple(
            build(
                r.DeleteAclsMatchingAcl,
                error_code=ErrorCode.none,
                error_message=None,
                resource_type=int(b.resource_type),
                resource_name=b.name,
                pattern_type=int(b.pattern_type),
                principal=b.principal,
                host=b.host,
                operation=int(b.operation),
                permission_type=int(b.permission),
            )
            for b in next(removed)
        )
        results.append(result(ErrorCode.none, None, matched))
    return answer(results)

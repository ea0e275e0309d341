"""AlterConfigs (key 33), v0-v2: each topic resource's configs are replaced by the given set (a
config left out returns to its default; a null value counts as left out). Every name and value
is validated first (broker/topic_configs.py): an unknown name or invalid value answers
INVALID_CONFIG and changes nothing for that resource. validate_only checks without storing. An
unknown topic answers UNKNOWN_TOPIC_OR_PARTITION; broker resources INVALID_REQUEST (read-only:
brokers are configured by their node configuration). With ACLs: ALTER_CONFIGS on the topic (else
TOPIC_AUTHORIZATION_FAILED) or, for a broker, on the cluster (else CLUSTER_AUTHORIZATION_FAILED)."""

from __future__ import annotations

from ..authorization import ALTER_CONFIGS, alter_refusal
from ..codec import NO_THROTTLE, build, error
from ..registry import handles
from ..topic_configs import alter_topic


@handles(33, "AlterConfigs", 0, 2)
async def alter_configs(ctx, request):
    r = ctx.response
    store = ctx.services.metadata
    responses = []
    for res in request.resources:
        replacement = ({c.name: c.value for c in res.configs if c.value is not None}, 0, None)
        code, message = alter_refusal(ctx, ALTER_CONFIGS, res.resource_type, res.resource_name) or await alter_topic(store, res, request.validate_only, lambda old, new=replacement: new)
        responses.append(build(r.AlterConfigsResourceResponse, error_code=error(code), error_message=message, resource_type=res.resource_type, resource_name=res.resource_name))
    return build(r.AlterConfigsResponse, throttle_time=NO_THROTTLE, responses=tuple(responses))

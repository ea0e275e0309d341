"""IncrementalAlterConfigs (key 44), v0-v1: per topic resource, operations on single configs:
SET (0), DELETE (1: back to the default), APPEND (2) and SUBTRACT (3) on list configs
(cleanup.policy, the throttled-replica lists). APPEND adds the items not already in the current
value (or the default), SUBTRACT removes items, as Kafka does. The resulting set is validated as a
whole (broker/topic_configs.py): an unknown name, an invalid value or APPEND/SUBTRACT on a
non-list config answers INVALID_CONFIG and changes nothing for that resource; the same name
twice in one resource answers INVALID_REQUEST. validate_only checks without storing. An unknown
topic answers UNKNOWN_TOPIC_OR_PARTITION; broker resources INVALID_REQUEST (read-only). With ACLs:
ALTER_CONFIGS on the topic (else TOPIC_AUTHORIZATION_FAILED) or, for a broker, on the cluster
(else CLUSTER_AUTHORIZATION_FAILED)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..authorization import ALTER_CONFIGS, alter_refusal
from ..codec import NO_THROTTLE, build, error
from ..registry import handles
from ..topic_configs import TOPIC_CONFIGS, ConfigType, alter_topic

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def apply_ops(current: dict[str, str], ops) -> tuple[dict[str, str] | None, int, str | None]:
    """(the new config set, 0, None), or (None, error code, message)."""
    configs = dict(current)
    for op in ops:
        name, value = op.name, op.value
        if op.config_operation == SET:
            if value is None:
                return None, ErrorCode.invalid_config, f"Null value not supported for topic configs: {name}"
            configs[name] = value
        elif op.config_operation == DELETE:
            configs.pop(name, None)
        elif op.config_operation in (APPEND, SUBTRACT):
            spec = TOPIC_CONFIGS.get(name)
            if spec is None:
                return None, ErrorCode.invalid_config, f"Unknown topic config name: {name}"
            if spec.type != ConfigType.LIST:
                return None, ErrorCode.invalid_config, f"Can't {'APPEND' if op.config_operation == APPEND else 'SUBTRACT'} to key {name} because its type is not LIST."
            base = configs.get(name, spec.default)
            items = [i for i in base.split(",") if i]
            given = [i.strip() for i in (value or "").split(",") if i.strip()]
            if op.config_operation == APPEND:
                items += [i for i in given if i not in items]
            else:
                items = [i for i in items if i not in given]
            configs[name] = ",".join(items)
        else:
            return None, ErrorCode.invalid_request, f"Unknown config operation {op.config_operation} for {name}"
    return configs, 0, None


@handles(44, "IncrementalAlterConfigs", 0, 1)
async def incremental_alter_configs(ctx, request):
    r = ctx.response
    store = ctx.services.metadata
    responses = []
    for res in request.resources:
        code, message = alter_refusal(ctx, ALTER_CONFIGS, res.resource_type, res.resource_name) or await alter_topic(store, res, request.validate_only, lambda old, res=res: apply_ops(old, res.configs))
        responses.append(build(r.AlterConfigsResourceResponse, error_code=error(code), error_message=message, resource_type=res.resource_type, resource_name=res.resource_name))
    return build(r.IncrementalAlterConfigsResponse, throttle_time=NO_THROTTLE, responses=tuple(responses))

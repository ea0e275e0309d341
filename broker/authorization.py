"""The handlers' one way to ask the ACL authorizer (auth/authorizer.py) about the connection's
principal and host. With no authorizer configured every request is allowed, and a check costs one
attribute test: hot handlers (Produce, Fetch) test `ctx.services.authorizer is None` themselves
before walking their topics."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from auth.acls import CLUSTER_NAME, SUPPORTED_OPERATIONS, Operation, ResourceType

# Short names for the checks' arguments, so a handler's check reads as one line.
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE, Operation.ALTER, Operation.DESCRIBE
DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE
CLUSTER_ACTION = Operation.CLUSTER_ACTION
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID

NOT_REPORTED = -2147483648  # an authorized-operations field the client did not ask for


def allowed(ctx, operation: Operation, resource_type: ResourceType, name: str = CLUSTER_NAME) -> bool:
    """Whether the connection's principal may do `operation` on the resource (the cluster when no
    name is given)."""
    authorizer = ctx.services.authorizer
    if authorizer is None:
        return True
    session = ctx.session
    return authorizer.authorize(session.principal, session.host, operation, resource_type, name)


def allowed_names(ctx, operation: Operation, resource_type: ResourceType, names) -> set[str]:
    """Those of `names` the principal may do `operation` on (each distinct name asked once)."""
    authorizer = ctx.services.authorizer
    if authorizer is None:
        return set(names)
    session = ctx.session
    return {n for n in set(names) if authorizer.authorize(session.principal, session.host, operation, resource_type, n)}


def allowed_on_any(ctx, operation: Operation, resource_type: ResourceType) -> bool:
    """Whether the principal may do `operation` on some resource of the type."""
    authorizer = ctx.services.authorizer
    if authorizer is None:
        return True
    session = ctx.session
    return authorizer.authorize_any(session.principal, session.host, operation, resource_type)


def alter_refusal(ctx, operation: Operation, config_resource_type: int, name: str) -> tuple[int, None] | None:
    """The refusal (error code, message) of a config change on a topic (config resource type 2)
    or a broker (4) the principal may not make; None if allowed (or another resource type)."""
    if ctx.services.authorizer is None:
        return None
    if config_resource_type == 2 and not allowed(ctx, operation, TOPIC, name):
        return int(ErrorCode.topic_authorization_failed), None
    if config_resource_type == 4 and not allowed(ctx, operation, CLUSTER):
        return int(ErrorCode.cluster_authorization_failed), None
    return None


def authorized_operations(ctx, resource_type: ResourceType, name: str = CLUSTER_NAME) -> int:
    """The authorized-operations bitfield of a resource; with no authorizer, every operation the
    resource type supports (as Kafka reports it)."""
    authorizer = ctx.services.authorizer
    if authorizer is None:
        bits = 0
        for op in SUPPORTED_OPERATIONS.get(resource_type, ()):
            bits |= 1 << int(op)
        return bits
    session = ctx.session
    return authorizer.authorized_operations(session.principal, session.host, resource_type, name)

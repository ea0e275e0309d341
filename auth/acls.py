"""ACL bindings as Kafka's KIP-11 model has them (a resource pattern and an entry: principal, host,
operation, permission), the filters DescribeAcls and DeleteAcls take, and how a binding is kept in
the metadata store's security family: one key per binding under "acls/", named by the binding's
own content, so two brokers creating different bindings at once never overwrite each other and
creating the same binding twice leaves one."""

from __future__ import annotations

import hashlib
import json
from enum import IntEnum
from typing import NamedTuple

from metadata.store import MAX_SECURITY_VALUE_BYTES

PREFIX = "acls/"  # the security family's keys of ACL bindings
WILDCARD = "*"  # a literal resource name matching every name; also the host matching every host
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"  # the one name of the cluster resource, as in Kafka
MAX_BINDING_BYTES = MAX_SECURITY_VALUE_BYTES  # one binding is one value of the security family


class ResourceType(IntEnum):
    """Kafka's wire codes (org.apache.kafka.common.resource.ResourceType)."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only: any pattern type, the name compared exactly
    MATCH = 2  # filters only: the patterns that would apply to the name (literal, wildcard, prefixes)
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    DENY = 2
    ALLOW = 3


# The operations that mean something on each resource type: what the authorized-operations
# bitfields of Metadata, DescribeCluster and DescribeGroups report on (as Kafka's AclEntry has them).
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE, Operation.DELETE, Operation.ALTER, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE),
}


def _code(enum: type[IntEnum], value: int) -> IntEnum:
    """A wire code as its enum member; a code this broker does not know reads as UNKNOWN."""
    try:
        return enum(value)
    except ValueError:
        return enum(0)


class InvalidAcl(ValueError):
    """A binding or filter Kafka would refuse with INVALID_REQUEST; the message says why."""


class AclBinding(NamedTuple):
    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    @classmethod
    def of(cls, resource_type: int, name: str, pattern_type: int, principal: str, host: str, operation: int, permission: int) -> AclBinding:
        """A binding from wire codes (unknown codes read as UNKNOWN: `validate` refuses them)."""
        return cls(_code(ResourceType, resource_type), name, _code(PatternType, pattern_type), principal, host, _code(Operation, operation), _code(Permission, permission))  # type: ignore[arg-type]

    def validate(self) -> None:
        """Raise InvalidAcl for a binding CreateAcls refuses, as Kafka does."""
        if self.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            raise InvalidAcl(f"invalid resource type {self.resource_type.name}")
        if self.resource_type in (ResourceType.DELEGATION_TOKEN, ResourceType.USER):
            # ACLs on these guard delegation tokens, which this broker does not issue
            raise InvalidAcl(f"ACLs on resource type {self.resource_type.name} guard delegation tokens, which this cluster does not support")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAcl(f"invalid pattern type {self.pattern_type.name}: a binding is LITERAL or PREFIXED")
        if self.operation in (Operation.UNKNOWN, Operation.ANY):
            raise InvalidAcl(f"invalid operation {self.operation.name}")
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            raise InvalidAcl(f"invalid permission type {self.permission.name}")
        if not self.name:
            raise InvalidAcl("invalid empty resource name")
        if self.resource_type is ResourceType.CLUSTER and self.name != CLUSTER_NAME:
            raise InvalidAcl(f"the only valid name for the CLUSTER resource is {CLUSTER_NAME}")
        kind, sep, name = self.principal.partition(":")
        if not sep or not kind or not name:
            raise InvalidAcl(f"invalid principal {self.principal!r}: expected <type>:<name>, e.g. User:alice")
        if not self.host:
            raise InvalidAcl("invalid empty host: use * for every host")
        if len(self.encode()) > MAX_BINDING_BYTES:
            raise InvalidAcl(f"a binding takes at most {MAX_BINDING_BYTES} bytes (resource name, principal and host)")

    def key(self) -> str:
        """The binding's key in the security family: the same binding always has the same key."""
        return PREFIX + hashlib.sha256(self.encode()).hexdigest()[:32]

    def encode(self) -> bytes:
        return json.dumps(
            {
                "resource_type": self.resource_type.name,
                "name": self.name,
                "pattern_type": self.pattern_type.name,
                "principal": self.principal,
                "host": self.host,
                "operation": self.operation.name,
                "permission": self.permission.name,
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, value: bytes) -> AclBinding:
        d = json.loads(value)
        return cls(ResourceType[d["resource_type"]], d["name"], PatternType[d["pattern_type"]], d["principal"], d["host"], Operation[d["operation"]], Permission[d["permission"]])


class AclFilter(NamedTuple):
    """What DescribeAcls and DeleteAcls select with: ANY codes and None fields match everything."""

    resource_type: ResourceType
    name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: Operation
    permission: Permission

    @classmethod
    def of(cls, resource_type: int, name: str | None, pattern_type: int, principal: str | None, host: str | None, operation: int, permission: int) -> AclFilter:
        return cls(_code(ResourceType, resource_type), name, _code(PatternType, pattern_type), principal, host, _code(Operation, operation), _code(Permission, permission))  # type: ignore[arg-type]

    def validate(self) -> None:
        """Raise InvalidAcl for a filter with an unknown code, as Kafka refuses it."""
        for field, value in (("resource type", self.resource_type), ("pattern type", self.pattern_type), ("operation", self.operation), ("permission type", self.permission)):
            if value == 0:
                raise InvalidAcl(f"filter has an unknown {field}")

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type is not ResourceType.ANY and self.resource_type != b.resource_type:
            return False
        if not self._matches_name(b):
            return False
        return (
            (self.principal is None or self.principal == b.principal)
            and (self.host is None or self.host == b.host)
            and (self.operation is Operation.ANY or self.operation == b.operation)
            and (self.permission is Permission.ANY or self.permission == b.permission)
        )

    def _matches_name(self, b: AclBinding) -> bool:
        pattern = self.pattern_type
        if pattern not in (PatternType.ANY, PatternType.MATCH) and pattern != b.pattern_type:
            return False
        if self.name is None:
            return True
        if pattern is not PatternType.MATCH:
            return self.name == b.name
        # MATCH: every binding that applies to a resource of this name
        if b.pattern_type is PatternType.LITERAL:
            return b.name == self.name or b.name == WILDCARD
        return self.name.startswith(b.name)


def read_bindings(items: dict[str, bytes]) -> list[AclBinding]:
    """The bindings of the security family's "acls/" items (an unreadable one, written by a newer
    broker, is skipped rather than failing every decision)."""
    out = []
    for value in items.values():
        try:
            out.append(AclBinding.decode(value))
        except (ValueError, KeyError, TypeError):
            continue
    return out

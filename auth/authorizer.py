"""The ACL authorizer: decides whether a principal, from a host, may do an operation on a resource,
as Kafka's standard authorizer does. The bindings live in the metadata store's security family
(auth/acls.py); this keeps an index of them, rebuilt only when the family's version moves, so a
decision costs a few dict lookups: the resource's literal bindings, the type's wildcard, and one
per prefix length of its name that some prefixed binding has."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from metadata.store import MAX_SECURITY_WRITE_BYTES, MAX_SECURITY_WRITE_KEYS

from .acls import PREFIX, SUPPORTED_OPERATIONS, WILDCARD, WILDCARD_PRINCIPAL, AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType, read_bindings

if TYPE_CHECKING:
    from metadata.store import MetadataStore

# An ALLOW of these grants the key operation too (as in Kafka: who may read, write, delete or
# alter a resource may see it; who may alter its configs may see them).
_ALLOWED_BY: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER, Operation.ALL}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.ALL}),
}


class _Index:
    """One snapshot of the bindings, arranged for lookups by resource."""

    __slots__ = ("bindings", "literal", "prefixed", "prefix_lengths")

    def __init__(self, bindings: list[AclBinding]) -> None:
        self.bindings = bindings
        self.literal: dict[tuple[ResourceType, str], list[AclBinding]] = defaultdict(list)
        self.prefixed: dict[tuple[ResourceType, str], list[AclBinding]] = defaultdict(list)
        lengths: dict[ResourceType, set[int]] = defaultdict(set)
        for b in bindings:
            if b.pattern_type is PatternType.LITERAL:
                self.literal[(b.resource_type, b.name)].append(b)
            else:
                self.prefixed[(b.resource_type, b.name)].append(b)
                lengths[b.resource_type].add(len(b.name))
        self.prefix_lengths = {t: sorted(n) for t, n in lengths.items()}
        self.literal = dict(self.literal)  # lookups below must not insert
        self.prefixed = dict(self.prefixed)

    def matching(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        """Every binding that applies to this resource, whoever it names."""
        out: list[AclBinding] = []
        literal = self.literal
        found = literal.get((resource_type, name))
        if found:
            out.extend(found)
        if name != WILDCARD:
            found = literal.get((resource_type, WILDCARD))
            if found:
                out.extend(found)
        for n in self.prefix_lengths.get(resource_type, ()):
            if n > len(name):
                break
            found = self.prefixed.get((resource_type, name[:n]))
            if found:
                out.extend(found)
        return out


class Authorizer:
    """`super_users`: principals ("User:<name>") allowed everything. With no binding on a
    resource, `allow_everyone_if_no_acl_found` decides (Kafka's default: refuse)."""

    def __init__(self, metadata: MetadataStore, super_users: Iterable[str] = (), allow_everyone_if_no_acl_found: bool = False) -> None:
        self.metadata = metadata
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._version: int | None = None
        self._index = _Index([])

    def _current(self) -> _Index:
        version = self.metadata.security_version()
        if version != self._version:
            self._index = _Index(read_bindings(self.metadata.security_items(PREFIX)))
            self._version = version
        return self._index

    # --- decisions ---

    def authorize(self, principal: str, host: str, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        if principal in self.super_users:
            return True
        return self._decide(self._current().matching(resource_type, name), principal, host, operation)

    def authorized_operations(self, principal: str, host: str, resource_type: ResourceType, name: str) -> int:
        """The bitfield of the operations this principal may do on the resource, among those the
        resource type supports (bit n is operation code n), as Kafka's responses report them."""
        supported = SUPPORTED_OPERATIONS.get(resource_type, ())
        if principal in self.super_users:
            return _bits(supported)
        acls = self._current().matching(resource_type, name)
        return _bits(op for op in supported if self._decide(acls, principal, host, op))

    def authorize_any(self, principal: str, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        """Whether the principal may do the operation on some resource of the type: Kafka's
        authorizeByResourceType (an idempotent producer with WRITE on any topic needs no cluster
        IDEMPOTENT_WRITE). A wildcard DENY refuses; else any ALLOW binding not denied outright."""
        if principal in self.super_users:
            return True
        index = self._current()
        bindings = [b for b in index.bindings if b.resource_type == resource_type and _applies(b, principal, host, operation)]
        denied = [b for b in bindings if b.permission is Permission.DENY]
        if any(b.pattern_type is PatternType.LITERAL and b.name == WILDCARD for b in denied):
            return False
        if self.allow_everyone_if_no_acl_found:
            return True
        denied_literal = {b.name for b in denied if b.pattern_type is PatternType.LITERAL}
        denied_prefixes = [b.name for b in denied if b.pattern_type is PatternType.PREFIXED]
        for b in bindings:
            if b.permission is not Permission.ALLOW:
                continue
            if any(b.name.startswith(p) for p in denied_prefixes):
                continue
            if b.pattern_type is PatternType.LITERAL and b.name != WILDCARD and b.name in denied_literal:
                continue
            return True
        return False

    def _decide(self, acls: list[AclBinding], principal: str, host: str, operation: Operation) -> bool:
        if not acls:
            return self.allow_everyone_if_no_acl_found
        allowed = False
        granting = _ALLOWED_BY.get(operation)
        for b in acls:
            if b.principal != principal and b.principal != WILDCARD_PRINCIPAL:
                continue
            if b.host != host and b.host != WILDCARD:
                continue
            if b.permission is Permission.DENY:
                # a DENY refuses only the operation it names (or ALL), never an implied one
                if b.operation is operation or b.operation is Operation.ALL:
                    return False
            elif not allowed:
                allowed = b.operation is operation or b.operation is Operation.ALL or (granting is not None and b.operation in granting)
        return allowed

    # --- the bindings, for the ACL admin APIs ---

    def bindings(self, selected: AclFilter | None = None) -> list[AclBinding]:
        every = self._current().bindings
        return list(every) if selected is None else [b for b in every if selected.matches(b)]

    async def create(self, bindings: Sequence[AclBinding]) -> None:
        """Store the (validated) bindings in one write; raises MetadataUnavailable."""
        await self._write({b.key(): b.encode() for b in bindings})

    async def delete(self, filters: Sequence[AclFilter]) -> list[list[AclBinding]]:
        """Remove the bindings each filter matches, in one write; each filter's matched bindings,
        in order (a binding matched by several filters is reported by the first, as in Kafka)."""
        every = self._current().bindings
        taken: set[AclBinding] = set()
        out: list[list[AclBinding]] = []
        for f in filters:
            matched = [b for b in every if b not in taken and f.matches(b)]
            taken.update(matched)
            out.append(matched)
        await self._write({b.key(): None for b in taken})
        return out

    async def _write(self, writes: dict[str, bytes | None]) -> None:
        """The writes in as few store writes as its limits allow (each binding is a key of its own,
        so a request of many bindings needs no single atomic write)."""
        batch: dict[str, bytes | None] = {}
        size = 0
        for key, value in writes.items():
            n = len(key) + (len(value) if value is not None else 0)
            if batch and (len(batch) >= MAX_SECURITY_WRITE_KEYS or size + n > MAX_SECURITY_WRITE_BYTES):
                await self.metadata.security_write(batch)
                batch, size = {}, 0
            batch[key] = value
            size += n
        if batch:
            await self.metadata.security_write(batch)


def _applies(b: AclBinding, principal: str, host: str, operation: Operation) -> bool:
    return (b.principal == principal or b.principal == WILDCARD_PRINCIPAL) and (b.host == host or b.host == WILDCARD) and (b.operation is operation or b.operation is Operation.ALL)


def _bits(operations: Iterable[Operation]) -> int:
    bits = 0
    for op in operations:
        bits |= 1 << int(op)
    return bits

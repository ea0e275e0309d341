"""The ACL authorizer's decisions as Kafka's standard authorizer makes them, on bindings kept in the
embedded metadata store's security family: DENY over ALLOW, literal, wildcard and prefixed
patterns, principal and host matching, implied operations, super users, the no-ACL default both
ways, the index rebuilt when the family changes; and the bindings' own rules (validation, keys,
filters)."""

from __future__ import annotations

import pytest

from auth.acls import PREFIX, AclBinding, AclFilter, InvalidAcl, Operation, PatternType, Permission, ResourceType
from auth.authorizer import Authorizer

TOPIC, GROUP, CLUSTER, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
Op = Operation
ALICE, BOB = "User:alice", "User:bob"
HOST = "10.1.2.3"


def acl(resource_type, name, operation, permission=ALLOW, principal=ALICE, host="*", pattern=LITERAL) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


async def authorizer(store, *bindings, **kwargs) -> Authorizer:
    a = Authorizer(store, **kwargs)
    for b in bindings:
        b.validate()
    await a.create(bindings)
    return a


async def test_allow_on_a_literal_topic_is_for_that_topic_principal_and_operation_only(store):
    a = await authorizer(store, acl(TOPIC, "orders", Op.WRITE))
    assert a.authorize(ALICE, HOST, Op.WRITE, TOPIC, "orders")
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "orders")  # another operation
    assert not a.authorize(BOB, HOST, Op.WRITE, TOPIC, "orders")  # another principal
    assert not a.authorize(ALICE, HOST, Op.WRITE, TOPIC, "orders2")  # another topic (no ACL: refused by default)
    assert not a.authorize(ALICE, HOST, Op.WRITE, GROUP, "orders")  # another resource type


async def test_deny_wins_over_allow_whatever_the_patterns(store):
    a = await authorizer(
        store,
        acl(TOPIC, "*", Op.ALL),  # everything on every topic...
        acl(TOPIC, "pay", Op.READ, DENY, pattern=PREFIXED),  # ...but reading pay*
        acl(TOPIC, "orders", Op.WRITE, DENY, principal="User:*"),  # ...and anyone writing orders
    )
    assert a.authorize(ALICE, HOST, Op.READ, TOPIC, "orders")
    assert not a.authorize(ALICE, HOST, Op.WRITE, TOPIC, "orders")
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "payments")
    assert a.authorize(ALICE, HOST, Op.WRITE, TOPIC, "payments")
    assert a.authorize(ALICE, HOST, Op.READ, TOPIC, "pa")  # shorter than the prefix: not under it


async def test_a_deny_does_not_extend_to_the_operations_its_operation_implies(store):
    # Kafka: READ implies DESCRIBE for an ALLOW, but a DENY of READ leaves DESCRIBE to the ALLOWs
    a = await authorizer(store, acl(TOPIC, "t", Op.READ, DENY), acl(TOPIC, "t", Op.DESCRIBE))
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "t")
    assert a.authorize(ALICE, HOST, Op.DESCRIBE, TOPIC, "t")


async def test_a_deny_of_all_refuses_every_operation(store):
    a = await authorizer(store, acl(TOPIC, "t", Op.ALL), acl(TOPIC, "t", Op.ALL, DENY, host=HOST))
    assert not any(a.authorize(ALICE, HOST, op, TOPIC, "t") for op in (Op.READ, Op.WRITE, Op.DESCRIBE, Op.DELETE))
    assert a.authorize(ALICE, "10.9.9.9", Op.READ, TOPIC, "t")  # the DENY names one host


async def test_prefixed_patterns_match_every_name_starting_with_them(store):
    a = await authorizer(store, acl(TOPIC, "orders-", Op.WRITE, pattern=PREFIXED), acl(TOPIC, "orders-eu-", Op.READ, pattern=PREFIXED))
    assert a.authorize(ALICE, HOST, Op.WRITE, TOPIC, "orders-")
    assert a.authorize(ALICE, HOST, Op.WRITE, TOPIC, "orders-us")
    assert a.authorize(ALICE, HOST, Op.WRITE, TOPIC, "orders-eu-1")
    assert a.authorize(ALICE, HOST, Op.READ, TOPIC, "orders-eu-1")  # both prefixes apply
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "orders-us")
    assert not a.authorize(ALICE, HOST, Op.WRITE, TOPIC, "orders")
    assert not a.authorize(ALICE, HOST, Op.WRITE, TOPIC, "xorders-us")


async def test_the_literal_wildcard_name_matches_every_resource_of_its_type_only(store):
    a = await authorizer(store, acl(GROUP, "*", Op.READ))
    assert a.authorize(ALICE, HOST, Op.READ, GROUP, "any-group")
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "any-group")
    # a literal "*" in a prefixed binding is a prefix of the character "*", not a wildcard
    b = await authorizer(store, acl(TOPIC, "*", Op.READ, pattern=PREFIXED))
    assert b.authorize(ALICE, HOST, Op.READ, TOPIC, "*x")
    assert not b.authorize(ALICE, HOST, Op.READ, TOPIC, "x")


async def test_principal_and_host_wildcards(store):
    a = await authorizer(store, acl(TOPIC, "t", Op.READ, principal="User:*", host=HOST))
    assert a.authorize(ALICE, HOST, Op.READ, TOPIC, "t")
    assert a.authorize(BOB, HOST, Op.READ, TOPIC, "t")
    assert not a.authorize(BOB, "10.1.2.4", Op.READ, TOPIC, "t")


async def test_implied_operations(store):
    a = await authorizer(
        store,
        acl(TOPIC, "r", Op.READ),
        acl(TOPIC, "w", Op.WRITE),
        acl(TOPIC, "d", Op.DELETE),
        acl(TOPIC, "a", Op.ALTER),
        acl(TOPIC, "c", Op.ALTER_CONFIGS),
        acl(TOPIC, "all", Op.ALL),
        acl(TOPIC, "create", Op.CREATE),
    )
    for name in ("r", "w", "d", "a", "all"):
        assert a.authorize(ALICE, HOST, Op.DESCRIBE, TOPIC, name), name
    assert not a.authorize(ALICE, HOST, Op.DESCRIBE, TOPIC, "c")
    assert not a.authorize(ALICE, HOST, Op.DESCRIBE, TOPIC, "create")  # CREATE implies nothing
    assert a.authorize(ALICE, HOST, Op.DESCRIBE_CONFIGS, TOPIC, "c")
    assert not a.authorize(ALICE, HOST, Op.DESCRIBE_CONFIGS, TOPIC, "r")
    assert not a.authorize(ALICE, HOST, Op.WRITE, TOPIC, "r")  # nothing implies more than itself
    assert all(a.authorize(ALICE, HOST, op, TOPIC, "all") for op in (Op.READ, Op.WRITE, Op.CREATE, Op.DELETE, Op.ALTER, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS))


async def test_super_users_are_allowed_everything_even_against_a_deny(store):
    a = await authorizer(store, acl(TOPIC, "t", Op.ALL, DENY, principal="User:*"), super_users=["User:admin"])
    assert a.authorize("User:admin", HOST, Op.WRITE, TOPIC, "t")
    assert a.authorize("User:admin", HOST, Op.ALTER, CLUSTER, "kafka-cluster")
    assert not a.authorize(ALICE, HOST, Op.WRITE, TOPIC, "t")


async def test_no_acl_on_a_resource_is_decided_by_allow_everyone_if_no_acl_found(store):
    await authorizer(store, acl(TOPIC, "guarded", Op.READ, principal=BOB))
    closed = Authorizer(store)
    opened = Authorizer(store, allow_everyone_if_no_acl_found=True)
    assert not closed.authorize(ALICE, HOST, Op.READ, TOPIC, "free")
    assert opened.authorize(ALICE, HOST, Op.READ, TOPIC, "free")
    # a resource with any binding, even for someone else, is decided by its bindings
    assert not opened.authorize(ALICE, HOST, Op.READ, TOPIC, "guarded")
    assert opened.authorize(BOB, HOST, Op.READ, TOPIC, "guarded")


async def test_the_index_follows_the_store_when_its_version_moves(store):
    a = Authorizer(store)
    other = Authorizer(store)  # as another broker's, writing to the same family
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "t")
    await other.create([acl(TOPIC, "t", Op.READ)])
    assert a.authorize(ALICE, HOST, Op.READ, TOPIC, "t")
    removed = await other.delete([AclFilter(ResourceType.ANY, None, PatternType.ANY, None, None, Op.ANY, Permission.ANY)])
    assert removed == [[acl(TOPIC, "t", Op.READ)]]
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "t")


async def test_the_index_is_not_rebuilt_while_the_version_stands(store):
    a = await authorizer(store, acl(TOPIC, "t", Op.READ))
    assert a.authorize(ALICE, HOST, Op.READ, TOPIC, "t")
    index = a._index
    for _ in range(3):
        a.authorize(ALICE, HOST, Op.READ, TOPIC, "t")
        a.authorized_operations(ALICE, HOST, TOPIC, "t")
    assert a._index is index


async def test_authorized_operations_bitfield(store):
    a = await authorizer(store, acl(TOPIC, "t", Op.READ), acl(TOPIC, "t", Op.ALTER_CONFIGS), acl(CLUSTER, "kafka-cluster", Op.ALL))
    expected = {Op.READ, Op.DESCRIBE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS}
    assert a.authorized_operations(ALICE, HOST, TOPIC, "t") == sum(1 << int(op) for op in expected)
    assert a.authorized_operations(ALICE, HOST, CLUSTER, "kafka-cluster") == sum(1 << int(op) for op in (Op.CREATE, Op.CLUSTER_ACTION, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS, Op.IDEMPOTENT_WRITE, Op.ALTER, Op.DESCRIBE))
    assert a.authorized_operations(BOB, HOST, TOPIC, "t") == 0


async def test_allowed_on_any_resource_of_a_type(store):
    a = await authorizer(store, acl(TOPIC, "orders-", Op.WRITE, pattern=PREFIXED), acl(TOPIC, "orders-", Op.WRITE, DENY, principal=BOB, pattern=PREFIXED), acl(TOPIC, "logs", Op.WRITE, principal=BOB))
    assert a.authorize_any(ALICE, HOST, Op.WRITE, TOPIC)
    assert a.authorize_any(BOB, HOST, Op.WRITE, TOPIC)  # logs
    assert not a.authorize_any("User:carol", HOST, Op.WRITE, TOPIC)
    b = await authorizer(store, acl(TOPIC, "*", Op.WRITE, DENY, principal=BOB))
    assert not b.authorize_any(BOB, HOST, Op.WRITE, TOPIC)


async def test_bindings_are_kept_one_key_each_and_created_once(store):
    a = Authorizer(store)
    one, two = acl(TOPIC, "t", Op.READ), acl(TOPIC, "t", Op.WRITE)
    await a.create([one])
    await Authorizer(store).create([two])  # another broker's creation does not overwrite the first
    await a.create([one])  # the same binding again: still one
    items = store.security_items(PREFIX)
    assert sorted(items) == sorted([one.key(), two.key()])
    assert sorted(AclBinding.decode(v) for v in items.values()) == sorted([one, two])


@pytest.mark.parametrize(
    ("binding", "why"),
    [
        (acl(ResourceType.ANY, "t", Op.READ), "invalid resource type"),
        (acl(ResourceType.DELEGATION_TOKEN, "token", Op.DESCRIBE), "delegation tokens"),
        (acl(ResourceType.USER, "User:bob", Op.CREATE_TOKENS), "delegation tokens"),
        (acl(TOPIC, "t", Op.READ, pattern=PatternType.MATCH), "invalid pattern type"),
        (acl(TOPIC, "t", Op.ANY), "invalid operation"),
        (acl(TOPIC, "t", Op.READ, Permission.ANY), "invalid permission type"),
        (acl(TOPIC, "", Op.READ), "empty resource name"),
        (acl(CLUSTER, "my-cluster", Op.ALTER), "kafka-cluster"),
        (acl(TOPIC, "t", Op.READ, principal="alice"), "invalid principal"),
        (AclBinding.of(99, "t", 3, ALICE, "*", 3, 3), "invalid resource type"),
    ],
)
def test_bindings_kafka_refuses(binding, why):
    with pytest.raises(InvalidAcl, match=why):
        binding.validate()


def test_filters_select_as_kafka_filters_do():
    lit = acl(TOPIC, "orders", Op.READ)
    star = acl(TOPIC, "*", Op.WRITE, principal=BOB)
    pre = acl(TOPIC, "ord", Op.READ, DENY, pattern=PREFIXED)
    grp = acl(GROUP, "orders", Op.READ)
    every = [lit, star, pre, grp]

    def selected(**kw):
        f = dict(resource_type=ResourceType.ANY, name=None, pattern_type=PatternType.ANY, principal=None, host=None, operation=Op.ANY, permission=Permission.ANY) | kw
        return [b for b in every if AclFilter(**f).matches(b)]

    assert selected() == every
    assert selected(resource_type=TOPIC) == [lit, star, pre]
    assert selected(name="orders") == [lit, grp]  # ANY: the name compared exactly
    assert selected(name="orders", pattern_type=PatternType.MATCH) == [lit, star, pre, grp]  # every binding that applies to "orders"
    assert selected(name="orders", pattern_type=PatternType.MATCH, resource_type=TOPIC, permission=DENY) == [pre]
    assert selected(pattern_type=PREFIXED) == [pre]
    assert selected(principal=BOB) == [star]
    assert selected(operation=Op.WRITE) == [star]
    assert selected(host="10.0.0.1") == []
    with pytest.raises(InvalidAcl):
        AclFilter.of(0, None, 1, None, None, 1, 1).validate()


async def test_more_bindings_than_one_store_write_takes_are_created_and_deleted(store):
    a = Authorizer(store)
    many = [acl(TOPIC, f"t{i}", Op.READ) for i in range(250)]  # the store takes 100 keys a write
    await a.create(many)
    assert len(store.security_items(PREFIX)) == 250
    assert a.authorize(ALICE, HOST, Op.READ, TOPIC, "t249")
    removed = await a.delete([AclFilter(TOPIC, None, PatternType.ANY, ALICE, None, Op.ANY, Permission.ANY)])
    assert sorted(removed[0]) == sorted(many)
    assert store.security_items(PREFIX) == {}


def test_a_binding_over_the_store_value_limit_is_refused():
    with pytest.raises(InvalidAcl, match="at most"):
        acl(GROUP, "g" * 70_000, Op.READ).validate()

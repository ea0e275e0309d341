"""KIP-848 consumer groups driven directly (no sockets): joining, the uniform and range assignors,
incremental reconciliation (revoked partitions withheld from their new owner until the old one
acknowledges), epoch fencing, session and revocation timeouts, static members, stored state, and
the coordinator's interplay with classic groups and offsets. Timeouts are a few hundred
milliseconds to a second and a half, waited for with generous bounds; exact assignments are asserted."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from broker.groups import state
from broker.groups.consumer_group import ConsumerGroup, Heartbeat, MemberState
from broker.groups.coordinator import GroupCoordinator
from broker.groups.group import GroupError
from broker.groups.subscription import subscribed_topics
from metadata.embedded import EmbeddedMetadataStore
from metadata.model import BrokerRegistration, CommittedOffset, TopicInfo

NONE, UNKNOWN_MEMBER_ID, INCONSISTENT_GROUP_PROTOCOL, INVALID_REQUEST = 0, 25, 23, 42
GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, FENCED_INSTANCE_ID = 69, 68, 82
FENCED_MEMBER_EPOCH, UNRELEASED_INSTANCE_ID, UNSUPPORTED_ASSIGNOR, STALE_MEMBER_EPOCH = 110, 111, 112, 113
INVALID_REGULAR_EXPRESSION = 128

T = TopicInfo("t", uuid.UUID(int=1), 6)
U = TopicInfo("u", uuid.UUID(int=2), 2)
TOPICS = {"t": T, "u": U}
LONG = 10_000


def parts(*ps: int, topic: TopicInfo = T) -> dict:
    return {topic.topic_id: frozenset(ps)} if ps else {}


def join(g: ConsumerGroup, member: str, topics=("t",), instance: str | None = None, assignor: str | None = None, rebalance_ms: int = LONG, known=TOPICS):
    return g.heartbeat(Heartbeat(member, 0, instance, rebalance_timeout_ms=rebalance_ms, topic_names=tuple(topics), assignor=assignor, owned={}), known)


def beat(g: ConsumerGroup, member: str, epoch: int, owned: dict | None = None, known=TOPICS, **kw):
    return g.heartbeat(Heartbeat(member, epoch, owned=owned, **kw), known)


async def until(condition, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_first_member_gets_every_partition():
    g = ConsumerGroup("g", heartbeat_interval_ms=700)
    r = join(g, "a")
    assert (r.error, r.member_id, r.member_epoch, r.heartbeat_interval_ms, r.assignment) == (NONE, "a", 1, 700, parts(0, 1, 2, 3, 4, 5))
    assert (g.group_epoch, g.assignment_epoch, g.state_name) == (1, 1, "Stable")
    # A heartbeat with nothing changed carries no assignment and keeps the epoch.
    r = beat(g, "a", 1)
    assert (r.error, r.member_epoch, r.assignment) == (NONE, 1, None)


async def test_v0_member_gets_its_id_from_the_coordinator():
    g = ConsumerGroup("g")
    r = g.heartbeat(Heartbeat("", 0, rebalance_timeout_ms=LONG, topic_names=("t",), owned={}, version=0), TOPICS)
    assert r.error == NONE and uuid.UUID(r.member_id) and r.member_id in g.members
    r = g.heartbeat(Heartbeat("", 0, rebalance_timeout_ms=LONG, topic_names=("t",), owned={}, version=1), TOPICS)
    assert r.error == INVALID_REQUEST


async def test_three_members_converge_with_revocations_acknowledged_first():
    g = ConsumerGroup("g")
    assert join(g, "a").assignment == parts(0, 1, 2, 3, 4, 5)

    # b joins: group epoch 2, target a{0,2,4} b{1,3,5}. b gets nothing while a still holds it all.
    r = join(g, "b")
    assert (r.member_epoch, r.assignment) == (2, {}) and g.members["b"].state is MemberState.UNRELEASED_PARTITIONS
    assert g.target == {"a": parts(0, 2, 4), "b": parts(1, 3, 5)} and g.state_name == "Reconciling"
    r = beat(g, "a", 1)
    assert (r.member_epoch, r.assignment) == (1, parts(0, 2, 4))  # revoke 1, 3, 5; epoch unchanged
    assert g.members["a"].revoking == parts(1, 3, 5)
    assert beat(g, "b", 2).assignment is None  # still withheld: a has not acknowledged
    assert beat(g, "a", 1, owned=parts(0, 1, 2, 3, 4, 5)).assignment is None  # a still owns them
    r = beat(g, "a", 1, owned=parts(0, 2, 4))
    assert (r.member_epoch, r.assignment) == (2, None)  # acknowledged: a reaches epoch 2
    r = beat(g, "b", 2)
    assert (r.member_epoch, r.assignment) == (2, parts(1, 3, 5))
    assert g.state_name == "Stable"

    # c joins: epoch 3, target a{0,4} b{1,3} c{2,5}; c gets 2 once a released it, 5 once b did.
    r = join(g, "c")
    assert (r.member_epoch, r.assignment) == (3, {})
    assert g.target == {"a": parts(0, 4), "b": parts(1, 3), "c": parts(2, 5)}
    assert beat(g, "a", 2).assignment == parts(0, 4)
    assert beat(g, "b", 2).assignment == parts(1, 3)
    assert beat(g, "a", 2, owned=parts(0, 4)).member_epoch == 3
    r = beat(g, "c", 3)
    assert (r.member_epoch, r.assignment) == (3, parts(2))
    assert g.members["c"].state is MemberState.UNRELEASED_PARTITIONS
    assert beat(g, "b", 2, owned=parts(1, 3)).member_epoch == 3
    assert beat(g, "c", 3).assignment == parts(2, 5)
    assert g.state_name == "Stable"
    assert {m: g.members[m].assigned for m in "abc"} == {"a": parts(0, 4), "b": parts(1, 3), "c": parts(2, 5)}

    # b leaves: epoch 4; its partitions are free at once (3 to a, 1 to c: sticky and balanced).
    r = beat(g, "b", -1)
    assert (r.error, r.member_epoch) == (NONE, -1)
    assert g.group_epoch == 4 and g.target == {"a": parts(0, 3, 4), "c": parts(1, 2, 5)}
    assert beat(g, "a", 3).assignment == parts(0, 3, 4)
    assert beat(g, "c", 3).assignment == parts(1, 2, 5)
    assert beat(g, "b", 3).error == UNKNOWN_MEMBER_ID


async def test_range_assignor_on_request_and_unknown_assignors_refused():
    g = ConsumerGroup("g")
    assert join(g, "a", assignor="sticky").error == UNSUPPORTED_ASSIGNOR
    join(g, "a", topics=("t", "u"), assignor="range")
    join(g, "b", topics=("t", "u"), assignor="range")
    assert g.assignor == "range"
    assert g.target == {"a": {**parts(0, 1, 2), **parts(0, topic=U)}, "b": {**parts(3, 4, 5), **parts(1, topic=U)}}


async def test_regex_subscription_and_new_topics_bump_the_epoch():
    g = ConsumerGroup("g")
    r = g.heartbeat(Heartbeat("a", 0, rebalance_timeout_ms=LONG, topic_regex="[tu]", owned={}), {"t": T})
    assert r.assignment == parts(0, 1, 2, 3, 4, 5) and g.group_epoch == 1
    r = beat(g, "a", 1)  # topic u appears
    assert g.group_epoch == 2 and r.member_epoch == 2 and r.assignment == {**parts(0, 1, 2, 3, 4, 5), **parts(0, 1, topic=U)}
    # Python's re backtracks (Kafka's RE2J does not): only simple patterns are taken.
    for pattern in ("(", "(a+)+", "a*b*c*", r"(t)\1", "(?=t)t"):
        bad = g.heartbeat(Heartbeat("b", 0, rebalance_timeout_ms=LONG, topic_regex=pattern, owned={}), TOPICS)
        assert bad.error == INVALID_REGULAR_EXPRESSION, pattern
    assert "b" not in g.members


async def test_fencing_and_bad_heartbeats():
    g = ConsumerGroup("g")
    join(g, "a")
    join(g, "b")
    beat(g, "a", 1)
    beat(g, "a", 1, owned=parts(0, 2, 4))  # a now at epoch 2, previous epoch 1
    assert beat(g, "a", 3).error == FENCED_MEMBER_EPOCH  # from the future
    assert beat(g, "a", 1, owned=parts(0, 2, 4)).error == NONE  # our answer was lost: the previous epoch is accepted
    assert beat(g, "a", 1, owned=parts(0, 1)).error == FENCED_MEMBER_EPOCH  # ...but not while claiming more
    assert beat(g, "zz", 2).error == UNKNOWN_MEMBER_ID
    assert beat(g, "a", -3).error == INVALID_REQUEST
    assert g.heartbeat(Heartbeat("c", 0, topic_names=("t",), owned={}), TOPICS).error == INVALID_REQUEST  # no rebalance timeout
    assert g.heartbeat(Heartbeat("c", 0, rebalance_timeout_ms=LONG, topic_names=("t",), owned=parts(1)), TOPICS).error == INVALID_REQUEST
    assert g.heartbeat(Heartbeat("c", 0, rebalance_timeout_ms=LONG, owned={}), TOPICS).error == INVALID_REQUEST  # no subscription
    assert g.heartbeat(Heartbeat("c", -2), TOPICS).error == INVALID_REQUEST  # static leave needs an instance id
    # A fenced member rejoins with epoch 0 and its id: it holds nothing and starts over.
    r = join(g, "a")
    assert (r.error, r.member_epoch, r.assignment) == (NONE, 2, parts(0, 2, 4))


async def test_session_expiry_removes_a_silent_member():
    # a heartbeats every 50 ms; its session is 30 times that, so only a silent member expires even
    # when a busy machine's event loop stalls (at 300 ms, a slow machine's a expired too: epoch 4)
    g = ConsumerGroup("g", session_timeout_ms=1500)
    join(g, "a")
    join(g, "b")
    beat(g, "a", 1)
    beat(g, "a", 1, owned=parts(0, 2, 4))
    beat(g, "b", 2)

    async def keep_a_alive():
        while True:
            beat(g, "a", g.members["a"].epoch, owned=g.members["a"].assigned)
            await asyncio.sleep(0.05)

    task = asyncio.ensure_future(keep_a_alive())
    try:
        await until(lambda: "b" not in g.members)
    finally:
        task.cancel()
    assert g.group_epoch == 3 and g.target == {"a": parts(0, 1, 2, 3, 4, 5)}
    beat(g, "a", g.members["a"].epoch, owned=g.members["a"].assigned)
    assert (g.members["a"].epoch, g.members["a"].assigned) == (3, parts(0, 1, 2, 3, 4, 5))


async def test_member_not_revoking_in_its_rebalance_timeout_is_fenced():
    g = ConsumerGroup("g")
    join(g, "a", rebalance_ms=200)
    join(g, "b")
    assert beat(g, "a", 1).assignment == parts(0, 2, 4)  # asked to revoke 1, 3, 5
    await until(lambda: "a" not in g.members)
    assert g.target == {"b": parts(0, 1, 2, 3, 4, 5)}
    assert beat(g, "b", 2).assignment == parts(0, 1, 2, 3, 4, 5)
    assert beat(g, "a", 1).error == UNKNOWN_MEMBER_ID


async def test_static_member_restart_takes_its_place_back():
    g = ConsumerGroup("g")
    join(g, "a", instance="ia")
    join(g, "b", instance="ib")
    beat(g, "a", 1)
    beat(g, "a", 1, owned=parts(0, 2, 4))
    beat(g, "b", 2)
    assert join(g, "b2", instance="ib").error == UNRELEASED_INSTANCE_ID  # ib is still running
    assert beat(g, "a", -2, instance_id="ib").error == FENCED_INSTANCE_ID
    r = beat(g, "b", -2, instance_id="ib")
    assert (r.error, r.member_epoch) == (NONE, -2)
    assert g.group_epoch == 2 and g.members["b"].assigned == parts(1, 3, 5)  # kept, nothing moves
    r = join(g, "b2", instance="ib")
    assert (r.error, r.member_epoch, r.assignment) == (NONE, 2, parts(1, 3, 5))
    assert g.group_epoch == 2 and set(g.members) == {"a", "b2"} and g.static == {"ia": "a", "ib": "b2"}
    assert g.target == {"a": parts(0, 2, 4), "b2": parts(1, 3, 5)}
    assert beat(g, "b", 2).error == UNKNOWN_MEMBER_ID


async def test_static_member_not_returning_is_removed_after_its_session():
    g = ConsumerGroup("g", session_timeout_ms=200)
    join(g, "a", instance="ia")
    beat(g, "a", -2, instance_id="ia")
    await until(lambda: not g.members)
    assert g.state_name == "Empty" and g.static == {} and g.group_epoch == 2


async def test_stored_state_round_trips_and_carries_on():
    g = ConsumerGroup("g")
    join(g, "a", instance="ia", assignor="uniform")
    join(g, "b", topics=("t", "u"))
    beat(g, "a", 1)  # a is revoking
    back = state.decode("g", state.encode(g))
    assert isinstance(back, ConsumerGroup) and state.group_type(state.encode(g)) == "consumer"
    assert (back.group_epoch, back.assignment_epoch, back.assignor, back.subscribed, back.target, back.static) == (
        g.group_epoch,
        g.assignment_epoch,
        g.assignor,
        g.subscribed,
        g.target,
        g.static,
    )
    for m in "ab":
        x, y = g.members[m], back.members[m]
        assert (x.epoch, x.previous_epoch, x.state, x.assigned, x.revoking, x.topic_names, x.instance_id, x.assignor, x.rebalance_timeout_ms) == (
            y.epoch,
            y.previous_epoch,
            y.state,
            y.assigned,
            y.revoking,
            y.topic_names,
            y.instance_id,
            y.assignor,
            y.rebalance_timeout_ms,
        )
    # The restored group carries on: no new epoch, a acknowledges, b gets what a released.
    back.start_sessions()
    assert beat(back, "a", 1, owned=back.members["a"].assigned).member_epoch == 2
    assert back.group_epoch == 2
    assert beat(back, "b", 2).assignment == back.target["b"]
    back.shutdown(0)
    g.shutdown(0)


# -- through the coordinator: interplay with classic groups and offsets -------------------------------

BROKERS = [BrokerRegistration(0, "127.0.0.1", 9000, "a")]


@pytest.fixture
async def coordinator():
    store = EmbeddedMetadataStore(None)
    await store.start()
    await store.create_topic("t", 6)
    c = GroupCoordinator(store, lambda: BROKERS, lambda: 0, min_session_timeout_ms=50)
    yield c
    c.close()
    await c.flush()
    await store.close()


def hb(member: str, epoch: int, **kw) -> Heartbeat:
    if epoch == 0:
        kw = dict(rebalance_timeout_ms=LONG, topic_names=("t",), owned={}) | kw
    return Heartbeat(member, epoch, **kw)


async def test_one_group_id_is_one_type(coordinator):
    c = coordinator
    assert (await c.consumer_heartbeat("cg", hb("a", 0, rebalance_timeout_ms=-1))).error == INVALID_REQUEST
    assert "cg" not in c.groups  # a refused first heartbeat creates no group
    assert (await c.consumer_heartbeat("cg", hb("a", 0))).error == NONE
    classic = await c.join("cg", "", None, "consumer", [("range", b"")], LONG, LONG, "client", "host", require_known_member_id=False)
    assert classic.error == INCONSISTENT_GROUP_PROTOCOL
    assert await c.heartbeat("cg", 1, "a", None) == UNKNOWN_MEMBER_ID

    joined = asyncio.ensure_future(c.join("classic", "", None, "consumer", [("range", b"")], LONG, LONG, "client", "host", require_known_member_id=False))
    assert (await asyncio.wait_for(joined, 3)).error == NONE
    assert (await c.consumer_heartbeat("classic", hb("a", 0))).error == GROUP_ID_NOT_FOUND
    with pytest.raises(GroupError) as e:
        await c.describe_consumer_group("classic")
    assert e.value.code == GROUP_ID_NOT_FOUND

    listing = {name: (protocol_type, group_state, group_type) for name, protocol_type, group_state, group_type in await c.listing()}
    assert listing["cg"] == ("consumer", "Stable", "consumer") and listing["classic"][2] == "classic"

    # Once empty, a consumer group can become a classic one (and back).
    assert (await c.consumer_heartbeat("cg", hb("a", -1))).error == NONE
    joined = asyncio.ensure_future(c.join("cg", "", None, "consumer", [("range", b"")], LONG, LONG, "client", "host", require_known_member_id=False))
    assert (await asyncio.wait_for(joined, 3)).error == NONE


async def test_commits_and_fetches_check_the_member_epoch(coordinator):
    c = coordinator
    tid = c.metadata.topics()["t"].topic_id
    offsets = {(tid, 0): CommittedOffset(5)}
    await c.consumer_heartbeat("g", hb("a", 0))
    assert await c.commit_offsets("g", 1, "a", None, offsets) == dict.fromkeys(offsets, NONE)
    assert await c.commit_offsets("g", 0, "a", None, offsets) == dict.fromkeys(offsets, STALE_MEMBER_EPOCH)
    assert await c.commit_offsets("g", 1, "zz", None, offsets) == dict.fromkeys(offsets, UNKNOWN_MEMBER_ID)
    assert await c.commit_offsets("g", -1, "", None, offsets) == dict.fromkeys(offsets, UNKNOWN_MEMBER_ID)  # the group has members
    assert (await c.fetch_offsets("g", "a", 1))[(tid, 0)].offset == 5
    with pytest.raises(GroupError) as e:
        await c.fetch_offsets("g", "a", 7)
    assert e.value.code == STALE_MEMBER_EPOCH
    assert await c.delete("g") == NON_EMPTY_GROUP
    assert subscribed_topics(await c.group("g")) == {"t"}  # OffsetDelete keeps their offsets
    await c.consumer_heartbeat("g", hb("a", -1))
    assert await c.commit_offsets("g", -1, "", None, {(tid, 0): CommittedOffset(6)}) == {(tid, 0): NONE}
    assert await c.delete("g") == NONE
    assert await c.metadata.load_group("g") is None


async def test_a_partition_given_up_cannot_be_committed_with_the_new_epoch(coordinator):
    """The KIP-848 churn duplicates: a member acknowledges revoking partition 1 and reaches the new
    epoch; the new owner fetches the committed offset; then the old member, with its new (current)
    epoch, commits records of partition 1 it had read before giving it up. Accepted, the new owner
    re-reads them although every commit succeeded. Refused (STALE_MEMBER_EPOCH for that partition,
    as KIP-1251 fences it), the client sees the commit fail; its other partitions still commit."""
    c = coordinator
    tid = c.metadata.topics()["t"].topic_id

    def parts(*ps: int) -> dict:
        return {tid: frozenset(ps)}

    assert (await c.consumer_heartbeat("g", hb("a", 0))).assignment == parts(0, 1, 2, 3, 4, 5)
    assert await c.commit_offsets("g", 1, "a", None, {(tid, 1): CommittedOffset(10)}) == {(tid, 1): NONE}
    assert (await c.consumer_heartbeat("g", hb("b", 0))).member_epoch == 2
    assert (await c.consumer_heartbeat("g", hb("a", 1))).assignment == parts(0, 2, 4)  # revoke 1, 3, 5
    # While revoking, a still holds 1: its last records of it may be committed.
    assert await c.commit_offsets("g", 1, "a", None, {(tid, 1): CommittedOffset(20)}) == {(tid, 1): NONE}
    assert (await c.consumer_heartbeat("g", hb("a", 1, owned=parts(0, 2, 4)))).member_epoch == 2
    assert (await c.consumer_heartbeat("g", hb("b", 2))).assignment == parts(1, 3, 5)
    assert (await c.fetch_offsets("g", "b", 2))[(tid, 1)].offset == 20  # where b starts reading 1
    late = {(tid, 1): CommittedOffset(45), (tid, 0): CommittedOffset(7)}
    assert await c.commit_offsets("g", 2, "a", None, late) == {(tid, 1): STALE_MEMBER_EPOCH, (tid, 0): NONE}
    committed = await c.fetch_offsets("g")
    assert (committed[(tid, 1)].offset, committed[(tid, 0)].offset) == (20, 7)
    assert await c.commit_offsets("g", 2, "b", None, {(tid, 1): CommittedOffset(30)}) == {(tid, 1): NONE}


async def test_a_new_coordinator_carries_on_from_the_stored_state(coordinator):
    c = coordinator
    await c.consumer_heartbeat("g", hb("a", 0))
    await c.consumer_heartbeat("g", hb("b", 0))
    await c.flush()
    other = GroupCoordinator(c.metadata, lambda: BROKERS, lambda: 0)
    try:
        t = c.metadata.topics()["t"]
        r = await other.consumer_heartbeat("g", hb("a", 1))
        assert (r.error, r.member_epoch, r.assignment) == (NONE, 1, parts(0, 2, 4, topic=t))
        group = await other.group("g")
        assert isinstance(group, ConsumerGroup) and group.group_epoch == 2 and group.members["a"].revoking == parts(1, 3, 5, topic=t)
    finally:
        other.close()

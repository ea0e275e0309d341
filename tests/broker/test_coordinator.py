"""The group coordinator driven directly (no sockets): the classic state machine, generation
fencing, timeouts, static membership, commit validation, stored state and takeover by another
broker. Timeouts are a few hundred milliseconds; waits are on the futures the coordinator returns,
each bounded."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from broker.groups import state
from broker.groups.coordinator import GroupCoordinator, coordinator_for
from broker.groups.group import Group, GroupError, GroupState
from metadata.embedded import EmbeddedMetadataStore
from metadata.model import BrokerRegistration, CommittedOffset

NONE, NOT_COORDINATOR, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID = 0, 16, 22, 25
INCONSISTENT_GROUP_PROTOCOL, INVALID_SESSION_TIMEOUT, REBALANCE_IN_PROGRESS = 23, 26, 27
MEMBER_ID_REQUIRED, FENCED_INSTANCE_ID = 79, 82
LONG = 10_000  # ms
BROKERS = [BrokerRegistration(0, "127.0.0.1", 9000, "a"), BrokerRegistration(1, "127.0.0.1", 9001, "b")]


@pytest.fixture
async def store():
    s = EmbeddedMetadataStore(None)
    await s.start()
    yield s
    await s.close()


def make(store, node_id: int = 0, brokers=BROKERS[:1]) -> GroupCoordinator:
    live = list(brokers)
    coordinator = GroupCoordinator(store, lambda: live, lambda: node_id, min_session_timeout_ms=50)
    coordinator.live = live  # tests change the live set in place
    return coordinator


def owned_by(node_id: int, brokers=BROKERS) -> str:
    while True:
        name = f"g-{uuid.uuid4().hex[:8]}"
        if coordinator_for(name, brokers).node_id == node_id:
            return name


async def settle(awaitable, timeout: float = 3.0):
    return await asyncio.wait_for(awaitable, timeout)


async def until(condition, timeout: float = 3.0) -> None:
    """Wait for a state change driven by a coordinator timer."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def join(c: GroupCoordinator, group: str, member_id: str = "", instance: str | None = None, protocols=(("range", b"m"),), session_ms: int = LONG, rebalance_ms: int = LONG, protocol_type: str = "consumer", v4: bool = False):
    return asyncio.ensure_future(c.join(group, member_id, instance, protocol_type, list(protocols), session_ms, rebalance_ms, "client", "host", require_known_member_id=v4))


async def stable_group(c: GroupCoordinator, group: str, n: int, **kw) -> list:
    """n members joined (all at once) and synced; returns their join results, leader first."""
    first = await settle(join(c, group, **kw))
    results = [first]
    await settle(c.sync(group, first.generation, first.member_id, kw.get("instance"), None, None, {}))
    for _ in range(n - 1):
        pending = join(c, group, **{k: v for k, v in kw.items() if k != "instance"})
        rejoins = [join(c, group, r.member_id, **{k: v for k, v in kw.items() if k != "instance"}) for r in results]
        answers = await settle(asyncio.gather(pending, *rejoins))
        results = sorted(answers[1:] + answers[:1], key=lambda r: r.member_id != r.leader)
        leader = results[0]
        assignment = {r.member_id: r.member_id.encode() for r in results}
        await settle(asyncio.gather(*(c.sync(group, r.generation, r.member_id, None, None, None, assignment if r is leader else {}) for r in results)))
    return results


async def test_member_id_required_then_leader_gets_members(store):
    c = make(store)
    first = await settle(join(c, "g", v4=True))
    assert (first.error, first.generation) == (MEMBER_ID_REQUIRED, -1) and first.member_id
    joined = await settle(join(c, "g", first.member_id, v4=True))
    assert (joined.error, joined.generation, joined.leader, joined.protocol_name) == (NONE, 1, first.member_id, "range")
    assert joined.members == ((first.member_id, None, b"m"),)
    synced = await settle(c.sync("g", 1, first.member_id, None, "consumer", "range", {first.member_id: b"all"}))
    assert (synced.error, synced.assignment) == (NONE, b"all")
    assert c.groups["g"].state is GroupState.STABLE


async def test_rebalance_waits_for_every_member_and_distributes_assignments(store):
    c = make(store)
    a = await settle(join(c, "g"))
    await settle(c.sync("g", 1, a.member_id, None, None, None, {a.member_id: b"A1"}))
    b_join = join(c, "g")
    await asyncio.sleep(0)
    assert not b_join.done()  # waits for a to rejoin
    assert await c.heartbeat("g", 1, a.member_id, None) == REBALANCE_IN_PROGRESS
    a2, b = await settle(asyncio.gather(join(c, "g", a.member_id), b_join))
    assert (a2.generation, b.generation, a2.leader, b.leader) == (2, 2, a.member_id, a.member_id)
    assert {m for m, _, _ in a2.members} == {a.member_id, b.member_id} and b.members == ()
    b_sync = asyncio.ensure_future(c.sync("g", 2, b.member_id, None, None, None, {}))
    await asyncio.sleep(0)
    assert not b_sync.done()  # waits for the leader's assignments
    a_sync = await settle(c.sync("g", 2, a.member_id, None, None, None, {a.member_id: b"A2", b.member_id: b"B2"}))
    assert ((await settle(b_sync)).assignment, a_sync.assignment) == (b"B2", b"A2")
    assert await c.heartbeat("g", 2, b.member_id, None) == NONE


async def test_member_not_rejoining_is_dropped_after_the_rebalance_timeout(store):
    c = make(store)
    a, b = await stable_group(c, "g", 2, rebalance_ms=300)
    newcomer = join(c, "g", rebalance_ms=300)
    a2 = join(c, "g", a.member_id, rebalance_ms=300)  # b never rejoins
    results = await settle(asyncio.gather(newcomer, a2))
    assert all(r.error == NONE and r.generation == 3 for r in results)
    assert set(c.groups["g"].members) == {a.member_id, results[0].member_id}
    assert await c.heartbeat("g", 2, b.member_id, None) == UNKNOWN_MEMBER_ID


async def test_session_timeout_evicts_a_silent_member(store):
    c = make(store)
    a = await settle(join(c, "g", session_ms=LONG))
    await settle(c.sync("g", 1, a.member_id, None, None, None, {}))
    b_join = join(c, "g", session_ms=200)
    a2, b = await settle(asyncio.gather(join(c, "g", a.member_id), b_join))
    await settle(asyncio.gather(c.sync("g", 2, a.member_id, None, None, None, {}), c.sync("g", 2, b.member_id, None, None, None, {})))
    group = c.groups["g"]
    await until(lambda: b.member_id not in group.members)  # b never heartbeats
    assert group.state is GroupState.PREPARING_REBALANCE
    assert await c.heartbeat("g", 2, a.member_id, None) == REBALANCE_IN_PROGRESS
    a3 = await settle(join(c, "g", a.member_id))
    assert (a3.generation, a3.members) == (3, ((a.member_id, None, b"m"),))


async def test_generation_and_member_fencing(store):
    c = make(store)
    a, b = await stable_group(c, "g", 2)
    assert await c.heartbeat("g", 1, a.member_id, None) == ILLEGAL_GENERATION
    assert await c.heartbeat("g", 2, "ghost", None) == UNKNOWN_MEMBER_ID
    assert (await c.sync("g", 1, a.member_id, None, None, None, {})).error == ILLEGAL_GENERATION
    assert (await c.sync("g", 2, "ghost", None, None, None, {})).error == UNKNOWN_MEMBER_ID
    assert (await c.sync("g", 2, a.member_id, None, "consumer", "roundrobin", {})).error == INCONSISTENT_GROUP_PROTOCOL
    tp = {(uuid.uuid4(), 0): CommittedOffset(5)}
    assert await c.commit_offsets("g", 1, a.member_id, None, tp) == dict.fromkeys(tp, ILLEGAL_GENERATION)
    assert await c.commit_offsets("g", 2, "ghost", None, tp) == dict.fromkeys(tp, UNKNOWN_MEMBER_ID)
    assert await c.commit_offsets("g", -1, "", None, tp) == dict.fromkeys(tp, UNKNOWN_MEMBER_ID)  # simple commit into a live group
    assert await c.commit_offsets("g", 2, b.member_id, None, tp) == dict.fromkeys(tp, NONE)
    assert await c.heartbeat("nobody", 1, "x", None) == UNKNOWN_MEMBER_ID


async def test_commits_during_a_rebalance(store):
    c = make(store)
    a = await settle(join(c, "g"))
    await settle(c.sync("g", 1, a.member_id, None, None, None, {}))
    tp = {(uuid.uuid4(), 0): CommittedOffset(7)}
    b_join = join(c, "g")
    await asyncio.sleep(0)
    assert await c.commit_offsets("g", 1, a.member_id, None, tp) == dict.fromkeys(tp, NONE)  # preparing: the old generation may still commit
    await settle(asyncio.gather(join(c, "g", a.member_id), b_join))
    assert await c.commit_offsets("g", 2, a.member_id, None, tp) == dict.fromkeys(tp, REBALANCE_IN_PROGRESS)  # awaiting the leader's sync


async def test_simple_commits_need_an_empty_group(store):
    c = make(store)
    tp = {(uuid.uuid4(), 3): CommittedOffset(11, 2, "meta", 1)}
    assert await c.commit_offsets("assign-only", -1, "", None, tp) == dict.fromkeys(tp, NONE)
    assert await c.fetch_offsets("assign-only") == tp
    assert await c.commit_offsets("assign-only", 1, "m", None, tp) == dict.fromkeys(tp, UNKNOWN_MEMBER_ID)


async def test_join_validation(store):
    c = make(store)
    assert (await settle(join(c, "g", session_ms=10))).error == INVALID_SESSION_TIMEOUT
    assert (await settle(join(c, "g", session_ms=2_000_000))).error == INVALID_SESSION_TIMEOUT
    assert (await settle(join(c, "g", protocol_type=""))).error == INCONSISTENT_GROUP_PROTOCOL
    assert (await settle(join(c, "g", protocols=()))).error == INCONSISTENT_GROUP_PROTOCOL
    await stable_group(c, "g", 1)
    assert (await settle(join(c, "g", protocol_type="connect"))).error == INCONSISTENT_GROUP_PROTOCOL
    assert (await settle(join(c, "g", protocols=(("cooperative-sticky", b""),)))).error == INCONSISTENT_GROUP_PROTOCOL
    assert (await settle(join(c, "g", "unknown-member"))).error == UNKNOWN_MEMBER_ID


async def test_protocol_is_the_one_every_member_supports_most_preferred(store):
    c = make(store)
    a = await settle(join(c, "g", protocols=(("range", b"r"), ("roundrobin", b"a-rr"))))
    await settle(c.sync("g", 1, a.member_id, None, None, None, {}))
    b_join = join(c, "g", protocols=(("roundrobin", b"b-rr"),))
    a2, b = await settle(asyncio.gather(join(c, "g", a.member_id, protocols=(("range", b"r"), ("roundrobin", b"a-rr"))), b_join))
    assert a2.protocol_name == "roundrobin"
    assert sorted(meta for _, _, meta in a2.members) == [b"a-rr", b"b-rr"]


async def test_static_member_restart_keeps_assignment_and_generation(store):
    c = make(store)
    a = await settle(join(c, "g", instance="inst-a"))
    await settle(c.sync("g", 1, a.member_id, "inst-a", None, None, {}))
    b_join = join(c, "g", instance="inst-b")
    a2, b = await settle(asyncio.gather(join(c, "g", a.member_id, instance="inst-a"), b_join))
    await settle(asyncio.gather(c.sync("g", 2, a.member_id, "inst-a", None, None, {a.member_id: b"A", b.member_id: b"B"}), c.sync("g", 2, b.member_id, "inst-b", None, None, {})))

    restarted = await settle(join(c, "g", instance="inst-b"))  # new process, no member id
    assert (restarted.error, restarted.generation) == (NONE, 2) and restarted.member_id != b.member_id
    assert c.groups["g"].state is GroupState.STABLE
    assert (await c.sync("g", 2, restarted.member_id, "inst-b", None, None, {})).assignment == b"B"
    assert await c.heartbeat("g", 2, a.member_id, "inst-a") == NONE  # the others saw nothing
    assert await c.heartbeat("g", 2, b.member_id, "inst-b") == FENCED_INSTANCE_ID  # the old incarnation is fenced
    assert await c.leave("g", [(b.member_id, "inst-b")]) == [FENCED_INSTANCE_ID]
    assert await c.leave("g", [("", "inst-b"), ("", "inst-z")]) == [NONE, UNKNOWN_MEMBER_ID]
    assert c.groups["g"].state is GroupState.PREPARING_REBALANCE


async def test_last_member_leaving_empties_the_group_and_it_can_be_deleted(store):
    c = make(store)
    (a,) = await stable_group(c, "g", 1)
    assert await c.delete("g") == 68  # NON_EMPTY_GROUP
    assert await c.leave("g", [(a.member_id, None)]) == [NONE]
    group = c.groups["g"]
    assert (group.state, group.generation) == (GroupState.EMPTY, 2)
    await c.flush()
    assert await store.load_group("g") is not None
    assert [name for name, _, _ in await c.list()] == ["g"]
    assert await c.delete("g") == NONE
    assert await store.load_group("g") is None and await c.list() == []
    assert await c.delete("g") == 69  # GROUP_ID_NOT_FOUND


async def test_stored_state_round_trips():
    g = Group("g")
    g.state, g.generation, g.protocol_type, g.protocol_name, g.leader = GroupState.STABLE, 4, "consumer", "range", "m1"
    from broker.groups.group import Member

    g.members["m1"] = Member("m1", "i1", "c", "h", 6000, 9000, "consumer", [("range", b"\x00\x01"), ("rr", b"")], b"\xff")
    g.static["i1"] = "m1"
    back = state.decode("g", state.encode(g))
    assert (back.state, back.generation, back.protocol_type, back.protocol_name, back.leader, back.static) == (GroupState.STABLE, 4, "consumer", "range", "m1", {"i1": "m1"})
    m = back.members["m1"]
    assert (m.instance_id, m.session_timeout_ms, m.rebalance_timeout_ms, m.protocols, m.assignment) == ("i1", 6000, 9000, [("range", b"\x00\x01"), ("rr", b"")], b"\xff")
    with pytest.raises(ValueError):
        state.decode("g", b'{"v": 99}')


async def test_another_broker_takes_over_from_the_stored_state(store):
    group = owned_by(0)
    first = make(store, node_id=0, brokers=BROKERS)
    second = make(store, node_id=1, brokers=BROKERS)
    with pytest.raises(GroupError) as e:
        await second.heartbeat(group, 1, "m", None)
    assert e.value.code == NOT_COORDINATOR
    a, b = await stable_group(first, group, 2)
    tp = {(uuid.uuid4(), 0): CommittedOffset(42)}
    assert await first.commit_offsets(group, 2, a.member_id, None, tp) == dict.fromkeys(tp, NONE)
    await first.flush()

    # broker 0 dies: its lease expires, and broker 1 sees only itself
    second.live[:] = BROKERS[1:]
    assert await second.heartbeat(group, 2, a.member_id, None) == NONE
    assert await second.heartbeat(group, 2, b.member_id, None) == NONE
    assert (await second.sync(group, 2, b.member_id, None, None, None, {})).assignment == b.member_id.encode()
    assert await second.fetch_offsets(group) == tp
    assert await second.commit_offsets(group, 2, b.member_id, None, tp) == dict.fromkeys(tp, NONE)

    # broker 0 comes back as seen by itself and by 1: ownership returns to 0, and 1 lets go
    second.live[:] = BROKERS
    pending = join(second, group, a.member_id)
    with pytest.raises(GroupError):
        await settle(pending)
    assert group not in second.groups


async def test_group_moving_away_answers_waiting_joins(store):
    group = owned_by(0)
    c = make(store, node_id=0, brokers=BROKERS[:1])
    a = await settle(join(c, group))
    await settle(c.sync(group, 1, a.member_id, None, None, None, {}))
    waiting = join(c, group)  # waits for a to rejoin
    await asyncio.sleep(0)
    c.live[:] = [BROKERS[1]]
    with pytest.raises(GroupError) as e:
        await c.heartbeat(group, 1, a.member_id, None)
    assert e.value.code == NOT_COORDINATOR
    assert (await settle(waiting)).error == NOT_COORDINATOR


async def test_unreadable_stored_state_starts_the_group_afresh(store):
    await store.save_group("g", b'{"v": 99}')
    c = make(store)
    joined = await settle(join(c, "g"))
    assert (joined.error, joined.generation) == (NONE, 1)


async def test_a_coordinator_registered_again_reads_its_groups_again(store):
    """A broker registered again (its lease lapsed in a pause) may have had its groups moved
    away and back meanwhile: it drops what it held and reads each group from the store on its
    next request, and a save its stale group would make meanwhile is not written."""
    c = make(store)
    group = owned_by(0, BROKERS[:1])
    (leader,) = await stable_group(c, group, 1)
    assert group in c.groups
    await c.flush()
    stored = await store.load_group(group)
    registered = {"revision": 0}
    store.registration_revision = lambda: registered["revision"]  # type: ignore[method-assign]
    registered["revision"] = 7  # registered again
    c._on_change(c.groups[group])  # the stale group's timer fires before any request
    await c.flush()
    assert await store.load_group(group) == stored
    await c.check_owner(group)  # the next request
    assert group not in c.groups
    answer = await settle(c.heartbeat(group, leader.generation, leader.member_id, None))
    assert answer == NONE  # read again from the store: the same generation and member

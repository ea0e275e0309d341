"""Group requests relayed across zones (broker/forwarding.py), on four in-process Kafka listeners
in two zones over one embedded store, driven by raw Kafka frames over loopback: a zone-b member of
a zone-a group talks only to its zone's relay, which forwards to the coordinator and relays the
answers (bytes as the coordinator sent them, the client's correlation ids back), pipelined over one
link; a relayed request is never relayed again; a silent coordinator costs COORDINATOR_NOT_AVAILABLE
at the deadline; a coordinator dying mid-request answers COORDINATOR_NOT_AVAILABLE, and once its
lease is gone the group carries on under its successor through the same relay."""

from __future__ import annotations

import asyncio
import datetime
import struct
import uuid
from types import SimpleNamespace

import pytest
from kio.index import load_response_schema
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.heartbeat.v4.request import HeartbeatRequest
from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.offset_commit.v8.request import OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopics
from kio.schema.sync_group.v5.request import SyncGroupRequest, SyncGroupRequestAssignment
from kio.serial import entity_reader
from prometheus_client import REGISTRY

from broker.config import BrokerConfig
from broker.context import Services
from broker.forwarding import mark
from broker.groups.coordinator import coordinator_for
from broker.locality import brokers_for_zone
from broker.metrics import CLIENT_TRAFFIC, PEER_BROKER
from broker.server import KafkaServer
from metadata.embedded import EmbeddedMetadataStore
from metadata.model import BrokerRegistration
from tests.fixtures import free_port
from tests.raw import encode_request

ZONE_OF = {0: "a", 1: "a", 2: "b", 3: "b"}
NONE, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, REBALANCE_IN_PROGRESS, MEMBER_ID_REQUIRED = 0, 15, 16, 27, 79
UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION = 25, 22
WAIT = 15.0  # seconds: any single answer, on a machine five times slower


class Cluster:
    def __init__(self, store: EmbeddedMetadataStore) -> None:
        self.store = store
        self.ports = {n: free_port() for n in ZONE_OF}
        self.brokers = {n: BrokerRegistration(n, "127.0.0.1", self.ports[n], z) for n, z in ZONE_OF.items()}
        self.services = {
            n: Services(settings=BrokerConfig(node_id=n, zone=z, port=self.ports[n]), metadata=store, wal=SimpleNamespace(seal_at=None), reader=None)  # type: ignore[arg-type]
            for n, z in ZONE_OF.items()
        }
        self.servers = {n: KafkaServer(s) for n, s in self.services.items()}

    def roles(self, group: str) -> tuple[int, int]:
        """(coordinator, zone b's relay) of a group whose home is zone a."""
        live = self.store.live_brokers()
        return coordinator_for(group, brokers_for_zone(live, "a")).node_id, coordinator_for(group, brokers_for_zone(live, "b")).node_id

    async def kill(self, node: int) -> None:
        """Stop a broker's listener (its connections close) and let its lease expire."""
        await self.servers[node].stop()
        self.store._brokers.pop(node)


@pytest.fixture
async def cluster():
    store = EmbeddedMetadataStore(None)
    await store.start()
    c = Cluster(store)
    for n, broker in c.brokers.items():
        await store.register_broker(broker)
        await c.servers[n].start()
    await store.create_topic("t", 4)
    yield c
    for server in c.servers.values():
        await server.stop()
    for services in c.services.values():
        services.coordinator.close()
    await store.close()


class Client:
    """One loopback connection speaking raw frames: answers come back in request order."""

    def __init__(self, port: int, client_id: str) -> None:
        self.port, self.client_id = port, client_id
        self.correlation_id = 1000

    async def __aenter__(self) -> Client:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc) -> None:
        self.writer.close()

    def send(self, body) -> tuple[int, int, int]:
        self.correlation_id += 7  # not the relay's own numbering
        self.writer.write(encode_request(body, self.correlation_id, self.client_id))
        return body.__api_key__, body.__version__, self.correlation_id

    async def frame(self) -> bytes:
        (size,) = struct.unpack(">i", await asyncio.wait_for(self.reader.readexactly(4), WAIT))
        return await asyncio.wait_for(self.reader.readexactly(size), WAIT)

    async def answer(self, sent: tuple[int, int, int]):
        api_key, version, correlation_id = sent
        frame = await self.frame()
        cls = load_response_schema(api_key, version)
        header, used = entity_reader(cls.__header_schema__)(frame, 0)
        assert header.correlation_id == correlation_id
        body, used_body = entity_reader(cls)(frame, used)
        assert used + used_body == len(frame)
        return body

    async def ask(self, body):
        return await self.answer(self.send(body))


def join_request(group: str, member_id: str = "", rebalance_ms: int = 10_000) -> JoinGroupRequest:
    return JoinGroupRequest(
        group_id=group, session_timeout=datetime.timedelta(seconds=10), rebalance_timeout=datetime.timedelta(milliseconds=rebalance_ms),
        member_id=member_id, group_instance_id=None, protocol_type="consumer", protocols=(JoinGroupRequestProtocol(name="range", metadata=b"meta"),),
    )  # fmt: skip


async def join(client: Client, group: str, member_id: str = "", rebalance_ms: int = 10_000):
    """JoinGroup until the member is in (a first join is asked to come back with its id)."""
    answer = await client.ask(join_request(group, member_id, rebalance_ms))
    if answer.error_code in (MEMBER_ID_REQUIRED, UNKNOWN_MEMBER_ID):
        answer = await client.ask(join_request(group, answer.member_id if answer.error_code == MEMBER_ID_REQUIRED else "", rebalance_ms))
        if answer.error_code == MEMBER_ID_REQUIRED:
            answer = await client.ask(join_request(group, answer.member_id, rebalance_ms))
    assert answer.error_code == NONE, answer
    return answer


def sync_request(group: str, joined, assignments=()) -> SyncGroupRequest:
    return SyncGroupRequest(
        group_id=group, generation_id=joined.generation_id, member_id=joined.member_id, group_instance_id=None,
        protocol_type="consumer", protocol_name="range", assignments=tuple(SyncGroupRequestAssignment(member_id=m, assignment=a) for m, a in assignments),
    )  # fmt: skip


def heartbeat_request(group: str, joined) -> HeartbeatRequest:
    return HeartbeatRequest(group_id=group, generation_id=joined.generation_id, member_id=joined.member_id, group_instance_id=None)


async def place_home(cluster: Cluster, group: str, zone: str = "a") -> None:
    """A client of `zone` looks the group up first, so `zone` is its home."""
    async with Client(cluster.ports[0 if zone == "a" else 2], f"first,zone_id={zone}") as c:
        answer = await c.ask(FindCoordinatorRequest(key_type=0, coordinator_keys=(group,)))
        assert answer.coordinators[0].error_code == NONE


async def zone_a_group(cluster: Cluster) -> tuple[str, int, int]:
    """A new group whose home is zone a: (its id, its coordinator, zone b's relay)."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    await place_home(cluster, group)
    return group, *cluster.roles(group)


def forwarded(api: str) -> float:
    return REGISTRY.get_sample_value("neve_group_forwarded_requests_total", {"api": api}) or 0.0


def failures(api: str, reason: str) -> float:
    return REGISTRY.get_sample_value("neve_group_forward_failures_total", {"api": api, "reason": reason}) or 0.0


def links_accepted(zone: str) -> int:
    counter = CLIENT_TRAFFIC.accepted.get((PEER_BROKER, zone))
    return counter.value if counter else 0


async def test_a_member_in_another_zone_is_served_through_its_zones_relay(cluster):
    group, coordinator, relay = await zone_a_group(cluster)
    links_before, joins_before = links_accepted("a"), forwarded("JoinGroup")
    async with Client(cluster.ports[relay], "member-b,zone_id=b") as member:
        found = await member.ask(FindCoordinatorRequest(key_type=0, coordinator_keys=(group,)))
        assert (found.coordinators[0].node_id, found.coordinators[0].port) == (relay, cluster.ports[relay]), "its own zone's broker"
        joined = await join(member, group)
        assert joined.leader == joined.member_id and joined.generation_id == 1
        synced = await member.ask(sync_request(group, joined, [(joined.member_id, b"all of t")]))
        assert (synced.error_code, synced.assignment) == (NONE, b"all of t")
        assert (await member.ask(heartbeat_request(group, joined))).error_code == NONE
        commit = OffsetCommitRequest(
            group_id=group, generation_id_or_member_epoch=joined.generation_id, member_id=joined.member_id, group_instance_id=None,
            topics=(OffsetCommitRequestTopic(name="t", partitions=tuple(OffsetCommitRequestPartition(partition_index=p, committed_offset=10 * p + 1, committed_leader_epoch=-1, committed_metadata="m") for p in range(4))),),
        )  # fmt: skip
        committed = await member.ask(commit)
        assert [p.error_code for p in committed.topics[0].partitions] == [NONE] * 4
        fetch = OffsetFetchRequest(groups=(OffsetFetchRequestGroup(group_id=group, topics=(OffsetFetchRequestTopics(name="t", partition_indexes=(0, 1, 2, 3)),)),), require_stable=False)
        fetched = await member.ask(fetch)
        assert [(p.partition_index, p.committed_offset, p.metadata) for p in fetched.groups[0].topics[0].partitions] == [(p, 10 * p + 1, "m") for p in range(4)]
        # the relayed answer is the coordinator's own bytes, under the member's correlation id
        async with Client(cluster.ports[coordinator], "member-b,zone_id=b") as direct:
            sent_direct = direct.send(fetch)
            at_coordinator = await direct.frame()
        sent = member.send(fetch)
        relayed = await member.frame()
        assert struct.unpack_from(">i", relayed)[0] == sent[2] and struct.unpack_from(">i", at_coordinator)[0] == sent_direct[2]
        assert relayed[4:] == at_coordinator[4:]
    # one coordinator, which kept the member's own client id and host
    group_state = cluster.services[coordinator].coordinator.groups[group]
    ((member_state),) = group_state.members.values()
    assert (member_state.client_id, member_state.client_host) == ("member-b,zone_id=b", "127.0.0.1")
    assert group not in cluster.services[relay].coordinator.groups
    assert await cluster.store.fetch_offsets(group) and len(await cluster.store.fetch_offsets(group)) == 4
    assert forwarded("JoinGroup") - joins_before >= 2
    assert links_accepted("a") - links_before == 1, "one link from the relay to the coordinator, counted as a broker's"


async def second_member_waiting(cluster: Cluster, group: str, m1: Client, m2: Client):
    """m1 joined and synced (generation 1, stored), then m2's JoinGroup sent: it waits at the
    coordinator until m1 rejoins. Returns (m1's join, m2's member id, m2's waiting request)."""
    first = await join(m1, group)
    assert (await m1.ask(sync_request(group, first, [(first.member_id, b"x")]))).error_code == NONE
    await cluster.services[cluster.roles(group)[0]].coordinator.flush()
    m2_id = (await m2.ask(join_request(group))).member_id
    return first, m2_id, m2.send(join_request(group, m2_id))


async def test_the_link_is_pipelined_and_a_waiting_join_holds_up_nothing(cluster):
    group, coordinator, relay = await zone_a_group(cluster)
    async with Client(cluster.ports[relay], "m1,zone_id=b") as m1, Client(cluster.ports[relay], "m2,zone_id=b") as m2:
        first, m2_id, waiting = await second_member_waiting(cluster, group, m1, m2)
        # m1's heartbeat goes over the same link and is answered meanwhile
        for _ in range(100):
            beat = await m1.ask(heartbeat_request(group, first))
            if beat.error_code == REBALANCE_IN_PROGRESS:
                break
            assert beat.error_code == NONE
            await asyncio.sleep(0.02)  # until the coordinator has m2's join (nothing to await across the link)
        assert beat.error_code == REBALANCE_IN_PROGRESS
        rejoined = await join(m1, group, first.member_id)
        second = await m2.answer(waiting)
    assert second.error_code == NONE and rejoined.generation_id == second.generation_id == 2
    assert {rejoined.member_id, second.member_id} == {first.member_id, m2_id}
    link = cluster.servers[relay].forwarder._links[coordinator]
    assert link.in_flight == 0


async def test_a_relayed_request_is_never_relayed_again(cluster):
    group, coordinator, relay = await zone_a_group(cluster)
    before = forwarded("Heartbeat")
    async with Client(cluster.ports[relay], mark("m,zone_id=b", "10.0.0.9", "User:ANONYMOUS")) as marked:
        beat = await marked.ask(HeartbeatRequest(group_id=group, generation_id=1, member_id="m-1", group_instance_id=None))
    assert beat.error_code == NOT_COORDINATOR
    assert forwarded("Heartbeat") == before
    # a zoned client asking a broker that is neither the coordinator nor its zone's relay: looked up again
    other_b = next(n for n, z in ZONE_OF.items() if z == "b" and n != relay)
    async with Client(cluster.ports[other_b], "m,zone_id=b") as lost:
        beat = await lost.ask(HeartbeatRequest(group_id=group, generation_id=1, member_id="m-1", group_instance_id=None))
    assert beat.error_code == NOT_COORDINATOR
    assert forwarded("Heartbeat") == before


async def test_a_relay_mark_is_trusted_on_the_inter_broker_listener_only(cluster):
    """Issue 43, finding 8: with the authorizer off, a client on another listener that marks its
    requests as relayed (speaking for a member, out of order and past its in-flight bound) is
    closed; on the listener brokers relay to, the request is answered."""
    from broker.listeners import Listener

    group, coordinator, _ = await zone_a_group(cluster)
    services = cluster.services[coordinator]
    services.settings.inter_broker_listener_name = "internal"
    internal, external = free_port(), free_port()
    server = KafkaServer(services, [Listener("EXTERNAL", "PLAINTEXT", "127.0.0.1", external, "127.0.0.1"), Listener("INTERNAL", "PLAINTEXT", "127.0.0.1", internal, "127.0.0.1")])
    await server.start()
    try:
        beat = HeartbeatRequest(group_id=group, generation_id=1, member_id="m-1", group_instance_id=None)
        async with Client(external, mark("m", "10.0.0.9", "User:ANONYMOUS")) as outside:
            outside.send(beat)
            with pytest.raises(asyncio.IncompleteReadError):
                await outside.frame()  # closed: no broker relays to this listener
        async with Client(internal, mark("m", "10.0.0.9", "User:ANONYMOUS")) as relay:
            assert (await relay.ask(beat)).error_code == UNKNOWN_MEMBER_ID  # answered by the coordinator
        async with Client(external, "m") as member:  # an unmarked request on the other listener is served
            assert (await member.ask(beat)).error_code == UNKNOWN_MEMBER_ID
    finally:
        await server.stop()


async def test_a_silent_coordinator_is_answered_unavailable_at_the_deadline(cluster):
    group, coordinator, relay = await zone_a_group(cluster)
    received = asyncio.Event()
    accepted = []

    async def swallow(reader, writer):  # reads requests, never answers
        accepted.append(writer)
        while await reader.read(65536):
            received.set()

    silent = await asyncio.start_server(swallow, "127.0.0.1", 0)
    try:
        await cluster.store.register_broker(BrokerRegistration(coordinator, "127.0.0.1", silent.sockets[0].getsockname()[1], "a"))
        cluster.servers[relay].forwarder.timeout_s = 0.5
        before = failures("Heartbeat", "timeout")
        async with Client(cluster.ports[relay], "m,zone_id=b") as member:
            started = asyncio.get_running_loop().time()
            beat = await member.ask(HeartbeatRequest(group_id=group, generation_id=1, member_id="m-1", group_instance_id=None))
            elapsed = asyncio.get_running_loop().time() - started
            assert beat.error_code == COORDINATOR_NOT_AVAILABLE
            assert received.is_set() and 0.5 <= elapsed < WAIT
            assert failures("Heartbeat", "timeout") - before == 1
            # the connection is still served
            found = await member.ask(FindCoordinatorRequest(key_type=0, coordinator_keys=(group,)))
            assert found.coordinators[0].node_id == relay
        assert cluster.servers[relay].forwarder._links[coordinator].in_flight == 0
    finally:
        silent.close()
        for writer in accepted:
            writer.close()
        await silent.wait_closed()


async def test_a_coordinator_dying_mid_request_then_its_successor_takes_over(cluster):
    group, coordinator, relay = await zone_a_group(cluster)
    async with Client(cluster.ports[relay], "m1,zone_id=b") as m1, Client(cluster.ports[relay], "m2,zone_id=b") as m2:
        first, m2_id, waiting = await second_member_waiting(cluster, group, m1, m2)
        held = cluster.services[coordinator].coordinator.groups[group]
        while m2_id not in held.members:
            await asyncio.sleep(0.01)  # until m2's join has reached the coordinator
        before = failures("JoinGroup", "connection")
        await cluster.kill(coordinator)
        cut = await m2.answer(waiting)
        assert cut.error_code == COORDINATOR_NOT_AVAILABLE
        assert failures("JoinGroup", "connection") - before == 1
        # its successor in zone a loads the stored group; both members get through the same relay
        successor, same_relay = cluster.roles(group)
        assert successor != coordinator and ZONE_OF[successor] == "a" and same_relay == relay
        later = asyncio.ensure_future(join(m2, group, m2_id))
        taken_over = cluster.services[successor].coordinator
        while len(getattr(taken_over.groups.get(group), "members", ())) < 2:
            await asyncio.sleep(0.01)  # until m2 joined the stored group (m1 and its generation 1)
        answers = [await join(m1, group, first.member_id), await later]
    assert {a.error_code for a in answers} == {NONE}
    assert answers[0].generation_id == answers[1].generation_id == 2
    assert {a.member_id for a in answers} == set(taken_over.groups[group].members)


def group_where(cluster: Cluster, role) -> str:
    while True:
        group = f"g-{uuid.uuid4().hex[:8]}"
        if role(*cluster.roles(group)):
            return group


async def test_a_request_naming_groups_of_several_coordinators_is_split_and_merged(cluster):
    relay = 2
    remote = group_where(cluster, lambda coordinator, r: r == relay)  # home a: relayed by broker 2
    local = group_where(cluster, lambda coordinator, r: r == relay)  # home b: coordinated by broker 2
    elsewhere = group_where(cluster, lambda coordinator, r: r != relay)  # home a, relayed by broker 3
    for group, zone in ((remote, "a"), (local, "b"), (elsewhere, "a")):
        await place_home(cluster, group, zone)
    before = forwarded("DescribeGroups")
    async with Client(cluster.ports[relay], "admin,zone_id=b") as member:
        for group in (remote, local):
            joined = await join(member, group)
            assert (await member.ask(sync_request(group, joined, [(joined.member_id, group.encode())]))).error_code == NONE
        described = await member.ask(DescribeGroupsRequest(groups=(elsewhere, remote, local, remote), include_authorized_operations=False))
    got = [(g.group_id, g.error_code, g.group_state, [m.member_assignment for m in g.members]) for g in described.groups]
    assert got == [
        (elsewhere, NOT_COORDINATOR, "", []),
        (remote, NONE, "Stable", [remote.encode()]),
        (local, NONE, "Stable", [local.encode()]),
        (remote, NONE, "Stable", [remote.encode()]),
    ]
    assert forwarded("DescribeGroups") - before == 1, "one request to the one other coordinator"


async def test_a_kip_848_member_is_relayed_too(cluster):
    from kio.schema.consumer_group_describe.v1.request import ConsumerGroupDescribeRequest
    from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest

    group, coordinator, relay = await zone_a_group(cluster)
    before = forwarded("ConsumerGroupHeartbeat")
    async with Client(cluster.ports[relay], "kip848,zone_id=b") as member:
        beat = await member.ask(
            ConsumerGroupHeartbeatRequest(
                group_id=group, member_id="m-848", member_epoch=0, instance_id=None, rack_id=None, rebalance_timeout=datetime.timedelta(seconds=10),
                subscribed_topic_names=("t",), subscribed_topic_regex=None, server_assignor=None, topic_partitions=(),
            )
        )  # fmt: skip
        assert (beat.error_code, beat.member_id, beat.member_epoch) == (NONE, "m-848", 1)
        assert [sorted(t.partitions) for t in beat.assignment.topic_partitions] == [[0, 1, 2, 3]]
        described = await member.ask(ConsumerGroupDescribeRequest(group_ids=(group,), include_authorized_operations=False))
    ((g,),) = [described.groups]
    assert (g.error_code, [(m.member_id, m.client_id) for m in g.members]) == (NONE, [("m-848", "kip848,zone_id=b")])
    assert forwarded("ConsumerGroupHeartbeat") - before == 1
    assert group in cluster.services[coordinator].coordinator.groups and group not in cluster.services[relay].coordinator.groups


async def test_a_transactional_offset_commit_is_relayed_to_the_groups_coordinator(cluster):
    from kio.schema.add_offsets_to_txn.v3.request import AddOffsetsToTxnRequest
    from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
    from kio.schema.txn_offset_commit.v3.request import TxnOffsetCommitRequest, TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic

    group, coordinator, relay = await zone_a_group(cluster)
    tid = f"tid-{uuid.uuid4().hex[:6]}"
    relayed_before = forwarded("TxnOffsetCommit")
    async with Client(cluster.ports[relay], "member-b,zone_id=b") as member:
        joined = await join(member, group)
        assert (await member.ask(sync_request(group, joined, [(joined.member_id, b"t")]))).error_code == NONE
        init = await member.ask(InitProducerIdRequest(transactional_id=tid, transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1))
        pid, epoch = init.producer_id, init.producer_epoch
        added = await member.ask(AddOffsetsToTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id=group))
        assert added.error_code == NONE

        def commit(generation: int) -> TxnOffsetCommitRequest:
            partitions = (TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=7, committed_leader_epoch=-1, committed_metadata=None),)
            return TxnOffsetCommitRequest(
                transactional_id=tid, group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=generation, member_id=joined.member_id, group_instance_id=None,
                topics=(TxnOffsetCommitRequestTopic(name="t", partitions=partitions),),
            )

        stale = await member.ask(commit(joined.generation_id + 1))  # checked by the coordinator, which holds the generation
        assert [p.error_code for p in stale.topics[0].partitions] == [ErrorCode.illegal_generation]
        accepted = await member.ask(commit(joined.generation_id))
        assert [p.error_code for p in accepted.topics[0].partitions] == [NONE]
    assert forwarded("TxnOffsetCommit") - relayed_before == 2
    topic_id = cluster.store.topics()["t"].topic_id
    assert await cluster.services[coordinator].transactions.pending_offsets(group) == {(topic_id, 0)}

"""Zone-aware answers, driven in-process over one shared embedded store with four registered
brokers in two zones: the zone hint in every spelling and separator, Metadata naming only the
client's zone's brokers, a hint naming no live zone (all brokers, counted, logged once per
client id), and FindCoordinator sending every member of one zone to one broker of that zone:
the group's coordinator in its home zone, its relay (broker/forwarding.py) in any other."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest as FindCoordinatorV3
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest as FindCoordinatorV4
from prometheus_client import REGISTRY

from broker.codec import response_module
from broker.config import BrokerConfig
from broker.context import RequestContext, Services
from broker.groups.coordinator import coordinator_for
from broker.groups.group import GroupError
from broker.handlers.api03_metadata import metadata
from broker.handlers.api10_find_coordinator import find_coordinator
from broker.locality import ZoneHints, brokers_for_zone, client_zone, known_zone, leader_for
from metadata.embedded import EmbeddedMetadataStore
from metadata.model import BrokerRegistration
from tests.raw import metadata_v12

SPELLINGS = ("zone_id", "ws_az", "warpstream_az", "zone", "diskless_az", "automq_az")
SEPARATORS = (",", " ", "&", ";")
ZONE_OF = {0: "a", 1: "a", 2: "b", 3: "b"}
NOT_COORDINATOR = 16


# -- the hint ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("sep", SEPARATORS)
def test_every_spelling_with_every_separator(spelling, sep):
    assert client_zone(f"{spelling}=us-east-1a") == "us-east-1a"
    assert client_zone(f"app-7{sep}{spelling}=us-east-1a") == "us-east-1a"
    assert client_zone(f"{spelling}=us-east-1a{sep}app-7") == "us-east-1a"
    assert client_zone(f"app{sep}{spelling}=eu_west-2b{sep}version=3") == "eu_west-2b"


@pytest.mark.parametrize("client_id", [None, "", "app", "app,zone", "app,zone=", "myzone=a", "xws_az=a", "automq_az_x=a", "zone-id=a"])
def test_no_hint(client_id):
    assert client_zone(client_id) is None


def test_the_first_hint_wins():
    assert client_zone("ws_az=a;zone_id=b") == "a"


# -- which brokers a client sees ----------------------------------------------------------------


BROKERS = [BrokerRegistration(n, "127.0.0.1", 9000 + n, z) for n, z in ZONE_OF.items()]


def test_known_zone_and_its_brokers():
    assert known_zone("app,zone=b", BROKERS) == "b"
    assert known_zone("app,zone=c", BROKERS) is None
    assert [b.node_id for b in brokers_for_zone(BROKERS, "b")] == [2, 3]
    assert [b.node_id for b in brokers_for_zone(BROKERS, "c")] == [0, 1, 2, 3]
    assert [b.node_id for b in brokers_for_zone(BROKERS, None)] == [0, 1, 2, 3]


@given(st.sampled_from(["a", "b", None]), st.sampled_from(BROKERS), st.text(min_size=1, max_size=20))
def test_a_broker_leaving_or_joining_moves_only_its_own_partitions(zone, gone, topic):
    everyone = brokers_for_zone(BROKERS, zone)
    rest = [b for b in everyone if b is not gone]
    if not rest:
        return
    with_it = {p: leader_for(topic, p, zone, everyone) for p in range(100)}
    without = {p: leader_for(topic, p, zone, rest) for p in range(100)}
    assert {p for p in with_it if with_it[p] != without[p]} == {p for p in with_it if with_it[p] == gone.node_id}


def hint_misses() -> float:
    return REGISTRY.get_sample_value("neve_zone_hint_misses_total") or 0.0


def test_a_hint_naming_no_live_zone_is_counted_and_logged_once_per_client(caplog):
    hints = ZoneHints(remember=2)
    before = hint_misses()
    with caplog.at_level(logging.WARNING, logger="neve.broker.locality"):
        assert hints.zone("app,zone_id=b", BROKERS) == "b"
        assert hints.zone("app", BROKERS) is None
        for _ in range(3):
            assert hints.zone("one,zone_id=c", BROKERS) is None
        assert hints.zone("two,ws_az=typo", BROKERS) is None
        assert hints.zone("three,ws_az=typo", BROKERS) is None  # "one" forgotten: two ids remembered
        assert hints.zone("one,zone_id=c", BROKERS) is None
    assert hint_misses() - before == 6
    logged = [(r.client_id, r.zone) for r in caplog.records if r.getMessage() == "zone_hint_unmatched"]
    assert logged == [("one,zone_id=c", "c"), ("two,ws_az=typo", "typo"), ("three,ws_az=typo", "typo"), ("one,zone_id=c", "c")]


# -- the handlers, four brokers over one store ------------------------------------------------------


@pytest.fixture
async def cluster():
    store = EmbeddedMetadataStore(None)
    await store.start()
    for b in BROKERS:
        await store.register_broker(b)
    await store.create_topic("t", 16)
    nodes = {n: Services(settings=BrokerConfig(node_id=n, zone=z, port=9000 + n), metadata=store, wal=None, reader=None) for n, z in ZONE_OF.items()}  # type: ignore[arg-type]
    yield nodes
    for services in nodes.values():
        services.coordinator.close()
    await store.close()


def ctx(services: Services, api_key: int, version: int, client_id: str | None) -> RequestContext:
    return RequestContext(services, api_key=api_key, api_version=version, client_id=client_id, response=response_module(api_key, version))


async def ask_metadata(services: Services, client_id: str | None):
    answer = await metadata(ctx(services, 3, 12, client_id), metadata_v12("t"))
    ((topic,),) = [answer.topics]
    return sorted(b.node_id for b in answer.brokers), {p.partition_index: p.leader_id for p in topic.partitions}, answer.controller_id


async def test_metadata_names_only_the_clients_zone(cluster):
    for spelling, zone in zip(SPELLINGS, "ababab"):
        for node, services in cluster.items():
            brokers, leaders, controller = await ask_metadata(services, f"app-{node};{spelling}={zone}")
            local = [n for n, z in ZONE_OF.items() if z == zone]
            assert brokers == local, (spelling, zone, node)
            assert set(leaders.values()) == set(local), "16 partitions spread over both of the zone's brokers"
            assert controller == local[0]
    # every broker names the same leaders for one zone
    answers = [(await ask_metadata(s, "zone=b"))[1] for s in cluster.values()]
    assert all(a == answers[0] for a in answers)


async def test_metadata_for_a_client_without_a_known_zone_lists_every_broker(cluster):
    before = hint_misses()
    for client_id in (None, "app", "app,zone_id=c"):
        brokers, leaders, controller = await ask_metadata(cluster[2], client_id)
        assert brokers == [0, 1, 2, 3] and controller == 0
        assert set(leaders.values()) == {0, 1, 2, 3}
    assert hint_misses() - before == 1


async def find(services: Services, group: str, client_id: str | None) -> int:
    answer = await find_coordinator(ctx(services, 10, 3, client_id), FindCoordinatorV3(key=group, key_type=0))
    assert answer.error_code == 0, answer
    assert (answer.host, answer.port) == ("127.0.0.1", 9000 + answer.node_id)
    return answer.node_id


async def test_a_single_zone_groups_coordinator_is_in_its_zone(cluster):
    for zone, spelling in (("a", "automq_az"), ("b", "diskless_az")):
        for i in range(20):
            group = f"g-{zone}-{i}"
            answers = {await find(services, group, f"c{node},{spelling}={zone}") for node, services in cluster.items() if ZONE_OF[node] == zone}
            assert len(answers) == 1
            (coordinator,) = answers
            assert ZONE_OF[coordinator] == zone
            assert coordinator == coordinator_for(group, brokers_for_zone(BROKERS, zone)).node_id


async def test_a_group_spanning_two_zones_has_one_coordinator_and_a_relay_per_zone(cluster):
    for i in range(20):
        group = f"g-{i}"
        first_zone = "ab"[i % 2]
        first = await find(cluster[1 if first_zone == "a" else 3], group, f"first,zone_id={first_zone}")
        assert ZONE_OF[first] == first_zone, "the first member's zone is the group's"
        # members of each zone, asking any broker, in any order: one broker of their own zone,
        # the coordinator itself in the group's zone
        for zone in "ab":
            answers = {await find(services, group, f"m,ws_az={zone}") for services in cluster.values()}
            assert answers == {coordinator_for(group, brokers_for_zone(BROKERS, zone)).node_id}
            (answer,) = answers
            assert ZONE_OF[answer] == zone
            assert (answer == first) == (zone == first_zone)
        # only the coordinator takes the group's requests (the other zone's answer relays them)
        for node, services in cluster.items():
            assert services.coordinator.coordinator(group).node_id == first
            if node == first:
                assert await services.coordinator.group(group, create=True) is not None
            else:
                with pytest.raises(GroupError) as refused:
                    await services.coordinator.group(group, create=True)
                assert refused.value.code == NOT_COORDINATOR


async def test_first_lookups_from_two_zones_at_once_agree(cluster):
    groups = [f"race-{uuid.uuid4().hex[:6]}" for _ in range(20)]
    asks = [(g, node, zone) for g in groups for node in cluster for zone in "ab"]
    answers = await asyncio.gather(*(find(cluster[node], g, f"zone={zone}") for g, node, zone in asks))
    by_group_zone: dict[tuple[str, str], set[int]] = {}
    for (g, _, zone), answer in zip(asks, answers):
        by_group_zone.setdefault((g, zone), set()).add(answer)
    assert all(len(a) == 1 for a in by_group_zone.values()), by_group_zone
    # and every broker took the same home zone, so names the same coordinator
    for g in groups:
        coordinators = {services.coordinator.coordinator(g).node_id for services in cluster.values()}
        assert len(coordinators) == 1
        (coordinator,) = coordinators
        assert coordinator in {a for (group, _), (a,) in by_group_zone.items() if group == g}


async def test_batched_lookup_and_clients_without_a_zone(cluster):
    answer = await find_coordinator(ctx(cluster[0], 10, 4, "app"), FindCoordinatorV4(key_type=0, coordinator_keys=("x", "y", "z", "")))
    got = [(c.key, c.error_code, c.node_id) for c in answer.coordinators]
    assert got[3] == ("", 24, -1)  # INVALID_GROUP_ID
    # no zone: every live broker is a candidate, as in a cluster without zones
    assert [(k, n) for k, _, n in got[:3]] == [(g, coordinator_for(g, BROKERS).node_id) for g in "xyz"]


async def test_a_cluster_without_zones_records_nothing():
    store = EmbeddedMetadataStore(None)
    await store.start()
    try:
        plain = [BrokerRegistration(n, "127.0.0.1", 9000 + n, None) for n in range(3)]
        for b in plain:
            await store.register_broker(b)
        services = Services(settings=BrokerConfig(node_id=0, port=9000), metadata=store, wal=None, reader=None)  # type: ignore[arg-type]
        for g in ("p", "q", "r"):
            assert await find(services, g, "zone_id=a") == coordinator_for(g, plain).node_id
        assert await store.registry_items("") == []
        brokers, _, _ = await ask_metadata(services, "zone_id=a")
        assert brokers == [0, 1, 2]
    finally:
        await store.close()

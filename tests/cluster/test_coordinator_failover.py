"""Coordinator failover on a three-zone cluster (real etcd and SeaweedFS): a librdkafka group
consumes, its coordinator broker is killed with SIGKILL, the group is taken over by another broker
from the stored state, consumption goes on, and no committed offset is lost. Once per group
protocol: classic (JoinGroup/SyncGroup generations) and KIP-848 (member epochs, server-side
assignments)."""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup

from tests.scenarios.records import LOG, create_topic
from tests.scenarios.test_bad_input import Raw
from tests.scenarios.test_consumer_groups import Ledger, _confluent_member, call, produce, wait_for
from tests.scenarios.test_consumer_protocol_groups import ENV as CONSUMER_PROTOCOL_ENV
from tests.scenarios.test_consumer_protocol_groups import consumer_protocol

pytestmark = pytest.mark.integration

PARTITIONS = 4
PER_PARTITION = 100
DEADLINE = 45.0


def find_coordinator(port: int, group: str) -> int:
    raw = Raw(port)
    try:
        answer = call(raw, FindCoordinatorRequest(key_type=0, coordinator_keys=(group,))).coordinators[0]
    finally:
        raw.close()
    assert answer.error_code == ErrorCode.none, answer
    return answer.node_id


def fetch_offsets(port: int, group: str, expect: ErrorCode = ErrorCode.none) -> dict[tuple[str, int], int]:
    raw = Raw(port)
    try:
        answer = call(raw, OffsetFetchRequest(groups=(OffsetFetchRequestGroup(group_id=group, topics=None),), require_stable=True)).groups[0]
    finally:
        raw.close()
    assert answer.error_code == expect, answer
    return {(t.name, p.partition_index): p.committed_offset for t in answer.topics for p in t.partitions}


def _loaded_classic(event: dict) -> bool:
    return event["generation"] >= 1 and event["members"] == 2


def _loaded_consumer(event: dict) -> bool:
    return event.get("type") == "consumer" and event["epoch"] >= 2 and event["members"] == 2


@pytest.mark.parametrize(
    "configure, env, loaded_from_store",
    [
        pytest.param(lambda config: config, {}, _loaded_classic, id="classic"),
        pytest.param(consumer_protocol, CONSUMER_PROTOCOL_ENV, _loaded_consumer, id="consumer"),
    ],
)
def test_coordinator_failover_keeps_group_and_offsets(cluster_factory, configure, env, loaded_from_store) -> None:
    cluster = cluster_factory(zones=("a", "b", "c"), env={"NEVE_WAL_LINGER_MS": "10", **env, "NEVE_METADATA_LEASE_TTL_S": "2"})
    topic = create_topic(cluster.bootstrap, PARTITIONS)
    produce(cluster.bootstrap, topic, PARTITIONS, PER_PARTITION)
    group = f"g-{uuid.uuid4().hex[:8]}"
    ports = {i: node.port for i, node in enumerate(cluster.nodes)}
    coordinator = find_coordinator(ports[0], group)
    assert all(find_coordinator(port, group) == coordinator for port in ports.values())  # one coordinator, whatever the zone
    for i, port in ports.items():
        if i != coordinator:
            fetch_offsets(port, group, expect=ErrorCode.not_coordinator)

    # a quarter first: less than the records of any two partitions, so a member that joins late
    # still finds records of its own to consume before both pause
    ledger = Ledger(limit=PARTITIONS * PER_PARTITION // 4)
    stops = {name: threading.Event() for name in "ab"}
    threads = [threading.Thread(target=_confluent_member, args=(cluster.bootstrap, topic, group, name, ledger, stops[name], configure), daemon=True) for name in "ab"]
    for t in threads:
        t.start()
    try:
        # both members consume and commit; then they pause (the gate)
        wait_for(
            lambda: ledger.unique >= ledger.limit and ledger.all_committed() and all(ledger.assigned.get(m) and ledger.by_member[m] for m in "ab"),
            DEADLINE,
            lambda: f"both members consuming, then paused with every processed record committed (assigned {ledger.assigned}, per member {dict(ledger.by_member)})",
        )
        before = fetch_offsets(ports[coordinator], group)
        with ledger.lock:
            consumed_upto = {(topic, p): max(o for q, o in ledger.deliveries if q == p) + 1 for p in {q for q, _ in ledger.deliveries}}
        assert before == consumed_upto

        cluster.nodes[coordinator].kill9()
        survivors = {i: port for i, port in ports.items() if i != coordinator}
        any_port = next(iter(survivors.values()))
        wait_for(lambda: find_coordinator(any_port, group) != coordinator, DEADLINE, "the coordinator's lease to expire")
        new_coordinator = find_coordinator(any_port, group)
        assert all(find_coordinator(port, group) == new_coordinator for port in survivors.values())
        assert fetch_offsets(survivors[new_coordinator], group) == before  # nothing committed was lost

        with ledger.lock:
            ledger.limit = PARTITIONS * PER_PARTITION + 1
        wait_for(lambda: ledger.unique == PARTITIONS * PER_PARTITION and ledger.all_committed(), DEADLINE, "every record consumed after the failover")
    finally:
        for name in stops:
            stops[name].set()
        for t in threads:
            t.join(DEADLINE)
    LOG.info("failover: per member %s, lost commits %d", dict(ledger.by_member), ledger.lost_commits)
    ledger.check({(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}, "ab")
    assert fetch_offsets(survivors[new_coordinator], group) == {(topic, p): PER_PARTITION for p in range(PARTITIONS)}
    # The new coordinator took the group over from its stored state (not from scratch).
    loaded = [json.loads(line) for line in cluster.nodes[new_coordinator].log_path.read_text().splitlines() if '"group_loaded"' in line]
    assert any(e["group"] == group and loaded_from_store(e) for e in loaded), loaded

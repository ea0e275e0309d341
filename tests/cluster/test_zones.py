"""Zone alignment on four brokers in two zones (real etcd and SeaweedFS), each broker with its own
metrics port. librdkafka and aiokafka producers and consumers name their zone in client.id, each
client a different spelling, and bootstrap from their zone's brokers. Asserted from the brokers'
own connection metrics: every connection of a zoned client lands on a broker of its zone, and
single-zone groups read everything produced in both zones. A group with members in both zones has
one coordinator, in its home zone; the other zone's members talk to their zone's relay, which
forwards their group requests broker to broker (broker/forwarding.py): no client connection leaves
its zone and none churns. A client whose hint names no zone sees every broker, works, and is
counted as a hint miss."""

from __future__ import annotations

import asyncio
import re
import threading
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, Producer, TopicPartition

from bench.servers import scrape
from tests.cluster.workload import create_topic, file_logger, metadata_brokers
from tests.fixtures import NeveNode, free_port

pytestmark = pytest.mark.integration

ZONES = ("a", "a", "b", "b")
PARTITIONS = 4
COUNT = 200  # records per producer
DEADLINE = 90.0


class ZonedCluster:
    def __init__(self, cluster, artifacts_dir) -> None:
        self.cluster = cluster
        self.metrics_ports: list[int] = []
        for i, zone in enumerate(ZONES):
            port = free_port()
            data_dir = artifacts_dir / f"broker{i}-data"
            env = {
                **cluster.s3.env,
                "NEVE_METADATA_URL": cluster.metadata_url,
                "NEVE_WAL_OBJECT_STORE": cluster.object_store_url,
                "NEVE_BROKER_NODE_ID": str(i),
                "NEVE_BROKER_ZONE": zone,
                "NEVE_BROKER_METRICS_PORT": str(port),
                "NEVE_WAL_LINGER_MS": "20",
                "NEVE_DATA_DIR": str(data_dir),
            }
            node = NeveNode(data_dir=data_dir, log_path=artifacts_dir / f"broker{i}.log", env=env, command="broker")
            cluster.nodes.append(node)  # stopped by cluster_factory's teardown
            self.metrics_ports.append(port)
            node.start()
        cluster.wait_formed()

    def bootstrap(self, zone: str) -> str:
        return ",".join(n.bootstrap for n, z in zip(self.cluster.nodes, ZONES) if z == zone)

    def samples(self, name: str) -> list[tuple[int, dict[str, str], float]]:
        """(broker, labels, value) of every sample of `name` on every broker."""
        out = []
        for broker, port in enumerate(self.metrics_ports):
            for key, value in scrape(f"http://127.0.0.1:{port}/metrics").items():
                metric, _, labels = key.partition("{")
                if metric == name:
                    out.append((broker, dict(re.findall(r'(\w+)="([^"]*)"', labels)), value))
        return out

    def connections(self) -> dict[tuple[int, str], float]:
        """(broker, client zone) -> client connections accepted."""
        return {(b, labels["client_zone"]): v for b, labels, v in self.samples("neve_client_connections_total") if v}


@pytest.fixture
def zoned(cluster_factory, artifacts_dir) -> ZonedCluster:
    return ZonedCluster(cluster_factory(zones=()), artifacts_dir)


def librdkafka_produce(bootstrap: str, client_id: str, topic: str, name: str, log_dir) -> set[bytes]:
    acked: list = []
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "acks": "all", "linger.ms": 5, "logger": file_logger(log_dir / f"librdkafka-{name}.log")})
    for i in range(COUNT):
        producer.produce(topic, value=f"{name}:{i}".encode(), partition=i % PARTITIONS, on_delivery=lambda err, msg: acked.append((err, msg.value())))
    assert producer.flush(DEADLINE) == 0
    assert [err for err, _ in acked if err is not None] == []
    return {value for _, value in acked}


async def aiokafka_produce(bootstrap: str, client_id: str, topic: str, name: str) -> set[bytes]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id=client_id, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        sent = [await producer.send(topic, value=f"{name}:{i}".encode(), partition=i % PARTITIONS) for i in range(COUNT)]
        await asyncio.wait_for(asyncio.gather(*sent), DEADLINE)
    finally:
        await producer.stop()
    return {f"{name}:{i}".encode() for i in range(COUNT)}


class Reader:
    """A group member recording what it read and its current assignment; `run` until `done()`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.values: list[bytes] = []
        self.assigned: set[int] = set()
        self.error: BaseException | None = None

    def librdkafka(self, bootstrap: str, client_id: str, group: str, topic: str, done, log_dir) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap, "client.id": client_id, "group.id": group, "auto.offset.reset": "earliest",
                "enable.auto.commit": True, "auto.commit.interval.ms": 100, "session.timeout.ms": 10_000,
                "partition.assignment.strategy": "roundrobin", "logger": file_logger(log_dir / f"librdkafka-{self.name}.log"),
            }
        )  # fmt: skip
        consumer.subscribe([topic], on_assign=lambda c, ps: self._assign(ps), on_revoke=lambda c, ps: self._revoke(ps))
        try:
            while not done():
                for msg in consumer.consume(100, 0.1):
                    assert msg.error() is None, msg.error()
                    self.values.append(msg.value())
        except BaseException as e:
            self.error = e
        finally:
            consumer.close()

    def _assign(self, partitions) -> None:
        self.assigned = {tp.partition for tp in partitions}

    def _revoke(self, partitions) -> None:
        self.assigned -= {tp.partition for tp in partitions}

    def aiokafka(self, bootstrap: str, client_id: str, group: str, topic: str, done) -> None:
        async def go() -> None:
            consumer = AIOKafkaConsumer(
                topic, bootstrap_servers=bootstrap, client_id=client_id, group_id=group, auto_offset_reset="earliest",
                enable_auto_commit=True, auto_commit_interval_ms=100, session_timeout_ms=10_000, heartbeat_interval_ms=500,
            )  # fmt: skip
            await consumer.start()
            try:
                while not done():
                    batches = await consumer.getmany(timeout_ms=100)
                    self.assigned = {tp.partition for tp in consumer.assignment()}
                    self.values += [m.value for msgs in batches.values() for m in msgs]
            finally:
                await consumer.stop()

        try:
            asyncio.run(go())
        except BaseException as e:
            self.error = e


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {DEADLINE}s waiting for {what}"
        time.sleep(0.1)


def started(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def run_readers(targets, done) -> None:
    threads = [started(t) for t in targets]
    deadline = time.monotonic() + DEADLINE
    while not done() and time.monotonic() < deadline:
        time.sleep(0.1)
    stop(threads)


def stop(threads) -> None:
    stop_at = time.monotonic() + DEADLINE
    for t in threads:
        t.join(max(1.0, stop_at - time.monotonic()))
        assert not t.is_alive(), "a reader did not stop"


def test_zoned_clients_stay_in_their_zone(zoned, artifacts_dir):
    topic = create_topic(zoned.bootstrap("a"), PARTITIONS, prefix="zones")
    a, b = zoned.bootstrap("a"), zoned.bootstrap("b")

    # Metadata of a zoned client names its zone's brokers only.
    assert sorted(metadata_brokers(a, "probe,zone_id=a", log_dir=artifacts_dir)) == [0, 1]
    assert sorted(metadata_brokers(b, "probe;ws_az=b", log_dir=artifacts_dir)) == [2, 3]

    produced = librdkafka_produce(a, "writer-a,zone_id=a", topic, "pa", artifacts_dir)
    produced |= asyncio.run(aiokafka_produce(b, "writer-b&warpstream_az=b", topic, "pb"))
    assert len(produced) == 2 * COUNT

    # One single-zone group per zone, each reading everything produced in both zones.
    ra, rb = Reader("ra"), Reader("rb")
    group_a, group_b = f"ga-{uuid.uuid4().hex[:6]}", f"gb-{uuid.uuid4().hex[:6]}"

    def both_done() -> bool:
        return set(ra.values) >= produced and set(rb.values) >= produced

    run_readers(
        [
            lambda: ra.librdkafka(a, "reader-a zone=a", group_a, topic, both_done, artifacts_dir),
            lambda: rb.aiokafka(b, "reader-b,diskless_az=b", group_b, topic, both_done),
        ],
        both_done,
    )
    assert ra.error is None and rb.error is None, (ra.error, rb.error)
    assert set(ra.values) == produced and set(rb.values) == produced

    # Broker-side: zoned clients connected to their own zone's brokers only.
    landed = zoned.connections()
    for zone in "ab":
        own = [i for i, z in enumerate(ZONES) if z == zone]
        assert sum(v for (broker, cz), v in landed.items() if cz == zone) >= 4, landed
        assert all(broker in own for (broker, cz) in landed if cz == zone), f"zone {zone} clients landed on {landed}"
    crossed = [(s[0], s[1]) for s in zoned.samples("neve_client_bytes_total") if s[2] and s[1]["client_zone"] in "ab" and s[1]["client_zone"] != s[1]["broker_zone"]]
    assert crossed == [], crossed
    for zone in "ab":
        into = sum(v for _, labels, v in zoned.samples("neve_client_bytes_total") if labels == {"direction": "in", "client_zone": zone, "broker_zone": zone})
        assert into > COUNT * len(f"pa:{COUNT}"), f"zone {zone}: {into} bytes in from its clients"


def test_a_group_spanning_two_zones_has_one_coordinator_and_stays_in_zone(zoned, artifacts_dir):
    topic = create_topic(zoned.bootstrap("a"), PARTITIONS, prefix="span")
    a, b = zoned.bootstrap("a"), zoned.bootstrap("b")
    group = f"span-{uuid.uuid4().hex[:6]}"
    members = {"ma": Reader("ma"), "mb": Reader("mb"), "mc": Reader("mc")}
    ma, mb, mc = members.values()
    finished = threading.Event()
    errors = lambda: [m.error for m in members.values() if m.error is not None]  # noqa: E731

    def split() -> bool:
        """Every member holds partitions, none twice, all of them held."""
        held = [m.assigned for m in members.values()]
        return all(held) and sum(map(len, held)) == PARTITIONS and set().union(*held) == set(range(PARTITIONS))

    # The zone-a member looks the group up first, so zone a is its home and its coordinator is
    # there; the zone-b members (librdkafka and aiokafka) reach it through their zone's relay.
    threads = [started(lambda: ma.aiokafka(a, "member-a,zone_id=a", group, topic, finished.is_set))]
    try:
        wait_for(lambda: ma.assigned == set(range(PARTITIONS)) or errors(), "the first member to hold every partition")
        threads.append(started(lambda: mb.librdkafka(b, "member-b,zone_id=b", group, topic, finished.is_set, artifacts_dir)))
        threads.append(started(lambda: mc.aiokafka(b, "member-c;ws_az=b", group, topic, finished.is_set)))
        wait_for(lambda: split() or errors(), "three members to share the partitions")
        held = {name: set(m.assigned) for name, m in members.items()}
        # produced once the split stands, so each record is read once, by its partition's member
        produced = librdkafka_produce(a, "writer,automq_az=a", topic, "pa", artifacts_dir)
        wait_for(lambda: set().union(*(m.values for m in members.values())) >= produced or errors(), "everything produced to be read")
        still = {name: set(m.assigned) for name, m in members.items()}  # before closing, which revokes
    finally:
        finished.set()
        stop(threads)
    assert errors() == []
    assert still == held, "no rebalance after the split"
    read = [v for m in members.values() for v in m.values]
    assert sorted(read) == sorted(produced), "every record read exactly once"
    for name, m in members.items():
        assert {int(v.split(b":")[1]) % PARTITIONS for v in m.values} <= held[name], f"{name} read only its own partitions"

    # Broker-side: every zoned connection in its own zone, a handful per client (no churn); the
    # zone-b members' group requests crossed zones only as one relay's link to one coordinator.
    landed = zoned.connections()
    assert all(ZONES[broker] == cz for (broker, cz) in landed if cz in ("a", "b")), landed
    per_zone = {zone: sum(v for (_, cz), v in landed.items() if cz == zone) for zone in "ab"}
    assert per_zone["b"] <= 2 * 8, f"two zone-b members: {per_zone}"
    assert per_zone["a"] <= 3 * 8, f"a member, a producer and topic setup in zone a: {per_zone}"
    crossed = [(s[0], s[1]) for s in zoned.samples("neve_client_bytes_total") if s[2] and s[1]["client_zone"] in ("a", "b") and s[1]["client_zone"] != s[1]["broker_zone"]]
    assert crossed == [], crossed
    links = {broker: v for (broker, cz), v in landed.items() if cz == "broker"}
    assert len(links) == 1 and sum(links.values()) == 1, f"one relay link, to the coordinator: {links}"
    ((coordinator, _),) = links.items()
    assert ZONES[coordinator] == "a"
    relays = {broker: v for broker, labels, v in zoned.samples("neve_group_forwarded_requests_total") if v and labels["api"] == "JoinGroup"}
    assert len(relays) == 1 and all(ZONES[r] == "b" for r in relays), relays
    assert sum(v for _, _, v in zoned.samples("neve_group_forward_failures_total")) == 0
    print(f"connections accepted by client zone: {per_zone}; relayed requests: {relayed_summary(zoned)}")


def relayed_summary(zoned: ZonedCluster) -> dict[str, tuple[int, int]]:
    """API -> (requests relayed, bytes out and in), over every broker."""
    out: dict[str, list[int]] = {}
    for _, labels, v in zoned.samples("neve_group_forwarded_requests_total"):
        out.setdefault(labels["api"], [0, 0])[0] += int(v)
    for _, labels, v in zoned.samples("neve_group_forwarded_bytes_total"):
        out.setdefault(labels["api"], [0, 0])[1] += int(v)
    return {api: (n, size) for api, (n, size) in out.items() if n}


def test_an_unknown_zone_hint_sees_every_broker_and_is_counted(zoned, artifacts_dir):
    topic = create_topic(zoned.bootstrap("a"), PARTITIONS, prefix="typo")
    client_id = "lost,zone_id=us-nowhere-1"
    assert sorted(metadata_brokers(zoned.bootstrap("b"), client_id, log_dir=artifacts_dir)) == [0, 1, 2, 3]
    assert sum(v for _, _, v in zoned.samples("neve_zone_hint_misses_total")) >= 1
    produced = librdkafka_produce(zoned.bootstrap("b"), client_id, topic, "lost", artifacts_dir)
    consumer = Consumer({"bootstrap.servers": zoned.bootstrap("b"), "client.id": client_id, "group.id": f"g-{uuid.uuid4().hex[:6]}", "logger": file_logger(artifacts_dir / "librdkafka-lost-reader.log")})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        read: set[bytes] = set()
        deadline = time.monotonic() + DEADLINE
        while read != produced:
            assert time.monotonic() < deadline, f"read {len(read)} of {len(produced)}"
            read |= {m.value() for m in consumer.consume(100, 0.2) if m.error() is None}
    finally:
        consumer.close()
    # the miss is logged once for this client id by each broker it asked, not per request
    logged = sum(line.count('"zone_hint_unmatched"') for n in zoned.cluster.nodes for line in n.log_path.read_text().splitlines() if "us-nowhere-1" in line)
    assert 1 <= logged <= len(ZONES)

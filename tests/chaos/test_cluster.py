"""The chaos harness's cluster on real servers: 3 brokers, a 3-member etcd, SeaweedFS, PostgreSQL and 2
compactors, each in a network namespace of its own (the tests run as root). A producer's 100 records are read back
exactly; a partition (broker0's proxies to etcd blackholed, long enough for its lease to lapse), a route cut
(the clients from a broker), a pause and a few seconds of the "slow" schedule are applied and healed; heal() resumes
a paused etcd member and starts a killed broker; the cluster then serves again; and stop() leaves no namespace, veth
or bridge behind."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from chaos import history
from chaos.cluster import ChaosCluster
from chaos.nemesis import NEMESES, Nemesis
from tests.cluster.test_one_copy import consume as read_back

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PARTITIONS = 3
RECORDS = 100


def produce(bootstrap: str, topic: str, base: int) -> dict[tuple[int, int], bytes]:
    acked: dict[tuple[int, int], bytes] = {}
    failures: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 120_000})

    def on_delivery(err, msg) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            acked[(msg.partition(), msg.offset())] = msg.value()

    for i in range(RECORDS):
        producer.produce(topic, value=b"%d" % (base + i), partition=i % PARTITIONS, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(150) == 0
    assert not failures, failures[:3]
    return acked


def consume(bootstrap: str, topic: str, want: int) -> dict[tuple[int, int], bytes]:
    """(partition, offset) -> value of the first `want` records read from offset 0 (tests/cluster's reader)."""
    return {at: record[1] for at, record in read_back(bootstrap, topic, want).items()}


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def leftovers(run: str) -> list[str]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [line for line in (netns + links).splitlines() if run in line]


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_the_cluster_serves_through_faults_and_heals(artifacts_dir):
    recorder = history.Recorder(artifacts_dir / "history.jsonl")
    cluster = ChaosCluster(artifacts_dir / "cluster", recorder=recorder)
    try:
        began = time.monotonic()
        cluster.start()
        print(f"cluster up in {time.monotonic() - began:.1f}s: {cluster.bootstrap}")
        about = cluster.describe()
        assert set(about["nodes"]) == {"etcd0", "etcd1", "etcd2", "s3", "postgres", "broker0", "broker1", "broker2", "compactor0", "compactor1"}
        assert all(n["pid"] and n["netns"] for n in about["nodes"].values()), about["nodes"]
        assert len(about["links"]) == 3 * 4  # each broker to each etcd member and to S3

        topic = f"chaos-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})  # held: a collected client cancels its futures
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)
        acked = produce(cluster.bootstrap, topic, 0)
        assert len(acked) == RECORDS
        assert consume(cluster.bootstrap, topic, RECORDS) == acked

        nemesis = Nemesis(cluster, recorder, "all", random.Random(7))
        # broker0 cut from every etcd member through its proxies, past its lease (5 s): the others stop listing it
        cluster.links[("broker0", "etcd0")].set(blackhole=True)
        for m in (1, 2):
            cluster.links[("broker0", f"etcd{m}")].set(blackhole=True)
        recorder.fault("partition", "start", {"kind": "brokers-etcd", "brokers": ["broker0"]})
        broker1 = cluster.brokers[1]
        deadline = time.monotonic() + 60
        while 0 in cluster.brokers_listed_by(broker1):
            assert time.monotonic() < deadline, "broker0 still listed a minute after it was cut from etcd"
            time.sleep(0.5)
        cluster.clear_links(reset=True)
        recorder.fault("partition", "stop", {"kind": "brokers-etcd", "brokers": ["broker0"]})

        # a route cut: the clients (the root namespace's .1) lose broker1, whose proxies (.2) stay reachable
        value = nemesis.inject("clients-broker")
        cut = cluster.nodes[value["broker"]]
        assert not reachable(cut.host, 9092)
        nemesis.release()
        assert reachable(cut.host, 9092)

        nemesis.inject("pause")
        time.sleep(3)
        nemesis.release()

        # the schedule: a short run of slow links, each fault recorded as a start and a stop
        Nemesis(cluster, recorder, "slow", random.Random(3)).run(time.monotonic() + 8)

        # left for heal(): a paused etcd member and a killed broker
        cluster.nodes["etcd1"].pause()
        cluster.nodes["broker2"].kill9()
        healed = cluster.heal()
        assert all(n.alive() and not n.paused for n in cluster.nodes.values())
        print(f"healed in {healed:.1f}s")
        more = produce(cluster.bootstrap, topic, RECORDS)
        assert consume(cluster.bootstrap, topic, 2 * RECORDS) == {**acked, **more}
    finally:
        cluster.stop()
        recorder.close()
    assert leftovers(cluster.run) == []
    faults = [op for op in history.read(artifacts_dir / "history.jsonl") if op["process"] == history.NEMESIS]
    assert [(op["f"], op["phase"]) for op in faults[:6]] == [("partition", "start"), ("partition", "stop")] * 2 + [("pause", "start"), ("pause", "stop")]
    slow = [op["phase"] for op in faults[6:]]
    assert slow and slow == ["start", "stop"] * (len(slow) // 2) and all(op["f"] == "slow" for op in faults[6:])


def test_every_mix_is_described():
    assert set(NEMESES) == {"none", "kill", "pause", "partition", "slow", "object-store", "etcd", "all"}

"""The per-zone chunk cache on real servers: four brokers in two zones over etcd and SeaweedFS, GETs
counted by SeaweedFS itself (its Prometheus counter SeaweedFS_s3_request_total{type="GET"} for
the bucket), not by neve.

- Every broker reading every record reads each chunk from object storage at most once per zone.
- A consumer tailing the broker that wrote the records costs no GET (the recent objects).
- The owner of half a zone's chunks killed (SIGKILL) mid-read: the read goes on, every batch once
  and exact; the survivor reads each chunk it lost once, and then owns every chunk of the zone.

Fetches are raw Fetch requests to one chosen broker each (no client library picks the broker)."""

from __future__ import annotations

import asyncio
import os
import random
import threading

import pytest

from bench.servers import SeaweedFS as BenchSeaweedFS
from cache.chunks import Member, owner_of
from tests.batches import make_batch
from tests.cluster.workload import create_topic, wait_until
from tests.fixtures import SeaweedFS
from tests.raw import Raw, fetch_v12, produce_v9
from wal.store import load_object_store

pytestmark = pytest.mark.integration

PARTITIONS = 4
REQUESTS = 12
RECORDS = 60  # per partition per produce request, 2 KiB each: about 480 KiB per request, one WAL object each
CHUNK = 128 * 1024
ZONES = ("a", "a", "b", "b")


class CountedSeaweedFS(SeaweedFS):
    """The fixtures' SeaweedFS with its Prometheus port, for its own S3 request counts."""

    PORT_FLAGS = (*SeaweedFS.PORT_FLAGS, "metricsPort")

    def gets(self) -> int:
        return int(BenchSeaweedFS.request_counts(self).get((self.bucket, "GET"), 0))


@pytest.fixture
def counted_s3(artifacts_dir):
    server = CountedSeaweedFS("seaweedfs", artifacts_dir / "seaweedfs").start()
    yield server
    server.stop()


def produce(port: int, topic: str) -> dict[int, list[bytes]]:
    """REQUESTS produce requests to one broker, each a batch of RECORDS incompressible records for
    every partition; the batches as Fetch serves them (base offset and leader epoch 0 injected)."""
    rng = random.Random(23)
    served: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    raw = Raw(port)
    try:
        for i in range(REQUESTS):
            batches = {p: make_batch([(b"k", rng.randbytes(2048), [], 1_700_000_000_000 + i)] * RECORDS) for p in range(PARTITIONS)}
            cid = raw.request(produce_v9(topic, batches))
            answers = raw.response(0, 9, cid).responses[0].partition_responses
            assert [(a.index, a.error_code, a.base_offset) for a in answers] == [(p, 0, i * RECORDS) for p in range(PARTITIONS)]
            for p, b in batches.items():
                served[p].append((i * RECORDS).to_bytes(8, "big") + b[8:12] + (0).to_bytes(4, "big") + b[16:])
    finally:
        raw.close()
    return served


def read_all(port: int, topic: str, on_fetch=None) -> dict[int, list[bytes]]:
    """Every batch of every partition, fetched from the broker on `port` alone, in order."""
    out: dict[int, list[bytes]] = {}
    raw = Raw(port)
    try:
        for p in range(PARTITIONS):
            out[p], offset = [], 0
            while offset < REQUESTS * RECORDS:
                cid = raw.request(fetch_v12(topic, p, offset, max_wait_ms=100))
                answer = raw.response(1, 12, cid).responses[0].partitions[0]
                assert answer.error_code == 0, f"partition {p} offset {offset}: error {answer.error_code}"
                for batch in whole_batches(answer.records or b""):
                    out[p].append(batch)
                    offset = int.from_bytes(batch[:8], "big") + int.from_bytes(batch[23:27], "big") + 1
                if on_fetch is not None:
                    on_fetch()
    finally:
        raw.close()
    return out


def whole_batches(records: bytes) -> list[bytes]:
    found, i = [], 0
    while i + 12 <= len(records):
        end = i + 12 + int.from_bytes(records[i + 8 : i + 12], "big")
        if end > len(records):
            break  # a partial batch at the end of the response
        found.append(records[i:end])
        i = end
    return found


def chunks_of(cluster, env) -> list[tuple[str, int]]:
    """(object key, chunk start) of every chunk of every object the cluster stored."""

    async def listing():
        store = load_object_store(cluster.object_store_url)
        try:
            return [(o.key, o.size) async for o in store.list("")]
        finally:
            await store.close()

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        objects = asyncio.run(listing())
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return [(key, c) for key, size in objects for c in range(0, size, CHUNK)]


def start(cluster_factory, counted_s3, recent_objects: bool):
    env = {"NEVE_CACHE_CHUNK_BYTES": str(CHUNK), "NEVE_WAL_SWEEP_INTERVAL_S": "0", "NEVE_BROKER_RETENTION_CHECK_INTERVAL_MS": "0"}
    if not recent_objects:
        env["NEVE_WAL_RECENT_OBJECTS_BYTES"] = "0"  # every read goes to the chunks
    cluster = cluster_factory(zones=ZONES, env=env, s3=counted_s3)
    topic = create_topic(cluster.bootstrap, PARTITIONS, prefix="zone-cache")
    return cluster, topic


def test_every_broker_reading_everything_reads_each_chunk_once_per_zone(cluster_factory, counted_s3):
    cluster, topic = start(cluster_factory, counted_s3, recent_objects=False)
    produced = produce(cluster.nodes[0].port, topic)
    chunks = chunks_of(cluster, counted_s3.env)
    before = counted_s3.gets()
    for node in cluster.nodes:
        assert read_all(node.port, topic) == produced
    gets = counted_s3.gets() - before
    print(f"{len(chunks)} chunks of {CHUNK} bytes; every record read from {len(cluster.nodes)} brokers in 2 zones: {gets} GETs")
    assert len(chunks) >= REQUESTS * 3  # objects of several chunks each, so owners share them
    assert gets <= 2 * len(chunks)
    again = counted_s3.gets()
    for node in cluster.nodes:  # all held by their owners now
        assert read_all(node.port, topic) == produced
    assert counted_s3.gets() == again


def test_a_consumer_tailing_the_producing_broker_costs_no_get(cluster_factory, counted_s3):
    cluster, topic = start(cluster_factory, counted_s3, recent_objects=True)
    before = counted_s3.gets()
    produced = produce(cluster.nodes[0].port, topic)
    assert read_all(cluster.nodes[0].port, topic) == produced
    assert counted_s3.gets() == before


def test_the_owner_of_hot_chunks_killed_mid_read(cluster_factory, counted_s3):
    cluster, topic = start(cluster_factory, counted_s3, recent_objects=False)
    produced = produce(cluster.nodes[0].port, topic)
    chunks = chunks_of(cluster, counted_s3.env)
    zone_a = [Member(0, "", 0), Member(1, "", 0)]
    lost = [c for c in chunks if owner_of(*c, zone_a).node_id == 1]
    assert 0 < len(lost) < len(chunks)
    before = counted_s3.gets()
    assert read_all(cluster.nodes[0].port, topic) == produced  # broker 1 now holds its share of zone a's chunks
    assert counted_s3.gets() - before <= len(chunks)

    # the same read again, broker 1 killed when it is a third through
    fetches, third = [0], threading.Event()

    def count():
        fetches[0] += 1
        if fetches[0] == 3:
            third.set()
            wait_until(lambda: cluster.nodes[1].process.poll() is not None, timeout=30, what="broker 1 killed")

    killer = threading.Thread(target=lambda: (third.wait(120), cluster.nodes[1].kill9()))
    killer.start()
    before = counted_s3.gets()
    try:
        assert read_all(cluster.nodes[0].port, topic, on_fetch=count) == produced
    finally:
        third.set()
        killer.join()
    regets = counted_s3.gets() - before
    print(f"{len(chunks)} chunks, {len(lost)} owned by the killed broker in its zone; read again after the kill: {regets}")
    assert 0 < regets <= len(lost)  # each lost chunk read again at most once, by the survivor

    # broker 0 owns every chunk of zone a now, and holds them all
    before = counted_s3.gets()
    assert read_all(cluster.nodes[0].port, topic) == produced
    assert counted_s3.gets() - before <= len(lost) - regets  # only lost chunks the read before had passed already

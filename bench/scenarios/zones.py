"""zones: object-store GETs per GiB consumed and client bytes across zones over four `neve broker`s
in two zones (etcd + SeaweedFS), with 1, 2 and 4 consumer groups per zone reading everything from
offset 0; the chunk cache on and, in the same run, off (issue 23: at most one GET per chunk per
zone, zero client bytes across zones for zoned clients).

One zoned producer per zone (its zone in client.id, its zone's brokers as bootstrap) writes half
of the records; the cluster stops. Each step then starts the four brokers afresh over the same
metadata root and objects (no recent object, no chunk in memory), and every group of both zones
reads every record at once; each group's consumers name their zone in client.id. GETs are
SeaweedFS's own count (SeaweedFS_s3_request_total{type="GET"} of the bucket) over the reads;
client bytes are the brokers' neve_client_bytes_total by (client zone, broker zone). Chunks are
counted from the stored objects' sizes and NEVE_CACHE_CHUNK_BYTES, so GETs per chunk per zone is
GETs / (chunks x zones)."""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
import threading
import time
import uuid

from .. import procstat
from ..load import CONSUMER_DEFAULTS, PRODUCER_DEFAULTS, create_topic
from ..options import size, sizes
from ..servers import NEVE_BUCKET
from ..stats import MB, GiB
from ..systems import NeveS3

NAME = "zones"
HELP = "object-store GETs per GiB consumed and client bytes across zones, 2 zones x 2 brokers, 1/2/4 consumer groups per zone, chunk cache on and off"

ZONES = ("a", "a", "b", "b")  # broker i's zone
READ_TIMEOUT_S = 600.0
FORMED_TIMEOUT_S = 60.0


def add_arguments(parser) -> None:
    parser.add_argument("--mib", type=float, default=None, help="MiB of values produced, half in each zone (default 32; --quick 2)")
    parser.add_argument("--record-bytes", type=size, default=1024, help="value size (default 1KiB)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the topic (default 4)")
    parser.add_argument("--groups", type=sizes, default=[1, 2, 4], help="consumer groups per zone, one step each (default 1,2,4)")
    parser.add_argument("--consumers-per-group", type=int, default=2, help="members of each group (default 2)")
    parser.add_argument("--chunk-bytes", type=size, default=None, help="NEVE_CACHE_CHUNK_BYTES (default 4MiB, the broker's; --quick 64KiB)")


class Cluster:
    """Four `neve broker`s (node ids 0-3, zones ZONES) over the run's etcd and SeaweedFS, sharing
    one metadata root and object prefix; started afresh by each `start`."""

    def __init__(self, r, env: dict[str, str]) -> None:
        self.r = r
        self.env = env
        self.root = f"zones-{uuid.uuid4().hex[:8]}"
        self.nodes: list[NeveS3] = []
        self.starts = 0

    def start(self, env: dict[str, str]) -> None:
        self.starts += 1
        self.nodes = []
        for i, zone in enumerate(ZONES):
            name = f"broker{i}-{self.starts}"
            node = NeveS3(self.r.work_dir / name, self.r.out_dir / f"{name}.log", {**self.env, **env, "NEVE_BROKER_NODE_ID": str(i), "NEVE_BROKER_ZONE": zone}, self.r.servers)
            node.root = self.root  # one cluster: the same etcd root and S3 prefix for every broker
            self.nodes.append(node)
            node.start()
        self._wait_formed()

    def _wait_formed(self) -> None:
        """Until every broker lists all four (it learns of the others through etcd's watch)."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + FORMED_TIMEOUT_S
        for node in self.nodes:
            admin = AdminClient({"bootstrap.servers": node.bootstrap, "log_level": 3})
            while sorted(admin.list_topics(timeout=10).brokers) != list(range(len(ZONES))):
                node.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"broker {node.bootstrap} does not list all {len(ZONES)} brokers after {FORMED_TIMEOUT_S:g} s")
                time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes:
            self.r.stop_system(node)

    def bootstrap(self, zone: str) -> str:
        return ",".join(n.bootstrap for n, z in zip(self.nodes, ZONES, strict=True) if z == zone)

    def check_alive(self) -> None:
        for node in self.nodes:
            node.check_alive()

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """(labels, value) of every sample of the counter `name` on every broker."""
        out = []
        for node in self.nodes:
            for key, value in node.metrics().items():
                metric, _, labels = key.partition("{")
                if metric == name:
                    out.append((dict(re.findall(r'(\w+)="([^"]*)"', labels)), value))
        return out

    def counters(self) -> dict:
        """The brokers' counters the scenario reports, summed over brokers."""
        client: dict[str, float] = {}
        for labels, value in self.samples("neve_client_bytes_total"):
            key = f"{labels['direction']} {labels['client_zone']}->{labels['broker_zone']}"
            client[key] = client.get(key, 0.0) + value
        lookups: dict[str, float] = {}
        for labels, value in self.samples("neve_cache_lookups_total"):
            key = f"{labels['layer']} {labels['result']}"
            lookups[key] = lookups.get(key, 0.0) + value
        peer = sum(v for labels, v in self.samples("neve_cache_peer_bytes_total") if labels.get("direction") == "received")
        gets = sum(v for _, v in self.samples("neve_object_gets_total"))
        get_bytes = sum(v for _, v in self.samples("neve_object_get_bytes_total"))
        direct = sum(v for _, v in self.samples("neve_cache_direct_reads_total"))
        return {"client_bytes": client, "cache_lookups": lookups, "peer_bytes_received": peer, "neve_object_gets": gets, "neve_object_get_bytes": get_bytes, "direct_reads": direct}

    def stored_sizes(self) -> list[int]:
        """The size of every object under the cluster's prefix."""
        from wal.s3 import S3ObjectStore

        s3 = self.r.servers.s3()
        os.environ.update(s3.env)  # obstore reads the credentials from the environment

        async def listing() -> list[int]:
            store = S3ObjectStore(NEVE_BUCKET, self.root, endpoint=s3.endpoint)
            try:
                return [o.size async for o in store.list()]
            finally:
                await store.close()

        return asyncio.run(listing())


def run(r) -> None:
    a = r.args
    mib = a.mib if a.mib is not None else (2.0 if r.quick else 32.0)
    chunk = a.chunk_bytes if a.chunk_bytes is not None else (64 * 1024 if r.quick else 4 * 2**20)
    base_env = {
        **r._broker_env(),
        "NEVE_CACHE_CHUNK_BYTES": str(chunk),
        # nothing but the consumers' fetches reads or rewrites objects during a step
        "NEVE_WAL_SWEEP_INTERVAL_S": "0",
        "NEVE_BROKER_RETENTION_CHECK_INTERVAL_MS": "0",
        "NEVE_COMPACTOR_IN_NODE": "false",
    }
    cluster = Cluster(r, base_env)
    try:
        r.progress.begin("produce")
        cluster.start({"NEVE_CACHE_ENABLED": "true"})
        topic = create_topic(cluster.bootstrap("a"), a.partitions, "zones")
        count = max(2 * a.partitions, int(mib * 2**20 / a.record_bytes))
        before = cluster.counters()["client_bytes"]
        produced = {zone: _produce(r, cluster.bootstrap(zone), f"zones-producer,zone_id={zone}", topic, a.partitions, a.record_bytes, count // 2 + (count % 2 if zone == "a" else 0), zone) for zone in ("a", "b")}
        produce_cross = _cross_zone(_delta(before, cluster.counters()["client_bytes"]))
        cluster.stop()
        records = sum(produced.values())
        value_bytes = records * a.record_bytes
        stored = cluster.stored_sizes()
        chunks = sum(math.ceil(s / chunk) for s in stored)
        r.progress.line(f"{records:,} records, {value_bytes / MB:.1f} MB in {len(stored)} objects of {sum(stored) / MB:.1f} MB: {chunks} chunks of {chunk:,} bytes; {produce_cross:,.0f} client bytes across zones")

        steps = []
        for cache in (True, False):
            for groups in a.groups:
                label = f"cache-{'on' if cache else 'off'}-{groups}-groups"
                r.progress.begin(label)
                cluster.start({"NEVE_CACHE_ENABLED": "true" if cache else "false"})
                step = _read_step(r, cluster, topic, records, groups, a.consumers_per_group, a.partitions)
                cluster.stop()
                step.update(cache=cache, groups_per_zone=groups)
                step["gets_per_gib_consumed"] = round(step["gets"] / (step["consumed_bytes"] / GiB), 2) if step["consumed_bytes"] else None
                step["gets_per_chunk_per_zone"] = round(step["gets"] / (chunks * 2), 3) if chunks else None
                steps.append(step)
                r.progress.line(
                    f"measured: {step['gets']:.0f} GETs for {step['consumed_bytes'] / MB:.1f} MB consumed: {step['gets_per_gib_consumed']} per GiB, "
                    f"{step['gets_per_chunk_per_zone']} per chunk per zone; {step['cross_zone_client_bytes']:,.0f} client bytes across zones"
                )
                if step["groups_complete"] != 2 * groups:
                    r.fail(f"{label}: {step['groups_complete']} of {2 * groups} groups read all {records:,} records ({step['error']})")
    finally:
        cluster.stop()

    r.derived["zones"] = {
        "records": records,
        "record_bytes": a.record_bytes,
        "produced_value_bytes": value_bytes,
        "produced_per_zone": produced,
        "produce_cross_zone_client_bytes": produce_cross,
        "partitions": a.partitions,
        "objects": len(stored),
        "object_bytes": sum(stored),
        "chunk_bytes": chunk,
        "chunks": chunks,
        "zones": sorted(set(ZONES)),
        "brokers": len(ZONES),
        "consumers_per_group": a.consumers_per_group,
        "steps": steps,
    }
    rows = [
        [
            "on" if s["cache"] else "off", str(s["groups_per_zone"]), f"{s['consumed_bytes'] / MB:.1f}", f"{s['gets']:.0f}", str(s["gets_per_gib_consumed"]),
            str(s["gets_per_chunk_per_zone"]), f"{s['cross_zone_client_bytes']:.0f}", f"{s['peer_bytes_received'] / MB:.1f}", f"{s['seconds']}",
        ]
        for s in steps
    ]  # fmt: skip
    r.derived.setdefault("tables", {})["Object-store GETs and client bytes across zones, 2 zones x 2 brokers"] = {
        "headers": ["cache", "groups per zone", "MB consumed", "GETs (SeaweedFS)", "GETs per GiB consumed", "GETs per chunk per zone", "client bytes across zones", "MB from peers", "read s"],
        "rows": rows,
    }
    for s in steps:
        if s["cache"]:
            r.target(f"object-store GETs per chunk per zone, cache on, {s['groups_per_zone']} group(s) per zone", "<= 1", s["gets_per_chunk_per_zone"], s["gets_per_chunk_per_zone"] is not None and s["gets_per_chunk_per_zone"] <= 1)
    cross = sum(s["cross_zone_client_bytes"] for s in steps) + produce_cross
    r.target("client bytes across zones, zoned clients (every step, producers included)", "0", cross, cross == 0)
    r.notes.append(
        f"{records:,} records of {a.record_bytes} B ({value_bytes / MB:.1f} MB of values) in {a.partitions} partitions, half produced in each zone by a zoned producer; "
        f"{len(stored)} objects, {chunks} chunks of {chunk:,} bytes. Each step starts the four brokers afresh and reads with {a.consumers_per_group} consumer(s) per group, "
        "every group reading every record from offset 0. GETs are SeaweedFS's own count over the step's reads; MB consumed counts each group's records once "
        "(a record read again after a rebalance is not counted). Client bytes across zones are neve_client_bytes_total (both directions) where a zoned client's zone differs from the broker's."
    )


def _produce(r, bootstrap: str, client_id: str, topic: str, partitions: int, record_bytes: int, count: int, zone: str) -> int:
    """`count` incompressible values round robin over the partitions from one zoned producer; how
    many were acknowledged (every one, or the run fails)."""
    from confluent_kafka import Producer

    rng = random.Random(zone)
    pool = [rng.randbytes(record_bytes) for _ in range(64)]
    acked, failed = [0], []

    def delivered(err, _msg) -> None:
        if err is None:
            acked[0] += 1
        else:
            failed.append(str(err))

    producer = Producer({**PRODUCER_DEFAULTS, **dict(r.args.producer_config), "bootstrap.servers": bootstrap, "client.id": client_id, "log_level": 3})
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=pool[i % len(pool)], partition=i % partitions, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(120)
    if left or failed or acked[0] != count:
        r.fail(f"{client_id}: {acked[0]} of {count} acknowledged, {left} left in the queue, errors {failed[:3]}")
    return acked[0]


class Group:
    """What one consumer group has read: each (partition, offset) once, and its values' bytes."""

    def __init__(self, zone: str, index: int) -> None:
        self.zone = zone
        self.id = f"zones-{zone}{index}-{uuid.uuid4().hex[:6]}"
        self.seen: set[tuple[int, int]] = set()
        self.bytes = 0
        self.reads = 0  # records delivered, repeats included
        self.lock = threading.Lock()

    def add(self, batch) -> None:
        with self.lock:
            for msg in batch:
                self.reads += 1
                key = (msg.partition(), msg.offset())
                if key not in self.seen:
                    self.seen.add(key)
                    self.bytes += len(msg.value())


def _read_step(r, cluster: Cluster, topic: str, records: int, groups: int, members: int, partitions: int) -> dict:
    """Every group of both zones reading every record at once; GETs and client bytes over it."""
    from confluent_kafka import Consumer

    all_groups = [Group(zone, g) for zone in ("a", "b") for g in range(groups)]
    stop = threading.Event()
    errors: list[str] = []

    def member(group: Group, m: int) -> None:
        config = {
            **CONSUMER_DEFAULTS, **dict(r.args.consumer_config),
            "bootstrap.servers": cluster.bootstrap(group.zone), "client.id": f"{group.id}-{m},zone_id={group.zone}", "group.id": group.id,
            "auto.offset.reset": "earliest", "enable.auto.commit": True, "auto.commit.interval.ms": 200, "session.timeout.ms": 10_000,
            "partition.assignment.strategy": "roundrobin", "enable.partition.eof": False,
        }  # fmt: skip
        consumer = Consumer(config)
        try:
            consumer.subscribe([topic])
            while not stop.is_set():
                batch = consumer.consume(1000, 0.1)
                bad = [msg.error() for msg in batch if msg.error() is not None]
                if bad:
                    errors.append(str(bad[0]))
                group.add([msg for msg in batch if msg.error() is None])
        except Exception as e:  # noqa: BLE001 - reported, the step fails on it
            errors.append(f"{type(e).__name__}: {e}")
        finally:
            consumer.close()

    gets0 = _gets(r)
    counters0 = cluster.counters()
    t0, cpu0 = time.monotonic(), _cpu(cluster)
    threads = [threading.Thread(target=member, args=(g, m), daemon=True, name=f"zones-{g.id}-{m}") for g in all_groups for m in range(members)]
    for t in threads:
        t.start()
    deadline = t0 + READ_TIMEOUT_S
    last = t0
    while not all(len(g.seen) >= records for g in all_groups) and not errors:
        cluster.check_alive()
        if time.monotonic() > deadline:
            errors.append(f"timed out after {READ_TIMEOUT_S:g} s")
            break
        time.sleep(0.05)
        if time.monotonic() - last >= 1.0:
            last = time.monotonic()
            r.progress.line(f"read {sum(len(g.seen) for g in all_groups):>10,} of {records * len(all_groups):,} ({len(all_groups)} groups)")
    seconds = time.monotonic() - t0
    stop.set()
    for t in threads:
        t.join(60)
    cpu1 = _cpu(cluster)
    counters1 = cluster.counters()
    client = _delta(counters0["client_bytes"], counters1["client_bytes"])
    lookups = _delta(counters0["cache_lookups"], counters1["cache_lookups"])
    return {
        "groups": len(all_groups),
        "groups_complete": sum(len(g.seen) == records for g in all_groups),
        "consumed_records": sum(len(g.seen) for g in all_groups),
        "records_read_again": sum(g.reads - len(g.seen) for g in all_groups),
        "consumed_bytes": sum(g.bytes for g in all_groups),
        "gets": _gets(r) - gets0,
        "neve_object_gets": counters1["neve_object_gets"] - counters0["neve_object_gets"],
        "neve_object_get_bytes": counters1["neve_object_get_bytes"] - counters0["neve_object_get_bytes"],
        "direct_reads": counters1["direct_reads"] - counters0["direct_reads"],
        "cache_lookups": lookups,
        "peer_bytes_received": counters1["peer_bytes_received"] - counters0["peer_bytes_received"],
        "client_bytes": client,
        "cross_zone_client_bytes": _cross_zone(client),
        "seconds": round(seconds, 2),
        "broker_cpu_s": None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 2),
        "load_average": procstat.load_average(),
        "error": errors[0] if errors else None,
    }


def _gets(r) -> float:
    return r.servers.s3().request_counts().get((NEVE_BUCKET, "GET"), 0.0)


def _cpu(cluster: Cluster) -> float | None:
    cpu = [n.cpu_seconds() for n in cluster.nodes]
    return None if any(c is None for c in cpu) else sum(cpu)


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in sorted(after.items()) if v - before.get(k, 0.0)}


def _cross_zone(client_bytes: dict[str, float]) -> float:
    """Bytes of zoned clients (a client zone that is a broker zone) on brokers of another zone."""
    zones = set(ZONES)
    total = 0.0
    for key, value in client_bytes.items():
        client_zone, broker_zone = key.split(" ", 1)[1].split("->")
        if client_zone in zones and client_zone != broker_zone:
            total += value
    return total

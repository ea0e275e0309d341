"""etcd's limits and the orphan sweeper, against the real servers.

A WAL object that touches 500 partitions commits in full against an etcd with default limits (128
operations per transaction, 1.5 MiB per request), and another store sees every index entry. The
orphan sweeper deletes a WAL object that was uploaded but never committed once it is older than
the grace period, and never an object that the index references, while three brokers keep
producing and sweeping."""

from __future__ import annotations

import time
import uuid

import aetcd
import pytest

from metadata.model import Append, AppendResult, IndexEntry, ObjectCommit, ObjectType
from tests.cluster.workload import ProducerSpec, check_log, create_topic, read_everywhere, s3_client, start_producers, wait_until
from tests.metadata.helpers import open_etcd_store

WIDE = 500
ETCD_MAX_TXN_OPS = 128  # etcd's default --max-txn-ops


@pytest.mark.integration
async def test_commit_touching_500_partitions(etcd_server):
    root = f"wide-{uuid.uuid4().hex[:10]}"
    store = await open_etcd_store(etcd_server, root)
    other = None
    try:
        # The etcd really has its default limits: one transaction of more than 128 operations fails.
        async with aetcd.Client(host="127.0.0.1", port=etcd_server.ports["client"]) as client:
            tx = client.transactions
            with pytest.raises(Exception, match="too many operations"):
                await client.transaction(compare=[], success=[tx.put(f"/{root}/probe/{i}".encode(), b"x") for i in range(ETCD_MAX_TXN_OPS + 1)], failure=[])

        info = await store.create_topic("wide", WIDE)
        pid, epoch = await store.init_producer_id()
        counts = [1 + p % 7 for p in range(WIDE)]

        def wide_object(key: str, sequences: list[int]) -> ObjectCommit:
            appends = tuple(
                Append(info.topic_id, p, start=p * 1000, size=1000, record_count=counts[p], max_timestamp=1_700_000_000_000 + p, producer_id=pid, producer_epoch=epoch, base_sequence=sequences[p])
                for p in range(WIDE)
            )
            return ObjectCommit(key, WIDE * 1000, appends)

        first = await store.commit(wide_object("wal/wide-1.wal", [0] * WIDE))
        assert first == [AppendResult(0, 0, 0)] * WIDE

        # The same batches again (a retried object): duplicates, answered with the original offsets.
        again = await store.commit(wide_object("wal/wide-2.wal", [0] * WIDE))
        assert [(r.error_code, r.base_offset, r.duplicate) for r in again] == [(0, 0, True)] * WIDE
        # The next batches of the producer: appended after the first ones.
        second = await store.commit(wide_object("wal/wide-3.wal", counts))
        assert second == [AppendResult(0, counts[p], 0) for p in range(WIDE)]

        other = await open_etcd_store(etcd_server, root)
        assert other.topics()["wide"] == info
        for p in range(WIDE):
            want = [
                IndexEntry(0, counts[p] - 1, "wal/wide-1.wal", ObjectType.WAL, p * 1000, 1000, 1_700_000_000_000 + p),
                IndexEntry(counts[p], 2 * counts[p] - 1, "wal/wide-3.wal", ObjectType.WAL, p * 1000, 1000, 1_700_000_000_000 + p),
            ]
            assert other.entries(info.topic_id, p, 0) == want, f"partition {p}"
            assert other.high_watermark(info.topic_id, p) == 2 * counts[p]
        assert other.referenced_objects() == {"wal/wide-1.wal", "wal/wide-3.wal"}
    finally:
        for s in (store, other):
            if s is not None:
                await s.close()


# -- the orphan sweeper ---------------------------------------------------------------------------

# Sweepers fence an object off before deleting it, and brokers commit nothing uploaded more than
# GRACE_S / 2 ago. At 2 s, before the fence, a fresh-clone run had a sweeper delete three committed
# objects whose commits waited behind earlier ones; 6 s keeps commits on their way out of reach of
# the fence too (a fenced commit would fail and its records be retried).
GRACE_S = 6
SWEEP_INTERVAL_S = 1
SWEEP_ENV = {"NEVE_WAL_ORPHAN_GRACE_S": str(GRACE_S), "NEVE_WAL_SWEEP_INTERVAL_S": str(SWEEP_INTERVAL_S)}
ZONES = ("a", "b", "c")
PARTITIONS = 3
COUNT = 18_000
RATE = 600  # records/s per producer: production lasts about 30 s, through two orphans' lives and many sweeps
SWEPT_WITHIN = GRACE_S + 3 * SWEEP_INTERVAL_S + 5  # generous: three brokers sweep every second
S3_LIST_GRANULARITY = 1.0  # S3 LastModified has whole seconds: an object may look up to 1 s older


def wal_objects(s3, cluster) -> set[str]:
    """Keys under the cluster's prefix, relative to it (wal/...)."""
    keys = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=cluster.s3.bucket, Prefix=f"{cluster.prefix}/wal/"):
        keys.update(item["Key"].removeprefix(f"{cluster.prefix}/") for item in page.get("Contents", ()))
    return keys


def referenced(cluster) -> set[str]:
    """Every object the offset index references, read by a store of our own."""
    import asyncio

    async def read() -> set[str]:
        store = await open_etcd_store(cluster.etcd, cluster.root)
        try:
            return store.referenced_objects()
        finally:
            await store.close()

    return asyncio.run(read())


def orphan_swept(s3, cluster, name: str) -> float:
    """Put a WAL object that no commit will ever reference; wait for a sweeper to delete it and
    return how long it lived."""
    key = f"wal/{int(time.time() * 1000):013d}-99-{name}.wal"
    s3.put_object(Bucket=cluster.s3.bucket, Key=f"{cluster.prefix}/{key}", Body=b"never committed " + name.encode())
    put_at = time.monotonic()
    assert key in wal_objects(s3, cluster)
    lived = wait_until(lambda: key not in wal_objects(s3, cluster), timeout=SWEPT_WITHIN, what=f"orphan {key} to be swept", interval=0.1)
    assert time.monotonic() - put_at >= GRACE_S - S3_LIST_GRANULARITY, f"orphan {key} deleted {lived:.1f}s after its upload, inside the {GRACE_S}s grace period"
    return lived


@pytest.mark.integration
def test_orphans_swept_committed_objects_kept(cluster_factory, artifacts_dir):
    cluster = cluster_factory(zones=ZONES, env=SWEEP_ENV)
    s3 = s3_client(cluster)
    topic = create_topic(cluster.bootstrap, PARTITIONS)
    specs = [ProducerSpec(f"p{zone}", zone, idempotent=True) for zone in ZONES]
    producers = start_producers(specs, cluster.bootstrap, topic, COUNT, PARTITIONS, artifacts_dir, rate=RATE)
    wait_until(lambda: all(len(p.acks) >= RATE for p in producers), timeout=30, what="a second of acknowledged production")

    # While the brokers produce (and commit new objects) and sweep every second: two orphans, one
    # after the other, each deleted after the grace period.
    lives = [orphan_swept(s3, cluster, "orphan-1"), orphan_swept(s3, cluster, "orphan-2")]
    assert all(p.sent < COUNT for p in producers), "production ended before the sweeps it should overlap"
    for p in producers:
        p.join(timeout=60)
        assert not p.failures and not p.fatal_errors and len(p.acks) == COUNT
    # One more, put after the last commit: its deletion proves a sweep ran when every committed
    # object was past the grace period.
    lives.append(orphan_swept(s3, cluster, "orphan-3"))
    deletions = sum(n.log_path.read_text().count('"wal_orphans_deleted"') for n in cluster.nodes)
    assert deletions >= 3, f"{deletions} wal_orphans_deleted log lines for 3 orphans"  # two brokers may both delete one

    # Exactly the committed objects remain: none deleted, no orphan left behind.
    refs = referenced(cluster)
    assert refs, "nothing committed"
    assert wal_objects(s3, cluster) == refs
    log = read_everywhere({i: (n, ZONES[i]) for i, n in enumerate(cluster.nodes)}, topic, PARTITIONS, artifacts_dir)
    result = check_log(log, producers)
    assert result.records == len(specs) * COUNT
    print(f"orphans lived {[round(x, 1) for x in lives]}s (grace {GRACE_S}s, sweep every {SWEEP_INTERVAL_S}s); {len(refs)} committed objects kept")

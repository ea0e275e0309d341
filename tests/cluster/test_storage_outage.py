"""The object store or the metadata store goes away during production and comes back.

(a) SeaweedFS stopped for 13 s: producers see retriable errors or delays and no fatal error; a
record acknowledged while S3 is down lives in an object S3 stored before it went down (an upload
in flight at the stop may still complete while SeaweedFS shuts down; its commit may wait, in
upload-start order, for an earlier upload that is failing); each broker's memory stays under a bound derived from its
WAL buffer (backpressure, not growth); after S3 returns (same ports, same data dir) production
resumes without restarting anything and everything acknowledged is readable from every broker.
(b) etcd stopped and started again (same ports, same data dir): the same guarantees, and no
record is acknowledged while etcd is down (a commit needs it).

Each test stops a server of its own (private_seaweedfs / private_etcd); the other server is the
worker's shared one."""

from __future__ import annotations

import time

import pytest

from tests.cluster.workload import RssMonitor, check_log, create_topic, metadata_brokers, objects_holding, read_everywhere, rss_bytes, s3_client, six_producers, start_producers, wait_until

PARTITIONS = 3
ZONES = ("a", "b", "c")
MiB = 1024 * 1024
BUFFER_BYTES = 16 * MiB
RECENT_BYTES = 4 * MiB
# While a store is down a broker holds at most BUFFER_BYTES of produced chunks (then it stops reading
# produce requests). Each held byte may be alive up to four times: in its decoded request, as a chunk,
# inside an encoded WAL object and in the object-store client's copy of it while uploading. Plus the
# recent-objects cache and a fixed 32 MiB for the runtime (gRPC and object-store client threads,
# allocator arenas, one request frame read ahead per connection). Measured with etcd down, where
# failed commits release the buffer at once and the broker churns through uploads, the growth
# plateaus at about 50-80 MiB whatever the offered load; a broker that took in everything offered
# during the outage (over 3 x BUFFER_BYTES, asserted) would hold it at least twice and exceed it.
GROWTH_BOUND = 4 * BUFFER_BYTES + RECENT_BYTES + 32 * MiB
VALUE_BYTES = 16 * 1024
RATE = 150  # records/s per producer while the store is down; two producers per broker offer
# ~4.7 MiB/s to each broker, so an outage of 13 s offers each broker about 61 MiB, well over 3 x its
# buffer (at 10 s the 47 MiB offered sat right at the 48 MiB asserted, and a fresh-clone run fell
# 0.2 MiB short)
CALM_RATE = 30  # records/s per producer before and after the outage: 2.8 MiB/s in all, well below
# what a slow machine stores (at RATE throughout, 14 MiB/s, a machine whose SeaweedFS took 21-42
# MB/s of PUTs never finished the warm-up, and the outage's backlog never drained in time)
CLIENT = {"linger.ms": 50}  # fewer, larger batches: fewer index entries to read back
WARMUP_ACKS = 60  # per producer, before the store stops
OUTAGE_S = 13.0
AFTER_S = 2.0  # production after the store is back and every producer has been acknowledged again
DRAIN_S = 300.0  # the outage's backlog (~180 MiB) delivered within this (message.timeout.ms too)
ACK_MARGIN_S = 2.0  # acks this long after the stop may still be for objects stored before it
ENV = {
    "NEVE_WAL_BUFFER_BYTES": str(BUFFER_BYTES),
    "NEVE_WAL_RECENT_OBJECTS_BYTES": str(RECENT_BYTES),
}


def produce_through_outage(cluster, artifacts_dir, stop_store, start_store, what: str) -> tuple[str, float, dict[tuple[int, int], float]]:
    """Returns the topic, the wall-clock time the store had stopped (its process had exited),
    and the ack time (monotonic) of every record acknowledged while it was down, by (partition,
    offset)."""
    topic = create_topic(cluster.bootstrap, PARTITIONS)
    producers = start_producers(
        six_producers(), cluster.bootstrap, topic, count=RATE * 120, partitions=PARTITIONS, log_dir=artifacts_dir, rate=CALM_RATE, value_bytes=VALUE_BYTES, config=CLIENT, flush_timeout=DRAIN_S
    )
    pids = [n.process.pid for n in cluster.nodes]
    try:
        wait_until(lambda: all(len(p.acks) >= WARMUP_ACKS for p in producers), timeout=120, what="warm-up acknowledgements")
        baseline = [rss_bytes(n) for n in cluster.nodes]
        monitor = RssMonitor(cluster.nodes).start()

        for p in producers:
            p.rate = RATE
        stop_store()
        stopped_wall = time.time()
        down_at = time.monotonic()
        sent_at_stop = sum(p.sent for p in producers)
        time.sleep(OUTAGE_S)  # the outage itself: a duration, not an event
        acked_while_down = {p.acks[seq]: t for p in producers for seq, t in list(p.acked_at.items()) if down_at + ACK_MARGIN_S < t}
        start_store()
        up_at = time.monotonic()
        offered_while_down = (sum(p.sent for p in producers) - sent_at_stop) * VALUE_BYTES // len(cluster.nodes)
        for p in producers:
            p.rate = CALM_RATE

        resumed_after = wait_until(lambda: all(max(p.last_ack_at.values()) > up_at for p in producers), timeout=120, what=f"every producer acknowledged again after {what} returned")
        time.sleep(AFTER_S)  # keep producing for a while with the store back
        for p in producers:
            p.stop_sending()
        for p in producers:
            p.join(timeout=DRAIN_S + 30)
        peaks = monitor.stop()
    finally:
        for p in producers:
            p.stop_sending()

    wait_until(lambda: set(metadata_brokers(cluster.bootstrap, timeout=30, log_dir=artifacts_dir)) == {0, 1, 2}, timeout=60, what="Metadata to list the three brokers")
    assert [n.process.pid for n in cluster.nodes] == pids and all(n.process.poll() is None for n in cluster.nodes), "a broker restarted or died"
    for p in producers:
        assert not p.fatal_errors, f"{p.spec.name}: fatal errors {p.fatal_errors}"
        assert not p.failures, f"{p.spec.name}: {len(p.failures)} delivery failures, first {next(iter(p.failures.items()))}"
        assert len(p.acks) == p.sent
        assert any(seq_t > up_at for seq_t in p.acked_at.values())
    growth = [peak - base for peak, base in zip(peaks, baseline, strict=True)]
    print(
        f"{what} outage: resumed {resumed_after:.1f}s after it returned; sent {[p.sent for p in producers]}; "
        f"client errors {sum(len(p.client_errors) for p in producers)}; offered per broker while down ~{offered_while_down // MiB} MiB; RSS baseline {[b // MiB for b in baseline]} MiB, "
        f"peak growth {[g // MiB for g in growth]} MiB (bound {GROWTH_BOUND // MiB} MiB)"
    )
    assert offered_while_down > 3 * BUFFER_BYTES, f"only {offered_while_down / MiB:.0f} MiB offered per broker during the outage: backpressure not exercised"
    for i, g in enumerate(growth):
        assert g <= GROWTH_BOUND, f"broker {i}: RSS grew {g / MiB:.0f} MiB over its {baseline[i] / MiB:.0f} MiB baseline (bound {GROWTH_BOUND / MiB:.0f} MiB)"

    log = read_everywhere({i: (n, ZONES[i]) for i, n in enumerate(cluster.nodes)}, topic, PARTITIONS, artifacts_dir)
    result = check_log(log, producers, exact=lambda p: p.spec.idempotent, ordered=lambda p: p.spec.idempotent)
    print(f"{what} outage: {result.records} records; duplicates {result.duplicates}; stored but unacknowledged {result.unacked_present}")
    assert result.records == sum(p.sent for p in producers) + sum(result.duplicates.values())
    return topic, stopped_wall, acked_while_down


@pytest.mark.integration
def test_s3_outage(cluster_factory, private_seaweedfs, artifacts_dir):
    cluster = cluster_factory(zones=ZONES, env=ENV, s3=private_seaweedfs)
    topic, stopped_wall, acked_while_down = produce_through_outage(cluster, artifacts_dir, private_seaweedfs.stop, private_seaweedfs.start, "S3")
    # Whatever was acknowledged during the outage had been stored before it: the object holding each
    # such record was last modified before SeaweedFS had stopped. That can be after the stop began:
    # SeaweedFS finishes a PUT in flight while it shuts down (S3 times are whole seconds, rounded down).
    holders = objects_holding(cluster.metadata_url, topic, set(acked_while_down))
    s3 = s3_client(cluster)
    for key in set(holders.values()):
        stored = s3.head_object(Bucket=cluster.s3.bucket, Key=f"{cluster.prefix}/{key}")["LastModified"].timestamp()
        assert stored <= stopped_wall, f"{key} stored {stored - stopped_wall:.1f}s after S3 had stopped, yet records in it were acknowledged during the outage"
    print(f"S3 outage: {len(acked_while_down)} records in {len(set(holders.values()))} objects stored before it were acknowledged during it")


@pytest.mark.integration
def test_etcd_restart(cluster_factory, private_etcd, artifacts_dir):
    cluster = cluster_factory(zones=ZONES, env=ENV, etcd=private_etcd)
    _, _, acked_while_down = produce_through_outage(cluster, artifacts_dir, private_etcd.stop, private_etcd.start, "etcd")
    assert acked_while_down == {}, f"records acknowledged while etcd was down: {sorted(acked_while_down)[:10]}"

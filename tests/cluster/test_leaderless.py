"""Three brokers, one per zone, over one etcd and one SeaweedFS; six librdkafka producers (two per
zone, one idempotent and one not) write 20,000 records each to the same 3 partitions at once, so
every broker receives produce requests for every partition at the same time. Every broker then
serves the same log: each acknowledged record exactly once at its acknowledged offset, offsets
gap-free, each producer's records in order within a partition."""

from __future__ import annotations

import pytest

from tests.cluster.workload import check_log, create_topic, finish, metadata_brokers, read_everywhere, six_producers, start_producers, writers_by_partition

PARTITIONS = 3
COUNT = 20_000
ZONES = ("a", "b", "c")


@pytest.mark.integration
def test_six_producers_through_three_brokers(cluster_factory, artifacts_dir):
    cluster = cluster_factory(zones=ZONES)
    node_of_zone = {zone: i for i, zone in enumerate(ZONES)}

    # A client without a zone sees every live broker.
    assert metadata_brokers(cluster.bootstrap) == {i: n.bootstrap for i, n in enumerate(cluster.nodes)}

    topic = create_topic(cluster.bootstrap, PARTITIONS)
    producers = start_producers(six_producers(), cluster.bootstrap, topic, COUNT, PARTITIONS, artifacts_dir)

    # Each producer's own Metadata names its zone's broker as the leader of every partition: the
    # three zones write every partition through three different brokers.
    for p in producers:
        leaders, _ = p.leaders()
        want = node_of_zone[p.spec.zone]
        assert leaders == {q: want for q in range(PARTITIONS)}, f"{p.spec.name} (zone {p.spec.zone}) was given leaders {leaders}"

    finish(producers, COUNT, timeout=120)

    # The offset index shows every broker writing every partition, at overlapping times.
    writers = writers_by_partition(cluster.metadata_url, topic)
    for q, spans in writers.items():
        assert set(spans) == {0, 1, 2}, f"partition {q} written by brokers {sorted(spans)}"
        assert max(lo for lo, _ in spans.values()) <= min(hi for _, hi in spans.values()), f"partition {q}: brokers wrote at disjoint times {spans}"

    log = read_everywhere({i: (n, ZONES[i]) for i, n in enumerate(cluster.nodes)}, topic, PARTITIONS, artifacts_dir)
    result = check_log(log, producers)
    assert result.records == 6 * COUNT

"""The chaos workloads on real servers, no faults: three brokers on etcd and SeaweedFS and two `neve
compactor` processes sharing a PostgreSQL catalog; the queue, txn and compacted workloads run together
for a while, then read every partition back and every table. The history they record must say what
a fault-free cluster did: every acknowledged send once at its offset, committed transactions whole
and aborted ones absent in read_committed reads, tables equal to the Kafka view, a compacted table
one row per live key."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from chaos import history
from chaos.workloads import WORKLOADS
from tests.cluster.test_one_copy import compactor_env, start_compactor
from tests.cluster.test_shared_compactors import catalog_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

RUN_S = 15.0
ENV = {"NEVE_BROKER_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": "500", "NEVE_BROKER_GROUP_CONSUMER_SESSION_TIMEOUT_MS": "10000"}


def completions(ops: list[dict], f: str, type: str | None = None) -> list[tuple[dict, dict]]:
    return [(i, c) for i, c in history.pairs(ops) if c is not None and i["f"] == f and (type is None or c["type"] == type)]


def final_records(ops: list[dict], isolation: str) -> dict[str, list]:
    reads = [c for i, c in completions(ops, "final-read") if c["value"]["isolation"] == isolation]
    assert len(reads) >= 1 and all(c["type"] == "ok" for c in reads), [c.get("incomplete") for c in reads]
    out: dict[str, list] = {}
    for c in reads:
        out.update(c["value"]["records"])
    return out


def topic_of(key: str) -> str:
    return key.rpartition("/")[0]


def test_workloads_record_what_a_fault_free_cluster_does(cluster_factory, postgres_db, artifacts_dir):
    began = time.monotonic()
    cluster = cluster_factory(zones=("a", "b", "c"), env=ENV)
    env = {**compactor_env(cluster, postgres_db), "NEVE_COMPACTOR_SHARE_TOPICS": "true"}
    compactors = [start_compactor(env, artifacts_dir / f"compactor-{i}.log") for i in range(2)]
    path = artifacts_dir / "history.jsonl"
    path.unlink(missing_ok=True)
    recorder = history.Recorder(path)
    rng = random.Random(7)
    workloads = {name: cls(f"{rng.getrandbits(32):08x}", rng, recorder) for name, cls in WORKLOADS.items()}
    try:
        for w in workloads.values():
            w.setup(cluster.bootstrap)
        for w in workloads.values():
            w.start(cluster.bootstrap)
        time.sleep(RUN_S)
        for w in workloads.values():
            w.stop()
        for w in workloads.values():
            w.final_reads(cluster.bootstrap, 90)
        catalog = catalog_of(cluster, postgres_db)
        for w in workloads.values():
            w.table_reads(catalog, 150)
    finally:
        recorder.close()
        for process in compactors:
            process.terminate()
            process.wait(60)
    ops = history.read(path)
    print(f"{len(ops)} ops in {time.monotonic() - began:.0f}s: {Counter((o['f'], o['type']) for o in ops).most_common()}")

    # the contract's shape: one op outstanding per process, every op completed, values unique
    assert [o["index"] for o in ops] == list(range(len(ops)))
    assert all(c is not None for _, c in history.pairs(ops)), [i for i, c in history.pairs(ops) if c is None][:3]
    invoked = Counter(m[2] for o in ops if o["type"] == "invoke" and o["f"] in ("send", "txn") for m in o["value"] if m[0] == "send" and m[2] is not None)
    assert invoked and max(invoked.values()) == 1

    committed = final_records(ops, "read_committed")
    uncommitted = final_records(ops, "read_uncommitted")
    at = {(k, r[0]): r[1] for k, rs in committed.items() for r in rs}

    # queue: every acknowledged send exactly once, at its acknowledged offset
    queue = workloads["queue"]
    sent = [(m[1], m[2][0], m[2][1]) for _, c in completions(ops, "send", "ok") for m in c["value"] if topic_of(m[1]) in queue.topics]
    assert len(sent) > 50
    values = Counter(r[1] for k, rs in committed.items() if topic_of(k) in queue.topics for r in rs)
    for key, offset, v in sent:
        assert at.get((key, offset)) == v and values[v] == 1, (key, offset, v)
    # its consumers polled, its groups committed and rebalanced, both protocols
    assert sum(len(rs) for _, c in completions(ops, "poll", "ok") for rs in c["value"][0][1].values()) > 0
    groups_committed = {c["value"]["group"] for _, c in completions(ops, "commit", "ok")}
    assert set(queue.groups.values()) <= groups_committed, groups_committed
    assert any(o["f"] == "rebalance" for o in ops)
    assert completions(ops, "offsets", "ok")

    # txn: committed transactions whole in read_committed, aborted ones absent from it (and there in read_uncommitted)
    txn = workloads["txn"]
    oks = completions(ops, "txn", "ok")
    fails = completions(ops, "txn", "fail")
    assert len(oks) > 10 and fails
    assert all(c["commit_time"] is not None for _, c in oks)
    committed_values = {v for rs in committed.values() for _, v, *_ in rs}
    # read_uncommitted saw the aborted records: in the final read, or (an aborted transaction at a
    # partition's start leaves neve's Kafka view once compacted: see the workloads' report) polled
    uncommitted_values = {v for rs in uncommitted.values() for _, v, *_ in rs}
    uncommitted_values |= {r[1] for _, c in completions(ops, "poll", "ok") for rs in c["value"][0][1].values() for r in rs}
    for _, c in oks:
        for m in c["value"]:
            if m[0] == "send":
                assert at.get((m[1], m[2][0])) == m[2][1], m
    for _, c in fails:
        for m in c["value"]:
            if m[0] == "send":
                assert m[2][1] not in committed_values, m
                assert m[2][0] is None or m[2][1] in uncommitted_values, m
    # the consume-transform-produce loop committed transactions with the group's offsets
    assert any(m[0] == "offsets" for _, c in oks for m in c["value"])

    # tables: every topic's table reached the Kafka view and equals it (the compacted one apart)
    reads = {c["value"]["topic"]: c for _, c in completions(ops, "table-read")}
    for w in (queue, txn):
        for topic in w.topics:
            read = reads[topic]
            assert read["type"] == "ok" and read["value"]["complete"], topic
            assert read["value"]["rows"] == {k: rs for k, rs in committed.items() if topic_of(k) == topic and rs}, topic

    # compacted: the table is one row per live key, its latest acknowledged value
    compacted = workloads["compacted"]
    (topic,) = compacted.topics
    latest: dict[tuple[str, str], tuple[int, int | None]] = {}
    for _, c in completions(ops, "send", "ok"):
        for _, key, (offset, v), record_key in (m for m in c["value"] if topic_of(m[1]) == topic):
            if (key, record_key) not in latest or latest[(key, record_key)][0] < offset:
                latest[(key, record_key)] = (offset, v)
    live = {k: ov for k, ov in latest.items() if ov[1] is not None}
    assert live and len(live) < len(latest) + 1
    read = reads[topic]
    assert read["type"] == "ok" and read["value"]["complete"]
    rows = {(key, record_key): (offset, v) for key, rs in read["value"]["rows"].items() for offset, v, record_key in rs}
    assert sum(len(rs) for rs in read["value"]["rows"].values()) == len(rows)
    assert rows == live
    # the Kafka view of it holds each key's latest record (a tombstone may have gone)
    kafka_latest = {}
    for key, rs in committed.items():
        if topic_of(key) == topic:
            for offset, v, record_key in rs:
                kafka_latest[(key, record_key)] = (offset, v)
    assert {k: ov for k, ov in kafka_latest.items() if ov[1] is not None} == live

    try:
        from chaos.checker import check
    except ImportError:
        return
    result = check(ops)
    # G0 (a write cycle among concurrent transactions of different producers) is what Kafka's own
    # transactions allow: their writes to different partitions interleave as they arrive
    named = {cls: found for cls, found in result.anomalies.items() if found and cls != "G0"}
    assert not named, named

"""Compactors sharing the topics, on real servers: two brokers on etcd and SeaweedFS, then two or
three `neve compactor` processes with NEVE_COMPACTOR_SHARE_TOPICS=true over one PostgreSQL catalog.
While their membership is stable each topic's cycles are committed by exactly one of them, and
together they cover every topic; after a kill -9 of the one with the most topics, its topics are
compacted by the others once its lease expires. Every acknowledged offset is in its table exactly
once with the produced key and value, and the Kafka view reads back every record once from offset 0."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.test_one_copy import PARTITIONS, compactor_env, consume, start_compactor
from tests.cluster.workload import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TOPICS = 9
PER_TOPIC = 120  # records per topic per round
LEASE_TTL_S = 3
WAIT_S = 120.0  # generous: on a busy 2-core machine


def produce_round(bootstrap: str, topics: list[str], r: int) -> dict[str, dict[tuple[int, int], tuple]]:
    """PER_TOPIC records to each topic (acks=all, idempotent): per topic, (partition, offset) ->
    (key, value, headers) as acknowledged."""
    acked: dict[str, dict[tuple[int, int], tuple]] = {t: {} for t in topics}
    failures: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 10})

    def delivered(topic: str, record: tuple):
        def on_delivery(err, msg) -> None:
            if err is not None:
                failures.append(str(err))
            else:
                acked[topic][(msg.partition(), msg.offset())] = record

        return on_delivery

    for i in range(PER_TOPIC):
        for topic in topics:
            key, value = b"%s-%d-%d" % (topic.encode(), r, i), b"v%d-%d " % (r, i) * (i % 7 + 1)
            producer.produce(topic, key=key, value=value, partition=i % PARTITIONS, on_delivery=delivered(topic, (key, value, ())))
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures[:3]
    assert all(len(a) == PER_TOPIC for a in acked.values())
    return acked


def catalog_of(cluster, postgres_db: str):
    from compactor.catalog import load_catalog
    from compactor.config import CompactorConfig
    from tests.fixtures import S3_KEY, S3_SECRET

    env = compactor_env(cluster, postgres_db)
    return load_catalog(CompactorConfig(catalog_url=postgres_db, warehouse=env["NEVE_COMPACTOR_WAREHOUSE"], s3_endpoint=cluster.s3.endpoint, s3_access_key_id=S3_KEY, s3_secret_access_key=S3_SECRET))


def identifier_of(topic: str) -> str:
    return "neve." + topic.replace("-", "_")


def table_rows(catalog, topic: str) -> list[tuple[tuple[int, int], tuple]]:
    """Every row of the topic's table: ((partition, offset), (key, value, ())), sorted."""
    if not catalog.table_exists(identifier_of(topic)):
        return []
    rows = catalog.load_table(identifier_of(topic)).scan(selected_fields=("kafka", "key_raw", "value_raw")).to_arrow().to_pylist()
    return sorted(((r["kafka"]["partition"], r["kafka"]["offset"]), (r["key_raw"], r["value_raw"], ())) for r in rows)


def share_of(catalog, topics: list[str], member_names: str, member: str) -> set[str]:
    """The topics whose owner among `member_names` (as a compactor logs them) is `member`, by the
    topic ids their tables are bound to."""
    from compactor.commits.binding import TOPIC_PROPERTY
    from compactor.service.sharing import owner

    members = member_names.split(",")
    return {t for t in topics if owner(members, uuid.UUID(catalog.load_table(identifier_of(t)).properties[TOPIC_PROPERTY])) == member}


def events(log_path: Path, event: str) -> list[dict]:
    """The log lines of one event in a compactor's JSON log, in order."""
    out = []
    for line in log_path.read_text().splitlines():
        if line.startswith("{") and f'"{event}"' in line:
            record = json.loads(line)
            if record.get("event") == event:
                out.append(record)
    return out


def after_share(log_path: Path, members: int) -> tuple[dict, list[dict]]:
    """A compactor's last share change to `members` members, and its log lines since: what it did
    under that membership."""
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    changes = [i for i, r in enumerate(lines) if r.get("event") == "compactor_share_changed" and r.get("members") == members]
    assert changes, f"{log_path.name}: no share of {members} members"
    return lines[changes[-1]], lines[changes[-1] + 1 :]


def committed(lines: list[dict]) -> set[str]:
    return {r["topic"] for r in lines if r.get("event") == "cycle committed"}


def refused(lines: list[dict]) -> list[dict]:
    return [r for r in lines if r.get("event") == "cycle not committed: another cycle holds its offsets"]


@pytest.mark.parametrize("compactors", [3, 2])
def test_compactors_divide_the_topics_and_take_over_a_killed_ones_share(cluster_factory, postgres_db, artifacts_dir, compactors):
    cluster = cluster_factory(zones=("a", "b"))
    run = uuid.uuid4().hex[:6]
    topics = [f"shared-{run}-{i}" for i in range(TOPICS)]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics]).values():
        future.result(60)

    env = {**compactor_env(cluster, postgres_db), "NEVE_COMPACTOR_SHARE_TOPICS": "true", "NEVE_METADATA_LEASE_TTL_S": str(LEASE_TTL_S)}
    logs = [artifacts_dir / f"compactor-{compactors}-{i}.log" for i in range(compactors)]
    processes = [start_compactor(env, log) for log in logs]
    try:
        # every compactor has read the full membership before there is anything to compact
        wait_until(lambda: all(any(e["members"] == compactors for e in events(log, "compactor_share_changed")) for log in logs), timeout=WAIT_S, what="every compactor seeing all", interval=0.2)
        acked = produce_round(cluster.bootstrap, topics, 0)

        catalog = catalog_of(cluster, postgres_db)

        def in_tables() -> bool:
            return all(table_rows(catalog, t) == sorted(acked[t].items()) for t in topics)

        wait_until(in_tables, timeout=WAIT_S, what="the first round in the tables", interval=0.5)
        stable = [after_share(log, compactors) for log in logs]
        shares = [committed(lines) for _, lines in stable]
        # each compactor committed the cycles of exactly its rendezvous share, no other compactor
        # worked them (no cycle refused), and the shares divide the topics
        for (change, lines), share in zip(stable, shares, strict=True):
            assert share == share_of(catalog, topics, change["member_names"], change["member"]), change
            assert change["topics"] == len(share) and refused(lines) == []
        assert set().union(*shares) == set(topics) and sum(len(s) for s in shares) == TOPICS, shares

        victim = max(range(compactors), key=lambda i: len(shares[i]))
        processes[victim].kill()  # SIGKILL: no resign, its lease expires
        assert processes[victim].wait(60) == -9
        killed = time.monotonic()
        more = produce_round(cluster.bootstrap, topics, 1)
        for t in topics:
            acked[t].update(more[t])

        def victims_topics_in_tables() -> bool:
            return all(table_rows(catalog, t) == sorted(acked[t].items()) for t in shares[victim])

        wait_until(victims_topics_in_tables, timeout=WAIT_S, what="the killed compactor's topics compacted by the others", interval=0.5)
        assert time.monotonic() - killed < WAIT_S
        wait_until(in_tables, timeout=WAIT_S, what="the second round in the tables", interval=0.5)
        # the survivors saw it leave (its lease expired) and took its topics, each its new share's
        taken = []
        for i in (i for i in range(compactors) if i != victim):
            change, lines = after_share(logs[i], compactors - 1)
            assert processes[victim].pid != int(change["member"].rsplit(":", 1)[1])
            assert committed(lines) <= share_of(catalog, topics, change["member_names"], change["member"])
            taken.append(committed(lines) & shares[victim])
        assert set().union(*taken) == shares[victim] and sum(len(t) for t in taken) == len(shares[victim])
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                assert process.wait(60) == 0

    # exactly once, with the produced values, in each table (read again, no compactor running) and in the Kafka view
    for t in topics:
        assert table_rows(catalog, t) == sorted(acked[t].items())
        assert consume(cluster.nodes[1].bootstrap, t, len(acked[t])) == acked[t]

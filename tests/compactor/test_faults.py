"""Fault injection into the compactor of `neve dev` (tasks in the node's process), at each step
where it changes something: a cycle's task `written` (its Parquet files), its Iceberg commit
(`committed`), its index swap (`swapped`), maintenance's merge (`merged`), table retention's
overwrite (`overwrite`) and a deleted topic's table drop (`dropped`). At each step either an
exception is raised once (the node goes on: the next cycle) or the node is killed -9 (then
restarted). Afterwards every acknowledged offset is in the table exactly once (those table
retention let go excepted, which the Kafka view no longer serves either), the Kafka view read
from offset 0 through the broker is what was produced, byte for byte, and the topic is not
stalled: a later produce is compacted too.

Each case: phase 1 compacts three rounds of records, one cycle each (small files; maintenance
off); phase 2 restarts the node with the fault armed and maintenance on (a merge due at two small
files, the topic's retention due), and gives the step its work; a killed node is started again
without the fault."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.compactor.produced import CODECS, DAY_MS, PARTITIONS, RAW, T0, TOMBSTONE, Produced, Want, headers_of, key_of, produce, timestamp_of
from tests.compactor.test_service import WAIT_S, consume_all, table_offsets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PER_ROUND = 12
POINTS = ["written", "committed", "swapped", "merged", "overwrite", "dropped"]


def node_env(**extra: str) -> dict[str, str]:
    return {
        "NEVE_WAL_LINGER_MS": "5",
        "NEVE_COMPACTOR_IN_NODE": "true",
        "NEVE_COMPACTOR_RUNNER": "in-process",
        "NEVE_COMPACTOR_FRESHNESS_MS": "100",
        "NEVE_COMPACTOR_INTERVAL_MS": "100",
        "NEVE_COMPACTOR_MAINTENANCE_INTERVAL_MS": "0",
        **extra,
    }


def create_topic(bootstrap: str, prefix: str, configs: dict[str, str]) -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1, config=configs)])[topic].result(30)
    return topic


def produce_round(bootstrap: str, p: Produced, r: int) -> None:
    items = []
    for i in range(PER_ROUND):
        j = r * PER_ROUND + i
        value = None if i % 9 == 4 else (b"fault %d " % j) * (j % 13 + 1)
        items.append((j % PARTITIONS, Want(CODECS[r % len(CODECS)], key_of(i, j), headers_of(j), timestamp_of(j), TOMBSTONE if value is None else RAW, value_raw=value), value))
    produce(bootstrap, p.topic, CODECS[r % len(CODECS)], items, p.want)


def log_starts(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"starts-{time.monotonic_ns()}"})
    try:
        return {part: consumer.get_watermark_offsets(TopicPartition(topic, part), timeout=30)[0] for part in range(PARTITIONS)}
    finally:
        consumer.close()


def visible(p: Produced, starts: dict[int, int]) -> list[tuple[int, int]]:
    return sorted(k for k in p.want if k[1] >= starts[k[0]])


def wait_until(what: str, check, node=None) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"not {what} after {WAIT_S} s"
        assert node is None or node.process.poll() is None, f"the node exited with {node.process.returncode} before {what}"
        time.sleep(0.1)


def counts(offsets: list[tuple[int, int]]) -> dict[int, int]:
    out = dict.fromkeys(range(PARTITIONS), 0)
    for part, _ in offsets:
        out[part] += 1
    return out


@pytest.mark.parametrize("mode", ["raise", "kill"])
@pytest.mark.parametrize("point", POINTS)
def test_a_fault_at_each_step_loses_duplicates_and_stalls_nothing(neve_factory, point, mode):
    node = neve_factory(env=node_env())
    data_dir = Path(node.data_dir).resolve()
    # Retention: the rows of a partition up to its first record not older than T0 + half a day go
    # (offset 0 of partition 0 alone: the next record there is two days later).
    configs = {"neve.iceberg.retention.ms": str(int(time.time() * 1000) - (T0 + DAY_MS // 2))} if point == "overwrite" else {}
    p = Produced(create_topic(node.bootstrap, "fault", configs), {}, {})
    for r in range(3):  # phase 1: a cycle per round, three small files in each table partition
        produce_round(node.bootstrap, p, r)
        wait_until("compacted", lambda: table_offsets(data_dir, p.topic) == sorted(p.want))

    fault = {"raise": "NEVE_COMPACTOR_FAULT_RAISE_AT", "kill": "NEVE_COMPACTOR_FAULT_KILL_AFTER"}[mode]
    node.env.update({fault: point, "NEVE_COMPACTOR_MAINTENANCE_INTERVAL_MS": "500", "NEVE_COMPACTOR_MERGE_MIN_FILES": "2"})
    node.restart()  # phase 2: the fault armed, maintenance due
    if point in ("written", "committed", "swapped"):
        produce_round(node.bootstrap, p, 3)
    elif point == "dropped":
        doomed = Produced(create_topic(node.bootstrap, "doomed", {"neve.iceberg.drop.on.delete": "true"}), {}, {})
        produce_round(node.bootstrap, doomed, 0)
        wait_until("the doomed topic compacted", lambda: table_offsets(data_dir, doomed.topic) == sorted(doomed.want), node)
        admin = AdminClient({"bootstrap.servers": node.bootstrap})  # kept until its answer came
        admin.delete_topics([doomed.topic])[doomed.topic].result(30)
    if mode == "kill":
        assert node.process.wait(WAIT_S) == -9  # killed at `point`
        del node.env[fault]
        node.start()
    else:
        wait_until(f"a fault raised at {point}", lambda: b"InjectedFault" in node.log_path.read_bytes(), node)
    if point == "dropped":
        wait_until("the doomed topic's table dropped", lambda: table_offsets(data_dir, doomed.topic) == [], node)

    produce_round(node.bootstrap, p, 4)  # not stalled: a later produce is compacted too
    starts = log_starts(node.bootstrap, p.topic)
    want = visible(p, starts)
    if point == "overwrite":
        assert starts == {0: 1, 1: 0}
    wait_until("every visible offset in the table once", lambda: table_offsets(data_dir, p.topic) == want, node)
    got = consume_all(node.bootstrap, p.topic, counts(want))
    assert sorted(got) == want
    for key in want:
        w = p.want[key]
        assert got[key] == (w.key, w.value_raw, [(k, v) for k, v in w.headers], w.timestamp)
    assert node.stop() == 0
    assert table_offsets(data_dir, p.topic) == want

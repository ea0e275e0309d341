"""Four independent client implementations drive the same scenarios against one `neve dev`: the
Java client (kafka-clients 3.9.1), librdkafka (confluent-kafka), kafkajs and aiokafka, each
through its driver (tests/clients/<client>_driver.py, one interface in tests/clients/driver.py).

- admin: create a topic with a config, describe its partitions and configs (exact values), alter a
  config and read it back, grow it from 3 to 6 partitions and produce to / read partition 5,
  delete it and see it gone;
- idempotent producer (acks=all, 5 in flight where the client has the setting): 20,000 records
  over 3 partitions read back with each sequence number exactly once, in send order per
  partition, at contiguous offsets from 0;
- a consumer group on a 6-partition topic: one member starts, two join while it consumes, one
  leaves while the others consume, after processing a batch it never commits; every record is
  consumed, that batch is read again, and every re-delivery is of a record whose batch was not
  committed (members commit synchronously after each batch);
- commit, close, resume: a member consumes and commits exactly K records, then processes one
  more batch and closes without committing it; a new member of the group reads exactly the
  records after the committed offsets (that batch again, nothing committed).

Members are paced by quotas (tests/clients/member.py), so joins and leaves happen at known points
of the consumption and the test waits on what the members report, never on a clock."""

from __future__ import annotations

import time
import uuid
from collections import Counter, defaultdict

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from tests.clients.driver import CLIENTS, Ack, Driver, load
from tests.clients.member import ABANDONED, Batch, Board, Member

pytestmark = pytest.mark.integration


# Topics are created and deleted by the tests themselves: with `neve dev`'s auto-creation on (as
# Kafka's default), a client's Metadata request would bring a deleted topic back, as it would in Kafka.
LINGER = {"NEVE_WAL_LINGER_MS": "10", "NEVE_BROKER_AUTO_CREATE_TOPICS": "false"}
WAIT = 45.0  # the longest any one awaited event may take; healthy runs take a few seconds


@pytest.fixture(params=CLIENTS)
def driver(request, neve_factory, artifacts_dir) -> Driver:
    node = neve_factory(env=LINGER)
    d = load(request.param, node.bootstrap, artifacts_dir)
    yield d
    d.close()


@pytest.fixture
def board():
    """Where the test's group members report; every member still running is ended at teardown."""
    b = Board()
    yield b
    for member in b.members:
        member.kill()


def new_topic(prefix: str, driver: Driver) -> str:
    return f"{prefix}-{driver.name}-{uuid.uuid4().hex[:8]}"


def read_all(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[int, list[tuple[int, str]]]:
    """Every record of each partition from offset 0 to `ends[p]` (exclusive) as (offset, value),
    read by one independent client (librdkafka, assign() from the beginning, no group)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{topic}", "enable.auto.commit": False})
    got: dict[int, list[tuple[int, str]]] = {p: [] for p in ends}
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        deadline = time.monotonic() + WAIT
        while any(len(got[p]) < n for p, n in ends.items()):
            assert time.monotonic() < deadline, f"read {({p: len(v) for p, v in got.items()})} of {ends} in {WAIT}s"
            for msg in consumer.consume(1000, timeout=0.2):
                assert msg.error() is None, f"consume error: {msg.error()}"
                got[msg.partition()].append((msg.offset(), msg.value().decode()))
    finally:
        consumer.close()
    return got


def expected_layout(count: int, partitions: int) -> dict[int, list[tuple[int, str]]]:
    """Where `Driver.produce` puts records: seq s on partition s % P at offset s // P."""
    return {p: [(o, str(s)) for o, s in enumerate(range(p, count, partitions))] for p in range(partitions)}


def assert_acks(acks: list[Ack], count: int, partitions: int) -> None:
    assert sorted((a.partition, a.offset, a.seq) for a in acks) == sorted(
        (s % partitions, s // partitions, s) for s in range(count)
    ), "acknowledged positions differ from seq s at partition s % P, offset s // P"


# --- a. admin -------------------------------------------------------------------------------------


def test_topic_lifecycle(driver):
    """Create (3 partitions, with a config), describe, produce and read back, delete."""
    bootstrap = driver.bootstrap
    topic = new_topic("life", driver)
    driver.create_topic(topic, 3, {"retention.ms": "3600000"})
    assert driver.partitions(topic) == [0, 1, 2]
    acks = driver.produce(topic, 6, 3)
    assert_acks(acks, 6, 3)
    assert read_all(bootstrap, topic, {p: 2 for p in range(3)}) == expected_layout(6, 3)
    driver.delete_topic(topic)
    assert driver.partitions(topic) is None


def test_topic_configs_and_partitions(driver):
    """Configs described exactly, altered and read back; 3 -> 6 partitions, partition 5 used."""
    bootstrap = driver.bootstrap
    topic = new_topic("admin", driver)
    driver.create_topic(topic, 3, {"retention.ms": "3600000"})
    assert driver.partitions(topic) == [0, 1, 2]
    assert driver.configs(topic)["retention.ms"] == "3600000"

    driver.alter_configs(topic, {"retention.ms": "7200000"})
    assert driver.configs(topic)["retention.ms"] == "7200000"

    driver.create_partitions(topic, 6)
    assert driver.partitions(topic) == [0, 1, 2, 3, 4, 5]
    acks = driver.produce(topic, 6, 6)  # seq 5 goes to the new partition 5
    assert_acks(acks, 6, 6)
    assert read_all(bootstrap, topic, {p: 1 for p in range(6)}) == expected_layout(6, 6)

    driver.delete_topic(topic)
    assert driver.partitions(topic) is None


# --- b. idempotent producer -----------------------------------------------------------------------

IDEMPOTENT_COUNT = 20_000


def test_idempotent_producer(driver):
    """Each sequence number exactly once, in send order per partition, offsets contiguous from 0."""
    topic = new_topic("idem", driver)
    driver.create_topic(topic, 3, {})
    acks = driver.produce(topic, IDEMPOTENT_COUNT, 3)
    assert len(acks) == IDEMPOTENT_COUNT
    assert_acks(acks, IDEMPOTENT_COUNT, 3)
    expected = expected_layout(IDEMPOTENT_COUNT, 3)
    got = read_all(driver.bootstrap, topic, {p: len(v) for p, v in expected.items()})
    for p in expected:
        seqs = Counter(v for _, v in got[p])
        assert not [s for s, n in seqs.items() if n > 1], f"partition {p}: sequence numbers read twice"
        assert [o for o, _ in got[p]] == list(range(len(expected[p]))), f"partition {p}: offsets not contiguous from 0"
        assert got[p] == expected[p], f"partition {p}: records differ from send order"
    # nothing beyond them either: the end offsets are exactly the counts
    ends = end_offsets(driver.bootstrap, topic, 3)
    assert ends == {p: len(v) for p, v in expected.items()}


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{topic}"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in range(partitions)}
    finally:
        consumer.close()


# --- c. a group whose members join and leave during consumption -----------------------------------

GROUP_PARTITIONS = 6
PER_PARTITION = 200
GROUP_COUNT = GROUP_PARTITIONS * PER_PARTITION
BATCH = 20


def committed(board: Board) -> dict[int, int]:
    """Each partition's committed offset, from the batches whose commit succeeded."""
    out: dict[int, int] = {}
    for b in board.batches():
        if b.error is None:
            for p, o in b.next_offsets().items():
                out[p] = max(out.get(p, 0), o)
    return out


def at_rest(board: Board, members: list[Member], ends: dict[int, int]) -> bool:
    """The members share every partition (non-empty, disjoint assignments) and each has used its
    whole quota or has nothing left to read in its partitions."""
    assignments = [m.assignment() for m in members]
    if not all(assignments) or sum(map(len, assignments)) != len(ends) or frozenset().union(*assignments) != set(ends):
        return False
    done = committed(board)
    return all(
        (m.quota is not None and m.processed() >= m.quota) or all(done.get(p, 0) >= ends[p] for p in a)
        for m, a in zip(members, assignments)
    )


def all_committed(board: Board, ends: dict[int, int]) -> bool:
    done = committed(board)
    return all(done.get(p, 0) >= end for p, end in ends.items())


def redelivery_account(batches: list[Batch]) -> tuple[Counter, Counter]:
    """(deliveries per record, failed-commit batches containing each record)."""
    delivered: Counter = Counter()
    uncommitted: Counter = Counter()
    for b in batches:
        for p, o, _ in b.records:
            delivered[p, o] += 1
            if b.error is not None:
                uncommitted[p, o] += 1
    return delivered, uncommitted


def test_group_members_join_and_leave(driver, board):
    """c1 starts alone, c2 and c3 join while it consumes, one leaves with a batch it never
    committed; every record is consumed, re-deliveries are exactly accounted for."""
    topic = new_topic("group", driver)
    group = f"g-{topic}"
    driver.create_topic(topic, GROUP_PARTITIONS, {})
    assert_acks(driver.produce(topic, GROUP_COUNT, GROUP_PARTITIONS), GROUP_COUNT, GROUP_PARTITIONS)
    ends = {p: PER_PARTITION for p in range(GROUP_PARTITIONS)}
    expected = {(p, o): v for p, records in expected_layout(GROUP_COUNT, GROUP_PARTITIONS).items() for o, v in records}

    # c1 alone takes every partition and consumes a sixth of the records ...
    c1 = driver.member(topic, group, board, "c1", BATCH, quota=GROUP_COUNT // 6)
    board.wait(lambda: c1.processed() >= GROUP_COUNT // 6, WAIT, "c1 to consume its first sixth")
    assert c1.assignment() == set(range(GROUP_PARTITIONS)), "a lone member is assigned every partition"
    # ... then consumes more while c2 and c3 join (it goes on as soon as they are about to subscribe).
    c2 = driver.member(topic, group, board, "c2", BATCH, quota=GROUP_COUNT // 6)
    c3 = driver.member(topic, group, board, "c3", BATCH, quota=GROUP_COUNT // 6)
    board.wait(lambda: c2.started() and c3.started(), WAIT, "c2 and c3 to start")
    c1.set_quota(GROUP_COUNT // 3)
    board.wait(lambda: at_rest(board, [c1, c2, c3], ends), WAIT, "three members sharing the partitions, each at its quota")
    with board.cond:
        joined_at = sum(committed(board).values())
    assert joined_at < GROUP_COUNT, "records were left when the three members settled"

    # One member leaves mid-way as a consumer that dies between processing and committing: one
    # that still has records in its partitions processes one more batch and closes without
    # committing it, while the other two consume a twelfth more each (at most 1020 of the 1200
    # records are processed before it has left); then they consume the rest.
    with board.cond:
        done = committed(board)
        leaver = next(m for m in (c2, c3, c1) if any(done.get(p, 0) < ends[p] for p in m.assignment()))
    stayers = [m for m in (c1, c2, c3) if m is not leaver]
    leaver.abandon()
    leaver.set_quota(leaver.quota + BATCH)
    for m in stayers:
        m.set_quota(m.quota + GROUP_COUNT // 12)
    board.wait(leaver.closed, WAIT, f"{leaver.name} to process one more batch and leave without committing it")
    leaver.stop()  # it has closed; this waits for its exit
    with board.cond:
        left_at = sum(committed(board).values())
    assert left_at < GROUP_COUNT, f"records were left when {leaver.name} left"
    for m in stayers:
        m.set_quota(None)
    board.wait(lambda: all_committed(board, ends), WAIT, "every record committed by the two members left")
    for m in stayers:
        m.stop()

    batches = board.batches()
    delivered, uncommitted = redelivery_account(batches)
    assert set(delivered) == set(expected), f"{len(set(expected) - set(delivered))} records never consumed, first {sorted(set(expected) - set(delivered))[:5]}"
    wrong = [(b.member, p, o, v) for b in batches for p, o, v in b.records if expected[p, o] != v]
    assert not wrong, f"records with wrong values, first {wrong[:5]}"
    redelivered = {k: n - 1 for k, n in delivered.items() if n > 1}
    unexplained = {k: (n, uncommitted[k]) for k, n in redelivered.items() if n > uncommitted[k]}
    assert not unexplained, (
        f"{len(unexplained)} records re-delivered more often than their batches failed to commit "
        f"(record: (re-deliveries, failed commits)), first {sorted(unexplained.items())[:5]}"
    )
    [abandoned] = [b for b in batches if b.error == ABANDONED]
    missed = [(p, o) for p, o, _ in abandoned.records if (p, o) not in redelivered]
    assert not missed, f"records {leaver.name} processed but never committed were not read again: {missed[:5]}"
    duplicates = sum(redelivered.values())
    bound = sum(uncommitted.values())
    assert len(abandoned.records) <= duplicates <= bound
    failed_commits = sum(1 for b in batches if b.error is not None)
    print(f"{driver.name}: {len(batches)} batches, {failed_commits} failed commits, {duplicates} re-deliveries (bound {bound})")


# --- d. commit, close, resume ---------------------------------------------------------------------

RESUME_PARTITIONS = 3
RESUME_COUNT = 300
RESUME_K = 110


def test_commit_close_resume(driver, board):
    """The first member commits K records batch by batch, then processes one more batch and closes
    without committing it; a new member of the group reads exactly the records after the
    committed offsets, so the abandoned batch again and nothing committed."""
    topic = new_topic("resume", driver)
    group = f"g-{topic}"
    driver.create_topic(topic, RESUME_PARTITIONS, {})
    assert_acks(driver.produce(topic, RESUME_COUNT, RESUME_PARTITIONS), RESUME_COUNT, RESUME_PARTITIONS)
    layout = expected_layout(RESUME_COUNT, RESUME_PARTITIONS)
    ends = {p: len(v) for p, v in layout.items()}

    first = driver.member(topic, group, board, "first", BATCH, quota=RESUME_K)
    board.wait(lambda: first.processed() >= RESUME_K, WAIT, f"the first member to consume {RESUME_K} records")
    first.abandon()
    first.set_quota(RESUME_K + BATCH)
    board.wait(lambda: first.closed(), WAIT, "the first member to process one more batch and close without committing it")
    first.stop()  # it has closed; this waits for its exit
    *kept, abandoned = first.batches()
    assert abandoned.error == ABANDONED and 1 <= len(abandoned.records) <= BATCH
    assert sum(len(b.records) for b in kept) == RESUME_K, "the quota bounds what a member processes"
    failed = [b for b in kept if b.error is not None]
    assert not failed, f"a lone member's commits failed: {failed[0].error}"
    resume_at = committed(board)
    by_partition: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for b in kept:
        for p, o, v in b.records:
            by_partition[p].append((o, v))
    assert {p: by_partition[p] for p in layout} == {p: layout[p][: resume_at.get(p, 0)] for p in layout}, (
        "the first member read each partition from 0 up to its committed offset"
    )

    second = driver.member(topic, group, board, "second", BATCH, quota=None)
    board.wait(lambda: all_committed(board, ends), WAIT, "the second member to consume the rest")
    second.stop()
    resumed: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for b in second.batches():
        assert b.error is None, f"a lone member's commit failed: {b.error}"
        for p, o, v in b.records:
            resumed[p].append((o, v))
    assert {p: resumed[p] for p in layout} == {p: layout[p][resume_at.get(p, 0) :] for p in layout}, (
        f"the new member resumes exactly at the committed offsets {resume_at}"
    )
    redelivered = {(p, o) for p, o, _ in abandoned.records}
    assert redelivered <= {(p, o) for p, records in resumed.items() for o, _ in records}, "the uncommitted batch is read again"

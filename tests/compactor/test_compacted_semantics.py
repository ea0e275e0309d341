"""Kafka's answers around a compacted range, through `neve dev` with the compactor in the node, by
librdkafka (confluent-kafka), as Kafka's log cleaner leaves them: a consumer fetching from an offset
whose record was removed (a gap, also one inside a rebuilt batch) gets the next record still there,
and so does a group whose committed offset is in a gap; ListOffsets earliest and latest (the log
start and the high watermark) do not move with compaction, and a timestamp finds the first record
still there at or after it; DeleteRecords moves the log start into the compacted range, and a
consumer from the beginning then starts at the first record still there at or after it.

Each partition holds 8 keys updated 1, 2, 3 and 4 times, in 4 rounds (a key updated c times is
written in rounds 0..c-1), each round one batch per partition with its own timestamp: after
compaction each round's batch keeps the records of the keys it wrote last, with gaps between them."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from tests.compactor.test_compacted_topics import PARTITIONS, TIMEOUT, Record, create, key, latest_per_key, read_to_end, wait_for_table, wait_for_view
from tests.compactor.test_service import WAIT_S, node_env
from tests.compactor.test_transactions_clients import catalog
from tests.fixtures import free_port
from tests.readers import rows_pyiceberg

KEYS, ROUNDS = 32, 4
ROUND_MS = 1000


def updates(k: int) -> int:
    """How many times key k is written: 1..ROUNDS, each count twice in every partition."""
    return 1 + (k // PARTITIONS) % ROUNDS


def produce_round(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]], timestamp: int) -> list[Record]:
    """The records to partition (key number % PARTITIONS), held back until all are queued so that
    each partition's records go out as one batch: the records as acknowledged."""
    acked: list[Record] = []

    def delivered(err, msg) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 60_000, "batch.num.messages": 10_000, "enable.idempotence": True})
    for k, v in records:
        producer.produce(topic, key=k, value=v, partition=int(k[4:]) % PARTITIONS, timestamp=timestamp, on_delivery=delivered)
    assert producer.flush(TIMEOUT) == 0  # sends each partition's queue at once, as one batch
    assert len(acked) == len(records)
    return acked


def rounds(bootstrap: str, topic: str, base_ms: int, after_each=None) -> tuple[list[Record], dict[tuple[int, int], int]]:
    """Write the rounds (round u at base_ms + u * ROUND_MS), calling `after_each` with the records
    acknowledged so far after each: the records acknowledged, and each one's timestamp by
    (partition, offset)."""
    acked: list[Record] = []
    stamps = {}
    for u in range(ROUNDS):
        written = produce_round(bootstrap, topic, [(key(k), b"r%d-%03d" % (u, k)) for k in range(KEYS) if updates(k) > u], base_ms + u * ROUND_MS)
        stamps.update({(p, o): base_ms + u * ROUND_MS for p, o, _, _ in written})
        acked += written
        if after_each is not None:
            after_each(acked)
    return acked, stamps


def compacted_topic(neve_factory, topic: str) -> tuple[str, list[Record], list[Record], dict[tuple[int, int], int]]:
    """A node whose compacted `topic` holds the rounds, once its Kafka view and table are
    compacted: the bootstrap, the records acknowledged, those still there, and the base offset of
    the batch each of those was produced in (from its table row). Each round is in the table
    before the next is written: its own cycle, file and row group, so that the compacted range is
    read in windows (one a row group) with removed offsets at their edges."""
    node = neve_factory(env=node_env(free_port()))
    data_dir = Path(node.data_dir).resolve()
    create(node.bootstrap, topic, **{"delete.retention.ms": "3600000"})
    acked, _ = rounds(node.bootstrap, topic, int(time.time() * 1000) - 600_000, lambda acked: wait_for_table(data_dir, topic, latest_per_key(acked)))
    kept = latest_per_key(acked)
    assert len(acked) == 80 and len(kept) == KEYS
    wait_for_view(node.bootstrap, topic, kept)
    rows = rows_pyiceberg(catalog(data_dir).load_table(f"neve.{topic}"))
    return node.bootstrap, acked, kept, {(r["kafka"]["partition"], r["kafka"]["offset"]): r["kafka"]["batch_base_offset"] for r in rows}


def gaps(acked: list[Record], kept: list[Record]) -> list[tuple[int, int, int]]:
    """(partition, removed offset, the next offset still there) for every removed offset (a key's
    last record follows each of its removed ones)."""
    there = {p: sorted(o for q, o, _, _ in kept if q == p) for p in range(PARTITIONS)}
    return [(p, o, next(x for x in there[p] if x > o)) for p, o, _, _ in sorted(set(acked) - set(kept))]


def first_records(consumer: Consumer, partitions: int = 1) -> dict[int, Record]:
    """The first record polled from each of `partitions` partitions."""
    got: dict[int, Record] = {}
    deadline = time.monotonic() + WAIT_S
    while len(got) < partitions:
        assert time.monotonic() < deadline, f"no record polled from {partitions - len(got)} partitions after {WAIT_S} s"
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            raise KafkaException(msg.error())
        got.setdefault(msg.partition(), (msg.partition(), msg.offset(), msg.key(), msg.value()))
    return got


def from_beginning(bootstrap: str, topic: str) -> list[Record]:
    """Every record from each partition's log start to its end, in (partition, offset) order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"start-{uuid.uuid4().hex[:8]}", "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        return read_to_end(consumer)
    finally:
        consumer.close()


def test_a_fetch_or_a_committed_offset_in_a_removed_gap_resumes_at_the_next_record(neve_factory):
    bootstrap, acked, kept, batch_of = compacted_topic(neve_factory, "gaps")
    removed = gaps(acked, kept)
    at = {(p, o): (p, o, k, v) for p, o, k, v in kept}
    assert len(removed) == 48
    # gaps inside a rebuilt batch: each round's one batch of a partition kept records on both
    # sides of removed ones
    inside = [(p, o) for p, o, nxt in removed if batch_of.get((p, o - 1), -1) == batch_of[(p, nxt)]]
    assert len(inside) >= PARTITIONS, inside

    # a consumer fetching from each removed offset gets the next record still there, first
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"gaps-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    try:
        for p, o, nxt in removed:
            consumer.assign([TopicPartition("gaps", p, o)])
            assert first_records(consumer)[p] == at[(p, nxt)], f"partition {p} from offset {o}"
    finally:
        consumer.close()

    # a group whose committed offset is a removed offset resumes at the next record still there
    committed = {p: next(o for q, o, nxt in removed if q == p and nxt - o > 1) for p in range(PARTITIONS)}  # a gap of two or more
    resumes = {p: next(nxt for q, o, nxt in removed if q == p and o == committed[p]) for p in range(PARTITIONS)}
    group = f"resume-{uuid.uuid4().hex[:8]}"
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        committer.commit(offsets=[TopicPartition("gaps", p, o) for p, o in committed.items()], asynchronous=False)
    finally:
        committer.close()
    resumed = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "latest"})
    try:
        resumed.subscribe(["gaps"])
        assert first_records(resumed, PARTITIONS) == {p: at[(p, nxt)] for p, nxt in resumes.items()}
        stored = resumed.committed([TopicPartition("gaps", p) for p in range(PARTITIONS)], timeout=TIMEOUT)
        assert {tp.partition: tp.offset for tp in stored} == committed
    finally:
        resumed.close()


def test_list_offsets_earliest_and_latest_are_unchanged_by_compaction(neve_factory):
    node = neve_factory(env=node_env(free_port()))
    create(node.bootstrap, "ends", **{"delete.retention.ms": "3600000"})
    acked, stamps = rounds(node.bootstrap, "ends", int(time.time() * 1000) - 600_000)
    ends = {p: (0, max(o for q, o, _, _ in acked if q == p) + 1) for p in range(PARTITIONS)}
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": f"ends-{uuid.uuid4().hex[:8]}"})
    try:
        assert {p: consumer.get_watermark_offsets(TopicPartition("ends", p), timeout=TIMEOUT) for p in range(PARTITIONS)} == ends
        kept = latest_per_key(acked)
        wait_for_table(Path(node.data_dir).resolve(), "ends", kept)
        wait_for_view(node.bootstrap, "ends", kept)
        # the log start and the high watermark are where they were: the removed offsets are gaps
        assert {p: consumer.get_watermark_offsets(TopicPartition("ends", p), timeout=TIMEOUT) for p in range(PARTITIONS)} == ends
        # a timestamp finds the first record still there at or after it, as after Kafka's
        # cleaner: a round's first offset where the round kept its first record, else later;
        # none (-1) past the last round
        first = min(stamps.values())
        for u in range(ROUNDS + 1):
            ts = first + u * ROUND_MS
            want = {p: min((o for q, o, _, _ in kept if q == p and stamps[(q, o)] >= ts), default=-1) for p in range(PARTITIONS)}
            found = consumer.offsets_for_times([TopicPartition("ends", p, ts) for p in range(PARTITIONS)], timeout=TIMEOUT)
            assert all(tp.error is None for tp in found)
            assert {tp.partition: tp.offset for tp in found} == want, f"round {u}"
    finally:
        consumer.close()


def test_delete_records_moves_the_log_start_into_the_compacted_range(neve_factory):
    bootstrap, acked, kept, _ = compacted_topic(neve_factory, "trimmed")
    removed = gaps(acked, kept)
    # partition 0 from a removed offset with records still there before it, partition 1 from a
    # record still there; 2 and 3 untouched
    gap = next(r for r in removed if r[0] == 0 and any(q == 0 and o < r[1] for q, o, _, _ in kept))
    starts = {0: gap[1], 1: next(o for q, o, _, _ in kept if q == 1 and o > 0), 2: 0, 3: 0}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    done = admin.delete_records([TopicPartition("trimmed", 0, starts[0]), TopicPartition("trimmed", 1, starts[1])])
    assert sorted((tp.partition, f.result(TIMEOUT).low_watermark) for tp, f in done.items()) == [(0, starts[0]), (1, starts[1])]

    highs = {p: max(o for q, o, _, _ in acked if q == p) + 1 for p in range(PARTITIONS)}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"trimmed-{uuid.uuid4().hex[:8]}"})
    try:
        assert {p: consumer.get_watermark_offsets(TopicPartition("trimmed", p), timeout=TIMEOUT) for p in range(PARTITIONS)} == {p: (starts[p], highs[p]) for p in range(PARTITIONS)}
    finally:
        consumer.close()
    # from the beginning: the records still there at or after each log start; partition 0's
    # first is the one after the gap
    visible = [r for r in kept if r[1] >= starts[r[0]]]
    assert from_beginning(bootstrap, "trimmed") == visible
    beginning = Consumer({"bootstrap.servers": bootstrap, "group.id": f"begin-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"})
    try:
        beginning.subscribe(["trimmed"])
        firsts = {p: r[1] for p, r in first_records(beginning, PARTITIONS).items()}
    finally:
        beginning.close()
    assert firsts == {0: gap[2], 1: starts[1], 2: 0, 3: 0}

    # compaction goes on past the new log start: updating a key on each side of it in partition 0
    # removes the key's record after it (the one before it was hidden already)
    before = next(r for r in kept if r[0] == 0 and r[1] < starts[0])
    after = next(r for r in kept if r[0] == 0 and r[1] > starts[0])
    again = produce_round(bootstrap, "trimmed", [(before[2], b"again-before"), (after[2], b"again-after")], int(time.time() * 1000))
    want = sorted([*(r for r in visible if r != after), *again], key=lambda r: (r[0], r[1]))
    deadline = time.monotonic() + WAIT_S
    while (got := from_beginning(bootstrap, "trimmed")) != want:
        assert set(want) <= set(got), f"records missing from the Kafka view: {sorted(set(want) - set(got))}"
        assert time.monotonic() < deadline, f"the Kafka view still holds {got} after {WAIT_S} s"
        time.sleep(0.5)


def test_a_committed_offset_at_records_removed_before_the_end_resumes_at_the_last_record(neve_factory):
    """A partition's compacted range ending in a superseded value and then its key's tombstone,
    past delete.retention.ms: the value is removed, the tombstone stays while it is the
    partition's last record (as Kafka's newest record, in its active segment, is never cleaned),
    so no consumer is left below the high watermark; a group committed at the removed offset, or
    at the tombstone, reads on from the tombstone, not from the log start."""
    node = neve_factory(env=node_env(free_port()))
    create(node.bootstrap, "tail", **{"delete.retention.ms": "1000"})
    values = produce_round(node.bootstrap, "tail", [(key(k), b"v-%03d" % k) for k in range(2 * PARTITIONS)], int(time.time() * 1000))
    tombstones = produce_round(node.bootstrap, "tail", [(key(k), None) for k in range(PARTITIONS, 2 * PARTITIONS)], int(time.time() * 1000))
    kept = [r for r in values if r[2] < key(PARTITIONS)]
    wait_for_view(node.bootstrap, "tail", sorted(kept + tombstones))
    # per partition: offset 0 kept, 1 (a superseded value) removed, 2 (its tombstone) the last
    assert sorted((p, o) for p, o, _, _ in values + tombstones) == [(p, o) for p in range(PARTITIONS) for o in range(3)]
    assert sorted((p, o) for p, o, _, _ in kept) == [(p, 0) for p in range(PARTITIONS)]
    committed = {0: 1, 1: 1, 2: 2, 3: 2}
    group = f"tail-{uuid.uuid4().hex[:8]}"
    committer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        committer.commit(offsets=[TopicPartition("tail", p, o) for p, o in committed.items()], asynchronous=False)
    finally:
        committer.close()
    # `earliest`: a reset (the committed offset taken as out of range) would read offset 0 again
    resumed = Consumer({"bootstrap.servers": node.bootstrap, "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        resumed.subscribe(["tail"])
        assert first_records(resumed, PARTITIONS) == {r[0]: r for r in tombstones}
    finally:
        resumed.close()


def test_max_timestamp_finds_the_record_still_there_with_the_largest_timestamp(neve_factory):
    """ListOffsets MAX_TIMESTAMP (KIP-734) after compaction: as Kafka's cleaner recomputes a
    rebuilt batch's max timestamp from the records it keeps, the answer is the record still there
    with the largest timestamp, not a removed one's (nor none)."""
    node = neve_factory(env=node_env(free_port()))
    create(node.bootstrap, "latest", **{"delete.retention.ms": "3600000"})
    now = int(time.time() * 1000)
    # partition 0: key 0 at now + 1 h (offset 0), key 4 at now - 1 s (1), key 0 again at now (2)
    ahead = produce_round(node.bootstrap, "latest", [(key(0), b"ahead")], now + 3_600_000)
    before = produce_round(node.bootstrap, "latest", [(key(4), b"before")], now - 1000)
    again = produce_round(node.bootstrap, "latest", [(key(0), b"now")], now)
    assert [r[1] for r in ahead + before + again] == [0, 1, 2]
    wait_for_view(node.bootstrap, "latest", [*before, *again])
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    asked = {TopicPartition("latest", 0): OffsetSpec.max_timestamp(), TopicPartition("latest", 1): OffsetSpec.max_timestamp()}
    found = {tp.partition: (f.result(TIMEOUT).offset, f.result(TIMEOUT).timestamp) for tp, f in admin.list_offsets(asked).items()}
    # key 0's update (offset 2) has the largest timestamp still there; partition 1 has no record
    assert found == {0: (2, now), 1: (-1, -1)}

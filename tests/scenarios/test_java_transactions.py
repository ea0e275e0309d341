"""Transactions with the stock Java client (kafka-clients 3.9.1) against `neve dev`:
- a transactional producer commits, aborts and commits over three partitions of two topics, then
  leaves a fourth transaction open: read_committed reads exactly the committed records with
  their offsets, `endOffsets` under read_committed is the last stable offset (the open
  transaction's first offset), read_uncommitted reads every record; once the fourth commits,
  read_committed reads it too;
- consume-transform-produce in a consumer group with sendOffsetsToTransaction, some transactions
  aborted and retried, and a second instance with the same transactional id started mid-stream:
  the first is fenced, the output holds each input record exactly once, in input order per
  partition, and the group's committed offsets reach the input's end."""

from __future__ import annotations

import uuid
from collections import defaultdict

from tests.clients.java_client import Record, consume, produce, transform, txn_produce_open, txn_records

from .test_transactions import LINGER, PARTITIONS, create_topics

READ_COMMITTED = {"isolation.level": "read_committed"}
TIMEOUT = 120.0


def by_partition(records) -> dict[int, list[Record]]:
    out: dict[int, list[Record]] = defaultdict(list)
    for r in records:
        out[r.partition].append(r)
    return dict(out)


def test_commit_abort_commit_then_an_open_transaction(java_client, neve_factory, artifacts_dir):
    node = neve_factory(env=LINGER)
    topics = [f"jtxn-a-{uuid.uuid4().hex[:6]}", f"jtxn-b-{uuid.uuid4().hex[:6]}"]
    create_topics(node.bootstrap, *topics)
    producer = txn_produce_open(node.bootstrap, topics, PARTITIONS, f"jtid-{uuid.uuid4().hex[:6]}", "c30,a30,c30", 12, artifacts_dir / "txn-produce.log")
    sent = txn_records(producer.wait_for(lambda lines: "opened" in lines, TIMEOUT))
    assert [r.outcome for r in sent] == ["committed"] * 30 + ["aborted"] * 30 + ["committed"] * 30
    for topic in topics:
        committed = [Record(r.partition, r.offset, r.value) for r in sent if r.topic == topic and r.outcome == "committed"]
        everything = [r for r in sent if r.topic == topic]
        got = consume(node.bootstrap, topic, PARTITIONS, expect=len(committed), config=READ_COMMITTED, log_path=artifacts_dir / "consume.log")
        assert sorted(got.records, key=lambda r: (r.partition, r.offset)) == sorted(committed, key=lambda r: (r.partition, r.offset))
        assert by_partition(got.records) == by_partition(sorted(committed, key=lambda r: (r.partition, r.offset)))  # in order
        # the last stable offset: after the third transaction's marker, where the open one starts
        for p in range(PARTITIONS):
            third = max(r.offset for r in everything if r.partition == p)
            assert got.end_offsets[p] == third + 2, (topic, p)
        uncommitted = consume(node.bootstrap, topic, PARTITIONS, expect=len(everything) + 6, log_path=artifacts_dir / "consume.log")
        values = sorted(r.value for r in uncommitted.records)
        assert values == sorted([r.value for r in everything] + [f"t3-{i}" for i in range(12) if i % 2 == topics.index(topic)])
    producer.send_line()
    lines = producer.finish(TIMEOUT)
    assert lines[-1] == "done"
    final = txn_records(lines)
    for topic in topics:
        committed = sorted((Record(r.partition, r.offset, r.value) for r in final if r.topic == topic and r.outcome == "committed"), key=lambda r: (r.partition, r.offset))
        got = consume(node.bootstrap, topic, PARTITIONS, expect=len(committed), config=READ_COMMITTED, log_path=artifacts_dir / "consume.log")
        assert by_partition(got.records) == by_partition(committed)
        for p in range(PARTITIONS):
            assert got.end_offsets[p] == max(r.offset for r in final if r.topic == topic and r.partition == p) + 2  # the high watermark, after its marker


def test_consume_transform_produce_exactly_once_with_a_fenced_instance(java_client, neve_factory, artifacts_dir):
    node = neve_factory(env=LINGER)
    source, sink = f"jsrc-{uuid.uuid4().hex[:6]}", f"jsink-{uuid.uuid4().hex[:6]}"
    create_topics(node.bootstrap, source, sink)
    produce(node.bootstrap, source, 600, PARTITIONS, log_path=artifacts_dir / "produce.log")
    inputs = consume(node.bootstrap, source, PARTITIONS, expect=600, log_path=artifacts_dir / "consume.log")
    group, tid = f"jgroup-{uuid.uuid4().hex[:6]}", f"jtid-{uuid.uuid4().hex[:6]}"

    first = transform(node.bootstrap, source, sink, PARTITIONS, group, tid, artifacts_dir / "transform-1.log", abort_every=3, hold_after=4)
    first.wait_for(lambda lines: "holding" in lines, TIMEOUT)
    second = transform(node.bootstrap, source, sink, PARTITIONS, group, tid, artifacts_dir / "transform-2.log", abort_every=4)
    second.wait_for(lambda lines: any(line.startswith("txn ") for line in lines), TIMEOUT)  # initialized: the first is fenced
    first.send_line()
    first_lines = first.finish(TIMEOUT)
    assert first_lines[-1].startswith("fenced"), first_lines[-3:]
    second_lines = second.finish(TIMEOUT)
    assert second_lines[-1] == "done"
    assert any(" aborted " in line for line in first_lines + second_lines)

    output = consume(node.bootstrap, sink, PARTITIONS, expect=600, config=READ_COMMITTED, log_path=artifacts_dir / "consume.log")
    # each input record exactly once, in input order, in the same partition
    assert {p: [r.value for r in rs] for p, rs in by_partition(output.records).items()} == {p: [r.value for r in rs] for p, rs in by_partition(inputs.records).items()}

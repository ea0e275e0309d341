"""Transactions with the stock Java client (kafka-clients 3.9.1) against `neve dev`:
- a transactional producer commits, aborts and commits over three partitions of two topics, then
  leaves a fourth transaction open: read_committed reads exactly the committed records with
  their offsets, `endOffsets` under read_committed is the last stable offset (the open
  transaction's first offset), read_uncommitted reads every record; once the fourth commits,
  read_committed reads it too;
- consume-transform-produce in a consumer group with sendOffsetsToTransaction, some transactions
  aborted and retried, and a second instance with the same transactional id started mid-stream:
  the first is fenced, the output holds each input record exactly once, in input order per
  partition, and the group's committed offsets reach the input's end;
- a fenced producer that sends a record and then its offsets (sendOffsetsToTransaction) is told
  by every request neve receives (issue 42 finding 9: when its AddPartitionsToTxn is answered
  first, the client queues AddOffsetsToTxn and never sends it, and the call waits out
  max.block.ms: the client's doing, measured here by counting what reached the broker)."""

from __future__ import annotations

import urllib.request
import uuid
from collections import defaultdict

from bench.servers import parse_prometheus
from tests.clients.java_client import Record, consume, fenced_offsets, produce, transform, txn_produce_open, txn_records
from tests.fixtures import free_port

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


def test_a_fenced_producer_is_told_by_every_transactional_request_neve_receives(java_client, neve_factory, artifacts_dir):
    """Issue 42 finding 9. Per round, producer A inits, B inits with the same transactional id
    (fencing A), then A sends a record and at once its offsets. The Java client (3.9.1) sends one
    of its two queued requests first: AddOffsetsToTxn, answered PRODUCER_FENCED at once; or
    AddPartitionsToTxn, answered PRODUCER_FENCED too, which puts the client in its fatal state,
    where it sends nothing more and fails only its pending begin/commit/abort
    (TransactionManager.transitionToFatalError): the queued AddOffsetsToTxn is never sent and
    sendOffsetsToTransaction waits out max.block.ms. So: no round commits, and every round that
    was not told at once is one whose AddOffsetsToTxn never reached the broker."""
    port = free_port()
    node = neve_factory(env={**LINGER, "NEVE_BROKER_METRICS_PORT": str(port)})
    topic = f"jfenced-{uuid.uuid4().hex[:6]}"
    create_topics(node.bootstrap, topic)
    rounds = fenced_offsets(node.bootstrap, topic, "g", f"jtid-{uuid.uuid4().hex[:6]}", 12, 3_000, artifacts_dir / "fenced-offsets.log")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        metrics = parse_prometheus(r.read().decode())
    outcomes = [outcome for outcome, _ms, _error in rounds]
    assert len(rounds) == 12 and set(outcomes) <= {"fenced", "timeout"}, rounds
    assert all(error == "ProducerFencedException" for outcome, _ms, error in rounds if outcome == "fenced"), rounds
    assert all(error.endswith("while_awaiting_AddOffsetsToTxn") for outcome, _ms, error in rounds if outcome == "timeout"), rounds
    assert metrics.get('neve_requests_total{api="AddOffsetsToTxn"}', 0) == outcomes.count("fenced"), (rounds, {k: v for k, v in metrics.items() if k.startswith("neve_requests_total")})

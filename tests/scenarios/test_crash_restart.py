"""Durability across restarts of one `neve dev` node on the same data dir.

(a) kill -9 while a librdkafka producer (acks=all) is producing steadily: after the restart every
acknowledged record is at its acknowledged offset, every record present is byte-identical to one
that was produced (no torn or foreign records, no duplicates), offsets are contiguous from 0, and
new records continue right after the old ones. (b) a clean stop (SIGINT, exit code 0) and a
restart keep every record at the same offset."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from tests.scenarios.records import create_topic

PARTITIONS = 3
LINGER = {"NEVE_WAL_LINGER_MS": "20"}
ACKED_BEFORE_KILL = 3000
LOG = logging.getLogger("tests.scenarios.crash_restart")  # librdkafka logs, captured by pytest
DEADLINE = 60.0


@dataclass(frozen=True, slots=True)
class Read:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def value_of(seq: int) -> bytes:
    """A self-describing value: a torn or foreign record cannot pass for a produced one."""
    body = f"rec-{seq:08d}-".encode()
    return body + bytes((seq * 7 + i) % 251 for i in range(100 + seq % 400))


def partition_of(seq: int) -> int:
    return seq % PARTITIONS


def _logger(path: Path, name: str) -> tuple[logging.Logger, logging.Handler]:
    logger = logging.getLogger(name)
    logger.propagate = False
    handler = logging.FileHandler(path)
    logger.addHandler(handler)
    return logger, handler


def read_all(bootstrap: str, topic: str, log_dir: Path) -> tuple[list[Read], dict[int, int]]:
    """Every record of every partition up to its high watermark, and the high watermarks."""
    logger, handler = _logger(log_dir / "consumer.log", f"consumer.{topic}.{time.monotonic()}")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"crash-{topic}",  # required by the client; assign() never joins it
            "enable.auto.commit": False,
            "logger": logger,
        }
    )
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in range(PARTITIONS)}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        out: list[Read] = []
        seen = {p: 0 for p in range(PARTITIONS)}
        deadline = time.monotonic() + DEADLINE
        while any(seen[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                assert msg.error() is None, f"consume error: {msg.error()}"
                if msg.offset() < ends[msg.partition()]:
                    out.append(Read(msg.partition(), msg.offset(), msg.key(), msg.value()))
                    seen[msg.partition()] += 1
        assert all(seen[p] == ends[p] for p in ends), f"read {seen} records per partition, high watermarks {ends}"
        return out, ends
    finally:
        consumer.close()
        logger.removeHandler(handler)
        handler.close()


def check_contiguous(reads: list[Read]) -> dict[int, list[Read]]:
    per: dict[int, list[Read]] = {p: [] for p in range(PARTITIONS)}
    for r in reads:
        per[r.partition].append(r)
    for p, rs in per.items():
        offsets = [r.offset for r in rs]
        assert offsets == list(range(len(rs))), f"partition {p}: offsets not contiguous from 0 (first: {offsets[:5]}, len {len(rs)})"
    return per


class SteadyProducer(threading.Thread):
    """Produces value_of(0), value_of(1), ... until stopped, recording every acknowledgement.
    On stop it purges what is still queued or in flight, so nothing can be retried into the
    restarted node: what is on disk then is exactly what the killed node committed."""

    def __init__(self, bootstrap: str, topic: str, log_path: Path, ack_target: int) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.acked: dict[int, tuple[int, int]] = {}  # seq -> (partition, offset)
        self.failed: dict[int, KafkaError] = {}
        self.produced = 0
        self.ack_target = ack_target
        self.reached = threading.Event()
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.logger, self.handler = _logger(log_path, f"producer.{topic}")
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 5,
                "batch.num.messages": 200,  # many small requests in flight at the kill
                "message.timeout.ms": 30000,
                "logger": self.logger,
            }
        )

    def _report(self, err, msg) -> None:
        seq = int(msg.value()[4:12])
        if err is None:
            self.acked[seq] = (msg.partition(), msg.offset())
            if len(self.acked) >= self.ack_target:
                self.reached.set()
        else:
            self.failed[seq] = err

    def run(self) -> None:
        try:
            seq = 0
            while not self.stopping.is_set():
                try:
                    self.producer.produce(self.topic, value=value_of(seq), key=str(seq).encode(), partition=partition_of(seq), on_delivery=self._report)
                    seq += 1
                    self.produced = seq
                except BufferError:
                    self.producer.poll(0.01)
                self.producer.poll(0)
            self.producer.purge(in_queue=True, in_flight=True)
            self.producer.flush(10)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.logger.removeHandler(self.handler)
            self.handler.close()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_kill9_during_production_keeps_acknowledged_records(neve_factory, artifacts_dir: Path) -> None:
    node = neve_factory(env=LINGER)
    topic = create_topic(node.bootstrap, PARTITIONS, prefix="crash")
    producer = SteadyProducer(node.bootstrap, topic, artifacts_dir / "producer.log", ACKED_BEFORE_KILL)
    producer.start()
    try:
        assert producer.reached.wait(DEADLINE), f"only {len(producer.acked)} acknowledgements in {DEADLINE}s"
        node.kill9()
        acked_at_kill = len(producer.acked)
        produced_at_kill = producer.produced
    finally:
        producer.stopping.set()
        producer.join(30)
    assert not producer.is_alive() and producer.error is None, f"producer thread: {producer.error!r}"
    assert produced_at_kill > acked_at_kill, "nothing was in flight at the kill; the test proves nothing"
    acked = dict(producer.acked)

    node.start()
    reads, ends = read_all(node.bootstrap, topic, artifacts_dir)
    per = check_contiguous(reads)

    by_seq: dict[int, Read] = {}
    for r in reads:
        assert r.value is not None and r.value[:4] == b"rec-", f"partition {r.partition} offset {r.offset}: not a produced record: {r.value[:20]!r}"
        seq = int(r.value[4:12])
        assert r.value == value_of(seq), f"partition {r.partition} offset {r.offset}: value of record {seq} differs from what was produced"
        assert r.key == str(seq).encode(), f"partition {r.partition} offset {r.offset}: key {r.key!r} != {seq}"
        assert r.partition == partition_of(seq), f"record {seq} found in partition {r.partition}"
        assert seq not in by_seq, f"record {seq} stored twice: {by_seq[seq]} and {r}"
        by_seq[seq] = r
    lost = [(seq, where) for seq, where in acked.items() if seq not in by_seq]
    assert not lost, f"{len(lost)} acknowledged records missing after restart, e.g. {sorted(lost)[:5]}"
    moved = [(seq, where, (by_seq[seq].partition, by_seq[seq].offset)) for seq, where in acked.items() if (by_seq[seq].partition, by_seq[seq].offset) != where]
    assert not moved, f"{len(moved)} acknowledged records at another offset, e.g. (seq, acked, found) {moved[:5]}"
    # Per partition, records are in produce order (one producer, no retries across the restart).
    for p, rs in per.items():
        seqs = [int(r.value[4:12]) for r in rs]
        assert seqs == sorted(seqs), f"partition {p}: records out of produce order"

    # The restarted node continues each partition right after what it kept.
    tail = Producer({"bootstrap.servers": node.bootstrap, "acks": "all", "logger": LOG})
    tail_offsets: dict[int, int] = {}
    base = 10_000_000

    def on_tail(err, msg) -> None:
        tail_offsets[msg.partition()] = -1 if err is not None else msg.offset()

    for p in range(PARTITIONS):
        tail.produce(topic, value=value_of(base + p), key=str(base + p).encode(), partition=p, on_delivery=on_tail)
    assert tail.flush(DEADLINE) == 0
    assert tail_offsets == ends, f"records after the restart landed at {tail_offsets}, expected the old ends {ends}"
    assert node.process.poll() is None


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_clean_stop_and_restart_keeps_offsets(neve_factory, artifacts_dir: Path) -> None:
    node = neve_factory(env=LINGER)
    topic = create_topic(node.bootstrap, PARTITIONS, prefix="stop")
    count = 3000
    acked: dict[int, tuple[int, int]] = {}
    failures: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            acked[int(msg.value()[4:12])] = (msg.partition(), msg.offset())

    producer = Producer({"bootstrap.servers": node.bootstrap, "acks": "all", "linger.ms": 5, "logger": LOG})
    for seq in range(count):
        producer.produce(topic, value=value_of(seq), key=str(seq).encode(), partition=partition_of(seq), on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(DEADLINE) == 0
    assert not failures and len(acked) == count, f"{len(acked)} acknowledged, failures {failures[:3]}"
    before, ends_before = read_all(node.bootstrap, topic, artifacts_dir)

    assert node.stop() == 0, f"neve exited with {node.process.returncode} on SIGINT"
    node.start()

    after, ends_after = read_all(node.bootstrap, topic, artifacts_dir)
    assert ends_after == ends_before == {p: sum(1 for s in range(count) if partition_of(s) == p) for p in range(PARTITIONS)}
    order = lambda r: (r.partition, r.offset)  # noqa: E731
    assert sorted(after, key=order) == sorted(before, key=order), "records differ after the restart"
    check_contiguous(after)
    found = {int(r.value[4:12]): (r.partition, r.offset) for r in after}
    assert found == acked, "records are not at their acknowledged offsets"
    assert all(r.value == value_of(int(r.value[4:12])) for r in after)

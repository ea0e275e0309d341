"""Each stock Python client × each compression codec against its own `neve dev`: 10,000 records
(keys, headers, values of 0 B..1 KiB plus five of 100 KiB, explicit partitions and timestamps)
over 3 partitions, produced with acks=all and read back by the same client from the beginning of
every partition. Exact check (tests/scenarios/records.py): same bytes, keys, headers, timestamps,
per-partition order, offsets contiguous from 0, each record where its producer was told it is,
and the partition ends at exactly the number of records produced."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from tests.scenarios.records import Got, Rec, create_topic, make_records, verify

COUNT = 10_000
PARTITIONS = 3
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
MAX_BYTES = 2 * 1024 * 1024  # producer request / consumer fetch limits: room for the 100 KiB values
DEADLINE = 60.0  # per phase; a healthy case takes a few seconds
LINGER = {"NEVE_WAL_LINGER_MS": "10"}


def _seed(client: str, codec: str) -> int:
    return sum(map(ord, client)) * 100 + CODECS.index(codec)


def _file_logger(name: str, path: Path) -> tuple[logging.Logger, logging.Handler]:
    logger = logging.getLogger(name)
    logger.propagate = False
    handler = logging.FileHandler(path)
    logger.addHandler(handler)
    return logger, handler


# --- confluent-kafka (librdkafka) -------------------------------------------------------------


def confluent_roundtrip(bootstrap: str, topic: str, records: list[Rec], codec: str, log_dir: Path) -> tuple[list[int], list[Got], dict[int, int]]:
    from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_CREATE_TIME, Consumer, Producer, TopicPartition

    logger, handler = _file_logger(f"librdkafka.{topic}", log_dir / f"librdkafka-{topic}.log")
    acked: list[int] = [-1] * len(records)
    failures: list[str] = []

    def on_delivery(i: int):
        def report(err, msg) -> None:
            if err is not None:
                failures.append(f"record {i}: {err}")
            else:
                acked[i] = msg.offset()

        return report

    try:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "compression.type": codec,
                "linger.ms": 5,
                "message.max.bytes": MAX_BYTES,
                "logger": logger,
            }
        )
        for i, r in enumerate(records):
            while True:
                try:
                    producer.produce(topic, value=r.value, key=r.key, partition=r.partition, timestamp=r.timestamp, headers=list(r.headers), on_delivery=on_delivery(i))
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        remaining = producer.flush(DEADLINE)
        assert remaining == 0, f"{remaining} records not acknowledged within {DEADLINE}s"
        assert not failures, f"{len(failures)} delivery failures, first: {failures[:3]}"

        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"roundtrip-{topic}",  # required by the client; assign() never joins it
                "enable.auto.commit": False,
                "max.partition.fetch.bytes": MAX_BYTES,
                "fetch.max.bytes": 4 * MAX_BYTES,
                "logger": logger,
            }
        )
        try:
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
            got: list[Got] = []
            deadline = time.monotonic() + DEADLINE
            while len(got) < len(records) and time.monotonic() < deadline:
                for msg in consumer.consume(1000, timeout=0.5):
                    if msg.error() is not None:
                        raise AssertionError(f"consume error: {msg.error()}")
                    ts_type, ts = msg.timestamp()
                    got.append(
                        Got(msg.partition(), msg.offset(), msg.key(), msg.value(), tuple(msg.headers() or ()), ts, ts_type == TIMESTAMP_CREATE_TIME)
                    )
            ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in range(PARTITIONS)}
        finally:
            consumer.close()
    finally:
        logger.removeHandler(handler)
        handler.close()
    return acked, got, ends


# --- aiokafka ---------------------------------------------------------------------------------


def aiokafka_roundtrip(bootstrap: str, topic: str, records: list[Rec], codec: str, log_dir: Path) -> tuple[list[int], list[Got], dict[int, int]]:
    return asyncio.run(asyncio.wait_for(_aiokafka(bootstrap, topic, records, codec), 2 * DEADLINE))


async def _aiokafka(bootstrap: str, topic: str, records: list[Rec], codec: str):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        compression_type=None if codec == "none" else codec,
        linger_ms=5,
        max_request_size=MAX_BYTES,
    )
    await producer.start()
    try:
        futures = []
        for r in records:
            futures.append(await producer.send(topic, value=r.value, key=r.key, partition=r.partition, timestamp_ms=r.timestamp, headers=list(r.headers)))
        metadata = await asyncio.wait_for(asyncio.gather(*futures), DEADLINE)
    finally:
        await producer.stop()
    acked = [m.offset for m in metadata]

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=MAX_BYTES,
        fetch_max_bytes=4 * MAX_BYTES,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        got: list[Got] = []
        deadline = time.monotonic() + DEADLINE
        while len(got) < len(records) and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            for tp, msgs in batches.items():
                for m in msgs:
                    got.append(Got(tp.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp, m.timestamp_type == 0))
        ends = {tp.partition: o for tp, o in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()
    return acked, got, ends


# --- kafka-python -----------------------------------------------------------------------------


def kafka_python_roundtrip(bootstrap: str, topic: str, records: list[Rec], codec: str, log_dir: Path) -> tuple[list[int], list[Got], dict[int, int]]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        compression_type=None if codec == "none" else codec,
        linger_ms=5,
        max_request_size=MAX_BYTES,
    )
    try:
        futures = [
            producer.send(topic, value=r.value, key=r.key, partition=r.partition, timestamp_ms=r.timestamp, headers=list(r.headers))
            for r in records
        ]
        producer.flush(DEADLINE)
        acked = [f.get(timeout=DEADLINE).offset for f in futures]
    finally:
        producer.close(timeout=10)

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=MAX_BYTES,
        fetch_max_bytes=4 * MAX_BYTES,
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        got: list[Got] = []
        deadline = time.monotonic() + DEADLINE
        while len(got) < len(records) and time.monotonic() < deadline:
            for tp, msgs in consumer.poll(timeout_ms=500, max_records=2000).items():
                for m in msgs:
                    got.append(Got(tp.partition, m.offset, m.key, m.value, tuple(m.headers or ()), m.timestamp, m.timestamp_type == 0))
        ends = {tp.partition: o for tp, o in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()
    return acked, got, ends


CLIENTS = {
    "confluent-kafka": confluent_roundtrip,
    "aiokafka": aiokafka_roundtrip,
    "kafka-python": kafka_python_roundtrip,
}


# kafka-python 3.0 loads its protocol schemas with importlib.resources.read_text, whose inner
# open_text call warns from inside importlib (so the kafka.* ignore in pyproject cannot match it).
@pytest.mark.filterwarnings("ignore:(open|read)_text is deprecated:DeprecationWarning")
@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("client", list(CLIENTS))
def test_roundtrip(client: str, codec: str, neve_factory, artifacts_dir: Path) -> None:
    node = neve_factory(env=LINGER)
    topic = create_topic(node.bootstrap, PARTITIONS, prefix=f"rt-{client}-{codec}")
    records = make_records(_seed(client, codec), COUNT, PARTITIONS)

    acked, got, ends = CLIENTS[client](node.bootstrap, topic, records, codec, artifacts_dir)

    verify(records, got, acked_offsets=acked)
    produced_per_partition = {p: sum(1 for r in records if r.partition == p) for p in range(PARTITIONS)}
    assert ends == produced_per_partition, "high watermarks differ from the records produced"
    assert node.process.poll() is None, "neve exited during the test"

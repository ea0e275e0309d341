"""compactor/rows/records.py on batches real clients made: confluent-kafka (librdkafka) with each codec
and the Java client's xerial-framed snappy, produced to `neve dev`, read back from the stopped
node's offset index and WAL objects, and compared with what each client was acknowledged."""

from __future__ import annotations

import dataclasses

import pytest

from tests.compactor.wal_source import decoded
from tests.scenarios.records import Rec, create_topic, make_records

pytestmark = pytest.mark.integration

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PARTITIONS = 2
COUNT = 1500
DEADLINE = 60.0


def produce(bootstrap: str, topic: str, records: list[Rec], codec: str) -> list[int]:
    from confluent_kafka import Producer

    acked = [-1] * len(records)
    failures: list[str] = []

    def on_delivery(i: int):
        def report(err, msg) -> None:
            if err is not None:
                failures.append(f"record {i}: {err}")
            else:
                acked[i] = msg.offset()

        return report

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "compression.type": codec, "linger.ms": 5, "message.max.bytes": 2 << 20, "enable.idempotence": True})
    for i, r in enumerate(records):
        while True:
            try:
                producer.produce(topic, value=r.value, key=r.key, partition=r.partition, timestamp=r.timestamp, headers=list(r.headers), on_delivery=on_delivery(i))
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(DEADLINE) == 0
    assert not failures, failures[:3]
    return acked


def test_every_codec_from_librdkafka(neve_factory):
    node = neve_factory(env={"NEVE_WAL_LINGER_MS": "5"})
    produced = {}
    for n, codec in enumerate(CODECS):
        # Values that compress: librdkafka sends a batch uncompressed when its codec would not shrink it.
        records = [dataclasses.replace(r, value=(r.value[:16] * (len(r.value) // 16 + 1))[: len(r.value)]) for r in make_records(seed=2100 + n, count=COUNT, partitions=PARTITIONS, big=1)]
        topic = create_topic(node.bootstrap, PARTITIONS, prefix=f"codec-{codec}")
        produced[codec] = (topic, records, produce(node.bootstrap, topic, records, codec))
    assert node.stop() == 0
    for codec, (topic, records, acked) in produced.items():
        batches = decoded(node.data_dir, topic)
        want = {(r.partition, offset): (r.timestamp, r.key, r.value, r.headers) for r, offset in zip(records, acked, strict=True)}
        got = {}
        for partition, partition_batches in batches.items():
            assert {b.codec_name for b in partition_batches} == {codec}, codec
            assert all(b.producer_id >= 0 and not b.is_control and not b.is_transactional for b in partition_batches)
            offsets = [r.offset for b in partition_batches for r in b.records]
            assert offsets == list(range(len(offsets))), f"{codec}: partition {partition} offsets not contiguous from 0"
            for b in partition_batches:
                assert b.records[0].offset == b.base_offset and b.records[-1].offset == b.last_offset
                got.update({(partition, r.offset): (r.timestamp, r.key, r.value, r.headers) for r in b.records})
        assert got == want, codec


def test_xerial_snappy_from_the_java_client(neve_factory, java_client, artifacts_dir):
    node = neve_factory(env={"NEVE_WAL_LINGER_MS": "5"})
    topic = create_topic(node.bootstrap, PARTITIONS, prefix="java-snappy")
    acks = java_client.produce(node.bootstrap, topic, 2000, PARTITIONS, config={"compression.type": "snappy", "linger.ms": "20"}, log_path=artifacts_dir / "java.log")
    assert len(acks) == 2000
    assert node.stop() == 0
    batches = decoded(node.data_dir, topic)
    # The driver sends record `seq` with key and value both str(seq), to partition seq % partitions.
    want = {(a.partition, a.offset): (str(a.seq).encode(), str(a.seq).encode()) for a in acks}
    got = {(p, r.offset): (r.key, r.value) for p, bs in batches.items() for b in bs for r in b.records}
    assert got == want
    assert {b.codec_name for bs in batches.values() for b in bs} == {"snappy"}
    assert any(b.record_count > 1 for bs in batches.values() for b in bs)

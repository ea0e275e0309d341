"""ListOffsets (earliest, latest, max timestamp, by timestamp) and Fetch long polling.

By timestamp the answer is the first offset whose record timestamp is at or after the target, or
-1 when there is none; checked at exact offsets over several WAL objects, in an uncompressed and a
zstd-compressed partition, and in a partition whose timestamps go back and forth. Long poll: a
fetch parked on an empty tail returns as soon as a record is committed (well before its max
wait), and one with nothing to return answers at about its max wait, empty."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.fetch import FetchRequest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from tests.scenarios.records import LOG, create_topic

LINGER = {"NEVE_WAL_LINGER_MS": "20"}
T0 = 1_700_000_000_000
STEP = 10  # ms between consecutive records' timestamps in the monotonic partitions
GROUPS, PER_GROUP = 3, 100  # each group is flushed on its own: several WAL objects and index entries
N = GROUPS * PER_GROUP
JUMPY = [5000, 1000, 3000, 7000, 2000, 6000]  # partition 2's timestamps, relative to T0


def _produce(bootstrap: str, topic: str) -> None:
    """Partition 0 uncompressed and partition 1 zstd: record i at T0 + STEP*i, flushed in groups;
    partition 2: the JUMPY timestamps."""
    plain = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "logger": LOG})
    zstd = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "compression.type": "zstd", "logger": LOG})
    failures: list[str] = []

    def report(err, msg) -> None:
        if err is not None:
            failures.append(str(err))

    for g in range(GROUPS):
        for i in range(g * PER_GROUP, (g + 1) * PER_GROUP):
            plain.produce(topic, value=b"p0-%d" % i, partition=0, timestamp=T0 + STEP * i, on_delivery=report)
            zstd.produce(topic, value=b"p1-%d" % i * 20, partition=1, timestamp=T0 + STEP * i, on_delivery=report)
        assert plain.flush(30) == 0 and zstd.flush(30) == 0
    for i, ts in enumerate(JUMPY):
        plain.produce(topic, value=b"p2-%d" % i, partition=2, timestamp=T0 + ts, on_delivery=report)
        assert plain.flush(30) == 0  # one batch per record: the index entries disagree in order too
    assert not failures, failures


def expected_monotonic(target: int) -> int:
    """First i with T0 + STEP*i >= target, or -1."""
    for i in range(N):
        if T0 + STEP * i >= target:
            return i
    return -1


def expected_jumpy(target: int) -> int:
    return next((i for i, ts in enumerate(JUMPY) if T0 + ts >= target), -1)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_list_offsets_by_timestamp_earliest_latest(neve_factory) -> None:
    node = neve_factory(env=LINGER)
    topic = create_topic(node.bootstrap, 3, prefix="lo")
    _produce(node.bootstrap, topic)

    last = T0 + STEP * (N - 1)
    targets = [0, T0 - 1, T0, T0 + 1, T0 + STEP * 99, T0 + STEP * 99 + 5, T0 + STEP * 100, T0 + STEP * 100 - 1, T0 + STEP * 150 + 3, T0 + STEP * 200 + 9, last - 1, last, last + 1, last + 10**9]
    jumpy_targets = [0, T0, T0 + 1000, T0 + 1001, T0 + 2000, T0 + 4000, T0 + 5000, T0 + 5500, T0 + 6001, T0 + 7000, T0 + 7001]

    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": f"lo-{topic}", "enable.auto.commit": False, "logger": LOG})
    try:
        # One timestamp per call: a partition listed twice in one request gets one answer.
        def offset_at(p: int, t: int) -> tuple[int, object]:
            (answer,) = consumer.offsets_for_times([TopicPartition(topic, p, t)], timeout=30)
            return answer.offset, answer.error

        for p in (0, 1):
            got = [(t, *offset_at(p, t)) for t in targets]
            assert got == [(t, expected_monotonic(t), None) for t in targets], f"partition {p}: (timestamp, offset, error)"
        got = [(t, *offset_at(2, t)) for t in jumpy_targets]
        assert got == [(t, expected_jumpy(t), None) for t in jumpy_targets], "partition 2: (timestamp, offset, error)"

        for p, n in ((0, N), (1, N), (2, len(JUMPY))):
            assert consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False) == (0, n)
    finally:
        consumer.close()

    admin = AdminClient({"bootstrap.servers": node.bootstrap, "logger": LOG})
    specs = {
        ("earliest", 0): OffsetSpec.earliest(),
        ("latest", 0): OffsetSpec.latest(),
        ("latest", 2): OffsetSpec.latest(),
        ("max_timestamp", 0): OffsetSpec.max_timestamp(),
        ("max_timestamp", 2): OffsetSpec.max_timestamp(),
        ("timestamp", 1): OffsetSpec.for_timestamp(T0 + STEP * 150 + 3),
    }
    results = {}
    for (name, p), spec in specs.items():
        future = admin.list_offsets({TopicPartition(topic, p): spec}, request_timeout=30)[TopicPartition(topic, p)]
        info = future.result(timeout=30)
        results[(name, p)] = (info.offset, info.timestamp)
    assert results == {
        ("earliest", 0): (0, -1),
        ("latest", 0): (N, -1),
        ("latest", 2): (len(JUMPY), -1),
        ("max_timestamp", 0): (N - 1, last),
        ("max_timestamp", 2): (JUMPY.index(max(JUMPY)), T0 + max(JUMPY)),
        ("timestamp", 1): (151, T0 + STEP * 151),
    }


# --- long poll ---------------------------------------------------------------------------------


def _partition_of(response, topic: str, partition: int) -> tuple[int, int, bytes]:
    """(error code, high watermark, records) of one partition in an aiokafka Fetch response."""
    for name, partitions in response.topics:
        if name == topic:
            for p in partitions:
                if p[0] == partition:
                    return p[1], p[2], p[-1] or b""
    raise AssertionError(f"{topic}/{partition} missing from the fetch response")


async def _client(bootstrap: str, topic: str) -> tuple[AIOKafkaClient, int]:
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await client.bootstrap()
    client.add_topic(topic)
    await client.force_metadata_update()
    leader = client.cluster.leader_for_partition(AioTopicPartition(topic, 0))
    assert leader is not None and leader >= 0, f"no leader for {topic}/0 in metadata"
    return client, leader


def _fetch(topic: str, offset: int, max_wait_ms: int) -> FetchRequest:
    return FetchRequest(max_wait_ms, 1, 1024 * 1024, 0, [(topic, [(0, offset, 1024 * 1024)])])


@pytest.mark.integration
@pytest.mark.timeout(120)
async def test_long_poll_wakes_on_new_data(neve_factory) -> None:
    node = neve_factory(env=LINGER)
    topic = create_topic(node.bootstrap, 1, prefix="lp")
    client, leader = await _client(node.bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=node.bootstrap, acks="all", linger_ms=0)
    await producer.start()
    try:
        for round_ in range(3):  # the first on an empty partition, then at the tail of a non-empty one
            started = time.monotonic()
            pending = asyncio.ensure_future(client.send(leader, _fetch(topic, round_, 10_000)))
            # Parked: no answer within a second (there is nothing to return).
            done, _ = await asyncio.wait({pending}, timeout=1.0)
            assert not done, f"round {round_}: fetch at the tail answered after {time.monotonic() - started:.2f}s instead of waiting: {pending.result()}"
            meta = await producer.send_and_wait(topic, value=b"wake-%d" % round_, partition=0)
            acked = time.monotonic()
            assert meta.offset == round_
            response = await asyncio.wait_for(pending, 15)
            arrived = time.monotonic()
            error, high_watermark, records = _partition_of(response, topic, 0)
            assert (error, high_watermark) == (0, round_ + 1)
            assert b"wake-%d" % round_ in records, f"round {round_}: the new record is not in the response"
            assert arrived - acked < 3.0, f"round {round_}: fetch returned {arrived - acked:.2f}s after the produce was acknowledged (max wait 10 s): not woken by the commit"
    finally:
        await producer.stop()
        await client.close()


@pytest.mark.integration
@pytest.mark.timeout(120)
async def test_empty_fetch_returns_at_max_wait(neve_factory) -> None:
    node = neve_factory(env=LINGER)
    topic = create_topic(node.bootstrap, 1, prefix="lpe")
    client, leader = await _client(node.bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=node.bootstrap, acks="all")
    await producer.start()
    try:
        durations = []
        for offset in (0, 0, 1):  # empty partition twice, then the tail after one record
            if offset == 1:
                assert (await producer.send_and_wait(topic, value=b"one", partition=0)).offset == 0
            started = time.monotonic()
            response = await asyncio.wait_for(client.send(leader, _fetch(topic, offset, 500)), 10)
            elapsed = time.monotonic() - started
            durations.append(round(elapsed, 3))
            assert _partition_of(response, topic, 0) == (0, offset, b""), f"fetch at offset {offset}: {response}"
            assert 0.4 <= elapsed <= 3.0, f"empty fetch with max_wait 500 ms returned after {elapsed:.3f}s"
    finally:
        await producer.stop()
        await client.close()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_consumer_long_poll_gets_new_record_quickly(neve_factory) -> None:
    """The same through librdkafka's consumer with fetch.wait.max.ms=10000."""
    node = neve_factory(env=LINGER)
    topic = create_topic(node.bootstrap, 1, prefix="lpc")
    consumer = Consumer(
        {
            "bootstrap.servers": node.bootstrap,
            "group.id": f"lpc-{topic}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10_000,
            "logger": LOG,
        }
    )
    producer = Producer({"bootstrap.servers": node.bootstrap, "acks": "all", "linger.ms": 0, "logger": LOG})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        for round_ in range(3):
            # Nothing arrives for a second: the consumer's fetch is parked at the tail.
            assert consumer.poll(1.0) is None
            offsets: list[int] = []
            producer.produce(topic, value=b"tick-%d" % round_, partition=0, on_delivery=lambda err, msg, offsets=offsets: offsets.append(-1 if err else msg.offset()))
            assert producer.flush(10) == 0 and offsets == [round_]
            acked = time.monotonic()
            msg = consumer.poll(10.0)
            arrived = time.monotonic()
            assert msg is not None and msg.error() is None, f"round {round_}: no record within 10 s: {msg and msg.error()}"
            assert (msg.offset(), msg.value()) == (round_, b"tick-%d" % round_)
            assert arrived - acked < 3.0, f"round {round_}: record reached the consumer {arrived - acked:.2f}s after its acknowledgement (fetch.wait.max.ms 10 s)"
    finally:
        consumer.close()

"""Kafka reads of compacted offsets are served from the table's Parquet files (issue 22): `neve dev`
with records confluent-kafka produced through every codec (raw, Avro from its AvroSerializer,
tombstones, malformed values), fetched as raw batches from offset 0 while they are in the WAL, then
compacted, then the WAL objects deleted, then fetched again: every batch is the same batch (base
offset, producer id, epoch, base sequence, timestamp type, timestamps, control and transactional
flags, every record's offset, timestamp, key, value bytes and headers), only its compression may
differ. Fetches positioned mid-batch, and across the boundary between compacted and WAL entries,
are answered with exactly the right batches."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from compactor.rows.records import Batch, decode_records, iter_batches
from metadata.model import ObjectType
from tests.clients.java_client import consume_bytes
from tests.compactor.produced import PARTITIONS, Produced, Want, produce
from tests.compactor.test_service import WAIT_S, consume_all, index_types, node_env, produce_both, wait_for_table
from tests.fixtures import free_port
from tests.raw import Raw, fetch_v12
from wal.batch import BATCH_HEADER, LOG_OVERHEAD

Fetched = dict[int, list[Batch]]  # partition -> batches in offset order


def fetch_batches(port: int, topic: str, offset: int = 0, partitions: range = range(PARTITIONS)) -> Fetched:
    """Every batch of each partition from `offset` to its high watermark, fetch after fetch."""
    raw = Raw(port)
    out: Fetched = {}
    try:
        for p in partitions:
            batches: list[Batch] = []
            at = offset
            while True:
                cid = raw.request(fetch_v12(topic, p, at, 0))
                part = raw.response(1, 12, cid).responses[0].partitions[0]
                assert part.error_code == 0, (p, at, part.error_code)
                got = served(part.records or b"")
                for b in got:
                    if not batches or b.base_offset > batches[-1].base_offset:
                        batches.append(b)
                if not got or got[-1].last_offset + 1 >= part.high_watermark:
                    break
                at = got[-1].last_offset + 1
            out[p] = batches
    finally:
        raw.close()
    return out


def served(data: bytes) -> list[Batch]:
    """The batches of a fetch response's records, each with the base offset it was served with
    and its records decoded."""
    out = []
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        base, length = BATCH_HEADER.unpack_from(view, pos)[:2]
        one = view[pos : pos + LOG_OVERHEAD + length]
        (batch,) = iter_batches(one, base)
        batch.records = decode_records(one, batch)
        out.append(batch)
        pos += len(one)
    return out


def comparable(batches: Fetched) -> dict[int, list[Batch]]:
    """Each batch as everything a consumer sees of it: its compression (and so its size) aside."""
    return {p: [replace(b, attributes=b.attributes & ~0x07, size=0, position=0, index=0) for b in bs] for p, bs in batches.items()}


def offsets_for_times(port: int, topic: str, batches: Fetched) -> dict[tuple[int, int], int]:
    """ListOffsets by timestamp for a spread of each partition's record timestamps, one before the
    oldest and one past the newest: (partition, timestamp) -> offset (-1 past the end)."""
    from tests.broker.test_fetch_read_failures import list_offsets

    raw = Raw(port)
    out = {}
    try:
        for p, bs in batches.items():
            stamps = sorted({r.timestamp for b in bs for r in b.records})
            for t in [stamps[0] - 1, *stamps[:: max(1, len(stamps) // 25)], stamps[-1], stamps[-1] + 1]:
                ((_, error, offset, _),) = list_offsets(raw, topic, {p: t})
                assert error == 0
                out[(p, t)] = offset
    finally:
        raw.close()
    return out


def records_of(batches: Fetched) -> list[tuple]:
    """(partition, offset, timestamp type, timestamp, key, value, headers) of every record."""
    return sorted((p, r.offset, b.timestamp_type, r.timestamp, r.key, r.value, tuple(r.headers)) for p, bs in batches.items() for b in bs for r in b.records)


async def aiokafka_records(bootstrap: str, topic: str) -> list[tuple]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, check_crcs=True)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        out = []
        async with asyncio.timeout(WAIT_S):
            while any([await consumer.position(tp) < end[tp] for tp in tps]):
                for tp, msgs in (await consumer.getmany(timeout_ms=1000)).items():
                    out += [(tp.partition, m.offset, m.timestamp_type, m.timestamp, m.key, m.value, tuple(m.headers)) for m in msgs]
        return sorted(out)
    finally:
        await consumer.stop()


def wal_objects(data_dir: Path) -> list[Path]:
    return sorted(p for p in (data_dir / "objects" / "wal").rglob("*") if p.is_file())


def test_compacted_offsets_are_served_from_the_table_batch_for_batch(neve_factory):
    registry_port = free_port()
    node = neve_factory(env=node_env(registry_port, NEVE_COMPACTOR_IN_NODE="false"))
    produced: list[Produced] = produce_both(node, registry_port)
    before = {p.topic: fetch_batches(node.port, p.topic) for p in produced}
    times_before = {p.topic: offsets_for_times(node.port, p.topic, before[p.topic]) for p in produced}
    for times in times_before.values():
        assert -1 in times.values() and 0 in times.values() and len(set(times.values())) > 10
    for p in produced:
        assert sum(len(b.records) for bs in before[p.topic].values() for b in bs) == len(p.want)

    node.env["NEVE_COMPACTOR_IN_NODE"] = "true"
    node.restart()
    data_dir = Path(node.data_dir).resolve()
    for p in produced:
        wait_for_table(data_dir, p)
    assert node.stop() == 0
    for p in produced:
        assert index_types(data_dir, p.topic) == {ObjectType.PARQUET}
    # Nothing but the manifests names these any more: without them, every read is from the table.
    removed = wal_objects(data_dir)
    assert removed
    for path in removed:
        path.unlink()

    node.env["NEVE_COMPACTOR_IN_NODE"] = "false"
    node.start()
    for p in produced:
        after = fetch_batches(node.port, p.topic)
        assert comparable(after) == comparable(before[p.topic])
        # compression.type=producer: each batch rebuilt with its own codec
        assert [b.codec for bs in after.values() for b in bs] == [b.codec for bs in before[p.topic].values() for b in bs]

        # mid-batch: the batch holding the offset comes first, whole
        for partition, batches in before[p.topic].items():
            for b in batches:
                if b.last_offset > b.base_offset:
                    mid = fetch_batches(node.port, p.topic, b.base_offset + 1, range(partition, partition + 1))[partition]
                    assert comparable({0: mid}) == comparable({0: [x for x in batches if x.base_offset >= b.base_offset]})
                    break

    # ListOffsets by timestamp finds the same offsets in the table's rows
    for p in produced:
        assert offsets_for_times(node.port, p.topic, before[p.topic]) == times_before[p.topic]

    # stock clients decode the rebuilt batches (every codec, CRCs checked) into the same records
    for p in produced:
        want = records_of(before[p.topic])
        assert sorted(consume_bytes(node.bootstrap, p.topic, PARTITIONS, log_path=Path(node.log_path).with_suffix(".java.log"))) == want
        assert asyncio.run(aiokafka_records(node.bootstrap, p.topic)) == want
        by_librdkafka = consume_all(node.bootstrap, p.topic, p.counts())  # (key, value, headers, timestamp)
        assert sorted((part, o, 0, ts, k, v, tuple(h)) for (part, o), (k, v, h, ts) in by_librdkafka.items()) == want

    # a topic's compression.type other than `producer`: every rebuilt batch in that codec
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    for p in produced:
        zstd = ConfigResource(ResourceType.TOPIC, p.topic, incremental_configs=[ConfigEntry("compression.type", "zstd", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([zstd])[zstd].result(60)
        after = fetch_batches(node.port, p.topic)
        assert comparable(after) == comparable(before[p.topic])
        assert {b.codec for bs in after.values() for b in bs} == {4}

    # across the boundary: new records in the WAL after the compacted ones
    p = produced[0]
    more: dict = {}
    produce(node.bootstrap, p.topic, "lz4", [(j % PARTITIONS, Want("lz4", b"more", [], 1_700_000_000_000 + j, "raw", value_raw=b"v%d" % j), b"v%d" % j) for j in range(20)], more)
    crossed = fetch_batches(node.port, p.topic)
    for partition in range(PARTITIONS):
        old = comparable(before[p.topic])[partition]
        assert comparable(crossed)[partition][: len(old)] == old
        new = crossed[partition][len(old) :]
        assert sum(len(b.records) for b in new) == sum(1 for part, _ in more if part == partition)
        assert [r.offset for b in crossed[partition] for r in b.records] == list(range(sum(len(b.records) for b in crossed[partition])))

"""Records a stock client produces that no table column holds as they are come back exactly once
compacted, through `neve dev` with the compactor in the node: a nanosecond timestamp sent as
milliseconds and a timestamp past year 9999 (each a batch beside ordinary records), and a batch
of records whose header key is not UTF-8 (legal in Kafka, and librdkafka's C API sends any bytes;
the Python clients encode keys as text, so that batch is produced as such a client frames it). They reach the table (the timestamp clamped and kept
exact beside it, the key's bytes kept), the index entries become PARQUET, the WAL objects are
deleted, and a read from offset 0 through Kafka gives every batch and record as the WAL gave it.
(Record attribute bits and batch attribute bits above the control bit, which no client sets, are
proven at the byte level by test_roundtrip_bytes.py.)"""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyiceberg.catalog.sql import SqlCatalog

from metadata.model import ObjectType
from tests.broker.test_fetch_read_failures import list_offsets
from tests.compactor.test_roundtrip_bytes import record_bytes
from tests.compactor.test_service import WAIT_S, index_types, node_env, table_offsets
from tests.fixtures import free_port
from tests.raw import Raw, produce_v9
from tests.table.test_fetch_from_table import comparable, fetch_batches, wal_objects
from wal.batch_builder import GZIP, frame_batch

TOPIC = "exactrecords"
T0 = 1_700_000_000_000
NANOS = 1_700_000_000_000_000_000  # a nanosecond clock's now, sent as ms
YEAR_10000 = 253_402_300_800_000
KEY = b"\xff\xfe trace"  # not UTF-8


def _produce(node) -> int:
    """Four batches of partition 0 (a flush after each): returns how many records."""
    producer = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 50, "compression.type": "gzip", "enable.idempotence": True})
    batches = [
        [(b"n0", b"before", T0), (b"n1", b"nanoseconds", NANOS), (b"n2", b"after", T0 + 1)],
        [(b"h%d" % i, b"header %d" % i, T0 + 10 + i) for i in range(3)],
        [(b"y", b"year 10000", YEAR_10000)],
        [(b"z", b"plain", T0 + 20)],
    ]
    for i, batch in enumerate(batches):
        if i == 1:
            records = [record_bytes(j, timestamp - T0 - 10, 0, key, value, [(KEY, b"v"), (b"ok", b"w")]) for j, (key, value, timestamp) in enumerate(batch)]
            stored = frame_batch(
                b"".join(records), 3, codec=GZIP, timestamp_type=0, base_timestamp=T0 + 10, max_timestamp=T0 + 12, last_offset_delta=2,
                producer_id=-1, producer_epoch=-1, base_sequence=-1, is_transactional=False, is_control=False, partition_leader_epoch=-1, base_offset=0,
            )  # fmt: skip
            raw = Raw(node.port)
            try:
                response = raw.response(0, 9, raw.request(produce_v9(TOPIC, {0: stored})))
                assert [p.error_code for t in response.responses for p in t.partition_responses] == [0]
            finally:
                raw.close()
            continue
        for key, value, timestamp in batch:
            producer.produce(TOPIC, value, key, partition=0, timestamp=timestamp)
        assert producer.flush(60) == 0
    return sum(len(b) for b in batches)


def _consume(bootstrap: str, count: int) -> list[tuple]:
    """(offset, key, value, timestamp) of partition 0's records from offset 0, by librdkafka (whose
    Python binding cannot hand over a header key that is not UTF-8: the raw fetches compare those)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"exact-{time.monotonic_ns()}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    got: list[tuple] = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(got) < count:
            assert time.monotonic() < deadline, f"consumed {len(got)} of {count}"
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.offset(), msg.key(), msg.value(), msg.timestamp()[1]))
    finally:
        consumer.close()
    assert [o for o, *_ in got] == list(range(count))
    return got


def _times(port: int) -> list[tuple[int, int, int]]:
    """ListOffsets by timestamp, around the timestamps no column holds as they are: (error, offset,
    timestamp) for each."""
    raw = Raw(port)
    try:
        return [list_offsets(raw, TOPIC, {0: t})[0][1:] for t in (T0 + 15, YEAR_10000 - 1, YEAR_10000, NANOS, NANOS + 1)]
    finally:
        raw.close()


def _rows(data_dir: Path) -> list[dict]:
    catalog = SqlCatalog("neve", uri=f"sqlite:///{data_dir / 'catalog.db'}", warehouse=f"file://{data_dir / 'warehouse'}")
    rows = catalog.load_table(f"neve.{TOPIC}").scan().to_arrow().to_pylist()
    return sorted(rows, key=lambda r: r["kafka"]["offset"])


def test_records_no_column_holds_as_they_are_come_back_exactly(neve_factory):
    node = neve_factory(env=node_env(free_port(), NEVE_COMPACTOR_IN_NODE="false"))
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(60)
    del admin
    count = _produce(node)
    before = fetch_batches(node.port, TOPIC, partitions=range(1))
    assert [len(b.records) for b in before[0]] == [3, 3, 1, 1]
    assert [r.timestamp for b in before[0] for r in b.records][:3] == [T0, NANOS, T0 + 1]
    consumed = _consume(node.bootstrap, count)
    times = _times(node.port)
    assert [(error, offset) for error, offset, _ in times] == [(0, 1), (0, 1), (0, 1), (0, 1), (0, -1)]
    assert [ts for _, _, _, ts in consumed] == [T0, NANOS, T0 + 1, T0 + 10, T0 + 11, T0 + 12, YEAR_10000, T0 + 20]

    node.env["NEVE_COMPACTOR_IN_NODE"] = "true"
    node.restart()
    data_dir = Path(node.data_dir).resolve()
    started = time.monotonic()
    while table_offsets(data_dir, TOPIC) != [(0, o) for o in range(count)]:
        assert time.monotonic() - started < WAIT_S, f"{table_offsets(data_dir, TOPIC)} after {WAIT_S} s"
        time.sleep(0.2)
    assert node.stop() == 0
    assert index_types(data_dir, TOPIC) == {ObjectType.PARQUET}

    rows = _rows(data_dir)
    nanos, year = rows[1]["kafka"], rows[6]["kafka"]
    assert (nanos["timestamp"].year, nanos["timestamp_ms"], nanos["batch_max_timestamp_ms"]) == (9999, NANOS, NANOS)
    assert (year["timestamp"].year, year["timestamp_ms"]) == (9999, YEAR_10000)
    assert rows[0]["kafka"]["timestamp_ms"] is None  # a timestamp the column holds is not repeated
    assert [r["headers"] for r in rows[3:6]] == [[{"key": "\ufffd\ufffd trace", "value": b"v", "key_bytes": KEY}, {"key": "ok", "value": b"w", "key_bytes": None}]] * 3
    assert [r["value_raw"] for r in rows] == [b"before", b"nanoseconds", b"after", b"header 0", b"header 1", b"header 2", b"year 10000", b"plain"]

    # the WAL objects gone, every read is served from the table
    removed = wal_objects(data_dir)
    assert removed
    for path in removed:
        path.unlink()
    node.start()
    after = fetch_batches(node.port, TOPIC, partitions=range(1))
    assert comparable(after) == comparable(before)
    assert [b.codec for b in after[0]] == [b.codec for b in before[0]]
    assert _consume(node.bootstrap, count) == consumed
    assert _times(node.port) == times

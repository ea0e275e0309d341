"""An object-store read that fails while serving Fetch or ListOffsets answers that partition with
the retriable KAFKA_STORAGE_ERROR and serves the request's other partitions; the connection stays
open (regression: the handler raised and the connection was closed). On a real node a WAL object
is hidden by moving its file out of the node's object store, then put back; in-process, a store
fails GETs as S3 does in an outage (each read costs its whole retry schedule, so a range that
failed is not read twice) and a bug in it still raises."""

from __future__ import annotations

import datetime
import os
import shutil

import pytest
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic

from tests.batches import make_batch
from tests.broker.test_fetch_lagging_view import Broker, LaggingStore
from tests.broker.test_fetch_limits import offsets_in
from tests.fixtures import free_port
from tests.neve.test_metrics import scrape
from tests.raw import Raw, assert_still_serving, produce_v9
from tests.scenarios.records import create_topic
from wal.store import MemoryObjectStore, ObjectStoreError

KAFKA_STORAGE_ERROR = 56
FAILURES = 'neve_object_read_failures_total{api="%s"}'
T0 = 1_700_000_000_000
MAX_TIMESTAMP = -3


def wal_files(objects_dir) -> set[str]:
    return {os.path.join(d, f) for d, _, files in os.walk(objects_dir) for f in files if ".tmp-" not in f}


class Objects:
    """Produces one WAL object per request (each sent after the previous one is answered) and
    remembers which file holds it, so a test can hide it."""

    def __init__(self, raw: Raw, topic: str, objects_dir, hidden_dir) -> None:
        self.raw, self.topic, self.objects_dir, self.hidden_dir = raw, topic, objects_dir, hidden_dir
        self.files: list[str] = []

    def produce(self, partitions: dict[int, bytes]) -> int:
        """The index of the new object."""
        before = wal_files(self.objects_dir)
        cid = self.raw.request(produce_v9(self.topic, partitions))
        answers = [p.error_code for t in self.raw.response(0, 9, cid).responses for p in t.partition_responses]
        assert answers == [0] * len(partitions)
        (new,) = wal_files(self.objects_dir) - before
        self.files.append(new)
        return len(self.files) - 1

    def hide(self, index: int) -> None:
        shutil.move(self.files[index], os.path.join(self.hidden_dir, f"hidden-{index}"))

    def restore(self, index: int) -> None:
        shutil.move(os.path.join(self.hidden_dir, f"hidden-{index}"), self.files[index])


def fetch(raw: Raw, topic: str, offsets: dict[int, int]) -> list[tuple[int, int, int, list[int]]]:
    """(partition, error code, high watermark, offsets returned) of each partition asked for."""
    request = FetchRequest(
        cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1, max_bytes=10_000_000,
        isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
        topics=(FetchTopic(topic=topic, partitions=tuple(FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=o, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1_000_000) for p, o in offsets.items())),),
        forgotten_topics_data=(),
    )  # fmt: skip
    cid = raw.request(request)
    return [(p.partition_index, p.error_code, p.high_watermark, offsets_in(p.records)) for p in raw.response(1, 12, cid).responses[0].partitions]


def list_offsets(raw: Raw, topic: str, timestamps: dict[int, int]) -> list[tuple[int, int, int, int]]:
    """(partition, error code, offset, timestamp) of each partition asked for."""
    request = ListOffsetsRequest(
        replica_id=-1, isolation_level=0,
        topics=(ListOffsetsTopic(name=topic, partitions=tuple(ListOffsetsPartition(partition_index=p, current_leader_epoch=-1, timestamp=t) for p, t in timestamps.items())),),
    )  # fmt: skip
    cid = raw.request(request)
    return [(p.partition_index, p.error_code, p.offset, p.timestamp) for p in raw.response(2, 7, cid).topics[0].partitions]


def records(n: int, first_ts: int, tag: bytes) -> bytes:
    return make_batch([(b"k", b"%s-%d" % (tag, i), [], first_ts + i) for i in range(n)])


@pytest.fixture
def node(neve_factory):
    """A node and its metrics port."""
    metrics_port = free_port()
    # No recent-objects cache and no chunk cache: every read goes to the object store.
    node = neve_factory(env={"NEVE_BROKER_METRICS_PORT": str(metrics_port), "NEVE_WAL_LINGER_MS": "5", "NEVE_WAL_RECENT_OBJECTS_BYTES": "0", "NEVE_CACHE_ENABLED": "false"})
    return node, metrics_port


@pytest.mark.integration
def test_fetch_answers_a_failed_read_with_a_retriable_error_and_serves_the_rest(node, tmp_path):
    node, metrics_port = node
    topic = create_topic(node.bootstrap, 2, prefix="read-failures")
    raw = Raw(node.port)
    try:
        objects = Objects(raw, topic, node.data_dir / "objects", tmp_path)
        first = objects.produce({0: records(3, T0, b"a")})  # partition 0, offsets 0-2
        objects.produce({1: records(2, T0, b"b")})  # partition 1, offsets 0-1
        third = objects.produce({0: records(2, T0 + 10, b"c")})  # partition 0, offsets 3-4
        before = scrape(metrics_port)

        objects.hide(first)
        assert fetch(raw, topic, {0: 0, 1: 0}) == [(0, KAFKA_STORAGE_ERROR, 5, []), (1, 0, 2, [0, 1])]
        assert fetch(raw, topic, {1: 0, 0: 0}) == [(1, 0, 2, [0, 1]), (0, KAFKA_STORAGE_ERROR, 5, [])]  # the failed partition last: the one before it is still served
        assert_still_serving(raw)
        assert scrape(metrics_port)[FAILURES % "Fetch"] - before.get(FAILURES % "Fetch", 0) == 2

        objects.restore(first)
        objects.hide(third)
        # what was read before the failure is served; the next fetch, from where it ends, fails
        assert fetch(raw, topic, {0: 0, 1: 0}) == [(0, 0, 5, [0, 1, 2]), (1, 0, 2, [0, 1])]
        assert fetch(raw, topic, {0: 3}) == [(0, KAFKA_STORAGE_ERROR, 5, [])]

        objects.restore(third)
        assert fetch(raw, topic, {0: 0, 1: 0}) == [(0, 0, 5, [0, 1, 2, 3, 4]), (1, 0, 2, [0, 1])]
    finally:
        raw.close()


@pytest.mark.integration
def test_list_offsets_answers_a_failed_read_with_a_retriable_error_and_serves_the_rest(node, tmp_path):
    node, metrics_port = node
    topic = create_topic(node.bootstrap, 2, prefix="read-failures")
    raw = Raw(node.port)
    try:
        objects = Objects(raw, topic, node.data_dir / "objects", tmp_path)
        # partition 0's newest records hold its oldest timestamps: its max timestamp is in the first object
        first = objects.produce({0: records(3, T0 + 100, b"a")})  # partition 0, offsets 0-2
        objects.produce({1: records(2, T0, b"b")})  # partition 1, offsets 0-1
        objects.produce({0: records(2, T0, b"c")})  # partition 0, offsets 3-4
        assert list_offsets(raw, topic, {0: T0 + 101, 1: T0 + 1}) == [(0, 0, 1, T0 + 101), (1, 0, 1, T0 + 1)]
        before = scrape(metrics_port)

        objects.hide(first)
        assert list_offsets(raw, topic, {0: T0 + 101, 1: T0 + 1}) == [(0, KAFKA_STORAGE_ERROR, -1, -1), (1, 0, 1, T0 + 1)]
        assert list_offsets(raw, topic, {0: MAX_TIMESTAMP, 1: MAX_TIMESTAMP}) == [(0, KAFKA_STORAGE_ERROR, -1, -1), (1, 0, 1, T0 + 1)]
        assert list_offsets(raw, topic, {0: -1, 1: -2}) == [(0, 0, 5, -1), (1, 0, 0, -1)]  # latest and earliest read nothing
        assert_still_serving(raw)
        assert scrape(metrics_port)[FAILURES % "ListOffsets"] - before.get(FAILURES % "ListOffsets", 0) == 2

        objects.restore(first)
        assert list_offsets(raw, topic, {0: T0 + 101, 1: MAX_TIMESTAMP}) == [(0, 0, 1, T0 + 101), (1, 0, 1, T0 + 1)]
    finally:
        raw.close()


# -- in-process -----------------------------------------------------------------------------------


class BrokenObjects(MemoryObjectStore):
    """GETs of the keys in `broken` fail with `error` (ObjectStoreError: what the S3 backend raises
    once its retries are spent), counted."""

    def __init__(self) -> None:
        super().__init__()
        self.broken: set[str] = set()
        self.error: Exception = ObjectStoreError("get: connection refused")
        self.failed_gets = 0

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if key in self.broken:
            self.failed_gets += 1
            raise self.error
        return await super().get(key, start, end)


@pytest.fixture
async def broken():
    store = LaggingStore(None)
    await store.start()
    try:
        yield Broker(store, BrokenObjects())
    finally:
        await store.close()


async def test_a_failed_range_is_read_once_and_a_bug_still_raises(broken):
    info = await broken.store.create_topic("broken", 2)
    first = await broken.produce(info.topic_id, 0, 3)
    await broken.produce(info.topic_id, 1, 2)
    broken.objects.broken.add(first)
    assert await broken.fetch("broken", {0: 0, 1: 0}) == [(0, KAFKA_STORAGE_ERROR, 3, 0, []), (1, 0, 2, 0, [0, 1])]
    assert broken.objects.failed_gets == 1  # the prefetch's GET; the partition's read did not repeat it
    broken.objects.error = TypeError("a bug in the store")
    with pytest.raises(TypeError):
        await broken.fetch("broken", {0: 0, 1: 0})


@pytest.mark.integration
def test_list_offsets_answers_records_that_do_not_decode_with_corrupt_message(node, tmp_path):
    """Issue 20's review: ListOffsets by timestamp decoding stored records that do not parse closed
    the connection. Produce refuses such records now (CORRUPT_MESSAGE), so they are made by
    overwriting a stored object's records in place; that partition answers CORRUPT_MESSAGE and
    the other is served on the same connection."""
    from tests.batches import encode_records, frame_batch

    node, _ = node
    topic = create_topic(node.bootstrap, 2, prefix="corrupt-records")
    garbage = frame_batch(b"\x7f" * 40, record_count=3, last_offset_delta=2, base_timestamp=T0, max_timestamp=T0 + 2)
    raw = Raw(node.port)
    try:
        cid = raw.request(produce_v9(topic, {0: garbage, 1: records(2, T0, b"fine")}))
        assert [p.error_code for t in raw.response(0, 9, cid).responses for p in t.partition_responses] == [2, 0]
        objects = Objects(raw, topic, node.data_dir / "objects", tmp_path)
        objects.produce({0: records(3, T0, b"soon-garbage")})
        payload = encode_records([(b"k", b"soon-garbage-%d" % i, [], T0 + i) for i in range(3)], T0)
        with open(objects.files[0], "r+b") as f:
            stored = f.read()
            assert stored.count(payload) == 1
            f.seek(stored.index(payload))
            f.write(b"\x7f" * len(payload))
        assert list_offsets(raw, topic, {0: T0 + 1, 1: T0 + 1}) == [(0, 2, -1, -1), (1, 0, 1, T0 + 1)]
        assert_still_serving(raw)
    finally:
        raw.close()

"""Fetch beyond the high watermark of a metadata view that may lag answers the retriable
OFFSET_NOT_AVAILABLE, not OFFSET_OUT_OF_RANGE, unless the store's durable high watermark confirms
the offset is beyond it: the offset may exist, handed to the consumer by a broker whose view is
ahead, and OFFSET_OUT_OF_RANGE would make the consumer reset (auto.offset.reset) and skip or
re-read records. Below the log start offset is OFFSET_OUT_OF_RANGE in any view. The handler runs
in-process over an in-memory object store, and an embedded store that reports its view as lagging
(the etcd store's while its watch is broken), or two etcd stores on a real etcd, one of whose
watch is held back while it stays connected."""

from __future__ import annotations

import asyncio
import datetime

import pytest
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.offset_for_leader_epoch.v4 import response as ofle_response
from kio.schema.offset_for_leader_epoch.v4.request import OffsetForLeaderEpochRequest, OffsetForLeaderPartition, OffsetForLeaderTopic

from broker.config import BrokerConfig
from broker.context import RequestContext, Services
from broker.handlers.api01_fetch import fetch
from broker.handlers.api23_offset_for_leader_epoch import offset_for_leader_epoch
from cache.reader import ObjectReader
from cache.recent import RecentObjects
from metadata.embedded import EmbeddedMetadataStore
from metadata.etcd import EtcdMetadataStore
from metadata.model import Append, ObjectCommit
from metadata.store import MetadataUnavailable
from tests.batches import make_batch
from tests.broker.test_fetch_limits import offsets_in
from wal.store import MemoryObjectStore

NONE, OFFSET_OUT_OF_RANGE, OFFSET_NOT_AVAILABLE = 0, 1, 78


class LaggingStore(EmbeddedMetadataStore):
    """An embedded store whose view says whether it is known to be current, as the etcd store's
    does (False while its watch is broken and it reloads)."""

    current = True

    def is_current(self) -> bool:
        return self.current


class Broker:
    """The fetch handler over a store and an in-memory object store; `produce` writes a WAL object
    and commits it, as the WAL writer would."""

    def __init__(self, store: LaggingStore, objects: MemoryObjectStore | None = None) -> None:
        self.store = store
        self.objects = objects if objects is not None else MemoryObjectStore()
        services = Services(settings=BrokerConfig(), metadata=store, wal=None, reader=ObjectReader(self.objects, RecentObjects(0)))  # type: ignore[arg-type]
        self.ctx = RequestContext(services, api_key=1, api_version=12, client_id="test", response=None)  # type: ignore[arg-type]
        self.objects_made = 0

    async def produce(self, topic_id, partition: int, count: int) -> str:
        """The new object's key."""
        batch = make_batch([(b"k", b"v%d" % i, [], 1_700_000_000_000 + i) for i in range(count)])
        key = f"wal/{self.objects_made:08d}"
        self.objects_made += 1
        await self.objects.put(key, batch)
        await self.store.commit(ObjectCommit(key, len(batch), (Append(topic_id, partition, 0, len(batch), count, 1_700_000_000_000 + count),)))
        return key

    async def fetch(self, topic: str, offsets: dict[int, int], max_wait_ms: int = 0) -> list[tuple[int, int, int, int, list[int]]]:
        """(partition, error code, high watermark, log start offset, offsets returned) of each partition."""
        request = FetchRequest(
            cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=1, max_bytes=10_000_000,
            isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
            topics=(FetchTopic(topic=topic, partitions=tuple(FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=o, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1_000_000) for p, o in offsets.items())),),
            forgotten_topics_data=(),
        )  # fmt: skip
        answer = await fetch(self.ctx, request)
        ((name, partitions),) = answer.topics
        assert name == topic
        return [(index, code, hw, log_start, offsets_in(bytes(records))) for index, code, hw, _, log_start, records in partitions]


@pytest.fixture
async def broker():
    store = LaggingStore(None)
    await store.start()
    try:
        yield Broker(store)
    finally:
        await store.close()


async def topic_with_records(broker: Broker) -> str:
    """A topic whose partition 0 holds offsets 0-2 and partition 1 offsets 0-1."""
    info = await broker.store.create_topic("lagging", 2)
    await broker.produce(info.topic_id, 0, 3)
    await broker.produce(info.topic_id, 1, 2)
    return info.name


async def test_beyond_a_lagging_view_is_not_available_and_the_rest_is_served(broker):
    topic = await topic_with_records(broker)
    broker.store.current = False
    assert await broker.fetch(topic, {0: 5, 1: 0}) == [(0, OFFSET_NOT_AVAILABLE, 3, 0, []), (1, NONE, 2, 0, [0, 1])]
    # at the view's end: nothing yet, no error; within it: served as always (the batch holding
    # the offset, whole)
    assert await broker.fetch(topic, {0: 3, 1: 2}) == [(0, NONE, 3, 0, []), (1, NONE, 2, 0, [])]
    assert await broker.fetch(topic, {0: 1}) == [(0, NONE, 3, 0, [0, 1, 2])]


async def test_a_current_view_still_answers_out_of_range_beyond_its_end(broker):
    topic = await topic_with_records(broker)
    assert await broker.fetch(topic, {0: 5, 1: 0}) == [(0, OFFSET_OUT_OF_RANGE, 3, 0, []), (1, NONE, 2, 0, [0, 1])]


async def test_below_the_log_start_is_out_of_range_even_in_a_lagging_view(broker):
    """A view's log start offset lags too, but only behind the real one (it never moves back):
    an offset below it is below the real one."""
    topic = await topic_with_records(broker)
    info = broker.store.topics()[topic]
    assert await broker.store.advance_log_start(info.topic_id, 0, 2) == 2
    broker.store.current = False
    assert await broker.fetch(topic, {0: 1, 1: 0}) == [(0, OFFSET_OUT_OF_RANGE, 3, 2, []), (1, NONE, 2, 0, [0, 1])]


async def test_a_long_poll_beyond_a_lagging_view_is_served_once_the_view_catches_up(broker):
    topic = await topic_with_records(broker)
    info = broker.store.topics()[topic]
    broker.store.current = False
    waiting = asyncio.create_task(broker.fetch(topic, {0: 5}, max_wait_ms=10_000))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await broker.produce(info.topic_id, 0, 4)  # offsets 3-6 reach the view
    broker.store.current = True
    # the entry holding offset 5 starts at 3: its batch is served whole, as Kafka serves batches
    assert await asyncio.wait_for(waiting, 5) == [(0, NONE, 7, 0, [3, 4, 5, 6])]


class HeldBackStore(EtcdMetadataStore):
    """An etcd store whose watch stays connected (its view counts as current) but hands on no
    events while `held` is set: a view behind commits that are durable, deterministically."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.released = asyncio.Event()
        self.released.set()

    async def _watch(self, start_revision: int):
        async for response in super()._watch(start_revision):
            if response.events:
                await self.released.wait()
            yield response


async def etcd_revision(store: EtcdMetadataStore) -> int:
    """etcd's revision now, past every commit made so far (a put of a marker key)."""
    return (await store._client.put(store.keys.prefix("test-marker"), b"")).header.revision


@pytest.mark.integration
async def test_a_connected_etcd_view_behind_a_commit_answers_not_available_until_it_catches_up(etcd_server):
    """Issue 20's review: a broker whose etcd watch was connected but behind answered
    OFFSET_OUT_OF_RANGE for an offset another broker had committed, and the consumer reset. Now
    it reads the heads (one request for the response) and answers OFFSET_NOT_AVAILABLE while its
    view lags, OFFSET_OUT_OF_RANGE only beyond the durable high watermark, and the records once
    its view has them."""
    port = etcd_server.ports["client"]
    writer_store = EtcdMetadataStore("127.0.0.1", port, root="lagging-watch")
    lagging_store = HeldBackStore("127.0.0.1", port, root="lagging-watch")
    await writer_store.start()
    await lagging_store.start()
    try:
        objects = MemoryObjectStore()
        writer, lagging = Broker(writer_store, objects), Broker(lagging_store, objects)
        info = await writer_store.create_topic("lagging", 2)
        await writer.produce(info.topic_id, 0, 3)
        await writer.produce(info.topic_id, 1, 2)
        assert await lagging_store._view_reaches(await etcd_revision(writer_store), 30)

        lagging_store.released.clear()
        await writer.produce(info.topic_id, 0, 4)  # offsets 3-6, durable; the lagging view has 0-2
        await writer.produce(info.topic_id, 1, 1)  # offset 2
        assert lagging_store.is_current() and lagging_store.high_watermark(info.topic_id, 0) == 3
        assert await writer.fetch("lagging", {0: 5}) == [(0, NONE, 7, 0, [3, 4, 5, 6])]

        ops = lagging_store.ops
        # beyond the view in both partitions, within the durable high watermark in both: one read
        assert await lagging.fetch("lagging", {0: 5, 1: 3}) == [(0, OFFSET_NOT_AVAILABLE, 3, 0, []), (1, OFFSET_NOT_AVAILABLE, 2, 0, [])]
        assert lagging_store.ops == ops + 1
        # beyond the durable one too: out of range; and at the view's end or within it, no read
        assert await lagging.fetch("lagging", {0: 8, 1: 3}) == [(0, OFFSET_OUT_OF_RANGE, 3, 0, []), (1, OFFSET_NOT_AVAILABLE, 2, 0, [])]
        assert lagging_store.ops == ops + 2
        assert await lagging.fetch("lagging", {0: 3, 1: 0}) == [(0, NONE, 3, 0, []), (1, NONE, 2, 0, [0, 1])]
        assert lagging_store.ops == ops + 2
        # a long poll that ends with the view still behind: the same answer, after max_wait
        assert await lagging.fetch("lagging", {0: 5}, max_wait_ms=200) == [(0, OFFSET_NOT_AVAILABLE, 3, 0, [])]

        lagging_store.released.set()
        assert await lagging_store._view_reaches(await etcd_revision(writer_store), 30)
        assert await lagging.fetch("lagging", {0: 5, 1: 2}) == [(0, NONE, 7, 0, [3, 4, 5, 6]), (1, NONE, 3, 0, [2])]
        assert await lagging.fetch("lagging", {0: 8}) == [(0, OFFSET_OUT_OF_RANGE, 7, 0, [])]
    finally:
        lagging_store.released.set()
        await lagging_store.close()
        await writer_store.close()


async def offset_for_epoch_0(broker: Broker, topic: str, partition: int) -> tuple[int, int, int]:
    """(error code, leader epoch, end offset) of OffsetForLeaderEpoch for epoch 0, on `broker`."""
    request = OffsetForLeaderEpochRequest(replica_id=-1, topics=(OffsetForLeaderTopic(topic=topic, partitions=(OffsetForLeaderPartition(partition=partition, current_leader_epoch=0, leader_epoch=0),)),))
    ctx = RequestContext(broker.ctx.services, api_key=23, api_version=4, client_id="test", response=ofle_response)
    (answer,) = (await offset_for_leader_epoch(ctx, request)).topics[0].partitions
    return answer.error_code, answer.leader_epoch, answer.end_offset


@pytest.mark.integration
async def test_offset_for_leader_epoch_never_ends_an_epoch_below_what_another_broker_served(etcd_server):
    """The chaos harness's poll-skip under etcd pauses: a consumer had fetched records 66-70
    through a current broker and not yet returned them; librdkafka then validated its position
    (KIP-320) with the partition's leader, a broker whose view lagged at 69. Told epoch 0 ends at
    69, below its fetch position, it took the log for truncated, sought to 69 and dropped the
    records it held. Epoch 0 now ends at the durable high watermark; the store unreadable, the
    answer is the retriable OFFSET_NOT_AVAILABLE."""
    port = etcd_server.ports["client"]
    writer_store = EtcdMetadataStore("127.0.0.1", port, root="lagging-epoch")
    lagging_store = HeldBackStore("127.0.0.1", port, root="lagging-epoch")
    await writer_store.start()
    await lagging_store.start()
    try:
        objects = MemoryObjectStore()
        writer, lagging = Broker(writer_store, objects), Broker(lagging_store, objects)
        info = await writer_store.create_topic("epochs", 1)
        await writer.produce(info.topic_id, 0, 3)
        assert await lagging_store._view_reaches(await etcd_revision(writer_store), 30)
        lagging_store.released.clear()
        await writer.produce(info.topic_id, 0, 4)  # offsets 3-6, durable; the lagging view has 0-2
        assert await writer.fetch("epochs", {0: 0}) == [(0, NONE, 7, 0, [0, 1, 2, 3, 4, 5, 6])]  # the consumer's position: 7
        assert lagging_store.high_watermark(info.topic_id, 0) == 3
        assert await offset_for_epoch_0(lagging, "epochs", 0) == (NONE, 0, 7)
        assert await offset_for_epoch_0(writer, "epochs", 0) == (NONE, 0, 7)
        lagging_store.released.set()
        assert await lagging_store._view_reaches(await etcd_revision(writer_store), 30)
        assert await offset_for_epoch_0(lagging, "epochs", 0) == (NONE, 0, 7)
    finally:
        lagging_store.released.set()
        await lagging_store.close()
        await writer_store.close()


class UnreadableStore(LaggingStore):
    """A store whose durable high watermarks cannot be read (its etcd paused)."""

    async def durable_high_watermarks(self, partitions):
        raise MetadataUnavailable("etcd did not answer")


async def test_offset_for_leader_epoch_is_not_available_while_the_store_cannot_be_read():
    store = UnreadableStore(None)
    await store.start()
    try:
        broker = Broker(store)
        info = await store.create_topic("epochs", 1)
        await broker.produce(info.topic_id, 0, 2)
        assert await offset_for_epoch_0(broker, "epochs", 0) == (OFFSET_NOT_AVAILABLE, -1, -1)
    finally:
        await store.close()

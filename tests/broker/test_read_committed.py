"""read_committed on the Kafka read path: Fetch with isolation_level 1 stops at the last stable
offset (an index entry straddling it is cut at the batch there), lists the aborted transactions
its records meet (none whose marker the table holds), and answers the real last stable offset;
ListOffsets under read_committed answers the last stable offset for latest and finds no offset at
or past it by timestamp. read_uncommitted is unchanged. The handlers run in-process over an
embedded store and an in-memory object store; transactional batches and markers are committed as
the WAL writer commits them, and answers are checked as a client decodes them; a real client
(aiokafka, served by an in-process listener) reads exactly the committed records."""

from __future__ import annotations

import asyncio
import datetime
import random
import struct
import uuid
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.serial import entity_reader

from broker import codec
from broker.config import BrokerConfig
from broker.context import RequestContext, Services
from broker.fetch_response import FetchAnswer
from broker.handlers.api01_fetch import fetch
from broker.handlers.api02_list_offsets import list_offsets
from broker.server import KafkaServer
from cache.reader import ObjectReader
from cache.recent import RecentObjects
from metadata.embedded import EmbeddedMetadataStore
from metadata.model import ABORT_MARKER, COMMIT_MARKER, Append, IndexEntry, ObjectCommit, ObjectType
from tests.batches import CONTROL, TRANSACTIONAL, make_batch
from tests.broker.test_fetch_response_encoding import kio_frame, topic_key
from tests.fixtures import free_port
from wal.store import MemoryObjectStore

READ_UNCOMMITTED, READ_COMMITTED = 0, 1
T0 = 1_700_000_000_000


def served(batch: bytes, base_offset: int) -> bytes:
    """A stored batch as Fetch serves it: its assigned base offset and leader epoch 0 injected."""
    return base_offset.to_bytes(8, "big") + batch[8:12] + (0).to_bytes(4, "big") + batch[16:]


class Log:
    """The in-process handlers over an embedded store and an in-memory object store. `write`
    stores batches as one WAL object and commits them as the WAL writer would: each batch one
    append, byte-adjacent appends of a partition making one index entry."""

    def __init__(self, store: EmbeddedMetadataStore) -> None:
        self.store = store
        self.objects = MemoryObjectStore()
        self.services = Services(settings=BrokerConfig(port=free_port()), metadata=store, wal=SimpleNamespace(seal_at=None), reader=ObjectReader(self.objects, RecentObjects(0)))  # type: ignore[arg-type]
        self.objects_made = 0
        self.ts = T0
        self.sequences: dict[int, int] = {}

    def plain(self, count: int) -> tuple[bytes, Append]:
        batch = make_batch([(b"k", b"plain %d" % self._tick(), [], self.ts) for _ in range(count)])
        return batch, Append(uuid.UUID(int=0), 0, 0, len(batch), count, self.ts)

    def txn(self, pid: int, count: int) -> tuple[bytes, Append]:
        """A batch of producer `pid`'s transaction (epoch 0, its next sequence)."""
        seq = self.sequences.get(pid, 0)
        self.sequences[pid] = seq + count
        batch = make_batch([(b"k", b"txn %d" % self._tick(), [], self.ts) for _ in range(count)], producer_id=pid, producer_epoch=0, base_sequence=seq, attributes=TRANSACTIONAL)
        return batch, Append(uuid.UUID(int=0), 0, 0, len(batch), count, self.ts, producer_id=pid, producer_epoch=0, base_sequence=seq, transactional=True)

    def marker(self, pid: int, kind: int) -> tuple[bytes, Append]:
        """A control batch ending producer `pid`'s transaction: key version 0 and type (0 abort,
        1 commit), value version 0 and coordinator epoch."""
        record = (struct.pack(">hh", 0, kind), struct.pack(">hi", 0, 0), [], self._tick())
        batch = make_batch([record], producer_id=pid, producer_epoch=0, base_sequence=-1, attributes=TRANSACTIONAL | CONTROL)
        return batch, Append(uuid.UUID(int=0), 0, 0, len(batch), 1, self.ts, producer_id=pid, producer_epoch=0, base_sequence=-1, transactional=True, control=kind)

    def _tick(self) -> int:
        self.ts += 1
        return self.ts

    async def write(self, topic_id: uuid.UUID, *batches: tuple[bytes, Append], partition: int = 0) -> list[int]:
        """The base offsets the batches were given."""
        key = f"wal/{self.objects_made:08d}"
        self.objects_made += 1
        appends, position = [], 0
        for batch, a in batches:
            appends.append(Append(topic_id, partition, position, a.size, a.record_count, a.max_timestamp, a.producer_id, a.producer_epoch, a.base_sequence, a.transactional, a.control))
            position += len(batch)
        await self.objects.put(key, b"".join(b for b, _ in batches))
        results = await self.store.commit(ObjectCommit(key, position, tuple(appends)))
        assert [r.error_code for r in results] == [0] * len(batches)
        return [r.base_offset for r in results]

    async def fetch(self, topic: str, offset: int, isolation: int, partition_max_bytes: int = 1_000_000, max_wait_ms: int = 0, version: int = 12):
        """The partition's answer as a client decodes it."""
        request = FetchRequest(
            cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=1, max_bytes=10_000_000,
            isolation_level=isolation, session_id=0, session_epoch=-1, rack_id="",
            topics=(FetchTopic(topic=topic, partitions=(FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=partition_max_bytes),)),),
            forgotten_topics_data=(),
        )  # fmt: skip
        ctx = RequestContext(self.services, api_key=1, api_version=version, client_id="test", response=None)  # type: ignore[arg-type]
        answer = await fetch(ctx, request)
        ((topic_answer,),) = [decoded(answer, version).responses]
        (part,) = topic_answer.partitions
        return part

    async def list_offsets(self, topic: str, timestamp: int, isolation: int) -> tuple[int, int, int]:
        """(error code, offset, timestamp) of partition 0."""
        request = ListOffsetsRequest(replica_id=-1, isolation_level=isolation, topics=(ListOffsetsTopic(name=topic, partitions=(ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=timestamp),)),))
        ctx = RequestContext(self.services, api_key=2, api_version=7, client_id="test", response=codec.response_module(2, 7))  # type: ignore[arg-type]
        (p,) = (await list_offsets(ctx, request)).topics[0].partitions
        return int(p.error_code), p.offset, p.timestamp


def decoded(answer: FetchAnswer, version: int):
    """The response body as a client reads it off the wire."""
    frame = b"".join(codec.encode_response(1, version, 1, answer))
    cls = codec.response_codec(1, version)[3]
    header, used = entity_reader(cls.__header_schema__)(frame[4:], 0)
    body, used_body = entity_reader(cls)(frame[4:], used)
    assert used + used_body == len(frame) - 4
    return body


def outcome(part) -> tuple:
    """(error, high watermark, last stable offset, aborted transactions, records)."""
    aborted = None if part.aborted_transactions is None else [(a.producer_id, a.first_offset) for a in part.aborted_transactions]
    return int(part.error_code), part.high_watermark, part.last_stable_offset, aborted, bytes(part.records or b"")


@pytest.fixture
async def log():
    store = EmbeddedMetadataStore(None)
    await store.start()
    try:
        yield Log(store)
    finally:
        await store.close()


async def test_read_committed_stops_at_the_last_stable_offset_inside_an_entry(log):
    info = await log.store.create_topic("txn-straddle", 1)
    t = info.topic_id
    batches = [log.plain(2), log.txn(1, 3), log.marker(1, ABORT_MARKER), log.txn(2, 2), log.marker(2, COMMIT_MARKER), log.txn(3, 2), log.plain(2)]
    bases = await log.write(t, *batches)
    assert bases == [0, 2, 5, 6, 8, 9, 11]
    view = log.store.topic_views(t)[0]
    assert len(view) == 1  # one entry, 0-12, straddling the open transaction's start at 9
    stored = [served(b, base) for (b, _), base in zip(batches, bases)]

    # read_uncommitted: everything up to the high watermark, aborted transactions null; the real
    # last stable offset
    assert outcome(await log.fetch("txn-straddle", 0, READ_UNCOMMITTED)) == (0, 13, 9, None, b"".join(stored))
    # read_committed: exactly the batches below the last stable offset, producer 1's aborted
    # transaction listed for the client to skip its batch at 2-4
    assert outcome(await log.fetch("txn-straddle", 0, READ_COMMITTED)) == (0, 13, 9, [(1, 2)], b"".join(stored[:5]))
    # from past the abort marker: nothing aborted is met
    assert outcome(await log.fetch("txn-straddle", 6, READ_COMMITTED)) == (0, 13, 9, [], b"".join(stored[3:5]))
    # from the last stable offset up to the high watermark: no records, no error
    for offset in (9, 11, 13):
        assert outcome(await log.fetch("txn-straddle", offset, READ_COMMITTED)) == (0, 13, 9, [], b"")
    assert outcome(await log.fetch("txn-straddle", 11, READ_UNCOMMITTED)) == (0, 13, 9, None, stored[6])

    # producer 3 commits: its records are readable, up to the high watermark again
    commit = log.marker(3, COMMIT_MARKER)
    assert await log.write(t, commit) == [13]
    assert outcome(await log.fetch("txn-straddle", 9, READ_COMMITTED)) == (0, 14, 14, [], b"".join(stored[5:]) + served(commit[0], 13))


async def test_aborted_transactions_whose_marker_is_past_the_last_stable_offset_are_listed(log):
    """Producer 1 aborts after producer 2 opened its transaction: the last stable offset stops at
    producer 2's start, and the client reading producer 1's aborted batch below it must know."""
    t = (await log.store.create_topic("txn-late-marker", 1)).topic_id
    aborted, open_one, abort = log.txn(1, 2), log.txn(2, 2), log.marker(1, ABORT_MARKER)
    assert await log.write(t, aborted, open_one, abort) == [0, 2, 4]
    assert outcome(await log.fetch("txn-late-marker", 0, READ_COMMITTED)) == (0, 5, 2, [(1, 0)], served(aborted[0], 0))


async def test_aborted_transactions_are_those_the_returned_records_meet(log):
    """A budget that returns only the first entry lists nothing of the transaction after it."""
    t = (await log.store.create_topic("txn-budget", 1)).topic_id
    first = log.plain(2)
    assert await log.write(t, first) == [0]
    assert await log.write(t, log.txn(1, 3), log.marker(1, ABORT_MARKER)) == [2, 5]
    assert await log.write(t, log.plain(1)) == [6]
    # KIP-74: the first batch is returned even beyond the partition's budget, and nothing more
    assert outcome(await log.fetch("txn-budget", 0, READ_COMMITTED, partition_max_bytes=1)) == (0, 7, 7, [], served(first[0], 0))
    assert outcome(await log.fetch("txn-budget", 0, READ_COMMITTED))[3] == [(1, 2)]


async def test_an_aborted_transaction_whose_marker_the_table_holds_is_not_listed(log):
    """Compaction drops aborted records and markers: a client told of an aborted transaction
    whose marker it will never read would skip that producer's later committed batches. Only the
    entries are swapped here (an index entry of the marker's offset made a table entry), with the
    fetch's budget ending before it: the listing follows the marker's entry alone."""
    t = (await log.store.create_topic("txn-compacted", 1)).topic_id
    assert await log.write(t, log.plain(2)) == [0]
    aborted = log.txn(1, 3)
    assert await log.write(t, aborted) == [2]
    assert await log.write(t, log.marker(1, ABORT_MARKER)) == [5]
    assert await log.write(t, log.plain(2)) == [6]
    budget = len(aborted[0])  # producer 1's batch alone
    assert outcome(await log.fetch("txn-compacted", 2, READ_COMMITTED, partition_max_bytes=budget)) == (0, 8, 8, [(1, 2)], served(aborted[0], 2))
    (marker_entry,) = log.store.entries(t, 0, 5, max_entries=1)
    assert (marker_entry.base_offset, marker_entry.last_offset) == (5, 5)
    table_entry = IndexEntry(5, 5, "table/data/00000.parquet", ObjectType.PARQUET, 0, 1, marker_entry.max_timestamp)
    assert await log.store.replace_entries(t, 0, [marker_entry], table_entry)
    assert outcome(await log.fetch("txn-compacted", 2, READ_COMMITTED, partition_max_bytes=budget)) == (0, 8, 8, [], served(aborted[0], 2))


async def test_a_swap_while_the_records_are_read_does_not_drop_their_aborted_transaction(log):
    """Issue 42 finding 2: a read_committed Fetch read the WAL bytes first and the aborted
    transactions afterwards; a compactor's swap in between (its table entry now holding the abort
    marker) took the transaction off the list, and the client was served the aborted batch with
    no word that it was aborted. The answer is built from the view of one moment: the entries it
    read and the aborted transactions they meet, listed with the marker the bytes still hold."""
    t = (await log.store.create_topic("txn-swap-race", 1)).topic_id
    assert await log.write(t, log.plain(2)) == [0]
    aborted = log.txn(1, 3)
    marker = log.marker(1, ABORT_MARKER)
    later = log.plain(2)
    assert await log.write(t, aborted, marker) == [2, 5]
    assert await log.write(t, later) == [6]
    (wal_entry,) = log.store.entries(t, 0, 2, max_entries=1)
    assert (wal_entry.base_offset, wal_entry.last_offset) == (2, 5)
    table_entry = IndexEntry(2, 5, "table/data/00000.parquet", ObjectType.PARQUET, 0, 1, wal_entry.max_timestamp)

    real_read_many, swapped = log.services.reader.read_many, []

    async def read_then_swap(ranges, unread):
        got = await real_read_many(ranges, unread)
        if not swapped:  # the compactor's swap lands while the fetch holds the WAL bytes
            swapped.append(await log.store.replace_entries(t, 0, [wal_entry], table_entry))
        return got

    log.services.reader.read_many = read_then_swap
    part = await log.fetch("txn-swap-race", 2, READ_COMMITTED)
    assert swapped == [True]
    assert outcome(part) == (0, 8, 8, [(1, 2)], served(aborted[0], 2) + served(marker[0], 5) + served(later[0], 6))


async def test_a_long_poll_at_the_last_stable_offset_is_answered_when_the_transaction_commits(log):
    t = (await log.store.create_topic("txn-poll", 1)).topic_id
    opened = log.txn(4, 2)
    assert await log.write(t, log.plain(1), opened) == [0, 1]
    waiting = asyncio.create_task(log.fetch("txn-poll", 1, READ_COMMITTED, max_wait_ms=20_000))
    # the partition grows past the open transaction: the last stable offset does not move, and
    # the poll goes on waiting
    more = log.plain(1)
    assert await log.write(t, more) == [3]
    await asyncio.sleep(0.1)
    assert not waiting.done()
    commit = log.marker(4, COMMIT_MARKER)
    assert await log.write(t, commit) == [4]
    got = await asyncio.wait_for(waiting, 10)
    assert outcome(got) == (0, 5, 5, [], served(opened[0], 1) + served(more[0], 3) + served(commit[0], 4))


async def test_list_offsets_under_read_committed(log):
    t = (await log.store.create_topic("txn-offsets", 1)).topic_id
    committed = log.plain(2)  # timestamps T0+1, T0+2
    opened = log.txn(5, 2)  # T0+3, T0+4
    later = log.plain(1)  # T0+5
    assert await log.write(t, committed, opened, later) == [0, 2, 4]
    LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3
    assert await log.list_offsets("txn-offsets", LATEST, READ_UNCOMMITTED) == (0, 5, -1)
    assert await log.list_offsets("txn-offsets", LATEST, READ_COMMITTED) == (0, 2, -1)
    assert await log.list_offsets("txn-offsets", EARLIEST, READ_COMMITTED) == (0, 0, -1)
    # by timestamp, as Kafka: only an offset below the last stable offset is found
    assert await log.list_offsets("txn-offsets", T0 + 2, READ_COMMITTED) == (0, 1, T0 + 2)
    assert await log.list_offsets("txn-offsets", T0 + 3, READ_UNCOMMITTED) == (0, 2, T0 + 3)
    assert await log.list_offsets("txn-offsets", T0 + 3, READ_COMMITTED) == (0, -1, -1)
    assert await log.list_offsets("txn-offsets", MAX_TIMESTAMP, READ_UNCOMMITTED) == (0, 4, T0 + 5)
    assert await log.list_offsets("txn-offsets", MAX_TIMESTAMP, READ_COMMITTED) == (0, -1, -1)
    # once the transaction commits, read_committed sees it all
    assert await log.write(t, log.marker(5, COMMIT_MARKER)) == [5]
    assert await log.list_offsets("txn-offsets", LATEST, READ_COMMITTED) == (0, 6, -1)
    assert await log.list_offsets("txn-offsets", T0 + 3, READ_COMMITTED) == (0, 2, T0 + 3)


async def consume(port: int, topic: str, isolation: str, count: int) -> list[tuple[int, bytes]]:
    """(offset, value) of the first `count` records a real client (aiokafka) reads from offset 0."""
    consumer = AIOKafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}", isolation_level=isolation, enable_auto_commit=False, fetch_max_wait_ms=100)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        got: list[tuple[int, bytes]] = []
        async with asyncio.timeout(30):
            while len(got) < count:
                for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                    got += [(r.offset, r.value) for r in records]
        return got
    finally:
        await consumer.stop()


async def end_offset(port: int, topic: str, isolation: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}", isolation_level=isolation, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        return (await consumer.end_offsets([tp]))[tp]
    finally:
        await consumer.stop()


async def test_a_read_committed_client_reads_exactly_the_committed_records(log):
    """aiokafka skips the aborted batches the answers list and stops at the open transaction."""
    t = (await log.store.create_topic("txn-client", 1)).topic_id
    await log.write(t, log.plain(2), log.txn(1, 3), log.marker(1, ABORT_MARKER), log.txn(2, 2), log.marker(2, COMMIT_MARKER), log.txn(3, 2), log.plain(2))
    server = KafkaServer(log.services)
    await server.start()
    try:
        port = server.port
        kinds = lambda got: [(offset, value.split(b" ")[0]) for offset, value in got]  # noqa: E731
        everything = await consume(port, "txn-client", "read_uncommitted", 11)
        assert kinds(everything) == [(0, b"plain"), (1, b"plain"), (2, b"txn"), (3, b"txn"), (4, b"txn"), (6, b"txn"), (7, b"txn"), (9, b"txn"), (10, b"txn"), (11, b"plain"), (12, b"plain")]
        committed = await consume(port, "txn-client", "read_committed", 4)
        assert committed == [everything[i] for i in (0, 1, 5, 6)]
        assert (await end_offset(port, "txn-client", "read_committed"), await end_offset(port, "txn-client", "read_uncommitted")) == (9, 13)
        await log.write(t, log.marker(3, COMMIT_MARKER))
        assert await consume(port, "txn-client", "read_committed", 8) == [everything[i] for i in (0, 1, 5, 6, 7, 8, 9, 10)]
        assert await end_offset(port, "txn-client", "read_committed") == 14
    finally:
        await server.stop()


@pytest.mark.parametrize("version", range(4, 18))
def test_aborted_transactions_are_encoded_as_kio_encodes_them(version):
    rng = random.Random(version)
    for _ in range(50):
        topics, aborted = [], {}
        for ti in range(rng.choice([1, 2, 3])):
            partitions = []
            for p in range(rng.choice([1, 3, 20])):
                records = rng.choice([b"", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 100)))])
                partitions.append((p, 0, 100, rng.randrange(101), 0, records))
                if records and rng.random() < 0.3:
                    aborted.setdefault(ti, {})[p] = [(rng.randrange(2**40), rng.randrange(100)) for _ in range(rng.choice([1, 2, 5]))]
            topics.append((topic_key(version, f"t{ti}"), partitions))
        answer = FetchAnswer(topics, read_committed=True, aborted=aborted or None)
        assert b"".join(answer.frame(version, 9)) == kio_frame(version, 9, answer.entity(version))
    answer = FetchAnswer([(topic_key(version, "t"), [(0, 0, 9, 5, 0, b"\x01" * 70), (1, 0, 9, 9, 0, b"")])], read_committed=True, aborted={0: {0: [(7, 3), (8, 4)]}})
    got = [[(a.producer_id, a.first_offset) for a in p.aborted_transactions] for p in decoded(answer, version).responses[0].partitions]
    assert got == [[(7, 3), (8, 4)], []]

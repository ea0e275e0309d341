"""The table holds exactly the committed records, through the compaction service over a metadata
store and a WAL written here batch by batch (transactional batches and markers as a transactional
producer and the coordinator write them): compaction of a partition stops at its last stable
offset (an open transaction holds it back, and the records after it), markers and aborted records
are never rows, rows keep their offsets, and a run with no row left (only aborted records and
markers) still replaces its WAL entries, so the index and the checkpoint move on."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from broker.transactions.markers import marker_batch
from compactor.config import CompactorConfig
from compactor.service.loop import CompactionService
from metadata.model import ABORT_MARKER, COMMIT_MARKER, NOT_CONTROL, Append, ObjectCommit, ObjectType
from metadata.store import load_metadata_store
from registry.client import StoreLookup
from tests.readers import rows_duckdb, rows_pyiceberg
from wal.batch_builder import build_batch
from wal.store import load_object_store

T0 = 1_700_000_000_000


class Wal:
    """Batches written as a broker writes them: each into a WAL object of its own, committed to
    the metadata store (so each is an index entry of its own)."""

    def __init__(self, metadata, objects, topic_id) -> None:
        self.metadata, self.objects, self.topic_id = metadata, objects, topic_id
        self.sequences: dict[tuple[int, int], int] = {}
        self.n = 0

    async def write(self, partition: int, data: bytes, count: int, *, pid: int = -1, transactional: bool = False, control: int = NOT_CONTROL, seq: int = -1, max_timestamp: int = T0, generation: int = -1) -> int:
        self.n += 1
        key = f"wal/{self.n:06d}"
        await self.objects.put(key, data)
        append = Append(self.topic_id, partition, 0, len(data), count, max_timestamp, producer_id=pid, producer_epoch=0 if pid >= 0 else -1, base_sequence=seq, transactional=transactional, control=control, txn_generation=generation)
        (result,) = await self.metadata.commit(ObjectCommit(key, len(data), (append,)))
        assert result.error_code == 0, result
        return result.base_offset

    async def records(self, partition: int, values: list[bytes], pid: int = -1, generation: int = -1) -> int:
        """A batch of `values` (transactional when `pid` is set, opening the coordinator's
        transaction `generation` if it opens one): its base offset."""
        seq = -1
        if pid >= 0:
            seq = self.sequences.get((pid, partition), 0)
            self.sequences[(pid, partition)] = seq + len(values)
        records = [(i, T0 + i, b"k", v, ()) for i, v in enumerate(values)]
        data = build_batch(records, producer_id=pid, producer_epoch=0 if pid >= 0 else -1, base_sequence=seq, is_transactional=pid >= 0)
        return await self.write(partition, data, len(values), pid=pid, transactional=pid >= 0, seq=seq, generation=generation)

    async def marker(self, partition: int, pid: int, kind: int, generation: int = -1) -> int:
        return await self.write(partition, marker_batch(pid, 0, kind, T0), 1, pid=pid, transactional=True, control=kind, generation=generation)


async def compaction(stack: contextlib.AsyncExitStack, tmp_path: Path, runner: str, spark=None):
    """A metadata store, an object store and a compaction service over `tmp_path`, each closed by
    `stack`: (metadata, objects, service)."""
    objects_url = f"file://{tmp_path / 'objects'}"
    config = CompactorConfig(catalog_url=f"sqlite://{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'warehouse'}", runner=runner, freshness_ms=0, maintenance_interval_ms=0)
    metadata = load_metadata_store(f"sqlite:///{tmp_path / 'metadata.db'}")
    await metadata.start()
    stack.push_async_callback(metadata.close)
    objects = load_object_store(objects_url)
    stack.push_async_callback(objects.close)
    lookup = StoreLookup(metadata)
    stack.push_async_callback(lookup.close)
    service = CompactionService(config, metadata, objects, objects_url, lookup, spark=spark)
    stack.push_async_callback(service.close)
    return metadata, objects, service


def held_offsets(topic: str, partition: int) -> float | None:
    return REGISTRY.get_sample_value("neve_compactor_transaction_held_offsets", {"topic": topic, "partition": str(partition)})


def kafka_rows(rows: list[dict]) -> list[tuple[int, int, bytes, bool, bool]]:
    """(partition, offset, value, transactional, control) of each row, in offset order."""
    return sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["value_raw"], r["kafka"]["is_transactional"], r["kafka"]["is_control"]) for r in rows)


@pytest.mark.parametrize("runner", ["in-process", "spark"])
async def test_the_table_holds_exactly_the_committed_records_and_waits_for_open_transactions(tmp_path: Path, runner, request):
    spark = request.getfixturevalue("spark_session") if runner == "spark" else None
    async with contextlib.AsyncExitStack() as stack:
        metadata, objects, service = await compaction(stack, tmp_path, runner, spark)
        info = await metadata.create_topic("txntable", 2)
        wal = Wal(metadata, objects, info.topic_id)

        # partition 0: plain records, a committed transaction, an aborted one, then one left open
        # with plain records after it
        assert await wal.records(0, [b"plain0", b"plain1"]) == 0
        assert await wal.records(0, [b"c2", b"c3", b"c4"], pid=1) == 2
        assert await wal.records(0, [b"a5", b"a6"], pid=2) == 5
        assert await wal.records(0, [b"c7"], pid=1) == 7  # producer 1's committed batches around producer 2's aborted ones
        assert await wal.marker(0, pid=1, kind=COMMIT_MARKER) == 8
        assert await wal.marker(0, pid=2, kind=ABORT_MARKER) == 9
        assert await wal.records(0, [b"o10", b"o11"], pid=3) == 10  # open
        assert await wal.records(0, [b"plain12"]) == 12  # after the open transaction: waits with it
        # partition 1: an aborted transaction and its marker alone, no row to write
        assert await wal.records(1, [b"a0", b"a1", b"a2"], pid=2) == 0
        assert await wal.marker(1, pid=2, kind=ABORT_MARKER) == 3

        cycle = await service.compact_topic(metadata.topics()["txntable"])
        assert cycle.offsets == {0: (0, 9), 1: (0, 3)}  # partition 0 up to its last stable offset, 10
        table = (await service.resources.catalog()).load_table("neve.txntable")
        want = [(0, 0, b"plain0", False, False), (0, 1, b"plain1", False, False), (0, 2, b"c2", True, False), (0, 3, b"c3", True, False), (0, 4, b"c4", True, False), (0, 7, b"c7", True, False)]
        assert kafka_rows(rows_pyiceberg(table)) == want
        assert kafka_rows(rows_duckdb(table)) == want
        assert [(e.base_offset, e.last_offset, e.object_type) for e in metadata.entries(info.topic_id, 1, 0, 100)] == [(0, 3, ObjectType.PARQUET)]
        assert [(e.base_offset, e.object_type) for e in metadata.entries(info.topic_id, 0, 0, 100)] == [(0, ObjectType.PARQUET), (10, ObjectType.WAL), (12, ObjectType.WAL)]
        assert held_offsets("txntable", 0) == 3  # offsets 10-12 wait for producer 3
        assert (await service.compact_topic(metadata.topics()["txntable"])).cycle_id is None  # nothing more is due while it is open

        # a cycle with no row at all: another aborted transaction on partition 1
        assert await wal.records(1, [b"a4"], pid=2) == 4
        assert await wal.marker(1, pid=2, kind=ABORT_MARKER) == 5
        empty = await service.compact_topic(metadata.topics()["txntable"])
        assert (empty.offsets, empty.rows, empty.files) == ({1: (4, 5)}, 0, 0)
        assert [(e.base_offset, e.last_offset, e.object_type) for e in metadata.entries(info.topic_id, 1, 0, 100)] == [(0, 3, ObjectType.PARQUET), (4, 5, ObjectType.PARQUET)]

        # producer 3 commits: its records and the plain record after them join the table
        assert await wal.marker(0, pid=3, kind=COMMIT_MARKER) == 13
        last = await service.compact_topic(metadata.topics()["txntable"])
        assert last.offsets == {0: (10, 13)}
        assert held_offsets("txntable", 0) == 0
        table = table.refresh()
        want += [(0, 10, b"o10", True, False), (0, 11, b"o11", True, False), (0, 12, b"plain12", False, False)]
        assert kafka_rows(rows_pyiceberg(table)) == want
        assert kafka_rows(rows_duckdb(table)) == want
        assert {e.object_type for p in (0, 1) for e in metadata.entries(info.topic_id, p, 0, 100)} == {ObjectType.PARQUET}


async def test_a_transaction_whose_markers_are_being_written_waits_whole(tmp_path: Path):
    """A transaction over two partitions: its commit marker stored on the first, the coordinator's
    decision stored, the second marker not yet. A cycle then takes neither partition's records of
    it (nor anything of those partitions): the snapshot holds the transaction whole or not at all.
    Once the second marker and the completion are stored, the next cycle takes both."""
    from metadata.transactions import Status, Transaction, key_of

    async with contextlib.AsyncExitStack() as stack:
        metadata, objects, service = await compaction(stack, tmp_path, "in-process")
        info = await metadata.create_topic("torn", 3)
        wal = Wal(metadata, objects, info.topic_id)
        t = info.topic_id.hex

        txn = Transaction(producer_id=5, producer_epoch=0, timeout_ms=60_000, status=Status.ONGOING, partitions=((t, 0), (t, 1)), started_ms=1)
        assert await metadata.registry_write({key_of("tid"): txn.encode()}, {key_of("tid"): 0})
        await wal.records(0, [b"x0", b"x1"], pid=5)
        await wal.records(1, [b"y0"], pid=5)
        await wal.records(2, [b"plain"])  # a partition outside the transaction
        item = await metadata.registry_get(key_of("tid"))
        assert await metadata.registry_write({key_of("tid"): txn.with_(status=Status.PREPARE_COMMIT).encode()}, {key_of("tid"): item.revision})
        await wal.marker(0, pid=5, kind=COMMIT_MARKER)  # partition 0's records are stable now, partition 1's not

        first = await service.compact_topic(metadata.topics()["torn"])
        assert first.offsets == {2: (0, 0)}  # neither partition of the transaction
        table = (await service.resources.catalog()).load_table("neve.torn")
        assert kafka_rows(rows_pyiceberg(table)) == [(2, 0, b"plain", False, False)]

        await wal.marker(1, pid=5, kind=COMMIT_MARKER)
        item = await metadata.registry_get(key_of("tid"))
        assert await metadata.registry_write({key_of("tid"): txn.with_(status=Status.COMPLETE_COMMIT, partitions=()).encode()}, {key_of("tid"): item.revision})
        second = await service.compact_topic(metadata.topics()["torn"])
        assert second.offsets == {0: (0, 2), 1: (0, 1)}
        table = (await service.resources.catalog()).load_table("neve.torn")
        want = [(0, 0, b"x0", True, False), (0, 1, b"x1", True, False), (1, 0, b"y0", True, False), (2, 0, b"plain", False, False)]
        assert kafka_rows(rows_pyiceberg(table)) == want
        assert kafka_rows(rows_duckdb(table)) == want


async def test_a_committed_transaction_waits_on_every_partition_while_another_holds_one_back(tmp_path: Path):
    """Issue 42 finding 4: producer 5's transaction commits on partitions 0 and 1; producer 9's,
    open on partition 1 since before it, holds partition 1's table back. Planned each on its own,
    partition 0 took 5's records and partition 1 did not: a snapshot with the transaction in part.
    Partition 0 now stops at 5's first record there (the plain record before it goes in), and
    both parts go in together once 9's transaction ends."""
    async with contextlib.AsyncExitStack() as stack:
        metadata, objects, service = await compaction(stack, tmp_path, "in-process")
        info = await metadata.create_topic("held", 3)
        wal = Wal(metadata, objects, info.topic_id)

        await wal.records(1, [b"open"], pid=9, generation=4)  # p1 0: 9's transaction, open
        await wal.records(0, [b"before"])  # p0 0
        await wal.records(0, [b"x0", b"x1"], pid=5, generation=1)  # p0 1-2
        await wal.records(1, [b"y0"], pid=5, generation=1)  # p1 1
        await wal.marker(0, pid=5, kind=COMMIT_MARKER, generation=1)  # p0 3
        await wal.marker(1, pid=5, kind=COMMIT_MARKER, generation=1)  # p1 2
        await wal.records(2, [b"plain"])  # p2 0

        first = await service.compact_topic(metadata.topics()["held"])
        assert first.offsets == {0: (0, 0), 2: (0, 0)}
        table = (await service.resources.catalog()).load_table("neve.held")
        assert kafka_rows(rows_pyiceberg(table)) == [(0, 0, b"before", False, False), (2, 0, b"plain", False, False)]

        await wal.marker(1, pid=9, kind=COMMIT_MARKER, generation=4)  # p1 3
        second = await service.compact_topic(metadata.topics()["held"])
        assert second.offsets == {0: (1, 3), 1: (0, 3)}
        table = (await service.resources.catalog()).load_table("neve.held")
        want = [(0, 0, b"before", False, False), (0, 1, b"x0", True, False), (0, 2, b"x1", True, False), (1, 0, b"open", True, False), (1, 1, b"y0", True, False), (2, 0, b"plain", False, False)]
        assert kafka_rows(rows_pyiceberg(table)) == want

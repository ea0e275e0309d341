"""Issue 22's table maintenance, keeping the Kafka view right: records confluent-kafka produced to
`neve dev` are compacted over many cycles (many small files); then (a) Spark's rewrite_data_files,
run as an outside engine, and Spark's expire_snapshots deleting the old files; (b) neve's own merge,
on Spark and in-process, with neve's expiry deleting the old files once the index no longer names
them; (c) a node killed -9 between its merge's table commit and the re-index. After neve's
re-index, every PARQUET entry's manifest names only files of the current snapshot, reading those
files' rows for each entry's offsets gives every acknowledged offset once, as produced, the
manifests still map to the same produced bytes, and table readers see each row once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import os
import shutil
import time
import uuid
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from compactor.catalog import load_catalog
from compactor.commits.rewrites import current_files, find_part
from compactor.config import CompactorConfig
from compactor.files.spark import register_catalog
from compactor.maintenance.rounds import MAINTENANCE
from compactor.rows.translator import RAW, TOMBSTONE
from compactor.service import planning
from compactor.service.loop import CompactionService
from compactor.service.tables import TABLE_PROPERTIES
from metadata.model import ObjectType
from metadata.store import load_metadata_store
from registry.client import StoreLookup
from tests.compactor.produced import CODECS, PARTITIONS, Produced, Want, check_rows, headers_of, key_of, produce, timestamp_of
from tests.compactor.test_service import WAIT_S, consume_all, node_env, wait_for_table
from tests.fixtures import NeveNode, free_port
from tests.readers import collect, rows_pyiceberg
from wal.manifest import CycleManifest
from wal.store import load_object_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROUNDS = 4
PER_ROUND = 40
DAYS = 3  # timestamp_of spreads records over three days: three table partitions


def produce_round(bootstrap: str, topic: str, r: int, want: dict) -> None:
    """PER_ROUND raw records (tombstones among them) through round `r`'s codec, as produce_raw makes them."""
    items = []
    for i in range(PER_ROUND):
        j = r * PER_ROUND + i
        value = None if i % 9 == 4 else (b"maint %d " % j) * (j % 13 + 1)
        items.append((j % PARTITIONS, Want(CODECS[r % len(CODECS)], key_of(i, j), headers_of(j), timestamp_of(j), TOMBSTONE if value is None else RAW, value_raw=value), value))
    produce(bootstrap, topic, CODECS[r % len(CODECS)], items, want)


@pytest.fixture(scope="module")
def produced(tmp_path_factory) -> tuple[Path, Produced]:
    """ROUNDS rounds of records produced through `neve dev` (its compactor off), the node stopped."""
    from tests.scenarios.records import create_topic

    data_dir = tmp_path_factory.mktemp("maintenance") / "node"
    data_dir.mkdir()
    node = NeveNode(data_dir=data_dir, log_path=data_dir.parent / "node.log", env={"NEVE_WAL_LINGER_MS": "5", "NEVE_COMPACTOR_IN_NODE": "false"}).start()
    try:
        topic = create_topic(node.bootstrap, PARTITIONS, prefix="maint")
        want: dict = {}
        for r in range(ROUNDS):
            produce_round(node.bootstrap, topic, r, want)
    finally:
        assert node.stop() == 0
    return data_dir, Produced(topic, want, {})


# -- the service over a stopped node's data dir ---------------------------------------------------


async def with_service(data_dir: Path, config: CompactorConfig, spark, work):
    """`work(service, metadata, objects)` with a compaction service over the stopped node's data dir."""
    objects_url = f"file://{data_dir.resolve() / 'objects'}"
    async with contextlib.AsyncExitStack() as stack:
        metadata = load_metadata_store(f"sqlite:///{data_dir.resolve() / 'metadata.db'}")
        await metadata.start()
        stack.push_async_callback(metadata.close)
        objects = load_object_store(objects_url)
        stack.push_async_callback(objects.close)
        lookup = StoreLookup(metadata)
        stack.push_async_callback(lookup.close)
        service = CompactionService(config, metadata, objects, objects_url, lookup, spark=spark)
        stack.push_async_callback(service.close)
        return await work(service, metadata, objects)


def compact_in_cycles(data_dir: Path, config: CompactorConfig, topic: str) -> int:
    """Every WAL entry compacted, one entry per partition a cycle (many small files): the cycles."""

    async def work(service, metadata, objects):
        cycles = 0
        while (await service.compact_topic(metadata.topics()[topic])).cycle_id is not None:
            cycles += 1
        return cycles

    return asyncio.run(with_service(data_dir, dataclasses.replace(config, runner="in-process", freshness_ms=0), None, work))


def maintain(data_dir: Path, config: CompactorConfig, topic: str, spark=None):
    async def work(service, metadata, objects):
        return await service.maintain_topic(metadata.topics()[topic])

    return asyncio.run(with_service(data_dir, config, spark, work))


# -- what the index says ------------------------------------------------------------------------------


@dataclasses.dataclass
class IndexView:
    manifests: dict[int, list[tuple]]  # partition -> [(entry, the manifest's part of it)]
    produced_bytes: dict[int, list[tuple[str, int, int]]]  # partition -> the WAL bytes its entries resolve to, merged


def read_index(data_dir: Path, topic: str) -> IndexView:
    async def work(service, metadata, objects):
        info = metadata.topics()[topic]
        view = IndexView({}, {})
        for p in range(info.partitions):
            entries = metadata.entries(info.topic_id, p, 0, max_entries=100_000)
            assert {e.object_type for e in entries} == {ObjectType.PARQUET}
            assert all(a.last_offset + 1 == b.base_offset for a, b in zip(entries, entries[1:]))
            ranges: list[tuple[str, int, int]] = []
            for e in entries:
                manifest = CycleManifest.decode(await objects.get(e.object_key))
                view.manifests.setdefault(p, []).append((e, find_part(manifest, p)))
                for key, start, size in manifest.resolve(e.start, e.size):
                    if ranges and ranges[-1][0] == key and ranges[-1][1] + ranges[-1][2] == start:
                        ranges[-1] = (key, ranges[-1][1], ranges[-1][2] + size)
                    else:
                        ranges.append((key, start, size))
            view.produced_bytes[p] = ranges
        return view

    return asyncio.run(with_service(data_dir, CompactorConfig(), None, work))


def check_index_reads(view: IndexView, table, p: Produced) -> None:
    """Every file the index names is in `table`'s current snapshot, and the rows of each entry's
    offsets in its slices' files are every acknowledged record once, as produced."""
    current = current_files(table)
    rows = []
    for partition, entries in view.manifests.items():
        for entry, part in entries:
            assert part is not None and (part.first_offset, part.last_offset) == (entry.base_offset, entry.last_offset)
            for s in part.slices:
                assert s.path in current, f"partition {partition} offsets {entry.base_offset}-{entry.last_offset}: {s.path} is not in the current snapshot"
                with table.io.new_input(s.path).open() as f:
                    file_rows = pq.ParquetFile(f).read()
                kafka = file_rows.column("kafka")
                offsets = pc.struct_field(kafka, "offset")
                mask = pc.and_(pc.equal(pc.struct_field(kafka, "partition"), partition), pc.and_(pc.greater_equal(offsets, entry.base_offset), pc.less_equal(offsets, entry.last_offset)))
                rows += file_rows.filter(mask).to_pylist()
    check_rows(p, rows, where="index")  # one row per acknowledged offset, each as produced


def check_kafka_reads(data_dir: Path, p: Produced) -> None:
    """With the WAL objects gone, a node over `data_dir` serves every record of `p` from the table
    files the index names now, each once and as produced (raw fetches from offset 0)."""
    from tests.table.test_fetch_from_table import fetch_batches

    for wal in (data_dir / "objects" / "wal").rglob("*"):
        if wal.is_file():
            wal.unlink()
    node = NeveNode(data_dir=data_dir, log_path=data_dir.parent / "reader.log", env={"NEVE_COMPACTOR_IN_NODE": "false"}).start()
    try:
        fetched = fetch_batches(node.port, p.topic)
    finally:
        assert node.stop() == 0
    got = {(partition, r.offset): (r.key, r.value, list(r.headers), r.timestamp) for partition, batches in fetched.items() for b in batches for r in b.records}
    want = {k: (w.key, w.value_raw, list(w.headers), w.timestamp) for k, w in p.want.items()}
    assert got == want


def files_by_partition(table) -> dict[tuple, int]:
    out: dict[tuple, int] = {}
    for task in table.scan().plan_files():
        key = tuple(task.file.partition)
        out[key] = out.get(key, 0) + 1
    return out


def local(path: str) -> Path:
    return Path(path.removeprefix("file://"))


def copy_of(produced, tmp_path: Path, iceberg) -> tuple[Path, CompactorConfig, int]:
    """The produced node's data dir copied for this test, compacted in cycles into a namespace of
    its own in `iceberg`'s catalog: (data dir, config, cycles)."""
    data_dir, p = produced
    copy = tmp_path / "node"
    shutil.copytree(data_dir, copy)
    config = dataclasses.replace(iceberg.config, namespace=f"m{uuid.uuid4().hex[:8]}", maintenance_interval_ms=0)
    return copy, config, compact_in_cycles(copy, config, p.topic)


@pytest.fixture
def one_entry_a_cycle(monkeypatch):
    monkeypatch.setattr(planning, "MAX_ENTRIES_PER_PARTITION", 1)


# -- (a) an outside engine rewrites and expires ------------------------------------------------------


@pytest.mark.xdist_group("spark")
def test_an_outside_rewrite_and_expiry_is_reindexed_and_every_offset_reads_once(produced, sqlite_catalog, spark_session, tmp_path, one_entry_a_cycle):
    p = produced[1]
    data_dir, config, cycles = copy_of(produced, tmp_path, sqlite_catalog)
    assert cycles >= ROUNDS
    identifier = f"{config.namespace}.{p.topic.replace('-', '_')}"
    table = load_catalog(config).load_table(identifier)
    before = read_index(data_dir, p.topic)
    old_files = set(current_files(table))
    assert all(n >= ROUNDS for n in files_by_partition(table).values()) and len(files_by_partition(table)) == DAYS

    catalog = register_catalog(spark_session, sqlite_catalog.target)
    (done,) = collect(spark_session.sql(f"CALL {catalog}.system.rewrite_data_files(table => '{identifier}', options => map('min-input-files', '2'))"))
    assert done["rewritten_data_files_count"] == len(old_files)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    collect(spark_session.sql(f"CALL {catalog}.system.expire_snapshots(table => '{identifier}', older_than => TIMESTAMP '{now}', retain_last => 1)"))
    assert not any(local(f).exists() for f in old_files), "Spark's expiry deleted the old files"

    outcome = maintain(data_dir, config, p.topic)
    assert outcome.reindexed_partitions == PARTITIONS
    table = table.refresh()
    after = read_index(data_dir, p.topic)
    check_index_reads(after, table, p)
    assert after.produced_bytes == before.produced_bytes  # the entries' bytes are still the produced ones
    assert [len(entries) for entries in after.manifests.values()] == [1] * PARTITIONS  # consecutive entries became one
    check_rows(p, rows_pyiceberg(table), where="pyiceberg")
    assert maintain(data_dir, config, p.topic).reindexed_partitions == 0  # nothing moved since
    check_kafka_reads(data_dir, p)  # Spark's files, served to Kafka


# -- (b) neve's merge ---------------------------------------------------------------------------------


@pytest.mark.xdist_group("spark")
@pytest.mark.parametrize("runner", ["spark", "in-process"])
def test_neves_merge_leaves_one_file_per_table_partition_and_every_offset_reads_once(produced, sqlite_catalog, spark_session, tmp_path, one_entry_a_cycle, runner):
    p = produced[1]
    data_dir, config, cycles = copy_of(produced, tmp_path, sqlite_catalog)
    identifier = f"{config.namespace}.{p.topic.replace('-', '_')}"
    table = load_catalog(config).load_table(identifier)
    before = read_index(data_dir, p.topic)
    old_files = set(current_files(table))
    snapshots = len(table.snapshots())
    assert snapshots == cycles and all(n >= ROUNDS for n in files_by_partition(table).values())

    config = dataclasses.replace(config, runner=runner, maintenance_interval_ms=1, merge_min_files=2, merge_on_spark_min_bytes=0, snapshot_max_age_ms=0, file_delete_grace_ms=0)
    outcome = maintain(data_dir, config, p.topic, spark=spark_session if runner == "spark" else None)
    assert (outcome.files_rewritten, outcome.reindexed_partitions) == (len(old_files), PARTITIONS)
    assert outcome.snapshots_expired == snapshots  # all but the merge's
    table = table.refresh()
    assert files_by_partition(table) == dict.fromkeys(files_by_partition(table), 1) and len(files_by_partition(table)) == DAYS
    assert TABLE_PROPERTIES.items() <= table.properties.items()  # merged files' row groups stay a fetch's size
    assert outcome.files_deleted >= len(old_files) and not any(local(f).exists() for f in old_files)
    after = read_index(data_dir, p.topic)
    check_index_reads(after, table, p)
    assert after.produced_bytes == before.produced_bytes
    check_rows(p, rows_pyiceberg(table), where="pyiceberg")
    again = maintain(data_dir, config, p.topic)
    assert (again.files_rewritten, again.reindexed_partitions, again.files_deleted) == (0, 0, 0)
    check_kafka_reads(data_dir, p)


def test_a_table_keeps_its_newest_snapshots_and_its_tags_once_it_holds_twice_as_many(produced, sqlite_catalog, tmp_path, one_entry_a_cycle):
    """Every commit's cost grows with the snapshots a table keeps: past twice `snapshot_max_count`,
    the check after a commit (no maintenance round due) expires all but the newest, never a tag's;
    the rows, the index and the Kafka view are as they were."""
    p = produced[1]
    data_dir, config, cycles = copy_of(produced, tmp_path, sqlite_catalog)
    identifier = f"{config.namespace}.{p.topic.replace('-', '_')}"
    table = load_catalog(config).load_table(identifier)
    history = sorted(table.snapshots(), key=lambda s: s.timestamp_ms)
    keep = 1
    assert len(history) == cycles >= 4
    table.manage_snapshots().create_tag(history[0].snapshot_id, "first").commit()
    before = read_index(data_dir, p.topic)

    config = dataclasses.replace(config, snapshot_max_count=cycles // 2, maintenance_interval_ms=0)  # not past twice as many: nothing
    assert maintain(data_dir, config, p.topic).snapshots_expired == 0
    config = dataclasses.replace(config, snapshot_max_count=keep)
    outcome = maintain(data_dir, config, p.topic)
    table = table.refresh()
    left = {s.snapshot_id for s in table.snapshots()}
    assert outcome.snapshots_expired == cycles - keep - 1 and outcome.files_rewritten == 0
    assert left == {s.snapshot_id for s in history[-keep:]} | {history[0].snapshot_id}
    assert table.current_snapshot().snapshot_id == history[-1].snapshot_id
    after = read_index(data_dir, p.topic)
    assert after == before
    check_index_reads(after, table, p)
    check_rows(p, rows_pyiceberg(table), where="pyiceberg")
    check_kafka_reads(data_dir, p)


# -- (c) killed between the merge's commit and the re-index -------------------------------------------


def wait_for_log(node: NeveNode, text: str, after: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while text not in node.log_path.read_text()[after:]:
        assert node.process.poll() is None, f"the node exited with {node.process.returncode}"
        assert time.monotonic() < deadline, f"no {text!r} in {node.log_path} after {WAIT_S} s"
        time.sleep(0.2)


def test_a_node_killed_between_its_merge_commit_and_the_reindex_finishes_on_restart(neve_factory):
    from tests.scenarios.records import create_topic

    registry_port = free_port()
    node = neve_factory(env=node_env(registry_port, NEVE_COMPACTOR_MAINTENANCE_INTERVAL_MS="0"))
    topic = create_topic(node.bootstrap, PARTITIONS, prefix="maint-kill")
    want: dict = {}
    p = Produced(topic, want, {})
    for r in range(ROUNDS):  # a cycle each: the node's compactor catches up between rounds
        produce_round(node.bootstrap, topic, r, want)
        wait_for_table(Path(node.data_dir).resolve(), p)
    before = consume_all(node.bootstrap, topic, p.counts())
    data_dir = Path(node.data_dir).resolve()
    config = CompactorConfig(catalog_url=f"sqlite:///{data_dir / 'catalog.db'}")
    identifier = "neve." + topic.replace("-", "_")
    old_files = set(current_files(load_catalog(config).load_table(identifier)))
    assert node.stop() == 0

    node.env.update({"NEVE_COMPACTOR_MAINTENANCE_INTERVAL_MS": "1", "NEVE_COMPACTOR_MERGE_MIN_FILES": "2", "NEVE_COMPACTOR_FAULT_KILL_AFTER": "merged"})
    node.start()
    assert node.process.wait(WAIT_S) == -9  # killed right after the merge's commit
    table = load_catalog(config).load_table(identifier)
    assert table.current_snapshot().summary[MAINTENANCE] == "merge"
    stale = read_index(data_dir, topic)
    assert any(s.path not in current_files(table) for entries in stale.manifests.values() for _, part in entries for s in part.slices)

    del node.env["NEVE_COMPACTOR_FAULT_KILL_AFTER"]
    node.env["NEVE_COMPACTOR_MAINTENANCE_INTERVAL_MS"] = "0"  # only the re-index, which always runs
    log_at = len(node.log_path.read_text())
    node.start()
    wait_for_log(node, "re-indexed offsets the table's files moved", log_at)
    assert consume_all(node.bootstrap, topic, p.counts()) == before
    assert node.stop() == 0
    table = table.refresh()
    after = read_index(data_dir, topic)
    check_index_reads(after, table, p)
    assert after.produced_bytes == stale.produced_bytes
    assert set(files_by_partition(table).values()) == {1} and not (old_files & set(current_files(table)))
    check_rows(p, rows_pyiceberg(table), where="pyiceberg")


# -- orphan files ---------------------------------------------------------------------------------------


def test_files_nothing_holds_are_deleted_once_old_and_every_other_file_stays(produced, sqlite_catalog, tmp_path):
    """A crashed cycle's files (in the data directory, in no snapshot, named by no index entry)
    and a failed commit's metadata files are deleted by a maintenance round once older than
    `orphan_file_age_ms`; a younger one (a cycle may still be writing it) stays, and so does
    every file the table holds."""
    p = produced[1]
    data_dir, config, _ = copy_of(produced, tmp_path, sqlite_catalog)
    identifier = f"{config.namespace}.{p.topic.replace('-', '_')}"
    table = load_catalog(config).load_table(identifier)
    held = {local(f) for f in current_files(table)}
    data = local(table.location()) / "data"
    some_held = sorted(held)[0]
    an_hour_ago = time.time() - 3600
    old = [data / "crashed-cycle-1.parquet", some_held.parent / "crashed-cycle-2.parquet"]
    young = data / "being-written.parquet"
    for f in (*old, young):
        f.write_bytes(some_held.read_bytes())
    for f in old:
        os.utime(f, (an_hour_ago, an_hour_ago))
    os.utime(some_held, (an_hour_ago, an_hour_ago))  # old, but held: stays

    # A commit that never landed leaves its metadata file, manifest list and manifest behind; the
    # table's own metadata files are as old, and stay, and so does a file that is no Iceberg's.
    metadata = local(table.metadata_location).parent
    own_metadata = sorted(f for f in metadata.iterdir() if f.is_file())
    failed_commit = [metadata / "00999-crashed.metadata.json", metadata / "snap-1-1-crashed.avro", metadata / "crashed-m0.avro"]
    for f in failed_commit:
        f.write_bytes(local(table.metadata_location).read_bytes())  # what they hold is not looked at
    not_iceberg = metadata / "README.txt"
    not_iceberg.write_text("left by someone")
    young_metadata = metadata / "01000-being-committed.metadata.json"
    young_metadata.write_bytes(local(table.metadata_location).read_bytes())
    for f in (*failed_commit, *own_metadata, not_iceberg):
        os.utime(f, (an_hour_ago, an_hour_ago))

    config = dataclasses.replace(config, maintenance_interval_ms=1, merge_min_files=1_000_000, orphan_file_age_ms=60_000)
    outcome = maintain(data_dir, config, p.topic)
    assert (outcome.orphans_deleted, outcome.files_deleted, outcome.files_rewritten) == (5, 5, 0)
    assert not any(f.exists() for f in (*old, *failed_commit)) and young.exists() and young_metadata.exists()
    assert all(f.exists() for f in (*held, *own_metadata, not_iceberg))
    check_rows(p, rows_pyiceberg(table.refresh()), where="pyiceberg")
    check_kafka_reads(data_dir, p)
    off = maintain(data_dir, dataclasses.replace(config, orphan_file_age_ms=0), p.topic)
    assert off.orphans_deleted == 0 and young.exists()


# -- rows an outside engine deletes ----------------------------------------------------------------


@pytest.mark.xdist_group("spark")
def test_rows_an_outside_engine_deleted_leave_a_gap_that_the_entries_still_cover(produced, sqlite_catalog, spark_session, tmp_path, one_entry_a_cycle):
    p = produced[1]
    data_dir, config, _ = copy_of(produced, tmp_path, sqlite_catalog)
    identifier = f"{config.namespace}.{p.topic.replace('-', '_')}"
    before = read_index(data_dir, p.topic)
    catalog = register_catalog(spark_session, sqlite_catalog.target)
    collect(spark_session.sql(f"DELETE FROM {catalog}.{identifier} WHERE kafka.partition = 0 AND kafka.offset % 5 = 0"))  # copy-on-write: files rewritten without them

    assert maintain(data_dir, config, p.topic).reindexed_partitions >= 1
    after = read_index(data_dir, p.topic)
    for partition in range(PARTITIONS):  # the entries cover what they covered
        assert (after.manifests[partition][0][0].base_offset, after.manifests[partition][-1][0].last_offset) == (0, p.counts()[partition] - 1)
    assert after.produced_bytes == before.produced_bytes
    kept = Produced(p.topic, {k: w for k, w in p.want.items() if not (k[0] == 0 and k[1] % 5 == 0)}, {})
    assert len(kept.want) < len(p.want)
    table = load_catalog(config).load_table(identifier)
    check_index_reads(after, table, kept)  # the rows that exist, each once
    check_rows(kept, rows_pyiceberg(table), where="pyiceberg")
    check_kafka_reads(data_dir, kept)  # consumers skip the deleted offsets


@pytest.mark.xdist_group("spark")
def test_rows_an_outside_engine_deleted_with_delete_files_leave_the_files_kafka_reads(produced, sqlite_catalog, spark_session, tmp_path, one_entry_a_cycle):
    """Spark's DELETE in merge-on-read mode writes position delete files and leaves the data files
    as they were. The next round rewrites the data files those apply to without the deleted rows
    (as a copy-on-write DELETE would have), so Kafka consumers skip them as the table's readers do."""
    p = produced[1]
    data_dir, config, _ = copy_of(produced, tmp_path, sqlite_catalog)
    identifier = f"{config.namespace}.{p.topic.replace('-', '_')}"
    catalog = register_catalog(spark_session, sqlite_catalog.target)
    collect(spark_session.sql(f"ALTER TABLE {catalog}.{identifier} SET TBLPROPERTIES ('write.delete.mode' = 'merge-on-read')"))
    table = load_catalog(config).load_table(identifier)
    files_before = set(current_files(table))
    collect(spark_session.sql(f"DELETE FROM {catalog}.{identifier} WHERE kafka.partition = 1 AND kafka.offset % 7 = 3"))
    table = table.refresh()
    assert set(current_files(table)) == files_before  # the data files as they were: deletes in files of their own
    assert any(task.delete_files for task in table.scan().plan_files())

    outcome = maintain(data_dir, config, p.topic)
    assert outcome.files_rewritten >= 1 and outcome.reindexed_partitions >= 1
    table = table.refresh()
    assert not any(task.delete_files for task in table.scan().plan_files())
    kept = Produced(p.topic, {k: w for k, w in p.want.items() if not (k[0] == 1 and k[1] % 7 == 3)}, {})
    assert len(kept.want) < len(p.want)
    after = read_index(data_dir, p.topic)
    for partition in range(PARTITIONS):  # the entries cover what they covered
        assert (after.manifests[partition][0][0].base_offset, after.manifests[partition][-1][0].last_offset) == (0, p.counts()[partition] - 1)
    check_index_reads(after, table, kept)
    check_rows(kept, rows_pyiceberg(table), where="pyiceberg")
    check_kafka_reads(data_dir, kept)


# -- (f) a topic with nothing to compact ----------------------------------------------------------------


@pytest.mark.parametrize("check_ms", [0, 3_600_000])
def test_a_caught_up_topic_reads_its_table_only_when_its_check_is_due(produced, sqlite_catalog, tmp_path, check_ms):
    # Caught up, nothing due: a cycle reads no table to compact, and maintenance reads it once a
    # `table_check_interval_ms` (every cycle at 0; at an hour, in the first cycle alone).
    p = produced[1]
    data_dir, config, _ = copy_of(produced, tmp_path, sqlite_catalog)
    identifier = f"{config.namespace}.{p.topic.replace('-', '_')}"
    config = dataclasses.replace(config, runner="in-process", freshness_ms=0, table_check_interval_ms=check_ms)
    cycles = 5

    async def work(service, metadata, objects):
        catalog = await service.resources.catalog()
        load_table, reads = catalog.load_table, [[] for _ in range(cycles)]
        done = []
        for cycle in range(cycles):
            catalog.load_table = lambda name, *args, _reads=reads[cycle], **kwargs: _reads.append(name) or load_table(name, *args, **kwargs)
            done.append(await service.run_once())
        return done, reads

    done, reads = asyncio.run(with_service(data_dir, config, None, work))
    assert [c.cycle_id for cycle in done for c in cycle if c.table == identifier] == [None] * cycles  # caught up
    per_cycle = [sum(1 for name in names if name == identifier) for names in reads]
    # The first cycle reads it to finish any cycle a compactor left, and maintenance has a first look.
    assert per_cycle[0] >= 1 and per_cycle[1:] == [1 if check_ms == 0 else 0] * (cycles - 1)

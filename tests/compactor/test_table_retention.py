"""Issue 22's retention and deletion, and the restart after a re-index: records confluent-kafka
produced with timestamps days old (a table partitioned by day), then recent ones, then one with an
old timestamp again. With `neve.iceberg.retention.ms` of a day, the compactor moves each partition's
log start to its first recent record before any row goes (seen at the moment of the delete), then
drops the old days' files and rewrites the one holding the late record: a consumer from offset 0
(auto.offset.reset=earliest) gets exactly the records still in the table, table readers see
exactly those rows, and the index reads them. A topic deleted with `neve.iceberg.drop.on.delete`
loses its table, also when the deletion happened while no compactor ran; one without keeps its
table with every row. After a re-index, a restart finds the last cycle swapped (no error)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from compactor.catalog import load_catalog
from compactor.commits.reindex import finish_last_cycle
from compactor.maintenance import retention as retention_module
from compactor.maintenance.retention import DROP_ON_DELETE, DROP_PROPERTY, RETENTION_MS
from compactor.maintenance.rounds import MAINTENANCE
from compactor.rows.translator import RAW
from compactor.service import planning
from tests.compactor.produced import PARTITIONS, Produced, Want, check_rows, headers_of, key_of, produce
from tests.compactor.test_maintenance import check_index_reads, compact_in_cycles, read_index, with_service
from tests.compactor.test_service import WAIT_S, node_env, table_offsets, wait_for_table
from tests.fixtures import NeveNode, free_port
from tests.readers import rows_pyiceberg

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

DAY_MS = 86_400_000
OLD, NEW = 30, 12  # records per partition: days old, then recent
KEEP_MS = DAY_MS  # the table retention the tests set


def create_topic(bootstrap: str, prefix: str, **configs: str) -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1, config={"retention.ms": "-1", **configs})])[topic].result(30)
    return topic


def set_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the answer: a destroyed client fails its futures
    admin.incremental_alter_configs([resource])[resource].result(30)


def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)


def produce_days(bootstrap: str, topic: str) -> Produced:
    """Per partition: OLD records 2 and 3 days old (two table partitions), NEW an hour old; then
    one more in partition 0 with a 3-day-old timestamp. Returns what was acknowledged."""
    now = int(time.time() * 1000)
    want: dict = {}

    def item(partition: int, j: int, timestamp: int, codec: str):
        value = b"retained %d " % j * (j % 7 + 1)
        return partition, Want(codec, key_of(j, j), headers_of(j), timestamp, RAW, value_raw=value), value

    old = [item(j % PARTITIONS, j, now - (2 + j % 2) * DAY_MS - j, "none") for j in range(OLD * PARTITIONS)]
    produce(bootstrap, topic, "none", old, want)
    new = [item(j % PARTITIONS, j, now - 3_600_000 + j, "lz4") for j in range(OLD * PARTITIONS, (OLD + NEW) * PARTITIONS)]
    produce(bootstrap, topic, "lz4", new, want)
    produce(bootstrap, topic, "none", [item(0, 10_000, now - 3 * DAY_MS + 5, "none")], want)
    return Produced(topic, want, {})


def kept_of(p: Produced) -> tuple[Produced, dict[int, int]]:
    """What table retention of KEEP_MS keeps, and each partition's first kept offset: from each
    partition's first recent record on (the late old record after it stays)."""
    cutoff = int(time.time() * 1000) - KEEP_MS
    starts = {part: min(o for (q, o), w in p.want.items() if q == part and w.timestamp >= cutoff) for part in range(PARTITIONS)}
    return Produced(p.topic, {(q, o): w for (q, o), w in p.want.items() if o >= starts[q]}, {}), starts


def consume_from_zero(bootstrap: str, topic: str, counts: dict[int, int]) -> dict[tuple[int, int], tuple]:
    """Every record a consumer assigned at offset 0 of each partition gets (auto.offset.reset
    earliest), by (partition, offset), until `counts` are reached and a second passes with nothing."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ret-{time.monotonic_ns()}", "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: dict[tuple[int, int], tuple] = {}
    deadline = time.monotonic() + WAIT_S
    try:
        while True:
            msg = consumer.poll(1.0)
            if msg is None:
                if all(sum(1 for (q, _) in got if q == part) >= n for part, n in counts.items()):
                    return got
                assert time.monotonic() < deadline, f"consumed {len(got)} of {sum(counts.values())}"
                continue
            assert msg.error() is None, msg.error()
            got[(msg.partition(), msg.offset())] = (msg.key(), msg.value(), msg.headers() or [], msg.timestamp()[1])
    finally:
        consumer.close()


def as_consumed(p: Produced) -> dict[tuple[int, int], tuple]:
    return {k: (w.key, w.value_raw, [(h, v) for h, v in w.headers], w.timestamp) for k, w in p.want.items()}


def wait_until(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"no {what} after {WAIT_S} s"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def produced(tmp_path_factory) -> tuple[Path, Produced]:
    """produce_days through `neve dev` (its compactor off), the node stopped."""
    root = tmp_path_factory.mktemp("retention")
    (root / "node").mkdir()
    node = NeveNode(data_dir=root / "node", log_path=root / "node.log", env={"NEVE_WAL_LINGER_MS": "5", "NEVE_COMPACTOR_IN_NODE": "false"})
    with contextlib.ExitStack() as running:
        running.callback(lambda: node.stop() == 0 or pytest.fail("the node did not stop cleanly"))
        p = produce_days(node.start().bootstrap, create_topic(node.bootstrap, "ret"))
    return root / "node", p


def copy_of(produced, tmp_path: Path, iceberg, **settings):
    """The produced data dir copied, compacted a WAL entry a cycle into a namespace of its own."""
    data_dir, p = produced
    copy = tmp_path / "node"
    shutil.copytree(data_dir, copy)
    config = dataclasses.replace(iceberg.config, namespace=f"r{uuid.uuid4().hex[:8]}", maintenance_interval_ms=0, **settings)
    compact_in_cycles(copy, config, p.topic)
    return copy, config, f"{config.namespace}.{p.topic.replace('-', '_')}"


@pytest.fixture
def one_entry_a_cycle(monkeypatch):
    monkeypatch.setattr(planning, "MAX_ENTRIES_PER_PARTITION", 1)


# -- the restart after a re-index -------------------------------------------------------------------


def test_a_restart_after_a_reindex_finds_the_last_cycle_swapped(produced, sqlite_catalog, tmp_path, one_entry_a_cycle, caplog):
    p = produced[1]
    data_dir, config, identifier = copy_of(produced, tmp_path, sqlite_catalog)
    merging = dataclasses.replace(config, runner="in-process", maintenance_interval_ms=1, merge_min_files=2)

    async def merge(service, metadata, objects):
        return await service.maintain_topic(metadata.topics()[p.topic])

    assert asyncio.run(with_service(data_dir, merging, None, merge)).reindexed_partitions == PARTITIONS

    async def restart(service, metadata, objects):
        table = load_catalog(config).load_table(identifier)
        return await finish_last_cycle(metadata, objects, table)

    with caplog.at_level(logging.INFO, logger="neve.compactor"):
        outcome = asyncio.run(with_service(data_dir, config, None, restart))
    assert outcome is not None and outcome.conflicts == [] and outcome.swapped == []
    assert outcome.already  # the last cycle's partitions, covered by the re-index's entries
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


# -- table retention, in the service ------------------------------------------------------------------


@pytest.mark.parametrize("cycles", ["one", "an entry each"])
def test_table_retention_moves_the_log_start_first_then_drops_old_days_and_the_index_reads_the_rest(produced, sqlite_catalog, tmp_path, monkeypatch, cycles):
    p = produced[1]
    if cycles != "one":  # a file per WAL entry and day: every file with old rows holds only expired ones
        monkeypatch.setattr(planning, "MAX_ENTRIES_PER_PARTITION", 1)
    data_dir, config, identifier = copy_of(produced, tmp_path, sqlite_catalog)
    kept, starts = kept_of(p)
    assert 0 < len(kept.want) < len(p.want)
    config = dataclasses.replace(config, runner="in-process", maintenance_interval_ms=1, merge_min_files=1_000)
    at_delete: dict = {}
    real = retention_module.delete_before

    async def work(service, metadata, objects):
        info = metadata.topics()[p.topic]

        def spy(table, wanted, properties):  # what the Kafka view and the table say as the rows go
            at_delete["log_starts"] = {q: metadata.log_start_offset(info.topic_id, q) for q in range(PARTITIONS)}
            at_delete["wanted"] = dict(wanted)
            at_delete["rows"] = len(table.scan().to_arrow())
            return real(table, wanted, properties)

        monkeypatch.setattr(retention_module, "delete_before", spy)
        untouched = await service.maintain_topic(info)  # no table retention set: nothing goes
        # with the drop-on-delete mark written in the same round (the delete commits on the table it refreshed)
        await metadata.update_topic(p.topic, configs={RETENTION_MS: str(KEEP_MS), DROP_ON_DELETE: "true"})
        outcome = await service.maintain_topic(metadata.topics()[p.topic])
        again = await service.maintain_topic(metadata.topics()[p.topic])
        return untouched, outcome, again, {q: metadata.log_start_offset(info.topic_id, q) for q in range(PARTITIONS)}

    untouched, outcome, again, log_starts = asyncio.run(with_service(data_dir, config, None, work))
    assert untouched.rows_expired == 0
    assert at_delete["log_starts"] == starts == at_delete["wanted"] == log_starts  # moved before the delete
    assert at_delete["rows"] == len(p.want)  # every row still there when the log starts had moved
    assert outcome.rows_expired == len(p.want) - len(kept.want) and outcome.reindexed_partitions == PARTITIONS
    assert again.rows_expired == 0 and again.reindexed_partitions == 0
    table = load_catalog(config).load_table(identifier)
    retention_snapshot = table.current_snapshot()
    assert retention_snapshot.summary[MAINTENANCE] == "retention" and table.properties[DROP_PROPERTY] == "true"
    summary = retention_snapshot.summary.additional_properties
    if cycles == "one":  # a file per day: the older day's dropped whole, the one holding the late record rewritten
        assert (summary["deleted-data-files"], summary["added-data-files"]) == ("2", "1")
    else:  # files holding only expired rows, dropped whole
        assert int(summary["deleted-data-files"]) >= 2 and "added-data-files" not in summary
    check_rows(kept, rows_pyiceberg(table), where="pyiceberg")
    check_index_reads(read_index(data_dir, p.topic), table, kept)  # the index's entries read exactly the kept rows


# -- table retention and deletion in `neve dev` --------------------------------------------------------


def test_neve_dev_table_retention_a_consumer_from_zero_gets_exactly_the_rows_kept(neve_factory):
    node = neve_factory(env=node_env(free_port(), NEVE_COMPACTOR_MAINTENANCE_INTERVAL_MS="300"))
    topic = create_topic(node.bootstrap, "ret-dev")
    p = produce_days(node.bootstrap, topic)
    data_dir = Path(node.data_dir).resolve()
    wait_for_table(data_dir, p)
    assert consume_from_zero(node.bootstrap, topic, p.counts()) == as_consumed(p)  # nothing expires by default

    set_config(node.bootstrap, topic, RETENTION_MS, str(KEEP_MS))
    kept, starts = kept_of(p)
    wait_until(lambda: table_offsets(data_dir, topic) == sorted(kept.want), "table holding only the kept rows")
    assert consume_from_zero(node.bootstrap, topic, kept.counts()) == as_consumed(kept)
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "watermarks"})
    try:
        assert {q: consumer.get_watermark_offsets(TopicPartition(topic, q), timeout=30)[0] for q in range(PARTITIONS)} == starts
    finally:
        consumer.close()
    table = load_catalog(sqlite_config(data_dir)).load_table("neve." + topic.replace("-", "_"))
    check_rows(kept, rows_pyiceberg(table), where="pyiceberg")


def sqlite_config(data_dir: Path):
    """The catalog `neve dev` keeps in its data dir."""
    from compactor.config import CompactorConfig

    return CompactorConfig(catalog_url=f"sqlite:///{data_dir / 'catalog.db'}", warehouse=f"file://{data_dir / 'warehouse'}")


def data_files(data_dir: Path, topic: str) -> list[Path]:
    return list((data_dir / "warehouse").glob(f"neve/{topic.replace('-', '_')}-*/data/**/*.parquet"))  # a table's location ends in its topic id


def test_a_topic_deleted_with_drop_on_delete_loses_its_table_one_without_keeps_every_row(neve_factory):
    node = neve_factory(env=node_env(free_port()))
    data_dir = Path(node.data_dir).resolve()
    config = sqlite_config(data_dir)
    dropped = create_topic(node.bootstrap, "drop", **{DROP_ON_DELETE: "true"})
    kept = create_topic(node.bootstrap, "keep")
    later = create_topic(node.bootstrap, "drop-later", **{DROP_ON_DELETE: "true"})
    produced = {t: produce_days(node.bootstrap, t) for t in (dropped, kept, later)}
    for p in produced.values():
        wait_for_table(data_dir, p)
    catalog = load_catalog(config)
    wait_until(lambda: catalog.load_table("neve." + later.replace("-", "_")).properties.get(DROP_PROPERTY) == "true", "drop-on-delete mark")
    assert data_files(data_dir, dropped)

    delete_topic(node.bootstrap, dropped)
    delete_topic(node.bootstrap, kept)
    wait_until(lambda: not catalog.table_exists("neve." + dropped.replace("-", "_")), "table dropped")
    wait_until(lambda: not data_files(data_dir, dropped), "its files purged")  # the catalog entry goes first, then the files
    assert table_offsets(data_dir, kept) == sorted(produced[kept].want)
    check_rows(produced[kept], rows_pyiceberg(catalog.load_table("neve." + kept.replace("-", "_"))), where="kept")

    # deleted while no compactor ran: the next one to start drops the marked table
    assert node.stop() == 0
    node.env["NEVE_COMPACTOR_IN_NODE"] = "false"
    node.start()
    delete_topic(node.bootstrap, later)
    assert node.stop() == 0
    assert catalog.table_exists("neve." + later.replace("-", "_"))
    node.env["NEVE_COMPACTOR_IN_NODE"] = "true"
    node.start()
    wait_until(lambda: not catalog.table_exists("neve." + later.replace("-", "_")), "marked table dropped at start")
    wait_until(lambda: not data_files(data_dir, later), "its files purged")  # here too the catalog entry goes first
    assert table_offsets(data_dir, kept) == sorted(produced[kept].want)


def test_the_two_configs_are_declared_and_validated_as_kafkas_are():
    from broker.topic_configs import TOPIC_CONFIGS, InvalidConfig, check

    assert (TOPIC_CONFIGS[RETENTION_MS].default, TOPIC_CONFIGS[DROP_ON_DELETE].default) == ("-1", "false")
    assert check({RETENTION_MS: " 86400000 ", DROP_ON_DELETE: "TRUE"}) == {RETENTION_MS: "86400000", DROP_ON_DELETE: "true"}
    for name, value in ((RETENTION_MS, "-2"), (RETENTION_MS, "a day"), (RETENTION_MS, str(2**63)), (DROP_ON_DELETE, "yes")):
        with pytest.raises(InvalidConfig):
            check({name: value})

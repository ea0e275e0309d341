"""A table belongs to one topic, end to end on `neve dev` with confluent-kafka and the compactor in
the node:
- look-alike topics (`orders.eu`, `orders-eu`, `orders_eu`) and table configs naming another
  topic's table, or holding SQL, are refused at CreateTopics and AlterConfigs; and when two topics
  are forced onto one table name anyway (a topic the metadata store holds without the broker's
  check: two brokers racing, an older neve), the compactor refuses to write the second into the
  first's table, and both topics read back exactly;
- a topic deleted and made again gets a new table: read back from offset 0 after compaction,
  after a table merge and after its WAL objects are collected, it holds exactly its own records;
  the deleted topic's table is renamed aside with every row (or dropped when it asked)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError

from metadata.store import load_metadata_store
from table.names import default_table_name
from tests.compactor.test_service import WAIT_S, consume_all, node_env
from tests.fixtures import free_port
from tests.table.test_wal_collected import GC_ENV, wal_files

PARTITIONS = 2
KEEP = {"retention.ms": "-1"}  # the records' fixed timestamps are years old
HOSTILE = "neve.x\" AS SELECT 1; COPY (SELECT 42) TO '/tmp/neve-injected'; --"


def catalog_of(data_dir: Path) -> SqlCatalog:
    return SqlCatalog("neve", uri=f"sqlite:///{data_dir / 'catalog.db'}", warehouse=f"file://{data_dir / 'warehouse'}")


def table_rows(data_dir: Path, name: str) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every row of table neve.<name>, sorted ([] without the table)."""
    if not (data_dir / "catalog.db").exists():
        return []
    try:  # not table_exists, then load: a deleted topic's table may be renamed aside or purged meanwhile
        rows = catalog_of(data_dir).load_table(f"neve.{name}").scan(selected_fields=("kafka", "value_raw")).to_arrow().to_pylist()
    except (NoSuchTableError, FileNotFoundError):
        return []
    return sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["value_raw"]) for r in rows)


def wait_until(what: str, check) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"{what} after {WAIT_S} s"
        time.sleep(0.2)


def create(admin: AdminClient, topic: str, **configs: str) -> None:
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config={**KEEP, **configs})])[topic].result(60)


def refused_create(admin: AdminClient, topic: str, **configs: str) -> KafkaError:
    with pytest.raises(KafkaException) as caught:
        create(admin, topic, **configs)
    return caught.value.args[0]


def refused_alter(admin: AdminClient, topic: str, name: str, value: str) -> KafkaError:
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as caught:
        admin.incremental_alter_configs([resource])[resource].result(60)
    return caught.value.args[0]


def produce(bootstrap: str, topic: str, tag: str, count: int, start: int = 0) -> dict[tuple[int, int], tuple]:
    """`count` records (value `<tag>-<i>`), acknowledged: (partition, offset) -> (key, value, headers, timestamp)."""
    acked: dict[tuple[int, int], tuple] = {}

    def on_delivery(err, msg) -> None:
        assert err is None, err
        acked[(msg.partition(), msg.offset())] = (msg.key(), msg.value(), [], msg.timestamp()[1])

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(start, start + count):
        producer.produce(topic, key=b"k%d" % i, value=f"{tag}-{i}".encode(), partition=i % PARTITIONS, timestamp=1_700_000_000_000 + i, on_delivery=on_delivery)
    assert producer.flush(60) == 0
    assert len(acked) == count
    return acked


def topic_id(admin: AdminClient, topic: str) -> str:
    described = admin.describe_topics(TopicCollection([topic]))[topic].result(60).topic_id
    return str(uuid.UUID(int=((described.get_most_significant_bits() % 2**64) << 64) | (described.get_least_significant_bits() % 2**64)))


def counts(records: dict[tuple[int, int], tuple]) -> dict[int, int]:
    return {p: sum(1 for q, _ in records if q == p) for p in range(PARTITIONS)}


def as_rows(records: dict[tuple[int, int], tuple]) -> list[tuple[int, int, bytes]]:
    return sorted((p, o, v[1]) for (p, o), v in records.items())


def read_back(bootstrap: str, topic: str, records: dict[tuple[int, int], tuple]) -> None:
    """Every record of `topic` from offset 0 is exactly `records`: same offsets, keys, values, timestamps."""
    assert consume_all(bootstrap, topic, counts(records)) == records


def test_look_alike_topics_and_table_configs_naming_another_topics_table_or_sql_are_refused(neve_factory):
    node = neve_factory(env=node_env(free_port()))
    data_dir = Path(node.data_dir).resolve()
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    create(admin, "orders.eu")
    for look_alike in ("orders-eu", "orders_eu", "Orders_EU"):
        error = refused_create(admin, look_alike)
        assert error.code() == KafkaError.TOPIC_EXCEPTION and "orders.eu" in error.str(), error
    create(admin, "other")
    for value in ("orders_eu", "neve.orders_eu"):
        error = refused_create(admin, "third", **{"neve.iceberg.table": value})
        assert error.code() == KafkaError.INVALID_CONFIG and "orders.eu" in error.str(), error
        error = refused_alter(admin, "other", "neve.iceberg.table", value)
        assert error.code() == KafkaError.INVALID_CONFIG and "orders.eu" in error.str(), error
    for name, value in (("neve.iceberg.table", HOSTILE), ("neve.iceberg.table", "a.b.c"), ("neve.iceberg.partition.by", "day(timestamp); DROP TABLE x"), ("neve.iceberg.partition.by", "week(timestamp)")):
        assert refused_create(admin, "third", **{name: value}).code() == KafkaError.INVALID_CONFIG
        assert refused_alter(admin, "other", name, value).code() == KafkaError.INVALID_CONFIG
    assert sorted(t for t in admin.list_topics(timeout=30).topics if not t.startswith("_")) == ["orders.eu", "other"]
    assert admin.describe_configs([ConfigResource(ResourceType.TOPIC, "other")])[ConfigResource(ResourceType.TOPIC, "other")].result(60)["neve.iceberg.table"].value in ("", None)

    # the backstop: a look-alike the metadata store holds though no broker would have made it
    first = produce(node.bootstrap, "orders.eu", "dot", 20)
    wait_until("orders.eu's rows in its table", lambda: table_rows(data_dir, "orders_eu") == as_rows(first))
    assert node.stop() == 0

    async def force() -> None:
        store = load_metadata_store(f"sqlite:///{data_dir / 'metadata.db'}")
        await store.start()
        try:
            await store.create_topic("orders_eu", PARTITIONS, KEEP)
        finally:
            await store.close()

    asyncio.run(force())
    node.start()
    second = produce(node.bootstrap, "orders_eu", "underscore", 20)
    more = produce(node.bootstrap, "orders.eu", "dot", 10, start=20)
    first |= more
    wait_until("orders.eu's later rows in its table", lambda: table_rows(data_dir, "orders_eu") == as_rows(first))
    wait_until("the refusal in the node's log", lambda: "holds the rows of live topic" in Path(node.log_path).read_text(errors="replace"))
    assert table_rows(data_dir, "orders_eu") == as_rows(first)  # none of orders_eu's rows
    read_back(node.bootstrap, "orders.eu", first)
    read_back(node.bootstrap, "orders_eu", second)


def test_a_topic_made_again_reads_back_only_its_own_records_and_the_old_table_is_set_aside(neve_factory):
    node = neve_factory(env=node_env(free_port(), NEVE_COMPACTOR_MAINTENANCE_INTERVAL_MS="1000", NEVE_COMPACTOR_MERGE_MIN_FILES="2", NEVE_COMPACTOR_TABLE_CHECK_INTERVAL_MS="200", **GC_ENV))
    data_dir = Path(node.data_dir).resolve()
    catalog = catalog_of(data_dir)
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    kept, dropped = "re.made", "re.dropped"  # the first keeps its table on delete, the second asks for the drop
    create(admin, kept)
    create(admin, dropped, **{"neve.iceberg.drop.on.delete": "true"})
    old = {t: produce(node.bootstrap, t, "old", 30) for t in (kept, dropped)}
    for t, records in old.items():
        wait_until(f"{t}'s rows in its table", lambda t=t, records=records: table_rows(data_dir, default_table_name(t)) == as_rows(records))
    wait_until("the drop-on-delete mark", lambda: catalog.load_table(f"neve.{default_table_name(dropped)}").properties.get("neve.drop-on-delete") == "true")
    old_ids = {t: topic_id(admin, t) for t in (kept, dropped)}

    for t in (kept, dropped):
        admin.delete_topics([t])[t].result(60)
        wait_until(f"{t} deleted", lambda t=t: t not in admin.list_topics(timeout=30).topics)
        create(admin, t)
    new: dict[str, dict] = {t: {} for t in (kept, dropped)}
    for round_ in range(3):  # three cycles, three files per table partition: a merge is due
        for t in (kept, dropped):
            new[t] |= produce(node.bootstrap, t, f"new{round_}", 5, start=5 * round_)
            wait_until(f"{t}'s new rows in its new table", lambda t=t: table_rows(data_dir, default_table_name(t)) == as_rows(new[t]))

    # after compaction
    for t in (kept, dropped):
        read_back(node.bootstrap, t, new[t])
        assert catalog.load_table(f"neve.{default_table_name(t)}").properties["neve.topic-id"] == topic_id(admin, t) != old_ids[t]

    # after a table merge: one file per table partition, every offset still exactly once
    def merged(t: str) -> bool:
        table = catalog.load_table(f"neve.{default_table_name(t)}")
        summaries = [s.summary.additional_properties for s in table.snapshots() if s.summary is not None]
        return any(p.get("neve.maintenance") == "merge" for p in summaries)

    for t in (kept, dropped):
        wait_until(f"{t}'s table merged", lambda t=t: merged(t))
        assert table_rows(data_dir, default_table_name(t)) == as_rows(new[t])
        read_back(node.bootstrap, t, new[t])

    # after the WAL read grace: every WAL object collected, the records read from the tables alone
    wait_until("every WAL object collected", lambda: not wal_files(data_dir))
    for t in (kept, dropped):
        read_back(node.bootstrap, t, new[t])

    # the deleted topics' tables: one renamed aside with every row, the other dropped
    aside = f"{default_table_name(kept)}__{uuid.UUID(old_ids[kept]).hex[:8]}"
    assert table_rows(data_dir, aside) == as_rows(old[kept])
    assert catalog.load_table(f"neve.{aside}").properties["neve.topic-id"] == old_ids[kept]
    assert sorted(n for _, n in catalog.list_tables("neve")) == sorted([aside, default_table_name(kept), default_table_name(dropped)])
    assert not list((data_dir / "warehouse" / "neve").glob(f"{default_table_name(dropped)}-{uuid.UUID(old_ids[dropped]).hex}/data/**/*.parquet"))

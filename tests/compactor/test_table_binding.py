"""A table belongs to one topic, by topic id (compactor/commits/binding.py, tables.load_or_create), on a
real pyiceberg SQL catalog (SQLite): a new table is bound and lives in a directory of its own; a
table of another live topic is refused; a deleted topic's table under the name is renamed aside
(or dropped when it asked) with its rows intact; a table made by an older neve is adopted only
when its history is this topic's; and every step that writes or indexes a table refuses one that
is not bound to its topic."""

from __future__ import annotations

import uuid

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from compactor.commits.binding import TOPIC_PROPERTY, TableNotBound
from compactor.commits.committer import CYCLE, TOPIC_ID
from compactor.commits.rewrites import ManifestCache, reindex
from compactor.config import CompactorConfig
from compactor.files.layout import first_raw_schema
from compactor.files.writer import TableWriter
from compactor.maintenance.retention import DROP_PROPERTY, TableRetention, purge
from compactor.maintenance.rounds import TableMaintenance
from compactor.rows.records import Batch, Record
from compactor.rows.translator import kafka_columns, translate
from compactor.service import tables
from metadata.store import load_metadata_store
from wal.store import MemoryObjectStore


@pytest.fixture
def catalog(tmp_path):
    (tmp_path / "warehouse").mkdir()
    return SqlCatalog("neve", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")


@pytest.fixture
async def store():
    s = load_metadata_store("memory://")
    await s.start()
    yield s
    await s.close()


def older_neves_table(catalog, *cycle_topic_ids: str):
    """A table as a neve before binding made it (its first raw columns, no property), one cycle
    snapshot of three rows per topic id given."""
    catalog.create_namespace_if_not_exists("neve")
    table = catalog.create_table("neve.t", first_raw_schema())
    batch = Batch(0, 0, 100, 0, 0, 2, 0, 1, 1_700_000_000_000, 1_700_000_000_000, -1, -1, -1, 3)
    for i, topic_id in enumerate(cycle_topic_ids):
        writer = TableWriter(table.schema(), table.spec(), table.location() + "/data", table.io)
        for offset in range(3 * i, 3 * i + 3):
            writer.add(translate(Record(offset, 1_700_000_000_000, b"k", b"v", ()), kafka_columns(0, batch), None)[0], "raw")
        with table.transaction() as tx, tx.update_snapshot(snapshot_properties={CYCLE: f"c{i}", TOPIC_ID: topic_id}).fast_append() as append:
            for written in writer.close():
                append.append_data_file(written.data_file(table.spec()))
        table = table.refresh()
    return catalog.load_table("neve.t")


def test_a_new_table_is_bound_to_its_topic_and_lives_in_a_directory_named_by_its_id(catalog, tmp_path):
    topic_id = uuid.uuid4()
    table = tables.load_or_create(catalog, "neve.t", "none", topic_id)
    assert table.properties[TOPIC_PROPERTY] == str(topic_id)
    assert table.location() == f"file://{tmp_path}/warehouse/neve/t-{topic_id.hex}"
    assert tables.load_or_create(catalog, "neve.t", "none", topic_id).metadata_location == table.metadata_location


def test_a_table_bound_to_a_live_topic_is_refused_and_left_as_it_is(catalog):
    mine, theirs = uuid.uuid4(), uuid.uuid4()
    table = tables.load_or_create(catalog, "neve.t", "none", theirs)
    with pytest.raises(TableNotBound, match=str(theirs)):
        tables.load_or_create(catalog, "neve.t", "none", mine, live={str(mine), str(theirs)})
    assert catalog.load_table("neve.t").metadata_location == table.metadata_location
    assert catalog.list_tables("neve") == [("neve", "t")]


def test_a_deleted_topics_table_is_renamed_aside_and_the_new_topic_gets_a_new_table_in_a_directory_of_its_own(catalog):
    old, new = uuid.uuid4(), uuid.uuid4()
    table = tables.load_or_create(catalog, "neve.t", "none", old)
    with pytest.raises(TableNotBound, match="not known yet"):  # a stale view of the topics sets nothing aside
        tables.load_or_create(catalog, "neve.t", "none", new, live=None)
    assert catalog.list_tables("neve") == [("neve", "t")]
    fresh = tables.load_or_create(catalog, "neve.t", "none", new, live={str(new)})
    assert fresh.properties[TOPIC_PROPERTY] == str(new) and fresh.current_snapshot() is None
    aside = catalog.load_table(f"neve.t__{old.hex[:8]}")
    assert aside.properties[TOPIC_PROPERTY] == str(old) and aside.metadata_location == table.metadata_location
    assert not fresh.location().startswith(aside.location()) and not aside.location().startswith(fresh.location())
    assert sorted(catalog.list_tables("neve")) == [("neve", "t"), ("neve", f"t__{old.hex[:8]}")]


def test_an_older_neves_table_of_a_deleted_topic_is_renamed_aside_with_its_rows(catalog):
    old, new = uuid.uuid4(), uuid.uuid4()
    older_neves_table(catalog, str(old), str(old))
    before = catalog.load_table("neve.t").scan().to_arrow()
    fresh = tables.load_or_create(catalog, "neve.t", "none", new, live={str(new)})
    assert fresh.current_snapshot() is None and fresh.properties[TOPIC_PROPERTY] == str(new)
    assert catalog.load_table(f"neve.t__{old.hex[:8]}").scan().to_arrow() == before
    assert before.num_rows == 6


def test_a_deleted_topics_table_that_asked_to_be_dropped_is_dropped_for_the_new_one(catalog, tmp_path):
    old, new = uuid.uuid4(), uuid.uuid4()
    table = tables.load_or_create(catalog, "neve.t", "none", old)
    with table.transaction() as txn:
        txn.set_properties({DROP_PROPERTY: "true"})
    fresh = tables.load_or_create(catalog, "neve.t", "none", new, live={str(new)})
    assert fresh.properties[TOPIC_PROPERTY] == str(new)
    assert catalog.list_tables("neve") == [("neve", "t")]
    assert not list((tmp_path / "warehouse" / "neve" / f"t-{old.hex}").glob("**/*.metadata.json"))  # purged


def test_an_older_neves_table_is_adopted_only_when_every_cycle_in_it_is_this_topics(catalog):
    mine, theirs = uuid.uuid4(), uuid.uuid4()
    older_neves_table(catalog, str(mine), str(mine))
    adopted = tables.load_or_create(catalog, "neve.t", "none", mine, live={str(mine)})
    assert adopted.properties[TOPIC_PROPERTY] == str(mine) and adopted.scan().to_arrow().num_rows == 6

    catalog.drop_table("neve.t")
    older_neves_table(catalog, str(mine), str(theirs))  # two topics' rows in one table: adopted by neither
    with pytest.raises(TableNotBound, match=str(theirs)):
        tables.load_or_create(catalog, "neve.t", "none", mine, live={str(mine), str(theirs)})
    assert TOPIC_PROPERTY not in catalog.load_table("neve.t").properties


def test_a_table_config_naming_another_namespace_is_refused_by_the_compactor():
    assert tables.table_identifier("neve", "orders.eu", {}) == "neve.orders_eu"
    assert tables.table_identifier("neve", "o", {"neve.iceberg.table": "neve.eu"}) == "neve.eu"
    with pytest.raises(ValueError, match="namespace 'lake'"):
        tables.table_identifier("neve", "o", {"neve.iceberg.table": "lake.eu"})


async def test_maintenance_retention_reindex_and_purge_refuse_a_table_bound_to_another_topic(catalog, store):
    mine = await store.create_topic("t", 1, {"neve.iceberg.retention.ms": "0"})
    theirs = uuid.uuid4()
    table = tables.load_or_create(catalog, "neve.t", "none", theirs)
    objects = MemoryObjectStore()
    config = CompactorConfig(maintenance_interval_ms=1)

    async def no_spark():
        return None

    maintenance = TableMaintenance(config, store, objects, spark=no_spark)
    with pytest.raises(TableNotBound):
        await maintenance.maintain(catalog, mine, "neve.t", committed=True)
    with pytest.raises(TableNotBound):
        await TableRetention(store).expire(table, mine, {})
    with pytest.raises(TableNotBound):
        await reindex(store, objects, ManifestCache(objects), table, mine, "neve.t")
    assert purge(catalog, "neve.t", mine.topic_id) is False  # a deleted topic's purge never takes another's table
    after = catalog.load_table("neve.t")
    assert after.metadata_location == table.metadata_location and after.properties.get(DROP_PROPERTY) is None
    assert purge(catalog, "neve.t", theirs) is True
    assert catalog.list_tables("neve") == []


def test_the_topic_configs_the_compactor_reads_are_the_ones_the_broker_declares():
    from broker.topic_configs import TOPIC_CONFIGS
    from compactor.maintenance import retention

    for name in (tables.ENABLED, tables.TABLE, tables.PARTITION_BY, retention.RETENTION_MS, retention.DROP_ON_DELETE):
        assert name in TOPIC_CONFIGS

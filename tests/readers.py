"""Readers of an Iceberg table for tests, one per engine the product promises (pyiceberg, DuckDB
with its iceberg extension, Spark 3.5 with the Iceberg runtime), each returning the rows as the same
plain Python values, sorted, so that one expected list is compared with every engine's answer:
structs as dicts, lists as lists, binary as bytes, timestamptz as aware UTC datetimes (micros)."""

from __future__ import annotations

import datetime as dt
import functools
import gc
import threading
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

from compactor.catalog import CatalogTarget
from compactor.config import CompactorConfig
from neve.sql import duckdb_connect, set_s3_secret

UTC = dt.UTC


@dataclass
class IcebergCatalog:
    """A catalog a test writes tables to: its settings, how both engines open it, and pyiceberg's handle."""

    config: CompactorConfig
    target: CatalogTarget
    catalog: Any  # pyiceberg.catalog.Catalog


def normalize(value: Any) -> Any:
    """One engine's Python value as every reader returns it, and as a test writes what it expects:
    timestamps with a time zone in UTC; maps as dicts (Arrow, so pyiceberg and DuckDB, gives a map
    as a list of (key, value) tuples, which no other type gives; an empty map reads as [] there and
    {} in Spark, so expect a non-empty one); UUIDs as their text (DuckDB's and Spark's form); binary
    as bytes."""
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        return {normalize(k): normalize(v) for k, v in value}
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def sorted_rows(rows: list[dict]) -> list[dict]:
    """Rows in one order whatever the engine's (files and splits come back in any order)."""
    rows = [normalize(r) for r in rows]
    return sorted(rows, key=repr)


# -- pyiceberg ---------------------------------------------------------------------------------------


def rows_pyiceberg(table, snapshot_id: int | None = None) -> list[dict]:
    """pyiceberg's scan of `table` (a pyiceberg Table), at `snapshot_id` or its current snapshot.
    pyiceberg 0.12 reads a null list<struct> as [] (apache/iceberg-python#3833); the others read null."""
    return sorted_rows(table.scan(snapshot_id=snapshot_id).to_arrow().to_pylist())


# -- DuckDB --------------------------------------------------------------------------------------------

_duckdb_lock = threading.Lock()


@functools.cache
def duckdb_connection():
    """One in-memory DuckDB per process, its extensions loaded as `neve sql` loads them."""
    return duckdb_connect()


def rows_duckdb(table, snapshot_id: int | None = None) -> list[dict]:
    """DuckDB's `iceberg_scan` of `table`'s current metadata file (local or S3: the S3 settings
    are taken from the table's FileIO), at `snapshot_id` or the metadata's current snapshot."""
    location = table.metadata_location
    at = f", snapshot_from_id={int(snapshot_id)}" if snapshot_id is not None else ""
    with _duckdb_lock:
        con = duckdb_connection()
        if location.startswith("s3://"):
            set_s3_secret(con, dict(table.io.properties))
        result = con.execute(f"SELECT * FROM iceberg_scan('{location}'{at})").to_arrow_table()
    return sorted_rows(result.to_pylist())


def rows_duckdb_rest(target: CatalogTarget, identifier: str, snapshot_id: int | None = None) -> list[dict]:
    """DuckDB reading through the REST catalog itself (ATTACH ... TYPE iceberg), as a user of a
    REST catalog would; `identifier` is `namespace.table`."""
    client_id, _, client_secret = target.credential.partition(":")
    alias = f"rest_{abs(hash((target.uri, target.warehouse))) % 10**8}"
    at = f" AT (VERSION => {int(snapshot_id)})" if snapshot_id is not None else ""
    namespace, table = identifier.split(".")
    with _duckdb_lock:
        con = duckdb_connection()
        set_s3_secret(con, target.io)
        attached = {r[0] for r in con.execute("SELECT database_name FROM duckdb_databases()").fetchall()}
        if alias not in attached:
            con.execute(f"CREATE OR REPLACE SECRET {alias} (TYPE iceberg, CLIENT_ID '{client_id}', CLIENT_SECRET '{client_secret}', "
                        f"OAUTH2_SERVER_URI '{target.uri}/v1/oauth/tokens')")  # fmt: skip
            warehouse = target.warehouse.removeprefix("s3://").strip("/")
            con.execute(f"ATTACH '{warehouse}' AS {alias} (TYPE iceberg, ENDPOINT '{target.uri}', SECRET {alias})")
        result = con.execute(f'SELECT * FROM {alias}."{namespace}"."{table}"{at}').to_arrow_table()
    return sorted_rows(result.to_pylist())


# -- Spark ---------------------------------------------------------------------------------------------


def rows_spark(spark, catalog: str, identifier: str, snapshot_id: int | None = None) -> list[dict]:
    """Spark SQL's answer for `catalog`.`identifier` (namespace.table), at `snapshot_id` (VERSION AS OF)
    or the current snapshot. `catalog` must be registered in the session (compactor.files.spark.register_catalog)."""
    name = ".".join(f"`{part}`" for part in (catalog, *identifier.split(".")))
    at = f" VERSION AS OF {int(snapshot_id)}" if snapshot_id is not None else ""
    df = spark.sql(f"SELECT * FROM {name}{at}")
    schema = df.schema
    return sorted_rows([{f.name: _spark_value(row[f.name], f.dataType) for f in schema.fields} for row in collect(df)])


def collect(df) -> list:
    """`df.collect()` without pyspark's ResourceWarning: pyspark 3.5 leaves the local socket each
    collect reads its rows from to the garbage collector ("will be automatically closed when
    garbage-collected"), which the suite's warnings-as-errors would report as a failure."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        rows = df.collect()
        gc.collect()
    return rows


def _spark_value(value: Any, data_type) -> Any:
    """A collected Spark value as the other readers give it: pyspark hands timestamps (with time
    zone) back as naive datetimes in this process's local time, structs as Rows, binary as bytearray."""
    from pyspark.sql import types as T

    if value is None:
        return None
    if isinstance(data_type, T.TimestampType):
        return value.astimezone(UTC)  # naive: local time, which astimezone assumes
    if isinstance(data_type, T.StructType):
        return {f.name: _spark_value(value[f.name], f.dataType) for f in data_type.fields}
    if isinstance(data_type, T.ArrayType):
        return [_spark_value(v, data_type.elementType) for v in value]
    if isinstance(data_type, T.MapType):
        return {_spark_value(k, data_type.keyType): _spark_value(v, data_type.valueType) for k, v in value.items()}
    return normalize(value)

"""A topic's Iceberg table: its name, its creation on first compaction (the raw columns, partitioned
by `neve.iceberg.partition.by`), and its evolution by union with every version of the topic's value
subject (`<topic>-value`, Confluent's TopicNameStrategy), oldest first (seed 003 §4.5). A version
the table cannot take (a type change Iceberg cannot promote) is not an error: its values stay raw,
with the reason. Synchronous (pyiceberg is): the service runs it off the event loop.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import avro_types, layout
from .writer import DEFAULT_ROW_GROUP_BYTES, DEFAULT_ROW_GROUP_ROWS, ROW_GROUP_BYTES_PROPERTY, ROW_GROUP_ROWS_PROPERTY

log = logging.getLogger("neve.compactor.tables")

# Topic configs the compactor reads (declared, with their documentation, in broker/topic_configs.py,
# which the compactor may not import; tests/compactor/test_tables.py checks the names agree).
ENABLED = "neve.iceberg.enabled"
TABLE = "neve.iceberg.table"
PARTITION_BY = layout.PARTITION_BY_CONFIG  # "neve.iceberg.partition.by"


# Row groups of a few MiB in the files the compactor writes (compactor/writer.py reads these too)
# and those maintenance (or Spark's rewrite_data_files) writes: a Kafka
# fetch reads and rebuilds a partition's rows a row group at a time (table/serve.py), and Iceberg's
# defaults (128 MiB, 1M rows) would make a consumer's first fetch of a merged file decode all of it.
# Query engines read row groups of this size well (DuckDB's own default is 122,880 rows).
# And a table.metadata.json of each commit kept only for the last 100 commits (Iceberg's
# write.metadata.previous-versions-max): a commit every few seconds otherwise leaves tens of
# thousands of them a day. Snapshots are in the current metadata: time travel keeps working.
TABLE_PROPERTIES = {
    ROW_GROUP_BYTES_PROPERTY: str(DEFAULT_ROW_GROUP_BYTES),
    ROW_GROUP_ROWS_PROPERTY: str(DEFAULT_ROW_GROUP_ROWS),
    "write.metadata.delete-after-commit.enabled": "true",
}


def is_enabled(configs: Mapping[str, str], default: bool) -> bool:
    value = configs.get(ENABLED)
    return default if value is None else value.strip().lower() == "true"


def table_identifier(namespace: str, topic: str, configs: Mapping[str, str]) -> str:
    """`neve.iceberg.table` when set (with `namespace` added if it names no namespace), else the
    topic's name in `namespace`, with the characters SQL engines quote (`.`, `-`) made `_`."""
    name = configs.get(TABLE, "").strip()
    if name:
        return name if "." in name else f"{namespace}.{name}"
    return f"{namespace}.{re.sub(r'[^A-Za-z0-9_]', '_', topic)}"


def value_subject(topic: str) -> str:
    return f"{topic}-value"


def load_or_create(catalog, identifier: str, partition_by: str | None):
    """The table, created with the raw columns when it does not exist yet (the value column comes
    with the first schema, by union, which keeps the raw columns' field ids)."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError

    try:
        return layout.upgrade_raw_columns(catalog.load_table(identifier))
    except NoSuchTableError:
        pass
    namespace = identifier.rsplit(".", 1)[0]
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    schema = layout.table_schema()
    try:
        table = catalog.create_table(identifier, schema, partition_spec=layout.partition_spec(schema, partition_by), properties=TABLE_PROPERTIES)
        log.info("table created", extra={"table": identifier, "partition_by": partition_by or layout.DEFAULT_PARTITION_BY})
        return table
    except TableAlreadyExistsError:  # another compactor, or a user, made it meanwhile
        return catalog.load_table(identifier)


@dataclass(frozen=True, slots=True)
class ResolvedSchema:
    """One registered version as the job will use it: its text, and why its values stay raw (None
    when they become columns)."""

    schema_id: int
    schema_type: str
    text: str
    raw_reason: str | None = None


def apply_schemas(table, versions: Sequence[tuple[int, int, object]]):
    """Evolve `table` by union with each Avro version in `versions` ((version, schema id, Schema)
    from registry.client.SchemaLookup.subject_schemas), oldest first. Returns the refreshed table and
    {schema id: ResolvedSchema}."""
    resolved: dict[int, ResolvedSchema] = {}
    for version, schema_id, schema in versions:
        kind = schema.type.value if hasattr(schema.type, "value") else str(schema.type)
        if kind.upper() != "AVRO":
            resolved[schema_id] = ResolvedSchema(schema_id, kind, schema.text, f"schema {schema_id} is {kind}, columns are laid out for Avro only")
            continue
        try:
            value = avro_types.value_layout(avro_types.parse(schema.text))
        except Exception as e:  # fastavro's parse errors: the registry validated it, so rare
            resolved[schema_id] = ResolvedSchema(schema_id, kind, schema.text, f"schema {schema_id} does not parse as Avro: {e}")
            continue
        if value.iceberg is None:
            resolved[schema_id] = ResolvedSchema(schema_id, kind, schema.text, None)  # the translator says why per value
            continue
        evolution = avro_types.evolve(table.schema(), value.iceberg)
        if evolution.incompatible:
            reason = f"schema {schema_id} (version {version}) cannot evolve the table: {evolution.incompatible}"
            log.warning("incompatible schema kept raw", extra={"table": str(table.name()), "schema_id": schema_id, "reason": evolution.incompatible})
            resolved[schema_id] = ResolvedSchema(schema_id, kind, schema.text, reason)
            continue
        if evolution.changed:
            with table.update_schema() as update:
                update.union_by_name(avro_types.union_schema(value.iceberg))
            table = table.refresh()
            log.info("table schema evolved", extra={"table": str(table.name()), "schema_id": schema_id, "version": version})
        resolved[schema_id] = ResolvedSchema(schema_id, kind, schema.text, None)
    return table, resolved

"""A topic's Iceberg table: its name (table/names.py), its creation on first compaction (the raw
columns, partitioned by `neve.iceberg.partition.by`) bound to its topic's id (commits/binding.py; a
deleted topic's table under the name is set aside first), and its evolution by union with every version of the topic's value
subject (`<topic>-value`, Confluent's TopicNameStrategy), oldest first (seed 003 §4.5). A version
the table cannot take (a type change Iceberg cannot promote) is not an error: its values stay raw,
with the reason. Synchronous (pyiceberg is): the service runs it off the event loop.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from pyiceberg.catalog import MetastoreCatalog

from table import names

from ..commits import binding, committer
from ..files import layout
from ..files.writer import DEFAULT_ROW_GROUP_BYTES, DEFAULT_ROW_GROUP_ROWS, ROW_GROUP_BYTES_PROPERTY, ROW_GROUP_ROWS_PROPERTY
from ..maintenance import retention
from ..rows import avro_types

log = logging.getLogger("neve.compactor.tables")

# Topic configs the compactor reads (declared, with their documentation, in broker/topic_configs.py,
# which the compactor may not import; tests/compactor/test_table_binding.py checks the names agree).
ENABLED = "neve.iceberg.enabled"
TABLE = names.TABLE_CONFIG
PARTITION_BY = layout.PARTITION_BY_CONFIG  # "neve.iceberg.partition.by"


# Row groups of a few MiB in the files the compactor writes (compactor/files/writer.py reads these too)
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
    """`neve.iceberg.table` when set, else the topic's name with the characters SQL engines quote
    (`.`, `-`) made `_` (table/names.py), in `namespace`. A table config naming another namespace
    is refused (ValueError): the compactor keeps the tables of its own namespace only."""
    ns, name = names.table_of(topic, configs)
    if ns is not None and ns != namespace:
        raise ValueError(f"{TABLE}={configs.get(TABLE)!r} of topic {topic!r} names namespace {ns!r}: this compactor keeps the tables of namespace {namespace!r} only")
    return f"{namespace}.{name}"


def value_subject(topic: str) -> str:
    return f"{topic}-value"


def live_topic_ids(metadata) -> frozenset[str] | None:
    """The ids of the topics that exist, None while the metadata view may be stale (a topic
    missing from it need not be deleted, so no table may be set aside on its account)."""
    return frozenset(str(t.topic_id) for t in metadata.topics().values()) if metadata.is_current() else None


def load_or_create(catalog, identifier: str, partition_by: str | None, topic_id: uuid.UUID | str, live: Collection[str] | None = ()):
    """The table of topic `topic_id`, created with the raw columns when it does not exist yet (the
    value column comes with the first schema, by union, which keeps the raw columns' field ids),
    bound to the topic (compactor/commits/binding.py). `live` holds the ids of the topics that exist (None:
    not known, and no table is set aside).

    A table under the name bound to another topic: when that topic is live, TableNotBound (two
    topics never share a table); when it was deleted, its table is set aside (renamed
    `<name>__<its id's first 8 hex digits>`, or dropped when it asked for drop-on-delete) and a
    new one made, so a topic made again never reads or writes the deleted one's rows. A table
    made by an older neve, not bound yet, is adopted when every neve cycle in its history is this
    topic's."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError

    topic_id = str(topic_id)
    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        table = None
    if table is not None:
        owner = binding.bound_topic(table)
        if owner == topic_id:
            return layout.upgrade_raw_columns(table)
        owners = {owner} if owner is not None else _cycle_topic_ids(table)
        if owners <= {topic_id}:
            return layout.upgrade_raw_columns(_adopt(table, topic_id))
        if live is None:
            raise binding.TableNotBound(f"table {identifier} is bound to topic id(s) {', '.join(sorted(owners))}, not {topic_id}, and which topics exist is not known yet: set aside later")
        if owners & set(live):
            raise binding.TableNotBound(f"table {identifier} holds the rows of live topic id(s) {', '.join(sorted(owners & set(live)))}, not of topic id {topic_id}: a table belongs to one topic")
        _set_aside(catalog, table, identifier, sorted(owners)[0])
    namespace, name = identifier.rsplit(".", 1)
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    except Exception:  # made meanwhile by another table's creation (the SQL catalog's check and insert race)
        if not catalog.namespace_exists(namespace):
            raise
    schema = layout.table_schema()
    try:
        table = catalog.create_table(
            identifier,
            schema,
            location=_location(catalog, namespace, name, topic_id),
            partition_spec=layout.partition_spec(schema, partition_by),
            properties={**TABLE_PROPERTIES, binding.TOPIC_PROPERTY: topic_id},
        )
        log.info("table created", extra={"table": identifier, "topic_id": topic_id, "partition_by": partition_by or layout.DEFAULT_PARTITION_BY})
        return table
    except TableAlreadyExistsError:  # another compactor, or a user, made it meanwhile
        table = catalog.load_table(identifier)
        binding.require(table, topic_id)
        return layout.upgrade_raw_columns(table)


def _cycle_topic_ids(table) -> set[str]:
    """The topic ids the neve cycles of every snapshot the table keeps name ("" for a cycle that names none)."""
    summaries = (s.summary.additional_properties for s in table.snapshots() if s.summary is not None)
    return {props.get(committer.TOPIC_ID, "") for props in summaries if committer.CYCLE in props}


def _adopt(table, topic_id: str):
    with table.transaction() as txn:
        txn.set_properties({binding.TOPIC_PROPERTY: topic_id})
    log.info("table bound to its topic (made by an older neve, only this topic's cycles in it)", extra={"table": str(table.name()), "topic_id": topic_id})
    return table.refresh()


def _set_aside(catalog, table, identifier: str, owner: str) -> None:
    """Move the table of deleted topic `owner` out of the name: dropped and purged when it asked
    for that (the table property drop-on-delete sets), else renamed with all its rows."""
    if table.properties.get(retention.DROP_PROPERTY) == "true":
        if retention.purge(catalog, identifier, owner):
            log.info("dropped a deleted topic's table to make its name's new one", extra={"table": identifier, "topic_id": owner})
        return
    from pyiceberg.exceptions import TableAlreadyExistsError

    digits = owner.replace("-", "") or "unbound"
    for aside in (f"{identifier}__{digits[:8]}", f"{identifier}__{digits}"):
        try:
            catalog.rename_table(identifier, aside)
        except TableAlreadyExistsError:
            continue
        log.warning("a deleted topic's table renamed aside: its topic's name has a new topic", extra={"table": identifier, "renamed": aside, "topic_id": owner})
        return
    raise binding.TableNotBound(f"table {identifier} of deleted topic id {owner} could not be renamed aside: {identifier}__{digits} exists")


def _location(catalog, namespace: str, name: str, topic_id: str) -> str | None:
    """Where a topic's new table lives: the catalog's usual place for it with the topic id added,
    so that a table made again under a name never shares a directory (nor orphan-file cleanup)
    with the one set aside. None (the catalog decides) when no warehouse or namespace location says
    where that is (a REST catalog's server)."""
    base = catalog.load_namespace_properties(namespace).get("location", "").rstrip("/")
    if not base and isinstance(catalog, MetastoreCatalog) and (warehouse := catalog.properties.get("warehouse", "").rstrip("/")):
        base = f"{warehouse}/{namespace}"
    return f"{base}/{name}-{topic_id.replace('-', '')}" if base else None


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

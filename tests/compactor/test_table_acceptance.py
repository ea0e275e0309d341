"""Issue 21's table acceptance: records that confluent-kafka produced to `neve dev` (raw values, Avro
values from its AvroSerializer against neve's registry, every Avro type the table lays out,
tombstones and malformed values, through every codec) are compacted by the compaction service on
Spark into each catalog (SQLite; PostgreSQL; SeaweedFS's REST catalog, its table files on
SeaweedFS's S3), then pyiceberg, DuckDB and Spark each read exactly the acknowledged records: one
row per (partition, offset), every field as produced, value_raw exactly where expected.

Schema evolution: v1 (an int field), compact; v2 adds an optional field and promotes the int to a
long (BACKWARD-compatible, under the same subject), compact; every reader sees both cycles' rows,
the old ones null in the new column and the promoted column as long. A v3 the table cannot take
(string→int, registered under compatibility NONE) is still stored, raw with its reason, and the v2
values after it in the same cycle are columns: the topic never blocks. Time travel: the snapshot of
each cycle gives exactly the rows up to that cycle, in that snapshot's schema, in every reader.

The node's records are produced once per module; each catalog compacts its own copy of the node's
data dir (a cycle swaps the index to the table it committed to). One Spark session for all."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import shutil
from pathlib import Path

import pytest
from pyiceberg.types import LongType

from compactor.catalog import load_catalog
from compactor.commits.committer import OFFSETS
from compactor.files.spark import register_catalog
from compactor.rows.translator import COLUMNS, RAW, TOMBSTONE
from compactor.service.cycle import TopicCycle
from compactor.service.loop import CompactionService
from metadata.model import ObjectType
from metadata.store import load_metadata_store
from registry.client import StoreLookup
from tests.compactor.produced import CODECS, PARTITIONS, Produced, Want, check_rows, headers_of, key_of, produce, produce_avro, produce_raw, timestamp_of
from tests.fixtures import NeveNode, free_port
from tests.readers import IcebergCatalog, rows_duckdb, rows_duckdb_rest, rows_pyiceberg, rows_spark
from wal.store import load_object_store

pytestmark = [
    pytest.mark.integration,
    pytest.mark.xdist_group("spark"),
    # a module fixture's setup (producing, starting nodes, a Spark cycle per topic and catalog) is
    # timed with the first test that uses it
    pytest.mark.timeout(900),
]

CATALOGS = ["sqlite_catalog", "postgres_catalog", "rest_catalog"]
READERS = ["pyiceberg", "duckdb", "spark"]


# -- the node and the service --------------------------------------------------------------------


def start_node(data_dir: Path, registry_port: int) -> NeveNode:
    """`neve dev` with its registry on `registry_port`, the compactor off (the test runs it)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {"NEVE_REGISTRY_PORT": str(registry_port), "NEVE_WAL_LINGER_MS": "5", "NEVE_COMPACTOR_IN_NODE": "false"}
    node = NeveNode(data_dir=data_dir, log_path=data_dir.parent / f"{data_dir.name}.log", env=env)
    return node.start()


def compact(data_dir: Path, iceberg: IcebergCatalog, spark, topic: str) -> list[TopicCycle]:
    """The compaction service over a stopped node's data dir, its tasks on `spark`, cycling `topic`
    into `iceberg`'s catalog until nothing is due: the cycles that committed."""
    config = dataclasses.replace(iceberg.config, runner="spark", freshness_ms=0, parallelism=2)
    objects_url = f"file://{data_dir.resolve() / 'objects'}"

    async def run() -> list[TopicCycle]:
        metadata = load_metadata_store(f"sqlite:///{data_dir.resolve() / 'metadata.db'}")
        objects = load_object_store(objects_url)
        await metadata.start()
        lookup = StoreLookup(metadata)
        service = CompactionService(config, metadata, objects, objects_url, lookup, spark=spark)
        try:
            done = []
            while (cycle := await service.compact_topic(metadata.topics()[topic])).cycle_id is not None:
                done.append(cycle)
            info = metadata.topics()[topic]
            types = {e.object_type for p in range(info.partitions) for e in metadata.entries(info.topic_id, p, 0, max_entries=10_000)}
            assert types == {ObjectType.PARQUET}, f"{topic}: the index still names WAL entries"
            return done
        finally:
            await service.close()
            await lookup.close()
            await metadata.close()
            await objects.close()

    return asyncio.run(run())


def read(reader: str, iceberg: IcebergCatalog, identifier: str, spark, snapshot_id: int | None = None) -> dict[str, list[dict]]:
    """The table's rows as `reader` gives them, by how it was asked (DuckDB reads a REST catalog's
    table both by its metadata file and through the catalog)."""
    if reader == "pyiceberg":  # a catalog handle of its own, as another process would have
        return {"pyiceberg": rows_pyiceberg(load_catalog(iceberg.config).load_table(identifier), snapshot_id)}
    if reader == "duckdb":
        out = {"duckdb iceberg_scan": rows_duckdb(load_catalog(iceberg.config).load_table(identifier), snapshot_id)}
        if iceberg.target.kind == "rest":
            out["duckdb ATTACH (REST)"] = rows_duckdb_rest(iceberg.target, identifier, snapshot_id)
        return out
    return {"spark": rows_spark(spark, register_catalog(spark, iceberg.target), identifier, snapshot_id)}


# -- every record, every reader, every catalog ---------------------------------------------------


CLOCK = {
    "type": "record", "name": "Clock", "namespace": "neve.test",
    "fields": [
        {"name": "n", "type": "int"},
        {"name": "t_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "t_us", "type": {"type": "long", "logicalType": "time-micros"}},
    ],
}  # fmt: skip


def produce_clock(bootstrap: str, registry_url: str) -> Produced:
    """Avro values with Avro's two time types, kept as microseconds since midnight (Spark 3.5
    cannot read a table that has an Iceberg time column at all)."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from tests.scenarios.records import create_topic

    topic = create_topic(bootstrap, PARTITIONS, prefix="clock")
    client = SchemaRegistryClient({"url": registry_url})
    try:
        schema_id = client.register_schema(f"{topic}-value", Schema(json.dumps(CLOCK), "AVRO"))
        serializer, context = AvroSerializer(client, json.dumps(CLOCK)), SerializationContext(topic, MessageField.VALUE)
        items, want = [], {}
        for j in range(20):
            value = {"n": j, "t_ms": dt.time(j, 59, 58, j * 1000), "t_us": dt.time(23, j, 0, 999_999 - j)}
            micros = {"t_ms": ((j * 60 + 59) * 60 + 58) * 1_000_000 + j * 1000, "t_us": ((23 * 60 + j) * 60) * 1_000_000 + 999_999 - j}
            row = Want("zstd", key_of(j, j), headers_of(j), timestamp_of(j), COLUMNS, value={**value, **micros}, schema_id=schema_id)
            items.append((j % PARTITIONS, row, serializer(value, context)))
        produce(bootstrap, topic, "zstd", items, want)
    finally:
        client.close()
    return Produced(topic, want, {schema_id: (json.dumps(CLOCK), None)})


@pytest.fixture(scope="module")
def produced(tmp_path_factory) -> tuple[Path, list[Produced], Produced]:
    """Raw and Avro records produced once through `neve dev`, the node stopped: its data dir, the
    topics every reader reads, and the topic with time fields."""
    registry_port = free_port()
    node = start_node(tmp_path_factory.mktemp("produced") / "node", registry_port)
    registry_url = f"http://127.0.0.1:{registry_port}"
    try:
        topics = [produce_raw(node.bootstrap), produce_avro(node.bootstrap, registry_url)]
        clock = produce_clock(node.bootstrap, registry_url)
    finally:
        assert node.stop() == 0
    return node.data_dir, topics, clock


@pytest.fixture(scope="module", params=CATALOGS)
def compacted(request, produced, spark_session, tmp_path_factory) -> tuple[IcebergCatalog, dict[str, TopicCycle]]:
    """`produced` compacted into one catalog from a copy of the node's data dir: each topic's cycle."""
    iceberg = request.getfixturevalue(request.param)
    data_dir, topics, clock = produced
    copy = tmp_path_factory.mktemp(request.param) / "node"
    shutil.copytree(data_dir, copy)
    cycles = {}
    for p in (*topics, clock):
        (cycle,) = compact(copy, iceberg, spark_session, p.topic)  # a few hundred records: one cycle
        assert (cycle.rows, cycle.offsets) == (len(p.want), {part: (0, n - 1) for part, n in p.counts().items()})
        cycles[p.topic] = cycle
    return iceberg, cycles


def test_each_topic_is_one_snapshot_naming_its_offsets(compacted, produced):
    iceberg, cycles = compacted
    for p in (*produced[1], produced[2]):
        table = load_catalog(iceberg.config).load_table(cycles[p.topic].table)
        (snapshot,) = table.snapshots()
        assert snapshot.snapshot_id == cycles[p.topic].snapshot_id
        assert json.loads(snapshot.summary[OFFSETS]) == {str(part): [0, n - 1] for part, n in p.counts().items()}
        assert ("value" in table.schema().column_names) == bool(p.schemas)
        if iceberg.target.kind == "rest":  # the table files are on SeaweedFS's S3
            assert table.location().startswith("s3://")
            # (table.inspect.files() fails on the uuid column's bounds: pyarrow has no min/max of an extension type)
            paths = [task.file.file_path for task in table.scan().plan_files()]
            assert paths and all(path.startswith(table.location() + "/") for path in paths)


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_sees_exactly_the_acknowledged_records(compacted, produced, reader, spark_session):
    iceberg, cycles = compacted
    for p in produced[1]:
        for how, rows in read(reader, iceberg, cycles[p.topic].table, spark_session).items():
            check_rows(p, rows, where=f"{iceberg.config.catalog_name} {how}")


@pytest.mark.parametrize("reader", READERS)
def test_time_fields_read_as_microseconds_of_the_day(compacted, produced, reader, spark_session):
    iceberg, cycles = compacted
    clock = produced[2]
    for how, rows in read(reader, iceberg, cycles[clock.topic].table, spark_session).items():
        check_rows(clock, rows, where=f"{iceberg.config.catalog_name} {how}")


# -- schema evolution and time travel ------------------------------------------------------------

V1 = {
    "type": "record", "name": "Reading", "namespace": "neve.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "count", "type": "int"},
    ],
}  # fmt: skip
# BACKWARD-compatible with V1: an optional field added, int promoted to long
V2 = {**V1, "fields": [V1["fields"][0], V1["fields"][1], {"name": "count", "type": "long"}, {"name": "email", "type": ["null", "string"], "default": None}]}
# No Iceberg promotion from string to int: registered under NONE, its values stay raw
V3 = {**V2, "fields": [V2["fields"][0], {"name": "name", "type": "int"}, *V2["fields"][2:]]}
PER_PHASE = 40


def _value(phase: int, j: int) -> dict:
    value = {"id": 2**40 + j, "name": f"n{j}" * (j % 3 + 1), "count": -(2**31) + j if phase == 1 else 2**40 + j}
    if phase >= 2:
        value["email"] = None if j % 3 == 0 else f"u{j}@example.com"
    if phase == 3 and j % 2 == 0:
        value["name"] = j  # a v3 value
    return value


def _produce_phase(bootstrap: str, registry_url: str, topic: str, phase: int) -> Produced:
    """Phase 1: V1 values; 2: V2; 3: V3 and V2 alternating. Every 7th record a tombstone. Wants are
    the rows as the final table reads them (v1 rows null in `email`)."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    subject = f"{topic}-value"
    try:
        if phase == 3:
            client.set_compatibility(subject, "NONE")
        ids = {}
        for version, schema in ((1, V1), (2, V2), (3, V3))[:phase]:
            ids[version] = client.register_schema(subject, Schema(json.dumps(schema), "AVRO"))  # idempotent: same id again
        assert len(set(ids.values())) == phase
        context = SerializationContext(topic, MessageField.VALUE)
        serializers = {v: AvroSerializer(client, json.dumps(s), conf={"auto.register.schemas": False}) for v, s in ((1, V1), (2, V2), (3, V3))[:phase]}
        want: dict = {}
        codec = CODECS[phase + 1]
        items = []
        for i in range(PER_PHASE):
            j = phase * 1000 + i
            value = _value(phase, j)
            version = 3 if phase == 3 and j % 2 == 0 else min(phase, 2)
            key, headers, timestamp = key_of(i, j), headers_of(j), timestamp_of(j)
            if i % 7 == 3:
                items.append((j % PARTITIONS, Want(codec, key, headers, timestamp, TOMBSTONE), None))
                continue
            encoded = serializers[version](value, context)
            if version == 3:
                error = f"schema {ids[3]} (version 3) cannot evolve the table: …"
                row = Want(codec, key, headers, timestamp, RAW, value_raw=encoded, schema_id=ids[3], error=error)
            else:
                row = Want(codec, key, headers, timestamp, COLUMNS, value={"email": None, **value}, schema_id=ids[version])
            items.append((j % PARTITIONS, row, encoded))
        produce(bootstrap, topic, codec, items, want)
        schemas = {ids[v]: (json.dumps(s), None) for v, s in ((1, V1), (2, V2), (3, V3))[:phase]}
    finally:
        client.close()
    return Produced(topic, want, schemas)


def _v1_shape(p: Produced) -> Produced:
    """`p`'s rows as the snapshot of the first cycle reads them: V1's columns only."""
    drop = {k: dataclasses.replace(w, value=None if w.value is None else {f: v for f, v in w.value.items() if f != "email"}) for k, w in p.want.items()}
    return Produced(p.topic, drop, p.schemas)


def _union(*phases: Produced) -> Produced:
    return Produced(phases[0].topic, {k: w for p in phases for k, w in p.want.items()}, {k: s for p in phases for k, s in p.schemas.items()})


@dataclasses.dataclass
class Evolved:
    iceberg: IcebergCatalog
    phases: list[Produced]
    cycles: list[TopicCycle]  # one per phase


@pytest.fixture(scope="module")
def evolved(request, spark_session, tmp_path_factory) -> dict[str, Evolved]:
    """One node, a topic per catalog; three phases (V1, V2, V3+V2), each produced with the node up,
    then compacted with it stopped into the topic's catalog."""
    from tests.scenarios.records import create_topic

    registry_port = free_port()
    data_dir = tmp_path_factory.mktemp("evolution") / "node"
    node = start_node(data_dir, registry_port)
    out: dict[str, Evolved] = {}
    try:
        topics = {name: create_topic(node.bootstrap, PARTITIONS, prefix="evolve") for name in CATALOGS}
        for phase in (1, 2, 3):
            if phase > 1:
                node.start()
            produced = {name: _produce_phase(node.bootstrap, f"http://127.0.0.1:{registry_port}", topic, phase) for name, topic in topics.items()}
            assert node.stop() == 0
            for name, topic in topics.items():
                iceberg = request.getfixturevalue(name)
                (cycle,) = compact(data_dir, iceberg, spark_session, topic)
                assert cycle.rows == len(produced[name].want)
                evolution = out.setdefault(name, Evolved(iceberg, [], []))
                evolution.phases.append(produced[name])
                evolution.cycles.append(cycle)
    finally:
        node.stop()
    return out


@pytest.mark.parametrize("catalog", CATALOGS)
def test_the_table_evolved_by_union_and_kept_the_incompatible_version_raw(evolved, catalog):
    e = evolved[catalog]
    table = load_catalog(e.iceberg.config).load_table(e.cycles[0].table)
    value = table.schema().find_field("value").field_type
    assert [(f.name, str(f.field_type), f.required) for f in value.fields] == [("id", "long", False), ("name", "string", False), ("count", "long", False), ("email", "string", False)]
    assert table.schema().find_field("value.count").field_type == LongType()
    assert [s.snapshot_id for s in table.snapshots()] == [c.snapshot_id for c in e.cycles]
    # the first cycle's snapshot was written under V1's schema: an int count, no email
    first = table.schemas()[table.snapshot_by_id(e.cycles[0].snapshot_id).schema_id]
    assert [(f.name, str(f.field_type)) for f in first.find_field("value").field_type.fields] == [("id", "long"), ("name", "string"), ("count", "int")]
    assert e.cycles[2].outcomes[RAW] == sum(w.outcome == RAW for w in e.phases[2].want.values()) > 0
    assert e.cycles[2].outcomes[COLUMNS] == sum(w.outcome == COLUMNS for w in e.phases[2].want.values()) > 0


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("catalog", CATALOGS)
def test_every_reader_sees_every_version_and_each_snapshot_its_own_rows(evolved, catalog, reader, spark_session):
    e = evolved[catalog]
    identifier = e.cycles[0].table
    first, second, third = e.phases
    expected = [
        (None, _union(first, second, third)),  # now: v1 rows null in email, count read as long
        (e.cycles[1].snapshot_id, _union(first, second)),  # before the third cycle
        (e.cycles[0].snapshot_id, _v1_shape(first)),  # before the second: the first cycle's rows, V1's columns
    ]
    for snapshot_id, want in expected:
        for how, rows in read(reader, e.iceberg, identifier, spark_session, snapshot_id).items():
            check_rows(want, rows, where=f"{catalog} {how} at snapshot {snapshot_id}")

"""compactor/rows/avro_columns.py: Avro values read many at once into the value column are taken only
where the translator keeps the value as columns alone (its re-encoding gives the produced bytes
back), and then hold what the translator's row holds; every valid value of a schema it reads is
taken; a task's files are the same rows, outcomes and spans whichever way its values went."""

from __future__ import annotations

import datetime
import io
import json
import uuid
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastavro import schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactor.files import job
from compactor.files.job import TaskContext, run_task
from compactor.files.layout import arrow_schema, partition_spec, rows_to_arrow, table_schema
from compactor.files.planner import ObjectRead, Run, Task
from compactor.files.writer import TableWriter
from compactor.rows import avro_columns
from compactor.rows.avro_columns import MAX_ITEMS, ValueColumns, plan, value_columns
from compactor.rows.columns import records_to_rows
from compactor.rows.records import Record
from compactor.rows.translator import COLUMNS, TOMBSTONE, kafka_columns, translate, writer_schema
from metadata.model import IndexEntry, ObjectType
from registry.wire import frame
from tests.compactor.avro_strategies import LEAVES, values
from tests.compactor.test_columns import T0
from tests.compactor.test_translator import _MUTATIONS, BATCH, mutate
from wal.batch_builder import build_batch

SETTINGS = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
KAFKA = kafka_columns(3, BATCH)
SCHEMA_ID = 9


def read_type(path: str, depth: int):
    """Field types avro_columns.py reads: leaves (logical types too, decimals), enums, fixed, unions
    of null and one of them, records, arrays and maps of them."""
    leaf = st.one_of(
        st.sampled_from(LEAVES),  # every leaf the translator's tests use: avro_columns.py reads them all
        st.lists(st.sampled_from("ABCDE"), min_size=1, max_size=4, unique=True).map(lambda s: {"type": "enum", "name": f"E{path}", "symbols": s}),
        st.integers(1, 8).map(lambda n: {"type": "fixed", "name": f"F{path}", "size": n}),
        st.just({"type": "fixed", "name": f"U{path}", "size": 16, "logicalType": "uuid"}),
        st.integers(1, 16).map(lambda n: {"type": "fixed", "name": f"D{path}", "size": n, "logicalType": "decimal", "precision": 2 * n, "scale": n // 2}),
    )
    nullable = leaf.flatmap(lambda t: st.sampled_from((["null", t], [t, "null"])))
    if depth >= 2:
        return st.one_of(leaf, nullable)
    inner = read_type(f"{path}x", depth + 1)
    return st.one_of(
        leaf,
        nullable,
        read_record(f"{path}r", depth + 1),
        read_record(f"{path}n", depth + 1).map(lambda r: ["null", r]),
        inner.map(lambda t: {"type": "array", "items": t}),
        inner.map(lambda t: {"type": "map", "values": t}),
        inner.map(lambda t: ["null", {"type": "array", "items": t}]),
    )


@st.composite
def read_record(draw, name: str = "R", depth: int = 0):
    count = draw(st.integers(1, 4))
    return {"type": "record", "name": name, "fields": [{"name": f"f{i}", "type": draw(read_type(f"{name}_{i}", depth))} for i in range(count)]}


def encode(parsed, value) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parsed, value)
    return out.getvalue()


@st.composite
def produced(draw):
    """A schema avro_columns reads, and values: valid, mutated, tombstones, of another schema id,
    not framed."""
    schema = draw(read_record())
    ws = writer_schema(SCHEMA_ID, json.dumps(schema))
    out, valid = [], []
    for value in draw(st.lists(values(schema), min_size=1, max_size=12)):
        kind = draw(st.sampled_from(("valid", "valid", "valid", "mutated", "tombstone", "other id", "unframed")))
        payload = encode(ws.parsed, value)
        if kind == "mutated":
            for how in draw(st.lists(_MUTATIONS, min_size=1, max_size=3)):
                payload = mutate(payload, how)
        out.append(None if kind == "tombstone" else payload if kind == "unframed" else frame(SCHEMA_ID + (kind == "other id"), payload))
        valid.append(kind in ("valid", "tombstone"))
    return ws, out, valid


@SETTINGS
@given(produced())
def test_values_taken_are_those_the_translator_keeps_as_columns_alone(case):
    ws, produced_values, valid = case
    table = arrow_schema(table_schema(ws.layout.iceberg))
    records = [Record(100 + i, T0, None, v, ()) for i, v in enumerate(produced_values)]
    record = plan(ws.parsed)
    assert record is not None
    read = value_columns(records_to_rows(KAFKA, records, table), SCHEMA_ID, record, table.field("value").type)
    assert read is not None
    rows, taken = read
    assert len(rows) == len(records) and rows.schema_id == SCHEMA_ID
    for i, r in enumerate(records):
        want, outcome = translate(r, KAFKA, {SCHEMA_ID: ws}.get)
        if valid[i]:
            assert taken[i], outcome
        if taken[i]:  # a value kept as columns alone, or a tombstone
            assert outcome in (COLUMNS, TOMBSTONE), want["value_error"]
            assert rows.rows.slice(i, 1).equals(rows_to_arrow([want], table))


def _zigzag(n: int) -> bytes:
    return encode(writer_schema(0, '"long"').parsed, n)


def _string(text: str) -> bytes:
    return _zigzag(len(text)) + text.encode()


_UUID = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
_EDGES = [
    ({"type": "int", "logicalType": "time-millis"}, [(_zigzag(0), True), (_zigzag(86_399_999), True), (_zigzag(86_400_000), False), (_zigzag(-1), False)]),
    ({"type": "long", "logicalType": "time-micros"}, [(_zigzag(86_399_999_999), True), (_zigzag(86_400_000_000), False), (_zigzag(-1), False)]),
    ({"type": "long", "logicalType": "local-timestamp-millis"}, [(_zigzag(-62_135_596_800_000), True), (_zigzag(253_402_300_799_999), True), (_zigzag(253_402_300_800_000), False)]),
    ({"type": "long", "logicalType": "local-timestamp-micros"}, [(_zigzag(-62_135_596_800_000_000), True), (_zigzag(-62_135_596_800_000_001), False)]),
    # fastavro decodes any form uuid.UUID takes, and writes back only str(uuid)'s
    ({"type": "string", "logicalType": "uuid"}, [(_string(_UUID), True), *((_string(u), False) for u in (_UUID.upper(), _UUID.replace("-", ""), "{" + _UUID + "}", _UUID[:-1] + "g", _UUID.replace("-", "_")))]),
    # fastavro writes one block of all the items then an empty one, or the empty one alone
    ({"type": "array", "items": "int"}, [
        (bytes.fromhex("0602040600"), True), (b"\x00", True), (bytes.fromhex("020202040400"), False), (bytes.fromhex("01020200"), False),
        (bytes.fromhex("8600020406" "00"), False), (bytes.fromhex("06020406" "02"), False),
        (_zigzag(MAX_ITEMS) + b"\x02" * MAX_ITEMS + b"\x00", True), (_zigzag(MAX_ITEMS + 1) + b"\x02" * (MAX_ITEMS + 1) + b"\x00", False),
    ]),
    ({"type": "array", "items": {"type": "array", "items": ["null", "string"]}}, [
        (bytes.fromhex("04" "04" "020278" "00" "00" "00" "00"), True), (bytes.fromhex("04" "02" "020278" "02" "00" "00" "00" "00"), False),
    ]),
    # a key twice decodes to a dict of one item, written back shorter
    # the fewest bytes that hold the magnitude and a sign bit; within the precision (a wider value
    # fastavro decodes rounded, or, 12300 here, writes back the same but the column cannot hold)
    ({"type": "bytes", "logicalType": "decimal", "precision": 3, "scale": 0}, [
        (_zigzag(len(b)) + b, want) for b, want in (
            (b"\x00", True), (b"", False), (b"\x00\x05", False), (b"\x30\x0c", False), (b"\x03\xe7", True), (b"\x03\xe8", False), (b"\xfc\x19", True),
            (b"\xfc\x18", False), (b"\xff\x80", True), (b"\x80", False), (b"\xff\x7f", True), (b"\xff\xff", False), (b"\x7f", True), (b"\x00\x80", True),
        )
    ]),
    ({"type": "fixed", "name": "D", "size": 2, "logicalType": "decimal", "precision": 4, "scale": 1}, [
        (b"\x27\x0f", True), (b"\x27\x10", False), (b"\xd8\xf1", True), (b"\xd8\xf0", False), (b"\x80\x00", False), (b"\x00\x00", True), (b"\xff\xff", True),
    ]),
    ({"type": "map", "values": "int"}, [
        (bytes.fromhex("02" "0261" "02" "00"), True), (bytes.fromhex("04" "0261" "02" "0262" "02" "00"), True),
        (bytes.fromhex("04" "0261" "02" "0261" "04" "00"), False), (bytes.fromhex("02" "02ff" "02" "00"), False),
        *((_zigzag(len(keys)) + b"".join(_string(k) + b"\x02" for k in keys) + b"\x00", len(set(keys)) == len(keys)) for keys in ("abcde", "abcda", "bcdee", "aabc")),
    ]),
    ({"type": "map", "values": "int"}, [  # larger maps, whose keys are checked another way
        (_zigzag(len(keys)) + b"".join(_string(k) + b"\x02" for k in keys) + b"\x00", len(set(keys)) == len(keys)) for keys in ("abcdef", "abcdea", "aabcdefg", "abcdefgg", "ab", "aa")
    ]),
]  # fmt: skip


@pytest.mark.parametrize(("avro", "cases"), _EDGES, ids=[json.dumps(a) for a, _ in _EDGES])
def test_encodings_at_the_edges_are_taken_as_the_translator_and_writer_keep_them(avro, cases):
    """Hand-made bytes at the edges of what fastavro decodes and writes back the same: each is
    taken exactly when said (when the translator keeps it as columns alone and its column can
    take it), holding what the translator's row holds."""
    schema = {"type": "record", "name": "E", "fields": [{"name": "x", "type": avro}, {"name": "after", "type": "int"}]}
    ws = writer_schema(SCHEMA_ID, json.dumps(schema))
    table = arrow_schema(table_schema(ws.layout.iceberg))
    records = [Record(i, T0, None, frame(SCHEMA_ID, payload + b"\x0e"), ()) for i, (payload, _) in enumerate(cases)]
    rows, taken = value_columns(records_to_rows(KAFKA, records, table), SCHEMA_ID, plan(ws.parsed), table.field("value").type)
    assert taken.tolist() == [want for _, want in cases]
    for i, r in enumerate(records):
        if taken[i]:
            want, outcome = translate(r, KAFKA, {SCHEMA_ID: ws}.get)
            assert outcome == COLUMNS
            assert rows.rows.slice(i, 1).equals(rows_to_arrow([want], table))
            assert want["value"]["after"] == 7


@pytest.mark.parametrize(("steps", "first_taken"), [(12, True), (11, False), (8, False)])
def test_values_whose_nested_items_would_take_more_steps_than_a_read_makes_are_not_taken(monkeypatch, steps, first_taken):
    """A nested array makes its steps again at each step of the one around it: the values that
    would need more than MAX_STEPS are not taken, the others (whose items came first) are."""
    monkeypatch.setattr(avro_columns, "MAX_STEPS", steps)
    schema = {"type": "record", "name": "E", "fields": [{"name": "x", "type": {"type": "array", "items": {"type": "array", "items": "int"}}}]}
    ws = writer_schema(SCHEMA_ID, json.dumps(schema))
    table = arrow_schema(table_schema(ws.layout.iceberg))
    values = [[[1, 2, 3]] * 3, [[4]], [], [[5, 6], [7]]]  # 3 + 3 * 3 steps; the last's items are read in the first 7
    records = [Record(i, T0, None, frame(SCHEMA_ID, encode(ws.parsed, {"x": v})), ()) for i, v in enumerate(values)]
    rows, taken = value_columns(records_to_rows(KAFKA, records, table), SCHEMA_ID, plan(ws.parsed), table.field("value").type)
    assert taken.tolist() == [first_taken, True, True, True]
    assert rows.rows.column("value").to_pylist()[1 - first_taken :] == [{"x": v} for v in values[1 - first_taken :]]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "record", "name": "E", "fields": [{"name": "tags", "type": {"type": "array", "items": ["int", "string"]}}]},
        {"type": "record", "name": "E", "fields": [{"name": "u", "type": ["null", "int", "string"]}]},
        {"type": "record", "name": "E", "fields": [{"name": "k", "type": {"type": "fixed", "name": "K", "size": 17, "logicalType": "decimal", "precision": 38}}]},
        {"type": "record", "name": "E", "fields": [{"name": "t", "type": {"type": "long", "logicalType": "time-millis"}}]},
        "string",
    ],
)
def test_schemas_with_types_not_read_here_have_no_plan(schema):
    assert plan(writer_schema(1, json.dumps(schema)).parsed) is None


def test_a_table_with_fields_of_other_versions_gets_them_null_and_promoted():
    """The table's value column is the union of the versions: a field of another version is null,
    an int the table holds as long is widened, and so is a decimal it holds with more digits, in
    arrays and maps too."""
    d9, d12 = ({"type": "bytes", "logicalType": "decimal", "precision": p, "scale": 2} for p in (9, 12))
    v1 = {"type": "record", "name": "E", "fields": [
        {"name": "n", "type": "int"}, {"name": "s", "type": "string"}, {"name": "d", "type": d9},
        {"name": "ns", "type": {"type": "array", "items": "int"}}, {"name": "ds", "type": {"type": "map", "values": d9}},
    ]}  # fmt: skip
    v2 = {"type": "record", "name": "E", "fields": [
        {"name": "n", "type": "long"}, {"name": "s", "type": "string"}, {"name": "x", "type": ["null", "double"], "default": None}, {"name": "d", "type": d12},
        {"name": "ns", "type": {"type": "array", "items": "long"}}, {"name": "ds", "type": {"type": "map", "values": d12}},
    ]}  # fmt: skip
    ws1, ws2 = writer_schema(1, json.dumps(v1)), writer_schema(2, json.dumps(v2))
    table = arrow_schema(table_schema(ws2.layout.iceberg))
    assert table.field("value").type.field("d").type == pa.decimal128(12, 2)
    want = [{"n": i - 2, "s": "é" * i, "d": Decimal(i * 1001).scaleb(-2), "ns": [i] * i, "ds": [(str(j), Decimal(-j).scaleb(-2)) for j in range(i)]} for i in range(4)]
    records = [Record(i, T0, None, frame(1, encode(ws1.parsed, dict(w, ds=dict(w["ds"])))), ()) for i, w in enumerate(want)]
    rows, taken = value_columns(records_to_rows(KAFKA, records, table), 1, plan(ws1.parsed), table.field("value").type)
    assert taken.all()
    assert rows.rows.column("value").to_pylist() == [dict(w, x=None) for w in want]


@pytest.mark.parametrize("partition_by", ["day(timestamp)", "none"])
def test_a_task_writes_the_same_files_with_values_read_at_once_or_one_by_one(tmp_path, monkeypatch, partition_by):
    schema = {"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"}, {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "who", "type": "string"}, {"name": "amount", "type": "double"}, {"name": "n", "type": "int"},
        {"name": "ok", "type": "boolean"}, {"name": "coupon", "type": ["null", "string"]},
        {"name": "tags", "type": {"type": "array", "items": "string"}}, {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}}, {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "since", "type": {"type": "long", "logicalType": "time-micros"}},
    ]}  # fmt: skip
    ws = writer_schema(SCHEMA_ID, json.dumps(schema))
    good = [
        frame(SCHEMA_ID, encode(ws.parsed, {
            "id": i, "at": T0 + i, "who": f"c{i}", "amount": i / 3, "n": i, "ok": i % 2 == 0, "coupon": None if i % 3 else "x",
            "tags": ["t"] * (i % 4), "attrs": {f"a{j}": j for j in range(i % 3)},
            "ref": uuid.UUID(int=i * 7919), "price": Decimal(i * 101).scaleb(-2), "since": datetime.time(i % 24, i % 60, 0, i),
        }))
        for i in range(300)
    ]  # fmt: skip
    odd = good[5][:-1] + b"\x00\x00"  # bytes after the value: columns and raw
    batches = [
        build_batch([(i, T0 + (i // 50) * 86_400_000, None, good[i], ()) for i in range(100)]),
        build_batch([(0, T0, None, good[100], ()), (1, T0, None, odd, ()), (2, T0, None, None, ()), (3, T0, None, b"not framed", ())]),
        build_batch([(i, T0, b"k", good[104 + i], ()) for i in range(193)], codec=4),
        build_batch([(0, T0, None, good[297], ()), (1, T0, None, None, ()), (2, T0, None, good[298], ())]),  # a tombstone among values: taken
    ]
    data = b"".join(batches)
    (tmp_path / "objects").mkdir()
    (tmp_path / "objects" / "obj").write_bytes(data)
    table = table_schema(ws.layout.iceberg)

    def run(name: str):
        context = TaskContext(
            cycle_id=name, topic="t", objects_url=f"file://{tmp_path / 'objects'}", data_location=f"file://{tmp_path / name}", io_properties={},
            table_schema=table.model_dump_json(), partition_spec=partition_spec(table, partition_by).model_dump_json(), table_properties={},
            schemas={SCHEMA_ID: (json.dumps(schema), None)},
        )  # fmt: skip
        entry = IndexEntry(1000, 1299, "obj", ObjectType.WAL, 0, len(data), T0 + 86_400_000)
        return run_task(context, Task((Run("t", 4, (entry,), 1010),), (ObjectRead("obj", 0, len(data)),)))

    reads = []
    original = ValueColumns.read
    monkeypatch.setattr(ValueColumns, "read", lambda self, *a: reads.append(original(self, *a)) or reads[-1])
    at_once = run("a")
    assert [[k >= 0 for k in part] for _, part in reads] == [[True, False, True, True]]
    monkeypatch.setattr(job, "ValueColumns", None)
    monkeypatch.setattr(TableWriter, "takes_columns", property(lambda self: False))
    one_by_one = run("b")
    assert at_once.partition_outcomes == one_by_one.partition_outcomes
    assert at_once.partition_outcomes[4] == {"columns": 286, "columns+raw": 1, "raw": 1, "tombstone": 2, "malformed": 0}
    got = [(f.path.replace("/a/", "/").replace("a-", "-"), f.record_count, f.schema_id, f.partition, f.offsets, f.outcomes) for f in at_once.files]
    want = [(f.path.replace("/b/", "/").replace("b-", "-"), f.record_count, f.schema_id, f.partition, f.offsets, f.outcomes) for f in one_by_one.files]
    assert got == want
    for a, b in zip(at_once.files, one_by_one.files, strict=True):
        assert pq.read_table(a.path, partitioning=None).equals(pq.read_table(b.path, partitioning=None))
    assert np.array_equal(*(sorted(r["kafka"]["offset"] for f in x.files for r in pq.read_table(f.path, partitioning=None).to_pylist()) for x in (at_once, one_by_one)))


def test_batches_of_two_schema_ids_in_one_chunk_are_read_at_once_each_with_its_own(tmp_path):
    # A producer moving to v2 (a long for an int, a new optional field) while others still write
    # v1: each batch is read with its own schema id, a batch of tombstones alone with the chunk's
    # first; the files are those the one-by-one path writes.
    v1 = {"type": "record", "name": "E", "fields": [{"name": "n", "type": "int"}, {"name": "s", "type": "string"}]}
    v2 = {"type": "record", "name": "E", "fields": [{"name": "n", "type": "long"}, {"name": "s", "type": "string"}, {"name": "x", "type": ["null", "double"], "default": None}]}
    ws = {1: writer_schema(1, json.dumps(v1)), 2: writer_schema(2, json.dumps(v2))}

    def value(version: int, i: int) -> bytes:
        fields = {"n": i if version == 1 else 2**40 + i, "s": f"s{i}"} | ({"x": i / 4 if i % 2 else None} if version == 2 else {})
        return frame(version, encode(ws[version].parsed, fields))

    plan_ = [[value(1, i) for i in range(10)], [value(2, i) for i in range(10)], [None] * 3, [value(1, i) for i in range(5)], [value(2, 0), None, value(2, 2)]]
    batches, offset = [], 0
    for values_ in plan_:
        batches.append(build_batch([(j, T0, None, v, ()) for j, v in enumerate(values_)]))
        offset += len(values_)
    data = b"".join(batches)
    root = tmp_path
    (root / "objects").mkdir()
    (root / "objects" / "obj").write_bytes(data)
    table = table_schema(ws[2].layout.iceberg)

    def run(name: str):
        context = TaskContext(
            cycle_id=name, topic="t", objects_url=f"file://{root / 'objects'}", data_location=f"file://{root / name}", io_properties={},
            table_schema=table.model_dump_json(), partition_spec=partition_spec(table, "none").model_dump_json(), table_properties={},
            schemas={1: (json.dumps(v1), None), 2: (json.dumps(v2), None)},
        )  # fmt: skip
        entry = IndexEntry(0, offset - 1, "obj", ObjectType.WAL, 0, len(data), T0)
        return run_task(context, Task((Run("t", 0, (entry,), 0),), (ObjectRead("obj", 0, len(data)),)))

    reads = []
    original = ValueColumns.read
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ValueColumns, "read", lambda self, *a: reads.append(original(self, *a)) or reads[-1])
        at_once = run("a")
    assert [part for _, part in reads] == [[0, 1, 0, 0, 1]]
    assert [r.schema_id for r in reads[0][0]] == [1, 2]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(job, "ValueColumns", None)
        patch.setattr(TableWriter, "takes_columns", property(lambda self: False))
        one_by_one = run("b")
    assert at_once.partition_outcomes == one_by_one.partition_outcomes == {0: {"columns": 27, "columns+raw": 0, "raw": 0, "tombstone": 4, "malformed": 0}}
    got = [(f.path.replace("/a/", "/").replace("a-", "-"), f.record_count, f.schema_id, f.offsets, f.outcomes) for f in at_once.files]
    want = [(f.path.replace("/b/", "/").replace("b-", "-"), f.record_count, f.schema_id, f.offsets, f.outcomes) for f in one_by_one.files]
    assert got == want and [f.schema_id for f in at_once.files] == [1, 2, None]
    for a, b in zip(at_once.files, one_by_one.files, strict=True):
        assert pq.read_table(a.path, partitioning=None).equals(pq.read_table(b.path, partitioning=None))

"""compactor/rows/columns.py: batches of a topic without a schema decoded at once into the table's raw
columns give exactly the rows records.py's per-record path gives (every codec, varint widths at
their edges, LogAppendTime, null keys, values and header values, control batches, offsets below
the checkpoint left out); a batch whose records do not decode is never taken, and the writer files
the columns as it files add()'s rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactor.files.job import TaskContext, run_task
from compactor.files.layout import arrow_schema, partition_spec, table_schema
from compactor.files.planner import ObjectRead, Run, Task
from compactor.files.writer import TableWriter
from compactor.rows.columns import _varints, decode_batches, records_to_rows
from compactor.rows.records import BATCH_HEADER_SIZE, CorruptBatch, decode_records, iter_batches
from compactor.rows.translator import kafka_columns, translate
from metadata.model import IndexEntry, ObjectType
from wal.batch import decompress
from wal.batch_builder import LOG_APPEND_TIME, NONE, ZSTD, build_batch, frame_batch, zigzag_varint

SCHEMA = arrow_schema(table_schema())
PARTITION = 5
T0 = 1_700_000_000_000
DAY = 86_400_000
# lengths either side of each varint width (zigzagged: 1 byte to 63, 2 to 8191, 3 to 1048575)
EDGES = (0, 1, 5, 63, 64, 127, 128, 8191, 8192)

blob = st.one_of(st.none(), st.sampled_from(EDGES).map(lambda n: bytes([n % 251]) * n), st.binary(max_size=30))
header = st.tuples(st.sampled_from(("h", "", "ключ", "x" * 63, "y" * 64)), st.one_of(st.none(), st.binary(max_size=10), st.just(b"v" * 130)))
delta = st.one_of(st.integers(-(10**6), 10**6), st.sampled_from((0, 63, 64, -64, -65, 8191, 8192, -8193, 2**40, -(2**40))))


@st.composite
def batch_bytes(draw) -> bytes:
    """One valid batch: records of sizes that repeat in runs (the decoder checks runs at once) or
    not, every kind of key, value and header, gaps between offsets, any codec and flags."""
    n = draw(st.integers(1, 40))
    base_ts = T0 + draw(st.sampled_from((0, -3 * DAY, 5 * DAY)))
    same = draw(st.booleans())
    shared = (draw(blob), draw(blob), tuple(draw(st.lists(header, max_size=2))))
    records, at = [], 0
    for _ in range(n):
        key, value, headers = shared if same and draw(st.integers(0, 9)) else (draw(blob), draw(blob), tuple(draw(st.lists(header, max_size=3))))
        records.append((at, base_ts + (0 if same else draw(delta)), key, value, headers))
        at += 1 + draw(st.sampled_from((0, 0, 0, 1, 63, 64, 9000)))
    log_append, control = draw(st.booleans()), draw(st.booleans())
    return build_batch(
        records,
        codec=draw(st.integers(0, 4)),
        timestamp_type=LOG_APPEND_TIME if log_append else 0,
        base_timestamp=base_ts,
        max_timestamp=base_ts + draw(st.integers(0, 2 * DAY)) if log_append else None,
        producer_id=draw(st.sampled_from((-1, 7, 2**40))),
        producer_epoch=draw(st.sampled_from((-1, 0, 3))),
        base_sequence=draw(st.sampled_from((-1, 0, 2**31 - 1))),
        is_transactional=control or draw(st.booleans()),
        is_control=control,
        partition_leader_epoch=draw(st.sampled_from((0, 4))),
    )


def split(data: bytes, base_offset: int, first_offset: int = 0):
    """The range's batches holding offsets from first_offset on, and their records sections."""
    view = memoryview(data)
    batches, payloads = [], []
    for batch in iter_batches(view, base_offset):
        if batch.last_offset < first_offset:
            continue
        payload = view[batch.position + BATCH_HEADER_SIZE : batch.position + batch.size]
        try:
            payload = decompress(batch.codec, payload) if batch.codec else payload
        except Exception:
            payload = None
        batches.append(batch)
        payloads.append(payload)
    return view, batches, payloads


def per_record(view, batch, first_offset: int) -> pa.RecordBatch | None:
    """records.py's rows of one batch (None: it does not decode, or no column takes a value)."""
    try:
        records = [r for r in decode_records(view, batch) if r.offset >= first_offset]
        return records_to_rows(kafka_columns(PARTITION, batch), records, SCHEMA).rows
    except (CorruptBatch, OverflowError, pa.ArrowInvalid):
        return None


def check(data: bytes, base_offset: int, first_offset: int = 0) -> list[bool]:
    """Decodes `data` both ways: every batch taken gives records.py's rows exactly, in order, and
    any batch records.py cannot decode is not taken. Returns which were taken."""
    view, batches, payloads = split(data, base_offset, first_offset)
    got, taken, counts = decode_batches(PARTITION, batches, payloads, first_offset, SCHEMA)
    want = []
    for batch, was_taken, count in zip(batches, taken, counts, strict=True):
        rows = per_record(view, batch, first_offset)
        if rows is None:
            assert not was_taken
        elif was_taken:
            assert count == rows.num_rows
            want.append(rows)
        else:
            assert count == 0
    expected = pa.Table.from_batches(want, schema=SCHEMA)
    assert pa.Table.from_batches([got.rows]).equals(expected), (pa.Table.from_batches([got.rows]).to_pylist()[:3], expected.to_pylist()[:3])
    assert got.offsets.tolist() == expected.column("kafka").combine_chunks().field("offset").to_pylist()
    assert got.timestamps.tolist() == [t // 1000 for t in expected.column("kafka").combine_chunks().field("timestamp").cast(pa.int64()).to_pylist()]
    assert got.tombstones == expected.column("value_raw").null_count
    # Values left apart: the same rows but value_raw, and each value where its span says.
    apart, apart_taken, apart_counts = decode_batches(PARTITION, batches, payloads, first_offset, SCHEMA, values_apart=True)
    assert (apart_taken, apart_counts, apart.tombstones) == (taken, counts, got.tombstones)
    assert apart.rows.column("value_raw").null_count == len(apart)
    assert apart.rows.drop_columns(["value_raw"]).equals(got.rows.drop_columns(["value_raw"]))
    spans = apart.values
    assert [None if n < 0 else spans.buf[a : a + n].tobytes() for a, n in zip(spans.at.tolist(), spans.length.tolist(), strict=True)] == got.rows.column("value_raw").to_pylist()
    assert len(spans.buf) - (spans.at + np.maximum(spans.length, 0)).max(initial=0) >= 16
    return taken


@given(st.lists(batch_bytes(), min_size=1, max_size=5), st.sampled_from((0, 2**31, 2**62 - 2**50)), st.integers(0, 60))
@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_batches_of_every_codec_give_the_per_record_rows(batches, base_offset, skip):
    data = b"".join(batches)
    taken = check(data, base_offset, base_offset + skip)
    assert all(taken)


@pytest.mark.parametrize("odd_at", [0, 1, 2, 3, 500, 998, 999])
def test_records_of_one_size_with_one_of_another(odd_at):
    records = [(i, T0 + i, None, b"x" * (200 if i == odd_at else 100), ()) for i in range(1000)]
    assert check(build_batch(records), 0) == [True]
    alternating = [(i, T0, b"k", b"x" * (100 + (i // 3) % 2), ()) for i in range(1000)]
    assert check(build_batch(alternating, codec=ZSTD), 0) == [True]


def record(ts_delta: int, offset_delta: int, key: bytes, value: bytes, headers: bytes = b"\x00", length: int | None = None) -> bytes:
    """One record's bytes as written, with any field as given (headers: its count and headers)."""
    body = b"\x00" + zigzag_varint(ts_delta) + zigzag_varint(offset_delta) + key + value + headers
    return zigzag_varint(len(body) if length is None else length) + body


def framed(section: bytes, count: int, log_append: bool = False) -> bytes:
    return frame_batch(
        section, count, codec=NONE, timestamp_type=LOG_APPEND_TIME if log_append else 0, base_timestamp=T0, max_timestamp=T0 + 9,
        last_offset_delta=max(count - 1, 0), producer_id=-1, producer_epoch=-1, base_sequence=-1, is_transactional=False, is_control=False,
        partition_leader_epoch=0, base_offset=0,
    )  # fmt: skip


GOOD = record(1, 0, zigzag_varint(1) + b"k", zigzag_varint(3) + b"abc")
CORRUPT = {
    "record length under 6": zigzag_varint(5) + b"\x00" * 5,
    "record length past the end": record(0, 0, b"\x01", b"\x01", length=40),
    "fields end before the length": record(0, 0, b"\x01", b"\x01", b"\x00\x00\x00"),
    "fields end after the length": record(0, 0, b"\x01", b"\x01", length=4 + 1),
    "key past the record": record(0, 0, zigzag_varint(50) + b"k", b"\x01"),
    "value length beyond 64 bits": record(0, 0, b"\x01", b"\xff" * 9 + b"\x7f"),
    "varint of 11 bytes": record(0, 0, b"\x01", b"\x80" * 10 + b"\x00"),
    "header key null": record(0, 0, b"\x01", b"\x01", b"\x02\x01\x01"),
    "header key not UTF-8": record(0, 0, b"\x01", b"\x01", b"\x02" + zigzag_varint(2) + b"\xc3\x28\x01"),
    "more headers than bytes": record(0, 0, b"\x01", b"\x01", zigzag_varint(1000)),
    "offset delta beyond int64": record(0, 2**62, b"\x01", b"\x01"),
    "offset delta of -2**63": record(0, -(2**63), b"\x01", b"\x01"),
    "bytes after the last record": b"\x00",
    "record cut short": GOOD[:-1],
}


# Timestamps no column can hold as they are (beyond Iceberg's years 1-9999, or their micros beyond
# int64, or base + delta past int64) still decode: the column clamped, the exact ms beside it.
EXTREME = {  # the middle record's timestamp delta from the batch's base timestamp T0
    "timestamp beyond int64 micros": 2**62,
    "timestamp delta of -2**63": -(2**63),
    "a nanosecond timestamp": 1_700_000_000_000_000_000 - T0,
    "year 10000": 253_402_300_800_000 - T0,
    "before year 1": -62_135_596_800_001 - T0,
}


@pytest.mark.parametrize("name", sorted(EXTREME))
@pytest.mark.parametrize("log_append", [False, True])
def test_records_with_timestamps_outside_the_columns_range_decode_both_ways(name, log_append):
    data = framed(GOOD + record(EXTREME[name], 0, b"\x01", b"\x01") + GOOD, 3, log_append)
    assert check(data, 10) == [True]
    view, batches, payloads = split(data, 10)
    rows, _, _ = decode_batches(PARTITION, batches, payloads, 0, SCHEMA)
    kafka = rows.rows.column("kafka")
    own = (T0 + EXTREME[name] + 2**63) % 2**64 - 2**63  # as Kafka adds them: Java longs
    visible = T0 + 9 if log_append else own  # a LogAppendTime batch's records have its maxTimestamp
    clamped = min(max(visible, -62_135_596_800_000), 253_402_300_799_999)
    assert kafka.field("timestamp").cast(pa.int64()).to_pylist()[1] == clamped * 1000
    assert kafka.field("timestamp_ms").to_pylist() == [T0 + 1 if log_append else None, own, T0 + 1 if log_append else None]


def test_record_attributes_decode_both_ways():
    assert len(GOOD) < 64  # its length one byte, its attributes the next
    with_bits = b"".join(GOOD[:1] + bytes([a]) + GOOD[2:] for a in (0x80, 0x01))
    assert check(framed(with_bits, 2), 3) == [True]
    view, (batch,), _ = split(framed(with_bits, 2), 3)
    assert [r.attributes for r in decode_records(view, batch)] == [0x80, 0x01]


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_a_batch_whose_records_do_not_decode_is_left_to_records_py(name):
    at_end = name in ("bytes after the last record", "record cut short")
    bad = framed(GOOD * 2 + CORRUPT[name], 2) if at_end else framed(GOOD + CORRUPT[name] + GOOD, 3)
    good = framed(GOOD * 4, 4)
    assert check(good + bad + good, 10) == [True, False, True]


def test_records_kafka_reads_but_the_rebuild_would_write_otherwise_are_not_rows():
    """Kafka reads these (and produce takes a padded varint or a null length other than -1), but
    rows would lose how they were written: their batches are not rows either way (the task keeps
    each as stored)."""
    odd = {
        "a negative header count": record(-5, 0, b"\x01", zigzag_varint(2) + b"ab", zigzag_varint(-3)),
        "a null key of length -7": record(0, 0, zigzag_varint(-7), zigzag_varint(-1)),
        "a null value of length -2": record(0, 0, zigzag_varint(-1), zigzag_varint(-2)),
        "a null header value of length -3": record(0, 0, b"\x01", b"\x01", zigzag_varint(1) + zigzag_varint(1) + b"h" + zigzag_varint(-3)),
        "a key length of 0 in two bytes": record(0, 0, b"\x80\x00", b"\x01"),
        "a timestamp delta of 1 in two bytes": zigzag_varint(len(GOOD)) + b"\x00\x82\x00" + GOOD[3:],  # GOOD's body, a byte longer
        "a record length in two bytes": bytes([GOOD[0] | 0x80, 0x00]) + GOOD[1:],
    }
    for name, bytes_ in odd.items():
        data = framed(GOOD + bytes_ + GOOD, 3)
        assert check(data, 0) == [False], name
        view, (batch,), _ = split(data, 0)
        with pytest.raises(CorruptBatch):
            decode_records(view, batch)
    many_headers = record(0, 0, b"\x01", b"\x01", zigzag_varint(70) + (zigzag_varint(1) + b"h" + zigzag_varint(-1)) * 70)
    data = framed(many_headers, 1, log_append=True)
    assert check(data, 0) == [False]  # more headers than the decoder steps through: records.py's way
    view, batches, _ = split(data, 0)
    assert [r.headers for r in decode_records(view, batches[0])] == [(("h", None),) * 70]


def test_records_of_the_commonest_size_laid_out_otherwise_decode_as_records_py_reads_them():
    """Records of one size are read at once after the first of them: those of that size whose
    fields lie elsewhere (deltas of other widths, a key or headers where the first has none) or
    that do not decode are read one by one."""

    def common(i: int, ts: int = 1, key: bytes = zigzag_varint(-1), value: int = 100, headers: bytes = b"\x00") -> bytes:
        return record(ts, i, key, zigzag_varint(value) + b"v" * value, headers)

    size = len(common(64))  # offset deltas of 2 bytes from 64 on: the commonest size, 86 of 150
    odd = {
        3: common(3, ts=64),  # a timestamp delta of 2 bytes, an offset delta of 1: that size too
        100: common(100, key=zigzag_varint(0)),  # an empty key where the others have none
        101: common(101, value=97, headers=zigzag_varint(1) + zigzag_varint(1) + b"h" + zigzag_varint(-1)),  # a header
    }
    records = [odd.get(i, common(i)) for i in range(150)]
    assert all(len(r) == size for r in odd.values())
    assert {len(r) for r in records} == {size - 1, size}
    corrupt = record(1, 200, zigzag_varint(-1), zigzag_varint(99) + b"v" * 99, b"\x00\x00")  # that size, its fields ending a byte short
    assert len(corrupt) == size
    assert check(framed(b"".join(records), 150) + framed(b"".join(records[64:90]) + corrupt, 27), 0) == [True, False]


def test_a_codecs_name_repeated_is_laid_out_as_arrows_take_lays_it_out():
    """The writer cuts row groups by the rows' nbytes: the batches' codec names, one name
    repeated, keep the take's buffers (a validity bitmap too), so the files stay byte for byte
    those the take made."""
    data = b"".join(build_batch([(i, T0, None, b"v" * 20, ())], codec=ZSTD) for i in range(5))
    _, batches, payloads = split(data, 0)
    rows = decode_batches(PARTITION, batches, payloads, 0, SCHEMA)[0].rows
    names = rows.column("kafka").field("batch_compression")
    by_take = pa.array(["zstd"], type=pa.large_string()).take(pa.array(np.zeros(5, dtype=np.int64)))
    assert names.equals(by_take)
    assert [b.size if b is not None else None for b in names.buffers()] == [b.size if b is not None else None for b in by_take.buffers()]
    assert names.nbytes == by_take.nbytes


def test_a_payload_that_does_not_decompress_is_left_to_records_py():
    bad = bytearray(build_batch([(0, T0, None, b"v" * 50, ())], codec=ZSTD))
    bad[BATCH_HEADER_SIZE + 4] ^= 0xFF
    data = build_batch([(0, T0, None, b"a", ())]) + framed(bytes(bad[BATCH_HEADER_SIZE:]), 1)
    view, batches, payloads = split(data, 0)
    batches[1].attributes |= ZSTD  # its section as a compressed one that does not decompress
    payloads[1] = None
    _, taken, counts = decode_batches(PARTITION, batches, payloads, 0, SCHEMA)
    assert (taken, counts) == ([True, False], [1, 0])


@pytest.mark.parametrize("partition_by", ["day(timestamp)", "hour(timestamp)", "month(timestamp)", "none"])
@given(batches=st.lists(batch_bytes(), min_size=1, max_size=4))
@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
def test_the_writer_files_the_columns_as_it_files_rows(tmp_path_factory, partition_by, batches):
    """Rows by add_raw_rows and the same records by add(), row by row: the same files, rows and spans."""
    schema = table_schema()
    spec = partition_spec(schema, partition_by)
    root = tmp_path_factory.mktemp("w")
    view, parsed, payloads = split(b"".join(batches), 1000)
    rows, taken, _ = decode_batches(PARTITION, parsed, payloads, 0, SCHEMA)
    assert all(taken)
    offsets = rows.offsets.tolist()
    if offsets != sorted(set(offsets)):
        return  # add() would refuse them too
    columns = TableWriter(schema, spec, str(root / "a"), pafs.LocalFileSystem(), file_prefix="t")
    assert columns.add_raw_rows(PARTITION, rows)
    one_by_one = TableWriter(schema, spec, str(root / "b"), pafs.LocalFileSystem(), file_prefix="t")
    for batch in parsed:
        kafka = kafka_columns(PARTITION, batch)
        for r in decode_records(view, batch):
            one_by_one.add(*translate(r, kafka, None))
    got, want = columns.close(), one_by_one.close()
    assert [(w.path.replace("/a/", "/"), w.record_count, w.partition, w.offsets, w.outcomes) for w in got] == [(w.path.replace("/b/", "/"), w.record_count, w.partition, w.offsets, w.outcomes) for w in want]
    for a, b in zip(got, want, strict=True):
        assert pq.read_table(a.path, partitioning=None).equals(pq.read_table(b.path, partitioning=None))


def test_a_batch_whose_offsets_go_back_is_kept_as_stored(tmp_path):
    """Offsets that go back within a batch (which produce never accepts) are refused as columns, and
    as rows too (its records could not be rebuilt in their order): the batch is one row holding it
    as stored, at its last offset; the batches around it are columns."""
    before = build_batch([(i, T0, None, b"a%d" % i, ()) for i in range(3)])
    back = build_batch([(0, T0, None, b"x", ()), (2, T0 + DAY, None, b"y", ()), (1, T0 - DAY, None, None, ())], last_offset_delta=2)
    after = build_batch([(i, T0, b"k", b"b%d" % i, ()) for i in range(2)])
    data = before + back + after
    (tmp_path / "objects").mkdir()
    (tmp_path / "objects" / "obj").write_bytes(data)
    schema = table_schema()
    context = TaskContext(
        cycle_id="c0", topic="t", objects_url=f"file://{tmp_path / 'objects'}", data_location=f"file://{tmp_path / 'data'}", io_properties={},
        table_schema=schema.model_dump_json(), partition_spec=partition_spec(schema).model_dump_json(), table_properties={},
    )  # fmt: skip
    entry = IndexEntry(100, 107, "obj", ObjectType.WAL, 0, len(data), T0 + DAY)
    result = run_task(context, Task((Run("t", PARTITION, (entry,), 0),), (ObjectRead("obj", 0, len(data)),)))
    by_day = {f.partition: pq.read_table(f.path, partitioning=None).to_pylist() for f in result.files}
    day = T0 // DAY
    assert {d: [(r["kafka"]["offset"], r["value_raw"], r["kafka"]["stored_batch"]) for r in rows] for (d,), rows in by_day.items()} == {
        day: [(100, b"a0", None), (101, b"a1", None), (102, b"a2", None), (105, back, True), (106, b"b0", None), (107, b"b1", None)],
    }
    assert result.partition_outcomes[PARTITION]["raw"] == 5 and result.partition_outcomes[PARTITION]["malformed"] == 1


def test_a_batch_that_fails_after_a_run_of_one_size_leaves_no_starts_behind():
    runs = framed(GOOD * 100 + record(0, 0, b"\x01", zigzag_varint(7) + b"x" * 7) * 50, 150)
    bad = [framed(GOOD * 100 + b"\x00", 100), framed(GOOD * 100, 101), framed(GOOD * 60 + CORRUPT["key past the record"] + GOOD * 60, 121)]
    assert check(runs + bad[0] + runs + bad[1] + bad[2] + runs, 0) == [True, False, True, False, False, True]


_INT64 = st.integers(-(2**63), 2**63 - 1)
_WIDE = st.one_of(_INT64, st.integers(-(2**20), 2**20), st.sampled_from((0, -1, 63, -64, 64, 2**27, 2**48, -(2**55), 2**55, 2**62, -(2**63), 2**63 - 1)))


@given(st.lists(_WIDE, min_size=1, max_size=60), st.sampled_from((1, 2, 10)))
@settings(deadline=None, max_examples=300)
def test_varints_read_at_once_are_kafkas_of_every_width(values, pad_extra):
    # Values of 1 to 10 bytes side by side, the last ones in the buffer's padding's reach.
    encoded = [zigzag_varint(v) for v in values]
    at = np.cumsum([0] + [len(e) for e in encoded[:-1]], dtype=np.int64)
    buf = np.frombuffer(b"".join(encoded) + bytes(10 + pad_extra), dtype=np.uint8)
    bad = np.zeros(len(values), dtype=bool)
    got, after = _varints(buf, at, bad)
    assert got.tolist() == values
    assert after.tolist() == [int(a) + len(e) for a, e in zip(at.tolist(), encoded, strict=True)]
    assert not bad.any()

"""table/rebuild.py encodes every batch's records at once from columns: each batch it rebuilds is
byte for byte the batch wal.batch_builder.build_batch writes record by record from the same
records and header fields (build_batch's own tests check that against Kafka's layout and clients),
and it reads back as those records."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.files.layout import arrow_schema, rows_to_arrow, table_schema
from compactor.rows.records import Batch, Record, decode_records, iter_batches
from compactor.rows.translator import kafka_columns, translate
from table.rebuild import _lengths, _packed, _zigzag, rebuild_batches, varints
from wal.batch import CODEC_NAMES
from wal.batch_builder import COMPRESSION_TYPES, build_batch, codec_for, zigzag_varint

SCHEMA = arrow_schema(table_schema())
# lengths and deltas either side of each varint width (1-3 bytes zigzagged: 63/64, 8191/8192)
EDGES = (0, 1, 63, 64, 127, 128, 8191, 8192, 16383, 16384)
INT64 = st.integers(-(2**63), 2**63 - 1)


@given(st.lists(st.one_of(INT64, st.sampled_from(EDGES), st.sampled_from([-e for e in EDGES])), max_size=50))
@settings(deadline=None, max_examples=200)
def test_varints_are_kafkas_zigzag_varints_end_to_end(values):
    data, widths = varints(values)
    assert bytes(data) == b"".join(zigzag_varint(v) for v in values)
    assert widths.tolist() == [len(zigzag_varint(v)) for v in values]


# columns as rebuild meets them: one value throughout, small non-negative, within 32 bits either
# sign, anything 64-bit
COLUMN = st.one_of(
    st.tuples(st.one_of(INT64, st.sampled_from(EDGES))).map(lambda v: v * 3),
    st.lists(st.sampled_from(EDGES), min_size=3, max_size=3),
    st.lists(st.integers(-(2**31), 2**31 - 1), min_size=3, max_size=3),
    st.lists(INT64, min_size=3, max_size=3),
)


@given(st.lists(st.one_of(COLUMN, st.binary(min_size=1, max_size=3)), min_size=1, max_size=6))
@settings(deadline=None, max_examples=300)
def test_packed_rows_are_each_rows_pieces_in_turn(pieces):
    """Each row packed is its columns' varints (and constant bytes) one after another."""
    n = 3
    data, widths = _packed([p if isinstance(p, bytes) else _zigzag(p) for p in pieces], n)
    rows = [b"".join(p if isinstance(p, bytes) else zigzag_varint(p[i]) for p in pieces) for i in range(n)]
    assert bytes(data) == b"".join(rows)
    assert widths.tolist() == [len(r) for r in rows]


@given(st.lists(st.one_of(st.none(), st.binary(max_size=9)), max_size=12), st.sampled_from([pa.binary(), pa.large_binary()]))
@settings(deadline=None)
def test_lengths_are_each_values_or_minus_one_for_null(values, kind):
    column = pa.array([b"xyz", *values], kind).slice(1)  # a slice: its offsets start past the array's
    assert _lengths(column).tolist() == [-1 if v is None else len(v) for v in values]


blob = st.one_of(st.none(), st.sampled_from(EDGES).map(lambda n: bytes([n % 251]) * n), st.binary(max_size=40))
header = st.tuples(st.sampled_from(("h", "", "ключ", "x" * 70)), st.one_of(st.none(), st.binary(max_size=20), st.just(b"v" * 130)))


@st.composite
def batches(draw) -> list[tuple[Batch, list[Record]]]:
    """Batches with offsets in order, gaps between batches, records' timestamps on both sides
    of their batch's base, and every kind of key, value and header."""
    out, offset = [], draw(st.integers(0, 2**40))
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 12))
        base_ts = draw(st.integers(0, 2**42))
        deltas = draw(st.lists(st.one_of(st.integers(-(10**6), 10**9), st.sampled_from(EDGES)), min_size=n, max_size=n))
        gaps = draw(st.lists(st.sampled_from((0, 0, 1, 63, 64, 9000)), min_size=n, max_size=n))
        records, at = [], offset
        for i in range(n):
            at += gaps[i] if i else 0
            records.append(Record(at, base_ts + deltas[i], draw(blob), draw(blob), tuple(draw(st.lists(header, max_size=3)))))
            at += 1
        control, transactional, log_append = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
        attributes = draw(st.integers(0, 4)) | 0x08 * log_append | 0x10 * (control or transactional) | 0x20 * control
        batch = Batch(
            0, 0, 0, offset, 0, 2, attributes, at - 1 - offset, base_ts, base_ts + max(deltas), draw(st.sampled_from((-1, 7, 2**40))),
            draw(st.sampled_from((-1, 0, 3))), draw(st.sampled_from((-1, 0, 2**31 - 1))), n,
        )  # fmt: skip
        out.append((batch, records))
        offset = at + draw(st.sampled_from((0, 5)))
    return out


def table_of(produced, split: int) -> pa.Table:
    rows = [translate(r, kafka_columns(0, b), None)[0] for b, records in produced for r in records]
    table = pa.Table.from_batches([rows_to_arrow(rows, SCHEMA)])
    return pa.concat_tables([table.slice(0, split), table.slice(split)]) if 0 < split < len(table) else table


def built(batch: Batch, records: list[Record], compression: str) -> bytes:
    return build_batch(
        [(r.offset - batch.base_offset, r.timestamp, r.key, r.value, r.headers) for r in records],
        codec=codec_for(compression, batch.codec), timestamp_type=batch.timestamp_type,
        base_timestamp=batch.base_timestamp, max_timestamp=batch.max_timestamp, producer_id=batch.producer_id,
        producer_epoch=batch.producer_epoch, base_sequence=batch.base_sequence, is_transactional=batch.is_transactional,
        is_control=batch.is_control, base_offset=batch.base_offset,
    )  # fmt: skip


@given(batches(), st.sampled_from(COMPRESSION_TYPES), st.booleans(), st.integers(0, 40))
@settings(deadline=None, max_examples=150)
def test_each_rebuilt_batch_is_the_batch_built_record_by_record(produced, compression, complete, split):
    lasts, rebuilt = rebuild_batches(table_of(produced, split), compression, {}, complete)
    want = produced if complete else produced[:-1]
    assert lasts == [records[-1].offset for _, records in want]
    assert rebuilt == [built(b, records, compression) for b, records in want]
    for data, (batch, records) in zip(rebuilt, want, strict=True):
        (read,) = iter_batches(memoryview(data), batch.base_offset)
        assert read.codec_name == CODEC_NAMES[codec_for(compression, batch.codec)]
        # a LogAppendTime batch's records read as its maxTimestamp (Kafka's rule)
        # (the timestamp each record holds kept beside it, when it is another)
        log_append = [r._replace(timestamp=batch.max_timestamp, stored_timestamp=None if r.timestamp == batch.max_timestamp else r.timestamp) for r in records]
        assert decode_records(memoryview(data), read) == (log_append if batch.timestamp_type else records)


def test_rows_of_one_batch_not_known_complete_give_nothing_yet():
    produced = [(Batch(0, 0, 0, 5, 0, 2, 0, 0, 10, 10, -1, -1, -1, 1), [Record(5, 10, None, b"v", ())])]
    assert rebuild_batches(table_of(produced, 0), "producer", {}, complete=False) == ([], [])
    assert rebuild_batches(table_of(produced, 0), "producer", {}, complete=True)[0] == [5]


@pytest.mark.parametrize("compression", ["producer", "zstd"])
def test_a_window_of_many_batches_is_rebuilt_in_order(compression):
    produced, offset = [], 0
    for k in range(300):
        n = 1 + k % 17
        produced.append((Batch(0, 0, 0, offset, 0, 2, k % 5, n - 1, k, k + n, 9, 1, offset, n), [Record(offset + i, k + i, b"%d" % i, b"x" * (k * 37 % 2000), ()) for i in range(n)]))
        offset += n
    lasts, rebuilt = rebuild_batches(table_of(produced, 1000), compression, {}, complete=True)
    assert lasts == [records[-1].offset for _, records in produced]
    assert rebuilt == [built(b, records, compression) for b, records in produced]


def test_rows_sliced_from_a_larger_window_rebuild_the_same():
    """A window's carried rows are a slice (an offset into the arrays) of the one before."""
    produced, offset = [], 0
    for k in range(6):
        produced.append((Batch(0, 0, 0, offset, 0, 2, k % 5, 2, k, k + 3, 9, 1, offset, 3), [Record(offset + i, k + i, b"%d" % i if i else None, b"x" * (k * 37 + i), (("h", b"v%d" % i),) if i % 2 else ()) for i in range(3)]))
        offset += 3
    rows = table_of(produced, 0).combine_chunks().slice(6)
    assert rows.column("kafka").chunk(0).offset == 6
    assert rebuild_batches(rows, "producer", {}, complete=True) == ([r[-1].offset for _, r in produced[2:]], [built(b, r, "producer") for b, r in produced[2:]])


def test_a_batch_of_no_known_codec_does_not_rebuild():
    rows = table_of([(Batch(0, 0, 0, 5, 0, 2, 0, 0, 10, 10, -1, -1, -1, 1), [Record(5, 10, None, b"v", ())])], 0)
    kafka = rows.column("kafka").combine_chunks()
    fields = [pa.array(["brotli"], f.type) if f.name == "batch_compression" else kafka.field(i) for i, f in enumerate(kafka.type)]
    rows = rows.set_column(0, SCHEMA.field("kafka"), pa.StructArray.from_arrays(fields, fields=list(kafka.type)))
    with pytest.raises(ValueError, match="brotli"):
        rebuild_batches(rows, "producer", {}, complete=True)


@pytest.mark.parametrize("value", [b"", None])
@pytest.mark.parametrize("key", [b"", None, b"k"])
def test_batches_whose_values_are_all_empty_or_null_rebuild(key, value):
    """No value bytes at all (the values' data buffer may be absent), with and without key bytes."""
    produced = [(Batch(0, 0, 0, 10 * k, 0, 2, 0, 2, 5, 7, 3, 0, 0, 3), [Record(10 * k + i, 5 + i, key, value, ()) for i in range(3)]) for k in range(3)]
    lasts, rebuilt = rebuild_batches(table_of(produced, 4), "producer", {}, complete=True)
    assert lasts == [2, 12, 22]
    assert rebuilt == [built(b, records, "producer") for b, records in produced]

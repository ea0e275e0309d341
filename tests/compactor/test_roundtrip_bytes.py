"""Every record batch produce accepts comes back byte for byte once compacted: Hypothesis makes
batches that wal.batch.validate accepts (any bytes in keys, values, header keys and values; null
keys, values and header values; any int64 timestamps and timestamp deltas; any record attributes
and batch attribute bits; every codec), broker-written control batches beside them (transaction
markers: never rows, so they alone do not come back, and a partition of markers only has no rows), batches of
records written with longer varints or null lengths other than -1 than any client writes (produce
takes them: they are kept as stored), and batches whose records do not decode at all. A compaction task (compactor/files/job.py, in this process) turns
them into Parquet rows, the rebuild (table/rebuild.py, both of table/serve.py's ways) turns the
rows back into batches, and those are compared with the same batches as the WAL serves them
(wal.batch.inject_offsets). The only difference allowed: a compressed batch's compressed bytes
(and so its length and CRC), when its decompressed records are then the same bytes."""

from __future__ import annotations

import struct
import tempfile
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactor.files.job import TaskContext, run_task
from compactor.files.layout import partition_spec, table_schema
from compactor.files.planner import ObjectRead, Run, Task
from metadata.model import IndexEntry, ObjectType
from table.layout import KAFKA, OFFSET, PARTITION
from table.rebuild import rebuild_partitions, rebuild_run
from wal.batch import BATCH_HEADER, BATCH_HEADER_SIZE, decompress, inject_offsets, iter_headers, validate
from wal.batch_builder import LOG_APPEND_TIME, frame_batch, zigzag_varint

INT64 = st.integers(-(2**63), 2**63 - 1)
# timestamps: mostly near now (rows of one day: a file per day is written), any int64 often enough
# (a nanosecond clock, years outside 1-9999, the extremes)
TIMESTAMP = st.one_of(
    st.integers(1_700_000_000_000, 1_700_000_000_000 + 3_600_000),
    st.sampled_from((-1, 0, 1_700_000_000_000_000_000, 253_402_300_800_000, -62_135_596_800_001, -(2**63), 2**63 - 1)),
    INT64,
)
BLOB = st.one_of(st.none(), st.binary(max_size=40))
HEADER_KEY = st.one_of(st.binary(max_size=12), st.text(max_size=6).map(str.encode), st.sampled_from((b"\xc3\x28", b"\xff", b"\xed\xa0\x80")))
HEADERS = st.lists(st.tuples(HEADER_KEY, BLOB), max_size=2)
CODEC = st.integers(0, 4)
_ATTRIBUTES_AT, _CRC_AT = 21, 17


def record_bytes(offset_delta: int, timestamp_delta: int, attributes: int, key: bytes | None, value: bytes | None, headers: list, odd_key: bool = False) -> bytes:
    """A record's bytes; `odd_key`: its key's length written as Kafka reads it but no client writes
    it (a null as -7, a length padded to a byte more)."""

    def blob(b: bytes | None) -> bytes:
        return zigzag_varint(-1) if b is None else zigzag_varint(len(b)) + b

    if odd_key:
        length = zigzag_varint(len(key)) if key is not None else b"\x0d"  # -7
        key_bytes = length[:-1] + bytes([length[-1] | 0x80, 0]) + key if key is not None else length
    else:
        key_bytes = blob(key)
    body = bytes([attributes]) + zigzag_varint(timestamp_delta) + zigzag_varint(offset_delta) + key_bytes + blob(value)
    body += zigzag_varint(len(headers)) + b"".join(zigzag_varint(len(k)) + k + blob(v) for k, v in headers)
    return zigzag_varint(len(body)) + body


@st.composite
def batches(draw) -> bytes:
    """One batch as a client (or, for a control batch, the broker) writes it."""
    n = draw(st.integers(1, 5))
    base_timestamp = draw(TIMESTAMP)
    same_time = draw(st.booleans())  # most producers' batches: deltas of 0 or a little
    deltas = [draw(st.one_of(st.integers(0, 5000), INT64)) if not same_time else 0 for _ in range(n)]
    odd = draw(st.integers(0, 19)) == 0  # a record no client writes: kept as stored, served back the same
    records = [record_bytes(i, deltas[i], draw(st.sampled_from((0, 0, 1, 0x7F, 0x80, 0xFF))), draw(BLOB), draw(BLOB), draw(HEADERS), odd and i == 0) for i in range(n)]
    control = draw(st.integers(0, 9)) == 0
    log_append = draw(st.booleans())
    codec = draw(CODEC)
    batch = bytearray(
        frame_batch(
            b"".join(records), n, codec=codec, timestamp_type=LOG_APPEND_TIME if log_append else 0, base_timestamp=base_timestamp,
            max_timestamp=draw(TIMESTAMP), last_offset_delta=n - 1, producer_id=draw(st.sampled_from((-1, 0, 7, 2**63 - 1))),
            producer_epoch=draw(st.sampled_from((-1, 0, 32767))), base_sequence=draw(st.sampled_from((-1, 0, 2**31 - 1))),
            is_transactional=control or draw(st.booleans()), is_control=control, partition_leader_epoch=draw(st.sampled_from((0, 5))),
            base_offset=draw(st.sampled_from((0, 123))),
        )
    )  # fmt: skip
    high = draw(st.sampled_from((0, 0, 0x40, 0x80, 0x7FC0, -0x8000)))  # bits above the control bit
    if high:
        (attributes,) = struct.unpack_from(">h", batch, _ATTRIBUTES_AT)
        struct.pack_into(">h", batch, _ATTRIBUTES_AT, attributes | high)
        struct.pack_into(">I", batch, _CRC_AT, crc32c(memoryview(batch)[_ATTRIBUTES_AT:]))
    if not control:
        validate(bytes(batch))  # what produce accepts
    return bytes(batch)


@st.composite
def poison(draw) -> bytes:
    """A batch whose framing and checksum are sound but whose records do not decode (a WAL written
    by another version, a bit flipped before its CRC was computed): it must come back as stored."""
    n = draw(st.integers(1, 3))
    section = zigzag_varint(1000) + draw(st.binary(max_size=30))  # a first record longer than the section
    return frame_batch(
        section, n, codec=draw(st.sampled_from((0, 0, 1))), timestamp_type=0, base_timestamp=draw(TIMESTAMP), max_timestamp=draw(TIMESTAMP),
        last_offset_delta=n - 1, producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=False, is_control=False,
        partition_leader_epoch=0, base_offset=0,
    )  # fmt: skip


PARTITION_BATCHES = st.lists(st.one_of(batches(), batches(), batches(), poison()), min_size=1, max_size=4)


CONTROL = 0x20  # a batch attribute: a control batch


def _served(rows: pa.Table) -> bytes:
    """The partition's batches as table/serve.py rebuilds them, both its ways agreeing."""
    rows = rows.take(pc.sort_indices(pc.struct_field(rows.column(KAFKA), OFFSET)))
    one = rebuild_run(rows, "producer", {}, complete=True)
    _, many = rebuild_partitions(rows, "producer", {})
    assert bytes(one.data) == bytes(many.data)
    return bytes(one.data)


def _same(got: bytes, want: bytes) -> None:
    """Batch by batch: equal bytes, or a compressed batch whose header (but its length and CRC) and
    decompressed records are the same."""
    got_headers, want_headers = list(iter_headers(got)), list(iter_headers(want))
    assert len(got_headers) == len(want_headers)
    for g, w in zip(got_headers, want_headers, strict=True):
        got_batch, want_batch = got[g.position : g.position + g.size], want[w.position : w.position + w.size]
        if got_batch == want_batch:
            continue
        got_fields, want_fields = BATCH_HEADER.unpack_from(got_batch), BATCH_HEADER.unpack_from(want_batch)
        codec = w.attributes & 0x07
        assert codec, ("an uncompressed batch differs", got_batch, want_batch)
        # all but batchLength and the CRC
        assert (got_fields[:1], got_fields[2:4], got_fields[5:]) == (want_fields[:1], want_fields[2:4], want_fields[5:])
        assert crc32c(got_batch[21:]) == got_fields[4]
        assert bytes(decompress(codec, memoryview(got_batch)[BATCH_HEADER_SIZE:])) == bytes(decompress(codec, memoryview(want_batch)[BATCH_HEADER_SIZE:]))


@pytest.mark.timeout(1200)
@given(st.lists(PARTITION_BATCHES, min_size=1, max_size=3))
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_every_batch_comes_back_byte_for_byte_after_compaction(partitions):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "objects").mkdir()
        # one WAL object holding each partition's batches one after another, as a flush writes them
        data, entries = b"", []
        for p, stored in enumerate(partitions):
            part = b"".join(stored)
            count = sum(h.last_offset_delta + 1 for h in iter_headers(part))
            base = 1000 * p  # offsets the sequencer assigned
            entries.append((p, IndexEntry(base, base + count - 1, "wal", ObjectType.WAL, len(data), len(part), 0), part))
            data += part
        (root / "objects" / "wal").write_bytes(data)
        schema = table_schema()
        context = TaskContext(
            cycle_id=uuid.uuid4().hex, topic="t", objects_url=f"file://{root / 'objects'}", data_location=f"file://{root / 'data'}",
            io_properties={}, table_schema=schema.model_dump_json(), partition_spec=partition_spec(schema).model_dump_json(), table_properties={},
        )  # fmt: skip
        task = Task(tuple(Run("t", p, (entry,), entry.base_offset) for p, entry, _ in entries), (ObjectRead("wal", 0, len(data)),))
        result = run_task(context, task)
        tables = [pq.read_table(f.path.removeprefix("file://"), partitioning=None) for f in result.files]
        rows = pa.concat_tables(tables, promote_options="permissive") if tables else None
        for p, entry, part in entries:
            # control batches (transaction markers) are never rows: every other batch comes back
            stored = bytes(inject_offsets(part, entry.base_offset))
            want = b"".join(stored[h.position : h.position + h.size] for h in iter_headers(stored) if not h.attributes & CONTROL)
            mine = rows.filter(pc.equal(pc.struct_field(rows.column(KAFKA), PARTITION), p)) if rows is not None else None
            if not want:
                assert mine is None or mine.num_rows == 0
                continue
            _same(_served(mine), want)

"""wal.batch_builder: batches built from records read back exactly by neve's own readers (the produce
path's validate, the compactor's decode) and by three clients' (aiokafka's C reader, kafka-python's
pure-Python one, and the Java client's, the strictest about codec framing); an uncompressed batch is
byte for byte what aiokafka's encoder writes."""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
import warnings
from pathlib import Path

import lz4.frame
import pytest
from aiokafka.record.default_records import DefaultRecordBatch as AiokafkaBatch
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.rows.records import decode_range
from tests.clients.java_client import classpath
from wal.batch import BATCH_HEADER, BATCH_HEADER_SIZE, validate
from wal.batch_builder import COMPRESSION_TYPES, GZIP, LOG_APPEND_TIME, LZ4, NONE, SNAPPY, ZSTD, build_batch, codec_for

with warnings.catch_warnings():
    # importing the kafka package loads its protocol schemas through importlib.resources' old API
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch

CODECS = (NONE, GZIP, SNAPPY, LZ4, ZSTD)
INT64 = (-(2**63), 2**63 - 1)

headers = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=16)), max_size=3)
# offset gaps: mostly none (a batch as produced), some records gone (compacted), some deltas past
# the two-byte varints
gaps = st.integers(0, 0) | st.integers(0, 3) | st.integers(0, 20_000)
# timestamp deltas: as produced (small, also backwards) and far outside the precomputed varints
timestamp_deltas = st.integers(-5, 50) | st.integers(-(2**40), 2**40)


@st.composite
def batches(draw, contiguous: bool = False, min_size: int = 0):
    """(records, build_batch keyword arguments) for one batch. A control batch holds one control
    record, as the transaction coordinator writes it (readers parse its key and value)."""
    base_timestamp = draw(st.integers(2**41, 2**42))  # record timestamps stay positive, as Kafka requires
    is_control = False if contiguous else draw(st.booleans())
    records = []
    offset_delta = -1
    for _ in range(draw(st.integers(min_size, 1 if is_control else 12))):
        offset_delta += 1 if contiguous else 1 + draw(gaps)
        timestamp = base_timestamp + draw(timestamp_deltas)
        if is_control:  # key: version, type (0 abort, 1 commit); value: version, coordinator epoch
            control = (struct.pack(">hh", 0, draw(st.integers(0, 1))), struct.pack(">hi", 0, draw(st.integers(0, 2**31 - 1))))
            records.append((offset_delta, timestamp, *control, []))
            continue
        records.append((
            offset_delta,
            timestamp,
            draw(st.none() | st.binary(max_size=40)),
            draw(st.none() | st.binary(max_size=300)),
            draw(headers),
        ))
    kwargs = dict(
        codec=draw(st.sampled_from(CODECS)),
        timestamp_type=draw(st.sampled_from((0, 1))),
        base_timestamp=base_timestamp,
        producer_id=draw(st.integers(-1, 2**63 - 1)),
        producer_epoch=draw(st.integers(-1, 2**15 - 1)),
        base_sequence=draw(st.integers(-1, 2**31 - 1)),
        is_transactional=draw(st.booleans()),
        is_control=is_control,
        partition_leader_epoch=draw(st.integers(-1, 2**31 - 1)),
        base_offset=draw(st.integers(0, 2**62)),
    )
    if kwargs["timestamp_type"] == LOG_APPEND_TIME or not records:
        kwargs["max_timestamp"] = draw(st.integers(0, 2**42))
    if not records or (not contiguous and draw(st.booleans())):  # the original batch's last records may be gone
        kwargs["last_offset_delta"] = (records[-1][0] if records else 0) + draw(st.integers(0, 5))
    return records, kwargs


def expected_header(records, kw) -> dict:
    """The header fields a reader must find, as build_batch documents them."""
    return dict(
        codec=kw["codec"] if records else NONE,
        timestamp_type=kw["timestamp_type"],
        is_transactional=kw["is_transactional"],
        is_control=kw["is_control"],
        last_offset_delta=kw.get("last_offset_delta", records[-1][0] if records else None),
        base_timestamp=kw["base_timestamp"],
        max_timestamp=kw.get("max_timestamp", max((r[1] for r in records), default=-1)),
        producer_id=kw["producer_id"],
        producer_epoch=kw["producer_epoch"],
        base_sequence=kw["base_sequence"],
        record_count=len(records),
    )


def expected_records(records, kw) -> list[tuple]:
    """(offset, timestamp, key, value, headers) as a consumer sees them."""
    log_append = kw["timestamp_type"] == LOG_APPEND_TIME
    return [
        (kw["base_offset"] + delta, kw["max_timestamp"] if log_append else ts, key, value, tuple(headers))
        for delta, ts, key, value, headers in records
    ]


def stored_prefix(data: bytes) -> tuple[int, int, int, int]:
    """baseOffset, batchLength, partitionLeaderEpoch and magic as written."""
    return BATCH_HEADER.unpack_from(data)[:4]


def assert_neve_reads(data: bytes, records, kw) -> None:
    assert stored_prefix(data) == (kw["base_offset"], len(data) - 12, kw["partition_leader_epoch"], 2)
    (batch,) = decode_range(data, kw["base_offset"])  # checks the CRC-32C
    assert batch.size == len(data)
    assert dict(
        codec=batch.codec, timestamp_type=batch.timestamp_type, is_transactional=batch.is_transactional,
        is_control=batch.is_control, last_offset_delta=batch.last_offset_delta, base_timestamp=batch.base_timestamp,
        max_timestamp=batch.max_timestamp, producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
        base_sequence=batch.base_sequence, record_count=batch.record_count,
    ) == expected_header(records, kw)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch.records] == expected_records(records, kw)


def assert_clients_read(data: bytes, records, kw) -> None:
    want = expected_header(records, kw)
    for reader in (AiokafkaBatch, KafkaPythonBatch):
        batch = reader(data)
        assert batch.validate_crc(), reader
        assert dict(
            codec=batch.compression_type, timestamp_type=batch.timestamp_type, is_transactional=batch.is_transactional,
            is_control=batch.is_control_batch, last_offset_delta=batch.last_offset_delta, base_timestamp=batch.first_timestamp,
            max_timestamp=batch.max_timestamp, producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence, record_count=len(records),
        ) == want, reader
        assert (batch.base_offset, batch.next_offset) == (kw["base_offset"], kw["base_offset"] + want["last_offset_delta"] + 1)
        got = [(r.offset, r.timestamp, r.key, r.value, tuple(tuple(h) for h in r.headers)) for r in batch]
        assert got == expected_records(records, kw), reader
    kafka_python = KafkaPythonBatch(data)
    assert (kafka_python.leader_epoch, kafka_python.records_count) == (kw["partition_leader_epoch"], len(records))


@settings(deadline=None, max_examples=300)
@given(batches())
def test_every_batch_reads_back_exactly(batch):
    records, kw = batch
    data = build_batch(records, **kw)
    assert_neve_reads(data, records, kw)
    assert_clients_read(data, records, kw)


@settings(deadline=None, max_examples=150)
@given(batches(contiguous=True, min_size=1))
def test_a_batch_as_produced_passes_the_produce_paths_validation(batch):
    """The produce path's checks (offset deltas 0..n-1, no control batch, at least one record) are
    Kafka's for what a client may send: every batch that meets them is accepted."""
    records, kw = batch
    data = build_batch(records, **kw)
    summary = validate(data, keyed=all(r[2] is not None for r in records))
    want = expected_header(records, kw)
    assert (summary.batch_count, summary.record_count, summary.first_timestamp, summary.max_timestamp, summary.compression) == (
        1, len(records), want["base_timestamp"], want["max_timestamp"], want["codec"])
    assert (summary.producer_id, summary.producer_epoch, summary.base_sequence, summary.transactional) == (
        kw["producer_id"], kw["producer_epoch"], kw["base_sequence"], kw["is_transactional"])


@pytest.mark.parametrize("codec", CODECS)
def test_a_large_batch_spans_many_compression_blocks(codec):
    """Megabytes of records cross snappy's 32 KiB and lz4's 64 KiB blocks many times, with values
    that do not compress (lz4 then stores raw blocks) and values that do."""
    rng = random.Random(codec)
    records = [
        (i, 1_700_000_000_000 + i, b"key-%d" % i, rng.randbytes(rng.choice((10, 5000, 70_000))) if i % 2 else b"v" * 30_000, [("i", b"%d" % i)])
        for i in range(300)
    ]
    kw = dict(codec=codec, timestamp_type=0, base_timestamp=records[0][1], producer_id=9, producer_epoch=1, base_sequence=0,
              is_transactional=False, is_control=False, partition_leader_epoch=0, base_offset=1000)
    data = build_batch(records, **kw)
    assert_neve_reads(data, records, kw)
    assert_clients_read(data, records, kw)
    assert validate(data).record_count == 300


def test_the_defaults_are_a_plain_producers_batch():
    records = [(0, 500, b"k", b"v", []), (1, 700, None, b"w", []), (2, 600, b"k", None, [])]
    kw = dict(codec=NONE, timestamp_type=0, base_timestamp=500, max_timestamp=700, last_offset_delta=2, producer_id=-1,
              producer_epoch=-1, base_sequence=-1, is_transactional=False, is_control=False, partition_leader_epoch=0, base_offset=0)
    assert build_batch(records) == build_batch(records, **kw)
    assert_neve_reads(build_batch(records), records, kw)


def test_an_empty_batch_is_written_as_kafkas_cleaner_writes_it():
    """Only its header: no records section, codec none, the offsets and producer state it keeps."""
    data = build_batch([], codec=ZSTD, base_timestamp=5, max_timestamp=9, last_offset_delta=3, producer_id=4, producer_epoch=0, base_sequence=10)
    assert len(data) == BATCH_HEADER_SIZE
    fields = BATCH_HEADER.unpack_from(data)
    assert fields[5:] == (0, 3, 5, 9, 4, 0, 10, 0)  # attributes .. recordCount
    assert [(b.next_offset, list(b)) for b in (AiokafkaBatch(data), KafkaPythonBatch(data))] == [(4, []), (4, [])]


@pytest.mark.parametrize(
    "records, kwargs, message",
    [
        ([], {}, "an empty batch needs its last_offset_delta"),
        ([(0, 1, b"k", b"v", [])] * 3, {"last_offset_delta": 1}, "3 records cannot fit offset deltas 0..1"),
        ([(0, 1, b"k", b"v", [])], {"codec": 5}, "compression codec 5"),
        ([(0, 1, b"k", b"v", [])], {"timestamp_type": 2}, "timestamp type 2"),
    ],
)
def test_impossible_batches_are_refused(records, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_batch(records, **kwargs)


def test_codecs_are_framed_as_the_java_client_frames_them():
    """lz4: an LZ4 frame of independent blocks with the descriptor Java writes (it refuses linked
    blocks); snappy: xerial's stream. Both read by the reference decoders too."""
    section_of = {}
    for codec in (NONE, SNAPPY, LZ4):
        data = build_batch([(0, 1, b"k", b"x" * 200_000, [])], codec=codec)
        section_of[codec] = data[BATCH_HEADER_SIZE:]
    lz4_section = section_of[LZ4]
    assert lz4_section[:7] == b"\x04\x22\x4d\x18\x60\x40\x82" and lz4_section[-4:] == b"\x00\x00\x00\x00"
    assert lz4.frame.decompress(lz4_section) == section_of[NONE]
    assert section_of[SNAPPY][:16] == b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01"


def aiokafka_batch(records, **producer) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=producer.get("is_transactional", False),
                                        producer_id=producer.get("producer_id", -1), producer_epoch=producer.get("producer_epoch", -1),
                                        base_sequence=producer.get("base_sequence", -1), batch_size=1 << 24)
    for offset, timestamp, key, value, record_headers in records:
        assert builder.append(offset, timestamp=timestamp, key=key, value=value, headers=record_headers) is not None
    return bytes(builder.build())


@settings(deadline=None, max_examples=200)
@given(batches(contiguous=True, min_size=1))
def test_rebuilding_a_client_built_batch_gives_the_same_bytes(batch):
    """A batch aiokafka's encoder wrote, decoded by the compactor and rebuilt from its records and
    header fields, is the same bytes (the producer's leader epoch is -1)."""
    records, kw = batch
    producer = {k: kw[k] for k in ("producer_id", "producer_epoch", "base_sequence", "is_transactional")}
    original = aiokafka_batch(records, **producer)
    (decoded,) = decode_range(original, 0)
    rebuilt = build_batch(
        [(r.offset - decoded.base_offset, r.timestamp, r.key, r.value, r.headers) for r in decoded.records],
        codec=decoded.codec, timestamp_type=decoded.timestamp_type, base_timestamp=decoded.base_timestamp,
        max_timestamp=decoded.max_timestamp, last_offset_delta=decoded.last_offset_delta, producer_id=decoded.producer_id,
        producer_epoch=decoded.producer_epoch, base_sequence=decoded.base_sequence, is_transactional=decoded.is_transactional,
        is_control=decoded.is_control, partition_leader_epoch=-1, base_offset=0,
    )
    assert rebuilt == original


@pytest.mark.parametrize("compression_type, original, codec", [
    ("producer", SNAPPY, SNAPPY), ("producer", NONE, NONE), ("uncompressed", GZIP, NONE), ("gzip", NONE, GZIP),
    ("snappy", ZSTD, SNAPPY), ("lz4", NONE, LZ4), ("zstd", LZ4, ZSTD),
])
def test_codec_for_a_topics_compression_type(compression_type, original, codec):
    assert codec_for(compression_type, original) == codec


def test_codec_for_knows_every_kafka_compression_type_and_no_other():
    assert sorted(COMPRESSION_TYPES) == ["gzip", "lz4", "producer", "snappy", "uncompressed", "zstd"]
    with pytest.raises(ValueError, match="'none'"):
        codec_for("none", NONE)  # a producer's name for it, not a topic's


# --- the Java client's reader ------------------------------------------------------------------

JAVA_READER = Path(__file__).parent / "java" / "ReadBatches.java"
JAVA_TIMEOUT = 300  # seconds: compiling the source program and reading megabytes, on a slow machine


def java_reads(data: bytes, tmp_path: Path) -> list[str]:
    """ReadBatches.java's lines for the concatenated batches in `data`."""
    path = tmp_path / "batches.bin"
    path.write_bytes(data)
    java = shutil.which("java")
    assert java is not None, "the Java-client tests need a JDK 17 on PATH"
    proc = subprocess.run([java, "-cp", classpath(), str(JAVA_READER), str(path)], capture_output=True, text=True, timeout=JAVA_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def java_lines(records, kw) -> list[str]:
    """What ReadBatches.java prints for a batch that reads back exactly."""
    h = expected_header(records, kw)

    def hex_(b: bytes | None) -> str:
        return "-" if b is None else "x" + b.hex()

    flags = [str(h["is_transactional"]).lower(), str(h["is_control"]).lower()]
    header = [kw["base_offset"], kw["base_offset"] + h["last_offset_delta"], kw["partition_leader_epoch"], 2, h["codec"], h["timestamp_type"], *flags,
              h["base_timestamp"], h["max_timestamp"], h["producer_id"], h["producer_epoch"], h["base_sequence"], h["record_count"]]
    lines = [" ".join(["B", *map(str, header)])]
    for offset, timestamp, key, value, record_headers in expected_records(records, kw):
        fields = ["R", str(offset), str(timestamp), hex_(key), hex_(value)]
        for name, header_value in record_headers:
            fields += [hex_(name.encode()), hex_(header_value)]
        lines.append(" ".join(fields))
    return lines


@pytest.mark.integration
@settings(max_examples=3)
@given(st.lists(batches(), min_size=30, max_size=30))
def test_the_java_client_reads_every_batch(tmp_path_factory, many):
    """One Java run per example, over 30 batches of every kind."""
    data = b"".join(build_batch(records, **kw) for records, kw in many)
    assert java_reads(data, tmp_path_factory.mktemp("java")) == [line for records, kw in many for line in java_lines(records, kw)]


@pytest.mark.integration
def test_the_java_client_reads_large_batches_of_every_codec(tmp_path):
    rng = random.Random(7)
    built = []
    for codec in CODECS:
        records = [(i, 1_700_000_000_000 + i, b"k%d" % i, rng.randbytes(70_000) if i % 3 == 0 else b"%d" % i * 9000, [("n", None)]) for i in range(40)]
        built.append((records, dict(codec=codec, timestamp_type=0, base_timestamp=records[0][1], producer_id=3, producer_epoch=0, base_sequence=0,
                                    is_transactional=True, is_control=False, partition_leader_epoch=0, base_offset=codec * 100)))
    data = b"".join(build_batch(records, **kw) for records, kw in built)
    assert java_reads(data, tmp_path) == [line for records, kw in built for line in java_lines(records, kw)]

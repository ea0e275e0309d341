"""wal.batch: produce-path validation, fetch-path offset injection, and ListOffsets by timestamp."""

from __future__ import annotations

import struct

import pytest
import zstandard
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial.readers import read_signed_varint, read_signed_varlong

from tests.batches import (
    CODECS,
    CONTROL,
    GZIP,
    LOG_APPEND_TIME,
    LZ4,
    NONE,
    SNAPPY,
    TRANSACTIONAL,
    ZSTD,
    compress,
    edited,
    encode_records,
    frame_batch,
    make_batch,
    xerial_snappy,
)
from wal.batch import (
    BatchHeader,
    InvalidRecords,
    RecordsSummary,
    inject_offsets,
    iter_headers,
    offset_for_timestamp,
    validate,
)


def records(timestamps: list[int], value_size: int = 10) -> list:
    return [(b"key-%d" % i, bytes([i % 256]) * value_size, [("h", b"v%d" % i)], ts) for i, ts in enumerate(timestamps)]


def expect(code: int, data: bytes, **kwargs) -> InvalidRecords:
    with pytest.raises(InvalidRecords) as info:
        validate(data, **kwargs)
    assert info.value.error_code == code
    return info.value


def client_batch(codec: int, timestamps: list[int]) -> bytes:
    """A batch built by aiokafka's own builder: an independent encoder (xerial-framed snappy)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, ts in enumerate(timestamps):
        builder.append(i, timestamp=ts, key=b"k%d" % i, value=b"value" * 40, headers=[("h", b"x")])
    return bytes(builder.build())


# --- validate: accepted batches ---------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_validate_summarises_one_batch_of_each_codec(codec):
    data = make_batch(records([1000, 1007, 1003]), producer_id=42, producer_epoch=3, base_sequence=17, compression=codec)
    assert validate(data) == RecordsSummary(
        batch_count=1,
        record_count=3,
        first_timestamp=1000,
        max_timestamp=1007,
        producer_id=42,
        producer_epoch=3,
        base_sequence=17,
        transactional=False,
        compression=codec,
    )


def test_validate_summarises_several_batches():
    data = (
        make_batch(records([500, 510]), producer_id=7, producer_epoch=1, base_sequence=0, compression=GZIP)
        + make_batch(records([520, 900, 530]), producer_id=7, producer_epoch=1, base_sequence=2, attributes=TRANSACTIONAL)
        + make_batch(records([600]), producer_id=7, producer_epoch=1, base_sequence=5, compression=ZSTD)
    )
    assert validate(data) == RecordsSummary(
        batch_count=3,
        record_count=6,
        first_timestamp=500,
        max_timestamp=900,
        producer_id=7,
        producer_epoch=1,
        base_sequence=0,
        transactional=True,
        compression=GZIP,
    )


def test_an_idempotent_producers_batches_must_follow_one_another():
    """The review's case: producer 7's sequences 3-5 then 100-102 in one partition's records were
    both stored, the second unchecked."""
    first = make_batch(records([1, 2, 3]), producer_id=7, producer_epoch=0, base_sequence=3)
    expect(45, first + make_batch(records([4, 5, 6]), producer_id=7, producer_epoch=0, base_sequence=100))
    assert validate(first + make_batch(records([4, 5, 6]), producer_id=7, producer_epoch=0, base_sequence=6)).record_count == 6
    # sequences wrap from Int.MaxValue to 0
    last = make_batch(records([1, 2]), producer_id=7, producer_epoch=0, base_sequence=2**31 - 2)
    assert validate(last + make_batch(records([3]), producer_id=7, producer_epoch=0, base_sequence=0)).batch_count == 2


@pytest.mark.parametrize("pid, epoch", [(8, 0), (7, 1), (-1, -1)])
def test_batches_of_another_producer_or_epoch_are_invalid(pid, epoch):
    """One partition's records come from one producer: a second one's batch would be stored
    without its own duplicate and sequence check."""
    first = make_batch(records([1]), producer_id=7, producer_epoch=0, base_sequence=0)
    expect(87, first + make_batch(records([2]), producer_id=pid, producer_epoch=epoch, base_sequence=1 if pid >= 0 else -1))
    expect(87, make_batch(records([2])) + first)  # a plain batch before an idempotent one too


def test_validate_accepts_a_memoryview_slice():
    data = b"junk" + make_batch(records([5, 6])) + b"more junk"
    summary = validate(memoryview(data)[4:-9])
    assert (summary.batch_count, summary.record_count, summary.max_timestamp) == (1, 2, 6)


@pytest.mark.parametrize("codec", CODECS)
def test_validate_accepts_batches_from_a_kafka_client_library(codec):
    summary = validate(client_batch(codec, [2000, 2001, 2002, 2003]))
    assert (summary.record_count, summary.first_timestamp, summary.max_timestamp, summary.compression) == (4, 2000, 2003, codec)


def test_max_size_bounds_each_batch():
    one = make_batch(records([1]))
    assert validate(one + one, max_size=len(one)).batch_count == 2
    error = expect(10, one + one, max_size=len(one) - 1)
    assert str(error) == f"batch 0 is {len(one)} bytes, the limit is {len(one) - 1}"


# --- validate: rejected batches ---------------------------------------------------------------


def test_empty_records_are_invalid():
    expect(87, b"")


def test_a_batch_without_records_is_invalid():
    expect(87, make_batch([]))


@pytest.mark.parametrize("position", [17, 21, 22, 30, 60, 61, -1])
def test_any_flipped_byte_from_the_crc_on_fails_the_crc(position):
    data = bytearray(make_batch(records([1, 2, 3]), compression=NONE))
    data[position] ^= 0x01
    expect(2, bytes(data))


def test_bytes_before_the_crc_region_are_not_covered():
    # baseOffset and partitionLeaderEpoch are rewritten on fetch, so the CRC must not cover them.
    data = bytearray(make_batch(records([1])))
    struct.pack_into(">q", data, 0, 12345)
    struct.pack_into(">i", data, 12, 99)
    assert validate(bytes(data)).record_count == 1


def test_every_truncation_is_corrupt():
    data = make_batch(records([1, 2]))
    for cut in range(1, len(data)):
        expect(2, data[:cut])


def test_a_truncated_second_batch_is_corrupt():
    one = make_batch(records([1]))
    expect(2, one + one[:40])
    expect(2, one + b"\x00" * 5)


@pytest.mark.parametrize("batch_length", [0, -1, 48, 10_000])
def test_batch_length_lies_are_corrupt(batch_length):
    data = bytearray(make_batch(records([1, 2])))
    struct.pack_into(">i", data, 8, batch_length)
    expect(2, bytes(data))


def test_a_batch_length_one_short_fails_the_crc():
    data = bytearray(make_batch(records([1, 2])))
    (length,) = struct.unpack_from(">i", data, 8)
    struct.pack_into(">i", data, 8, length - 1)
    expect(2, bytes(data))


@pytest.mark.parametrize("magic", [0, 1, 3, 255])
def test_other_magic_is_unsupported(magic):
    data = bytearray(make_batch(records([1])))
    data[16] = magic
    error = expect(43, bytes(data))
    assert str(error) == f"batch 0 has magic {magic}, only 2 is supported"


def test_a_legacy_message_shorter_than_a_v2_header_is_unsupported_not_corrupt():
    # offset, size, crc, magic 1, attributes, timestamp, key -1, value "x": 35 bytes
    legacy = struct.pack(">qiIbbqi", 0, 23, 0, 1, 0, 0, -1) + struct.pack(">i", 1) + b"x"
    expect(43, legacy)


def test_magic_is_checked_in_every_batch():
    expect(43, make_batch(records([1])) + frame_batch(b"", record_count=0, last_offset_delta=-1, base_timestamp=0, max_timestamp=0, magic=1))


@pytest.mark.parametrize(("record_count", "last_offset_delta"), [(2, 2), (3, 1), (0, -1), (-1, -2)])
def test_record_count_must_match_last_offset_delta(record_count, last_offset_delta):
    payload = encode_records(records([1, 2]), 1)
    expect(87, frame_batch(payload, record_count=record_count, last_offset_delta=last_offset_delta, base_timestamp=1, max_timestamp=2))


def test_clients_may_not_send_control_batches():
    expect(87, make_batch(records([1]), attributes=CONTROL))


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codecs_are_unsupported(codec):
    payload = encode_records(records([1]), 1)
    expect(76, frame_batch(payload, record_count=1, last_offset_delta=0, base_timestamp=1, max_timestamp=1, attributes=codec))


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_invalid_records(data):
    try:
        validate(data)
    except InvalidRecords as e:
        assert e.error_code in (2, 10, 43, 76, 87)


VALID = make_batch(records([10, 20, 30]), producer_id=1, producer_epoch=0, base_sequence=0) + make_batch(records([40]), compression=GZIP)


@settings(max_examples=500)
@given(
    st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=4),
    st.integers(0, len(VALID)),
    st.binary(max_size=70),
)
def test_mutated_batches_raise_only_invalid_records(edits, cut, tail):
    data = bytearray(VALID)
    for position, value in edits:
        data[position] = value
    mutated = bytes(data[:cut]) + tail
    try:
        summary = validate(mutated)
    except InvalidRecords as e:
        assert e.error_code in (2, 10, 43, 76, 87)
    else:
        assert summary.batch_count >= 1


# --- validate: every record, as Kafka walks them ----------------------------------------------


def reference_records(payload: bytes) -> list[tuple[int, bytes | None, bytes | None, list]] | None:
    """An independent, plain reading of a record section (kio's varint readers, every field
    decoded): (offset delta, key, value, headers) of each record, or None where Kafka's record
    reader would fail (a record's fields not ending at its length, a negative header count or
    header key length, a varint too long, a truncation)."""
    out = []
    pos = 0
    try:
        while pos < len(payload):
            length, used = read_signed_varint(payload, pos)
            start = pos = pos + used
            if length < 0 or start + length > len(payload):
                return None
            pos += 1  # attributes
            _, used = read_signed_varlong(payload, pos)
            pos += used
            offset_delta, used = read_signed_varint(payload, pos)
            pos += used
            fields = []
            for _ in range(2):  # key, value: negative lengths are null
                n, used = read_signed_varint(payload, pos)
                pos += used
                fields.append(payload[pos : pos + n] if n >= 0 else None)
                pos += max(n, 0)
            count, used = read_signed_varint(payload, pos)
            pos += used
            if count < 0:
                return None
            headers = []
            for _ in range(count):
                n, used = read_signed_varint(payload, pos)
                if n < 0 or pos + used + n > start + length:
                    return None
                name = payload[pos + used : pos + used + n]
                pos += used + n
                n, used = read_signed_varint(payload, pos)
                pos += used
                headers.append((name, payload[pos : pos + n] if n >= 0 else None))
                pos += max(n, 0)
            if pos != start + length:
                return None
            out.append((offset_delta, fields[0], fields[1], headers))
    except Exception:  # kio's underflow and varint errors
        return None
    return out


def keyless(values: list[bytes]) -> list:
    return [(None, v, [], 100 + i) for i, v in enumerate(values)]


def reframed(payload: bytes, record_count: int, codec: int = NONE) -> bytes:
    """A batch around `payload` (compressed with `codec`) with a right CRC: only its records lie."""
    return frame_batch(compress(codec, payload), record_count=record_count, last_offset_delta=record_count - 1, base_timestamp=1, max_timestamp=9, attributes=codec)


@pytest.mark.parametrize("codec", CODECS)
def test_records_that_do_not_parse_are_corrupt(codec):
    """Issue 20's review: a batch whose CRC is right but whose records do not parse was stored."""
    good = encode_records(records([1, 2, 3]), 1)
    expect(2, reframed(b"\x7f" * 40, 3, codec))
    expect(2, reframed(good[:-1], 3, codec))  # the last record one byte short
    expect(2, reframed(good + b"\x00", 3, codec))  # a byte after the last record
    expect(2, reframed(good, 4, codec))  # fewer records than the header says
    expect(2, reframed(good + encode_records(records([4]), 1), 3, codec))  # more
    assert validate(reframed(good, 3, codec)).record_count == 3


def test_offset_deltas_must_run_from_zero_in_order():
    first, second = encode_records(records([1]), 1), encode_records(records([2, 3]), 1)
    assert reference_records(second[len(encode_records(records([2]), 1)) :])[0][0] == 1
    expect(2, reframed(second[len(encode_records(records([2]), 1)) :] + first, 2))  # deltas 1, 0
    expect(2, reframed(first + first, 2))  # deltas 0, 0


def test_a_compressed_batch_that_does_not_decompress_is_corrupt():
    for codec in (GZIP, SNAPPY, LZ4, ZSTD):
        expect(2, frame_batch(b"not compressed at all", record_count=1, last_offset_delta=0, base_timestamp=1, max_timestamp=1, attributes=codec))


def test_xerial_framed_snappy_is_walked():
    payload = encode_records(records([1, 2, 3], value_size=300), 1)
    batch = frame_batch(xerial_snappy(payload, block_size=256), record_count=3, last_offset_delta=2, base_timestamp=1, max_timestamp=3, attributes=SNAPPY)
    assert validate(batch).record_count == 3
    broken = frame_batch(xerial_snappy(payload[:-2], block_size=256), record_count=3, last_offset_delta=2, base_timestamp=1, max_timestamp=3, attributes=SNAPPY)
    expect(2, broken)


@pytest.mark.parametrize("codec", CODECS)
def test_a_record_without_a_key_is_invalid_only_for_a_compacted_topic(codec):
    """As Kafka (and librdkafka's test 0011, which expects INVALID_RECORD)."""
    batch = make_batch(records([1]) + keyless([b"v"]), compression=codec)
    assert validate(batch).record_count == 2
    error = expect(87, batch, keyed=True)
    assert (str(error), error.keyless) == ("batch 0: record 1 has no key, and the topic is compacted", (1,))
    assert validate(make_batch(records([1, 2]), compression=codec), keyed=True).record_count == 2
    assert validate(make_batch([(b"", b"v", [], 1)]), keyed=True).record_count == 1  # an empty key is a key


@pytest.mark.parametrize("codec", CODECS)
def test_every_keyless_record_of_a_batch_is_named(codec):
    """Kafka's record_errors name each record without a key by its index within its batch: these
    indices, whatever the keys, values and headers around them."""
    recs = [(None if i in (0, 1, 3, 70, 199) else b"k" * (i % 3), b"v" * (i * 7 % 300) if i % 5 else None, [("h", b"x")] * (i % 2), i) for i in range(200)]
    error = expect(87, make_batch(recs, compression=codec), keyed=True)
    assert error.keyless == (0, 1, 3, 70, 199)
    assert str(error) == "batch 0: records 0, 1, 3 and 2 more have no key, and the topic is compacted"
    # the second batch of a request counts its own records from 0, as each batch is Kafka's unit
    two = make_batch(records([1, 2]), compression=codec) + make_batch(records([3]) + keyless([b"a", b"b"]), compression=codec)
    error = expect(87, two, keyed=True)
    assert (str(error), error.keyless) == ("batch 1: records 1, 2 have no key, and the topic is compacted", (1, 2))


def test_a_keyless_batch_that_does_not_parse_is_corrupt():
    """Keys are judged once the batch is sound: a record that does not parse after a keyless one
    makes the whole batch CORRUPT_MESSAGE, as in Kafka."""
    payload = encode_records(keyless([b"v"]) + records([1, 2]), 0)
    broken = frame_batch(payload[:-1], record_count=3, last_offset_delta=2, base_timestamp=0, max_timestamp=2)
    assert expect(2, broken, keyed=True).keyless == ()
    short = frame_batch(payload, record_count=4, last_offset_delta=3, base_timestamp=0, max_timestamp=2)  # a record missing
    assert "holds 3 records" in str(expect(2, short, keyed=True))


def test_records_of_every_varint_width_and_headers_are_accepted():
    """Fields whose varints take one, two, three and more bytes, null values, many headers."""
    recs = [
        (b"k" * 8000, b"v" * 70_000, [(f"h{j}", b"x" * j) for j in range(70)], 1),
        (b"", None, [("", None)], -(2**40)),
        (None, b"", [], 2**40),
    ] + [(b"k", b"v" * i, [], i) for i in range(200)]
    payload = encode_records(recs, 0)
    for codec in CODECS:
        assert validate(reframed(payload, len(recs), codec)).record_count == len(recs)


record_strategy = st.tuples(
    st.none() | st.binary(max_size=300),
    st.none() | st.binary(max_size=300),
    st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=20)), max_size=3),
    st.integers(-(2**45), 2**45),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(record_strategy, min_size=1, max_size=12), st.sampled_from(CODECS))
def test_any_records_round_trip(recs, codec):
    payload = encode_records(recs, 0)
    assert validate(reframed(payload, len(recs), codec)).record_count == len(recs)
    assert [r[1:] for r in reference_records(payload)] == [(k, v, [(n.encode(), hv) for n, hv in h]) for k, v, h, _ in recs]
    if any(k is None for k, *_ in recs):
        expect(87, reframed(payload, len(recs), codec), keyed=True)


@settings(max_examples=600, deadline=None)
@given(
    st.lists(record_strategy, min_size=1, max_size=6),
    st.sampled_from(CODECS),
    st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(["set", "insert", "delete"]), st.integers(0, 255)), min_size=1, max_size=3),
)
def test_mutated_record_bodies_are_stored_exactly_when_they_parse(recs, codec, edits):
    """A record section mutated in place, inserted into or cut, then compressed and framed with a
    right CRC: validate accepts it exactly when an independent reading parses it into the header's
    count of records with offset deltas 0..n-1, and answers CORRUPT_MESSAGE otherwise."""
    payload = edited(encode_records(recs, 0), edits)
    parsed = reference_records(payload)
    parses = parsed is not None and [r[0] for r in parsed] == list(range(len(recs)))
    try:
        summary = validate(reframed(payload, len(recs), codec))
    except InvalidRecords as e:
        assert e.error_code == 2 and not parses, str(e)
    else:
        assert parses and summary.record_count == len(recs)


# --- iter_headers and inject_offsets ----------------------------------------------------------


def test_iter_headers_reads_every_field():
    first = make_batch(records([100, 150]), producer_id=9, producer_epoch=2, base_sequence=4, compression=SNAPPY, base_offset=3)
    second = make_batch(records([160]), attributes=TRANSACTIONAL)
    assert list(iter_headers(first + second)) == [
        BatchHeader(position=0, size=len(first), base_offset=3, last_offset_delta=1, attributes=SNAPPY, base_timestamp=100, max_timestamp=150, producer_id=9, producer_epoch=2, base_sequence=4, record_count=2),
        BatchHeader(position=len(first), size=len(second), base_offset=0, last_offset_delta=0, attributes=TRANSACTIONAL, base_timestamp=160, max_timestamp=160, producer_id=-1, producer_epoch=-1, base_sequence=-1, record_count=1),
    ]


def test_inject_offsets_numbers_consecutive_batches_and_keeps_crcs():
    batches = [make_batch(records([1])), make_batch(records([2, 3, 4, 5, 6]), compression=LZ4), make_batch(records([7, 8, 9]))]
    stored = b"".join(batches)
    out = inject_offsets(stored, 100, leader_epoch=5)
    assert isinstance(out, bytearray)
    assert [(h.position, h.base_offset) for h in iter_headers(out)] == [(0, 100), (len(batches[0]), 101), (len(batches[0]) + len(batches[1]), 106)]
    assert [struct.unpack_from(">i", out, h.position + 12)[0] for h in iter_headers(out)] == [5, 5, 5]
    assert validate(out).record_count == 9  # every CRC still verifies
    for h in iter_headers(out):  # nothing after the partitionLeaderEpoch changed
        assert out[h.position + 16 : h.position + h.size] == stored[h.position + 16 : h.position + h.size]
    assert [h.base_offset for h in iter_headers(stored)] == [0, 0, 0]  # the input is untouched


def test_inject_offsets_accepts_a_memoryview_slice():
    one = make_batch(records([1, 2]))
    out = inject_offsets(memoryview(b"xx" + one + one)[2:], 7)
    assert [h.base_offset for h in iter_headers(out)] == [7, 9]


def test_inject_offsets_of_nothing_is_nothing():
    assert inject_offsets(b"", 5) == bytearray()


# --- offset_for_timestamp ---------------------------------------------------------------------

# Offsets 50..52 then 53..55; timestamps are not monotonic within a batch.
TIMESTAMPS = ([100, 105, 103], [110, 108, 120])
QUERIES = [(0, (50, 100)), (100, (50, 100)), (101, (51, 105)), (104, (51, 105)), (105, (51, 105)), (106, (53, 110)), (109, (53, 110)), (111, (55, 120)), (120, (55, 120)), (121, None)]


@pytest.mark.parametrize("codec", CODECS)
def test_offset_for_timestamp_in_every_codec(codec):
    # The base timestamp sits mid-batch so deltas are negative as well as positive.
    stored = make_batch(records(TIMESTAMPS[0], 300), compression=codec, base_timestamp=103) + make_batch(records(TIMESTAMPS[1], 300), compression=codec)
    for target, expected in QUERIES:
        assert offset_for_timestamp(stored, 50, target) == expected, target


def test_offset_for_timestamp_in_xerial_framed_snappy():
    def xerial(timestamps, base_offset=0):
        payload = encode_records(records(timestamps, 500), timestamps[0])
        return frame_batch(xerial_snappy(payload, block_size=256), record_count=3, last_offset_delta=2, base_timestamp=timestamps[0], max_timestamp=max(timestamps), attributes=SNAPPY)

    stored = xerial(TIMESTAMPS[0]) + xerial(TIMESTAMPS[1])
    for target, expected in QUERIES:
        assert offset_for_timestamp(memoryview(stored), 50, target) == expected, target


def test_offset_for_timestamp_in_zstd_frames_without_content_size():
    stream = zstandard.ZstdCompressor().compressobj()
    payload = encode_records(records([7, 9, 8]), 7)
    compressed = stream.compress(payload) + stream.flush()
    stored = frame_batch(compressed, record_count=3, last_offset_delta=2, base_timestamp=7, max_timestamp=9, attributes=ZSTD)
    assert offset_for_timestamp(stored, 0, 8) == (1, 9)


@pytest.mark.parametrize("codec", CODECS)
def test_offset_for_timestamp_in_batches_from_a_kafka_client_library(codec):
    stored = client_batch(codec, [1000, 1010, 1020]) + client_batch(codec, [1030, 1040])
    assert offset_for_timestamp(stored, 10, 1011) == (12, 1020)
    assert offset_for_timestamp(stored, 10, 1031) == (14, 1040)
    assert offset_for_timestamp(stored, 10, 1041) is None


def test_only_the_batch_reaching_the_target_is_decoded():
    undecodable = frame_batch(b"not gzip at all", record_count=2, last_offset_delta=1, base_timestamp=10, max_timestamp=20, attributes=GZIP)
    stored = undecodable + make_batch(records([30, 40]))
    assert offset_for_timestamp(stored, 0, 25) == (2, 30)
    with pytest.raises(InvalidRecords) as info:
        offset_for_timestamp(stored, 0, 15)
    assert info.value.error_code == 2


def test_records_overrunning_their_batch_are_corrupt():
    payload = encode_records(records([10, 20]), 10)
    stored = frame_batch(payload[:-3], record_count=2, last_offset_delta=1, base_timestamp=10, max_timestamp=20)
    with pytest.raises(InvalidRecords) as info:
        offset_for_timestamp(stored, 0, 15)
    assert info.value.error_code == 2


def test_log_append_time_batches_use_the_max_timestamp_for_every_record():
    payload = encode_records(records([1, 2, 3]), 1)
    stored = frame_batch(payload, record_count=3, last_offset_delta=2, base_timestamp=5000, max_timestamp=5000, attributes=LOG_APPEND_TIME)
    assert offset_for_timestamp(stored, 40, 4000) == (40, 5000)
    assert offset_for_timestamp(stored, 40, 5001) is None


def test_offset_for_timestamp_of_nothing_is_none():
    assert offset_for_timestamp(b"", 0, 0) is None

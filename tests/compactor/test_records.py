"""compactor/rows/records.py: stored batches of every codec decoded to records with their offsets as
assigned, header fields, control and transactional flags; broken bytes named, never crashed on."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from compactor.rows.records import CorruptBatch, decode_range, decode_records, iter_batches
from tests.batches import CODECS, CONTROL, LOG_APPEND_TIME, TRANSACTIONAL, encode_records, frame_batch, make_batch, xerial_snappy

T0 = 1_700_000_000_000


def records(n: int, tag: str = "") -> list:
    return [
        (None if i % 3 == 0 else f"k{tag}{i}".encode(), None if i % 5 == 4 else f"v{tag}{i}".encode() * (i % 7 + 1), [("h", b"x"), ("n", None)][: i % 3], T0 + i * 10)
        for i in range(n)
    ]


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_decodes_with_offsets_assigned_from_the_entry(codec):
    first, second = records(7, "a"), records(5, "b")
    # Stored base offsets are the producer's (0 here); the entry's base offset is what counts.
    data = make_batch(first, compression=codec, producer_id=9, producer_epoch=2, base_sequence=40) + make_batch(second, compression=codec, producer_id=9, producer_epoch=2, base_sequence=47)
    batches = decode_range(data, 1000)
    assert [b.base_offset for b in batches] == [1000, 1007]
    assert [(b.codec, b.producer_id, b.producer_epoch, b.base_sequence, b.record_count, b.last_offset_delta) for b in batches] == [(codec, 9, 2, 40, 7, 6), (codec, 9, 2, 47, 5, 4)]
    assert batches[0].base_timestamp == T0 and batches[0].max_timestamp == T0 + 60
    assert (batches[0].magic, batches[0].partition_leader_epoch, batches[0].timestamp_type) == (2, 0, 0)
    got = [tuple(r) for b in batches for r in b.records]
    want = [(1000 + i, ts, k, v, tuple(h), 0, None) for i, (k, v, h, ts) in enumerate(first + second)]
    assert got == want


def test_xerial_framed_snappy_as_the_java_client_writes_it():
    recs = records(300)
    payload = encode_records(recs, T0)
    data = frame_batch(xerial_snappy(payload, block_size=1024), record_count=300, last_offset_delta=299, base_timestamp=T0, max_timestamp=T0 + 2990, attributes=2)
    (batch,) = decode_range(data, 5)
    assert batch.codec_name == "snappy"
    assert [(r.offset, r.key, r.value) for r in batch.records] == [(5 + i, k, v) for i, (k, v, _, _) in enumerate(recs)]


def test_log_append_time_gives_every_record_the_batch_max_timestamp():
    payload = encode_records(records(3), T0)
    data = frame_batch(payload, record_count=3, last_offset_delta=2, base_timestamp=T0, max_timestamp=T0 + 999, attributes=LOG_APPEND_TIME)
    (batch,) = decode_range(data, 0)
    assert batch.timestamp_type == 1
    assert [r.timestamp for r in batch.records] == [T0 + 999] * 3


def test_control_and_transactional_batches_are_decoded_and_flagged():
    # A commit marker as a transaction coordinator writes it: key (version 0, type 1), value (version 0, coordinator epoch 3).
    marker = [(struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 3), [], T0)]
    data = make_batch(records(2), producer_id=4, producer_epoch=0, base_sequence=0, attributes=TRANSACTIONAL) + make_batch(marker, producer_id=4, producer_epoch=0, attributes=TRANSACTIONAL | CONTROL)
    data_batch, control = decode_range(data, 10)
    assert (data_batch.is_transactional, data_batch.is_control) == (True, False)
    assert (control.is_transactional, control.is_control, control.base_offset) == (True, True, 12)
    assert control.records[0] == (12, T0, struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 3), (), 0, None)


def _corrupt_payload_batch(payload: bytes, count: int = 1) -> bytes:
    return frame_batch(payload, record_count=count, last_offset_delta=count - 1, base_timestamp=T0, max_timestamp=T0)


@pytest.mark.parametrize(
    "bad, reason",
    [
        (lambda: make_batch(records(2))[:-1], "does not fit"),  # truncated
        (lambda: (lambda b: b[:-1] + bytes([b[-1] ^ 1]))(make_batch(records(2))), "CRC-32C"),
        (lambda: _corrupt_payload_batch(b"\x7f" * 20), "records do not decode"),  # a record length overrunning the payload
        (lambda: _corrupt_payload_batch(encode_records(records(2), T0), count=3), "records do not decode"),
        (lambda: _corrupt_payload_batch(encode_records(records(2), T0) + b"\x00", count=2), "bytes after"),
        (lambda: frame_batch(b"not zstd at all", record_count=1, last_offset_delta=0, base_timestamp=T0, max_timestamp=T0, attributes=4), "zstd payload does not decompress"),
        (lambda: frame_batch(b"\x82SNAPPY\x00" + b"\x00" * 8 + b"\xff\xff\xff\xff", record_count=1, last_offset_delta=0, base_timestamp=T0, max_timestamp=T0, attributes=2), "snappy payload does not decompress"),
    ],
)
def test_bytes_that_do_not_decode_raise_naming_the_batch(bad, reason):
    good = make_batch(records(4))
    with pytest.raises(CorruptBatch) as caught:
        decode_range(good + bad(), 50)
    assert (caught.value.index, caught.value.position, caught.value.base_offset) == (1, len(good), 54)
    assert reason in str(caught.value) and "batch 1 at byte" in str(caught.value)


def test_a_caller_can_keep_the_batches_around_one_that_does_not_decode():
    bad = _corrupt_payload_batch(b"\x7f" * 20)
    data = make_batch(records(2)) + bad + make_batch(records(3))
    kept, failed = [], []
    for batch in iter_batches(data, 0):
        try:
            kept.extend(r.offset for r in decode_records(data, batch))
        except CorruptBatch as e:
            failed.append((e.base_offset, batch.last_offset))
    assert kept == [0, 1, 3, 4, 5] and failed == [(2, 2)]


def test_magic_other_than_2_is_named():
    batch = bytearray(make_batch(records(1)))
    batch[16] = 1
    with pytest.raises(CorruptBatch, match="magic 1"):
        decode_range(bytes(batch), 0)


def test_a_memoryview_slice_of_a_larger_object_decodes_alike():
    data = b"junk" + make_batch(records(3), compression=3) + b"tail"
    view = memoryview(data)[4:-4]
    assert [r.offset for b in decode_range(view, 7) for r in b.records] == [7, 8, 9]
    assert crc32c(view) == crc32c(data[4:-4])

"""The Fetch handler's FetchAnswer writes its own frame: every byte must equal kio's encoding of
the same response (`FetchAnswer.entity`), in every version the handler serves, for any topics,
partitions, offsets, errors and records; large records stay pieces of their own."""

from __future__ import annotations

import io
import random
import struct
import uuid

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from broker import codec
from broker.fetch_response import FetchAnswer

VERSIONS = range(4, 18)  # what the Fetch handler serves


def kio_frame(version: int, correlation_id: int, body) -> bytes:
    write_header, write_body, header_cls, _ = codec.response_codec(1, version)
    out = io.BytesIO()
    write_header(out, header_cls(correlation_id=correlation_id))
    write_body(out, body)
    return struct.pack(">i", len(out.getvalue())) + out.getvalue()


def topic_key(version: int, name: str):
    return uuid.uuid5(uuid.NAMESPACE_DNS, name) if version >= 13 else name


def random_answer(rng: random.Random, version: int) -> FetchAnswer:
    topics = []
    for t in range(rng.choice([0, 1, 1, 2, 3])):
        partitions = []
        for p in range(rng.choice([0, 1, 5, 40])):
            records = rng.choice([b"", b"", None, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))])
            code = rng.choice([0, 0, 0, int(ErrorCode.offset_out_of_range), int(ErrorCode.unknown_topic_or_partition)])
            hw = rng.choice([0, -1, rng.randrange(2**40), 2**63 - 1])
            partitions.append((rng.choice([p, 2**31 - 1, 0]), code, hw, hw, rng.choice([0, -1, rng.randrange(2**40)]), records))
        topics.append((topic_key(version, rng.choice(["orders", "a.b-c_d", "ü-名前", "x" * 249]) + str(t)), partitions))
    return FetchAnswer(topics, read_committed=rng.random() < 0.5, error_code=rng.choice([0, 0, int(ErrorCode.unknown_server_error)]))


@pytest.mark.parametrize("version", VERSIONS)
def test_frames_are_byte_for_byte_kios(version):
    rng = random.Random(version)
    for n in range(150):
        answer = random_answer(rng, version)
        correlation_id = rng.choice([0, n, -1, 2**31 - 1])
        assert b"".join(answer.frame(version, correlation_id)) == kio_frame(version, correlation_id, answer.entity(version)), (version, answer)


@pytest.mark.parametrize("version", [4, 5, 11, 12, 13, 17])
def test_an_answer_decodes_to_its_values(version):
    records = b"\x00" * 70  # any bytes: not parsed on the way back by kio's reader either
    answer = FetchAnswer([(topic_key(version, "orders"), [(0, 0, 12, 12, 3, b""), (7, int(ErrorCode.offset_out_of_range), 9, 9, 0, b""), (2, 0, 40, 40, 0, records)])], read_committed=True)
    frame = b"".join(codec.encode_response(1, version, 77, answer))
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    cls = codec.response_codec(1, version)[3]
    header, used = entity_reader(cls.__header_schema__)(frame[4:], 0)
    body, used_body = entity_reader(cls)(frame[4:], used)
    assert (header.correlation_id, used + used_body) == (77, len(frame) - 4)
    (topic,) = body.responses
    got = [(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, p.aborted_transactions, getattr(p, "preferred_read_replica", -1), bytes(p.records or b"")) for p in topic.partitions]
    assert got == [
        (0, ErrorCode.none, 12, 12, (), -1, b""),
        (7, ErrorCode.offset_out_of_range, 9, 9, (), -1, b""),
        (2, ErrorCode.none, 40, 40, (), -1, records),
    ]
    if version >= 5:
        assert [p.log_start_offset for p in topic.partitions] == [3, 0, 0]


@pytest.mark.parametrize("version", [4, 11, 12, 13, 17])
def test_large_records_are_pieces_of_their_own(version):
    """Records of LARGE_FIELD_BYTES or more go to the socket as the objects the handler gave, not
    copies; the small fields between them are gathered."""
    records = [bytes([i]) * n for i, n in enumerate((100, codec.LARGE_FIELD_BYTES, 300_000, 0))]
    answer = FetchAnswer([(topic_key(version, "orders"), [(i, 0, 9, 9, 0, rec) for i, rec in enumerate(records)])])
    pieces = codec.encode_response(1, version, 5, answer)
    assert b"".join(pieces) == kio_frame(version, 5, answer.entity(version))
    assert [p is records[1] or p is records[2] for p in pieces] == [False, True, False, True, False]
    assert struct.unpack_from(">ii", pieces[0]) == (sum(map(len, pieces)) - 4, 5)


def test_ten_thousand_partitions_in_one_frame():
    """The answer to a consumer of 10,000 partitions without a fetch session: the partitions are
    joined into one piece, not written one by one."""
    tid = uuid.uuid4()
    partitions = [(p, 0, 1000 + p, 1000 + p, 0, b"") for p in range(10_000)]
    answer = FetchAnswer([(tid, partitions)])
    pieces = codec.encode_response(1, 15, 3, answer)
    # the head (length, header, throttle, error, session, topic count, topic id, partition count)
    assert [len(p) for p in pieces] == [4 + 4 + 1 + 4 + 2 + 4 + 1 + 16 + 2, 10_000 * 37 + 1, 1]  # a partition: 37 bytes; the topic's tagged fields; the response's
    assert b"".join(pieces) == kio_frame(15, 3, answer.entity(15))

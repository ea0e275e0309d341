"""One-partition ProduceResponses (the Produce handler's OnePartitionProduce) are written from kio's
encoding of their shape with the offsets filled in: every byte must equal kio's own encoding of
the same response, in every version, for any offsets, topic, partition and error."""

from __future__ import annotations

import datetime
import io
import struct
import uuid

import pytest
from kio.schema.errors import ErrorCode

from broker import codec
from broker.codec import OnePartitionProduce, build, response_module

VERSIONS = range(3, 12)  # what the Produce handler serves


def kio_response(version: int, parts: list[tuple[int, ErrorCode, int, int, str | None]], topic: str = "orders"):
    """The response as kio's entities, built field by field (not through OnePartitionProduce)."""
    r = response_module(0, version)
    partition_responses = tuple(
        build(r.PartitionProduceResponse, index=index, error_code=code, base_offset=base, log_append_time=None, log_start_offset=start, record_errors=(), error_message=message)
        for index, code, base, start, message in parts
    )
    topics = (build(r.TopicProduceResponse, name=topic, partition_responses=partition_responses),)
    return build(r.ProduceResponse, responses=topics, throttle_time=datetime.timedelta(0))


def encode_response(api_key: int, version: int, correlation_id: int, body) -> bytes:
    return b"".join(codec.encode_response(api_key, version, correlation_id, body))


def kio_frame(api_key: int, version: int, correlation_id: int, body) -> bytes:
    """kio's own encoding of the whole frame, into a plain BytesIO."""
    write_header, write_body, header_cls, _ = codec.response_codec(api_key, version)
    out = io.BytesIO()
    write_header(out, header_cls(correlation_id=correlation_id))
    write_body(out, body)
    return struct.pack(">i", len(out.getvalue())) + out.getvalue()


def template_of(version: int, answer: OnePartitionProduce):
    return codec._templates[(version, answer.name, answer.error_code, answer.error_message)]


@pytest.mark.parametrize("version", VERSIONS)
def test_one_partition_answers_are_byte_for_byte_kios(version):
    cases = [
        (7, (0, ErrorCode.none, 0, 0, None), "orders"),
        (8, (0, ErrorCode.none, 12_345, 17, None), "orders"),  # the same shape, other offsets
        (2**31 - 1, (9_999, ErrorCode.none, 2**62, 2**40, None), "orders"),
        (-5, (3, ErrorCode.none, 0x0102030405060708, 0x1112131415161718, None), "orders"),  # offsets equal to the sentinels
        (11, (1, ErrorCode.kafka_storage_error, -1, -1, "the object store did not answer"), "orders"),
        (12, (1, ErrorCode.out_of_order_sequence_number, -1, -1, "gap"), "a-topic.with_other-name"),
        (13, (2, ErrorCode.none, 5, 0, None), "\x01\x02\x03\x04\x05\x06\x07\x08"),  # a name holding sentinel bytes
        (14, (0x21222324, ErrorCode.none, 6, 0, None), "orders"),  # a partition equal to the sentinel
        (15, (4, ErrorCode.none, 0x21222324, 0, None), "orders"),  # the index sentinel's bytes in an offset
        (16, (5, ErrorCode.none, 9, 0, None), '!"#$'),  # and in the name
    ]
    for correlation_id, (index, code, base, start, message), topic in cases:
        answer = OnePartitionProduce(topic, index, code, base, start, message)
        kio = kio_frame(0, version, correlation_id, kio_response(version, [(index, code, base, start, message)], topic))
        assert encode_response(0, version, correlation_id, answer) == kio, (version, answer)
        # names holding a sentinel's bytes make the sentinel ambiguous: kio encodes those answers
        ambiguous = "\x01" in topic or "!" in topic
        assert (template_of(version, answer) is None) is ambiguous, "the template was not used" if not ambiguous else "an ambiguous template"


def test_one_template_serves_every_partition_of_a_topic():
    codec._templates.clear()
    for index in range(1000):
        frame = encode_response(0, 9, index, OnePartitionProduce("orders", index, ErrorCode.none, 10 * index, 0, None))
        assert frame == kio_frame(0, 9, index, kio_response(9, [(index, ErrorCode.none, 10 * index, 0, None)]))
    assert list(codec._templates) == [(9, "orders", ErrorCode.none, None)]


@pytest.mark.parametrize("version", [3, 9, 11])
def test_several_partitions_are_encoded_by_kio(version):
    body = kio_response(version, [(0, ErrorCode.none, 10, 0, None), (1, ErrorCode.none, 20, 0, None)])
    frame = encode_response(0, version, 1, body)
    assert frame == kio_frame(0, version, 1, body)
    decoded = decode_response(version, frame)
    assert [(p.index, p.base_offset) for p in decoded.responses[0].partition_responses] == [(0, 10), (1, 20)]


def test_a_shape_whose_sentinels_are_ambiguous_is_never_templated():
    # the base-offset sentinel's bytes inside the topic name: found twice, so no template
    name = (0x0102030405060708).to_bytes(8, "big").decode("latin-1")
    answer = OnePartitionProduce(name, 0, ErrorCode.none, 1, 0, None)
    kio = kio_frame(0, 9, 1, kio_response(9, [(0, ErrorCode.none, 1, 0, None)], topic=name))
    assert encode_response(0, 9, 1, answer) == kio
    assert template_of(9, answer) is None
    assert encode_response(0, 9, 2, OnePartitionProduce(name, 0, ErrorCode.none, 7, 0, None)) == kio_frame(
        0, 9, 2, kio_response(9, [(0, ErrorCode.none, 7, 0, None)], topic=name)
    )


def decode_response(version: int, frame: bytes):
    """A ProduceResponse frame (length prefix included) as kio's entities."""
    from kio.serial import entity_reader

    cls = codec.response_codec(0, version)[3]
    body_frame = frame[4:]
    header, used = entity_reader(cls.__header_schema__)(body_frame, 0)
    body, used_body = entity_reader(cls)(body_frame, used)
    assert (header.correlation_id, used + used_body) == (1, len(body_frame))
    return body


@pytest.mark.parametrize("version", [4, 11, 12, 13, 17])
def test_a_fetch_response_sends_its_large_records_as_they_are(version):
    """Records of LARGE_FIELD_BYTES or more are pieces of their own, the very objects the handler
    gave, not copies; small fields are gathered; the pieces joined are kio's frame."""
    r = response_module(1, version)
    records = [bytes([i]) * n for i, n in enumerate((100, codec.LARGE_FIELD_BYTES, 300_000, 0))]
    parts = tuple(
        build(r.PartitionData, partition_index=i, error_code=ErrorCode.none, high_watermark=9, last_stable_offset=9, log_start_offset=0,
              aborted_transactions=(), preferred_read_replica=-1, records=rec)
        for i, rec in enumerate(records)
    )  # fmt: skip
    key = {"topic": "orders"} if version < 13 else {"topic_id": uuid.uuid4()}
    body = build(r.FetchResponse, throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=0, responses=(build(r.FetchableTopicResponse, partitions=parts, **key),))
    pieces = codec.encode_response(1, version, 5, body)
    assert b"".join(pieces) == kio_frame(1, version, 5, body)
    assert [p is records[1] or p is records[2] for p in pieces] == [False, True, False, True, False]
    assert struct.unpack_from(">ii", pieces[0]) == (sum(map(len, pieces)) - 4, 5)

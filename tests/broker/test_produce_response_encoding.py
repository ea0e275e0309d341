"""One-partition ProduceResponses are written from kio's encoding of their shape with the offsets
filled in: every byte must equal kio's own encoding of the same response, in every version, for
any offsets, topic, partition and error; anything else is encoded by kio as before."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.errors import ErrorCode

from broker import codec
from broker.codec import build, encode_response, response_module

VERSIONS = range(3, 12)  # what the Produce handler serves


def response(version: int, parts: list[tuple[int, ErrorCode, int, int, str | None]], topic: str = "orders", throttle_ms: int = 0):
    r = response_module(0, version)
    partition_responses = tuple(
        build(r.PartitionProduceResponse, index=index, error_code=code, base_offset=base, log_append_time=None, log_start_offset=start, record_errors=(), error_message=message)
        for index, code, base, start, message in parts
    )
    topics = (build(r.TopicProduceResponse, name=topic, partition_responses=partition_responses),)
    return build(r.ProduceResponse, responses=topics, throttle_time=datetime.timedelta(milliseconds=throttle_ms))


@pytest.mark.parametrize("version", VERSIONS)
def test_one_partition_answers_are_byte_for_byte_kios(version):
    cases = [
        (7, [(0, ErrorCode.none, 0, 0, None)], "orders", 0),
        (8, [(0, ErrorCode.none, 12_345, 17, None)], "orders", 0),  # the same shape, other offsets
        (2**31 - 1, [(9_999, ErrorCode.none, 2**62, 2**40, None)], "orders", 0),
        (-5, [(3, ErrorCode.none, 0x0102030405060708, 0x1112131415161718, None)], "orders", 0),  # offsets equal to the sentinels
        (11, [(1, ErrorCode.kafka_storage_error, -1, -1, "the object store did not answer")], "orders", 0),
        (12, [(1, ErrorCode.out_of_order_sequence_number, -1, -1, "gap")], "a-topic.with_other-name", 250),
        (13, [(2, ErrorCode.none, 5, 0, None)], "\x01\x02\x03\x04\x05\x06\x07\x08", 0),  # a name holding sentinel bytes
    ]
    for correlation_id, parts, topic, throttle_ms in cases:
        body = response(version, parts, topic, throttle_ms)
        kio = codec._encode(0, version, correlation_id, body)
        assert encode_response(0, version, correlation_id, body) == kio, (version, parts, topic)
        if "\x01" not in topic:  # (that name holds a sentinel's bytes: kio encodes it, below)
            assert codec._encode_one_partition_produce(version, correlation_id, body) == kio, "the template was not used"


@pytest.mark.parametrize("version", [3, 9, 11])
def test_several_partitions_are_encoded_by_kio(version):
    body = response(version, [(0, ErrorCode.none, 10, 0, None), (1, ErrorCode.none, 20, 0, None)])
    assert codec._encode_one_partition_produce(version, 1, body) is None
    assert encode_response(0, version, 1, body) == codec._encode(0, version, 1, body)


def test_a_shape_whose_sentinels_are_ambiguous_is_never_templated():
    # the base-offset sentinel's bytes inside the topic name: found twice, so no template
    name = (0x0102030405060708).to_bytes(8, "big").decode("latin-1")
    body = response(9, [(0, ErrorCode.none, 1, 0, None)], topic=name)
    assert codec._encode_one_partition_produce(9, 1, body) is None
    assert encode_response(0, 9, 1, body) == codec._encode(0, 9, 1, body)

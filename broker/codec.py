"""Glue between Kafka frames and kio's typed entities: header peeking, request decoding and
response encoding, with readers/writers built once per (API, version)."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import struct
from dataclasses import dataclass
from typing import Any

from kio.index import load_payload_module, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id: common to every header
_SIZE = struct.Struct(">i")  # a frame's length prefix


class MalformedRequest(Exception):
    """The bytes are not a request we can decode: the connection is closed."""


def peek_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    if len(frame) < _HEAD.size:
        raise MalformedRequest(f"frame of {len(frame)} bytes has no request header")
    return _HEAD.unpack_from(frame, 0)


@functools.cache
def request_codec(api_key: int, version: int):
    """(header reader, body reader, request class) for one API version."""
    cls = load_request_schema(api_key, version)
    return entity_reader(cls.__header_schema__), entity_reader(cls), cls


@functools.cache
def response_codec(api_key: int, version: int):
    cls = load_response_schema(api_key, version)
    header_cls = cls.__header_schema__
    return entity_writer(header_cls), entity_writer(cls), header_cls, cls


@functools.cache
def response_module(api_key: int, version: int):
    """The kio module of one API version's response entities (handlers build from it)."""
    return load_payload_module(api_key, version, EntityType.response)


def decode_request(frame: bytes | memoryview, api_key: int, version: int) -> tuple[Any, Any]:
    """(header, body) of a request frame; raises MalformedRequest."""
    read_header, read_body, _ = request_codec(api_key, version)
    try:
        header, used = read_header(frame, 0)
        body, used_body = read_body(frame, used)
    except Exception as e:  # kio raises several types for truncated or garbled input
        raise MalformedRequest(f"cannot decode api {api_key} v{version}: {e!r}") from e
    # Trailing bytes are tolerated, as Kafka's brokers do: librdkafka's Metadata v12 for all topics
    # carries three (a field of older versions it still writes).
    return header, body


def encode_response(api_key: int, version: int, correlation_id: int, body: Any) -> list[bytes | bytearray]:
    """A whole response frame, length prefix included, as the pieces to write in order (see
    `FramePieces`)."""
    if type(body) is OnePartitionProduce:
        return _encode_one_partition_produce(version, correlation_id, body)
    if isinstance(body, OwnFrame):
        return body.frame(version, correlation_id)
    return _encode(api_key, version, correlation_id, body)


class OwnFrame:
    """A response a handler answers with instead of kio's entities, that writes its own frame
    (broker/fetch_response.py): for responses whose entities cost too much to build and encode."""

    __slots__ = ()

    def frame(self, version: int, correlation_id: int) -> list[bytes | bytearray]:
        """The whole frame, length prefix included, as the pieces to write in order (FramePieces)."""
        raise NotImplementedError


def _encode(api_key: int, version: int, correlation_id: int, body: Any) -> list[bytes | bytearray]:
    write_header, write_body, header_cls, _ = response_codec(api_key, version)
    frame = FramePieces()
    write_header(frame, header_cls(correlation_id=correlation_id))
    write_body(frame, body)
    return frame.pieces()


LARGE_FIELD_BYTES = 16 * 1024


class FramePieces:
    """The stream kio writes a response into. Its small writes are gathered into pieces, and a
    field of LARGE_FIELD_BYTES or more (a Fetch response's record batches) becomes a piece of
    its own, the caller's object itself: the records go to the socket without being copied
    into the frame first. (Writing a 1 MB Fetch response through a BytesIO and out of it as
    bytes took 0.17-0.47 ms; as pieces, 0.08.) A response without such a field is one piece.
    The pieces must not be changed once written, which holds for everything kio is given."""

    __slots__ = ("_pieces", "_small", "_size")

    def __init__(self) -> None:
        self._pieces: list[bytes | bytearray] = []
        self._small = bytearray(4)  # the frame's length prefix, filled in by `pieces`
        self._size = 0

    def write(self, data: bytes) -> int:
        n = len(data)
        if n >= LARGE_FIELD_BYTES:
            self._pieces.append(self._small)
            self._pieces.append(data)
            self._small = bytearray()
        else:
            self._small += data
        self._size += n
        return n

    def pieces(self) -> list[bytes | bytearray]:
        """The frame, length prefix first."""
        pieces = self._pieces
        if self._small:
            pieces.append(self._small)
        _SIZE.pack_into(pieces[0], 0, self._size)
        return pieces


# -- one-partition ProduceResponses, from kio's own encoding ------------------------------------
# librdkafka sends one partition per ProduceRequest, so a producer writing to many partitions
# has thousands of them answered a second. Building kio's three entities for each took about 4 µs
# and encoding them 10. The Produce handler answers such a request with a OnePartitionProduce, the
# values that vary; answers that differ only in their partition and offsets (and correlation id)
# have the same bytes elsewhere, so kio encodes one per shape (topic, error) with a sentinel
# partition and offsets, the sentinels' positions are found in its bytes, and each answer is that
# frame with its own partition and offsets written in. A shape whose sentinels are not found
# exactly once is encoded by kio every time.

PRODUCE = 0
NO_THROTTLE = datetime.timedelta(0)
_SENTINELS = (0x0102030405060708, 0x1112131415161718)  # base offset, log start offset
_INDEX_SENTINEL = 0x21222324  # partition index (int32)
_MAX_TEMPLATES = 65_536
_templates: dict[tuple, tuple[bytes, int, int, int] | None] = {}


@dataclass(slots=True)
class OnePartitionProduce:
    """A ProduceResponse for one partition of one topic, without throttling, record errors or a
    log append time (what neve's Produce answers)."""

    name: str
    index: int
    error_code: ErrorCode
    base_offset: int
    log_start_offset: int
    error_message: str | None

    def entity(self, version: int, base_offset: int | None = None, log_start_offset: int | None = None, index: int | None = None) -> Any:
        """The same answer as kio's ProduceResponse of `version` (partition and offsets replaced
        when given)."""
        r = response_module(PRODUCE, version)
        part = build(
            r.PartitionProduceResponse,
            index=self.index if index is None else index,
            error_code=self.error_code,
            base_offset=self.base_offset if base_offset is None else base_offset,
            log_append_time=None,
            log_start_offset=self.log_start_offset if log_start_offset is None else log_start_offset,
            record_errors=(),
            error_message=self.error_message,
        )
        topic = build(r.TopicProduceResponse, name=self.name, partition_responses=(part,))
        return build(r.ProduceResponse, responses=(topic,), throttle_time=NO_THROTTLE)


def _encode_one_partition_produce(version: int, correlation_id: int, answer: OnePartitionProduce) -> list[bytes | bytearray]:
    key = (version, answer.name, answer.error_code, answer.error_message)
    template = _templates.get(key, False)
    if template is False:
        template = _templates[key] = _produce_template(version, answer)
        if len(_templates) > _MAX_TEMPLATES:
            _templates.clear()
    if template is None:
        return _encode(PRODUCE, version, correlation_id, answer.entity(version))
    frame, index_at, base_at, start_at = template
    out = bytearray(frame)
    struct.pack_into(">i", out, 4, correlation_id)
    struct.pack_into(">i", out, index_at, answer.index)
    struct.pack_into(">q", out, base_at, answer.base_offset)
    if start_at >= 0:
        struct.pack_into(">q", out, start_at, answer.log_start_offset)
    return [out]


def _produce_template(version: int, answer: OnePartitionProduce) -> tuple[bytes, int, int, int] | None:
    """(frame, where the partition index is, where the base offset is, where the log start offset
    is or -1), or None if the sentinels are ambiguous in this shape's frame."""
    base, start = _SENTINELS
    shaped = answer.entity(version, base_offset=base, log_start_offset=start, index=_INDEX_SENTINEL)
    has_log_start = has_field(shaped.responses[0].partition_responses[0], "log_start_offset")
    frame = b"".join(_encode(PRODUCE, version, 0, shaped))
    patterns = [_INDEX_SENTINEL.to_bytes(4, "big"), base.to_bytes(8, "big")] + ([start.to_bytes(8, "big")] if has_log_start else [])
    positions = []
    for pattern in patterns:
        if frame.count(pattern) != 1:
            return None
        positions.append(frame.index(pattern))
    return frame, positions[0], positions[1], positions[2] if has_log_start else -1


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def build(cls: type, **values: Any) -> Any:
    """Instantiate a kio entity from the values its version has, ignoring the others, so one
    handler can serve every version of an API (fields come and go between versions)."""
    names = _field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


def has_field(cls_or_obj: Any, name: str) -> bool:
    return name in _field_names(cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj))


_ERRORS = {int(e): e for e in ErrorCode}


def error(code: int) -> ErrorCode:
    return _ERRORS.get(code, ErrorCode.unknown_server_error)

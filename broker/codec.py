"""Glue between Kafka frames and kio's typed entities: header peeking, request decoding and
response encoding, with readers/writers built once per (API, version)."""

from __future__ import annotations

import dataclasses
import functools
import io
import struct
from typing import Any

from kio.index import load_payload_module, load_request_schema, load_response_schema
from kio.static.constants import EntityType
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id: common to every header


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


def encode_response(api_key: int, version: int, correlation_id: int, body: Any) -> bytes:
    """A whole response frame, length prefix included."""
    write_header, write_body, header_cls, _ = response_codec(api_key, version)
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    write_header(buffer, header_cls(correlation_id=correlation_id))
    write_body(buffer, body)
    frame = buffer.getbuffer()
    struct.pack_into(">i", frame, 0, len(frame) - 4)
    out = bytes(frame)
    frame.release()
    return out


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

"""Confluent's wire framing of a schema-registry value: a zero magic byte, the schema id as a 4-byte
big-endian int, then the encoded value. The serializers write it; the compactor's resolver reads it."""

from __future__ import annotations

import struct

MAGIC = 0
HEADER = struct.Struct(">bI")
HEADER_SIZE = HEADER.size  # 5


class NotFramed(ValueError):
    """The value does not start with Confluent's framing (empty, too short, or another magic byte)."""


def frame(schema_id: int, payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, schema_id) + payload


def unframe(value: bytes | memoryview) -> tuple[int, memoryview]:
    """(schema id, the encoded value after the header). Raises NotFramed."""
    if len(value) < HEADER_SIZE:
        raise NotFramed(f"{len(value)} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic, schema_id = HEADER.unpack_from(value)
    if magic != MAGIC:
        raise NotFramed(f"magic byte {magic & 0xFF}, not {MAGIC}")
    return schema_id, memoryview(value)[HEADER_SIZE:]

"""Reading the topics out of a "consumer" protocol subscription (ConsumerProtocolSubscription:
int16 version, then an array of int16-length topic names; later versions only append fields).
Only OffsetDelete needs it, to keep the offsets of topics a live member still consumes."""

from __future__ import annotations

import struct

from .group import Group


def topics_of(metadata: bytes) -> list[str]:
    """The subscribed topics; [] when the bytes are not a consumer subscription."""
    try:
        (_version, count), pos = struct.unpack_from(">hi", metadata, 0), 6
        topics = []
        for _ in range(max(count, 0)):
            (size,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            topics.append(metadata[pos : pos + size].decode())
            pos += size
        return topics
    except (struct.error, UnicodeDecodeError):
        return []


def subscribed_topics(group: Group) -> set[str]:
    if group.protocol_type != "consumer" or group.is_empty:
        return set()
    return {t for m in group.members.values() for t in topics_of(m.metadata_for(group.protocol_name))}

"""Topic administration shared by CreateTopics and Metadata auto-creation: name rules and the
Kafka error each failure maps to."""

from __future__ import annotations

import re

from metadata.store import MetadataError

_LEGAL = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")

INVALID_TOPIC_EXCEPTION = 17
INVALID_PARTITIONS = 37


def topic_name_error(name: str | None) -> str | None:
    if not name or not _LEGAL.match(name) or name in (".", ".."):
        return f"topic name {name!r} is illegal: 1-249 of [a-zA-Z0-9._-], not '.' or '..'"
    return None


async def create_topic_checked(services, name, partitions: int, configs: dict[str, str]):
    """(error code, TopicInfo | None)."""
    if topic_name_error(name):
        return INVALID_TOPIC_EXCEPTION, None
    if partitions <= 0 or partitions > 100_000:
        return INVALID_PARTITIONS, None
    try:
        return 0, await services.metadata.create_topic(name, partitions, configs)
    except MetadataError as e:
        return e.error_code, None

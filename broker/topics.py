"""Topic administration shared by CreateTopics and Metadata auto-creation: name rules and the
Kafka error each failure maps to. A topic whose Iceberg table would have another live topic's
table name (`orders.eu` beside `orders_eu`, or a `neve.iceberg.table` naming it) is refused, as
Kafka refuses `a.b` beside `a_b`: a table belongs to one topic (table/names.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from kio.schema.errors import ErrorCode

from metadata.store import MetadataError
from table import names

_LEGAL = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def topic_name_error(name: str | None) -> str | None:
    if not name or not _LEGAL.match(name) or name in (".", ".."):
        return f"topic name {name!r} is illegal: 1-249 of [a-zA-Z0-9._-], not '.' or '..'"
    return None


def table_refusal(name: str, configs: Mapping[str, str], topics: Mapping) -> tuple[int, str] | None:
    """(error code, message) when topic `name` with `configs` would share its Iceberg table with
    another topic of `topics` (name -> TopicInfo, or anything with `configs`): INVALID_CONFIG when
    its `neve.iceberg.table` names that table, INVALID_TOPIC_EXCEPTION when its own name does."""
    other = names.table_collision(name, configs, (names.Topic(n, t.configs) for n, t in topics.items()))
    if other is None:
        return None
    code = ErrorCode.invalid_config if configs.get(names.TABLE_CONFIG, "").strip() else ErrorCode.invalid_topic_exception
    return code, names.collision_message(name, configs, other)


async def create_topic_checked(services, name, partitions: int, configs: dict[str, str]):
    """(error code, message or None, TopicInfo | None)."""
    if (message := topic_name_error(name)) is not None:
        return ErrorCode.invalid_topic_exception, message, None
    if partitions <= 0 or partitions > 100_000:
        return ErrorCode.invalid_partitions, f"num_partitions {partitions} must be between 1 and 100000", None
    if (refusal := table_refusal(name, configs, services.metadata.topics())) is not None:
        return *refusal, None
    try:
        return 0, None, await services.metadata.create_topic(name, partitions, configs)
    except MetadataError as e:
        return e.error_code, str(e) or None, None

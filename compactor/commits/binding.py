"""A table belongs to one topic, by topic id: the table property `neve.topic-id` names it. Every
step that writes a table or reads its rows into a topic's index (a cycle's commit, the merge,
retention, the re-index, a purge) first checks it, and a table bound to another topic is refused
with TableNotBound, never written: two topics' rows can never meet in one table, nor a deleted
topic's rows reach the topic made again under its name.
"""

from __future__ import annotations

import uuid

TOPIC_PROPERTY = "neve.topic-id"


class TableNotBound(RuntimeError):
    """The table is not bound to this topic: nothing of it may be written or indexed for it."""


def bound_topic(table) -> str | None:
    """The topic id `table` is bound to, None when it is not bound (an older neve made it)."""
    return table.properties.get(TOPIC_PROPERTY) or None


def require(table, topic_id: uuid.UUID | str, topic: str = "") -> None:
    """Raise TableNotBound unless `table` is bound to `topic_id`."""
    bound = bound_topic(table)
    if bound != str(topic_id):
        whose = "to no topic" if bound is None else f"to topic id {bound}"
        raise TableNotBound(f"table {'.'.join(table.name())} is bound {whose}, not to topic {topic or ''} ({topic_id}): it is neither written nor indexed for this topic")

"""Consumer groups' committed offsets: once acknowledged, a group's offset of a key never goes back
(offsets-backwards)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from .anomaly import Anomaly
from .model import Event, Model, micro_ops


def _committed(event: Event) -> list[dict]:
    """The {"group", "offsets"} values an ok op acknowledged or read: a commit's (its completion's,
    else its invoke's), an offsets read's, and an ok txn's "offsets" micro-ops."""
    if not event.ok:
        return []
    if event.f == "commit":
        value = event.value if isinstance(event.value, dict) else event.invoke_value
        return [value] if isinstance(value, dict) else []
    if event.f == "offsets":
        return [event.value] if isinstance(event.value, dict) else []
    if event.txn:
        return [m[1] for m in micro_ops(event.value) if m[0] == "offsets" and len(m) > 1 and isinstance(m[1], dict)]
    return []


def offsets_backwards(model: Model) -> Iterator[Anomaly]:
    """Per (group, key), an ok commit or offsets read lower than one that completed before it was
    invoked. History order refined to real-time order: two ops that overlap may linearize either
    way, so only one wholly before the other is compared."""
    # (group, key) -> completion indexes in order, and the highest (offset, event) up to each
    done: dict[tuple[Any, str], tuple[list[int], list[tuple[int, Event]]]] = {}
    for event in model.events:
        for value in _committed(event):
            group, offsets = value.get("group"), value.get("offsets")
            if not isinstance(offsets, dict):
                continue
            for key, offset in offsets.items():
                if offset is None or offset < 0:
                    continue  # no committed offset yet
                indexes, highest = done.setdefault((group, key), ([], []))
                before = bisect_left(indexes, event.invoke)
                if before and highest[before - 1][0] > offset:
                    top, by = highest[before - 1]
                    yield Anomaly(
                        "offsets-backwards",
                        f"group {group} {key}: op {event.index} ({event.f}) has offset {offset}, below {top} acknowledged by op {by.index}",
                        [by.index, event.index],
                        {"group": group, "key": key, "offset": offset, "previous": top},
                    )
                indexes.append(event.index)
                highest.append(max(highest[-1], (offset, event), key=lambda h: h[0]) if highest else (offset, event))

"""The log's own anomalies: records lost, duplicated, moved or invented (lost-write, duplicate,
inconsistent-offsets, unexpected-value)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .anomaly import Anomaly, unique
from .model import Event, Model


def unexpected_value(model: Model) -> Iterator[Anomaly]:
    """A value read (by a poll, a final read or a table read) that no op ever sent."""
    reads: dict[int, list] = {}
    for r in model.reads:
        if r.value is not None and r.value not in model.writer:
            reads.setdefault(r.value, []).append(r)
    for value, found in reads.items():
        first = found[0]
        yield Anomaly(
            "unexpected-value",
            f"{value} read at {first.key}@{first.offset} by op {first.event.index} ({first.source}) was never sent",
            unique(r.event.index for r in found),
            {"value": value, "key": first.key, "offset": first.offset, "reads": len(found)},
        )


def duplicate(model: Model) -> Iterator[Anomaly]:
    """One value at two positions (key, offset), across the acks and the Kafka reads. Tombstones are
    left out: their null value is not unique."""
    at: dict[int, dict[tuple[str, int], Event]] = {}
    for key, offsets in model.positions.items():
        for offset, vids in offsets.items():
            for value, event in vids.items():
                if not isinstance(value, tuple):
                    at.setdefault(value, {})[(key, offset)] = event
    for value, places in at.items():
        if len(places) > 1:
            where = sorted(places)
            text = ", ".join(f"{k}@{o}" for k, o in where)
            yield Anomaly("duplicate", f"{value} is at {len(where)} offsets: {text}", unique(places[p].index for p in where), {"value": value, "at": [list(p) for p in where]})


def inconsistent_offsets(model: Model) -> Iterator[Anomaly]:
    """Two different values at one (key, offset)."""
    for key, offsets in model.positions.items():
        for offset, vids in offsets.items():
            if len(vids) > 1:
                values = [_show(v) for v in vids]
                yield Anomaly("inconsistent-offsets", f"{key}@{offset} holds {len(values)} values: {', '.join(map(str, values))}", unique(e.index for e in vids.values()), {"key": key, "offset": offset, "values": values})


def lost_write(model: Model) -> Iterator[Anomaly]:
    """An acknowledged send (an ok send, or a send of an ok txn) at (key, offset) that is lost:
    - no poll or final read ever returned its value, though a read of that key returned a higher
      offset (Jepsen's rule); or
    - a complete final read, which reads the key from offset 0 after the heal, lacks it although it
      reached past its offset: read once, gone since (the copy that served it is not the one kept).
    Compacted topics are left out: compaction removes records legitimately (compacted-stale judges them)."""
    read_values = {r.value for r in model.reads if r.source != "table-read"}
    highest: dict[str, tuple[int, Event]] = {}
    final: dict[str, list[tuple[Event, set[int], int]]] = {}  # key -> (final read, its values, highest offset) of each
    for r in model.reads:
        if r.source != "table-read" and (r.key not in highest or r.offset > highest[r.key][0]):
            highest[r.key] = (r.offset, r.event)
    for event in model.events:
        if event.f == "final-read" and event.ok and event.polls:
            for key, reads in event.polls[0].items():
                if reads:
                    final.setdefault(key, []).append((event, {r.value for r in reads}, max(r.offset for r in reads)))
    for s in model.sends:
        if s.value is None or s.offset is None or not model.acked(s) or model.compacted(s.key) or model.writer[s.value] is not s:
            continue
        if s.value not in read_values:
            top = highest.get(s.key)
            if top is not None and top[0] > s.offset:
                yield Anomaly(
                    "lost-write",
                    f"{s.value} acknowledged at {s.key}@{s.offset} by op {s.event.index} was never read, though op {top[1].index} read {s.key} up to {top[0]}",
                    [s.event.index, top[1].index],
                    {"key": s.key, "offset": s.offset, "value": s.value, "highest_read": top[0]},
                )
            continue
        for event, values, top in final.get(s.key, ()):
            if s.value not in values and top > s.offset:
                yield Anomaly(
                    "lost-write",
                    f"{s.value} acknowledged at {s.key}@{s.offset} by op {s.event.index} and read since is missing from final read {event.index}, which read {s.key} from 0 to {top}",
                    [s.event.index, event.index],
                    {"key": s.key, "offset": s.offset, "value": s.value, "final_read": event.index, "highest_read": top},
                )
                break


def _show(value: Any) -> Any:
    return f"tombstone({value[1]})" if isinstance(value, tuple) else value

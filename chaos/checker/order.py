"""Order as each client saw it: a producer's offsets must rise (int- and ext-nonmonotonic-send), a
consumer's polls must rise and must not pass over records it should have seen (int- and
ext-nonmonotonic-poll, poll-skip)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from .anomaly import Anomaly, unique
from .model import READ_COMMITTED, RESETS, Event, Model


def int_nonmonotonic_send(model: Model) -> Iterator[Anomaly]:
    """Within one op, a send to a key acknowledged at an offset not above the op's previous send to it."""
    for event in model.events:
        last: dict[str, int] = {}
        flagged = set()
        for s in event.sends:
            if s.offset is None:
                continue
            if s.key in last and s.offset <= last[s.key] and s.key not in flagged:
                flagged.add(s.key)
                yield Anomaly("int-nonmonotonic-send", f"op {event.index} sent to {s.key} at offset {s.offset} after offset {last[s.key]}", [event.index], {"key": s.key, "offset": s.offset, "previous": last[s.key]})
            last[s.key] = s.offset


def ext_nonmonotonic_send(model: Model) -> Iterator[Anomaly]:
    """A process's ok op sent to a key at an offset not above its previous ok op's last send to that key."""
    last: dict[tuple[Any, str], tuple[int, Event]] = {}
    for event in model.events:
        if not (event.ok and event.sends):
            continue
        first: dict[str, int] = {}
        for s in event.sends:
            if s.offset is not None:
                first.setdefault(s.key, s.offset)
        for key, offset in first.items():
            previous = last.get((event.process, key))
            if previous is not None and offset <= previous[0]:
                yield Anomaly(
                    "ext-nonmonotonic-send",
                    f"process {event.process} sent to {key} at offset {offset} (op {event.index}) after its op {previous[1].index} sent at {previous[0]}",
                    [previous[1].index, event.index],
                    {"key": key, "offset": offset, "previous": previous[0]},
                )
        for s in event.sends:
            if s.offset is not None:
                last[(event.process, s.key)] = (s.offset, event)


def polls(model: Model) -> Iterator[Anomaly]:
    """int-nonmonotonic-poll, ext-nonmonotonic-poll and poll-skip, in one walk of each process's
    polls (ok polls, and the polls of txns of any outcome: what they returned was read). An
    assign, subscribe, seek, rebalance, open or close of the process, or a poll or txn of it that
    did not complete ok (the client may have rewound), forgets where the process was."""
    where: dict[Any, dict[str, tuple[int, Event]]] = defaultdict(dict)
    for event in model.events:
        if event.f in RESETS:
            where.pop(event.process, None)
            continue
        if event.f not in ("poll", "txn") or not (event.polls or event.polled):
            continue
        position = where[event.process]
        read_committed = event.isolation == READ_COMMITTED
        for poll in event.polls:
            for key, records in poll.items():
                if not records:
                    continue
                offsets = [r.offset for r in records]
                bad = next((i for i in range(1, len(offsets)) if offsets[i] <= offsets[i - 1]), None)
                if bad is not None:
                    yield Anomaly("int-nonmonotonic-poll", f"op {event.index} polled {key} at offset {offsets[bad]} after {offsets[bad - 1]}", [event.index], {"key": key, "offset": offsets[bad], "previous": offsets[bad - 1]})
                previous = position.get(key)
                if previous is not None:
                    yield from _next_poll(model, event, key, offsets[0], previous, read_committed)
                position[key] = (offsets[-1], event)
        if not event.ok:
            where.pop(event.process, None)


def _next_poll(model: Model, event: Event, key: str, first: int, previous: tuple[int, Event], read_committed: bool) -> Iterator[Anomaly]:
    last, before = previous
    if first <= last:
        yield Anomaly(
            "ext-nonmonotonic-poll",
            f"process {event.process} polled {key} from offset {first} (op {event.index}) after its op {before.index} had polled up to {last}",
            unique([before.index, event.index]),
            {"key": key, "offset": first, "previous": last},
        )
        return
    if model.compacted(key):
        return  # compaction empties offsets legitimately
    skipped = model.visible_between(key, read_committed, last, first)
    if not skipped:
        return
    at = model.positions[key][skipped[0]]
    value = next(iter(at))
    writer = model.writer.get(value) if not isinstance(value, tuple) else None
    isolation = "read_committed" if read_committed else "read_uncommitted"
    yield Anomaly(
        "poll-skip",
        f"process {event.process} ({isolation}) polled {key} up to {last} (op {before.index}) then from {first} (op {event.index}), skipping {len(skipped)} offset(s) with records, first {skipped[0]} ({value})",
        unique([before.index, event.index, writer.event.index if writer else None]),
        {"key": key, "previous": last, "offset": first, "skipped": skipped[:20], "skipped_count": len(skipped), "isolation": isolation},
    )

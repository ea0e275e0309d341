"""The history indexed for the checks: each client op paired with its completion (an Event), every
send and every read of a record, the writer of each value, what was seen at each (key, offset), and
which of it a read_committed consumer may see."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from chaos.history import FAIL, INFO, NEMESIS, OK, pairs

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
# after any of these a consumer's next poll of a key may start anywhere
RESETS = frozenset({"assign", "subscribe", "seek", "rebalance", "open", "close"})
WRITERS = frozenset({"send", "txn"})
TOMBSTONE = "tombstone"
SEQUENCES = (list, tuple)


class Send:
    """One record a writer sent: `value` None is a tombstone, `offset` None a send not acknowledged with one."""

    __slots__ = ("key", "value", "offset", "record_key", "event", "vid")

    def __init__(self, key: str, value: int | None, offset: int | None, record_key: str | None, event: Event) -> None:
        self.key, self.value, self.offset, self.record_key, self.event = key, value, offset, record_key, event
        self.vid = vid(value, record_key)


class Read:
    """One record a reader returned; `source` is the reader's f: poll, txn, final-read or table-read."""

    __slots__ = ("key", "offset", "value", "record_key", "event", "source", "vid")

    def __init__(self, key: str, offset: int, value: int | None, record_key: str | None, event: Event) -> None:
        self.key, self.offset, self.value, self.record_key, self.event = key, offset, value, record_key, event
        self.source = event.f
        self.vid = value if value is not None else (TOMBSTONE, record_key)


@dataclass(eq=False, slots=True)
class Event:
    """A client op: its invoke and its completion as one. `index` is the completion's (the invoke's
    when the history ended first, and then `type` is info: it may or may not have happened)."""

    index: int
    invoke: int
    process: Any
    f: str
    type: str
    time: float
    value: Any  # the completion's value, or the invoke's when there is none
    invoke_value: Any
    commit_time: float | None = None
    sends: list[Send] = field(default_factory=list)
    polls: list[dict[str, list[Read]]] = field(default_factory=list)  # one per poll micro-op; final and table reads hold one
    polled: bool = False  # it asked for a poll, whatever came of it
    isolation: str = READ_UNCOMMITTED  # of the records it read

    @property
    def ok(self) -> bool:
        return self.type == OK

    @property
    def txn(self) -> bool:
        return self.f == "txn"

    def __repr__(self) -> str:
        return f"Event({self.index} {self.process} {self.type} {self.f})"


def vid(value: Any, record_key: str | None) -> Any:
    """What identifies a record's value: the unique int, or for a tombstone its record key."""
    return value if value is not None else (TOMBSTONE, record_key)


def topic_of(key: str) -> str:
    return key.rpartition("/")[0]


def micro_ops(value: Any) -> list:
    return [m for m in value if isinstance(m, SEQUENCES) and m] if isinstance(value, SEQUENCES) else []


def _sends(value: Any) -> list[tuple[str, Any, int | None, str | None]]:
    out = []
    for m in micro_ops(value):
        if m[0] != "send" or len(m) < 3:
            continue
        body, record_key = m[2], (m[3] if len(m) > 3 else None)
        if isinstance(body, SEQUENCES) and len(body) == 2:
            out.append((m[1], body[1], body[0], record_key))
        else:
            out.append((m[1], body, None, record_key))
    return out


def _records(event: Event, by_key: Any) -> dict[str, list[Read]]:
    reads: dict[str, list[Read]] = {}
    if not isinstance(by_key, dict):
        return reads
    for key, records in by_key.items():
        reads[key] = [Read(key, r[0], r[1], r[2] if len(r) > 2 else None, event) if len(r) > 2 else Read(key, r[0], r[1], None, event) for r in records or ()]
    return reads


def events(ops: list[dict]) -> list[Event]:
    """Every client op as an Event, in completion order."""
    isolation = {op["process"]: op["value"].get("isolation") for op in ops if op.get("f") == "open" and isinstance(op.get("value"), dict) and op["value"].get("isolation")}
    out = []
    for invoke, done in pairs(ops):
        if invoke.get("process") == NEMESIS:
            continue
        last = done if done is not None else invoke
        event = Event(
            index=last["index"],
            invoke=invoke["index"],
            process=invoke["process"],
            f=invoke["f"],
            type=done["type"] if done is not None else INFO,
            time=last.get("time", 0.0),
            value=last.get("value"),
            invoke_value=invoke.get("value"),
            commit_time=last.get("commit_time", invoke.get("commit_time")),
        )
        if event.f in WRITERS:
            asked = _sends(invoke.get("value")) if invoke is not done else []
            acked = _sends(done.get("value")) if done is not None else []
            if any(offset is not None for _, _, offset, _ in acked):
                # an ack names each send's offset; a send it leaves out (a failed txn's) still happened or may have
                seen = {v for _, v, _, _ in acked if v is not None}
                acked += [s for s in asked if s[1] is not None and s[1] not in seen]
            else:
                acked = asked or acked
            event.sends = [Send(key, v, offset, record_key, event) for key, v, offset, record_key in acked]
        if event.f in ("poll", "txn"):
            event.polled = event.f == "poll" or any(m[0] == "poll" for m in micro_ops(invoke.get("value")))
            if done is not None:
                event.polls = [_records(event, m[1]) for m in micro_ops(done.get("value")) if m[0] == "poll" and len(m) > 1 and isinstance(m[1], dict)]
            event.isolation = isolation.get(event.process) or READ_UNCOMMITTED
        elif event.f == "final-read" and event.ok and isinstance(event.value, dict):
            event.polls = [_records(event, event.value.get("records"))]
            event.isolation = event.value.get("isolation") or READ_UNCOMMITTED
        elif event.f == "table-read" and event.ok and isinstance(event.value, dict):
            event.polls = [_records(event, event.value.get("rows"))]
            event.isolation = READ_COMMITTED
        out.append(event)
    out.sort(key=lambda e: e.index)
    return out


class Model:
    """The indexes every check shares, built once."""

    def __init__(self, ops: list[dict]) -> None:
        if any("index" not in op for op in ops):
            ops = [op if "index" in op else {**op, "index": i} for i, op in enumerate(ops)]
        self.ops = ops
        self.events = events(ops)
        self.sends = [s for e in self.events for s in e.sends]
        self.reads = [r for e in self.events for poll in e.polls for records in poll.values() for r in records]
        self.writer: dict[int, Send] = {}  # value -> its (first) send
        for s in self.sends:
            if s.value is not None:
                self.writer.setdefault(s.value, s)
        self.compacted_topics = {topic_of(s.key) for s in self.sends if s.record_key is not None}
        self.compacted_topics |= {topic_of(r.key) for r in self.reads if r.record_key is not None}
        # what read_committed reads observed: evidence that a txn of unknown outcome committed
        self.rc_values = {r.value for r in self.reads if r.event.isolation == READ_COMMITTED and r.value is not None and r.source != "table-read"}
        self.rc_positions = {(r.key, r.offset) for r in self.reads if r.event.isolation == READ_COMMITTED and r.source != "table-read"}
        self._committed: dict[int, bool] = {}
        # (key, offset) -> {vid: first event that showed it}, from acks and the Kafka reads (the table is judged apart)
        self.positions: dict[str, dict[int, dict[Any, Event]]] = defaultdict(lambda: defaultdict(dict))
        for s in self.sends:
            if s.offset is not None:
                self.positions[s.key][s.offset].setdefault(s.vid, s.event)
        for r in self.reads:
            if r.source != "table-read":
                self.positions[r.key][r.offset].setdefault(r.vid, r.event)
        self.lowest: dict[tuple[str, int], int] = {}  # (key, value) -> its lowest offset seen in that key
        for key, offsets in self.positions.items():
            for offset, vids in offsets.items():
                for value in vids:
                    if not isinstance(value, tuple) and offset < self.lowest.get((key, value), offset + 1):
                        self.lowest[(key, value)] = offset
        self._visible: dict[tuple[str, bool], list[int]] = {}

    def compacted(self, key: str) -> bool:
        return topic_of(key) in self.compacted_topics

    def committed(self, event: Event) -> bool:
        """Whether a read_committed consumer may see this writer's records: a plain send's records
        always (once in the log), a txn's if it committed, or its outcome is unknown but a
        read_committed read saw one of its records."""
        if not event.txn:
            return True
        known = self._committed.get(event.index)
        if known is None:
            known = event.ok or (event.type != FAIL and any(s.value in self.rc_values if s.value is not None else (s.key, s.offset) in self.rc_positions for s in event.sends))
            self._committed[event.index] = known
        return known

    def visible_between(self, key: str, read_committed: bool, after: int, before: int) -> list[int]:
        """Offsets strictly between `after` and `before` holding a record this consumer should see:
        for read_committed, a committed one; for read_uncommitted, any but those of transactions
        known aborted, which leave the Kafka view once compaction takes their range (their
        records never become rows: docs/GAPS.md), so a reader may or may not see them."""
        cache_key = (key, read_committed)
        offsets = self._visible.get(cache_key)
        if offsets is None:
            at = self.positions.get(key, {})
            if read_committed:
                offsets = sorted(o for o, vids in at.items() if any(self._vid_committed(v) for v in vids))
            else:
                offsets = sorted(o for o, vids in at.items() if not all(self._vid_aborted(v) for v in vids))
            self._visible[cache_key] = offsets
        return offsets[bisect_right(offsets, after) : bisect_right(offsets, before - 1)]

    def _vid_aborted(self, value: Any) -> bool:
        """Whether the value was written by a transaction that definitely ended aborted (`fail`)."""
        if isinstance(value, tuple):
            return False
        send = self.writer.get(value)
        return send is not None and send.event.txn and send.event.type == FAIL

    def _vid_committed(self, value: Any) -> bool:
        if isinstance(value, tuple) or value in self.rc_values:
            return True
        send = self.writer.get(value)
        return send is not None and self.committed(send.event)

    def acked(self, send: Send) -> bool:
        return send.event.ok and send.event.f in WRITERS

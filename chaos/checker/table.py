"""The Iceberg tables against the Kafka view (the read_committed final read): rows missing, extra or
different (table-*), and for compacted topics each record key's latest value (compacted-stale) and
one row per record key (compacted-duplicate-key)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .anomaly import Anomaly
from .model import READ_COMMITTED, Event, Model, Read, topic_of


def _finals(model: Model) -> list[Event]:
    return [e for e in model.events if e.f == "final-read" and e.ok and e.isolation == READ_COMMITTED and e.polls]


def _tables(model: Model) -> list[Event]:
    return [e for e in model.events if e.f == "table-read" and e.ok and e.polls]


def kafka_view(model: Model) -> dict[str, dict[int, Read]]:
    """key -> offset -> record, merged over the read_committed final reads (the first read of an
    offset wins; reads that disagree are inconsistent-offsets already)."""
    view: dict[str, dict[int, Read]] = {}
    for final in _finals(model):
        for key, records in final.polls[0].items():
            at = view.setdefault(key, {})
            for r in records:
                at.setdefault(r.offset, r)
    return view


def table_rows(model: Model) -> Iterator[Anomaly]:
    """For each table read of a topic that is not compacted, each key the final read covered:
    table-missing, a Kafka-view record whose offset has no row (for an incomplete table read, only
    at offsets up to the table's highest of that key); table-extra, a row at an offset the Kafka view
    has no record at; table-differs, a row whose value is not the Kafka view's at its offset. One
    anomaly per (table read, key, class), naming the offsets."""
    view = kafka_view(model)
    for table in _tables(model):
        topic, complete = table.value.get("topic"), bool(table.value.get("complete"))
        if topic in model.compacted_topics:
            continue
        rows_by_key = table.polls[0]
        keys = {k for k in rows_by_key if k in view} | {k for k in view if topic_of(k) == topic}
        for key in sorted(keys):
            rows = {r.offset: r for r in rows_by_key.get(key, ())}
            kafka = view[key]
            high = max(rows, default=-1)
            missing = [o for o in sorted(kafka) if o not in rows and (complete or o <= high)]
            differs = [o for o in sorted(kafka) if o in rows and rows[o].value != kafka[o].value]
            extra = [o for o in sorted(rows) if o not in kafka]
            for cls, offsets, say in (("table-missing", missing, "has no row for"), ("table-extra", extra, "has rows the Kafka view lacks at"), ("table-differs", differs, "differs from the Kafka view at")):
                if not offsets:
                    continue
                first = offsets[0]
                shown = f"table {first}: {rows[first].value}, Kafka {kafka[first].value}" if cls == "table-differs" else f"value {(kafka.get(first) or rows.get(first)).value}"
                readers = [kafka[o].event.index for o in offsets[:1] if o in kafka]
                yield Anomaly(
                    cls,
                    f"table read {table.index} of {key} {say} {len(offsets)} offset(s), first {first} ({shown})",
                    [table.index, *readers],
                    {"key": key, "offsets": offsets[:100], "count": len(offsets), "complete": complete},
                )


def _record_key(model: Model, r: Read) -> str | None:
    if r.record_key is not None:
        return r.record_key
    send = model.writer.get(r.value) if r.value is not None else None
    return send.record_key if send is not None else None


def latest(model: Model) -> dict[tuple[str, str], tuple[int, Any, Event]]:
    """(key, record key) -> (offset, value, op) of its highest-offset record a read_committed view
    keeps: acknowledged or read sends whose writer committed (model.committed), and the
    read_committed final reads' records."""
    out: dict[tuple[str, str], tuple[int, Any, Event]] = {}

    def offer(key: str, record_key: str | None, offset: int, value: Any, event: Event) -> None:
        if record_key is None or not model.compacted(key):
            return
        known = out.get((key, record_key))
        if known is None or offset > known[0]:
            out[(key, record_key)] = (offset, value, event)

    for s in model.sends:
        if s.offset is not None and model.committed(s.event):
            offer(s.key, s.record_key, s.offset, s.value, s.event)
    for final in _finals(model):
        for key, records in final.polls[0].items():
            for r in records:
                offer(key, _record_key(model, r), r.offset, r.value, final)
    return out


def _states(model: Model, records: list[Read]) -> dict[str, tuple[int, Any]]:
    """record key -> (offset, value) of its highest record among `records`."""
    states: dict[str, tuple[int, Any]] = {}
    for r in records:
        record_key = _record_key(model, r)
        if record_key is not None and (record_key not in states or r.offset > states[record_key][0]):
            states[record_key] = (r.offset, r.value)
    return states


def compacted(model: Model) -> Iterator[Anomaly]:
    """For compacted topics, each record key's latest record (by offset; see `latest`) decides:
    in every read_committed final read, the record key's highest-offset record must hold that value
    (a latest tombstone: a tombstone or no record at all); in every table read, the record key's row
    must hold that value (a latest tombstone: no live row), judged once the table reached the
    latest record's offset (complete, or a row of that key at or above it): compacted-stale. A table
    read holding two rows of one record key in a topic: compacted-duplicate-key."""
    if not model.compacted_topics:
        return
    last = latest(model)
    by_key: dict[str, list[tuple[str, tuple[int, Any, Event]]]] = {}
    for (key, record_key), record in last.items():
        by_key.setdefault(key, []).append((record_key, record))
    for final in _finals(model):
        for key, records in final.polls[0].items():
            if not model.compacted(key):
                continue
            states = _states(model, records)
            for record_key, (offset, value, writer) in by_key.get(key, ()):
                seen = states.get(record_key, (None, None))
                if seen[1] != value:
                    yield _stale(final, key, record_key, seen, offset, value, writer, "final read")
    for table in _tables(model):
        topic, complete = table.value.get("topic"), bool(table.value.get("complete"))
        if topic not in model.compacted_topics:
            continue
        rows_of: dict[str, list[tuple[str, Read]]] = {}
        for key, rows in table.polls[0].items():
            for r in rows:
                record_key = _record_key(model, r)
                if record_key is not None:
                    rows_of.setdefault(record_key, []).append((key, r))
        for record_key, rows in rows_of.items():
            if len(rows) > 1:
                where = ", ".join(f"{k}@{r.offset}={r.value}" for k, r in rows[:5])
                yield Anomaly(
                    "compacted-duplicate-key",
                    f"table read {table.index} of {topic} holds {len(rows)} rows for record key {record_key!r}: {where}",
                    [table.index],
                    {"topic": topic, "record_key": record_key, "rows": [[k, r.offset, r.value] for k, r in rows][:20]},
                )
        for key in {k for k in by_key if topic_of(k) == topic}:
            rows = table.polls[0].get(key, [])
            high = max((r.offset for r in rows), default=-1)
            states = _states(model, rows)
            for record_key, (offset, value, writer) in by_key[key]:
                if not (complete or high >= offset):
                    continue
                seen = states.get(record_key, (None, None))
                if seen[1] != value:
                    yield _stale(table, key, record_key, seen, offset, value, writer, "table read")


def _stale(reader: Event, key: str, record_key: str, seen: tuple[int | None, Any], offset: int, value: Any, writer: Event, what: str) -> Anomaly:
    has = "nothing" if seen[0] is None else f"{'a tombstone' if seen[1] is None else seen[1]} at {seen[0]}"
    want = "a tombstone" if value is None else str(value)
    return Anomaly(
        "compacted-stale",
        f"{what} {reader.index} of {key} has {has} for record key {record_key!r}; its latest record is {want} at {offset} (op {writer.index})",
        [reader.index, writer.index] if writer is not reader else [reader.index],
        {"key": key, "record_key": record_key, "offset": seen[0], "value": seen[1], "latest_offset": offset, "latest_value": value},
    )

"""Transactions as readers saw them: aborted reads (G1a), intermediate reads (G1b), and
transactions half visible after the heal (torn-txn)."""

from __future__ import annotations

from collections.abc import Iterator

from chaos.history import FAIL, INFO

from .anomaly import Anomaly
from .model import READ_COMMITTED, Event, Model, Read


def _read_committed(r: Read) -> bool:
    return r.source == "table-read" or r.event.isolation == READ_COMMITTED


def g1a(model: Model) -> Iterator[Anomaly]:
    """A read_committed poll or final read, or a table read, returned a value of a txn that failed
    (was aborted). read_uncommitted consumers may see those."""
    found: dict[tuple[Event, Event], list[Read]] = {}
    for r in model.reads:
        send = model.writer.get(r.value) if r.value is not None else None
        if send is None or not send.event.txn or send.event.type != FAIL or send.event is r.event or not _read_committed(r):
            continue
        found.setdefault((r.event, send.event), []).append(r)
    for (reader, writer), reads in found.items():
        values = [r.value for r in reads]
        yield Anomaly(
            "G1a",
            f"op {reader.index} ({reader.f}, {reader.isolation}) read {len(values)} value(s) of aborted txn {writer.index}, first {values[0]} at {reads[0].key}@{reads[0].offset}",
            [writer.index, reader.index],
            {"values": values[:20], "key": reads[0].key, "offset": reads[0].offset},
        )


def g1b(model: Model) -> Iterator[Anomaly]:
    """A read_committed poll returned a txn's value before that txn asked to commit (the poll
    completed before its commit_time), or a read_committed poll or final read returned a value of a
    txn of unknown outcome that never asked to commit (commit_time null)."""
    found: dict[tuple[Event, Event], list[Read]] = {}
    for r in model.reads:
        if r.event.isolation != READ_COMMITTED or r.source == "table-read" or r.value is None:
            continue
        send = model.writer.get(r.value)
        if send is None or not send.event.txn or send.event is r.event or send.event.type == FAIL:
            continue
        writer = send.event
        never = writer.type == INFO and writer.commit_time is None
        early = r.source != "final-read" and writer.commit_time is not None and r.event.time < writer.commit_time
        if never or early:
            found.setdefault((r.event, writer), []).append(r)
    for (reader, writer), reads in found.items():
        values = [r.value for r in reads]
        why = "which never asked to commit" if writer.commit_time is None else f"before it asked to commit (poll done at {reader.time}, commit at {writer.commit_time})"
        yield Anomaly(
            "G1b",
            f"op {reader.index} read {len(values)} value(s) of txn {writer.index} {why}, first {values[0]} at {reads[0].key}@{reads[0].offset}",
            [writer.index, reader.index],
            {"values": values[:20], "key": reads[0].key, "offset": reads[0].offset, "commit_time": writer.commit_time, "read_time": reader.time},
        )


def torn_txn(model: Model) -> Iterator[Anomaly]:
    """A txn (of any outcome) some of whose values a read_committed final read returned while it
    left out others on keys it covered (a key it covered: one in its records, even empty).
    Compacted topics are left out: compaction drops a txn's older records legitimately."""
    reported: set[int] = set()
    finals = [e for e in model.events if e.f == "final-read" and e.ok and e.isolation == READ_COMMITTED and e.polls]
    txns = [e for e in model.events if e.txn and e.sends]
    for final in finals:
        covered = {key for key in final.polls[0] if not model.compacted(key)}
        seen = {r.value for records in final.polls[0].values() for r in records}
        for txn in txns:
            if txn.index in reported:
                continue
            writes = [s for s in txn.sends if s.value is not None and s.key in covered]
            shown = [s for s in writes if s.value in seen]
            if shown and len(shown) < len(writes):
                missing = [s for s in writes if s.value not in seen]
                reported.add(txn.index)
                yield Anomaly(
                    "torn-txn",
                    f"txn {txn.index} ({txn.type}): the final read {final.index} shows {len(shown)} of its {len(writes)} values, missing {missing[0].value} to {missing[0].key}",
                    [txn.index, final.index],
                    {"visible": [s.value for s in shown][:20], "missing": [[s.key, s.value] for s in missing][:20], "outcome": txn.type},
                )

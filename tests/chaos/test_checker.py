"""The chaos checker against small hand-written histories, one or more per anomaly class (each found,
with the ops that show it), the edge cases that must stay clean, and histories of a correct model
of a Kafka log (Hypothesis), which must always be clean."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.checker import CLASSES, check, excerpt

K0, K1 = "t/0", "t/1"


class H:
    """A history written the way the workloads record it: each op an invoke line then a completion,
    its time its index (a txn's commit_time half a step before its completion)."""

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []

    def line(self, process: Any, type: str, f: str, value: Any, **extra: Any) -> int:
        i = len(self.ops)
        self.ops.append({"index": i, "time": float(i), "process": process, "type": type, "f": f, "value": value, **extra})
        return i

    def op(self, process: Any, f: str, value: Any, type: str = "ok", done: Any = None, **extra: Any) -> int:
        self.line(process, "invoke", f, value)
        return self.line(process, type, f, value if done is None else done, **extra)

    def open(self, process: Any, isolation: str = "read_committed", role: str = "consumer") -> int:
        return self.op(process, "open", {"role": role, "isolation": isolation, "group": "g"})

    def send(self, process: Any, key: str, value: Any, offset: int | None = None, type: str = "ok", record_key: str | None = None) -> int:
        rk = [] if record_key is None else [record_key]
        done = [["send", key, [offset, value], *rk]] if offset is not None else None
        return self.op(process, "send", [["send", key, value, *rk]], type, done)

    def poll(self, process: Any, records: dict[str, list]) -> int:
        return self.op(process, "poll", [["poll"]], "ok", [["poll", {k: [list(r) for r in rs] for k, rs in records.items()}]])

    @staticmethod
    def txn_values(mops: list) -> tuple[list, list]:
        """(invoke, completion) values of micro-ops ("send", key, value, offset), ("poll", records), ("offsets", value)."""
        invoke, done = [], []
        for m in mops:
            if m[0] == "send":
                invoke.append(["send", m[1], m[2]])
                done.append(["send", m[1], [m[3], m[2]]] if m[3] is not None else ["send", m[1], m[2]])
            elif m[0] == "poll":
                invoke.append(["poll"])
                done.append(["poll", {k: [list(r) for r in rs] for k, rs in m[1].items()}])
            else:
                invoke.append(list(m))
                done.append(list(m))
        return invoke, done

    def txn(self, process: Any, mops: list, type: str = "ok", committed: bool = True) -> int:
        invoke, done = self.txn_values(mops)
        self.line(process, "invoke", "txn", invoke)
        return self.line(process, type, "txn", done, commit_time=len(self.ops) - 0.5 if committed else None)

    def final(self, records: dict[str, list], isolation: str = "read_committed", process: Any = "final") -> int:
        return self.op(process, "final-read", None, "ok", {"isolation": isolation, "records": {k: [list(r) for r in rs] for k, rs in records.items()}})

    def table(self, topic: str, rows: dict[str, list], complete: bool = True, process: Any = "table") -> int:
        return self.op(process, "table-read", None, "ok", {"topic": topic, "rows": {k: [list(r) for r in rs] for k, rs in rows.items()}, "complete": complete})


def found(h: H, cls: str, **kwargs: Any) -> list:
    result = check(h.ops, **kwargs)
    others = {c: len(a) for c, a in result.anomalies.items() if a and c != cls}
    assert result.anomalies[cls], f"no {cls}; found {others}"
    return result.anomalies[cls]


def only(h: H, cls: str) -> list:
    """The anomalies of `cls`, asserting no other class was found."""
    result = check(h.ops)
    others = {c: [a.message for a in found] for c, found in result.anomalies.items() if found and c != cls}
    assert not others, others
    assert result.anomalies[cls], f"no {cls}"
    return result.anomalies[cls]


def clean(h: H) -> None:
    result = check(h.ops)
    assert result.count == 0, {c: [a.message for a in found] for c, found in result.anomalies.items() if found}


# the clean cases


def test_a_clean_history_is_clean():
    h = H()
    h.open(0, role="producer")
    h.open(1, "read_committed")
    a = h.send(0, K0, 1, 0)
    h.send(0, K0, 2, 1)
    h.txn(2, [("send", K0, 3, 2), ("send", K1, 4, 0)])  # markers at 3 and 1
    h.txn(2, [("send", K0, 5, 4)], type="fail")  # aborted; marker at 5
    h.send(0, K0, 6, 6)
    h.poll(1, {K0: [(0, 1), (1, 2)]})
    h.poll(1, {K0: [(2, 3), (6, 6)], K1: [(0, 4)]})
    h.op(1, "commit", {"group": "g", "offsets": {K0: 7, K1: 2}})
    h.op(3, "offsets", None, done={"group": "g", "offsets": {K0: 7, K1: 2}})
    h.final({K0: [(0, 1), (1, 2), (2, 3), (6, 6)], K1: [(0, 4)]})
    h.table("t", {K0: [(0, 1), (1, 2), (2, 3), (6, 6)], K1: [(0, 4)]})
    result = check(h.ops)
    assert result.count == 0 and result.valid
    assert set(result.anomalies) == set(CLASSES)
    assert result.stats["values_sent"] == 6 and result.stats["values_acked"] == 5 and result.stats["values_read"] == 5
    assert result.stats["ops"]["send"] == {"invoke": 3, "ok": 3}
    assert json.loads(json.dumps(result.to_json()))["count"] == 0
    assert a == 5


def test_an_info_send_may_or_may_not_appear():
    h = H()
    h.send(0, K0, 1, type="info")  # happened: read later
    h.send(0, K0, 2, type="info")  # did not: never read
    h.send(0, K0, 3, 1)
    h.poll(1, {K0: [(0, 1), (1, 3)]})
    h.final({K0: [(0, 1), (1, 3)]})
    clean(h)


def test_skipping_an_aborted_txns_offsets_is_no_skip_but_a_read_uncommitted_skip_of_others_is():
    """read_committed never sees an aborted transaction's records; read_uncommitted sees them
    until compaction takes their range, and not after (aborted records never become rows:
    docs/GAPS.md), so passing over them is no skip either. Passing over a committed record or one
    of a transaction whose outcome is unknown still is."""

    def history(isolation: str, outcome: str = "fail") -> tuple[H, list[int]]:
        h = H()
        h.open(1, isolation)
        h.send(0, K0, 1, 0)
        txn = h.txn(2, [("send", K0, 2, 1), ("send", K0, 3, 2)], type=outcome)  # marker at 3
        h.send(0, K0, 4, 4)
        return h, [h.poll(1, {K0: [(0, 1)]}), h.poll(1, {K0: [(4, 4)]}), txn]

    clean(history("read_committed")[0])
    clean(history("read_uncommitted")[0])
    h, ops = history("read_uncommitted", outcome="info")
    (skip,) = only(h, "poll-skip")  # read_uncommitted should have seen 2 and 3
    assert skip.details["skipped"] == [1, 2] and skip.ops == ops


def test_a_rebalance_or_seek_between_polls_is_not_ext_nonmonotonic():
    for reset in ("rebalance", "seek", "assign"):
        h = H()
        h.open(1)
        h.send(0, K0, 1, 0)
        h.send(0, K0, 2, 1)
        h.poll(1, {K0: [(0, 1), (1, 2)]})
        h.line(1, "info", "rebalance", {"revoked": [K0]}) if reset == "rebalance" else h.op(1, reset, {K0: 0} if reset == "seek" else [K0])
        h.poll(1, {K0: [(0, 1), (1, 2)]})
        clean(h)


def test_gaps_without_values_are_no_skip():
    h = H()
    h.open(1)
    h.send(0, K0, 1, 0)
    h.txn(2, [("send", K0, 2, 1)])  # marker at 2
    h.send(0, K0, 3, 3)
    h.poll(1, {K0: [(0, 1), (1, 2)]})
    h.poll(1, {K0: [(3, 3)]})
    clean(h)


# one class at a time


def test_lost_write():
    h = H()
    lost = h.send(0, K0, 1, 0)
    h.send(0, K0, 2, 1)
    h.open(1, "read_uncommitted")
    reader = h.poll(1, {K0: [(1, 2)]})
    (anomaly,) = only(h, "lost-write")
    assert anomaly.ops == [lost, reader] and anomaly.details == {"key": K0, "offset": 0, "value": 1, "highest_read": 1}


def test_a_write_read_once_and_missing_from_the_final_read_from_zero_is_lost():
    h = H()
    lost = h.send(0, K0, 1, 0)
    h.send(0, K0, 2, 1)
    h.open(1, "read_uncommitted")
    h.poll(1, {K0: [(0, 1), (1, 2)]})  # served once (from the WAL, say)
    final = h.final({K0: [(1, 2)]})  # the copy kept lacks it
    (anomaly,) = only(h, "lost-write")
    assert anomaly.ops == [lost, final] and anomaly.details["final_read"] == final


def test_a_final_read_that_holds_every_write_loses_none():
    h = H()
    h.send(0, K0, 1, 0)
    h.send(0, K0, 2, 1)
    h.open(1, "read_uncommitted")
    h.poll(1, {K0: [(0, 1), (1, 2)]})
    h.final({K0: [(0, 1), (1, 2)]})
    h.final({K0: [(0, 1), (1, 2)]}, isolation="read_uncommitted")
    clean(h)


def test_a_send_of_a_committed_txn_can_be_lost_and_a_compacted_topics_cannot():
    h = H()
    lost = h.txn(2, [("send", K0, 1, 0), ("send", K0, 2, 1)])
    h.send(0, "c/0", 3, 0, record_key="a")
    h.send(0, "c/0", 4, 1, record_key="a")
    final = h.final({K0: [(1, 2)], "c/0": [(1, 4, "a")]})
    (anomaly,) = found(h, "lost-write")
    assert anomaly.ops == [lost, final] and anomaly.details["value"] == 1


def test_duplicate():
    h = H()
    send = h.send(0, K0, 1, 0)
    h.open(1, "read_uncommitted")
    poll = h.poll(1, {K0: [(0, 1), (1, 1)]})
    (anomaly,) = only(h, "duplicate")
    assert anomaly.ops == [send, poll] and anomaly.details["at"] == [[K0, 0], [K0, 1]]


def test_inconsistent_offsets():
    h = H()
    a = h.send(0, K0, 1, 0)
    b = h.send(3, K0, 2, 0)
    (anomaly,) = only(h, "inconsistent-offsets")
    assert anomaly.ops == [a, b] and anomaly.details["values"] == [1, 2]


def test_unexpected_value():
    h = H()
    h.open(1)
    poll = h.poll(1, {K0: [(0, 99)]})
    (anomaly,) = only(h, "unexpected-value")
    assert anomaly.ops == [poll] and anomaly.details["value"] == 99


def test_int_nonmonotonic_send():
    h = H()
    txn = h.txn(2, [("send", K0, 1, 5), ("send", K0, 2, 3)])
    (anomaly,) = found(h, "int-nonmonotonic-send")
    assert anomaly.ops == [txn] and anomaly.details == {"key": K0, "offset": 3, "previous": 5}


def test_ext_nonmonotonic_send():
    h = H()
    first = h.send(0, K0, 1, 5)
    h.send(3, K0, 9, 6)  # another process: no order between them
    second = h.send(0, K0, 2, 3)
    (anomaly,) = only(h, "ext-nonmonotonic-send")
    assert anomaly.ops == [first, second]


def test_int_nonmonotonic_poll():
    h = H()
    h.open(1, "read_uncommitted")
    h.send(0, K0, 1, 0)
    h.send(0, K0, 2, 1)
    poll = h.poll(1, {K0: [(1, 2), (0, 1)]})
    (anomaly,) = only(h, "int-nonmonotonic-poll")
    assert anomaly.ops == [poll]


def test_ext_nonmonotonic_poll():
    h = H()
    h.open(1, "read_uncommitted")
    h.send(0, K0, 1, 0)
    h.send(0, K0, 2, 1)
    first = h.poll(1, {K0: [(0, 1), (1, 2)]})
    h.op(1, "commit", {"group": "g", "offsets": {K0: 2}})  # not a reset
    second = h.poll(1, {K0: [(1, 2)]})
    (anomaly,) = only(h, "ext-nonmonotonic-poll")
    assert anomaly.ops == [first, second] and anomaly.details == {"key": K0, "offset": 1, "previous": 1}


def test_poll_skip_read_committed_names_the_skipped_writer():
    h = H()
    h.open(1, "read_committed")
    h.send(0, K0, 1, 0)
    skipped = h.txn(2, [("send", K0, 2, 1)])  # marker at 2
    h.send(0, K0, 3, 3)
    first = h.poll(1, {K0: [(0, 1)]})
    second = h.poll(1, {K0: [(3, 3)]})
    (anomaly,) = found(h, "poll-skip")
    assert anomaly.ops == [first, second, skipped] and anomaly.details["skipped"] == [1]


def test_poll_skip_counts_an_info_txn_only_once_a_read_committed_read_saw_it():
    def history(seen: bool) -> H:
        h = H()
        h.open(1, "read_committed")
        h.open(5, "read_committed")
        h.send(0, K0, 1, 0)
        h.txn(2, [("send", K0, 2, 1)], type="info")
        h.send(0, K0, 3, 3)
        h.poll(1, {K0: [(0, 1)]})
        h.poll(1, {K0: [(3, 3)]})
        if seen:
            h.poll(5, {K0: [(1, 2)]})
        return h

    clean(history(seen=False))
    assert [a.details["skipped"] for a in only(history(seen=True), "poll-skip")] == [[1]]


def test_g1a():
    h = H()
    h.open(1, "read_committed")
    h.open(5, "read_uncommitted")
    aborted = h.txn(2, [("send", K0, 1, 0)], type="fail")
    h.poll(5, {K0: [(0, 1)]})  # read_uncommitted may
    poll = h.poll(1, {K0: [(0, 1)]})
    (anomaly,) = only(h, "G1a")
    assert anomaly.ops == [aborted, poll]


def test_g1a_in_the_final_read_and_the_table():
    h = H()
    aborted = h.txn(2, [("send", K0, 1, 0)], type="fail")
    final = h.final({K0: [(0, 1)]})
    table = h.table("t", {K0: [(0, 1)]})
    assert [a.ops for a in found(h, "G1a")] == [[aborted, final], [aborted, table]]


def test_g1b_a_poll_before_the_commit():
    h = H()
    h.open(1, "read_committed")
    invoke, done = H.txn_values([("send", K0, 1, 0)])
    h.line(2, "invoke", "txn", invoke)
    poll = h.poll(1, {K0: [(0, 1)]})
    txn = h.line(2, "ok", "txn", done, commit_time=poll + 1.0)
    (anomaly,) = only(h, "G1b")
    assert anomaly.ops == [txn, poll] and anomaly.details["commit_time"] == poll + 1.0


def test_g1b_a_txn_that_never_asked_to_commit():
    h = H()
    h.open(1, "read_committed")
    txn = h.txn(2, [("send", K0, 1, 0)], type="info", committed=False)
    poll = h.poll(1, {K0: [(0, 1)]})
    (anomaly,) = only(h, "G1b")
    assert anomaly.ops == [txn, poll]


def test_torn_txn():
    h = H()
    txn = h.txn(2, [("send", K0, 1, 0), ("send", K1, 2, 0)], type="info")
    final = h.final({K0: [(0, 1)], K1: []})
    (anomaly,) = only(h, "torn-txn")
    assert anomaly.ops == [txn, final] and anomaly.details["missing"] == [[K1, 2]]


def test_a_txn_on_a_key_the_final_read_did_not_cover_is_not_torn():
    h = H()
    h.txn(2, [("send", K0, 1, 0), ("send", K1, 2, 0)], type="info")
    h.final({K0: [(0, 1)]})
    clean(h)


def test_g0():
    h = H()
    a = h.txn(2, [("send", K0, 1, 0), ("send", K1, 2, 1)])
    b = h.txn(3, [("send", K0, 3, 1), ("send", K1, 4, 0)])
    (anomaly,) = only(h, "G0")
    assert sorted(anomaly.ops) == [a, b] and {s["kind"] for s in anomaly.details["steps"]} == {"ww"}
    assert check(h.ops, ww_deps=False).count == 0


def test_g1c():
    h = H()
    h.open(2, "read_uncommitted")
    h.open(3, "read_uncommitted")
    a = h.txn(2, [("send", K0, 1, 0), ("poll", {K1: [(0, 2)]})])
    b = h.txn(3, [("send", K1, 2, 0), ("poll", {K0: [(0, 1)]})])
    (anomaly,) = only(h, "G1c")
    assert sorted(anomaly.ops) == [a, b] and [s["kind"] for s in anomaly.details["steps"]] == ["wr", "wr"]


def test_edges_that_all_point_forward_make_no_cycle():
    h = H()
    h.open(1, "read_uncommitted")
    h.send(0, K0, 1, 0)
    h.txn(2, [("send", K0, 2, 1), ("send", K1, 3, 0)])  # send -ww-> txn
    h.txn(1, [("poll", {K1: [(0, 3)]}), ("send", K0, 4, 2)])  # txn -wr-> and -ww-> this one
    h.send(5, K1, 5, 1)
    h.poll(1, {K0: [(0, 1), (1, 2), (2, 4)], K1: [(1, 5)]})  # a single poll is a one-op transaction
    clean(h)


def test_g1c_with_a_ww_edge():
    h = H()
    x = h.txn(2, [("send", K0, 1, 0), ("poll", {K1: [(0, 9), (1, 2)]})])  # z -wr-> x
    z = h.txn(3, [("send", K1, 9, 0), ("send", K1, 2, 1), ("send", K0, 8, 1)])  # x -ww-> z on K0
    (anomaly,) = only(h, "G1c")
    assert sorted(anomaly.ops) == [x, z] and sorted(s["kind"] for s in anomaly.details["steps"]) == ["wr", "ww"]


def test_offsets_backwards():
    h = H()
    first = h.op(1, "commit", {"group": "g", "offsets": {K0: 10}})
    h.op(1, "commit", {"group": "other", "offsets": {K0: 3}})
    read = h.op(3, "offsets", None, done={"group": "g", "offsets": {K0: 5}})
    (anomaly,) = only(h, "offsets-backwards")
    assert anomaly.ops == [first, read] and anomaly.details["previous"] == 10


def test_offsets_of_overlapping_ops_are_not_compared():
    h = H()
    h.line(3, "invoke", "offsets", None)  # began before the commit was acknowledged: may read before it
    h.op(1, "commit", {"group": "g", "offsets": {K0: 10}})
    h.line(3, "ok", "offsets", {"group": "g", "offsets": {K0: 5}})
    clean(h)


def test_offsets_of_a_txn():
    h = H()
    first = h.txn(2, [("send", K1, 1, 0), ("offsets", {"group": "g", "offsets": {K0: 10}})])
    second = h.txn(2, [("send", K1, 2, 2), ("offsets", {"group": "g", "offsets": {K0: 4}})])
    (anomaly,) = found(h, "offsets-backwards")
    assert anomaly.ops == [first, second]


def _table_history(rows: dict, complete: bool = True) -> tuple[H, int, int]:
    h = H()
    for i in range(4):
        h.send(0, K0, i + 1, i)
    final = h.final({K0: [(i, i + 1) for i in range(4)]})
    table = h.table("t", rows, complete)
    return h, final, table


def test_table_missing():
    h, final, table = _table_history({K0: [(0, 1), (2, 3), (3, 4)]})
    (anomaly,) = only(h, "table-missing")
    assert anomaly.ops == [table, final] and anomaly.details["offsets"] == [1]


def test_an_incomplete_table_misses_only_up_to_its_highest_offset():
    h, _, _ = _table_history({K0: [(0, 1), (2, 3)]}, complete=False)
    (anomaly,) = only(h, "table-missing")
    assert anomaly.details["offsets"] == [1]
    h, _, _ = _table_history({K0: [(0, 1), (1, 2)]}, complete=False)
    clean(h)


def test_table_extra():
    h, _, table = _table_history({K0: [(0, 1), (1, 2), (2, 3), (3, 4), (7, 2)]})
    (anomaly,) = found(h, "table-extra")
    assert anomaly.ops[0] == table and anomaly.details["offsets"] == [7]


def test_table_differs():
    h, final, table = _table_history({K0: [(0, 1), (1, 3), (2, 3), (3, 4)]})
    (anomaly,) = found(h, "table-differs")
    assert anomaly.ops == [table, final] and anomaly.details["offsets"] == [1]


C0 = "c/0"


def _compacted(final: list, table: list, complete: bool = True) -> tuple[H, dict[str, int]]:
    h = H()
    ops = {
        "a1": h.send(0, C0, 1, 0, record_key="a"),
        "b1": h.send(0, C0, 2, 1, record_key="b"),
        "a2": h.send(0, C0, 3, 2, record_key="a"),
        "b-": h.send(0, C0, None, 3, record_key="b"),  # b deleted
    }
    ops["final"] = h.final({C0: final})
    ops["table"] = h.table("c", {C0: table}, complete)
    return h, ops


def test_compacted_topics_clean():
    h, _ = _compacted([(2, 3, "a"), (3, None, "b")], [(2, 3, "a")])
    clean(h)
    h, _ = _compacted([(2, 3, "a")], [(2, 3, "a")])  # the tombstone itself may be gone
    clean(h)
    h, _ = _compacted([(0, 1, "a"), (1, 2, "b"), (2, 3, "a"), (3, None, "b")], [(2, 3, "a")])  # not compacted yet
    clean(h)


def test_compacted_stale_in_the_final_read():
    h, ops = _compacted([(0, 1, "a"), (3, None, "b")], [(2, 3, "a")])
    (anomaly,) = only(h, "compacted-stale")
    assert anomaly.ops == [ops["final"], ops["a2"]] and anomaly.details["latest_value"] == 3


def test_compacted_stale_in_the_table_a_deleted_key_alive():
    h, ops = _compacted([(2, 3, "a"), (3, None, "b")], [(1, 2, "b"), (2, 3, "a")])
    (anomaly,) = only(h, "compacted-stale")
    assert anomaly.ops == [ops["table"], ops["b-"]] and anomaly.details["record_key"] == "b"


def test_an_incomplete_compacted_table_is_judged_only_up_to_its_rows():
    h, _ = _compacted([(2, 3, "a"), (3, None, "b")], [(0, 1, "a"), (1, 2, "b")], complete=False)
    clean(h)  # it has not reached a's latest (2) nor b's tombstone (3)
    h, _ = _compacted([(2, 3, "a"), (3, None, "b")], [(0, 1, "a"), (3, None, "b")], complete=False)
    (anomaly,) = only(h, "compacted-stale")  # it reached 3: a's 3 at offset 2 should be there
    assert anomaly.details["record_key"] == "a" and anomaly.details["value"] == 1


def test_compacted_duplicate_key():
    h = H()
    h.send(0, C0, 1, 0, record_key="a")
    h.send(0, C0, 2, 1, record_key="a")
    h.final({C0: [(1, 2, "a")]})
    table = h.table("c", {C0: [(0, 1, "a"), (1, 2, "a")]})
    (anomaly,) = only(h, "compacted-duplicate-key")
    assert anomaly.ops == [table] and anomaly.details["rows"] == [[C0, 0, 1], [C0, 1, 2]]


def test_excerpt_names_the_ops_and_their_neighbours():
    h = H()
    h.open(1, "read_uncommitted")
    lost = h.send(0, K0, 1, 0)
    h.send(0, K0, 2, 1)
    h.send(0, K0, 3, 2)
    poll = h.poll(1, {K0: [(1, 2), (2, 3)]})
    (anomaly,) = found(h, "lost-write")
    lines = excerpt(h.ops, anomaly, context=1)
    assert [op["index"] for op in lines] == [lost - 1, lost, lost + 1, poll - 1, poll]
    assert json.loads(json.dumps(check(h.ops).to_json()))["anomalies"]["lost-write"][0]["ops"] == [lost, poll]


def test_a_large_history_checks_in_seconds():
    h = H()
    h.open(1, "read_committed")
    offsets = itertools.count()
    for i in range(2000):
        o = next(offsets)
        h.txn(2 + i % 4, [("send", K0, 2 * i, o), ("send", K1, 2 * i + 1, i)])
        next(offsets)  # the marker
        h.poll(1, {K0: [(o, 2 * i)]})
    began = time.monotonic()
    assert check(h.ops).count == 0
    assert time.monotonic() - began < 5  # 8,000 lines; ~100k take a few seconds


# a correct Kafka log never shows an anomaly


@st.composite
def correct_histories(draw: st.DrawFn) -> list[dict]:
    """A run against an in-memory log that keeps Kafka's promises: producers append, transactions
    append then write a marker (committed, aborted, or of unknown outcome), consumers of either
    isolation poll forward from their position and sometimes seek, commit their own group's
    offsets; then a read_committed final read, the tables, and a compacted topic."""
    h = H()
    keys = [K0, K1]
    log: dict[str, list[tuple[Any, bool]]] = {k: [] for k in keys}  # (value, committed); value None: a marker
    values = itertools.count(1)
    consumers = {10: "read_committed", 11: "read_uncommitted", 12: "read_committed"}
    position = {c: dict.fromkeys(keys, 0) for c in consumers}
    group_offset = {c: dict.fromkeys(keys, 0) for c in consumers}
    for c, isolation in consumers.items():
        h.open(c, isolation)
    h.open(20, "read_committed", role="txn-producer")
    position[20] = dict.fromkeys(keys, 0)
    txn_offsets = dict.fromkeys(keys, 0)  # the txn group's committed offsets, where an unfinished txn rewinds to

    def poll_records(c: int, isolation: str, limit: int) -> dict[str, list]:
        out = {}
        for k in keys:
            got = []
            o = position[c][k]
            while o < len(log[k]) and len(got) < limit:
                value, committed = log[k][o]
                if value is not None and (committed or isolation == "read_uncommitted"):
                    got.append((o, value))
                o += 1
            position[c][k] = o
            if got:
                out[k] = got
        return out

    compacted: list[tuple[int, Any, str]] = []
    for _ in range(draw(st.integers(0, 40))):
        step = draw(st.sampled_from(["send", "send", "txn", "txn", "poll", "poll", "seek", "commit", "compacted"]))
        if step == "send":
            k, v, outcome = draw(st.sampled_from(keys)), next(values), draw(st.sampled_from(["ok", "ok", "info", "info-lost"]))
            if outcome == "info-lost":
                h.send(0, k, v, type="info")
                continue
            log[k].append((v, True))
            h.send(0, k, v, len(log[k]) - 1 if outcome == "ok" else None, type=outcome)
        elif step == "txn":
            outcome = draw(st.sampled_from(["commit", "abort", "info-commit", "info-abort", "info-never"]))
            committed = outcome in ("commit", "info-commit")
            mops: list = []
            if draw(st.booleans()):
                mops.append(("poll", poll_records(20, "read_committed", draw(st.integers(1, 3)))))
            touched = set()
            for _ in range(draw(st.integers(1, 3))):
                k, v = draw(st.sampled_from(keys)), next(values)
                log[k].append((v, committed))
                touched.add(k)
                mops.append(("send", k, v, len(log[k]) - 1 if outcome in ("commit", "abort") else None))
            for k in sorted(touched):
                log[k].append((None, committed))
            if outcome == "commit":
                mops.append(("offsets", {"group": "txn", "offsets": dict(position[20])}))
                txn_offsets = dict(position[20])
            elif committed:
                txn_offsets = dict(position[20])  # committed, offsets and all, though the client never heard
            if outcome != "commit":
                position[20] = dict(txn_offsets)  # rewound to the group's offsets; recorded as a seek
            type = {"commit": "ok", "abort": "fail"}.get(outcome, "info")
            h.txn(20, mops, type=type, committed=outcome != "info-never")
            if outcome != "commit":
                h.op(20, "seek", dict(position[20]))
        elif step == "poll":
            c = draw(st.sampled_from(sorted(consumers)))
            h.poll(c, poll_records(c, consumers[c], draw(st.integers(1, 3))))
        elif step == "seek":
            c, k = draw(st.sampled_from(sorted(consumers))), draw(st.sampled_from(keys))
            position[c][k] = draw(st.integers(0, len(log[k])))
            h.op(c, "seek", {k: position[c][k]})
        elif step == "commit":
            c = draw(st.sampled_from(sorted(consumers)))
            ahead = {k: o for k, o in position[c].items() if o >= group_offset[c][k]}
            group_offset[c].update(ahead)
            h.op(c, "commit", {"group": f"g{c}", "offsets": ahead})
            h.op(30, "offsets", None, done={"group": f"g{c}", "offsets": dict(group_offset[c])})
        else:
            record_key, tombstone = draw(st.sampled_from("ab")), draw(st.booleans())
            v = None if tombstone else next(values)
            compacted.append((len(compacted), v, record_key))
            h.send(1, C0, v, len(compacted) - 1, record_key=record_key)
    final = {k: [(o, v) for o, (v, committed) in enumerate(log[k]) if v is not None and committed] for k in keys}
    newest = {rk: (o, v, rk) for o, v, rk in compacted}
    keep_tombstones = draw(st.booleans())
    final[C0] = sorted(r for r in newest.values() if r[1] is not None or keep_tombstones)
    h.final(final)
    h.table("t", {k: final[k] for k in keys})
    h.table("c", {C0: sorted(r for r in newest.values() if r[1] is not None)})
    return h.ops


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(correct_histories())
def test_a_correct_log_is_always_clean(ops):
    result = check(ops)
    assert result.count == 0, {c: [a.message for a in found] for c, found in result.anomalies.items() if found}

"""compactor/files/planner.py: every due WAL offset planned exactly once, nothing below a checkpoint,
partitions' entries in order and a due partition whole, each object range read once, tasks sized
to the executors."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.files.planner import MiB, plan, whole_transactions
from metadata.model import IndexEntry, ObjectType

NOW = 1_700_000_100_000


@st.composite
def index(draw):
    """Partitions' entries as flushes make them: object k holds a range of some partitions, the
    sections one after another; now and then an entry is already PARQUET."""
    partitions = draw(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 3)), min_size=1, max_size=5, unique=True))
    entries = {tp: [] for tp in partitions}
    next_offset = dict.fromkeys(partitions, 0)
    for k in range(draw(st.integers(1, 12))):
        position = 8
        for tp in draw(st.lists(st.sampled_from(partitions), min_size=1, unique=True)):
            count, size = draw(st.integers(1, 50)), draw(st.integers(100, 3 * MiB))
            kind = ObjectType.PARQUET if draw(st.integers(0, 9)) == 0 and all(e.object_type == ObjectType.PARQUET for e in entries[tp]) else ObjectType.WAL
            age = draw(st.integers(0, 10_000))
            entries[tp].append(IndexEntry(next_offset[tp], next_offset[tp] + count - 1, f"wal/{k:04d}", kind, position, size, NOW - age))
            next_offset[tp] += count
            position += size
    checkpoints = {tp: draw(st.integers(0, next_offset[tp])) for tp in partitions if draw(st.booleans())}
    return entries, checkpoints


@settings(deadline=None, max_examples=300)
@given(index(), st.integers(0, 10_000), st.integers(1, 64) , st.integers(1, 16))
def test_plans_each_due_offset_once_in_order(case, freshness_ms, due_mib, parallelism):
    entries, checkpoints = case
    result = plan(entries, checkpoints, now_ms=NOW, freshness_ms=freshness_ms, due_bytes=due_mib * MiB, parallelism=parallelism, min_task_bytes=MiB, max_task_bytes=16 * MiB)
    planned: dict[tuple[str, int], list[int]] = {}
    for task in result.tasks:
        for run in task.runs:
            offsets = [o for e in run.entries for o in range(max(e.base_offset, run.first_offset), e.last_offset + 1)]
            planned.setdefault((run.topic, run.partition), []).extend(offsets)
            assert all(e.object_type == ObjectType.WAL for e in run.entries)
            # each entry's range lies inside one of the task's reads
            for e in run.entries:
                assert any(r.object_key == e.object_key and r.start <= e.start and e.start + e.size <= r.end for r in task.reads)
    for tp, wal in entries.items():
        checkpoint = checkpoints.get(tp, 0)
        got = planned.get(tp, [])
        # in order, no duplicates, from the checkpoint on, contiguous
        assert got == list(range(checkpoint, checkpoint + len(got))) or (got and got[0] > checkpoint and got == list(range(got[0], got[0] + len(got))))
        pending = [e for e in wal if e.object_type == ObjectType.WAL and e.last_offset >= checkpoint]
        run = [e for i, e in enumerate(pending) if all(pending[j + 1].base_offset == pending[j].last_offset + 1 for j in range(i))]
        due = any(e.max_timestamp <= NOW - freshness_ms for e in run) or sum(e.size for e in run) >= due_mib * MiB
        planned_entries = [e for t in result.tasks for r in t.runs if (r.topic, r.partition) == tp for e in r.entries]
        if due:
            # the partition goes whole: every consecutive pending entry, once one is old (or the bytes are many)
            assert sorted(planned_entries, key=lambda e: e.base_offset) == run
            assert result.offsets[tp] == (got[0], got[-1]) and got[-1] == run[-1].last_offset
        else:
            assert not got and tp not in result.offsets
    # each object byte range in one read of one task: reads never overlap
    reads = sorted((r.object_key, r.start, r.end) for task in result.tasks for r in task.reads)
    assert all(a[0] != b[0] or a[2] <= b[1] for a, b in zip(reads, reads[1:]))
    planned_ranges = sorted((e.object_key, e.start, e.size) for task in result.tasks for run in task.runs for e in run.entries)
    assert len(planned_ranges) == len(set(planned_ranges))


def entry(base: int, count: int, key: str, start: int, size: int, age_ms: int = 60_000) -> IndexEntry:
    return IndexEntry(base, base + count - 1, key, ObjectType.WAL, start, size, NOW - age_ms)


def test_partitions_flushed_together_share_a_task_and_their_sections_one_read():
    entries = {("t", p): [entry(0, 10, "wal/1", 8 + p * 100, 100), entry(10, 10, "wal/2", 8 + p * 100, 100)] for p in range(3)}
    result = plan(entries, {}, now_ms=NOW)
    (task,) = result.tasks
    assert [(r.object_key, r.start, r.end) for r in task.reads] == [("wal/1", 8, 308), ("wal/2", 8, 308)]
    assert result.offsets == {("t", p): (0, 19) for p in range(3)}


def test_a_partition_waits_until_an_entry_is_old_or_its_bytes_are_many_then_goes_whole():
    fresh = [entry(5, 5, "wal/2", 8, 1000, age_ms=100), entry(10, 5, "wal/3", 8, 1000, age_ms=100)]
    assert plan({("t", 0): fresh}, {("t", 0): 5}, now_ms=NOW, freshness_ms=2000).offsets == {}
    assert plan({("t", 0): fresh}, {("t", 0): 5}, now_ms=NOW, freshness_ms=2000, due_bytes=2000).offsets == {("t", 0): (5, 14)}
    assert plan({("t", 0): fresh}, {("t", 0): 5}, now_ms=NOW, freshness_ms=50).offsets == {("t", 0): (5, 14)}
    # one old entry takes the fresh ones after it along: a cycle takes ~freshness of records at once
    entries = {("t", 0): [entry(0, 5, "wal/1", 8, 1000), *fresh]}
    assert plan(entries, {}, now_ms=NOW, freshness_ms=2000).offsets == {("t", 0): (0, 14)}


def test_a_checkpoint_inside_an_entry_skips_the_records_below_it():
    entries = {("t", 0): [entry(0, 10, "wal/1", 8, 100), entry(10, 10, "wal/2", 8, 100)]}
    result = plan(entries, {("t", 0): 4}, now_ms=NOW)
    (task,) = result.tasks
    (run,) = task.runs
    assert (run.first_offset, [e.base_offset for e in run.entries]) == (4, [0, 10])
    assert result.offsets == {("t", 0): (4, 19)}
    assert plan(entries, {("t", 0): 20}, now_ms=NOW).tasks == ()


def test_a_gap_in_the_index_ends_the_partition_run():
    entries = {("t", 0): [entry(0, 10, "wal/1", 8, 100), entry(15, 5, "wal/2", 8, 100)]}
    assert plan(entries, {}, now_ms=NOW).offsets == {("t", 0): (0, 9)}


def test_tasks_are_sized_for_the_executors():
    entries = {("t", p): [entry(i * 10, 10, f"wal/{i}", 8 + p * 8 * MiB, 8 * MiB) for i in range(4)] for p in range(4)}  # 128 MiB
    result = plan(entries, {}, now_ms=NOW, parallelism=8, min_task_bytes=MiB, max_task_bytes=64 * MiB)
    assert [t.size for t in result.tasks] == [16 * MiB] * 8
    # A partition split over tasks keeps its order: pieces follow one another.
    pieces = sorted((run.first_offset, run.last_offset) for t in result.tasks for run in t.runs if run.partition == 0)
    assert pieces == [(0, 19), (20, 39)]
    assert len(plan(entries, {}, now_ms=NOW, parallelism=1, max_task_bytes=64 * MiB).tasks) == 2


def test_a_committed_transaction_enters_the_table_on_all_its_partitions_or_on_none():
    """Issue 42 finding 4: each partition was planned on its own, so a transaction over two
    partitions was in the table on one (due, nothing open there) and not on the other (an older
    open transaction holding it back, or not due yet). Its part on the first now waits too."""
    # producer 7's transaction (generation 3): 10-11 on p0 (marker 12), 20-21 on p1 (marker 22)
    parts = {("t", 0): [(7, 3, 10, 12)], ("t", 1): [(9, 1, 18, None), (7, 3, 20, 22)]}
    # p1 stops at 18 (producer 9's open transaction): 7's part there is out, so on p0 too
    assert whole_transactions({("t", 0): 13, ("t", 1): 18}, parts) == {("t", 0): 10}
    # both ends past the markers: in whole, nothing held
    parts[("t", 1)] = [(7, 3, 20, 22)]
    assert whole_transactions({("t", 0): 13, ("t", 1): 23}, parts) == {}
    # p1 not planned at all (not due, or left out of the cycle)
    assert whole_transactions({("t", 0): 13}, parts) == {("t", 0): 10}
    # a chain: holding 5's transaction on p1 leaves 7's in part there, which holds p2
    chain = {("t", 0): [(5, 1, 30, 31)], ("t", 1): [(5, 1, 40, 42), (7, 2, 41, 44)], ("t", 2): [(7, 2, 50, 51)]}
    assert whole_transactions({("t", 0): 30, ("t", 1): 45, ("t", 2): 52}, chain) == {("t", 1): 40, ("t", 2): 50}


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_whole_transactions_leaves_no_transaction_in_part(data):
    partitions = [("t", p) for p in range(3)]
    parts: dict = {tp: [] for tp in partitions}
    next_offset = dict.fromkeys(partitions, 0)
    for generation in range(data.draw(st.integers(0, 6))):
        for tp in data.draw(st.lists(st.sampled_from(partitions), min_size=1, max_size=3, unique=True)):
            first = next_offset[tp] + data.draw(st.integers(0, 2))
            last = first + data.draw(st.integers(1, 3))
            is_open = data.draw(st.booleans()) and generation >= 4
            parts[tp].append((1, generation, first, None if is_open else last))
            next_offset[tp] = last + 1
    ends = {tp: data.draw(st.integers(0, next_offset[tp] + 1)) for tp in partitions}
    stops = {**ends, **whole_transactions(ends, parts)}
    assert all(stops[tp] <= ends[tp] for tp in partitions)
    txns: dict = {}
    for tp, listed in parts.items():
        for pid, generation, first, last in listed:
            txns.setdefault((pid, generation), []).append((tp, first, last))
    for txn in txns.values():
        inside = [last is not None and last < stops[tp] for tp, _first, last in txn]
        outside = [first >= stops[tp] for tp, first, _last in txn]
        assert all(inside) or all(outside), (txn, stops)

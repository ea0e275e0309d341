"""The sequencer as a pure function: state in, overlays out, inputs untouched."""

from __future__ import annotations

import time
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from metadata.model import AppendResult, IndexEntry, ObjectType
from metadata.sequencer import BatchSequence, Head, ProducerState, involved, last_sequence, sequence

from .helpers import append, commit

T = uuid.UUID(int=1)
U = uuid.UUID(int=2)
WAL = ObjectType.WAL


def test_last_sequence_wraps():
    assert last_sequence(0, 1) == 0
    assert last_sequence(10, 5) == 14
    assert last_sequence(2**31 - 1, 1) == 2**31 - 1
    assert last_sequence(2**31 - 1, 2) == 0
    assert last_sequence(2**31 - 3, 10) == 6


def test_offsets_continue_from_the_heads_and_keep_the_log_start():
    heads = {(T, 0): Head(100, 40), (T, 1): Head(7)}
    out = sequence(commit(append(T, 0, 0, 10, 3), append(T, 0, 10, 10, 2), append(T, 1, 20, 10, 1), key="k"), heads, {})
    assert out.results == [AppendResult(0, 100, 40), AppendResult(0, 103, 40), AppendResult(0, 7, 0)]
    assert out.heads == {(T, 0): 105, (T, 1): 8}
    assert out.entries == {(T, 0): [IndexEntry(100, 104, "k", WAL, 0, 20, 0)], (T, 1): [IndexEntry(7, 7, "k", WAL, 20, 10, 0)]}
    assert out.producers == {}
    assert out.changed
    assert heads == {(T, 0): Head(100, 40), (T, 1): Head(7)}


def test_byte_gap_between_appends_of_a_partition_splits_the_entry():
    out = sequence(commit(append(T, 0, 0, 10, 1, max_ts=9), append(T, 0, 15, 5, 1, max_ts=3), key="k"), {(T, 0): Head(0)}, {})
    assert out.entries == {(T, 0): [IndexEntry(0, 0, "k", WAL, 0, 10, 9), IndexEntry(1, 1, "k", WAL, 15, 5, 3)]}


def test_unknown_partition_closes_the_run():
    out = sequence(commit(append(T, 0, 0, 10, 1), append(U, 0, 10, 10, 1), append(T, 0, 10, 10, 1), key="k"), {(T, 0): Head(0)}, {})
    assert out.results == [AppendResult(0, 0, 0), AppendResult(ErrorCode.unknown_topic_or_partition, -1, 0), AppendResult(0, 1, 0)]
    assert out.entries == {(T, 0): [IndexEntry(0, 0, "k", WAL, 0, 10, 0), IndexEntry(1, 1, "k", WAL, 10, 10, 0)]}


def test_nothing_stored_changes_nothing():
    state = ProducerState(0, (BatchSequence(0, 4, 0),))
    out = sequence(commit(append(T, 0, 0, 10, 5, pid=1, epoch=0, seq=0), append(T, 1, 0, 10, 1)), {(T, 0): Head(5)}, {(1, T, 0): state})
    assert out.results == [AppendResult(0, 0, 0, duplicate=True), AppendResult(ErrorCode.unknown_topic_or_partition)]
    assert (out.heads, out.entries, out.producers, out.changed) == ({}, {}, {}, False)


def test_producer_state_keeps_the_last_five_batches():
    state = ProducerState(3, tuple(BatchSequence(s, s, s) for s in range(5)))
    out = sequence(commit(append(T, 0, 0, 10, 2, pid=9, epoch=3, seq=5)), {(T, 0): Head(5)}, {(9, T, 0): state})
    assert out.producers == {(9, T, 0): ProducerState(3, (*(BatchSequence(s, s, s) for s in range(1, 5)), BatchSequence(5, 6, 5)))}
    assert state.batches == tuple(BatchSequence(s, s, s) for s in range(5))  # the input is not mutated


def test_new_epoch_resets_the_producer_state():
    state = ProducerState(3, (BatchSequence(0, 9, 0),))
    out = sequence(commit(append(T, 0, 0, 10, 2, pid=9, epoch=4, seq=0)), {(T, 0): Head(10)}, {(9, T, 0): state})
    assert out.producers == {(9, T, 0): ProducerState(4, (BatchSequence(0, 1, 10),))}


def test_first_batch_of_an_unknown_producer_creates_its_state():
    out = sequence(commit(append(T, 0, 0, 10, 3, pid=9, epoch=0, seq=77)), {(T, 0): Head(4)}, {})
    assert out.producers == {(9, T, 0): ProducerState(0, (BatchSequence(77, 79, 4),))}


def test_refusals_answer_with_the_log_start():
    state = ProducerState(3, (BatchSequence(0, 9, 0),))
    out = sequence(
        commit(append(T, 0, 0, 10, 1, pid=9, epoch=2, seq=10), append(T, 0, 10, 10, 1, pid=9, epoch=3, seq=11)),
        {(T, 0): Head(10, 4)},
        {(9, T, 0): state},
    )
    assert out.results == [AppendResult(ErrorCode.invalid_producer_epoch, -1, 4), AppendResult(ErrorCode.out_of_order_sequence_number, -1, 4)]


def test_involved_names_what_sequence_reads():
    c = commit(append(T, 0, 0, 1, 1), append(T, 0, 1, 1, 1, pid=4, epoch=0, seq=0), append(U, 3, 2, 1, 1, pid=4, epoch=0, seq=0), append(U, 3, 3, 1, 1, pid=5, epoch=0, seq=0))
    assert involved(c) == ({(T, 0), (U, 3)}, {(4, T, 0), (4, U, 3), (5, U, 3)})


def cpu_seconds(*fns, runs: int = 10) -> list[float]:
    """Each function's best run in this thread's CPU time, the functions taking turns so that a
    busy machine weighs on all of them alike."""
    best = [float("inf")] * len(fns)
    for _ in range(runs):
        for i, fn in enumerate(fns):
            began = time.thread_time()
            fn()
            best[i] = min(best[i], time.thread_time() - began)
    return best


def test_a_thousand_partitions_sequence_in_one_commit():
    # How fast is the benchmark's question (bench partitions: broker CPU per GiB at 10,000
    # partitions), not a timed test's; this one checks the answers.
    topics = [uuid.uuid4() for _ in range(10)]
    heads = {(t, p): Head(1000 * p) for t in topics for p in range(100)}
    producers = {(p, t, p): ProducerState(0, (BatchSequence(0, 9, 0),)) for t in topics for p in range(100)}
    c = commit(*(append(t, p, i * 100, 100, 10, max_ts=i, pid=p, epoch=0, seq=10) for i, (t, p) in enumerate(heads)))
    out = sequence(c, heads, producers)
    assert [(r.error_code, r.base_offset) for r in out.results] == [(0, 1000 * p) for _, p in heads]
    assert out.heads == {tp: 1000 * tp[1] + 10 for tp in heads}
    assert {k: s.batches[-1] for k, s in out.producers.items()} == {(p, t, p): BatchSequence(10, 19, 1000 * p) for t, p in heads}


def test_sequencing_cost_does_not_grow_with_the_state():
    small = {(T, p): Head(p) for p in range(100)}
    large = {**{(uuid.uuid4(), 0): Head(0) for _ in range(100_000)}, **small}
    c = commit(*(append(T, p, 10 * p, 10, 1) for p in range(20)))
    assert sequence(c, large, {}).results == sequence(c, small, {}).results
    on_small, on_large = cpu_seconds(lambda: sequence(c, small, {}), lambda: sequence(c, large, {}))
    assert on_large < 5 * on_small, f"{on_large * 1e6:.0f} us against 100k partitions, {on_small * 1e6:.0f} us against 100"


# -- properties -------------------------------------------------------------------------------------------

appends_strategy = st.lists(
    st.tuples(
        st.integers(0, 2),  # partition (2 is unknown)
        st.integers(1, 5),  # record count
        st.sampled_from([-1, 1, 2]),  # producer id
        st.integers(0, 1),  # epoch
        st.integers(0, 12),  # base sequence
    ),
    max_size=30,
).map(lambda xs: sorted(xs, key=lambda x: x[0]))  # a partition's appends are adjacent in an object


@settings(max_examples=200, deadline=None)
@given(appends_strategy)
def test_stored_appends_tile_offsets_and_entries(specs):
    heads = {(T, 0): Head(10), (T, 1): Head(0)}
    appends = [append(T, p, 8 * i, 8, n, pid=pid, epoch=e, seq=s) for i, (p, n, pid, e, s) in enumerate(specs)]
    out = sequence(commit(*appends, key="k"), heads, {})
    assert len(out.results) == len(appends)
    for p in (0, 1):
        stored = [(r.base_offset, a) for r, a in zip(out.results, appends, strict=True) if r.error_code == 0 and not r.duplicate and a.partition == p]
        # Stored appends take consecutive offsets from the head, in object order.
        expected = heads[(T, p)].next_offset
        for base, a in stored:
            assert base == expected
            expected += a.record_count
        assert out.heads.get((T, p), heads[(T, p)].next_offset) == expected
        # The entries cover exactly those offsets and exactly their bytes.
        entries = out.entries.get((T, p), [])
        assert [o for e in entries for o in range(e.base_offset, e.last_offset + 1)] == list(range(heads[(T, p)].next_offset, expected))
        assert sum(e.size for e in entries) == 8 * len(stored)
    for r, a in zip(out.results, appends, strict=True):
        if a.partition == 2:
            assert r == AppendResult(ErrorCode.unknown_topic_or_partition)
        elif r.duplicate:
            assert r.error_code == 0 and a.producer_id >= 0

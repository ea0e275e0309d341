"""Contract: `producer_states`, the read DescribeProducers answers from, on every backend
(fixtures from conftest.py: `store` per backend, `open_store` for durable ones)."""

from __future__ import annotations

import uuid

from metadata.sequencer import BatchSequence, ProducerState

from .helpers import append, commit


async def _write(store) -> uuid.UUID:
    t = (await store.create_topic("idem", 2)).topic_id
    await store.commit(commit(append(t, 0, 0, 10, 5, pid=7, epoch=0, seq=0), append(t, 1, 10, 10, 1, pid=7, epoch=0, seq=0)))  # p0: 0..4
    await store.commit(commit(append(t, 0, 0, 10, 2, pid=7, epoch=0, seq=5)))  # p0: 5..6
    await store.commit(commit(append(t, 0, 0, 10, 3, pid=9, epoch=2, seq=0)))  # p0: 7..9
    await store.commit(commit(append(t, 0, 0, 10, 1, pid=9, epoch=2, seq=7)))  # out of order: refused, no change
    await store.commit(commit(append(t, 0, 0, 10, 4)))  # not idempotent: no producer state
    return t


EXPECTED_P0 = {
    7: ProducerState(0, (BatchSequence(0, 4, 0), BatchSequence(5, 6, 5))),
    9: ProducerState(2, (BatchSequence(0, 2, 7),)),
}


async def test_producer_states_per_partition(store):
    t = await _write(store)
    assert store.producer_states(t, 0) == EXPECTED_P0
    assert store.producer_states(t, 1) == {7: ProducerState(0, (BatchSequence(0, 0, 0),))}
    assert store.producer_states(t, 2) == {}
    assert store.producer_states(uuid.uuid4(), 0) == {}


async def test_producer_states_survive_a_restart(open_store):
    store = await open_store()
    t = await _write(store)
    await store.close()
    reopened = await open_store()
    assert reopened.producer_states(t, 0) == EXPECTED_P0

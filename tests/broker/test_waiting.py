"""broker.waiting.wait_all: returns when every future is done, or at the deadline (at most one
50 ms slot late) with the rest left pending and uncancelled; never raises the futures' errors."""

from __future__ import annotations

import asyncio

import pytest

from broker.waiting import SLOT_S, wait_all


async def test_returns_when_all_are_done():
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(3)]
    waiting = asyncio.ensure_future(wait_all(futures, 30))
    for i, f in enumerate(futures):
        await asyncio.sleep(0)
        assert not waiting.done()
        if i == 1:
            f.set_exception(ValueError("stored nothing"))
        else:
            f.set_result(i)
    await asyncio.wait_for(waiting, 1)
    assert [f.result() for f in (futures[0], futures[2])] == [0, 2]


async def test_already_done_futures_return_at_once():
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    done.set_result(7)
    await asyncio.wait_for(wait_all([done], 30), 0.5)
    await asyncio.wait_for(wait_all([], 30), 0.5)


async def test_deadline_leaves_the_rest_pending():
    loop = asyncio.get_running_loop()
    finished, pending = loop.create_future(), loop.create_future()
    finished.set_result(1)
    started = loop.time()
    await wait_all([finished, pending], 0.1)
    waited = loop.time() - started
    assert 0.1 - 0.01 <= waited <= 0.1 + SLOT_S + 0.5
    assert not pending.done()
    pending.set_result(2)  # its callback outlives nothing: no error when it completes later
    await asyncio.sleep(0)


async def test_waiters_share_one_timer_per_slot(monkeypatch):
    loop = asyncio.get_running_loop()
    timers = []
    original = loop.call_at
    monkeypatch.setattr(loop, "call_at", lambda when, cb, *args, **kw: timers.append(when) or original(when, cb, *args, **kw))
    futures = [loop.create_future() for _ in range(50)]
    waiting = [asyncio.ensure_future(wait_all([f], 30)) for f in futures]
    await asyncio.sleep(0)
    assert 1 <= len(timers) <= 2  # the 50 deadlines fall in one slot, or straddle two
    for f in futures:
        f.set_result(None)
    await asyncio.wait_for(asyncio.gather(*waiting), 1)


@pytest.mark.parametrize("timeout", [0.0, 0.001])
async def test_tiny_timeouts_expire(timeout):
    loop = asyncio.get_running_loop()
    await asyncio.wait_for(wait_all([loop.create_future()], timeout), SLOT_S + 0.5)

"""broker.waiting.call_when_done: calls back once, when every future is done or at the deadline (at
most one 50 ms slot late) with the rest left pending and uncancelled; never looks at the futures'
errors; cancelled, never calls back."""

from __future__ import annotations

import asyncio

import pytest

from broker.waiting import SLOT_S, call_when_done


class Calls:
    """A callback that counts its calls and lets a test await the first."""

    def __init__(self) -> None:
        self.count = 0
        self.called = asyncio.get_running_loop().create_future()

    def __call__(self) -> None:
        self.count += 1
        if not self.called.done():
            self.called.set_result(asyncio.get_running_loop().time())


async def test_calls_back_once_when_all_are_done():
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(3)]
    calls = Calls()
    call_when_done(futures, 30, calls)
    for i, f in enumerate(futures):
        await asyncio.sleep(0)
        assert calls.count == 0
        if i == 1:
            f.set_exception(ValueError("stored nothing"))
        else:
            f.set_result(i)
    await asyncio.wait_for(calls.called, 1)
    assert [f.result() for f in (futures[0], futures[2])] == [0, 2]
    assert isinstance(futures[1].exception(), ValueError)
    assert calls.count == 1


async def test_already_done_futures_call_back_at_once():
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    done.set_result(7)
    for futures in ([done], []):
        calls = Calls()
        assert call_when_done(futures, 30, calls) is None
        assert calls.count == 1  # before returning


async def test_deadline_calls_back_and_leaves_the_rest_pending():
    loop = asyncio.get_running_loop()
    finished, pending = loop.create_future(), loop.create_future()
    finished.set_result(1)
    calls = Calls()
    started = loop.time()
    call_when_done([finished, pending], 0.1, calls)
    waited = await asyncio.wait_for(calls.called, 5) - started
    assert 0.1 - 0.01 <= waited <= 0.1 + SLOT_S + 0.5
    assert not pending.done()
    pending.set_result(2)  # its callback was removed: no second call
    await asyncio.sleep(0)
    assert calls.count == 1


async def test_a_cancelled_wait_never_calls_back():
    loop = asyncio.get_running_loop()
    futures = [loop.create_future(), loop.create_future()]
    calls = Calls()
    wait = call_when_done(futures, 0.01, calls)
    wait.cancel()
    futures[0].set_result(None)
    futures[1].set_result(None)
    await asyncio.sleep(SLOT_S * 2)  # past its deadline too
    assert calls.count == 0


async def test_waits_share_one_timer_per_slot(monkeypatch):
    loop = asyncio.get_running_loop()
    timers = []
    original = loop.call_at
    monkeypatch.setattr(loop, "call_at", lambda when, cb, *args, **kw: timers.append(when) or original(when, cb, *args, **kw))
    futures = [loop.create_future() for _ in range(50)]
    calls = [Calls() for _ in futures]
    for f, c in zip(futures, calls):
        call_when_done([f], 30, c)
    assert 1 <= len(timers) <= 2  # the 50 deadlines fall in one slot, or straddle two
    for f in futures:
        f.set_result(None)
    await asyncio.wait_for(asyncio.gather(*(c.called for c in calls)), 1)
    assert [c.count for c in calls] == [1] * 50


@pytest.mark.parametrize("timeout", [0.0, 0.001])
async def test_tiny_timeouts_expire(timeout):
    loop = asyncio.get_running_loop()
    calls = Calls()
    call_when_done([loop.create_future()], timeout, calls)
    await asyncio.wait_for(calls.called, SLOT_S + 0.5)

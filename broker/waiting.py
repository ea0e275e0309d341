"""Waiting for a request's futures with a timeout, cheaply enough to do thousands of times a second.

A produce request waits until its partitions' WAL object is stored and committed, or until its
timeout. asyncio.wait does that with a loop timer, a set and a callback per call: about 17 µs
per request under uvloop, which was 15% of the broker's CPU at 10,000 partitions (librdkafka
sends one partition per request). Here requests whose deadlines fall in the same 50 ms slot share
one loop timer, so a request costs one callback per future it waits for and a set insertion, and
no task: the Produce handler answers from the callback. A deadline is met up to one slot late.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Callable, Sequence

SLOT_S = 0.05


class Wait:
    """One call_when_done: calls back once, when its futures are all done or at its deadline."""

    __slots__ = ("futures", "remaining", "callback", "slot")

    def __init__(self, futures: list[asyncio.Future], callback: Callable[[], None]) -> None:
        self.futures = futures
        self.remaining = len(futures)
        self.callback: Callable[[], None] | None = callback
        self.slot: set[Wait] | None = None

    def _one_done(self, _: asyncio.Future) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            self._fire()

    def _fire(self) -> None:
        callback = self.callback
        if callback is None:
            return
        self.cancel()
        callback()

    def cancel(self) -> None:
        """Never call back (the futures are left as they are)."""
        self.callback = None
        if self.slot is not None:
            self.slot.discard(self)
            self.slot = None
        if self.remaining:  # the futures need not call back any more
            for f in self.futures:
                f.remove_done_callback(self._one_done)
            self.remaining = 0


class _Deadlines:
    """The pending waits of one event loop, by the slot their deadline falls in."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.slots: dict[int, set[Wait]] = {}

    def add(self, wait: Wait, timeout: float) -> None:
        slot = math.ceil((self.loop.time() + timeout) / SLOT_S)
        waits = self.slots.get(slot)
        if waits is None:
            waits = self.slots[slot] = set()
            self.loop.call_at(slot * SLOT_S, self._expire, slot)
        waits.add(wait)
        wait.slot = waits

    def _expire(self, slot: int) -> None:
        for wait in tuple(self.slots.pop(slot, ())):
            wait._fire()


_deadlines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deadlines] = weakref.WeakKeyDictionary()


def call_when_done(futures: Sequence[asyncio.Future], timeout: float, callback: Callable[[], None]) -> Wait | None:
    """Call `callback()` once every future is done or `timeout` seconds (plus at most one slot)
    have passed, whichever comes first: at once if they are all done already (then None is
    returned), else from a future's done-callback or the deadline's timer. Like asyncio.wait,
    never looks at the futures' results or exceptions and never cancels them: the callback reads
    which are done."""
    pending = [f for f in futures if not f.done()]
    if not pending:
        callback()
        return None
    loop = asyncio.get_running_loop()
    deadlines = _deadlines.get(loop)
    if deadlines is None:
        deadlines = _deadlines[loop] = _Deadlines(loop)
    wait = Wait(pending, callback)
    for f in pending:
        f.add_done_callback(wait._one_done)
    deadlines.add(wait, timeout)
    return wait

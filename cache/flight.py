"""Single flight: concurrent calls for the same key share one run of the work and its outcome
(a GET that many readers miss at once is made once)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any


class SingleFlight:
    def __init__(self) -> None:
        self._inflight: dict[Hashable, asyncio.Future] = {}

    async def run(self, key: Hashable, work: Callable[[], Awaitable[Any]]) -> Any:
        """`work()`'s result, or that of the run under way for `key`. A caller cancelled while
        waiting for another's run leaves that run going (shielded)."""
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        return await self._lead(self._take((key,)), (key,), work)

    def start_many(self, keys: Sequence[Hashable], work: Callable[[], Awaitable[Any]]) -> asyncio.Task:
        """Starts `work()` (one GET reading several chunks) as a task whose result every `run` of
        any of `keys` shares while it runs; the keys are taken now, before any other coroutine
        runs. None of them may be under way: ask `in` first."""
        return asyncio.ensure_future(self._lead(self._take(keys), keys, work))

    def _take(self, keys: Sequence[Hashable]) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        for key in keys:
            self._inflight[key] = fut
        return fut

    async def _lead(self, fut: asyncio.Future, keys: Sequence[Hashable], work: Callable[[], Awaitable[Any]]) -> Any:
        try:
            result = await work()
            fut.set_result(result)
            return result
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: nobody else may be waiting
            raise
        finally:
            for key in keys:
                del self._inflight[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._inflight

"""Single flight: concurrent calls for the same key share one run of the work and its outcome
(a GET that many readers miss at once is made once)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
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
        fut = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            result = await work()
            fut.set_result(result)
            return result
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: nobody else may be waiting
            raise
        finally:
            del self._inflight[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._inflight

"""Reads byte ranges of objects for fetches: from the recent-objects cache when it has them, else
from the object store, with concurrent reads of the same range sharing one GET (single flight)."""

from __future__ import annotations

import asyncio

from wal.store import ObjectStore

from .recent import RecentObjects


class ObjectReader:
    def __init__(self, store: ObjectStore, recent: RecentObjects) -> None:
        self.store = store
        self.recent = recent
        self._inflight: dict[tuple[str, int, int], asyncio.Future] = {}

    async def read(self, key: str, start: int, size: int) -> bytes | memoryview:
        end = start + size
        cached = self.recent.get(key, start, end)
        if cached is not None:
            return cached
        slot = (key, start, end)
        pending = self._inflight.get(slot)
        if pending is not None:
            return await asyncio.shield(pending)
        fut = asyncio.get_running_loop().create_future()
        self._inflight[slot] = fut
        try:
            data = await self.store.get(key, start, end)
            fut.set_result(data)
            return data
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()
            raise
        finally:
            del self._inflight[slot]

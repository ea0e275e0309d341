"""A stand-in for the compactor, for `python -m bench cost --compact-every S`: while a load runs,
it keeps each partition's index short with the metadata store's real range replace
(`MetadataStore.replace_entries`), as the compactor (issue 21) and table maintenance will: every S
seconds all but the newest two entries of each partition, the previous cycle's entry included,
become one PARQUET entry (no Parquet is written: only the index is exercised). It samples the
metadata store as it goes, so the cost scenario can show whether etcd's keys and bytes per GiB
stay flat as history grows."""

from __future__ import annotations

import asyncio
import threading
import time

from metadata.model import IndexEntry, ObjectType
from metadata.store import load_metadata_store

from .stats import GiB

KEEP_NEWEST = 2  # entries left to the WAL: what the compactor's freshness window would still hold


class StandInCompactor:
    def __init__(self, metadata_url: str, every_s: float, record_bytes: int) -> None:
        self.metadata_url, self.every_s, self.record_bytes = metadata_url, every_s, record_bytes
        self.samples: list[dict] = []  # one per cycle: elapsed s, GiB produced, live keys and bytes, entries
        self.replaced = self.lost = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="standin-compactor", daemon=True)

    def start(self) -> StandInCompactor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        if self.error is not None:
            raise RuntimeError(f"the stand-in compactor failed: {self.error!r}") from self.error

    async def _run(self) -> None:
        store = load_metadata_store(self.metadata_url)
        await store.start()
        started = time.monotonic()
        try:
            while not self._stop.is_set():
                await asyncio.sleep(self.every_s)
                await self._cycle(store, len(self.samples))
                self.samples.append({"elapsed_s": round(time.monotonic() - started, 1), **await self._sample(store)})
        except BaseException as e:  # reported by stop()
            self.error = e
        finally:
            await store.close()

    async def _cycle(self, store, n: int) -> None:
        for info in list(store.topics().values()):
            for p in range(info.partitions):
                entries = store.entries(info.topic_id, p, 0, max_entries=1_000_000)
                replaced = entries[:-KEEP_NEWEST]
                if len(replaced) < 2:
                    continue
                first, last = replaced[0], replaced[-1]
                entry = IndexEntry(first.base_offset, last.last_offset, f"standin/{info.topic_id.hex}/{p}/{n:06d}.parquet", ObjectType.PARQUET, 0, last.last_offset - first.base_offset + 1, max(e.max_timestamp for e in replaced))
                if await store.replace_entries(info.topic_id, p, replaced, entry):
                    self.replaced += len(replaced)
                else:
                    self.lost += 1

    async def _sample(self, store) -> dict:
        """The metadata under the store's root (live keys, their keys' and values' bytes), the
        index entries the view holds, and GiB produced so far (every partition's high watermark)."""
        kvs = await store._client.get_prefix(store.keys.prefix())
        records = entries = 0
        for info in list(store.topics().values()):
            for p in range(info.partitions):
                records += store.high_watermark(info.topic_id, p)
                entries += len(store.entries(info.topic_id, p, 0, max_entries=1_000_000))
        keys = sum(1 for _ in kvs)
        return {
            "gib_produced": round(records * self.record_bytes / GiB, 3),
            "keys": keys,
            "key_value_bytes": sum(len(kv.key) + len(kv.value) for kv in kvs),
            "wal_index_records": sum(1 for kv in kvs if kv.key.startswith(store.keys.prefix("wal-index/"))),
            "index_entries": entries,
        }

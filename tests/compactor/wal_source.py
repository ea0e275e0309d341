"""Test helper: what a stopped `neve dev` node stored for a topic, read back through its offset
index and object store the way the compactor reads it (entry by entry, WAL byte ranges)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from compactor.rows.records import Batch, decode_range
from metadata.embedded import EmbeddedMetadataStore
from metadata.model import IndexEntry, ObjectType
from wal.store import FileObjectStore


async def _read(data_dir: Path, topic: str) -> dict[int, list[tuple[IndexEntry, bytes]]]:
    meta = EmbeddedMetadataStore(str(data_dir / "metadata.db"))
    await meta.start()
    store = FileObjectStore(str(data_dir / "objects"))
    try:
        info = meta.topics()[topic]
        out: dict[int, list[tuple[IndexEntry, bytes]]] = {}
        for partition in range(info.partitions):
            entries: list[IndexEntry] = []
            while batch := meta.entries(info.topic_id, partition, entries[-1].last_offset + 1 if entries else 0, 1000):
                entries += batch
            out[partition] = [(e, await store.get(e.object_key, e.start, e.start + e.size)) for e in entries if e.object_type == ObjectType.WAL]
        return out
    finally:
        await store.close()
        await meta.close()


def wal_ranges(data_dir: Path, topic: str) -> dict[int, list[tuple[IndexEntry, bytes]]]:
    """Per partition, each WAL index entry with the bytes of its range."""
    return asyncio.run(_read(data_dir, topic))


def decoded(data_dir: Path, topic: str) -> dict[int, list[Batch]]:
    """Per partition, every stored batch decoded, entry after entry."""
    return {p: [b for entry, data in ranges for b in decode_range(data, entry.base_offset)] for p, ranges in wal_ranges(data_dir, topic).items()}

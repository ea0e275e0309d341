"""The per-zone distributed cache: objects are read in fixed-size aligned chunks, and each chunk
has one owner among the zone's live brokers (rendezvous hashing: a broker joining or leaving
moves only its own share). The owner reads a chunk from the object store once (concurrent misses
share one GET), keeps it in a byte-bounded LRU and serves it to the zone's other brokers over the
chunk protocol (cache/peers.py); they keep nothing of it, so a zone holds each chunk once.

A peer that cannot be reached is left out of ownership for a while (its chunks go to the next
owner in rendezvous order, who owns them anyway once the peer's registration expires); a peer
that misses its deadline or fails twice makes the reader read the object store directly,
counted. Brokers of other zones are never asked: the members given are the reader's own zone's."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wal.store import ObjectStore

from . import metrics
from .flight import SingleFlight
from .peers import PeerClient, PeerError, PeerTimeout
from .recent import RecentObjects

log = logging.getLogger("neve.cache.chunks")


@dataclass(frozen=True, slots=True)
class Member:
    """A broker of this zone, where its chunk server listens."""

    node_id: int
    host: str
    port: int


def score(node_id: int, key: str, chunk_start: int) -> int:
    digest = hashlib.blake2b(f"{node_id}\0{chunk_start}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner_of(key: str, chunk_start: int, members: Sequence[Member]) -> Member | None:
    """The member owning the chunk of `key` at `chunk_start`: the highest score (None without members)."""
    return max(members, key=lambda m: score(m.node_id, key, chunk_start), default=None)


class ChunkLRU:
    """Chunks by (key, chunk start, chunk size), at most `max_bytes` of them, least recently used evicted."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._chunks: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self.size = 0

    def get(self, slot: tuple[str, int, int]) -> bytes | None:
        data = self._chunks.get(slot)
        if data is not None:
            self._chunks.move_to_end(slot)
        return data

    def put(self, slot: tuple[str, int, int], data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        old = self._chunks.pop(slot, None)
        if old is not None:
            self.size -= len(old)
        self._chunks[slot] = data
        self.size += len(data)
        while self.size > self.max_bytes:
            _, evicted = self._chunks.popitem(last=False)
            self.size -= len(evicted)

    def __len__(self) -> int:
        return len(self._chunks)


class ZoneChunks:
    """Reads byte ranges of objects through the zone's chunk owners. `members()` gives the zone's
    live brokers (this one included or not: it is added); `node_id` is this broker's."""

    def __init__(
        self,
        store: ObjectStore,
        recent: RecentObjects,
        *,
        node_id: int,
        members: Callable[[], Sequence[Member]],
        chunk_bytes: int = 4 * 1024 * 1024,
        memory_bytes: int = 256 * 1024 * 1024,
        peer_timeout_s: float = 2.0,
        peer_retry_s: float = 5.0,
        on_get: Callable[[int], None] | None = None,
        member: bool = True,
    ) -> None:
        """`member`: this process owns chunks too (a broker); False for a reader beside the zone's
        brokers that only asks them (`neve compactor`), reading the store itself only when none
        answers."""
        self.member = member
        self.store = store
        self.recent = recent
        self.node_id = node_id
        self._members = members
        self.chunk_bytes = chunk_bytes
        self.lru = ChunkLRU(memory_bytes)
        self.peer_timeout_s = peer_timeout_s
        self.peer_retry_s = peer_retry_s
        self._on_get = on_get
        self._loading = SingleFlight()
        self._clients: dict[tuple[str, int], PeerClient] = {}
        self._down: dict[int, float] = {}  # node id -> until when it is left out of ownership

    # -- reading -------------------------------------------------------------------------------

    async def get(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes [start, end) of `key` (cut at its end), through the chunks covering them."""
        size = self.chunk_bytes
        first = start - start % size
        if end <= first + size:
            return await self._read(key, first, start, end)
        parts = await asyncio.gather(*(self._read(key, c, max(start, c), min(end, c + size)) for c in range(first, end, size)))
        return b"".join(parts)

    async def _read(self, key: str, chunk_start: int, start: int, end: int) -> bytes | memoryview:
        size = self.chunk_bytes
        slot = (key, chunk_start, size)
        held = self.lru.get(slot)
        if held is not None:
            metrics.CHUNK_HIT.inc()
            return memoryview(held)[start - chunk_start : end - chunk_start]
        asked: set[int] = set()
        while True:
            owner = self._owner(key, chunk_start, asked)
            if owner is None or owner.node_id == self.node_id:
                metrics.CHUNK_MISS.inc()
                data, _ = await self._load(slot)
                return memoryview(data)[start - chunk_start : end - chunk_start]
            try:
                data, was_held = await self._client(owner).get(key, chunk_start, size, start - chunk_start, end - chunk_start, self.peer_timeout_s)
            except PeerTimeout as e:
                self._failed(owner, "timeout", e)
                return await self._direct(key, start, end)
            except PeerError as e:
                self._failed(owner, "unreachable", e)
                asked.add(owner.node_id)
                if len(asked) > 1:  # the next owner failed too: no more asking around
                    return await self._direct(key, start, end)
                continue
            (metrics.PEER_HIT if was_held else metrics.PEER_MISS).inc()
            metrics.PEER_BYTES_IN.inc(len(data))
            return data

    def _owner(self, key: str, chunk_start: int, asked: set[int]) -> Member | None:
        now = time.monotonic()
        candidates = [m for m in self._members() if m.node_id not in asked and self._down.get(m.node_id, 0) <= now]
        if self.member and not any(m.node_id == self.node_id for m in candidates):
            candidates.append(Member(self.node_id, "", 0))
        return owner_of(key, chunk_start, candidates)

    def _failed(self, owner: Member, reason: str, error: Exception) -> None:
        metrics.PEER_FAILURES.labels(reason).inc()
        if self._down.get(owner.node_id, 0) <= time.monotonic():
            log.warning("chunk_owner_failed", extra={"owner": owner.node_id, "address": f"{owner.host}:{owner.port}", "reason": reason, "error": str(error)})
        self._down[owner.node_id] = time.monotonic() + self.peer_retry_s

    async def _direct(self, key: str, start: int, end: int) -> bytes:
        metrics.DIRECT_READS.inc()
        data = await self.store.get(key, start, end)
        if self._on_get is not None:
            self._on_get(len(data))
        return data

    def _client(self, member: Member) -> PeerClient:
        client = self._clients.get((member.host, member.port))
        if client is None:
            client = self._clients[(member.host, member.port)] = PeerClient(member.host, member.port, self.chunk_bytes)
        return client

    # -- owning --------------------------------------------------------------------------------

    async def _load(self, slot: tuple[str, int, int]) -> tuple[bytes, bool]:
        """The chunk (and whether it was held): from the LRU, else from the writer's recent
        objects, else one GET shared by every concurrent miss, then kept."""
        held = self.lru.get(slot)
        if held is not None:
            return held, True
        return await self._loading.run(slot, lambda: self._fetch(slot)), False

    async def _fetch(self, slot: tuple[str, int, int]) -> bytes:
        key, chunk_start, size = slot
        if self.recent.has(key):  # the writer itself owns it: no GET, and the recent cache holds it already
            return bytes(self.recent.get(key, chunk_start, chunk_start + size))
        data = await self.store.get(key, chunk_start, chunk_start + size)
        if self._on_get is not None:
            self._on_get(len(data))
        self.lru.put(slot, data)
        metrics.CHUNK_BYTES.set(self.lru.size)
        return data

    async def serve(self, key: str, chunk_start: int, chunk_size: int, lo: int, hi: int) -> tuple[bytes | memoryview, bool]:
        """For the chunk server: bytes [lo, hi) of a chunk a peer asked for, and whether it was held."""
        data, held = await self._load((key, chunk_start, chunk_size))
        return memoryview(data)[lo:hi], held

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._clients.values()), return_exceptions=True)
        self._clients.clear()

"""The per-zone distributed cache: objects are read in fixed-size aligned chunks, and each chunk
has one owner among the zone's live brokers (rendezvous hashing: a broker joining or leaving
moves only its own share). The owner reads a chunk from the object store once (concurrent misses
share one GET), keeps it in a byte-bounded LRU and serves it to the zone's other brokers over the
chunk protocol (cache/peers.py); they keep nothing of it, so a zone holds each chunk once.
Consecutive chunks a read needs that their owner lacks are read with one GET and held as views
of its bytes: a range across them is served as a view, not joined (a 4 MiB join costs the broker
as much CPU as the GET that read it).

A peer that cannot be reached is left out of ownership for a while (its chunks go to the next
owner in rendezvous order, who owns them anyway once the peer's registration expires); a peer
that misses its deadline or fails twice makes the reader read the object store directly,
counted. Brokers of other zones are never asked: the members given are the reader's own zone's."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wal.store import ObjectStore

from . import metrics
from .flight import SingleFlight
from .peers import PeerClient, PeerError, PeerRefused, PeerTimeout
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


RUN_BYTES = 16 * 1024 * 1024
"""At most this many bytes of consecutive chunks are read with one GET (and a quarter of the LRU's
memory at most). Runs of 64 MiB cost the broker more CPU than the joins they save (each buffer
mapped and faulted in afresh: glibc's mmap threshold stops at 32 MiB)."""

Held = tuple[bytes, int]
"""The bytes of one GET and the object offset of its first byte: a chunk is held as its part of
the GET that read it (one GET may read several chunks of an object)."""


def chunk_view(held: Held, chunk_start: int, size: int) -> memoryview:
    buffer, buffer_start = held
    return memoryview(buffer)[chunk_start - buffer_start : chunk_start - buffer_start + size]


class ChunkLRU:
    """Chunks by (key, chunk start, chunk size), least recently used evicted. Memory is counted
    per GET's buffer, whole while any chunk of it is held, and kept within `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._chunks: OrderedDict[tuple[str, int, int], Held] = OrderedDict()
        self._buffers: dict[int, list[int]] = {}  # id(buffer) -> [its chunks held, its size]
        self.size = 0

    def held(self, slot: tuple[str, int, int]) -> Held | None:
        found = self._chunks.get(slot)
        if found is not None:
            self._chunks.move_to_end(slot)
        return found

    def get(self, slot: tuple[str, int, int]) -> memoryview | None:
        found = self.held(slot)
        return None if found is None else chunk_view(found, slot[1], slot[2])

    def put(self, slot: tuple[str, int, int], data: bytes) -> None:
        self.put_many([slot], data, slot[1])

    def put_many(self, slots: list[tuple[str, int, int]], buffer: bytes, buffer_start: int) -> None:
        """Hold each of `slots` as its part of `buffer` (the object's bytes from `buffer_start`)."""
        if len(buffer) > self.max_bytes:
            return
        for slot in slots:
            self._release(self._chunks.pop(slot, None))
            self._chunks[slot] = (buffer, buffer_start)
            counted = self._buffers.setdefault(id(buffer), [0, len(buffer)])
            if not counted[0]:
                self.size += len(buffer)
            counted[0] += 1
        while self.size > self.max_bytes:
            self._release(self._chunks.popitem(last=False)[1])

    def _release(self, held: Held | None) -> None:
        if held is None:
            return
        counted = self._buffers[id(held[0])]
        counted[0] -= 1
        if not counted[0]:
            del self._buffers[id(held[0])]
            self.size -= counted[1]

    def __len__(self) -> int:
        return len(self._chunks)

    def __contains__(self, slot: tuple[str, int, int]) -> bool:
        return slot in self._chunks


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
        peer_secret: bytes | None = None,
        peer_tls: ssl.SSLContext | None = None,
    ) -> None:
        """`member`: this process owns chunks too (a broker); False for a reader beside the zone's
        brokers that only asks them (`neve compactor`), reading the store itself only when none
        answers. `peer_secret`: the deployment's chunk-port secret (peerauth.py), proved to
        every peer asked; `peer_tls`: the client context of the chunk port's mutual TLS."""
        self._peer_secret = peer_secret
        self._peer_tls = peer_tls
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

    async def get(self, key: str, start: int, end: int, ahead: int = 0) -> bytes | memoryview:
        """Bytes [start, end) of `key` (cut at its end), through the chunks covering them. The
        chunks this broker owns and lacks, from the first one wanted to `ahead` bytes past `end`
        (the caller knows the object reaches that far and expects to read on), are read with one
        GET per run of them, so a range across them is a view of that GET's bytes, not a join
        (a join costs the broker about as much CPU as the GET itself)."""
        size = self.chunk_bytes
        first = start - start % size
        if end <= first + size and not ahead:
            parts = [await self._read(key, first, start, end)]
        else:  # read ahead only what the LRU can keep until it is read (else it is read again)
            fresh = await self._load_runs(key, first, end, end + min(ahead, self.lru.max_bytes // 4))
            parts = await asyncio.gather(*(self._read(key, c, max(start, c), min(end, c + size), fresh.get(c)) for c in range(first, end, size)))
        held = parts[0]
        if isinstance(held, tuple) and all(p is held or (isinstance(p, tuple) and p[0] is held[0]) for p in parts):
            return memoryview(held[0])[start - held[1] : end - held[1]]  # all of one GET's bytes
        pieces = [chunk_view(p, c, size)[max(start, c) - c : min(end, c + size) - c] if isinstance(p, tuple) else p for c, p in zip(range(first, end, size), parts, strict=True)]
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def _load_runs(self, key: str, first: int, end: int, until: int) -> dict[int, Held]:
        """GETs the chunks from `first` to `until` that this broker owns, lacks and nobody is
        reading, one GET a run of consecutive ones, if any of them starts before `end` (a read
        wanting only held chunks reads nothing ahead). The GET bytes of each chunk read before
        `end`, by chunk start (the LRU may not keep them)."""
        size = self.chunk_bytes
        if self.recent.has(key):
            return {}
        run_bytes = min(RUN_BYTES, max(size, self.lru.max_bytes // 4))
        runs: list[list[tuple[str, int, int]]] = [[]]
        for c in range(first, until, size):
            slot = (key, c, size)
            if slot not in self.lru and slot not in self._loading and self._owns(key, c):
                if len(runs[-1]) * size >= run_bytes:
                    runs.append([])
                runs[-1].append(slot)
            elif runs[-1]:
                runs.append([])
        runs = [r for r in runs if r]
        if not any(slot[1] < end for r in runs for slot in r):
            return {}
        got = await asyncio.gather(*[self._loading.start_many(r, functools.partial(self._fetch_run, r)) for r in runs])
        return {slot[1]: held for r, held in zip(runs, got, strict=True) for slot in r if slot[1] < end}

    def _owns(self, key: str, chunk_start: int) -> bool:
        owner = self._owner(key, chunk_start, set())
        return owner is None or owner.node_id == self.node_id

    async def _read(self, key: str, chunk_start: int, start: int, end: int, fresh: Held | None = None) -> Held | bytes:
        """The GET bytes holding the chunk (whole: the caller cuts [start, end) from them), or the
        bytes [start, end) from its owner or from the store directly. `fresh`: the bytes of a
        GET this read made for it (`_load_runs`)."""
        size = self.chunk_bytes
        slot = (key, chunk_start, size)
        if fresh is not None:
            metrics.CHUNK_MISS.inc()
            return fresh
        held = self.lru.held(slot)
        if held is not None:
            metrics.CHUNK_HIT.inc()
            return held
        asked: set[int] = set()
        while True:
            owner = self._owner(key, chunk_start, asked)
            if owner is None or owner.node_id == self.node_id:
                metrics.CHUNK_MISS.inc()
                return (await self._load(slot))[0]
            try:
                data, was_held = await self._client(owner).get(key, chunk_start, size, start - chunk_start, end - chunk_start, self.peer_timeout_s)
            except PeerTimeout as e:
                self._failed(owner, "timeout", e)
                return await self._direct(key, start, end)
            except PeerRefused as e:  # a misconfigured deployment: every peer likely refuses alike
                self._failed(owner, "refused", e)
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
            client = self._clients[(member.host, member.port)] = PeerClient(member.host, member.port, self.chunk_bytes, secret=self._peer_secret, tls=self._peer_tls)
        return client

    # -- owning --------------------------------------------------------------------------------

    async def _load(self, slot: tuple[str, int, int]) -> tuple[Held, bool]:
        """The chunk's GET bytes (and whether they were held): from the LRU, else from the
        writer's recent objects, else one GET shared by every concurrent miss, then kept."""
        held = self.lru.held(slot)
        if held is not None:
            return held, True
        return await self._loading.run(slot, lambda: self._fetch(slot)), False

    async def _fetch(self, slot: tuple[str, int, int]) -> Held:
        key, chunk_start, size = slot
        if self.recent.has(key):  # the writer itself owns it: no GET, and the recent cache holds it already
            return bytes(self.recent.get(key, chunk_start, chunk_start + size)), chunk_start
        return await self._fetch_run([slot])

    async def _fetch_run(self, slots: list[tuple[str, int, int]]) -> Held:
        """One GET of consecutive chunks, each kept as its part of the GET's bytes."""
        key, run_start, size = slots[0]
        data = await self.store.get(key, run_start, slots[-1][1] + size)
        if self._on_get is not None:
            self._on_get(len(data))
        self.lru.put_many([s for s in slots if s[1] - run_start < len(data) or s[1] == run_start], data, run_start)
        metrics.CHUNK_BYTES.set(self.lru.size)
        return data, run_start

    async def serve(self, key: str, chunk_start: int, chunk_size: int, lo: int, hi: int) -> tuple[bytes | memoryview, bool]:
        """For the chunk server: bytes [lo, hi) of a chunk a peer asked for, and whether it was held."""
        held, was_held = await self._load((key, chunk_start, chunk_size))
        return chunk_view(held, chunk_start, chunk_size)[lo:hi], was_held

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._clients.values()), return_exceptions=True)
        self._clients.clear()

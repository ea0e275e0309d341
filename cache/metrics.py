"""Prometheus metrics of the read caches: lookups by layer (recent objects, this broker's chunks, a
peer's chunks), bytes exchanged with peers, and object-store reads a peer's failure caused. The
object-store GETs themselves are counted by the reader's `on_get` hook (neve_object_gets_total)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

LOOKUPS = Counter(
    "neve_cache_lookups_total",
    "Reads looked up in a cache layer: recent (the writer's recent objects), chunk (chunks this broker owns), peer (chunks the zone's owner served: hit when it held the chunk, miss when it read the object store for it)",
    ["layer", "result"],
)
RECENT_HIT, RECENT_MISS = LOOKUPS.labels("recent", "hit"), LOOKUPS.labels("recent", "miss")
CHUNK_HIT, CHUNK_MISS = LOOKUPS.labels("chunk", "hit"), LOOKUPS.labels("chunk", "miss")
PEER_HIT, PEER_MISS = LOOKUPS.labels("peer", "hit"), LOOKUPS.labels("peer", "miss")
PEER_BYTES = Counter("neve_cache_peer_bytes_total", "Chunk bytes exchanged with the zone's other brokers", ["direction"])
PEER_BYTES_IN, PEER_BYTES_OUT = PEER_BYTES.labels("received"), PEER_BYTES.labels("sent")
PEER_FAILURES = Counter("neve_cache_peer_failures_total", "Chunk requests to another broker that failed: timeout, unreachable, refused (the two do not share the deployment's secret)", ["reason"])
DIRECT_READS = Counter("neve_cache_direct_reads_total", "Object-store reads made directly because the chunk's owner failed or was slow")
PEER_REFUSED = Counter(
    "neve_cache_peer_refused_total",
    "Chunk-port connections refused by the shared-secret handshake: no_handshake (not a chunk client of this version), no_secret, wrong_secret, timeout (no proof in time)",
    ["reason"],
)
BAD_FRAMES = Counter("neve_cache_bad_frames_total", "Chunk-protocol connections closed for a malformed or oversized frame")
CHUNK_BYTES = Gauge("neve_cache_chunk_bytes", "Bytes of chunks this broker holds")

"""The per-zone distributed cache's settings. The composition root loads them as the [cache]
section (NEVE_CACHE_<FIELD>)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CacheConfig:
    enabled: bool = True
    """Read WAL and table objects through the per-zone chunk cache: each aligned chunk of an object
    is read from the object store by one broker of a zone (its owner, by rendezvous hashing over
    the zone's live brokers) and served to the others from memory. false: each broker reads the
    object store itself (its recent-objects cache aside)."""
    chunk_bytes: int = 4 * 1024 * 1024
    """Size of a chunk, the unit read from the object store and cached (WarpStream's and Ursa's
    4 MiB). A read needing a few bytes of a chunk makes its owner read the whole chunk, once."""
    memory_bytes: int = 256 * 1024 * 1024
    """Memory for the chunks this broker owns (least recently used evicted)."""
    port: int = 0
    """Port on the broker's `host` serving chunks to the zone's other brokers (published with the
    broker's registration); 0: any free port."""
    peer_timeout_ms: int = 2000
    """Deadline of one chunk request to another broker; past it the chunk's bytes are read from
    the object store directly (counted in neve_cache_direct_reads_total)."""
    peer_retry_ms: int = 5000
    """A broker that could not be reached (or missed a deadline) is left out of chunk ownership
    this long: its chunks go to the next owner in rendezvous order, the one that owns them once
    its registration expires, so each of its chunks is read once more, not once per broker."""
    peer_secret_file: str = ""
    """File holding the secret every broker (and compactor) of the deployment shares, e.g. a
    mounted Kubernetes Secret; at least 16 bytes, surrounding whitespace ignored. Each connection
    to a chunk port opens with a challenge-response proving both ends know it (the secret never
    crosses the network); one without it is refused and its chunks are read from the object store
    directly. Empty: no secret, allowed only where the chunk port listens on loopback (`neve dev`)
    or `peer_insecure` is set."""
    peer_insecure: bool = False
    """Serve chunks without a secret on an address other than loopback: only where no untrusted
    host can reach the chunk port (any host that can reads every topic's data through it)."""
    peer_tls_cert_file: str = ""
    """PEM certificate (and chain) this broker shows on the chunk port, as server and as client;
    with peer_tls_key_file and peer_tls_ca_file it turns on mutual TLS between the zone's brokers
    (every one needs all three). Empty: chunks cross the network in clear, authenticated by the
    secret only."""
    peer_tls_key_file: str = ""
    """PEM private key of peer_tls_cert_file."""
    peer_tls_ca_file: str = ""
    """PEM certificates of the deployment's CA: a chunk-port peer must show a certificate it
    signed (its host name is not checked: the CA is the deployment's own, and brokers are
    reached by the address they register)."""

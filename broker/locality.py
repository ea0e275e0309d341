"""Locality for a leaderless cluster: which zone a client is in (from its client.id), which
brokers it should see, and which broker Metadata names as a partition's "leader".

The leader is only a hint for batching and cache hits; any broker accepts any partition. It is
chosen by rendezvous hashing of (topic, partition, zone) over the zone's live brokers, so when a
broker leaves only its own partitions move, and clients in different zones write the same
partition through different brokers."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Protocol

# Every convention users already have: Ursa, WarpStream (two), Inkless, AutoMQ, Bufstream.
_ZONE = re.compile(r"(?<![A-Za-z0-9_])(?:zone_id|ws_az|warpstream_az|diskless_az|automq_az|zone)=([^,;&\s]+)")


class Broker(Protocol):
    node_id: int
    zone: str | None


def client_zone(client_id: str | None) -> str | None:
    if not client_id:
        return None
    m = _ZONE.search(client_id)
    return m.group(1) if m else None


def brokers_for_zone(brokers: Sequence[Broker], zone: str | None) -> list:
    """The brokers that lead partitions for a client in `zone`: its zone's, or all when it has
    none or its zone has no live broker."""
    if zone is not None:
        local = [b for b in brokers if b.zone == zone]
        if local:
            return local
    return list(brokers)


def _weight(topic: str, partition: int, zone: str | None, node_id: int) -> bytes:
    return hashlib.blake2b(f"{topic}\0{partition}\0{zone or ''}\0{node_id}".encode(), digest_size=8).digest()


def leader_for(topic: str, partition: int, zone: str | None, brokers: Sequence[Broker]) -> int:
    """The node id named as leader of (topic, partition) for a client in `zone`."""
    return max(brokers, key=lambda b: _weight(topic, partition, zone, b.node_id)).node_id

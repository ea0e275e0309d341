"""Locality for a leaderless cluster: which zone a client is in (from its client.id), which
brokers it should see, and which broker Metadata names as a partition's "leader".

The leader is only a hint for batching and cache hits; any broker accepts any partition. It is
chosen by rendezvous hashing of (topic, partition, zone) over the zone's live brokers, so when a
broker leaves only its own partitions move, and clients in different zones write the same
partition through different brokers.

A hint naming a zone no live broker is in (a typo, or a zone whose brokers are all down) is a
miss: the client is served as if it had no zone (every broker), which costs cross-zone bytes, so
each miss is counted (`neve_zone_hint_misses_total`) and logged once per client id."""

from __future__ import annotations

import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from .metrics import ZONE_HINT_MISSES

log = logging.getLogger("neve.broker.locality")

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


def known_zone(client_id: str | None, brokers: Sequence[Broker]) -> str | None:
    """The client's zone if some live broker is in it; None when it names none or an unknown one."""
    zone = client_zone(client_id)
    return zone if zone is not None and any(b.zone == zone for b in brokers) else None


class ZoneHints:
    """Resolves clients' zone hints for the requests that place them (Metadata, FindCoordinator):
    counts every miss, and logs the first miss of each client id. The client ids already logged
    are remembered up to `remember` (least recently missed forgotten first), so a client fleet of
    unbounded ids cannot grow the broker's memory; a forgotten one is logged again."""

    def __init__(self, remember: int = 1024) -> None:
        self.remember = remember
        self._logged: OrderedDict[str, None] = OrderedDict()

    def zone(self, client_id: str | None, brokers: Sequence[Broker]) -> str | None:
        hinted = client_zone(client_id)
        if hinted is None:
            return None
        if any(b.zone == hinted for b in brokers):
            return hinted
        ZONE_HINT_MISSES.inc()
        assert client_id is not None
        if client_id in self._logged:
            self._logged.move_to_end(client_id)
        else:
            self._logged[client_id] = None
            if len(self._logged) > self.remember:
                self._logged.popitem(last=False)
            zones = sorted({b.zone for b in brokers if b.zone})
            log.warning("zone_hint_unmatched", extra={"client_id": client_id, "zone": hinted, "live_zones": zones, "served": "every broker"})
        return None


ZONE_HINTS = ZoneHints()


def brokers_for_zone(brokers: Sequence[Broker], zone: str | None) -> list:
    """The brokers that lead partitions for a client in `zone`: its zone's, or all when it has
    none or its zone has no live broker."""
    if zone is not None:
        local = [b for b in brokers if b.zone == zone]
        if local:
            return local
    return list(brokers)


def brokers_listed(brokers: Sequence[Broker], zone: str | None) -> list:
    """The brokers Metadata (and DescribeCluster) names to a client in `zone`: the leaders' zone
    (brokers_for_zone), and, when that zone has a single live broker, the others after it. A
    client of a one-broker zone that knew only that broker would have nowhere to go when it dies
    but its bootstrap list, which librdkafka goes back to only after
    `metadata.recovery.rebootstrap.trigger.ms` (5 minutes) without metadata; knowing the others,
    it moves as soon as the dead broker's lease expires. Leaders are never named outside the zone,
    so a zoned client's produce and fetch bytes stay in it while its broker lives (its metadata
    requests may go to another zone's broker: Java's least-loaded node)."""
    leaders = brokers_for_zone(brokers, zone)
    if zone is None or len(leaders) != 1 or len(leaders) == len(brokers):
        return leaders
    return [*leaders, *(b for b in brokers if b not in leaders)]


def _weight(topic: str, partition: int, zone: str | None, node_id: int) -> bytes:
    return hashlib.blake2b(f"{topic}\0{partition}\0{zone or ''}\0{node_id}".encode(), digest_size=8).digest()


def leader_for(topic: str, partition: int, zone: str | None, brokers: Sequence[Broker]) -> int:
    """The node id named as leader of (topic, partition) for a client in `zone`."""
    return max(brokers, key=lambda b: _weight(topic, partition, zone, b.node_id)).node_id

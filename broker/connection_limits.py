"""How many client connections a broker holds, as Kafka bounds them: `max.connections` for the
broker, `max.connections.per.ip` for one address (with per-address overrides), and KIP-612's
`max.connection.creation.rate` for new connections a second. A connection past a bound is closed
as soon as it is accepted, before anything of it is read (Kafka's acceptor does the same for an
address over its bound), and counted by reason (neve_connections_refused_total).

The broker-wide bound defaults to what the process may open: its open-file limit less
RESERVED_FILES kept for its own files, object-store and metadata connections and its peers, so
that a flood is refused by the broker instead of failing its accept() and its own reads. The
inter-broker listener's connections (another broker relaying) are not counted when the broker
has other listeners, as Kafka exempts that listener from max.connections."""

from __future__ import annotations

import resource
import time
from collections import deque

from .config import BrokerConfig

RESERVED_FILES = 1000


class ConnectionLimits:
    def __init__(self, settings: BrokerConfig, clock=time.monotonic) -> None:
        self.max_connections = settings.max_connections if settings.max_connections > 0 else default_max_connections()
        self.per_ip = settings.max_connections_per_ip
        self.overrides = parse_overrides(settings.max_connections_per_ip_overrides)
        self.creation_rate = settings.max_connection_creation_rate
        self._clock = clock
        self._by_ip: dict[str, int] = {}
        self.total = 0
        self._created: deque[float] = deque()  # accept times within the last second (the rate's window)

    def admit(self, host: str) -> str | None:
        """Count a new connection from `host`, or say why it is refused (nothing counted then)."""
        if self.total >= self.max_connections:
            return "max_connections"
        bound = self.overrides.get(host, self.per_ip)
        if bound > 0 and self._by_ip.get(host, 0) >= bound:
            return "max_connections_per_ip"
        if self.creation_rate > 0:
            now = self._clock()
            while self._created and now - self._created[0] >= 1.0:
                self._created.popleft()
            if len(self._created) >= self.creation_rate:
                return "max_connection_creation_rate"
            self._created.append(now)
        self.total += 1
        self._by_ip[host] = self._by_ip.get(host, 0) + 1
        return None

    def release(self, host: str) -> None:
        self.total -= 1
        left = self._by_ip.get(host, 0) - 1
        if left > 0:
            self._by_ip[host] = left
        else:
            self._by_ip.pop(host, None)


def default_max_connections() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(soft - RESERVED_FILES, soft // 2)


def parse_overrides(text: str) -> dict[str, int]:
    """Kafka's max.connections.per.ip.overrides: `host:count` items, comma-separated."""
    out: dict[str, int] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        if not sep or not host or not count.strip().isdigit():
            raise ValueError(f"max_connections_per_ip_overrides: {item!r} is not host:count")
        out[host.strip()] = int(count)
    return out

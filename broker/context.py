"""What a handler sees: the broker's shared services and the request being answered."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cache.reader import ObjectReader
    from metadata.store import MetadataStore
    from wal.writer import WalWriter

    from .config import BrokerSettings


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass
class Services:
    """The long-lived parts of one broker, shared by every connection."""

    settings: BrokerSettings
    metadata: MetadataStore
    wal: WalWriter
    reader: ObjectReader
    cluster_id: str = "neve"
    brokers: list[BrokerInfo] = field(default_factory=list)

    @property
    def this_broker(self) -> BrokerInfo:
        return self.brokers[0]


@dataclass(frozen=True, slots=True)
class RequestContext:
    services: Services
    api_key: int
    api_version: int
    client_id: str | None
    response: ModuleType  # kio's response module for this API version
    peer: Any = None

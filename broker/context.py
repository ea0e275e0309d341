"""What a handler sees: the broker's shared services and the request being answered."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from auth.session import Session

from .config import FaultsConfig

if TYPE_CHECKING:
    from cache.reader import ObjectReader
    from metadata.store import MetadataStore
    from table.serve import CompactedReader
    from wal.writer import WalWriter

    from .config import BrokerConfig
    from .groups.coordinator import GroupCoordinator
    from .transactions.coordinator import TransactionCoordinator


@dataclass
class Services:
    """The long-lived parts of one broker, shared by every connection."""

    settings: BrokerConfig
    metadata: MetadataStore
    wal: WalWriter
    reader: ObjectReader
    cluster_id: str = "neve"
    storage: str = ""  # where the data lives (the object store's URL without its query), for DescribeLogDirs
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    # Serves PARQUET index entries from the table's files; None where the table extra is not
    # installed (compacted entries are then read from the WAL ranges their manifests name).
    compacted: CompactedReader | None = None
    # Authentication and authorization (auth/): the SASL mechanisms this broker's SASL listeners
    # offer, and the ACL authorizer; None: none configured (every request is allowed).
    sasl: Any = None
    authorizer: Any = None
    coordinator: GroupCoordinator = field(default=None)  # type: ignore[assignment]  # built in __post_init__
    transactions: TransactionCoordinator = field(default=None)  # type: ignore[assignment]  # built in __post_init__

    def __post_init__(self) -> None:
        if self.coordinator is None:
            from .groups.coordinator import GroupCoordinator

            self.coordinator = GroupCoordinator(
                self.metadata,
                self.live_brokers,
                lambda: self.settings.node_id,
                consumer_session_timeout_ms=self.settings.group_consumer_session_timeout_ms,
                consumer_heartbeat_interval_ms=self.settings.group_consumer_heartbeat_interval_ms,
                drop_commit_every=self.faults.offset_commit_dropped_every,
            )
        if self.transactions is None:
            from .transactions.coordinator import TransactionCoordinator

            self.transactions = TransactionCoordinator(
                self.metadata,
                self.wal,
                max_timeout_ms=self.settings.transaction_max_timeout_ms,
                id_expiration_ms=self.settings.transactional_id_expiration_ms,
                kill_during_end=self.faults.kill_during_end_txn,
                lose_abort_marker_every=self.faults.marker_lost_every,
                marker_linger_ms=self.settings.transaction_marker_linger_ms,
            )

    def live_brokers(self):
        """Registered live brokers (never empty: this broker is always live to itself)."""
        brokers = self.metadata.live_brokers()
        if not any(b.node_id == self.settings.node_id for b in brokers):
            brokers = [*brokers, self.this_broker]
        return brokers

    @property
    def this_broker(self):
        from metadata.model import BrokerRegistration

        s = self.settings
        return BrokerRegistration(s.node_id, s.advertised(), s.port, s.zone or None)


@dataclass(frozen=True, slots=True)
class RequestContext:
    services: Services
    api_key: int
    api_version: int
    client_id: str | None
    response: ModuleType  # kio's response module for this API version
    peer: Any = None
    session: Session = field(default_factory=Session)  # the connection's (one for all its contexts)

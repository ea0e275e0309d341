"""The settings the broker package reads. The composition root fills them from neve's config, so
the broker never imports it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str = "127.0.0.1"
    node_id: int = 0
    zone: str | None = None
    max_frame_bytes: int = 100 * 1024 * 1024
    max_inflight_requests: int = 64  # requests other than Produce; see neve/config.py
    max_inflight_produce_requests: int = 8192
    produce_read_pause_ms: float = 0.0  # see neve/config.py; the node caps it at a tenth of the WAL linger
    auto_create_topics: bool = False
    default_partitions: int = 1
    max_message_bytes: int = 10 * 1024 * 1024
    max_decompressed_batch_bytes: int = 256 * 1024 * 1024  # see neve/config.py
    fetch_max_bytes: int = 50 * 1024 * 1024
    produce_timeout_ms: int = 30000
    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    transaction_max_timeout_ms: int = 900_000  # see neve/config.py
    transaction_check_interval_ms: int = 10_000
    transaction_marker_linger_ms: int = 20
    transactional_id_expiration_ms: int = 604_800_000
    fault_drop_produce_response_every: int = 0
    fault_kill_during_end_txn: str = ""  # see neve/config.py [faults]
    storage: str = ""  # where the data lives (object store URL without its query), for DescribeLogDirs

"""Prometheus metrics of a broker (served by the composition root when a metrics port is set)."""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class LoopCounter:
    """A counter bumped from the event loop's thread only, on every request: a plain int, read at
    scrape time by `LoopCounters`. prometheus_client's Counter takes a lock and checks its amount
    on every `inc`, about 2% of the broker's CPU at 10,000 partitions (a request per partition)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class LoopCounters:
    """Exports the per-request counters: `neve_requests_total{api}` and `neve_produce_bytes_total`."""

    def __init__(self) -> None:
        self.requests: dict[str, LoopCounter] = {}
        self.produce_bytes = LoopCounter()

    def collect(self):
        requests = CounterMetricFamily("neve_requests", "Kafka requests decoded and handed to their handler", labels=["api"])
        for api, counter in list(self.requests.items()):
            requests.add_metric([api], counter.value)
        yield requests
        yield CounterMetricFamily(
            "neve_produce_bytes", "Record batch bytes Produce answered as stored (acks=0 requests, never answered, are not counted)", value=self.produce_bytes.value
        )


LOOP_COUNTERS = LoopCounters()
REGISTRY.register(LOOP_COUNTERS)


NO_ZONE = "none"  # the zone label of a client without a known zone hint, or of a zoneless broker
# The client zone label of a connection from another broker relaying its clients' group requests
# (broker/forwarding.py): a broker, not a client, whichever clients' requests it carries.
PEER_BROKER = "broker"


class ClientTraffic:
    """Where clients landed, by (client zone, broker zone): `neve_client_bytes_total{direction}`
    (Kafka frames in, responses out), `neve_client_connections_total` (accepted) and
    `neve_client_connections` (open). A connection is placed by the client id of its first
    request; client zones are only zones some live broker was in then (or "none"), so the label
    values stay few whatever clients write. Bumped from the event loop only, plain ints."""

    def __init__(self) -> None:
        self.bytes: dict[tuple[str, str, str], LoopCounter] = {}
        self.accepted: dict[tuple[str, str], LoopCounter] = {}
        self.open: dict[tuple[str, str], LoopCounter] = {}

    def counters(self, client_zone: str | None, broker_zone: str | None) -> tuple[LoopCounter, LoopCounter, LoopCounter]:
        """(bytes in, bytes out, open connections) of one (client zone, broker zone) pair; counts
        the connection as accepted."""
        zones = (client_zone or NO_ZONE, broker_zone or NO_ZONE)
        self.accepted.setdefault(zones, LoopCounter()).inc()
        return (
            self.bytes.setdefault(("in", *zones), LoopCounter()),
            self.bytes.setdefault(("out", *zones), LoopCounter()),
            self.open.setdefault(zones, LoopCounter()),
        )

    def collect(self):
        traffic = CounterMetricFamily("neve_client_bytes", "Kafka protocol bytes between clients and this broker", labels=["direction", "client_zone", "broker_zone"])
        for labels, counter in list(self.bytes.items()):
            traffic.add_metric(list(labels), counter.value)
        yield traffic
        accepted = CounterMetricFamily("neve_client_connections", "Client connections accepted, by the zone of their client id", labels=["client_zone", "broker_zone"])
        for labels, counter in list(self.accepted.items()):
            accepted.add_metric(list(labels), counter.value)
        yield accepted
        open_now = GaugeMetricFamily("neve_client_connections_open", "Client connections open, by the zone of their client id", labels=["client_zone", "broker_zone"])
        for labels, counter in list(self.open.items()):
            open_now.add_metric(list(labels), counter.value)
        yield open_now


CLIENT_TRAFFIC = ClientTraffic()
REGISTRY.register(CLIENT_TRAFFIC)
ZONE_HINT_MISSES = Counter(
    "neve_zone_hint_misses_total", "Metadata and FindCoordinator requests whose client.id named a zone no live broker is in (answered as for a client without a zone)"
)
GROUP_FORWARDS = Counter(
    "neve_group_forwarded_requests_total", "Group requests of zoned clients relayed to the group's coordinator (another zone's broker), by API", ["api"]
)
GROUP_FORWARD_BYTES = Counter(
    "neve_group_forwarded_bytes_total", "Bytes of relayed group requests (out) and of the coordinators' answers (in), broker to broker", ["api", "direction"]
)
GROUP_FORWARD_FAILURES = Counter(
    "neve_group_forward_failures_total",
    "Relayed group requests answered COORDINATOR_NOT_AVAILABLE: no answer by the deadline (timeout) or the link to the coordinator failed (connection)",
    ["api", "reason"],
)
GROUP_FORWARDS_IN_FLIGHT = Gauge("neve_group_forwards_in_flight", "Relayed group requests waiting for their coordinator's answer")
PRODUCE_BYTES = LOOP_COUNTERS.produce_bytes
TRANSACTIONS_ENDED = Counter(
    "neve_transactions_ended_total",
    "Transactions completed by this broker, by outcome (commit, abort) and cause (client: EndTxn; fenced: a new producer of its id; timeout: the sweep; recovered: decided by a broker that died)",
    ["outcome", "cause"],
)
HANGING_TRANSACTIONS_ABORTED = Counter("neve_hanging_transactions_aborted_total", "Open transactions of a partition that no transactional id held, aborted by the sweep")
TRANSACTIONAL_PRODUCE_REFUSED = Counter("neve_transactional_produce_refused_total", "Transactional produce partitions refused by the coordinator check (KIP-890), by error", ["error"])
FETCH_BYTES = Counter("neve_fetch_bytes_total", "Record batch bytes returned by Fetch")
OBJECT_GETS = Counter("neve_object_gets_total", "Object-store GETs made to serve fetches (reads from the recent-objects cache excluded)")
OBJECT_GET_BYTES = Counter("neve_object_get_bytes_total", "Bytes read from the object store to serve fetches")
OBJECT_READ_FAILURES = Counter(
    "neve_object_read_failures_total",
    "Partitions of Fetch and ListOffsets requests answered KAFKA_STORAGE_ERROR (or, in Fetch, with only the records before it) because an object-store read failed",
    ["api"],
)
FETCH_READ_FAILURES = OBJECT_READ_FAILURES.labels(api="Fetch")  # made here: both series are exported from the start, at 0
LIST_OFFSETS_READ_FAILURES = OBJECT_READ_FAILURES.labels(api="ListOffsets")
WAL_PUTS = Counter("neve_wal_object_puts_total", "WAL object PUTs to the object store")
WAL_PUT_BYTES = Counter("neve_wal_object_bytes_total", "Bytes of WAL objects stored")
WAL_COMMITS = Counter("neve_wal_commits_total", "WAL objects committed to the metadata store")
WAL_OBJECT_SIZE = Histogram("neve_wal_object_size_bytes", "Size of committed WAL objects", buckets=(2**10, 2**14, 2**17, 2**20, 2**21, 2**22, 2**23, 2**25))
WAL_PUT_HEDGES = Counter("neve_wal_put_hedges_total", "WAL object PUTs raced by a second PUT because the first was slow")
WAL_PUT_SECONDS = Histogram(
    "neve_wal_put_seconds", "Time to store one WAL object, retries included", buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
)
WAL_COMMIT_SECONDS = Histogram(
    "neve_wal_commit_seconds",
    "Time of one WAL object's sequencer commit (after the broker's earlier commits finished)",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


def requests_of(api: str) -> LoopCounter:
    """The request counter of one API (the connection counts every request)."""
    counter = LOOP_COUNTERS.requests.get(api)
    if counter is None:
        counter = LOOP_COUNTERS.requests[api] = LoopCounter()
    return counter


class WalMetrics:
    """The hooks wal.writer.WalWriter calls."""

    def object_put(self, size: int, seconds: float) -> None:
        WAL_PUTS.inc()
        WAL_PUT_BYTES.inc(size)
        WAL_PUT_SECONDS.observe(seconds)

    def object_put_hedged(self) -> None:
        WAL_PUT_HEDGES.inc()

    def object_committed(self, size: int, chunks: int, seconds: float) -> None:
        WAL_COMMITS.inc()
        WAL_OBJECT_SIZE.observe(size)
        WAL_COMMIT_SECONDS.observe(seconds)


def object_get(size: int) -> None:
    """The hook cache.reader.ObjectReader calls after every GET."""
    OBJECT_GETS.inc()
    OBJECT_GET_BYTES.inc(size)


class MetadataOpsCollector:
    """`neve_metadata_ops_total`: requests the broker made to its metadata store, read from the
    store's own `ops` count when it keeps one (the etcd store does), for the cost benchmark; and
    the size of the offset index the broker holds in memory (`neve_offset_index_entries`,
    `neve_offset_index_bytes`)."""

    def __init__(self, store) -> None:
        self.store = store

    def collect(self):
        ops = getattr(self.store, "ops", None)
        if ops is not None:
            yield CounterMetricFamily("neve_metadata_ops", "Requests made to the metadata store", value=ops)
        entries, size = self.store.index_size()
        yield GaugeMetricFamily("neve_offset_index_entries", "Offset index entries the broker holds in memory", value=entries)
        yield GaugeMetricFamily("neve_offset_index_bytes", "Bytes of the offset index's columns in the broker's memory (object key strings not counted)", value=size)


def expose_metadata_ops(store) -> None:
    """Register the collector once per process (a second node in the same process replaces nothing)."""
    global _metadata_ops
    if _metadata_ops is None:
        _metadata_ops = MetadataOpsCollector(store)
        REGISTRY.register(_metadata_ops)
    else:
        _metadata_ops.store = store


_metadata_ops: MetadataOpsCollector | None = None
CONNECTIONS = Gauge(
    "neve_connections",
    "Open client connections by listener and state: authenticating (a SASL listener's, not yet authenticated) or authenticated",
    ["listener", "state"],
)
CONNECTIONS_REFUSED = Counter(
    "neve_connections_refused_total",
    "Client connections closed as they were accepted, by listener and bound: max_connections, max_connections_per_ip, max_connection_creation_rate",
    ["listener", "reason"],
)
SASL_AUTHENTICATIONS = Counter(
    "neve_sasl_authentications_total",
    "SASL authentications (and KIP-368 re-authentications) by mechanism and result: success, or failure (answered SASL_AUTHENTICATION_FAILED, then the connection closed)",
    ["mechanism", "result"],
)

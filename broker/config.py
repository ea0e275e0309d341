"""The broker's settings, declared once: the composition root loads them as the [broker] and
[faults] sections of neve's config (NEVE_BROKER_<FIELD>, NEVE_FAULTS_<FIELD>) and hands the
broker these objects, so the broker never imports it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BrokerConfig:
    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 9092
    """Kafka listener port."""
    advertised_host: str = ""
    """Host named in Metadata answers; empty: same as `host` (see `advertised`)."""
    node_id: int = 0
    """This broker's id in Metadata answers; unique per cluster."""
    zone: str = ""
    """This broker's availability zone; clients naming a zone in client.id (zone_id=, ws_az=, ...)
    are served by brokers of their zone. Empty: no zone."""
    max_frame_bytes: int = 100 * 1024 * 1024
    """Largest request frame accepted (Kafka's socket.request.max.bytes); larger closes the connection."""
    sasl_max_receive_bytes: int = 512 * 1024
    """Largest request frame a SASL listener's connection may send before it has authenticated
    (Kafka's sasl.server.max.receive.size); larger closes the connection unread. Only ApiVersions,
    SaslHandshake and SaslAuthenticate are taken then, each only once its header has arrived."""
    authentication_timeout_ms: int = 30_000
    """How long a SASL listener's connection may take to authenticate before it is closed."""
    max_connections: int = 0
    """Client connections the broker holds at once (Kafka's max.connections); more are closed as
    they are accepted. 0: the process's open-file limit less 1,000 (broker/connection_limits.py)."""
    max_connections_per_ip: int = 0
    """Connections from one address at once (Kafka's max.connections.per.ip); 0: no bound."""
    max_connections_per_ip_overrides: str = ""
    """Per-address bounds, `host:count` comma-separated (Kafka's max.connections.per.ip.overrides)."""
    max_connection_creation_rate: int = 0
    """New connections accepted a second (KIP-612's max.connection.creation.rate); more are closed.
    0: no bound."""
    failed_authentication_delay_ms: int = 100
    """How long the answer to a failed authentication waits before the connection closes (Kafka's
    connection.failed.authentication.delay.ms), doubled for each other failure from the same address
    within a minute, up to 5 s. 0: no wait."""
    max_inflight_requests: int = 64
    """Pipelined requests other than Produce (Fetch, Metadata, ...) read ahead per connection
    before the reader waits (backpressure): each may hold a response of up to fetch_max_bytes."""
    max_inflight_produce_requests: int = 8192
    """Pipelined Produce requests read ahead per connection. librdkafka sends one partition per
    ProduceRequest and each waits for the WAL linger, so a producer to N partitions keeps up to N
    requests in flight on one connection; the bytes they hold are bounded by `wal.buffer_bytes`."""
    produce_read_pause_ms: float = 20
    """After a read that emptied a connection's socket and brought only Produce requests, wait
    this long before reading it again, so that a producer's next requests are read together in
    one wake-up (librdkafka sends a request per partition: at 10,000 partitions a 5 ms pause took
    the broker from 17.4-17.7 to 12.0-12.2 CPU-s per GiB, bench/RESULTS.md). Every produce request
    waits for the WAL linger anyway, and a pause ends before the WAL object being filled is sealed,
    so what it held back still joins that object; the pause is at most a tenth of
    `wal.linger_ms`. 0: never."""
    produce_timeout_ms: int = 25_000
    """Longest a produce request waits for its WAL object to be stored and committed before it is
    answered REQUEST_TIMED_OUT (and how long a closing connection waits for its answers). A node
    raises it to `wal.upload_timeout_ms` + 15 s when that is longer (the writer's own deadline,
    then a commit bounded by the metadata store's timeouts): a produce never gives up before its
    upload does."""
    auto_create_topics: bool = False
    """Create unknown topics on Metadata requests that allow it (Kafka's auto.create.topics.enable).
    `neve dev`: true, as Kafka's own default (quick starts and librdkafka's tests rely on it)."""
    default_partitions: int = 1
    """Partition count of auto-created topics and CreateTopics with num_partitions -1."""
    max_message_bytes: int = 10 * 1024 * 1024
    """Largest records field of one produce partition (Kafka's message.max.bytes)."""
    max_decompressed_batch_bytes: int = 256 * 1024 * 1024
    """Largest records section a compressed batch may decompress to on produce (its records are
    walked decompressed): a batch that expands further gets MESSAGE_TOO_LARGE (Java producers
    split it and send it again) and never takes more memory than this."""
    fetch_max_bytes: int = 50 * 1024 * 1024
    """Upper bound on one Fetch response, whatever the client asks."""
    metrics_port: int = 0
    """Prometheus metrics HTTP port; 0: disabled."""
    metrics_host: str = ""
    """Address the metrics endpoint listens on; empty: `host`. Scrapers often reach brokers on
    another network than clients do."""
    group_consumer_session_timeout_ms: int = 45_000
    """KIP-848 consumer groups (group.protocol=consumer): a member silent this long is removed
    (Kafka's group.consumer.session.timeout.ms)."""
    group_consumer_heartbeat_interval_ms: int = 5_000
    """KIP-848 consumer groups: the heartbeat interval given to members; a member waiting for
    partitions another member releases learns of them on its next heartbeat
    (Kafka's group.consumer.heartbeat.interval.ms)."""
    transaction_max_timeout_ms: int = 900_000
    """Longest transaction timeout a producer may ask for (transaction.timeout.ms): InitProducerId
    asking more gets INVALID_TRANSACTION_TIMEOUT (Kafka's transaction.max.timeout.ms)."""
    transaction_marker_linger_ms: int = 20
    """Longest a transaction's markers wait in the WAL buffer before their object is sealed,
    whatever `wal.linger_ms` (EndTxn waits for them; a producer sends nothing meanwhile). Markers
    of the transactions ending within it share one object: at most one extra WAL object per this
    many ms, however many transactional producers."""
    transaction_check_interval_ms: int = 10_000
    """How often the broker leading the transaction sweep aborts transactions open past their
    timeout and finishes those whose coordinator died between decision and markers (Kafka's
    transaction.abort.timed.out.transaction.cleanup.interval.ms)."""
    transactional_id_expiration_ms: int = 604_800_000
    """A transactional id with no transaction open and no request for this long is forgotten
    (Kafka's transactional.id.expiration.ms, 7 days)."""
    retention_check_interval_ms: int = 300_000
    """How often each broker applies topics' retention.ms / retention.bytes by advancing log start
    offsets (Kafka's log.retention.check.interval.ms); 0 disables retention."""
    gc_young_threshold: int = 100_000
    """CPython's generation-0 garbage-collection threshold (its default is 700; 0 keeps it). A
    broker holds every in-flight request for the WAL linger, so at CPython's defaults those
    objects survive into the old generation and full collections ran twice a second, 40% of the
    broker's CPU at 10,000 partitions. At 100,000 (the middle generation collected every 20 young
    collections, the old one considered every 100 of those; start-up objects frozen out of
    collection) they mostly die young."""

    # -- listeners and TLS -----------------------------------------------------------------------
    listeners: str = ""
    """Kafka listeners as Kafka writes them: comma-separated `NAME://host:port`, e.g.
    `SASL_SSL://0.0.0.0:9093,INTERNAL://10.0.0.5:9094`. A listener's security protocol is its name
    when that is one (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), else given in
    `listener_security_protocol_map`. Port 0: any free port. Empty: one PLAINTEXT listener on
    `host`:`port`."""
    advertised_listeners: str = ""
    """`NAME://host:port` per listener, named to the clients that connect through it: Metadata,
    FindCoordinator and DescribeCluster answer with the listener the client came in on. A listener
    not named here advertises `advertised_host` (else its own host) and its port."""
    listener_security_protocol_map: str = ""
    """`NAME:PROTOCOL` pairs for listeners whose name is not a protocol, e.g.
    `INTERNAL:SASL_SSL,EXTERNAL:SSL`."""
    allow_insecure_listeners: bool = False
    """Allow a PLAINTEXT listener (no authentication, no encryption) on an address other than
    loopback. Off: a broker asked for one refuses to start."""
    ssl_certfile: str = ""
    """PEM certificate chain of the SSL and SASL_SSL listeners; renewed files are picked up
    without a restart (new connections use them)."""
    ssl_keyfile: str = ""
    """PEM private key of `ssl_certfile`."""
    ssl_key_password: str = ""
    """Password of `ssl_keyfile`, if it is encrypted."""
    ssl_cafile: str = ""
    """PEM authorities client certificates are checked against (mutual TLS)."""
    ssl_client_auth: str = "none"
    """Client certificates on SSL listeners (Kafka's ssl.client.auth): none, requested or required.
    A client authenticated by certificate is the principal `ssl_principal_mapping_rules` make of
    its subject."""
    ssl_principal_mapping_rules: str = "DEFAULT"
    """Kafka's ssl.principal.mapping.rules: `RULE:regex/replacement/[L|U]` items and DEFAULT (the
    whole RFC 2253 subject, e.g. `CN=alice,OU=eng`), the first matching one names the user."""
    # -- SASL ------------------------------------------------------------------------------------
    sasl_enabled_mechanisms: str = "SCRAM-SHA-256,SCRAM-SHA-512"
    """Mechanisms the SASL listeners offer: SCRAM-SHA-256, SCRAM-SHA-512, PLAIN, OAUTHBEARER."""
    sasl_plain_users_file: str = ""
    """PLAIN's users: one `user:password` a line. Empty: PLAIN checks passwords against the SCRAM
    credentials."""
    sasl_scram_users_file: str = ""
    """SCRAM users created at start when absent (`user:password` a line, salted for both SCRAM
    mechanisms; a mounted Secret): the first administrator and the brokers' own user."""
    sasl_oauthbearer_jwks: str = ""
    """Where OAUTHBEARER's signing keys are: a JWKS file or an https URL (fetched and cached)."""
    sasl_oauthbearer_allow_http_jwks: bool = False
    """Accept an http:// JWKS URL (whoever can answer on its path can then sign tokens): off, the
    broker does not start with one."""
    sasl_oauthbearer_issuer: str = ""
    """The `iss` OAUTHBEARER tokens must carry; empty: not checked."""
    sasl_oauthbearer_audience: str = ""
    """An `aud` OAUTHBEARER tokens must include (a token the identity provider issued for another
    service is refused). Required with signed tokens unless `sasl_oauthbearer_allow_any_audience`."""
    sasl_oauthbearer_allow_any_audience: bool = False
    """Accept signed tokens whatever their audience, with no `sasl_oauthbearer_audience` set."""
    sasl_oauthbearer_sub_claim: str = "sub"
    """The token claim that names the principal (KIP-768's sasl.oauthbearer.sub.claim.name)."""
    sasl_oauthbearer_clock_skew_s: int = 30
    """Leeway allowed on a token's expiry and not-before times."""
    sasl_oauthbearer_allow_unsecured: bool = False
    """Accept unsigned (alg "none") tokens, as Kafka's unsecured OAUTHBEARER: development only."""
    connections_max_reauth_ms: int = 0
    """KIP-368: a SASL connection must authenticate again within this long (its token's expiry
    when sooner) or is closed; clients re-authenticate on their own. 0: never."""
    # -- authorization ---------------------------------------------------------------------------
    authorizer_enabled: bool = False
    """Check every request against the ACLs (kept in the metadata store, followed by every broker).
    Off: every client may do everything, and the ACL APIs answer SECURITY_DISABLED."""
    super_users: str = ""
    """Principals allowed everything, `;`-separated (Kafka's super.users), e.g.
    `User:admin;User:neve-broker`."""
    allow_everyone_if_no_acl_found: bool = False
    """With the authorizer on: a resource no ACL names is open to everyone (Kafka's
    allow.everyone.if.no.acl.found). Off: closed to all but super users."""
    inter_broker_listener_name: str = ""
    """The listener brokers reach each other on (relayed group requests); empty: the first."""
    inter_broker_sasl_username: str = ""
    """The user a broker authenticates as on another broker's SASL listener (a super user)."""
    inter_broker_sasl_password: str = ""
    """Its password (SCRAM-SHA-512 if offered, else the first SCRAM or PLAIN mechanism)."""

    def advertised(self) -> str:
        """The host clients are told to connect to."""
        return self.advertised_host or self.host


@dataclass
class FaultsConfig:
    """Test-only fault injection; every default is off."""

    drop_produce_response_every: int = 0
    """Commit every Nth produce request, then close the connection instead of answering (forces
    client retries of already-committed batches). 0: off."""
    kill_during_end_txn: str = ""
    """A transactional id: the broker that decides its first producer's (epoch 0) transaction
    kills itself (SIGKILL) once the decision is durable and the marker of the transaction's first
    partition is stored, before the others (a coordinator dying in the middle of EndTxn). Empty: off."""
    # Planted bugs (chaos/plants.py): each breaks a guarantee on purpose, so that a short chaos run
    # shows its checker catches the anomaly. Test only: never set them where the data matters.
    marker_lost_every: int = 0
    """Planted bug, test only: every Nth transaction this broker aborts (1: every one) has its
    first partition's abort marker replaced by a commit marker while the transaction still
    completes as aborted, so that partition's aborted records become visible to read_committed
    readers and the table (G1a, a torn transaction). 0: off."""
    fetch_past_lso: bool = False
    """Planted bug, test only: a read_committed Fetch reads up to the high watermark instead of
    the last stable offset and lists no aborted transactions, as if read_uncommitted: open and
    aborted transactions' records are served as committed (G1b, G1a). false: off."""
    batch_twice_every: int = 0
    """Planted bug, test only: every Nth batch of a non-transactional idempotent producer is
    stored twice, the second copy past the idempotence check (at offsets of its own), while the
    producer is acknowledged once: a consumer reads the record twice. 0: off."""
    offset_commit_dropped_every: int = 0
    """Planted bug, test only: every Nth OffsetCommit this broker's group coordinator accepts
    (classic and KIP-848 groups) is answered with no error but not stored: the group keeps its
    previous offsets, and reads them back behind the acknowledged commit. 0: off."""

"""Security on a 3-broker cluster over the real etcd and SeaweedFS: clients on a SASL_SSL listener
(SCRAM-SHA-512), brokers reaching each other on a SASL_SSL inter-broker listener as their own user,
the authorizer on with `admin` and `broker` as super users.
- ACLs made, listed and removed through the Java AdminClient and through confluent-kafka's
  AdminClient decide what confluent-kafka clients may do: WRITE on the prefix `orders-` produces
  there and nowhere else, a consumer without READ on its group is refused its group, Metadata leaves
  out the topics a user may not describe, a DENY wins over an ALLOW, transactional ids are
  authorized; an ACL removed is enforced by every broker, each asked directly, soon after the
  removal is acknowledged;
- SCRAM users created and removed with AlterUserScramCredentials (Java AdminClient) authenticate,
  then fail to, against each of the three brokers;
- a group spanning zones works: the relaying broker reaches the coordinator on the inter-broker
  listener, and the coordinator authorizes the relayed requests as their members."""

from __future__ import annotations

import re
import socket
import ssl
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient, NewTopic, ResourcePatternType, ResourceType
from kio.schema.describe_acls.v3.request import DescribeAclsRequest
from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from scramp import ScramClient

from auth.acls import Operation, PatternType, Permission
from auth.acls import ResourceType as KafkaResourceType
from bench.servers import scrape
from tests.batches import make_batch
from tests.clients.java_client import Acl, AdminSession, JavaClientError
from tests.fixtures import Certificates, NeveNode, free_port
from tests.raw import Raw, produce_v9

WAIT_S = 120  # events awaited (a JVM, a transaction, a rebalance) on a slow machine
# The authorizer follows the ACLs through each broker's etcd watch, which delivers a change well
# under a second after it is written. An ACL removal must be enforced by every broker within a
# second of its acknowledgement; the bound asserted adds 4 s of slack for a machine loaded by
# parallel test workers (three brokers, etcd, SeaweedFS and a JVM on two cores), and the measured
# delays are in the failure message. The order is asserted strictly: the removal acknowledged
# first, then a refusal from each broker.
REVOKE_TARGET_S = 1.0
REVOKE_BOUND_S = REVOKE_TARGET_S + 4.0
PASSWORDS = {"admin": "admin-secret", "broker": "broker-secret", "alice": "alice-secret", "bob": "bob-secret"}
MECHANISM = "SCRAM-SHA-512"


@dataclass
class SecureCluster:
    cluster: object  # tests/conftest.py Cluster
    certs: Certificates
    ports: list[int]  # each broker's SASL_SSL client listener, by node id
    log_dir: Path
    metrics_ports: list[int]

    def metric(self, broker: int, name: str, **labels: str) -> float:
        """The sum of broker `broker`'s samples of `name` whose labels include `labels`."""
        total = 0.0
        for key, value in scrape(f"http://127.0.0.1:{self.metrics_ports[broker]}/metrics").items():
            metric, _, text = key.partition("{")
            if metric == name and labels.items() <= dict(re.findall(r'(\w+)="([^"]*)"', text)).items():
                total += value
        return total

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def config(self, user: str, password: str | None = None, port: int | None = None) -> dict:
        """confluent-kafka settings of `user` over SASL_SSL (one broker's listener when `port` is given)."""
        return {
            "bootstrap.servers": self.bootstrap if port is None else f"127.0.0.1:{port}",
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": MECHANISM,
            "sasl.username": user,
            "sasl.password": PASSWORDS[user] if password is None else password,
            "ssl.ca.location": self.certs.ca_file,
        }

    def java_config(self, user: str) -> dict[str, str]:
        """The Java client's settings of `user` over SASL_SSL, trusting the test authority."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.jaas.config": f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{PASSWORDS[user]}";',
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": self.certs.ca_file,
        }

    def java_admin(self, user: str = "admin") -> AdminSession:
        return AdminSession(self.bootstrap, self.log_dir / f"java-admin-{user}.log", timeout=WAIT_S, config=self.java_config(user))


def listener_port(log_path: Path, name: str) -> int:
    """The port the broker's listener `name` bound (port 0 in the settings), from the line it
    printed when it started listening."""
    found = re.findall(rf"SASL_SSL listener {name} on 127\.0\.0\.1:(\d+)", log_path.read_text())
    assert found, f"no {name} listener in {log_path}"
    return int(found[-1])


ZONES = ("a", "b", "c")


@pytest.fixture
def secure_cluster(cluster_factory, artifacts_dir) -> SecureCluster:
    """Three brokers (zones a, b, c) started here rather than by `cluster_factory`, each with its own
    metrics port; `cluster_factory` gives the servers and the metadata root, and stops them."""
    certs = Certificates(artifacts_dir / "certs")
    users = artifacts_dir / "scram-users"
    users.write_text("".join(f"{user}:{password}\n" for user, password in PASSWORDS.items()))
    security = {
        # PLAINTEXT on loopback first: the fixture sees the cluster formed through it (its clients
        # are anonymous: with the authorizer on they may list brokers and nothing else)
        "NEVE_BROKER_LISTENERS": "PLAINTEXT://127.0.0.1:{port},CLIENTS://127.0.0.1:0,INTERNAL://127.0.0.1:0",
        "NEVE_BROKER_LISTENER_SECURITY_PROTOCOL_MAP": "CLIENTS:SASL_SSL,INTERNAL:SASL_SSL",
        "NEVE_BROKER_SSL_CERTFILE": certs.server_cert,
        "NEVE_BROKER_SSL_KEYFILE": certs.server_key,
        "NEVE_BROKER_SSL_CAFILE": certs.ca_file,
        "NEVE_BROKER_SASL_ENABLED_MECHANISMS": MECHANISM,
        "NEVE_BROKER_SASL_SCRAM_USERS_FILE": str(users),
        "NEVE_BROKER_AUTHORIZER_ENABLED": "true",
        "NEVE_BROKER_SUPER_USERS": "User:admin;User:broker",
        "NEVE_BROKER_INTER_BROKER_LISTENER_NAME": "INTERNAL",
        "NEVE_BROKER_INTER_BROKER_SASL_USERNAME": "broker",
        "NEVE_BROKER_INTER_BROKER_SASL_PASSWORD": PASSWORDS["broker"],
    }
    cluster = cluster_factory(zones=())
    metrics_ports = []
    for i, zone in enumerate(ZONES):
        metrics_ports.append(free_port())
        data_dir = artifacts_dir / f"broker{i}-data"
        env = {
            **cluster.s3.env,
            "NEVE_METADATA_URL": cluster.metadata_url,
            "NEVE_WAL_OBJECT_STORE": cluster.object_store_url,
            "NEVE_BROKER_NODE_ID": str(i),
            "NEVE_BROKER_ZONE": zone,
            "NEVE_BROKER_METRICS_PORT": str(metrics_ports[-1]),
            "NEVE_WAL_LINGER_MS": "20",
            "NEVE_DATA_DIR": str(data_dir),
            **security,
        }
        node = NeveNode(data_dir=data_dir, log_path=artifacts_dir / f"broker{i}.log", env=env, command="broker")
        cluster.nodes.append(node)  # stopped by cluster_factory's teardown
        node.start()
    cluster.wait_formed()
    ports = [listener_port(node.log_path, "CLIENTS") for node in cluster.nodes]
    return SecureCluster(cluster, certs, ports, artifacts_dir, metrics_ports)


# -- a raw SASL_SSL connection to one broker ---------------------------------------------------------


class SecureRaw(Raw):
    """A blocking raw-frame connection to one broker's SASL_SSL listener: TLS trusting the test
    authority, then SaslHandshake v1 and SaslAuthenticate v2 (SCRAM-SHA-512) by hand, so that each
    request goes to exactly this broker."""

    def __init__(self, port: int, ca_file: str) -> None:
        context = ssl.create_default_context(cafile=ca_file)
        plain = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock = context.wrap_socket(plain, server_hostname="127.0.0.1")
        self.correlation_id = 100

    def authenticate(self, user: str, password: str) -> ErrorCode:
        """none once authenticated, else the error the broker answered (it then closes)."""
        cid = self.request(SaslHandshakeRequest(mechanism=MECHANISM))
        assert self.response(17, 1, cid).error_code == ErrorCode.none
        client = ScramClient([MECHANISM], user, password)
        cid = self.request(SaslAuthenticateRequest(auth_bytes=client.get_client_first().encode()))
        first = self.response(36, 2, cid)
        if first.error_code != ErrorCode.none:
            return first.error_code
        client.set_server_first(bytes(first.auth_bytes).decode())
        cid = self.request(SaslAuthenticateRequest(auth_bytes=client.get_client_final().encode()))
        final = self.response(36, 2, cid)
        if final.error_code == ErrorCode.none:
            client.set_server_final(bytes(final.auth_bytes).decode())  # the broker proves it holds the credential
        return final.error_code

    def acls(self) -> list[Acl]:
        """Every ACL binding this broker's view holds (DescribeAcls v3, filter: anything)."""
        cid = self.request(DescribeAclsRequest(resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=None, host_filter=None, operation=1, permission_type=1))
        answer = self.response(29, 3, cid)
        assert answer.error_code == ErrorCode.none, answer
        return sorted(
            Acl(KafkaResourceType(r.resource_type).name, r.resource_name, PatternType(r.pattern_type).name, a.principal, a.host, Operation(a.operation).name, Permission(a.permission_type).name) for r in answer.resources for a in r.acls
        )

    def produce(self, topic: str, value: bytes) -> tuple[ErrorCode, int]:
        """One record to partition 0: (error, base offset)."""
        cid = self.request(produce_v9(topic, {0: make_batch([(None, value, [], int(time.time() * 1000))])}))
        (answer,) = self.response(0, 9, cid).responses
        (partition,) = answer.partition_responses
        return partition.error_code, partition.base_offset


def authenticated(port: int, certs: Certificates, user: str, password: str) -> SecureRaw:
    raw = SecureRaw(port, certs.ca_file)
    error = raw.authenticate(user, password)
    assert error == ErrorCode.none, f"{user} on port {port}: {error.name}"
    return raw


def authentication_answer(port: int, certs: Certificates, user: str, password: str) -> ErrorCode:
    raw = SecureRaw(port, certs.ca_file)
    try:
        return raw.authenticate(user, password)
    finally:
        raw.close()


def until_every_broker_holds(secure: SecureCluster, acls: list[Acl]) -> None:
    """Until each broker, asked directly, describes exactly `acls`: a binding written through one
    broker reaches the others through their watches (the admin clients ask any broker)."""
    for port in secure.ports:
        raw = authenticated(port, secure.certs, "admin", PASSWORDS["admin"])
        try:
            deadline = time.monotonic() + WAIT_S
            while (held := raw.acls()) != sorted(acls):
                assert time.monotonic() < deadline, f"broker on {port} holds {held}, not {sorted(acls)}"
                time.sleep(0.05)
        finally:
            raw.close()


# -- the two AdminClients, behind one small interface --------------------------------------------


class JavaAcls:
    """ACLs through the Java AdminClient (a super user's session)."""

    def __init__(self, secure: SecureCluster) -> None:
        self.session = secure.java_admin("admin")

    def create(self, *acls: Acl) -> None:
        for acl in acls:
            self.session.create_acl(acl)

    def describe(self, **fields: str) -> list[Acl]:
        return self.session.describe_acls(**fields)

    def delete(self, **fields: str) -> list[Acl]:
        return self.session.delete_acls(**fields)

    def close(self) -> None:
        self.session.close()


class LibrdkafkaAcls:
    """ACLs through confluent-kafka's AdminClient (librdkafka), as a super user."""

    def __init__(self, secure: SecureCluster) -> None:
        self.admin = AdminClient(secure.config("admin"))

    def create(self, *acls: Acl) -> None:
        bindings = [AclBinding(ResourceType[a.resource_type], a.name, ResourcePatternType[a.pattern_type], a.principal, a.host, AclOperation[a.operation], AclPermissionType[a.permission]) for a in acls]
        for future in self.admin.create_acls(bindings, request_timeout=WAIT_S).values():
            assert future.result(timeout=WAIT_S) is None

    @staticmethod
    def _filter(fields: dict[str, str]) -> AclBindingFilter:
        return AclBindingFilter(
            ResourceType[fields.get("resource_type", "ANY")], fields.get("name"), ResourcePatternType[fields.get("pattern_type", "ANY")],
            fields.get("principal"), fields.get("host"), AclOperation[fields.get("operation", "ANY")], AclPermissionType[fields.get("permission", "ANY")],
        )  # fmt: skip

    @staticmethod
    def _acls(bindings) -> list[Acl]:
        return sorted(Acl(b.restype.name, b.name, b.resource_pattern_type.name, b.principal, b.host, b.operation.name, b.permission_type.name) for b in bindings)

    def describe(self, **fields: str) -> list[Acl]:
        return self._acls(self.admin.describe_acls(self._filter(fields), request_timeout=WAIT_S).result(timeout=WAIT_S))

    def delete(self, **fields: str) -> list[Acl]:
        (future,) = self.admin.delete_acls([self._filter(fields)], request_timeout=WAIT_S).values()
        return self._acls(future.result(timeout=WAIT_S))

    def close(self) -> None:
        self.admin = None


# -- confluent-kafka clients -----------------------------------------------------------------------


def produce(config: dict, topic: str, values: list[bytes], **more) -> list[tuple[int, int] | int]:
    """Each value's outcome in order: (partition, offset) when acknowledged, else the error code."""
    outcomes: dict[bytes, tuple[int, int] | int] = {}

    def on_delivery(err, msg) -> None:
        outcomes[msg.value()] = (msg.partition(), msg.offset()) if err is None else err.code()

    producer = Producer({**config, "acks": "all", "message.timeout.ms": 60_000, **more})
    for value in values:
        producer.produce(topic, value, partition=0, on_delivery=on_delivery)
    assert producer.flush(WAIT_S) == 0
    return [outcomes[v] for v in values]


def topic_values(config: dict, topic: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every committed record of partition 0, read without a group."""
    consumer = Consumer({**config, "group.id": f"reader-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=WAIT_S)
        if end == 0:
            return []  # nothing to wait for (a position is invalid until a first fetch)
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + WAIT_S
        while consumer.position([TopicPartition(topic, 0)])[0].offset < end:
            assert time.monotonic() < deadline, f"{topic}: read {got} of {end} offsets"
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got.append((msg.offset(), msg.value()))
        return got
    finally:
        consumer.close()


def group_poll(config: dict, topic: str, group: str, count: int, commit: bool = False) -> list[bytes] | int:
    """Subscribe in `group` and read `count` values (then commit the position after them when
    `commit`); the error code instead if the consumer is refused first."""
    consumer = Consumer({**config, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(got) < count:
            assert time.monotonic() < deadline, f"group {group}: {len(got)} of {count} values"
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                return msg.error().code()
            got.append(msg.value())
            last = msg.offset()
        if commit:
            consumer.commit(offsets=[TopicPartition(topic, 0, last + 1)], asynchronous=False)
        return got
    finally:
        consumer.close()


def topics_seen(config: dict) -> set[str]:
    return set(AdminClient(config).list_topics(timeout=WAIT_S).topics)


def until(predicate: Callable[[], object], timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.05)
    return result


# -- ACLs ------------------------------------------------------------------------------------------


ALICE = "User:alice"


@pytest.mark.parametrize("admin_client", ["java", "librdkafka"])
def test_acls_made_through_an_admin_client_decide_what_each_broker_allows(secure_cluster, admin_client):
    secure = secure_cluster
    admin_config, alice = secure.config("admin"), secure.config("alice")
    acls = JavaAcls(secure) if admin_client == "java" else LibrdkafkaAcls(secure)
    try:
        topics = ["orders-eu", "orders-blocked", "payments"]
        creator = AdminClient(admin_config)  # kept while its futures are pending: a collected client cancels them
        created = creator.create_topics([NewTopic(t, 1, 1) for t in topics], operation_timeout=WAIT_S)
        for future in created.values():
            future.result(timeout=WAIT_S)
        write_orders = Acl("TOPIC", "orders-", "PREFIXED", ALICE, "*", "WRITE", "ALLOW")
        deny_blocked = Acl("TOPIC", "orders-blocked", "LITERAL", ALICE, "*", "WRITE", "DENY")
        acls.create(write_orders, deny_blocked)
        held = [write_orders, deny_blocked]
        until_every_broker_holds(secure, held)
        assert acls.describe(principal=ALICE) == sorted([write_orders, deny_blocked])
        assert acls.describe(resource_type="TOPIC", name="orders-blocked", pattern_type="MATCH") == sorted([write_orders, deny_blocked])
        assert acls.describe(principal="User:bob") == []

        # WRITE on the prefix: alice produces there; elsewhere, and where a DENY names the topic, she
        # is refused and nothing is stored
        values = [f"order-{i}".encode() for i in range(10)]
        assert produce(alice, "orders-eu", values) == [(0, i) for i in range(10)]
        assert produce(alice, "payments", [b"p-0", b"p-1"]) == [KafkaError.TOPIC_AUTHORIZATION_FAILED] * 2
        assert produce(alice, "orders-blocked", [b"b-0"]) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
        assert topic_values(admin_config, "orders-eu") == list(enumerate(values))
        assert topic_values(admin_config, "payments") == [] and topic_values(admin_config, "orders-blocked") == []

        # Metadata names only what alice may describe (WRITE implies DESCRIBE, a DENY of WRITE does
        # not take DESCRIBE away); the super user sees all, an anonymous client nothing
        assert topics_seen(alice) == {"orders-eu", "orders-blocked"}
        assert topics_seen(admin_config) == set(topics)
        assert topics_seen({"bootstrap.servers": secure.cluster.nodes[0].bootstrap}) == set()

        # READ on the topic is not enough to consume in a group: READ on the group is needed too
        group = "alice-orders"
        read_orders = Acl("TOPIC", "orders-eu", "LITERAL", ALICE, "*", "READ", "ALLOW")
        acls.create(read_orders)
        held.append(read_orders)
        until_every_broker_holds(secure, held)
        assert group_poll(alice, "orders-eu", group, len(values)) == KafkaError.GROUP_AUTHORIZATION_FAILED
        read_group = Acl("GROUP", group, "LITERAL", ALICE, "*", "READ", "ALLOW")
        acls.create(read_group)
        held.append(read_group)
        until_every_broker_holds(secure, held)
        assert group_poll(alice, "orders-eu", group, len(values)) == values

        # a transactional producer needs WRITE on its transactional id
        txn_id = "alice-tx"
        refused = Producer({**alice, "transactional.id": txn_id})
        with pytest.raises(KafkaException) as caught:
            refused.init_transactions(WAIT_S)
        assert caught.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, caught.value
        write_txn = Acl("TRANSACTIONAL_ID", txn_id, "LITERAL", ALICE, "*", "WRITE", "ALLOW")
        acls.create(write_txn)
        held.append(write_txn)
        until_every_broker_holds(secure, held)
        producer = Producer({**alice, "transactional.id": txn_id})
        producer.init_transactions(WAIT_S)
        producer.begin_transaction()
        txn_values = [f"txn-{i}".encode() for i in range(3)]
        for value in txn_values:
            producer.produce("orders-eu", value, partition=0)
        producer.commit_transaction(WAIT_S)
        assert topic_values(admin_config, "orders-eu") == [*enumerate(values), *((10 + i, v) for i, v in enumerate(txn_values))]
        next_offset = 14  # the commit marker took offset 13

        # removing the prefix ACL: each broker, asked directly on its own connection, refuses
        # alice's next produce soon after the removal is acknowledged
        direct = [authenticated(port, secure.certs, "alice", PASSWORDS["alice"]) for port in secure.ports]
        expected = [*enumerate(values), *((10 + i, v) for i, v in enumerate(txn_values))]
        for n, raw in enumerate(direct):
            value = f"direct-{n}-before".encode()
            assert raw.produce("orders-eu", value) == (ErrorCode.none, next_offset)
            expected.append((next_offset, value))
            next_offset += 1
        assert acls.delete(resource_type="TOPIC", name="orders-", pattern_type="PREFIXED", principal=ALICE) == [write_orders]
        removed_at = time.monotonic()
        refused_after: dict[int, float] = {}
        attempts = 0
        while len(refused_after) < len(direct):
            for n, raw in enumerate(direct):
                if n in refused_after:
                    continue
                value = f"direct-{n}-after-{attempts}".encode()
                error, offset = raw.produce("orders-eu", value)
                if error == ErrorCode.none:  # this broker's watch has not delivered the removal yet
                    assert offset == next_offset
                    expected.append((offset, value))
                    next_offset += 1
                else:
                    assert (error, offset) == (ErrorCode.topic_authorization_failed, -1)
                    refused_after[n] = time.monotonic() - removed_at
            attempts += 1
            waited = time.monotonic() - removed_at
            assert waited < REVOKE_BOUND_S, f"removal not enforced by brokers {sorted(set(range(3)) - set(refused_after))} after {waited:.2f}s (refused: {refused_after})"
        # enforced for good, on every broker
        assert [raw.produce("orders-eu", b"late") for raw in direct] == [(ErrorCode.topic_authorization_failed, -1)] * 3
        for raw in direct:
            raw.close()
        assert topic_values(admin_config, "orders-eu") == expected
        assert produce(alice, "orders-eu", [b"refused"]) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
        assert topics_seen(alice) == {"orders-eu"}  # READ on it is left; orders-blocked is no longer described
        held.remove(write_orders)
        until_every_broker_holds(secure, held)
        assert acls.describe(principal=ALICE) == sorted([deny_blocked, read_orders, read_group, write_txn])
        del refused, producer, creator  # librdkafka handles end here, not at the brokers' teardown
        print(f"ACL removal enforced after {', '.join(f'broker {n}: {s * 1000:.0f} ms' for n, s in sorted(refused_after.items()))}")
    finally:
        acls.close()


# -- SCRAM users -----------------------------------------------------------------------------------


def test_users_made_and_removed_with_alter_user_scram_credentials_authenticate_on_every_broker(secure_cluster):
    secure = secure_cluster
    certs = secure.certs
    admin = secure.java_admin("admin")
    try:
        bootstrapped = [("SCRAM_SHA_256", 8192), ("SCRAM_SHA_512", 8192)]
        assert admin.describe_scram() == {"admin": bootstrapped, "alice": bootstrapped, "bob": bootstrapped, "broker": bootstrapped}
        for port in secure.ports:
            assert authentication_answer(port, certs, "carol", "carol-secret") == ErrorCode.sasl_authentication_failed

        admin.upsert_scram("carol", "carol-secret", "SCRAM_SHA_512", iterations=4096)
        for port in secure.ports:  # each broker learns of her through its watch
            until(lambda port=port: authentication_answer(port, certs, "carol", "carol-secret") == ErrorCode.none, WAIT_S, f"carol on {port}")
            assert authentication_answer(port, certs, "carol", "wrong") == ErrorCode.sasl_authentication_failed
        # every broker holds her now, whichever the admin client asks
        assert admin.describe_scram("carol") == {"carol": [("SCRAM_SHA_512", 4096)]}
        # a stock client authenticates as her too: she sees no topic (no ACL names her)
        assert topics_seen(secure.config("carol", "carol-secret")) == set()

        # alice is no super user: she may not make users, nor grant herself ACLs
        alice_admin = secure.java_admin("alice")
        try:
            with pytest.raises(JavaClientError, match="ClusterAuthorizationException"):
                alice_admin.upsert_scram("mallory", "mallory-secret")
            with pytest.raises(JavaClientError, match="ClusterAuthorizationException"):
                alice_admin.create_acl(Acl("TOPIC", "*", "LITERAL", ALICE, "*", "ALL", "ALLOW"))
        finally:
            alice_admin.close()

        admin.delete_scram("carol", "SCRAM_SHA_512")
        for port in secure.ports:
            until(lambda port=port: authentication_answer(port, certs, "carol", "carol-secret") == ErrorCode.sasl_authentication_failed, WAIT_S, f"carol refused on {port}")
        assert "carol" not in admin.describe_scram()
        assert admin.describe_scram("carol", "alice") == {"carol": None, "alice": bootstrapped}  # carol: RESOURCE_NOT_FOUND
        # the others are served as before on every broker
        for port in secure.ports:
            assert authentication_answer(port, certs, "alice", PASSWORDS["alice"]) == ErrorCode.none
    finally:
        admin.close()


# -- the inter-broker listener ---------------------------------------------------------------------


def test_a_group_spanning_zones_reaches_its_coordinator_over_the_inter_broker_listener(secure_cluster):
    """A zoned member's group requests go to its zone's broker, which relays them to the group's
    coordinator over the SASL_SSL inter-broker listener as the broker's own user; the coordinator
    authorizes each as the member's principal."""
    secure = secure_cluster
    admin_config = secure.config("admin")
    topic, group = "orders-zoned", "zoned-readers"
    creator = AdminClient(admin_config)
    creator.create_topics([NewTopic(topic, 1, 1)], operation_timeout=WAIT_S)[topic].result(timeout=WAIT_S)
    values = [f"z-{i}".encode() for i in range(20)]
    assert produce(admin_config, topic, values) == [(0, i) for i in range(20)]
    acls = LibrdkafkaAcls(secure)
    granted = [
        Acl("TOPIC", topic, "LITERAL", ALICE, "*", "READ", "ALLOW"),
        Acl("GROUP", group, "LITERAL", ALICE, "*", "READ", "ALLOW"),
        Acl("TOPIC", topic, "LITERAL", "User:bob", "*", "READ", "ALLOW"),
        Acl("GROUP", group, "LITERAL", "User:bob", "*", "DESCRIBE", "ALLOW"),  # he finds the group, may not join it
    ]
    acls.create(*granted)
    until_every_broker_holds(secure, granted)

    def member(user: str, zone: int) -> dict:
        return {**secure.config(user, port=secure.ports[zone]), "client.id": f"{user}-member,zone_id={ZONES[zone]}"}

    # zone a looks the group up first: its coordinator is zone a's broker (0)
    assert group_poll(member("alice", 0), topic, group, 10, commit=True) == values[:10]
    relayed = secure.metric(1, "neve_group_forwarded_requests_total")
    # zone b's member resumes where zone a's committed, its group requests relayed by broker 1
    assert group_poll(member("alice", 1), topic, group, 10) == values[10:]
    assert secure.metric(1, "neve_group_forwarded_requests_total", api="JoinGroup") >= 1
    assert secure.metric(1, "neve_group_forwarded_requests_total") > relayed
    # bob's JoinGroup is relayed too, and refused by the coordinator as bob
    joins = secure.metric(1, "neve_group_forwarded_requests_total", api="JoinGroup")
    assert group_poll(member("bob", 1), topic, group, 1) == KafkaError.GROUP_AUTHORIZATION_FAILED
    assert secure.metric(1, "neve_group_forwarded_requests_total", api="JoinGroup") > joins
    assert sum(secure.metric(n, "neve_group_forward_failures_total") for n in range(3)) == 0
    del creator
    acls.close()

"""Group requests relayed across zones on SASL listeners with the authorizer on (four in-process
listeners in two zones over one embedded store, as tests/broker/test_group_forwarding.py): the
relaying broker authenticates to the coordinator as its own user (SCRAM-SHA-512, a super user) and
the coordinator checks each relayed request as the client's own principal; a client that is not a
broker cannot speak for another."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest

from auth.acls import AclBinding, Operation, PatternType, Permission, ResourceType
from auth.authorizer import Authorizer
from auth.credentials import ScramCredentials
from auth.sasl import JwtValidation, SaslMechanisms
from broker.forwarding import RELAY_MARK, mark, relayed_for
from broker.listeners import Listener
from broker.peer_dial import PeerDialer
from broker.server import KafkaServer
from metadata.embedded import EmbeddedMetadataStore
from tests.broker.test_group_forwarding import NONE, Client, Cluster, forwarded, join, join_request, links_accepted

PASSWORDS = {"broker": "broker-secret", "alice": "alice-pw", "bob": "bob-pw"}
ISSUER = "https://issuer.neve.test"
GROUP_AUTHORIZATION_FAILED = int(ErrorCode.group_authorization_failed)


def user(name: str) -> PeerDialer:
    return PeerDialer(mechanism="SCRAM-SHA-512", username=name, password=PASSWORDS[name])


class SaslClient(Client):
    """A raw-frame client that authenticates first, as `name`."""

    def __init__(self, port: int, client_id: str, name: str) -> None:
        super().__init__(port, client_id)
        self.dialer = user(name)

    async def __aenter__(self) -> SaslClient:
        self.reader, self.writer = await self.dialer.open("127.0.0.1", self.port)
        return self


@pytest.fixture
def signing(tmp_path):
    """An identity provider's key and the JWKS file the brokers check tokens against."""
    from tests.auth.test_oauthbearer import jwks, rsa_key

    key = rsa_key()
    (tmp_path / "jwks.json").write_text(jwks(key, "k1"))
    return key, str(tmp_path / "jwks.json")


class TokenClient(Client):
    """A raw-frame client that authenticates with an OAUTHBEARER token whose subject is `subject`."""

    def __init__(self, port: int, client_id: str, key, subject: str) -> None:
        super().__init__(port, client_id)
        self.key, self.subject = key, subject

    async def __aenter__(self) -> TokenClient:
        from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
        from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

        from tests.auth.test_oauthbearer import initial_response, token

        await super().__aenter__()
        assert (await self.ask(SaslHandshakeRequest(mechanism="OAUTHBEARER"))).error_code == NONE
        self.authentication = await self.ask(SaslAuthenticateRequest(auth_bytes=initial_response(token(self.key, sub=self.subject, iss=ISSUER))))
        return self


@pytest.fixture
async def secured(signing):
    store = EmbeddedMetadataStore(None)
    await store.start()
    credentials = ScramCredentials(store)
    for name, password in PASSWORDS.items():
        await credentials.bootstrap(name, password, "SCRAM-SHA-512")
    c = Cluster(store)
    authorizer = Authorizer(store, ["User:broker"])
    for n, services in c.services.items():
        services.sasl = SaslMechanisms(["SCRAM-SHA-512", "OAUTHBEARER"], credentials, jwt=JwtValidation(jwks_file=signing[1], issuer=ISSUER))
        services.authorizer = authorizer
        listener = Listener("SASL_PLAINTEXT", "SASL_PLAINTEXT", "127.0.0.1", c.ports[n], "127.0.0.1")
        c.servers[n] = KafkaServer(services, [listener], dialer=user("broker"))
    for n, broker in c.brokers.items():
        await store.register_broker(broker)
        await c.servers[n].start()
    await store.create_topic("t", 4)
    yield c, authorizer
    for server in c.servers.values():
        await server.stop()
    for services in c.services.values():
        services.coordinator.close()
    await store.close()


async def test_a_relayed_request_is_authorized_as_its_client_on_the_coordinator(secured):
    cluster, authorizer = secured
    group, coordinator, relay = await zone_a_group_as(cluster, "broker")
    await authorizer.create([AclBinding(ResourceType.GROUP, group, PatternType.LITERAL, "User:alice", "*", Operation.READ, Permission.ALLOW)])
    relayed_before, links_before = forwarded("JoinGroup"), links_accepted("a")
    async with SaslClient(cluster.ports[relay], "member-b,zone_id=b", "alice") as alice:
        joined = await join(alice, group)
        assert joined.generation_id == 1 and joined.leader == joined.member_id
    assert forwarded("JoinGroup") > relayed_before  # through the relay, authenticated as the broker
    assert links_accepted("a") == links_before + 1  # the link counted as a broker's, after its SASL exchange
    async with SaslClient(cluster.ports[relay], "member-b2,zone_id=b", "bob") as bob:
        refused = await bob.ask(join_request(group))
        assert refused.error_code == GROUP_AUTHORIZATION_FAILED  # bob's own principal, checked by the coordinator


async def test_a_client_cannot_speak_for_another_through_the_relay_mark(secured):
    cluster, authorizer = secured
    group, coordinator, _ = await zone_a_group_as(cluster, "broker")
    await authorizer.create([AclBinding(ResourceType.GROUP, group, PatternType.LITERAL, "User:alice", "*", Operation.ALL, Permission.ALLOW)])
    async with SaslClient(cluster.ports[coordinator], mark("sneaky", "10.0.0.1", "User:alice"), "bob") as bob:
        bob.send(join_request(group))
        with pytest.raises(asyncio.IncompleteReadError):
            await bob.frame()  # the connection is closed: bob is no broker
    async with SaslClient(cluster.ports[coordinator], "alice-direct", "alice") as alice:  # the broker serves the others
        answer = await alice.ask(join_request(group))
        assert answer.error_code in (NONE, 79)  # in, or asked to come back with its member id


async def zone_a_group_as(cluster, name: str) -> tuple[str, int, int]:
    """A new group whose home is zone a, placed by `name`'s FindCoordinator from zone a: (its id,
    its coordinator, zone b's relay)."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    async with SaslClient(cluster.ports[0], "first,zone_id=a", name) as c:
        answer = await c.ask(FindCoordinatorRequest(key_type=0, coordinator_keys=(group,)))
        assert answer.coordinators[0].error_code == NONE
    return group, *cluster.roles(group)


async def test_a_principal_holding_the_relay_mark_cannot_pass_for_another(secured, signing):
    """Issue 43, finding 2: a token whose subject holds the relay mark and another's principal,
    through zone b's relay to zone a's coordinator. On main the coordinator read the principal
    after the mark's last separator and let mallory in as alice. Now such a name authenticates no
    one, and a mark is read by its lengths whatever the names hold."""
    cluster, authorizer = secured
    key, _ = signing
    group, coordinator, relay = await zone_a_group_as(cluster, "broker")
    await authorizer.create([AclBinding(ResourceType.GROUP, group, PatternType.LITERAL, "User:alice", "*", Operation.ALL, Permission.ALLOW)])
    forged = f"mallory{RELAY_MARK}10.0.0.1\x1fUser:alice"  # as main wrote a mark: host, separator, principal
    async with TokenClient(cluster.ports[relay], "member-b,zone_id=b", key, forged) as mallory:
        assert mallory.authentication.error_code == int(ErrorCode.sasl_authentication_failed)
        with pytest.raises(asyncio.IncompleteReadError):
            await mallory.ask(join_request(group))  # closed after the failed authentication
    async with TokenClient(cluster.ports[relay], "member-b,zone_id=b", key, "alice") as alice:  # a subject without one is served
        assert alice.authentication.error_code == NONE
        joined = await join(alice, group)
        assert joined.generation_id >= 1 and joined.member_id
    # whatever a client id or a principal holds, the coordinator reads back what the relay wrote
    for own, principal in ((f"c{RELAY_MARK}1,2,3", "User:x"), ("c", f"User:m{RELAY_MARK}10.0.0.1\x1fUser:alice"), (None, "User:a,b")):
        assert relayed_for(mark(own, "10.0.0.7", principal)) == (own, "10.0.0.7", principal)


async def test_a_principal_without_rights_on_a_group_records_nothing_of_it(secured):
    """Issue 43, finding 3: a zoned client's group request reached the relay's placement, which
    wrote the group's home zone to the store, before the handler's ACL check: one lasting key per
    group id a client names, and a victim's future group pinned to the asker's zone. Now the
    request is refused first and nothing is written."""
    from broker.groups.coordinator import HOME_ZONES

    cluster, _ = secured
    group = f"victim-{uuid.uuid4().hex[:8]}"
    async with SaslClient(cluster.ports[2], "bob-b,zone_id=b", "bob") as bob:
        refused = await bob.ask(join_request(group))
        assert refused.error_code == GROUP_AUTHORIZATION_FAILED
        described = await bob.ask(FindCoordinatorRequest(key_type=0, coordinator_keys=(group,)))
        assert described.coordinators[0].error_code == GROUP_AUTHORIZATION_FAILED
    assert await cluster.store.registry_get(HOME_ZONES + group) is None

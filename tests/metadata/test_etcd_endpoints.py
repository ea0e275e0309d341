"""An etcd:// URL naming several members of one cluster (`etcd://h1:p1,h2:p2,h3:p3/root`): how it
is parsed, the gRPC target it becomes, and a store that reaches etcd through the one member of
the list that answers (the chaos harness points brokers at every member, each through a proxy)."""

from __future__ import annotations

import uuid

import pytest

from metadata.etcd.client import grpc_target, split_endpoints
from metadata.store import load_metadata_store
from tests.fixtures import free_port


def test_several_members_become_one_ipv4_target():
    assert split_endpoints("10.1.2.3:2379,10.1.2.4:2380") == [("10.1.2.3", 2379), ("10.1.2.4", 2380)]
    assert grpc_target("10.1.2.3:2379,10.1.2.4:2380", 0) == "ipv4:10.1.2.3:2379,10.1.2.4:2380"
    assert grpc_target("etcd.example", 2379) == "etcd.example:2379"  # one member: as before, a name resolved by DNS


@pytest.mark.parametrize("netloc", ["etcd-a:2379,etcd-b:2379", "10.0.0.1,10.0.0.2:2379", "10.0.0.1:x,10.0.0.2:2379"])
def test_a_member_list_takes_addresses_and_ports_only(netloc):
    with pytest.raises(ValueError, match="ipv4-address:port"):
        load_metadata_store(f"etcd://{netloc}/root")


def test_the_url_keeps_root_and_query_with_several_members():
    store = load_metadata_store("etcd://10.0.0.1:1,10.0.0.2:2/my-root?tls=true")
    assert store.host == "10.0.0.1:1,10.0.0.2:2" and store.keys.root == "my-root" and store.security.tls


async def test_a_store_reaches_etcd_through_the_member_that_answers(etcd_server):
    dead = free_port()  # nothing listens there: the channel moves on to the next address
    store = load_metadata_store(f"etcd://127.0.0.1:{dead},127.0.0.1:{etcd_server.ports['client']}/endpoints-{uuid.uuid4().hex[:8]}")
    await store.start()
    try:
        info = await store.create_topic("t", 2)
        assert info.partitions == 2
    finally:
        await store.close()

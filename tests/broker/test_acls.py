"""ACLs in the handlers: each handler called in-process with a RequestContext whose session has a
principal, over the embedded metadata store, an in-memory object store and the real WAL writer.
The ACL admin APIs (CreateAcls, DescribeAcls, DeleteAcls) make the bindings the checks then read,
and answer SECURITY_DISABLED without an authorizer, as Kafka does."""

from __future__ import annotations

import asyncio
import datetime

import pytest
from kio.schema.create_acls.v3 import request as create_v3
from kio.schema.delete_acls.v3 import request as delete_v3
from kio.schema.describe_acls.v3.request import DescribeAclsRequest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch_v12
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.join_group.v9 import request as join_v9
from kio.schema.metadata.v12 import request as metadata_v12
from kio.schema.offset_commit.v8 import request as commit_v8
from kio.schema.produce.v9 import request as produce_v9

from auth.acls import Operation, PatternType, Permission, ResourceType
from auth.authorizer import Authorizer
from auth.session import Session
from broker.appender import commit_fn
from broker.codec import OnePartitionProduce, response_module
from broker.config import BrokerConfig
from broker.context import RequestContext, Services
from broker.registry import load_handlers
from cache.reader import ObjectReader, RecentObjects
from metadata.store import load_metadata_store
from tests.batches import make_batch
from wal.store import load_object_store
from wal.writer import WalWriter

ALICE = "User:alice"
HOST = "10.0.0.7"
ADMIN = "User:admin"
ANY, LITERAL, PREFIXED, MATCH = PatternType.ANY, PatternType.LITERAL, PatternType.PREFIXED, PatternType.MATCH
HANDLERS = load_handlers()


class Broker:
    """One broker's services, its handlers called as a connection would call them."""

    def __init__(self, store, authorizer: Authorizer | None) -> None:
        self.store = store
        objects = load_object_store("memory://")
        self.wal = WalWriter(objects, commit_fn(store), linger_ms=1)
        self.services = Services(settings=BrokerConfig(), metadata=store, wal=self.wal, reader=ObjectReader(objects, RecentObjects(1 << 20)), authorizer=authorizer)

    async def call(self, api_key: int, version: int, request, principal: str = ALICE):
        ctx = RequestContext(self.services, api_key, version, "test-client", response_module(api_key, version), session=Session(host=HOST, principal=principal))
        answer = HANDLERS[api_key].fn(ctx, request)
        return await asyncio.wait_for(answer, 30)

    async def allow(self, resource_type, name, operation, pattern=LITERAL, principal=ALICE, permission=Permission.ALLOW):
        creation = create_v3.AclCreation(resource_type=resource_type, resource_name=name, resource_pattern_type=pattern, principal=principal, host="*", operation=operation, permission_type=permission)
        answer = await self.call(30, 3, create_v3.CreateAclsRequest(creations=(creation,)), principal=ADMIN)
        assert [r.error_code for r in answer.results] == [ErrorCode.none]


@pytest.fixture
async def store():
    s = load_metadata_store("memory://")
    await s.start()
    for name in ("orders-eu", "payments"):
        await s.create_topic(name, 2)
    yield s
    await s.close()


@pytest.fixture
async def broker(store):
    b = Broker(store, Authorizer(store, super_users=[ADMIN]))
    yield b
    await b.wal.close()


def produce_request(*topics: str, transactional_id=None):
    batch = make_batch([(b"k", b"v", [], 1_700_000_000_000)])
    data = tuple(produce_v9.TopicProduceData(name=t, partition_data=(produce_v9.PartitionProduceData(index=0, records=batch),)) for t in topics)
    return produce_v9.ProduceRequest(transactional_id=transactional_id, acks=-1, timeout=datetime.timedelta(seconds=30), topic_data=data)


def produced(answer) -> list[tuple[str, ErrorCode, int]]:
    if isinstance(answer, OnePartitionProduce):
        return [(answer.name, answer.error_code, answer.base_offset)]
    return [(t.name, p.error_code, p.base_offset) for t in answer.responses for p in t.partition_responses]


async def test_write_on_a_prefix_lets_a_user_produce_there_and_nowhere_else(broker, store):
    await broker.allow(ResourceType.TOPIC, "orders-", Operation.WRITE, PREFIXED)
    answer = await broker.call(0, 9, produce_request("orders-eu", "payments", "orders-new"))
    assert produced(answer) == [
        ("orders-eu", ErrorCode.none, 0),
        ("payments", ErrorCode.topic_authorization_failed, -1),
        # authorized, so its absence may be told
        ("orders-new", ErrorCode.unknown_topic_or_partition, -1),
    ]
    info = store.topics()["orders-eu"]
    assert store.high_watermark(info.topic_id, 0) == 1
    assert store.high_watermark(store.topics()["payments"].topic_id, 0) == 0  # nothing stored there
    # a transactional request needs WRITE on its transactional id, whatever the topics
    answer = await broker.call(0, 9, produce_request("orders-eu", transactional_id="tx-1"))
    assert produced(answer) == [("orders-eu", ErrorCode.transactional_id_authorization_failed, -1)]


async def test_fetch_needs_read_on_the_topic(broker, store):
    await broker.allow(ResourceType.TOPIC, "orders-eu", Operation.READ)
    topics = tuple(
        fetch_v12.FetchTopic(topic=t, partitions=(fetch_v12.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20),)) for t in ("orders-eu", "payments")
    )
    request = fetch_v12.FetchRequest(cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1, topics=topics, forgotten_topics_data=(), rack_id="")
    answer = await broker.call(1, 12, request)
    assert [(t, [p[1] for p in parts]) for t, parts in answer.topics] == [("orders-eu", [ErrorCode.none]), ("payments", [ErrorCode.topic_authorization_failed])]


async def test_metadata_leaves_out_topics_the_user_may_not_describe(broker, store):
    await broker.allow(ResourceType.TOPIC, "orders-", Operation.READ, PREFIXED)  # READ implies DESCRIBE
    everything = metadata_v12.MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=True)
    answer = await broker.call(3, 12, everything)
    assert [(t.name, t.error_code, t.topic_authorized_operations) for t in answer.topics] == [
        ("orders-eu", ErrorCode.none, (1 << Operation.READ) | (1 << Operation.DESCRIBE)),
    ]
    # named: refused without telling whether it exists
    named = metadata_v12.MetadataRequest(topics=tuple(metadata_v12.MetadataRequestTopic(topic_id=None, name=n) for n in ("payments", "nope")), allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    answer = await broker.call(3, 12, named)
    assert [(t.name, t.error_code, t.partitions) for t in answer.topics] == [("payments", ErrorCode.topic_authorization_failed, ()), ("nope", ErrorCode.topic_authorization_failed, ())]
    # by id: refused without its name (issue 43, finding 7); a described one is named
    by_id = metadata_v12.MetadataRequest(
        topics=tuple(metadata_v12.MetadataRequestTopic(topic_id=store.topics()[n].topic_id, name=None) for n in ("payments", "orders-eu")), allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    answer = await broker.call(3, 12, by_id)
    assert [(t.name, t.topic_id, t.error_code) for t in answer.topics] == [
        (None, store.topics()["payments"].topic_id, ErrorCode.topic_authorization_failed),
        ("orders-eu", store.topics()["orders-eu"].topic_id, ErrorCode.none),
    ]
    # a super user sees everything
    answer = await broker.call(3, 12, everything, principal=ADMIN)
    assert [t.name for t in answer.topics] == ["orders-eu", "payments"]


async def test_metadata_auto_creation_needs_create(store):
    from dataclasses import replace

    broker = Broker(store, Authorizer(store, super_users=[ADMIN]))
    broker.services.settings = replace(broker.services.settings, auto_create_topics=True)
    await broker.allow(ResourceType.TOPIC, "*", Operation.DESCRIBE)
    ask = metadata_v12.MetadataRequest(topics=(metadata_v12.MetadataRequestTopic(topic_id=None, name="fresh"),), allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    answer = await broker.call(3, 12, ask)
    assert [(t.name, t.error_code) for t in answer.topics] == [("fresh", ErrorCode.topic_authorization_failed)]
    assert "fresh" not in store.topics()
    await broker.allow(ResourceType.TOPIC, "fresh", Operation.CREATE)
    answer = await broker.call(3, 12, ask)
    assert [(t.name, t.error_code, len(t.partitions)) for t in answer.topics] == [("fresh", ErrorCode.none, broker.services.settings.default_partitions)]
    await broker.wal.close()


def commit_request(group: str, *topics: str):
    parts = (commit_v8.OffsetCommitRequestPartition(partition_index=0, committed_offset=5, committed_leader_epoch=-1, committed_metadata=None),)
    return commit_v8.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None, topics=tuple(commit_v8.OffsetCommitRequestTopic(name=t, partitions=parts) for t in topics))


async def test_group_read_is_needed_to_commit_join_and_find_a_group(broker, store):
    await broker.allow(ResourceType.TOPIC, "orders-eu", Operation.READ)
    answer = await broker.call(8, 8, commit_request("billing", "orders-eu"))
    assert [(t.name, p.error_code) for t in answer.topics for p in t.partitions] == [("orders-eu", ErrorCode.group_authorization_failed)]
    assert await store.fetch_offsets("billing") == {}
    join = join_v9.JoinGroupRequest(
        group_id="billing",
        session_timeout=datetime.timedelta(seconds=10),
        rebalance_timeout=datetime.timedelta(seconds=10),
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(join_v9.JoinGroupRequestProtocol(name="range", metadata=b""),),
        reason=None,
    )
    assert (await broker.call(11, 9, join)).error_code == ErrorCode.group_authorization_failed
    found = await broker.call(10, 4, FindCoordinatorRequest(key_type=0, coordinator_keys=("billing",)))
    assert [(c.key, c.error_code) for c in found.coordinators] == [("billing", ErrorCode.group_authorization_failed)]

    await broker.allow(ResourceType.GROUP, "billing", Operation.READ)
    answer = await broker.call(8, 8, commit_request("billing", "orders-eu", "payments"))
    assert [(t.name, p.error_code) for t in answer.topics for p in t.partitions] == [("orders-eu", ErrorCode.none), ("payments", ErrorCode.topic_authorization_failed)]
    offsets = await store.fetch_offsets("billing")
    assert [(store.topic_by_id(tp[0]).name, tp[1], c.offset) for tp, c in offsets.items()] == [("orders-eu", 0, 5)]
    found = await broker.call(10, 4, FindCoordinatorRequest(key_type=0, coordinator_keys=("billing",)))
    assert [(c.key, c.error_code) for c in found.coordinators] == [("billing", ErrorCode.none)]


async def test_an_idempotent_producer_needs_idempotent_write_or_write_on_some_topic(broker):
    ask = InitProducerIdRequest(transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1)
    assert (await broker.call(22, 4, ask)).error_code == ErrorCode.cluster_authorization_failed
    await broker.allow(ResourceType.TOPIC, "orders-", Operation.WRITE, PREFIXED)
    answer = await broker.call(22, 4, ask)
    assert (answer.error_code, answer.producer_epoch) == (ErrorCode.none, 0)
    txn = InitProducerIdRequest(transactional_id="tx-1", transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1)
    assert (await broker.call(22, 4, txn)).error_code == ErrorCode.transactional_id_authorization_failed


def acl_filter(cls, resource_type=ResourceType.ANY, name=None, pattern=ANY, principal=None, operation=Operation.ANY, permission=Permission.ANY):
    return cls(resource_type_filter=resource_type, resource_name_filter=name, pattern_type_filter=pattern, principal_filter=principal, host_filter=None, operation=operation, permission_type=permission)


def described(answer) -> list[tuple]:
    return [(r.resource_type, r.resource_name, r.pattern_type, a.principal, a.host, a.operation, a.permission_type) for r in answer.resources for a in r.acls]


async def test_create_describe_delete_acls_round_trip_with_filters(broker):
    creations = (
        create_v3.AclCreation(resource_type=ResourceType.TOPIC, resource_name="orders-", resource_pattern_type=PREFIXED, principal=ALICE, host="*", operation=Operation.WRITE, permission_type=Permission.ALLOW),
        create_v3.AclCreation(resource_type=ResourceType.TOPIC, resource_name="orders-eu", resource_pattern_type=LITERAL, principal="User:bob", host=HOST, operation=Operation.READ, permission_type=Permission.DENY),
        create_v3.AclCreation(resource_type=ResourceType.GROUP, resource_name="*", resource_pattern_type=LITERAL, principal="User:*", host="*", operation=Operation.READ, permission_type=Permission.ALLOW),
        create_v3.AclCreation(resource_type=ResourceType.CLUSTER, resource_name="other", resource_pattern_type=LITERAL, principal=ALICE, host="*", operation=Operation.ALTER, permission_type=Permission.ALLOW),
        create_v3.AclCreation(resource_type=ResourceType.DELEGATION_TOKEN, resource_name="tok", resource_pattern_type=LITERAL, principal=ALICE, host="*", operation=Operation.DESCRIBE, permission_type=Permission.ALLOW),
    )
    # only a principal that may ALTER the cluster creates ACLs
    refused = await broker.call(30, 3, create_v3.CreateAclsRequest(creations=creations))
    assert [r.error_code for r in refused.results] == [ErrorCode.cluster_authorization_failed] * 5
    created = await broker.call(30, 3, create_v3.CreateAclsRequest(creations=creations), principal=ADMIN)
    assert [r.error_code for r in created.results] == [ErrorCode.none, ErrorCode.none, ErrorCode.none, ErrorCode.invalid_request, ErrorCode.invalid_request]
    assert "delegation tokens" in created.results[4].error_message

    every = await broker.call(29, 3, acl_filter(DescribeAclsRequest), principal=ADMIN)
    assert described(every) == [
        (ResourceType.TOPIC, "orders-", PREFIXED, ALICE, "*", Operation.WRITE, Permission.ALLOW),
        (ResourceType.TOPIC, "orders-eu", LITERAL, "User:bob", HOST, Operation.READ, Permission.DENY),
        (ResourceType.GROUP, "*", LITERAL, "User:*", "*", Operation.READ, Permission.ALLOW),
    ]
    matching = await broker.call(29, 3, acl_filter(DescribeAclsRequest, ResourceType.TOPIC, "orders-eu", MATCH), principal=ADMIN)
    assert [(r[1], r[2]) for r in described(matching)] == [("orders-", PREFIXED), ("orders-eu", LITERAL)]
    exact = await broker.call(29, 3, acl_filter(DescribeAclsRequest, ResourceType.TOPIC, "orders-eu", LITERAL), principal=ADMIN)
    assert [(r[1], r[2]) for r in described(exact)] == [("orders-eu", LITERAL)]
    assert (await broker.call(29, 3, acl_filter(DescribeAclsRequest))).error_code == ErrorCode.cluster_authorization_failed
    bad = await broker.call(29, 3, acl_filter(DescribeAclsRequest, pattern=PatternType.UNKNOWN), principal=ADMIN)
    assert bad.error_code == ErrorCode.invalid_request

    # the denied bob, then every ALLOW on a group; a filter matching nothing removes nothing
    filters = (acl_filter(delete_v3.DeleteAclsFilter, principal="User:bob"), acl_filter(delete_v3.DeleteAclsFilter, ResourceType.GROUP, permission=Permission.ALLOW), acl_filter(delete_v3.DeleteAclsFilter, name="nothing"))
    deleted = await broker.call(31, 3, delete_v3.DeleteAclsRequest(filters=filters), principal=ADMIN)
    assert [(f.error_code, [(m.resource_type, m.resource_name, m.principal) for m in f.matching_acls]) for f in deleted.filter_results] == [
        (ErrorCode.none, [(ResourceType.TOPIC, "orders-eu", "User:bob")]),
        (ErrorCode.none, [(ResourceType.GROUP, "*", "User:*")]),
        (ErrorCode.none, []),
    ]
    left = await broker.call(29, 3, acl_filter(DescribeAclsRequest), principal=ADMIN)
    assert described(left) == [(ResourceType.TOPIC, "orders-", PREFIXED, ALICE, "*", Operation.WRITE, Permission.ALLOW)]


async def test_the_acl_apis_answer_security_disabled_without_an_authorizer(store):
    broker = Broker(store, None)
    creation = create_v3.AclCreation(resource_type=ResourceType.TOPIC, resource_name="t", resource_pattern_type=LITERAL, principal=ALICE, host="*", operation=Operation.READ, permission_type=Permission.ALLOW)
    created = await broker.call(30, 3, create_v3.CreateAclsRequest(creations=(creation, creation)))
    assert [r.error_code for r in created.results] == [ErrorCode.security_disabled] * 2
    assert (await broker.call(29, 3, acl_filter(DescribeAclsRequest))).error_code == ErrorCode.security_disabled
    deleted = await broker.call(31, 3, delete_v3.DeleteAclsRequest(filters=(acl_filter(delete_v3.DeleteAclsFilter),)))
    assert [f.error_code for f in deleted.filter_results] == [ErrorCode.security_disabled]
    # and every other request is allowed: a produce anywhere
    answer = await broker.call(0, 9, produce_request("payments"))
    assert produced(answer) == [("payments", ErrorCode.none, 0)]
    await broker.wal.close()


async def test_topic_apis_answer_topic_authorization_failed_for_topics_without_the_right(broker, store):
    """Each topic API, asked about a topic the user has the right for and one it has not (both
    exist): the first is served, the second refused."""
    from kio.schema.create_partitions.v3 import request as cp
    from kio.schema.create_topics.v7 import request as ct
    from kio.schema.delete_records.v2 import request as dr
    from kio.schema.delete_topics.v6 import request as dt
    from kio.schema.describe_configs.v4 import request as dc
    from kio.schema.incremental_alter_configs.v1 import request as iac
    from kio.schema.list_offsets.v7 import request as lo
    from kio.schema.offset_for_leader_epoch.v4 import request as ofle

    for op in (Operation.DESCRIBE, Operation.DELETE, Operation.ALTER, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.CREATE):
        await broker.allow(ResourceType.TOPIC, "orders-", op, PREFIXED)
    mine, theirs = "orders-eu", "payments"
    timeout = datetime.timedelta(seconds=30)

    latest = (lo.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1),)
    answer = await broker.call(2, 7, lo.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=tuple(lo.ListOffsetsTopic(name=t, partitions=latest) for t in (mine, theirs))))
    assert [(t.name, p.error_code) for t in answer.topics for p in t.partitions] == [(mine, ErrorCode.none), (theirs, ErrorCode.topic_authorization_failed)]

    epoch = (ofle.OffsetForLeaderPartition(partition=0, current_leader_epoch=-1, leader_epoch=0),)
    answer = await broker.call(23, 4, ofle.OffsetForLeaderEpochRequest(replica_id=-1, topics=tuple(ofle.OffsetForLeaderTopic(topic=t, partitions=epoch) for t in (mine, theirs))))
    assert [(t.topic, p.error_code) for t in answer.topics for p in t.partitions] == [(mine, ErrorCode.none), (theirs, ErrorCode.topic_authorization_failed)]

    resources = tuple(dc.DescribeConfigsResource(resource_type=2, resource_name=t, configuration_keys=("retention.ms",)) for t in (mine, theirs))
    answer = await broker.call(32, 4, dc.DescribeConfigsRequest(include_synonyms=False, include_documentation=False, resources=resources))
    assert [(r.resource_name, r.error_code, [c.name for c in r.configs]) for r in answer.results] == [(mine, ErrorCode.none, ["retention.ms"]), (theirs, ErrorCode.topic_authorization_failed, [])]
    broker_configs = dc.DescribeConfigsRequest(include_synonyms=False, include_documentation=False, resources=(dc.DescribeConfigsResource(resource_type=4, resource_name="", configuration_keys=None),))
    assert [r.error_code for r in (await broker.call(32, 4, broker_configs)).results] == [ErrorCode.cluster_authorization_failed]

    changes = tuple(iac.AlterConfigsResource(resource_type=2, resource_name=t, configs=(iac.AlterableConfig(name="retention.ms", config_operation=0, value="1000"),)) for t in (mine, theirs))
    answer = await broker.call(44, 1, iac.IncrementalAlterConfigsRequest(resources=changes, validate_only=False))
    assert [(r.resource_name, r.error_code) for r in answer.responses] == [(mine, ErrorCode.none), (theirs, ErrorCode.topic_authorization_failed)]
    assert store.topics()[mine].configs.get("retention.ms") == "1000"
    assert "retention.ms" not in store.topics()[theirs].configs

    answer = await broker.call(37, 3, cp.CreatePartitionsRequest(timeout=timeout, validate_only=False, topics=tuple(cp.CreatePartitionsTopic(name=t, count=3, assignments=None) for t in (mine, theirs))))
    assert [(r.name, r.error_code) for r in answer.results] == [(mine, ErrorCode.none), (theirs, ErrorCode.topic_authorization_failed)]
    assert (store.topics()[mine].partitions, store.topics()[theirs].partitions) == (3, 2)

    answer = await broker.call(21, 2, dr.DeleteRecordsRequest(timeout=timeout, topics=tuple(dr.DeleteRecordsTopic(name=t, partitions=(dr.DeleteRecordsPartition(partition_index=0, offset=0),)) for t in (mine, theirs))))
    assert [(t.name, p.error_code) for t in answer.topics for p in t.partitions] == [(mine, ErrorCode.none), (theirs, ErrorCode.topic_authorization_failed)]

    creations = tuple(ct.CreatableTopic(name=t, num_partitions=1, replication_factor=1, assignments=(), configs=()) for t in ("orders-us", "audit"))
    answer = await broker.call(19, 7, ct.CreateTopicsRequest(timeout=timeout, validate_only=False, topics=creations))
    assert [(t.name, t.error_code, t.topic_config_error_code, len(t.configs) > 0) for t in answer.topics] == [("orders-us", ErrorCode.none, ErrorCode.none, True), ("audit", ErrorCode.topic_authorization_failed, ErrorCode.none, False)]
    assert "audit" not in store.topics()

    answer = await broker.call(20, 6, dt.DeleteTopicsRequest(timeout=timeout, topics=tuple(dt.DeleteTopicState(name=t, topic_id=None) for t in (mine, theirs))))
    assert [(r.name, r.error_code) for r in answer.responses] == [(mine, ErrorCode.none), (theirs, ErrorCode.topic_authorization_failed)]
    assert sorted(store.topics()) == ["orders-us", "payments"]


async def test_cluster_authorized_operations_and_log_dirs_follow_describe_on_the_cluster(broker):
    from kio.schema.describe_cluster.v1.request import DescribeClusterRequest
    from kio.schema.describe_log_dirs.v4.request import DescribeLogDirsRequest

    ask = DescribeClusterRequest(include_cluster_authorized_operations=True, endpoint_type=1)
    assert (await broker.call(60, 1, ask)).cluster_authorized_operations == 0
    assert (await broker.call(35, 4, DescribeLogDirsRequest(topics=None))).error_code == ErrorCode.cluster_authorization_failed
    await broker.allow(ResourceType.CLUSTER, "kafka-cluster", Operation.DESCRIBE)
    await broker.allow(ResourceType.CLUSTER, "kafka-cluster", Operation.IDEMPOTENT_WRITE)
    assert (await broker.call(60, 1, ask)).cluster_authorized_operations == (1 << Operation.DESCRIBE) | (1 << Operation.IDEMPOTENT_WRITE)
    answer = await broker.call(35, 4, DescribeLogDirsRequest(topics=None))
    assert (answer.error_code, [t.name for r in answer.results for t in r.topics]) == (ErrorCode.none, ["orders-eu", "payments"])


async def test_transactional_apis_need_write_on_the_transactional_id_and_the_group_and_topic_rights(broker, store):
    from kio.schema.add_offsets_to_txn.v3.request import AddOffsetsToTxnRequest
    from kio.schema.add_partitions_to_txn.v3 import request as apt
    from kio.schema.end_txn.v3.request import EndTxnRequest
    from kio.schema.txn_offset_commit.v3 import request as toc

    def txn_commit(txn_id: str):
        parts = (toc.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=3, committed_leader_epoch=-1, committed_metadata=None),)
        topics = tuple(toc.TxnOffsetCommitRequestTopic(name=t, partitions=parts) for t in ("orders-eu", "payments"))
        return toc.TxnOffsetCommitRequest(transactional_id=txn_id, group_id="billing", producer_id=1, producer_epoch=0, generation_id=-1, member_id="", group_instance_id=None, topics=topics)

    def add_partitions(txn_id: str):
        topics = tuple(apt.AddPartitionsToTxnTopic(name=t, partitions=(0,)) for t in ("orders-eu", "payments"))
        return apt.AddPartitionsToTxnRequest(v3_and_below_transactional_id=txn_id, v3_and_below_producer_id=1, v3_and_below_producer_epoch=0, v3_and_below_topics=topics)

    def codes(answer):
        return [(t.name, p.error_code) for t in answer.topics for p in t.partitions]

    assert (await broker.call(26, 3, EndTxnRequest(transactional_id="tx-1", producer_id=1, producer_epoch=0, committed=True))).error_code == ErrorCode.transactional_id_authorization_failed
    assert (await broker.call(25, 3, AddOffsetsToTxnRequest(transactional_id="tx-1", producer_id=1, producer_epoch=0, group_id="billing"))).error_code == ErrorCode.transactional_id_authorization_failed
    assert codes(await broker.call(28, 3, txn_commit("tx-1"))) == [("orders-eu", ErrorCode.transactional_id_authorization_failed), ("payments", ErrorCode.transactional_id_authorization_failed)]
    answer = await broker.call(24, 3, add_partitions("tx-1"))
    refused = ErrorCode.transactional_id_authorization_failed
    assert [(t.name, p.partition_error_code) for t in answer.results_by_topic_v3_and_below for p in t.results_by_partition] == [("orders-eu", refused), ("payments", refused)]

    await broker.allow(ResourceType.TRANSACTIONAL_ID, "tx-", Operation.WRITE, PREFIXED)
    assert (await broker.call(25, 3, AddOffsetsToTxnRequest(transactional_id="tx-1", producer_id=1, producer_epoch=0, group_id="billing"))).error_code == ErrorCode.group_authorization_failed
    assert codes(await broker.call(28, 3, txn_commit("tx-1"))) == [("orders-eu", ErrorCode.group_authorization_failed), ("payments", ErrorCode.group_authorization_failed)]
    # WRITE on the topics added: the refused one fails, the other is not attempted
    await broker.allow(ResourceType.TOPIC, "orders-eu", Operation.WRITE)
    answer = await broker.call(24, 3, add_partitions("tx-1"))
    assert [(t.name, p.partition_error_code) for t in answer.results_by_topic_v3_and_below for p in t.results_by_partition] == [("orders-eu", ErrorCode.operation_not_attempted), ("payments", ErrorCode.topic_authorization_failed)]
    await broker.allow(ResourceType.GROUP, "billing", Operation.READ)
    await broker.allow(ResourceType.TOPIC, "orders-eu", Operation.READ)
    # past the rights, the transaction coordinator answers (no such producer): no refusal of rights
    assert codes(await broker.call(28, 3, txn_commit("tx-1")))[1] == ("payments", ErrorCode.topic_authorization_failed)
    assert codes(await broker.call(28, 3, txn_commit("tx-1")))[0][1] not in (ErrorCode.transactional_id_authorization_failed, ErrorCode.group_authorization_failed, ErrorCode.topic_authorization_failed)


async def test_groups_are_described_and_listed_only_with_describe(broker):
    from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
    from kio.schema.list_groups.v4.request import ListGroupsRequest

    await broker.allow(ResourceType.GROUP, "billing", Operation.DESCRIBE)
    for group in ("billing", "shipping"):
        await broker.call(8, 8, commit_request(group, "orders-eu"), principal=ADMIN)
    answer = await broker.call(15, 5, DescribeGroupsRequest(groups=("billing", "shipping"), include_authorized_operations=True))
    assert [(g.group_id, g.error_code, g.authorized_operations) for g in answer.groups] == [
        ("billing", ErrorCode.none, 1 << Operation.DESCRIBE),
        ("shipping", ErrorCode.group_authorization_failed, -2147483648),
    ]
    assert [g.group_id for g in (await broker.call(16, 4, ListGroupsRequest(states_filter=()))).groups] == ["billing"]
    assert sorted(g.group_id for g in (await broker.call(16, 4, ListGroupsRequest(states_filter=()), principal=ADMIN)).groups) == ["billing", "shipping"]


async def test_a_consumer_group_is_described_only_to_who_may_describe_every_topic_it_holds(broker):
    """Issue 43, finding 4: a KIP-848 member subscribed by regex holds topics the describer may not
    DESCRIBE; ConsumerGroupDescribe answered their names and ids. As Kafka: the group is refused,
    TOPIC_AUTHORIZATION_FAILED, until the describer may describe them all."""
    from kio.schema.consumer_group_describe.v0.request import ConsumerGroupDescribeRequest
    from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest

    beat = ConsumerGroupHeartbeatRequest(
        group_id="watch", member_id="watcher-member-0001-abcdef", member_epoch=0, instance_id=None, rack_id=None, rebalance_timeout=datetime.timedelta(seconds=30),
        subscribed_topic_names=(), subscribed_topic_regex=".*", server_assignor=None, topic_partitions=(),
    )  # fmt: skip
    joined = await broker.call(68, 1, beat, principal=ADMIN)
    assert joined.error_code == ErrorCode.none and joined.assignment is not None
    await broker.allow(ResourceType.GROUP, "watch", Operation.DESCRIBE)
    await broker.allow(ResourceType.TOPIC, "orders-eu", Operation.DESCRIBE)
    describe = ConsumerGroupDescribeRequest(group_ids=("watch",), include_authorized_operations=False)
    (refused,) = (await broker.call(69, 0, describe)).groups
    assert (refused.error_code, refused.error_message, refused.members) == (
        ErrorCode.topic_authorization_failed, "The group has described topic(s) that the client is not authorized to describe.", ()
    )  # fmt: skip
    await broker.allow(ResourceType.TOPIC, "payments", Operation.DESCRIBE)
    (described,) = (await broker.call(69, 0, describe)).groups
    assert described.error_code == ErrorCode.none
    assert sorted(t.topic_name for m in described.members for t in m.target_assignment.topic_partitions) == ["orders-eu", "payments"]


async def test_a_regex_subscription_takes_only_the_topics_its_member_may_describe(broker):
    """Issue 43, finding 4: a member's `.*` was assigned every topic of the cluster; as Kafka, a
    regex resolves to the topics the heartbeating principal may DESCRIBE."""
    from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest

    await broker.allow(ResourceType.GROUP, "everything", Operation.READ)
    await broker.allow(ResourceType.TOPIC, "orders-eu", Operation.READ)  # READ implies DESCRIBE
    beat = ConsumerGroupHeartbeatRequest(
        group_id="everything", member_id="alice-member-0001-abcdef", member_epoch=0, instance_id=None, rack_id=None, rebalance_timeout=datetime.timedelta(seconds=30),
        subscribed_topic_names=(), subscribed_topic_regex=".*", server_assignor=None, topic_partitions=(),
    )  # fmt: skip
    joined = await broker.call(68, 1, beat)
    assert joined.error_code == ErrorCode.none
    assert {t.topic_id for t in joined.assignment.topic_partitions} == {broker.store.topics()["orders-eu"].topic_id}

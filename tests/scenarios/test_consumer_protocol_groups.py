"""KIP-848 consumer groups (librdkafka with group.protocol=consumer) against a `neve dev` node:
members joining and leaving while consuming (the classic churn test's phases and ledger, so every
record is consumed and duplicates are exactly the records whose commit failed), commit-close-resume,
ConsumerGroupDescribe / ListGroups through the AdminClient, and one group id being one type.

The node gives members a 500 ms heartbeat interval (KIP-848 has the coordinator choose it), so a
member waiting for partitions another member releases learns of them quickly."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, ConsumerGroupType, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.scenarios.records import LOG, create_topic
from tests.scenarios.test_consumer_groups import PARTITIONS, PER_PARTITION, Ledger, _confluent_churn, _record, consumer_config, poll_assignment, produce, wait_for

pytestmark = pytest.mark.integration

ENV = {"NEVE_WAL_LINGER_MS": "5", "NEVE_BROKER_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": "500", "NEVE_BROKER_GROUP_CONSUMER_SESSION_TIMEOUT_MS": "10000"}
CLASSIC_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")


def consumer_protocol(config: dict) -> dict:
    """A classic consumer configuration turned KIP-848: librdkafka refuses the settings the
    coordinator now owns."""
    return {k: v for k, v in config.items() if k not in CLASSIC_ONLY} | {"group.protocol": "consumer"}


def test_members_join_and_leave_while_consuming(neve_factory) -> None:
    node = neve_factory(env=ENV)
    topic = create_topic(node.bootstrap, PARTITIONS)
    produce(node.bootstrap, topic, PARTITIONS, PER_PARTITION)
    group = f"g-{uuid.uuid4().hex[:8]}"
    ledger = Ledger()
    _confluent_churn(node.bootstrap, topic, group, ledger, configure=consumer_protocol)
    LOG.info("consumer-protocol churn: per member %s, lost commits %d", dict(ledger.by_member), ledger.lost_commits)
    ledger.check({(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}, "abc")


def test_a_commit_of_a_partition_given_up_fails(neve_factory) -> None:
    """What the churn test's duplicates were, made deterministic: member a reads records of both
    partitions, b joins, a gives partition 1 up (its revoke callback ran, it acknowledged and moved
    to the new epoch) and b takes it over; only then does a commit, with its current epoch, the
    records of partition 1 it read before. That commit must fail (STALE_MEMBER_EPOCH): accepted, b
    would read those records again while every commit reported success."""
    node = neve_factory(env=ENV)
    topic = create_topic(node.bootstrap, 2)
    produce(node.bootstrap, topic, 2, 10)
    group = f"g-{uuid.uuid4().hex[:8]}"
    config = consumer_protocol(consumer_config(node.bootstrap, group, **{"partition.assignment.strategy": "range", "session.timeout.ms": 10000}))
    revoked: list[int] = []
    a = Consumer(config | {"client.id": "a"})
    a.subscribe([topic], on_revoke=lambda c, ps: revoked.extend(tp.partition for tp in ps))
    read: dict[int, list[int]] = {0: [], 1: []}
    wait_for(lambda: all(len(v) >= 3 for v in read.values()), what="a reading both partitions", step=lambda: _record(a.poll(0.1), read))
    a.pause(a.assignment())  # a reads no further: what it read is what it will commit

    b = Consumer(config | {"client.id": "b"})
    b.subscribe([topic])
    wait_for(lambda: revoked and b.assignment(), what="a giving a partition up and b taking it", step=lambda: (a.poll(0.05), b.poll(0.05)))
    (given_up,) = revoked
    kept = 1 - given_up
    assert [tp.partition for tp in b.assignment()] == [given_up]
    with pytest.raises(KafkaException) as e:
        a.commit(offsets=[TopicPartition(topic, given_up, len(read[given_up]))], asynchronous=False)
    assert e.value.args[0].code() == KafkaError.STALE_MEMBER_EPOCH, e.value
    a.commit(offsets=[TopicPartition(topic, kept, len(read[kept]))], asynchronous=False)  # what a holds still commits
    assert {tp.partition: tp.offset for tp in b.committed([TopicPartition(topic, p) for p in range(2)], timeout=10)} == {given_up: -1001, kept: len(read[kept])}
    # b reads the partition a gave up from its start: nothing a read of it was committed.
    from_b: dict[int, list[int]] = {0: [], 1: []}
    wait_for(lambda: len(from_b[given_up]) == 10, what="b reading the partition a gave up", step=lambda: _record(b.poll(0.1), from_b))
    assert from_b[given_up] == list(range(10))
    a.close()
    b.close()


def test_commit_close_resume_and_describe(neve_factory) -> None:
    node = neve_factory(env=ENV)
    topic = create_topic(node.bootstrap, 3)
    produce(node.bootstrap, topic, 3, 10)
    group = f"g-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": node.bootstrap, "logger": LOG})

    first = Consumer(consumer_protocol(consumer_config(node.bootstrap, group, **{"client.id": "first"})))
    first.subscribe([topic])
    assert sorted(tp.partition for tp in poll_assignment(first)) == [0, 1, 2]

    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    assert (described.type, described.state, described.partition_assignor) == (ConsumerGroupType.CONSUMER, ConsumerGroupState.STABLE, "uniform")
    assert [(m.client_id, sorted(tp.partition for tp in m.assignment.topic_partitions)) for m in described.members] == [("first", [0, 1, 2])]
    listed = admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}).result(timeout=10)
    assert [(g.group_id, g.type) for g in listed.valid if g.group_id == group] == [(group, ConsumerGroupType.CONSUMER)]
    assert group not in {g.group_id for g in admin.list_consumer_groups(types={ConsumerGroupType.CLASSIC}).result(timeout=10).valid}

    # A classic member cannot join a consumer-protocol group.
    classic = Consumer(consumer_config(node.bootstrap, group))
    classic.subscribe([topic])
    errors = []
    wait_for(lambda: errors, what="the classic member's error", step=lambda: errors.extend(m.error() for m in [classic.poll(0.1)] if m is not None and m.error()))
    assert errors[0].code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL, errors
    classic.close()

    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    wait_for(lambda: all(len(v) >= 4 for v in seen.values()), what="4 records per partition", step=lambda: _record(first.poll(0.2), seen))
    committed_at = {0: 4, 1: 7, 2: 0}
    first.commit(offsets=[TopicPartition(topic, p, o) for p, o in committed_at.items()], asynchronous=False)
    assert {tp.partition: tp.offset for tp in first.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)} == committed_at
    first.close()

    second = Consumer(consumer_protocol(consumer_config(node.bootstrap, group)))
    second.subscribe([topic])
    resumed: dict[int, list[int]] = {0: [], 1: [], 2: []}
    wait_for(lambda: sum(map(len, resumed.values())) >= 30 - sum(committed_at.values()), what="the rest of the records", step=lambda: _record(second.poll(0.2), resumed))
    second.close()
    assert resumed == {p: list(range(committed_at[p], 10)) for p in range(3)}

    empty = admin.describe_consumer_groups([group])[group].result(timeout=10)
    assert (empty.type, empty.state, empty.members) == (ConsumerGroupType.CONSUMER, ConsumerGroupState.EMPTY, [])
    admin.delete_consumer_groups([group])[group].result(timeout=10)
    # ConsumerGroupDescribe answers GROUP_ID_NOT_FOUND; librdkafka then asks DescribeGroups: Dead.
    gone = admin.describe_consumer_groups([group])[group].result(timeout=10)
    assert (gone.type, gone.state, gone.members) == (ConsumerGroupType.CLASSIC, ConsumerGroupState.DEAD, []), (gone.type, gone.state, gone.members)


def test_raw_heartbeats_get_error_codes(neve_factory) -> None:
    """ConsumerGroupHeartbeat v0 (coordinator-named members) and v1 on a raw socket: a bad first
    heartbeat, an unknown assignor, fencing, a classic group's id, and a static member's restart."""
    import datetime

    from kio.schema.consumer_group_describe.v1.request import ConsumerGroupDescribeRequest
    from kio.schema.consumer_group_heartbeat.v0.request import ConsumerGroupHeartbeatRequest as V0
    from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest as V1
    from kio.schema.errors import ErrorCode

    from tests.scenarios.test_bad_input import Raw
    from tests.scenarios.test_consumer_groups import call

    node = neve_factory(env=ENV)
    topic = create_topic(node.bootstrap, 2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    raw = Raw(node.port)
    ten_s = datetime.timedelta(seconds=10)

    def beat(cls=V1, **kw):
        fields = dict(group_id=group, member_id="m1", member_epoch=0, rebalance_timeout=ten_s, subscribed_topic_names=(topic,), topic_partitions=()) | kw
        return call(raw, cls(**fields))

    try:
        assert beat(rebalance_timeout=datetime.timedelta(milliseconds=-1)).error_code == ErrorCode.invalid_request
        assert beat(topic_partitions=None).error_code == ErrorCode.invalid_request
        assert beat(server_assignor="cooperative-sticky").error_code == ErrorCode.unsupported_assignor
        first = beat(cls=V0, member_id="")
        assert (first.error_code, first.member_epoch, first.heartbeat_interval) == (ErrorCode.none, 1, datetime.timedelta(milliseconds=500))
        assert uuid.UUID(first.member_id) and [sorted(t.partitions) for t in first.assignment.topic_partitions] == [[0, 1]]
        assert beat(cls=V0, member_id=first.member_id, member_epoch=5, subscribed_topic_names=None, topic_partitions=None, rebalance_timeout=datetime.timedelta(milliseconds=-1)).error_code == ErrorCode.fenced_member_epoch
        static = beat(member_id="s1", instance_id="i1")
        assert static.error_code == ErrorCode.none and static.member_epoch == 2
        assert beat(member_id="s2", instance_id="i1").error_code == ErrorCode.unreleased_instance_id
        left = beat(member_id="s1", instance_id="i1", member_epoch=-2, subscribed_topic_names=None, topic_partitions=None)
        assert (left.error_code, left.member_epoch) == (ErrorCode.none, -2)
        back = beat(member_id="s2", instance_id="i1")
        assert (back.error_code, back.member_epoch) == (ErrorCode.none, 2)
        described = call(raw, ConsumerGroupDescribeRequest(group_ids=(group, "nothing-here"), include_authorized_operations=False)).groups
        assert (described[0].error_code, described[0].group_epoch, sorted(m.member_id for m in described[0].members)) == (ErrorCode.none, 2, sorted([first.member_id, "s2"]))
        assert described[1].error_code == ErrorCode.group_id_not_found
        # A classic group's id is not a consumer group's.
        classic = Consumer(consumer_config(node.bootstrap, f"{group}-classic"))
        classic.subscribe([topic])
        poll_assignment(classic)
        assert beat(group_id=f"{group}-classic").error_code == ErrorCode.group_id_not_found
        classic.close()
    finally:
        raw.close()

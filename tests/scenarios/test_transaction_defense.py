"""Transactional produce checked against the coordinator's state (KIP-890 part 1), and the
transaction admin APIs (KIP-664), spoken as raw Kafka requests to `neve dev`: records of a
partition that was not added to the transaction get INVALID_TXN_STATE; transactional records
without the request's transactional id get TRANSACTIONAL_ID_AUTHORIZATION_FAILED; a late batch of
a transaction that has ended (same producer epoch, as transactions v1 keep it) is refused and
opens nothing, so the last stable offset stays at the high watermark; a fenced producer's
records get INVALID_PRODUCER_EPOCH. DescribeTransactions and ListTransactions show the stored
state; DescribeProducers shows the open transaction's first offset."""

from __future__ import annotations

import datetime
import uuid

from kio.schema.add_partitions_to_txn.v3.request import AddPartitionsToTxnRequest, AddPartitionsToTxnTopic
from kio.schema.add_partitions_to_txn.v4.request import AddPartitionsToTxnRequest as AddPartitionsToTxnRequestV4
from kio.schema.add_partitions_to_txn.v4.request import AddPartitionsToTxnTopic as AddPartitionsToTxnTopicV4
from kio.schema.add_partitions_to_txn.v4.request import AddPartitionsToTxnTransaction
from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.list_transactions.v1.request import ListTransactionsRequest
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from tests.batches import make_batch
from tests.raw import Raw
from tests.scenarios.test_consumer_groups import call

from .test_transactions import LINGER, create_topics

TRANSACTIONAL = 0x10


def produce(raw: Raw, topic: str, partition: int, transactional_id: str | None, pid: int, epoch: int, seq: int, values: list[str]):
    batch = make_batch([(v.encode(), v.encode(), [], 1_700_000_000_000) for v in values], producer_id=pid, producer_epoch=epoch, base_sequence=seq, attributes=TRANSACTIONAL)
    request = ProduceRequest(transactional_id=transactional_id, acks=-1, timeout=datetime.timedelta(seconds=10), topic_data=(TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=partition, records=batch),)),))
    return call(raw, request).responses[0].partition_responses[0]


def add_partitions(raw: Raw, tid: str, pid: int, epoch: int, topic: str, partitions: tuple[int, ...]) -> list[ErrorCode]:
    request = AddPartitionsToTxnRequest(v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch, v3_and_below_topics=(AddPartitionsToTxnTopic(name=topic, partitions=partitions),))
    return [r.partition_error_code for r in call(raw, request).results_by_topic_v3_and_below[0].results_by_partition]


def latest(raw: Raw, topic: str, partition: int, isolation: int) -> int:
    request = ListOffsetsRequest(replica_id=-1, isolation_level=isolation, topics=(ListOffsetsTopic(name=topic, partitions=(ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1, timestamp=-1),)),))
    return call(raw, request).topics[0].partitions[0].offset


def test_transactional_produce_is_checked_against_the_transaction(neve_factory):
    node = neve_factory(env=LINGER)
    topic = f"txn-defense-{uuid.uuid4().hex[:6]}"
    create_topics(node.bootstrap, topic)
    tid = f"tid-{uuid.uuid4().hex[:6]}"
    raw = Raw(node.port)
    try:
        init = call(raw, InitProducerIdRequest(transactional_id=tid, transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1))
        assert init.error_code == ErrorCode.none
        pid, epoch = init.producer_id, init.producer_epoch
        assert add_partitions(raw, tid, pid, epoch, topic, (0,)) == [ErrorCode.none]

        stored = produce(raw, topic, 0, tid, pid, epoch, 0, ["a", "b"])
        assert (stored.error_code, stored.base_offset) == (ErrorCode.none, 0)
        assert produce(raw, topic, 1, tid, pid, epoch, 0, ["x"]).error_code == ErrorCode.invalid_txn_state  # never added
        assert produce(raw, topic, 2, None, pid, epoch, 0, ["y"]).error_code == ErrorCode.transactional_id_authorization_failed
        assert produce(raw, topic, 0, tid, pid, epoch, 2, ["c"]).base_offset == 2  # the open transaction goes on
        assert (latest(raw, topic, 0, 1), latest(raw, topic, 0, 0)) == (0, 3)  # open: the LSO is its first offset

        # KIP-890's verify-only AddPartitionsToTxn (v4): partition 0 is in the transaction, 1 is not
        verify = AddPartitionsToTxnRequestV4(transactions=(AddPartitionsToTxnTransaction(transactional_id=tid, producer_id=pid, producer_epoch=epoch, verify_only=True, topics=(AddPartitionsToTxnTopicV4(name=topic, partitions=(0, 1)),)),))
        results = call(raw, verify).results_by_transaction[0].topic_results[0].results_by_partition
        assert [(r.partition_index, r.partition_error_code) for r in results] == [(0, ErrorCode.none), (1, ErrorCode.invalid_txn_state)]

        # (only an open transaction is described here: kio cannot read back the -1 start time
        # Kafka and neve answer for the others)
        described = call(raw, DescribeTransactionsRequest(transactional_ids=(tid,))).transaction_states
        assert (described[0].transaction_state, described[0].producer_id, described[0].producer_epoch) == ("Ongoing", pid, epoch)
        assert [(t.topic, t.partitions) for t in described[0].topics] == [(topic, (0,))]
        listed = call(raw, ListTransactionsRequest(state_filters=("Ongoing",), producer_id_filters=(pid,), duration_filter=-1)).transaction_states
        assert [(t.transactional_id, t.transaction_state) for t in listed] == [(tid, "Ongoing")]
        producers = call(raw, DescribeProducersRequest(topics=(TopicRequest(name=topic, partition_indexes=(0,)),))).topics[0].partitions[0].active_producers
        assert [(p.producer_id, p.current_txn_start_offset) for p in producers] == [(pid, 0)]

        assert call(raw, EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=True)).error_code == ErrorCode.none
        assert (latest(raw, topic, 0, 1), latest(raw, topic, 0, 0)) == (4, 4)  # the marker at 3
        # a late batch of the ended transaction (the same epoch, the next sequence) opens nothing
        assert produce(raw, topic, 0, tid, pid, epoch, 3, ["late"]).error_code == ErrorCode.invalid_txn_state
        assert (latest(raw, topic, 0, 1), latest(raw, topic, 0, 0)) == (4, 4)
        listed = call(raw, ListTransactionsRequest(state_filters=(), producer_id_filters=(pid,), duration_filter=-1)).transaction_states
        assert [(t.transactional_id, t.transaction_state) for t in listed] == [(tid, "CompleteCommit")]

        # a new producer with the id fences this one
        fresh = call(raw, InitProducerIdRequest(transactional_id=tid, transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1))
        assert (fresh.producer_id, fresh.producer_epoch) == (pid, epoch + 1)
        assert add_partitions(raw, tid, pid, epoch, topic, (0,)) == [ErrorCode.producer_fenced]
        assert produce(raw, topic, 0, tid, pid, epoch, 3, ["zombie"]).error_code == ErrorCode.invalid_producer_epoch
    finally:
        raw.close()


def test_transactional_offsets_reach_the_group_only_on_commit(neve_factory):
    from kio.schema.add_offsets_to_txn.v3.request import AddOffsetsToTxnRequest
    from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopics
    from kio.schema.txn_offset_commit.v3.request import TxnOffsetCommitRequest, TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic

    node = neve_factory(env=LINGER)
    topic = f"txn-offsets-{uuid.uuid4().hex[:6]}"
    create_topics(node.bootstrap, topic)
    tid, group = f"tid-{uuid.uuid4().hex[:6]}", f"group-{uuid.uuid4().hex[:6]}"
    raw = Raw(node.port)

    def offsets(stable: bool) -> list[tuple[int, int, ErrorCode]]:
        request = OffsetFetchRequest(groups=(OffsetFetchRequestGroup(group_id=group, topics=(OffsetFetchRequestTopics(name=topic, partition_indexes=(0, 1)),)),), require_stable=stable)
        answer = call(raw, request).groups[0]
        assert answer.error_code == ErrorCode.none
        return [(p.partition_index, p.committed_offset, p.error_code) for p in answer.topics[0].partitions]

    def transaction(offset: int, commit: bool) -> None:
        assert call(raw, AddOffsetsToTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id=group)).error_code == ErrorCode.none
        commit_request = TxnOffsetCommitRequest(
            transactional_id=tid, group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=-1, member_id="", group_instance_id=None,
            topics=(TxnOffsetCommitRequestTopic(name=topic, partitions=(TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="m"),)),),
        )
        assert [p.error_code for p in call(raw, commit_request).topics[0].partitions] == [ErrorCode.none]
        # pending: a stable read waits for the transaction (KIP-447), a plain one sees the last commit
        assert offsets(stable=True)[0] == (0, -1, ErrorCode.unstable_offset_commit)
        assert offsets(stable=True)[1] == (1, -1, ErrorCode.none)
        before = offsets(stable=False)
        assert call(raw, EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit)).error_code == ErrorCode.none
        assert offsets(stable=True) == ([(0, offset, ErrorCode.none), (1, -1, ErrorCode.none)] if commit else before)

    try:
        init = call(raw, InitProducerIdRequest(transactional_id=tid, transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1))
        pid, epoch = init.producer_id, init.producer_epoch
        transaction(5, commit=True)
        transaction(9, commit=False)  # aborted: the group keeps 5
        assert offsets(stable=False)[0] == (0, 5, ErrorCode.none)
        transaction(12, commit=True)
    finally:
        raw.close()

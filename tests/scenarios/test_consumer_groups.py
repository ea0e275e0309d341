"""Consumer groups with stock clients against a `neve dev` node: membership churn while consuming
(librdkafka and aiokafka), commit-close-resume, static membership, the admin group APIs, and bad
group requests on a raw socket.

Records are `b"<partition>:<index>"` so what was consumed can be checked exactly. Waits are for
events (assignments, records) with deadlines, never fixed sleeps."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from tests.scenarios.records import LOG, create_topic
from tests.scenarios.test_bad_input import Raw

pytestmark = pytest.mark.integration

ENV = {"NEVE_WAL_LINGER_MS": "5"}
DEADLINE = 45.0


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    """`per_partition` records into each partition, values `p:i`, all acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "logger": LOG})
    failures = []
    for i in range(per_partition):
        for p in range(partitions):
            producer.produce(topic, value=f"{p}:{i}".encode(), partition=p, on_delivery=lambda err, msg: err and failures.append(err))
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not failures


def consumer_config(bootstrap: str, group: str, **extra) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "max.poll.interval.ms": 20000,
        "logger": LOG,
        **extra,
    }


def wait_for(condition, timeout: float = DEADLINE, what: str = "condition", step=None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")
        if step is not None:
            step()
        else:
            time.sleep(0.02)


def poll_assignment(consumer: Consumer, timeout: float = DEADLINE) -> list[TopicPartition]:
    """Poll until the consumer has an assignment (the on_assign callback ran)."""
    wait_for(lambda: consumer.assignment(), timeout, "an assignment", step=lambda: consumer.poll(0.1))
    return consumer.assignment()


# --- 2. commit, close, resume -------------------------------------------------------------------


def test_commit_close_resume(neve_factory) -> None:
    node = neve_factory(env=ENV)
    topic = create_topic(node.bootstrap, 3)
    produce(node.bootstrap, topic, 3, 10)
    group = f"g-{uuid.uuid4().hex[:8]}"

    first = Consumer(consumer_config(node.bootstrap, group))
    first.subscribe([topic])
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    wait_for(lambda: all(len(v) >= 4 for v in seen.values()), what="4 records per partition", step=lambda: _record(first.poll(0.2), seen))
    committed_at = {0: 4, 1: 7, 2: 0}
    first.commit(offsets=[TopicPartition(topic, p, o) for p, o in committed_at.items()], asynchronous=False)
    assert {tp.partition: tp.offset for tp in first.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)} == committed_at
    first.close()

    second = Consumer(consumer_config(node.bootstrap, group))
    second.subscribe([topic])
    resumed: dict[int, list[int]] = {0: [], 1: [], 2: []}
    wait_for(lambda: sum(map(len, resumed.values())) >= 30 - sum(committed_at.values()), what="the rest of the records", step=lambda: _record(second.poll(0.2), resumed))
    second.close()
    assert resumed == {p: list(range(committed_at[p], 10)) for p in range(3)}


def _record(msg, into: dict[int, list[int]]) -> None:
    if msg is None:
        return
    assert msg.error() is None, msg.error()
    p, i = msg.value().decode().split(":")
    assert int(p) == msg.partition() and int(i) == msg.offset()
    into[msg.partition()].append(msg.offset())


# --- 1. members join and leave while consuming ----------------------------------------------------

PARTITIONS = 6
PER_PARTITION = 520  # 3,120 records


@dataclass
class Ledger:
    """Who processed which record and which of those a successful commit covered. A record is
    delivered again only if its processor's commit of it failed (or never happened) before the
    partition moved, so the duplicates must be exactly the records left uncovered."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    deliveries: Counter = field(default_factory=Counter)  # (partition, offset) -> times processed
    by_member: Counter = field(default_factory=Counter)
    uncovered: dict = field(default_factory=dict)  # (member, partition) -> offsets not yet committed
    lost_commits: int = 0  # records whose commit failed
    assigned: dict = field(default_factory=dict)  # member -> partitions (from rebalance callbacks)
    limit: int = 0  # members pause once this many distinct records were processed

    @property
    def unique(self) -> int:
        return len(self.deliveries)

    def gated(self, member: str) -> bool:
        """Whether `member` must pause: the limit is reached and it has had its share (a late
        joiner still gets its first records, so every phase sees every member consume)."""
        with self.lock:
            return self.unique >= self.limit and self.by_member[member] > 0

    def processed(self, member: str, partition: int, offset: int) -> None:
        with self.lock:
            self.deliveries[(partition, offset)] += 1
            self.by_member[member] += 1
            self.uncovered.setdefault((member, partition), []).append(offset)

    def commit_result(self, member: str, partition: int, upto: int, ok: bool) -> None:
        with self.lock:
            pending = self.uncovered.get((member, partition), [])
            done = [o for o in pending if o < upto]
            self.uncovered[(member, partition)] = [o for o in pending if o >= upto]
            if not ok:
                self.lost_commits += len(done)

    def all_committed(self) -> bool:
        with self.lock:
            return not any(self.uncovered.values())

    def check(self, expected: set[tuple[int, int]], members: str) -> None:
        """Every expected record processed; duplicates exactly the records whose commit failed."""
        assert set(self.deliveries) == expected
        duplicates = sum(n - 1 for n in self.deliveries.values())
        never_committed = sum(len(v) for v in self.uncovered.values())
        assert never_committed == 0, f"{never_committed} processed records were never committed"
        assert duplicates == self.lost_commits, f"{duplicates} duplicates, but only {self.lost_commits} records had a failed commit"
        for member in members:
            assert self.by_member[member] > 0, f"member {member} processed nothing: {dict(self.by_member)}"


def _confluent_member(bootstrap: str, topic: str, group: str, name: str, ledger: Ledger, stop: threading.Event, configure=lambda config: config) -> None:
    """`configure` adapts the consumer's configuration (the KIP-848 test sets group.protocol).
    The callbacks track changes, so they serve eager (whole assignment) and incremental rebalances."""

    def on_assign(consumer, partitions):
        with ledger.lock:
            ledger.assigned[name] = ledger.assigned.get(name, set()) | {tp.partition for tp in partitions}

    def on_revoke(consumer, partitions):
        with ledger.lock:
            ledger.assigned[name] = ledger.assigned.get(name, set()) - {tp.partition for tp in partitions}

    consumer = Consumer(configure(consumer_config(bootstrap, group, **{"client.id": f"member-{name}", "partition.assignment.strategy": "range", "session.timeout.ms": 10000})))
    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    try:
        applied = None
        while not stop.is_set():
            # Gate by pausing (not by not polling: librdkafka serves rebalances in poll). Applied
            # again whenever the assignment changes: a reassigned partition may keep its pause.
            wanted = (ledger.gated(name), frozenset(tp.partition for tp in consumer.assignment()))
            if wanted != applied and wanted[1]:
                partitions = [TopicPartition(topic, p) for p in wanted[1]]
                consumer.pause(partitions) if wanted[0] else consumer.resume(partitions)
                applied = wanted
            batch = [m for m in consumer.consume(25, 0.05) if m.error() is None]
            upto: dict[int, int] = {}
            for msg in batch:
                ledger.processed(name, msg.partition(), msg.offset())
                upto[msg.partition()] = msg.offset() + 1
            for p, offset in upto.items():
                try:
                    consumer.commit(offsets=[TopicPartition(topic, p, offset)], asynchronous=False)
                    ledger.commit_result(name, p, offset, ok=True)
                except KafkaException as e:
                    LOG.info("member %s commit of %d@%d failed: %s", name, p, offset, e)
                    ledger.commit_result(name, p, offset, ok=False)
    finally:
        consumer.close()
        with ledger.lock:
            ledger.assigned[name] = set()


async def _aiokafka_member(bootstrap: str, topic: str, group: str, name: str, ledger: Ledger, stop: asyncio.Event) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as TP
    from aiokafka.abc import ConsumerRebalanceListener
    from aiokafka.errors import KafkaError as AioKafkaError
    from aiokafka.structs import OffsetAndMetadata

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked):
            with ledger.lock:
                ledger.assigned[name] = set()

        async def on_partitions_assigned(self, assigned):
            with ledger.lock:
                ledger.assigned[name] = {tp.partition for tp in assigned}

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        client_id=f"member-{name}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
        max_poll_interval_ms=20000,
    )
    await consumer.start()
    consumer.subscribe([topic], listener=Listener())
    try:
        while not stop.is_set():
            if ledger.gated(name):
                await asyncio.sleep(0.02)  # aiokafka rebalances in its own task; nothing to serve here
                continue
            batches = await consumer.getmany(timeout_ms=100, max_records=25)
            for tp, records in batches.items():
                for r in records:
                    ledger.processed(name, tp.partition, r.offset)
                upto = records[-1].offset + 1
                try:
                    await consumer.commit({TP(topic, tp.partition): OffsetAndMetadata(upto, "")})
                    ledger.commit_result(name, tp.partition, upto, ok=True)
                except (AioKafkaError, AssertionError) as e:
                    LOG.info("member %s commit of %d@%d failed: %r", name, tp.partition, upto, e)
                    ledger.commit_result(name, tp.partition, upto, ok=False)
    finally:
        await consumer.stop()
        with ledger.lock:
            ledger.assigned[name] = set()


def _churn_phases(ledger: Ledger, start, stop_member, wait) -> None:
    """a alone; then b and c join; then b leaves; each phase consumes about a third."""
    t0 = time.monotonic()
    _wait = wait

    def wait(cond, what):
        try:
            _wait(cond, what)
        except AssertionError as e:
            raise AssertionError(f"{e}; assigned {ledger.assigned}, processed per member {dict(ledger.by_member)}, unique {ledger.unique}, limit {ledger.limit}") from None
        LOG.info("phase %s done at %.1fs", what, time.monotonic() - t0)
    total = PARTITIONS * PER_PARTITION
    ledger.limit = total // 5
    start("a")
    wait(lambda: ledger.unique >= ledger.limit, "member a alone")
    start("b")
    start("c")
    wait(lambda: all(ledger.assigned.get(m) for m in "abc") and set().union(*(ledger.assigned[m] for m in "abc")) == set(range(PARTITIONS)), "a, b, c all assigned")
    with ledger.lock:
        ledger.limit = total * 3 // 5
    wait(lambda: ledger.unique >= ledger.limit and ledger.by_member["b"] > 0 and ledger.by_member["c"] > 0, "three members consuming")
    stop_member("b")
    wait(lambda: not ledger.assigned.get("b") and set().union(ledger.assigned.get("a", set()), ledger.assigned.get("c", set())) == set(range(PARTITIONS)), "a and c own everything")
    with ledger.lock:
        ledger.limit = total + 1
    wait(lambda: ledger.unique == total, "every record")


@pytest.mark.parametrize("client", ["confluent", "aiokafka"])
def test_members_join_and_leave_while_consuming(client: str, neve_factory) -> None:
    node = neve_factory(env=ENV)
    topic = create_topic(node.bootstrap, PARTITIONS)
    produce(node.bootstrap, topic, PARTITIONS, PER_PARTITION)
    group = f"g-{uuid.uuid4().hex[:8]}"
    ledger = Ledger()
    if client == "confluent":
        _confluent_churn(node.bootstrap, topic, group, ledger)
    else:
        asyncio.run(_aiokafka_churn(node.bootstrap, topic, group, ledger))
    LOG.info("churn %s: per member %s, lost commits %d", client, dict(ledger.by_member), ledger.lost_commits)
    ledger.check({(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}, "abc")


def _confluent_churn(bootstrap: str, topic: str, group: str, ledger: Ledger, configure=lambda config: config) -> None:
    """The churn phases with librdkafka members, one thread each."""
    threads, stops = {}, {}

    def start(name):
        stops[name] = threading.Event()
        threads[name] = threading.Thread(target=_confluent_member, args=(bootstrap, topic, group, name, ledger, stops[name], configure), daemon=True)
        threads[name].start()

    def stop_member(name):
        stops[name].set()
        threads[name].join(DEADLINE)
        assert not threads[name].is_alive()

    try:
        _churn_phases(ledger, start, stop_member, lambda cond, what: wait_for(cond, DEADLINE, what))
    finally:
        for name in list(threads):
            stop_member(name)


async def _aiokafka_churn(bootstrap: str, topic: str, group: str, ledger: Ledger) -> None:
    tasks, stops = {}, {}
    loop = asyncio.get_running_loop()

    def start(name):
        stops[name] = asyncio.Event()
        tasks[name] = loop.create_task(_aiokafka_member(bootstrap, topic, group, name, ledger, stops[name]))

    pending_stop: list = []

    def stop_member(name):
        stops[name].set()
        pending_stop.append(tasks[name])

    # The phases are written as blocking steps; run them in a thread that schedules into this loop.
    def call(fn, *args):
        return asyncio.run_coroutine_threadsafe(_call(fn, *args), loop).result(DEADLINE)

    async def _call(fn, *args):
        fn(*args)

    phases = loop.run_in_executor(None, _churn_phases, ledger, lambda n: call(start, n), lambda n: call(stop_member, n), lambda cond, what: wait_for(cond, DEADLINE, what))
    try:
        await phases
    finally:
        for name in stops:
            stops[name].set()
        results = await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), DEADLINE)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors


# --- raw group requests ----------------------------------------------------------------------------


def call(raw, body):
    """Send one kio request on a raw connection and decode its response."""
    cls = type(body)
    return raw.response(cls.__api_key__, cls.__version__, raw.request(body))


def current_generation(port: int, group: str, member_id: str, upto: int = 20) -> int:
    """The group's generation, found by heartbeating as `member_id` with 1, 2, ... (a wrong
    generation is answered ILLEGAL_GENERATION and changes nothing)."""
    from kio.schema.heartbeat.v4.request import HeartbeatRequest

    raw = Raw(port)
    try:
        for generation in range(1, upto):
            answer = call(raw, HeartbeatRequest(group_id=group, generation_id=generation, member_id=member_id, group_instance_id=None))
            if answer.error_code == ErrorCode.none:
                return generation
            assert answer.error_code == ErrorCode.illegal_generation, answer
    finally:
        raw.close()
    raise AssertionError(f"no generation below {upto} accepted for {member_id}")


# --- 3. static membership -----------------------------------------------------------------------------


def test_static_member_restarts_without_rebalance(neve_factory) -> None:
    node = neve_factory(env=ENV)
    topic = create_topic(node.bootstrap, 4)
    group = f"g-{uuid.uuid4().hex[:8]}"
    callbacks: Counter = Counter()

    def member(instance: str, label: str) -> Consumer:
        consumer = Consumer(consumer_config(node.bootstrap, group, **{"group.instance.id": instance, "session.timeout.ms": 10000, "partition.assignment.strategy": "range"}))
        consumer.subscribe(
            [topic],
            on_assign=lambda c, ps: callbacks.update([f"{label} assign"]),
            on_revoke=lambda c, ps: callbacks.update([f"{label} revoke"]),
        )
        return consumer

    a, b = member("static-a", "a"), member("static-b", "b")
    wait_for(lambda: len(a.assignment()) + len(b.assignment()) == 4 and len(a.assignment()) == 2, what="both static members assigned", step=lambda: (a.poll(0.05), b.poll(0.05)))
    a_parts = sorted(tp.partition for tp in a.assignment())
    b_parts = sorted(tp.partition for tp in b.assignment())
    generation = current_generation(node.port, group, b.memberid())
    b_before = (callbacks["b assign"], callbacks["b revoke"])
    old_a_id = a.memberid()

    a.close()  # a static member leaves no LeaveGroup behind: its place is kept for the session timeout
    a = member("static-a", "a2")
    wait_for(lambda: a.assignment(), what="restarted member assigned", step=lambda: (a.poll(0.05), b.poll(0.05)))
    assert sorted(tp.partition for tp in a.assignment()) == a_parts
    assert sorted(tp.partition for tp in b.assignment()) == b_parts
    assert a.memberid() != old_a_id
    assert current_generation(node.port, group, b.memberid()) == generation
    assert current_generation(node.port, group, a.memberid()) == generation
    assert (callbacks["b assign"], callbacks["b revoke"]) == b_before, callbacks  # b saw no rebalance
    assert (callbacks["a2 assign"], callbacks["a2 revoke"]) == (1, 0), callbacks
    a.close()
    b.close()


# --- 4. the admin group APIs -------------------------------------------------------------------------


def test_admin_group_apis(neve_factory) -> None:
    from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions

    node = neve_factory(env=ENV)
    topic = create_topic(node.bootstrap, 2)
    produce(node.bootstrap, topic, 2, 5)
    admin = AdminClient({"bootstrap.servers": node.bootstrap, "logger": LOG})
    live, idle = f"live-{uuid.uuid4().hex[:8]}", f"idle-{uuid.uuid4().hex[:8]}"

    consumer = Consumer(consumer_config(node.bootstrap, live, **{"client.id": "admin-test"}))
    consumer.subscribe([topic])
    poll_assignment(consumer)
    consumer.commit(offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 5)], asynchronous=False)
    # An assign()-only group: simple commits (generation -1, no member) through AdminClient.
    admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(idle, [TopicPartition(topic, 0, 2), TopicPartition(topic, 1, 4)])])[idle].result(10)

    listed = admin.list_consumer_groups(request_timeout=10).result(10)
    assert not listed.errors
    states = {g.group_id: (g.state, g.is_simple_consumer_group) for g in listed.valid}
    assert states == {live: (ConsumerGroupState.STABLE, False), idle: (ConsumerGroupState.EMPTY, True)}
    stable_only = admin.list_consumer_groups(request_timeout=10, states={ConsumerGroupState.STABLE}).result(10)
    assert [g.group_id for g in stable_only.valid] == [live]

    described = {g: f.result(10) for g, f in admin.describe_consumer_groups([live, idle], request_timeout=10).items()}
    d = described[live]
    assert (d.state, d.partition_assignor, d.is_simple_consumer_group) == (ConsumerGroupState.STABLE, "range", False)
    assert [(m.member_id, m.client_id) for m in d.members] == [(consumer.memberid(), "admin-test")]
    assert sorted(tp.partition for tp in d.members[0].assignment.topic_partitions) == [0, 1]
    assert (described[idle].state, described[idle].members) == (ConsumerGroupState.EMPTY, [])

    def offsets(group):
        result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
        return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions}

    assert offsets(live) == {(topic, 0): 3, (topic, 1): 5}
    assert offsets(idle) == {(topic, 0): 2, (topic, 1): 4}

    # OffsetDelete (no AdminClient call in the Python binding): refused for the live group's topic.
    from kio.schema.offset_delete.v0.request import OffsetDeleteRequest, OffsetDeleteRequestPartition, OffsetDeleteRequestTopic

    def offset_delete(group, partitions, name=topic):
        raw = Raw(node.port)
        try:
            return call(raw, OffsetDeleteRequest(group_id=group, topics=(OffsetDeleteRequestTopic(name=name, partitions=tuple(OffsetDeleteRequestPartition(partition_index=p) for p in partitions)),)))
        finally:
            raw.close()

    answer = offset_delete(live, [0])
    assert (answer.error_code, answer.topics[0].partitions[0].error_code) == (ErrorCode.none, ErrorCode.group_subscribed_to_topic)
    answer = offset_delete(idle, [0, 7])
    assert [p.error_code for p in answer.topics[0].partitions] == [ErrorCode.none, ErrorCode.unknown_topic_or_partition]
    assert offsets(idle) == {(topic, 1): 4}  # all offsets of the group: the deleted one is gone
    assert offset_delete(f"nobody-{uuid.uuid4().hex[:6]}", [0]).error_code == ErrorCode.group_id_not_found

    deleted = admin.delete_consumer_groups([live, idle], request_timeout=10)
    with pytest.raises(KafkaException) as refused:
        deleted[live].result(10)
    assert refused.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
    deleted[idle].result(10)
    consumer.close()
    admin.delete_consumer_groups([live], request_timeout=10)[live].result(10)
    listed = admin.list_consumer_groups(request_timeout=10).result(10)
    assert [g.group_id for g in listed.valid] == []
    assert offsets(live) == {}


# --- 6. bad group requests -----------------------------------------------------------------------------


def test_bad_group_requests_get_error_codes(neve_factory) -> None:
    import datetime

    from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
    from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
    from kio.schema.sync_group.v5.request import SyncGroupRequest

    node = neve_factory(env=ENV)
    topic = create_topic(node.bootstrap, 1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    raw = Raw(node.port)

    def join(member_id="", session_s=10, protocol_type="consumer", protocols=("range",)):
        return call(
            raw,
            JoinGroupRequest(
                group_id=group,
                session_timeout=datetime.timedelta(seconds=session_s),
                rebalance_timeout=datetime.timedelta(seconds=10),
                member_id=member_id,
                group_instance_id=None,
                protocol_type=protocol_type,
                protocols=tuple(JoinGroupRequestProtocol(name=p, metadata=b"") for p in protocols),
            ),
        )

    def heartbeat(generation, member_id):
        from kio.schema.heartbeat.v4.request import HeartbeatRequest

        return call(raw, HeartbeatRequest(group_id=group, generation_id=generation, member_id=member_id, group_instance_id=None)).error_code

    assert join(session_s=7 * 24 * 3600).error_code == ErrorCode.invalid_session_timeout
    assert join(protocol_type="").error_code == ErrorCode.inconsistent_group_protocol
    first = join()
    assert first.error_code == ErrorCode.member_id_required and first.member_id
    joined = join(first.member_id)
    assert (joined.error_code, joined.generation_id, joined.leader, joined.member_id) == (ErrorCode.none, 1, first.member_id, first.member_id)
    assert join(protocol_type="connect").error_code == ErrorCode.inconsistent_group_protocol  # foreign to the group
    assert join(protocols=("sticky-only",)).error_code == ErrorCode.inconsistent_group_protocol
    unknown_sync = call(raw, SyncGroupRequest(group_id=group, generation_id=1, member_id="nobody", group_instance_id=None, protocol_type="consumer", protocol_name="range", assignments=()))
    assert unknown_sync.error_code == ErrorCode.unknown_member_id
    assert heartbeat(1, first.member_id) == ErrorCode.none  # awaiting the sync: heartbeats are fine (as Kafka)
    synced = call(raw, SyncGroupRequest(group_id=group, generation_id=1, member_id=first.member_id, group_instance_id=None, protocol_type="consumer", protocol_name="range", assignments=()))
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"")
    assert heartbeat(1, first.member_id) == ErrorCode.none
    assert heartbeat(7, first.member_id) == ErrorCode.illegal_generation
    assert heartbeat(1, "nobody") == ErrorCode.unknown_member_id
    found = call(raw, FindCoordinatorRequest(key_type=1, coordinator_keys=("txn-1", ""))).coordinators
    assert [(f.error_code, f.port) for f in found] == [(ErrorCode.none, node.port), (ErrorCode.invalid_request, -1)]  # a transactional id: this node
    assert call(raw, FindCoordinatorRequest(key_type=2, coordinator_keys=("x",))).coordinators[0].error_code == ErrorCode.invalid_request
    found = call(raw, FindCoordinatorRequest(key_type=0, coordinator_keys=(group,))).coordinators[0]
    assert (found.error_code, found.port) == (ErrorCode.none, node.port)
    raw.close()

    # The broker keeps serving: a real consumer group works afterwards.
    produce(node.bootstrap, topic, 1, 3)
    consumer = Consumer(consumer_config(node.bootstrap, f"after-{group}"))
    consumer.subscribe([topic])
    got: dict[int, list[int]] = {0: []}
    wait_for(lambda: len(got[0]) == 3, what="3 records", step=lambda: _record(consumer.poll(0.2), got))
    consumer.close()
    assert got == {0: [0, 1, 2]}

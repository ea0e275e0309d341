"""The table holds exactly the committed records of a real transactional producer (confluent-kafka)
through `neve dev` with the compactor in the node: commit 300 / abort 200 / commit 100 records over
three partitions while another producer's transaction stays open: pyiceberg and DuckDB read
exactly the 400 committed records (none of the open transaction's, none aborted, no marker),
the table stopping right below the open transaction; once that one commits, exactly every
committed record. After compaction a read_committed consumer from offset 0 reads exactly the
committed records with the offsets they were acknowledged at, and so does a read_uncommitted one
(aborted records are gone from the compacted range); each reaches the end of every partition
(whose last offset is a marker, no longer a row)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyiceberg.catalog.sql import SqlCatalog

from compactor.commits.committer import committed_offsets
from metadata.model import ObjectType
from tests.compactor.test_service import WAIT_S, index_types, node_env
from tests.fixtures import free_port
from tests.readers import rows_duckdb, rows_pyiceberg

TOPIC = "txnrows"
PARTITIONS = 3
TIMEOUT = 60.0

Record = tuple[int, int, bytes]  # partition, offset, value


class Transactional:
    """A transactional producer that remembers the (partition, offset, value) of each record
    delivered."""

    def __init__(self, bootstrap: str, transactional_id: str, **config) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5, **config})
        self.producer.init_transactions(TIMEOUT)
        self.delivered: list[Record] = []

    def _on_delivery(self, err, msg) -> None:
        assert err is None, err
        self.delivered.append((msg.partition(), msg.offset(), msg.value()))

    def send(self, prefix: str, count: int) -> list[Record]:
        """`count` records over the partitions, in the transaction begun: those delivered (all)."""
        start = len(self.delivered)
        for i in range(count):
            self.producer.produce(TOPIC, key=b"k%d" % i, value=b"%s-%d" % (prefix.encode(), i), partition=i % PARTITIONS, on_delivery=self._on_delivery)
        assert self.producer.flush(TIMEOUT) == 0
        sent = self.delivered[start:]
        assert len(sent) == count
        return sent

    def transaction(self, prefix: str, count: int, *, commit: bool | None) -> list[Record]:
        """A transaction of `count` records, committed, aborted or (None) left open."""
        self.producer.begin_transaction()
        sent = self.send(prefix, count)
        if commit is True:
            self.producer.commit_transaction(TIMEOUT)
        elif commit is False:
            self.producer.abort_transaction(TIMEOUT)
        return sent


def catalog(data_dir: Path) -> SqlCatalog:
    return SqlCatalog("neve", uri=f"sqlite:///{data_dir / 'catalog.db'}", warehouse=f"file://{data_dir / 'warehouse'}")


def table_records(data_dir: Path) -> tuple[list[Record], dict[int, int]]:
    """The table's rows as (partition, offset, value), in order, and the last offset committed to
    it per partition (empty before the table is made)."""
    cat = catalog(data_dir)
    if not (data_dir / "catalog.db").exists() or not cat.table_exists(f"neve.{TOPIC}"):
        return [], {}
    table = cat.load_table(f"neve.{TOPIC}")
    kafka = table.scan(selected_fields=("kafka", "value_raw")).to_arrow().to_pylist()
    topic_id = table.properties.get("neve.topic-id") or next(k[len("neve.committed.") :] for k in table.properties if k.startswith("neve.committed."))
    return sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["value_raw"]) for r in kafka), {p: last for p, (last, _) in committed_offsets(table, topic_id).items()}


def wait_for_table(data_dir: Path, want: list[Record], last: dict[int, int]) -> None:
    """Until the table holds `want` and has committed up to `last` per partition; fails as soon as
    it holds a record not in `want` (an aborted, open or duplicated one)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        got, committed = table_records(data_dir)
        assert len(got) == len(set(got)), "a record is in the table twice"
        assert set(got) <= set(want), f"the table holds records that are not committed: {sorted(set(got) - set(want))[:5]}"
        if got == want and committed == last:
            return
        assert time.monotonic() < deadline, f"{len(got)} of {len(want)} rows, committed up to {committed} (want {last}) after {WAIT_S} s"
        time.sleep(0.2)


def end_offsets(bootstrap: str, isolation: str = "read_committed") -> dict[int, int]:
    """Each partition's end as a consumer of `isolation` sees it (read_committed: the last stable
    offset)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{uuid.uuid4().hex[:8]}", "isolation.level": isolation})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=TIMEOUT)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()


def consume(bootstrap: str, isolation: str) -> list[Record]:
    """Every record from offset 0 in order per partition, until the consumer is at the end of
    each partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"txn-table-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    got: list[Record] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + WAIT_S
    try:
        while len(at_end) < PARTITIONS:
            assert time.monotonic() < deadline, f"{isolation}: {len(got)} records, at the end of {sorted(at_end)} after {WAIT_S} s"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                    continue
                raise KafkaException(msg.error())
            got.append((msg.partition(), msg.offset(), msg.value()))
            at_end.discard(msg.partition())
    finally:
        consumer.close()
    return got


def test_the_table_holds_exactly_the_committed_records_of_a_transactional_producer(neve_factory):
    node = neve_factory(env=node_env(free_port()))
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(TIMEOUT)
    data_dir = Path(node.data_dir).resolve()

    writer = Transactional(node.bootstrap, "txn-table-writer")
    committed = writer.transaction("first", 300, commit=True)
    aborted = writer.transaction("aborted", 200, commit=False)
    committed += writer.transaction("third", 100, commit=True)
    other = Transactional(node.bootstrap, "txn-table-open")
    still_open = other.transaction("open", 60, commit=None)
    assert len({(p, o) for p, o, _ in committed + aborted + still_open}) == 660

    # The table stops right below the open transaction: every record before it that was committed,
    # none aborted, no marker, and none of the open one's.
    open_from = {p: min(o for q, o, _ in still_open if q == p) for p in range(PARTITIONS)}
    want = sorted(committed)
    wait_for_table(data_dir, want, {p: o - 1 for p, o in open_from.items()})
    table = catalog(data_dir).load_table(f"neve.{TOPIC}")
    for rows in (rows_pyiceberg(table), rows_duckdb(table)):
        assert sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["value_raw"]) for r in rows) == want
        assert not any(r["kafka"]["is_control"] for r in rows)

    # Once it commits: exactly every committed record, up to each partition's last marker.
    other.producer.commit_transaction(TIMEOUT)
    want = sorted(committed + still_open)
    ends = end_offsets(node.bootstrap)
    wait_for_table(data_dir, want, {p: end - 1 for p, end in ends.items()})
    table = catalog(data_dir).load_table(f"neve.{TOPIC}")
    for rows in (rows_pyiceberg(table), rows_duckdb(table)):
        assert sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["value_raw"]) for r in rows) == want

    assert node.stop() == 0
    assert index_types(data_dir, TOPIC) == {ObjectType.PARQUET}
    node.env["NEVE_COMPACTOR_IN_NODE"] = "false"
    node.start()
    # Served from the table: exactly the committed records, in order, at their offsets.
    for isolation in ("read_committed", "read_uncommitted"):
        got = consume(node.bootstrap, isolation)
        assert sorted(got) == want, isolation
        for p in range(PARTITIONS):  # in offset order
            offsets = [o for q, o, _ in got if q == p]
            assert offsets == sorted(offsets), (isolation, p)


def test_a_transaction_open_past_its_timeout_never_reaches_the_table(neve_factory):
    node = neve_factory(env=node_env(free_port(), NEVE_BROKER_TRANSACTION_CHECK_INTERVAL_MS="200"))
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(TIMEOUT)
    data_dir = Path(node.data_dir).resolve()
    committed = Transactional(node.bootstrap, "before").transaction("before", 30, commit=True)
    late = Transactional(node.bootstrap, "late", **{"transaction.timeout.ms": 2000})
    timed_out = late.transaction("late", 30, commit=None)  # then nothing: the sweep aborts it
    committed += Transactional(node.bootstrap, "after").transaction("after", 30, commit=True)
    assert len({(p, o) for p, o, _ in committed + timed_out}) == 90
    # the sweep aborts it: the last stable offsets reach the high watermarks, past its markers
    deadline = time.monotonic() + WAIT_S
    while (ends := end_offsets(node.bootstrap, "read_uncommitted")) != end_offsets(node.bootstrap):
        assert time.monotonic() < deadline, f"the transaction was not aborted within {WAIT_S} s"
        time.sleep(0.2)
    # the table holds every committed record, up to each partition's last marker, and never one
    # of the timed-out transaction's
    wait_for_table(data_dir, sorted(committed), {p: end - 1 for p, end in ends.items()})
    with pytest.raises(KafkaException):  # its producer was fenced by the abort
        late.producer.commit_transaction(TIMEOUT)

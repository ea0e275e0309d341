"""Table maintenance as `neve dev` runs it: the node's own compactor on its defaults (the Spark
runner, the SQLite catalog `<data-dir>/catalog.db` named `neve`, tables in namespace `neve`), a
maintenance round every few seconds that merges a table partition's small files once it has two.
A real client produces over several cycles; the WAL objects go within the read grace (2 s
here) and a watch interval of the last swap, the sweeper's listing being minutes away; a
maintenance round merges the cycles' files into one (Iceberg's rewrite of data files, on the
node's Spark session); every record is read back from offset 0 through Kafka, batch for batch,
from the table once the WAL objects are gone and again from the merged file. The node logs no
failed compaction or maintenance."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyiceberg.catalog.sql import SqlCatalog

from tests.compactor.test_service import WAIT_S, consume_all
from tests.fixtures import NeveNode
from tests.table.test_fetch_from_table import comparable, fetch_batches, wal_objects

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("spark"), pytest.mark.timeout(900)]

TOPIC = "orders"
PARTITIONS = 2
ROUNDS = 6
PER_ROUND = 40
DAY_MS = 1_700_006_400_000  # every record in one day: the table has one table partition


def node_env(**extra: str) -> dict[str, str]:
    """`neve dev`'s defaults (no catalog named, the Spark runner) but for how often things happen."""
    return {
        "NEVE_COMPACTOR_IN_NODE": "true",
        "NEVE_WAL_LINGER_MS": "5",
        "NEVE_COMPACTOR_FRESHNESS_MS": "200",
        "NEVE_COMPACTOR_INTERVAL_MS": "200",
        "NEVE_COMPACTOR_MAINTENANCE_INTERVAL_MS": "8000",
        "NEVE_COMPACTOR_MERGE_MIN_FILES": "2",
        "NEVE_COMPACTOR_MERGE_ON_SPARK_MIN_BYTES": "0",  # the merge of these few KiB on Spark too
        **extra,
    }


def catalog(data_dir: Path) -> SqlCatalog:
    return SqlCatalog("neve", uri=f"sqlite:///{data_dir / 'catalog.db'}", warehouse=f"file://{data_dir / 'warehouse'}")


def table_state(data_dir: Path) -> tuple[list[tuple[int, int]], int, list[str]] | None:
    """(the table's (partition, offset) rows, its data files, its snapshots' operations), or None before it exists."""
    c = catalog(data_dir)
    if not (data_dir / "catalog.db").exists() or not c.table_exists(f"neve.{TOPIC}"):
        return None
    table = c.load_table(f"neve.{TOPIC}")
    kafka = table.scan(selected_fields=("kafka",)).to_arrow().column("kafka").to_pylist()
    files = len(table.inspect.files()) if table.current_snapshot() is not None else 0
    return sorted((k["partition"], k["offset"]) for k in kafka), files, [s.summary.operation.value for s in table.snapshots() if s.summary is not None]


FAILED = ("compaction failed", "maintenance failed", "compaction cycle failed", "rewrite not committed")


def events(node: NeveNode) -> list[dict]:
    """The node's log events (its JSON lines)."""
    out = []
    for line in node.log_path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def failures(node: NeveNode) -> list[str]:
    """The node's log events that say a compaction or a maintenance round failed."""
    return [json.dumps(e) for e in events(node) if e.get("level") == "error" or any(f in str(e.get("event", "")) for f in FAILED)]


def wait_until(what: str, node: NeveNode, done) -> object:
    """Poll `done()` until it returns something true; fail at once on a failure line in the node's log."""
    deadline = time.monotonic() + WAIT_S
    while True:
        got = done()
        if got:
            return got
        bad = failures(node)
        assert not bad, f"{what}: the node logged failures:\n" + "\n".join(bad[:5])
        assert time.monotonic() < deadline, f"{what}: not after {WAIT_S} s"
        time.sleep(0.25)


def produce_round(bootstrap: str, r: int, want: dict) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    acked = []

    def on_delivery(err, msg):
        assert err is None, err
        acked.append((msg.partition(), msg.offset()))

    sent = {}
    for i in range(PER_ROUND):
        key, value = b"k%d-%d" % (r, i), bytes([r, i]) * (1 + i % 7) + b"\x00\xff"
        headers = [("round", b"%d" % r), ("bytes", bytes(range(i % 5)))]
        part, ts = i % PARTITIONS, DAY_MS + r * 1000 + i
        sent.setdefault(part, []).append((key, value, headers, ts))
        producer.produce(TOPIC, value=value, key=key, headers=headers, partition=part, timestamp=ts, on_delivery=on_delivery)
    assert producer.flush(60) == 0
    for part, records in sent.items():  # one producer, one partition: acknowledged in order
        offsets = sorted(o for p, o in acked if p == part)
        for offset, record in zip(offsets, records, strict=True):
            want[(part, offset)] = record


READ_GRACE_S = 2
COLLECTED_WITHIN_S = READ_GRACE_S + 15  # the read grace, a watch interval (1 s here), and a busy machine's slack


def test_neve_dev_merges_its_tables_small_files_and_every_record_reads_back(neve_factory):
    # the sweeper's listing stays at its default (300 s): the WAL objects go by its index watch
    node = neve_factory(env=node_env(NEVE_WAL_READ_GRACE_S=str(READ_GRACE_S)))
    data_dir = Path(node.data_dir).resolve()
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS)])[TOPIC].result(60)
    counts = {p: ROUNDS * PER_ROUND // PARTITIONS for p in range(PARTITIONS)}

    want: dict[tuple[int, int], tuple] = {}
    for r in range(ROUNDS):  # a cycle each: each round's rows in the table before the next is produced
        produce_round(node.bootstrap, r, want)
        wait_until(f"round {r} in the table", node, lambda: (s := table_state(data_dir)) and s[0] == sorted(want))
    compacted = time.monotonic()  # the last cycle committed (its index swap follows at once)
    assert table_state(data_dir)[2].count("append") >= ROUNDS  # a commit a cycle at least
    batches = fetch_batches(node.port, TOPIC, partitions=range(PARTITIONS))
    assert sum(len(b.records) for bs in batches.values() for b in bs) == len(want)

    # the WAL objects go once their read grace has passed, long before the sweeper's next listing
    wait_until("the WAL objects collected", node, lambda: not wal_objects(data_dir))
    took = time.monotonic() - compacted
    print(f"WAL objects collected {took:.1f} s after the last cycle (read grace {READ_GRACE_S} s)")
    assert took <= COLLECTED_WITHIN_S
    assert comparable(fetch_batches(node.port, TOPIC, partitions=range(PARTITIONS))) == comparable(batches)
    assert consume_all(node.bootstrap, TOPIC, counts) == want

    # a maintenance round merges every cycle's files of the one table partition into one
    rows, files, operations = wait_until("the merge", node, lambda: (s := table_state(data_dir)) and s[1] == 1 and s)
    assert rows == sorted(want)  # each offset once
    assert "replace" in operations  # Spark's rewrite of the data files
    assert [e["runner"] for e in events(node) if e.get("event") == "merged a table's small files"][:1] == ["spark"]
    assert comparable(fetch_batches(node.port, TOPIC, partitions=range(PARTITIONS))) == comparable(batches)
    assert consume_all(node.bootstrap, TOPIC, counts) == want
    assert node.stop() == 0
    assert not failures(node)
    assert table_state(data_dir)[:2] == (sorted(want), 1)

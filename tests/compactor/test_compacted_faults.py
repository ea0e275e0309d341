"""A compacted topic's upsert cycle cut short anywhere keeps its table one row per live key and its
Kafka view what it would have been without the cut.

kill -9 of `neve dev` (its compactor in the node) at each step of an upsert cycle that updates,
deletes and adds keys: once its tasks' Parquet files are `written`; once its removal object is
written (`removals-written`), its manifest (`manifest-written`), its position-delete files
(`deletes-written`, not committed); once its one snapshot of rows and deletes is `committed`; once
its index is `swapped`; once its partitions' entries are merged (`entries-merged`). The table the
kill leaves is the one before the cycle or the one after it, whole (never a key with two rows or
with none); after a restart (and a later cycle that updates, deletes and brings a deleted key
back) the table (pyiceberg and DuckDB) holds exactly the latest record of each live key, and a
consumer from offset 0 reads exactly the latest record of each key and the tombstones (within
delete.retention.ms), as the same records compacted without a kill are read (`None`: no kill).

A compactor deposed mid-cycle (its lease revoked while its tasks run, as in test_deposed.py) that
commits its upsert cycle before or after the new leader's over the same offsets leaves one row
per live key too, and the same Kafka view."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from compactor.config import CompactorConfig
from tests.compactor.test_compacted_topics import PARTITIONS, TIMEOUT, Record, after_retention, create, key, latest_per_key, wait_for_table, wait_for_view
from tests.compactor.test_deposed import LEAD_S, service_on, wal_entries
from tests.compactor.test_service import WAIT_S, node_env
from tests.compactor.test_transactions_clients import catalog
from tests.fixtures import NeveNode, free_port
from tests.readers import rows_duckdb, rows_pyiceberg

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

KEYS = 24
KILL = "NEVE_COMPACTOR_FAULT_KILL_AFTER"
RETAINED = "3600000"  # delete.retention.ms: tombstones served for an hour once compacted
HIDDEN_AT_ONCE = "0"  # tombstones hidden from Kafka readers once compacted
BEFORE_COMMIT = ["written", "removals-written", "manifest-written", "deletes-written"]  # the table as before the cycle
AFTER_COMMIT = ["committed", "swapped", "entries-merged"]  # the table as after it


def produce_together(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]]) -> list[Record]:
    """Each (key, value) to partition (key number % PARTITIONS), in order, lingering so that all of
    them go in one produce request (one WAL object: one cycle compacts them all): the records as
    acknowledged."""
    acked: list[Record] = []

    def delivered(err, msg) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 500, "enable.idempotence": True})
    for k, v in records:
        producer.produce(topic, key=k, value=v, partition=int(k[4:]) % PARTITIONS, on_delivery=delivered)
    assert producer.flush(TIMEOUT) == 0
    assert len(acked) == len(records)
    return acked


def base_records() -> list[tuple[bytes, bytes | None]]:
    """Every key, then a third of them updated."""
    return [(key(k), b"v0-%03d" % k) for k in range(KEYS)] + [(key(k), b"v1-%03d" % k) for k in range(KEYS // 3)]


def upsert_records() -> list[tuple[bytes, bytes | None]]:
    """The cycle cut short: keys updated (some twice), deleted, updated then deleted, and new."""
    return [
        *((key(k), b"v2-%03d" % k) for k in range(12)),
        *((key(k), b"v3-%03d" % k) for k in range(4)),
        *((key(k), None) for k in range(12, 16)),
        (key(8), None),
        *((key(k), b"v2-%03d" % k) for k in range(KEYS, KEYS + 4)),
    ]


def later_records() -> list[tuple[bytes, bytes | None]]:
    """A later cycle: a key updated again, a deleted key back, a key deleted."""
    return [(key(0), b"v4-000"), (key(12), b"v4-012"), (key(20), None)]


def table_rows(data_dir: Path, topic: str) -> list[Record]:
    """(partition, offset, key, value) of each row of the topic's table, sorted; pyiceberg and
    DuckDB read the same."""
    table = catalog(data_dir).load_table(f"neve.{topic}")
    got = sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["key_raw"], r["value_raw"]) for r in rows_pyiceberg(table))
    assert sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["key_raw"], r["value_raw"]) for r in rows_duckdb(table)) == got
    return got


def live_rows(acked: list[Record]) -> list[Record]:
    """The rows an upsert table of `acked` holds: the latest record of each key, but tombstones."""
    return [r for r in latest_per_key(acked) if r[3] is not None]


@pytest.mark.parametrize("point", [None, *BEFORE_COMMIT, *AFTER_COMMIT])
def test_a_kill_at_each_step_of_an_upsert_cycle_leaves_one_row_per_live_key_and_the_same_kafka_view(neve_factory, point):
    kill_in_an_upsert_cycle(neve_factory, point, HIDDEN_AT_ONCE)


@pytest.mark.parametrize("point", [None, "committed", "swapped"])
def test_tombstones_stay_in_the_kafka_view_for_delete_retention_across_a_kill(neve_factory, point):
    kill_in_an_upsert_cycle(neve_factory, point, RETAINED)


def kafka_view(acked: list[Record], retention: str) -> list[Record]:
    """What a consumer from offset 0 reads once `acked` are compacted: the latest record of each
    key, and tombstones only while retained."""
    want = latest_per_key(acked)
    return want if retention == RETAINED else after_retention(want)


def kill_in_an_upsert_cycle(neve_factory, point: str | None, retention: str) -> None:
    """The base records compacted; the node restarted with the kill armed at `point` (None: not
    armed), the upsert records produced, the node killed in their cycle and started again; the
    later records produced: the table and the Kafka view as without a kill."""
    node = neve_factory(env=node_env(free_port(), NEVE_COMPACTOR_MAINTENANCE_INTERVAL_MS="0"))
    data_dir = Path(node.data_dir).resolve()
    topic = "upsert_" + (point or "none").replace("-", "_")
    create(node.bootstrap, topic, **{"delete.retention.ms": retention})
    acked = produce_together(node.bootstrap, topic, base_records())
    wait_for_table(data_dir, topic, latest_per_key(acked))
    wait_for_view(node.bootstrap, topic, kafka_view(acked, retention))  # compacted and merged: nothing left to do
    before = live_rows(acked)
    assert len(before) == KEYS

    if point is not None:
        node.env[KILL] = point
    node.restart()
    acked += produce_together(node.bootstrap, topic, upsert_records())
    if point is not None:
        assert node.process.wait(WAIT_S) == -9  # the cycle of those records killed it at `point`
        after = live_rows(acked)
        assert len(after) == KEYS - 5 + 4
        assert table_rows(data_dir, topic) == (before if point in BEFORE_COMMIT else after)
        del node.env[KILL]
        node.start()

    acked += produce_together(node.bootstrap, topic, later_records())
    want = latest_per_key(acked)
    assert (len(want), sum(v is None for *_, v in want)) == (KEYS + 4, 5)  # the tombstones of keys 8, 13-15 and 20
    wait_for_table(data_dir, topic, want)
    wait_for_view(node.bootstrap, topic, kafka_view(acked, retention))
    assert node.stop() == 0
    assert table_rows(data_dir, topic) == live_rows(acked)


@pytest.mark.parametrize("first_to_commit", ["deposed", "leader"])
def test_a_deposed_compactor_committing_an_upsert_cycle_late_leaves_one_row_per_live_key(etcd_server, tmp_path, caplog, first_to_commit):
    caplog.set_level(logging.INFO, logger="neve")
    metadata_url = f"{etcd_server.url}/deposed-upsert-{uuid.uuid4().hex[:8]}"
    data_dir = (tmp_path / "node").resolve()
    data_dir.mkdir()
    node = NeveNode(data_dir=data_dir, log_path=tmp_path / "node.log", env={"NEVE_WAL_LINGER_MS": "5", "NEVE_COMPACTOR_IN_NODE": "false", "NEVE_METADATA_URL": metadata_url}).start()
    topic = "deposed_upsert"
    try:
        create(node.bootstrap, topic, **{"delete.retention.ms": HIDDEN_AT_ONCE})
        config = CompactorConfig(
            catalog_url=f"sqlite://{data_dir / 'catalog.db'}", warehouse=f"file://{data_dir / 'warehouse'}", runner="in-process", freshness_ms=0, maintenance_interval_ms=0
        )
        acked, outcome = asyncio.run(deposed_upsert(metadata_url, data_dir, config, node.bootstrap, topic, first_to_commit))
        assert outcome["deposed_cycles"] == [] and outcome["wal_left"] == 0
        assert outcome["rows_before"] == live_rows(acked[: len(base_records())])
        assert table_rows(data_dir, topic) == live_rows(acked)  # one row per live key: none twice, none lost
        wait_for_view(node.bootstrap, topic, kafka_view(acked, HIDDEN_AT_ONCE))
    finally:
        assert node.stop() == 0
    lost = [r for r in caplog.records if r.getMessage() == "compactor leadership lost; this run stops"]
    refused = [r for r in caplog.records if r.getMessage() == "cycle not committed: another cycle holds its offsets"]
    finished = [r for r in caplog.records if r.getMessage() == "finished the index swap of a committed cycle"]
    if first_to_commit == "deposed":  # its upsert committed, its swap fenced: the leader swapped and merged that cycle
        assert (len(lost), refused, len(finished)) == (1, [], 1)
        assert outcome["leader_cycles"] == []
    else:  # the leader's upsert went first: the deposed one's commit is refused
        assert (lost, len(refused), finished) == ([], 1, [])
        assert outcome["leader_cycles"]


async def deposed_upsert(metadata_url: str, data_dir: Path, config: CompactorConfig, bootstrap: str, topic: str, first_to_commit: str) -> tuple[list[Record], dict]:
    """The base records compacted by the first compactor while it leads; then the upsert records
    planned by it, its lease revoked while its tasks run, and the second compactor leading."""
    objects_url = f"file://{data_dir / 'objects'}"
    async with contextlib.AsyncExitStack() as stack:

        async def compactor(name: str, lease_ttl_s: int):
            service = await service_on(stack, metadata_url, objects_url, config, lease_ttl_s)
            service.leadership = await service.metadata.campaign("compactor", name)
            return service

        deposed = await compactor("deposed", 30)
        assert await deposed.leadership.wait_leading(LEAD_S)
        acked = await asyncio.to_thread(produce_together, bootstrap, topic, base_records())
        await deposed.metadata.view_caught_up()
        assert [c.cycle_id is not None for c in await deposed.run_once()] == [True]
        assert wal_entries(deposed.metadata, topic) == 0
        rows_before = await asyncio.to_thread(table_rows, data_dir, topic)

        acked += await asyncio.to_thread(produce_together, bootstrap, topic, upsert_records())
        await deposed.metadata.view_caught_up()
        leader = await compactor("leader", 2)
        assert not leader.leadership.is_leader()
        in_task, go_on = asyncio.Event(), asyncio.Event()
        run_job = deposed._run_job

        async def paused(due):
            in_task.set()
            await go_on.wait()
            return await run_job(due)

        deposed._run_job = paused
        deposed_run = asyncio.create_task(deposed.run_once())
        await asyncio.wait_for(in_task.wait(), LEAD_S)
        # Its lease revoked while its task runs: the other compactor takes the lead.
        held = await leader.metadata._client.get(deposed.metadata.keys.leader("compactor"))
        await leader.metadata._client.revoke_lease(held.lease)
        deposed.leadership.is_leader = lambda: True  # paused: it has not noticed
        assert await leader.leadership.wait_leading(LEAD_S)

        leader_cycles = []
        if first_to_commit == "leader":
            await leader.metadata.view_caught_up()
            leader_cycles += [c for c in await leader.run_once() if c.cycle_id is not None]
        go_on.set()
        deposed_cycles = [c for c in await deposed_run if c.cycle_id is not None]
        for _ in range(5):  # a run finishes what the deposed compactor left, the next finds nothing due
            cycles = [c for c in await leader.run_once() if c.cycle_id is not None]
            leader_cycles += cycles
            if not cycles and wal_entries(leader.metadata, topic) == 0:
                break
        outcome = {"deposed_cycles": deposed_cycles, "leader_cycles": leader_cycles, "wal_left": wal_entries(leader.metadata, topic), "rows_before": rows_before}
        return acked, outcome

"""The compactor's planted bug (chaos/plants.py's table-row-dropped, CompactorConfig's
fault_drop_row_every): every Nth task the service plans leaves its first row out of its Parquet
file while its offsets are still the task's, so the cycle's index swap replaces the WAL entries
that held it. Shown on the tasks in this process (through the record path and the columnar one),
on the service's count of tasks, and on `neve dev` with the compactor inside: once the index
names the table, a Kafka read from offset 0 misses the records the table misses."""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compactor.config import CompactorConfig
from compactor.files.job import TaskContext, run_tasks_in_process
from compactor.files.layout import partition_spec, table_schema
from compactor.files.planner import ObjectRead, Run, Task
from compactor.service.loop import CompactionService
from metadata.model import IndexEntry, ObjectType
from tests.batches import make_batch
from tests.compactor.test_service import node_env, table_offsets
from tests.fixtures import free_port

T0 = 1_700_000_000_000
EVENT_SCHEMA = '{"type": "record", "name": "E", "fields": [{"name": "n", "type": "long"}]}'


def _context(tmp_path: Path, drop: frozenset[int]) -> TaskContext:
    schema = table_schema()
    return TaskContext(
        cycle_id="c0", topic="t", objects_url=f"file://{tmp_path / 'objects'}", data_location=f"file://{tmp_path / 'data'}", io_properties={},
        table_schema=schema.model_dump_json(), partition_spec=partition_spec(schema).model_dump_json(), table_properties={}, drop_row_tasks=drop,
    )  # fmt: skip


@pytest.mark.parametrize("schemas", [{}, {1: (EVENT_SCHEMA, None)}], ids=["columns (raw topic)", "record by record (topic with a schema)"])
def test_a_task_named_in_drop_row_tasks_writes_all_but_its_first_row(tmp_path, schemas):
    """Two tasks of one partition's offsets 0-5 and 6-11 (two batches each): the second, named,
    writes offsets 7-11; its file's offsets still start at 7 and it counts 5 rows, so the cycle's
    manifest (which replaces the WAL entries 6-11) has offset 6 in no file."""
    batches = [make_batch([(b"k", b"v%d" % (3 * b + i), [], T0 + 3 * b + i) for i in range(3)]) for b in range(4)]
    (tmp_path / "objects").mkdir()
    (tmp_path / "objects" / "obj").write_bytes(b"".join(batches))
    starts = [sum(map(len, batches[:b])) for b in range(5)]
    entries = [IndexEntry(3 * b, 3 * b + 2, "obj", ObjectType.WAL, starts[b], len(batches[b]), T0 + 3 * b + 2) for b in range(4)]
    tasks = [Task((Run("t", 0, tuple(entries[2 * t : 2 * t + 2]), 6 * t),), (ObjectRead("obj", starts[2 * t], starts[2 * t + 2]),)) for t in range(2)]
    context = dataclasses.replace(_context(tmp_path, frozenset({1})), schemas=schemas)
    kept, dropped = run_tasks_in_process(context, tasks)
    offsets = [[row["kafka"]["offset"] for f in r.files for row in pq.read_table(f.path, partitioning=None).to_pylist()] for r in (kept, dropped)]
    assert offsets == [list(range(0, 6)), list(range(7, 12))]
    assert [(f.record_count, f.offsets[0].first, f.offsets[0].last, f.offsets[0].rows) for f in dropped.files] == [(5, 7, 11, 5)]
    # off (the default): every row
    (whole,) = run_tasks_in_process(dataclasses.replace(context, cycle_id="c1", drop_row_tasks=frozenset()), tasks[1:])
    assert [f.record_count for f in whole.files] == [6]


def test_the_service_names_every_nth_task_it_plans_across_cycles():
    service = CompactionService(CompactorConfig(fault_drop_row_every=3), None, None, "", None)  # type: ignore[arg-type]
    assert [sorted(service.faults.drop_row_tasks(n)) for n in (2, 2, 1, 4, 3)] == [[], [0], [], [0, 3], [2]]  # tasks 3, 6, 9, 12
    off = CompactionService(CompactorConfig(), None, None, "", None)  # type: ignore[arg-type]
    assert off.config.fault_drop_row_every == 0  # _prepare does not ask then: no task is named


def test_neve_dev_with_the_plant_serves_kafka_reads_without_the_dropped_records(neve_factory):
    node = neve_factory(env=node_env(free_port(), NEVE_COMPACTOR_FAULT_DROP_ROW_EVERY="1"))
    topic = f"plant-table-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    for fut in admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=30).values():
        fut.result(timeout=30)
    producer = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 0})
    for i in range(10):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    data_dir = Path(node.data_dir).resolve()
    deadline = time.monotonic() + 120
    while True:  # every offset compacted, rows missing, and the index swapped to the table
        in_table = [o for _, o in table_offsets(data_dir, topic)]
        read = kafka_offsets(node.bootstrap, topic) if in_table and in_table[-1] == 9 else list(range(10))
        if len(read) < 10:
            break
        assert time.monotonic() < deadline, f"table {in_table}, Kafka read {read}"
        time.sleep(0.5)
    assert len(in_table) < 10 and read == in_table  # the table and the Kafka view miss the same records


def kafka_offsets(bootstrap: str, topic: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, 0)])
    offsets: list[int] = []
    try:
        for _ in range(100):
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                return offsets
            offsets.append(msg.offset())
    finally:
        consumer.close()
    raise AssertionError(f"no end of partition after {offsets}")

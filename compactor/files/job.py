"""The compaction job between the plan and the commit: each planned task reads its WAL byte ranges
(once), decodes the batches, translates every record and writes the task's Parquet files; run on
Spark executors (`run_tasks`) or in this process (`run_tasks_in_process`). An executor gets all it
needs in a picklable TaskContext (store and warehouse URLs, the table's schema and spec, the writer
schemas the driver fetched): nothing comes from the driver's memory, the registry or a local path.

The table holds committed records only: control batches (transaction markers) and the batches of
the aborted transactions each run carries (planner.Run.aborted) are never rows. Rows keep their
offsets, so the table's offsets have gaps where those were.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import threading
import time
import traceback
import warnings
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from metadata.model import IndexEntry
from table.layout import BATCH_COMPRESSION, HEADERS, KAFKA, KEY_RAW, MAX_MS, MIN_MS, OFFSET, STORED_BATCH, TIMESTAMP, VALUE, VALUE_ERROR, VALUE_RAW, VALUE_SCHEMA_ID, clamp_ms
from wal.batch import BATCH_HEADER, BATCH_HEADER_SIZE, LOG_OVERHEAD, decompress
from wal.store import load_object_store

from ..rows.avro_columns import ValueColumns
from ..rows.columns import RawRows, decode_batches
from ..rows.records import SERVED_LEADER_EPOCH, Batch, CorruptBatch, decode_records, iter_batches
from ..rows.translator import COLUMNS, OUTCOMES, RAW, TOMBSTONE, Resolver, WriterSchema, kafka_columns, translate, writer_schema
from .planner import Aborted, ObjectRead, Run, Task
from .writer import TableWriter, WrittenFile

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyspark.sql import SparkSession

_TRANSACTION_BITS = 0x30  # a batch's transactional and control attributes: only such a batch may be no row
# A batch that does not decode: one row holds its stored bytes (the writer counts it as raw).
MALFORMED = "malformed"
COUNTED = (*OUTCOMES, MALFORMED)
# Consecutive batches of a topic without a schema decoded as columns at once: (RawRows, the
# batches), for the writer's add_raw_rows.
RAW_ROWS = "raw rows"
RAW_ROWS_BYTES = 32 << 20  # records sections decoded as columns at once, at most (past one batch)
READ_CONCURRENCY = 8  # ranged GETs in flight per task: object-store latency, not bandwidth, bounds a task
# A task reading at most this many bytes fetches them before it decodes, on its own thread: a
# thread started per task to overlap a few KiB of reads cost more than the reads (a cycle's job
# holds a task of every small topic).
FETCH_FIRST_BYTES = 1 << 20
# Catalog settings that reach table.io.properties but no FileIO reads (a PostgreSQL URI carries its
# password): kept off the context that every executor receives.
_CATALOG_ONLY = frozenset({"uri", "credential", "token", "oauth2-server-uri", "warehouse"})


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What every task of one cycle of one topic needs, sent to each executor with its task."""

    cycle_id: str
    topic: str
    objects_url: str  # the WAL's object store, wal/store.py's factory URL: file:///dir, s3://bucket/prefix?endpoint=...
    data_location: str  # where the table's data files go (its location provider's data path)
    io_properties: dict[str, str]  # pyiceberg FileIO settings for data_location (S3 endpoint, keys)
    table_schema: str  # pyiceberg Schema as JSON
    partition_spec: str  # pyiceberg PartitionSpec as JSON
    table_properties: dict[str, str]  # for the writer's column statistics (write.metadata.metrics.*)
    # Schema id → (Avro schema text, raw_reason or None): every version of `subject`, fetched by
    # the driver before the cycle. Empty: the topic has no schema, values stay raw.
    schemas: dict[int, tuple[str, str | None]] = field(default_factory=dict)
    subject: str = ""  # the subject `schemas` are the versions of; "" means `<topic>-value`
    # The table-row-dropped plant (a deliberate bug, test only: CompactorConfig.fault_drop_row_every):
    # the indexes of this cycle's tasks whose writer leaves out its first row. Empty: none.
    drop_row_tasks: frozenset[int] = frozenset()

    @classmethod
    def for_table(cls, table: Any, *, cycle_id: str, topic: str, objects_url: str, schemas: Mapping[int, tuple[str, str | None]], subject: str = "", drop_row_tasks: frozenset[int] = frozenset()) -> TaskContext:
        """The context of a cycle writing to `table` (a pyiceberg Table, as loaded by the driver)."""
        return cls(
            cycle_id=cycle_id,
            topic=topic,
            objects_url=objects_url,
            data_location=table.location_provider().data_path,
            io_properties={k: v for k, v in table.io.properties.items() if k not in _CATALOG_ONLY},
            table_schema=table.schema().model_dump_json(),
            partition_spec=table.spec().model_dump_json(),
            table_properties=dict(table.properties),
            schemas=dict(schemas),
            subject=subject,
            drop_row_tasks=drop_row_tasks,
        )

    @property
    def value_subject(self) -> str:
        return self.subject or f"{self.topic}-value"


@dataclass(slots=True)
class TaskResult:
    """What one task wrote and what it saw, sent back to the driver."""

    index: int
    attempt: int
    files: list[WrittenFile]
    partition_outcomes: dict[int, dict[str, int]]  # Kafka partition → rows per outcome (COUNTED), as translated
    bytes_read: int  # WAL bytes fetched by the task's reads
    seconds: float
    # (partition, offset of its row, why) for each batch that did not decode: for the service's log
    malformed: list[tuple[int, int, str]] = field(default_factory=list)

    @property
    def outcomes(self) -> dict[str, int]:
        """Rows per outcome (COUNTED) over the task's partitions."""
        totals = dict.fromkeys(COUNTED, 0)
        for counts in self.partition_outcomes.values():
            for outcome, n in counts.items():
                totals[outcome] += n
        return totals

    @property
    def rows(self) -> int:
        return sum(self.outcomes.values())


def run_task(context: TaskContext, task: Task, index: int = 0, attempt: int = 0) -> TaskResult:
    """Read, decode, translate and write one task; pure Python, runs on an executor or here (off any
    event loop: it runs one of its own for the reads). Files are named `<cycle>-<index>-<attempt>-n`
    so that a retried or speculative attempt never meets another's. A batch that does not decode
    becomes one malformed row; any other failure deletes the files the task wrote, then raises."""
    from pyiceberg.io import load_file_io
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema

    started = time.perf_counter()
    for run in task.runs:
        if run.topic != context.topic:
            raise ValueError(f"task {index} holds a run of topic {run.topic!r}, the context is for {context.topic!r}")
    ranges = _Ranges(context.objects_url, task.reads)  # fetched on a thread of its own from here on (a few KiB: fetched now)
    resolve = _resolver(context)
    io = _RecordingIO(load_file_io(context.io_properties, context.data_location))
    writer = TableWriter(
        _parsed(Schema, context.table_schema),
        _parsed(PartitionSpec, context.partition_spec),
        context.data_location,
        io,
        file_prefix=f"{context.cycle_id}-{index:05d}-{attempt}",
        table_properties=context.table_properties,
        drop_first_row=index in context.drop_row_tasks,
    )
    outcomes: dict[int, dict[str, int]] = {}
    malformed: list[tuple[int, int, str]] = []
    # Batches decoded as columns many at once (values too, for Avro values rows/avro_columns.py reads);
    # the others record by record.
    columnar = writer.takes_raw if resolve is None else writer.takes_columns
    values = ValueColumns(resolve, writer.arrow) if columnar and resolve is not None else None
    try:
        # The writer takes each partition's rows together and in offset order; a task may hold
        # several pieces of one partition's run, packed apart.
        for run in sorted(task.runs, key=lambda r: (r.partition, r.first_offset)):
            counts = outcomes.setdefault(run.partition, dict.fromkeys(COUNTED, 0))
            if columnar:
                rows = _run_raw_rows(run, ranges, writer.arrow, values)
            else:
                rows = (item for entry in run.entries for item in _entry_rows(run.partition, entry, ranges.slice(entry), run.first_offset, resolve, run.aborted))
            for row, outcome in rows:
                if outcome != RAW_ROWS:
                    _add_row(writer, row, outcome, counts, malformed, run.partition)
                    continue
                raw_rows, batches = row
                if writer.add_raw_rows(run.partition, raw_rows):
                    _count_rows(raw_rows, counts)
                    continue
                for view, batch in batches:  # offsets add_raw_rows refuses: batch by batch, as records
                    for batch_row, batch_outcome in _batch_rows(run.partition, view, batch, run.first_offset, resolve):
                        _add_row(writer, batch_row, batch_outcome, counts, malformed, run.partition)
        files = writer.close()
    except BaseException:
        writer.abort()
        io.delete_created()
        raise
    finally:
        ranges.close()
    return TaskResult(index, attempt, files, outcomes, ranges.bytes_read, time.perf_counter() - started, malformed)


@functools.lru_cache(maxsize=256)
def _parsed(model: type, text: str) -> Any:
    """A table's schema or spec from its JSON, parsed once per process: a cycle's job holds a task
    of every topic with something due, and most tables share their schema (the raw columns)."""
    return model.model_validate_json(text)


def _count_rows(rows: RawRows, counts: dict[str, int]) -> None:
    counts[TOMBSTONE] += rows.tombstones
    counts[RAW if rows.schema_id is None else COLUMNS] += len(rows) - rows.tombstones  # with a schema id: values in columns alone


def _add_row(writer: TableWriter, row: Any, outcome: str | None, counts: dict[str, int], malformed: list[tuple[int, int, str]], partition: int) -> None:
    """One of _entry_rows' (row, outcome) to the writer, counted."""
    if outcome is None:  # a topic without a schema: one batch's records
        kafka, records, stored = row
        try:
            taken = writer.add_raw(kafka, records)
        except Exception as e:  # records that do not become rows: the batch is kept as stored
            _add_row(writer, stored(e), MALFORMED, counts, malformed, partition)
            return
        if not taken:
            for record in records:
                writer.add(*translate(record, kafka, None))
        tombstones = sum(1 for r in records if r[3] is None)
        counts[TOMBSTONE] += tombstones
        counts[RAW] += len(records) - tombstones
        return
    if outcome == MALFORMED:
        malformed.append((partition, row[KAFKA][OFFSET], row[VALUE_ERROR]))
        writer.add(row, RAW)
    else:
        writer.add(row, outcome)
    counts[outcome] += 1


def run_task_tuple(item: tuple[TaskContext, int, Task]) -> TaskResult:
    """run_task for Spark's map: the attempt number from Spark's own TaskContext."""
    context, index, task = item
    from pyspark import TaskContext as SparkTaskContext

    spark_task = SparkTaskContext.get()
    return run_task(context, task, index, spark_task.attemptNumber() if spark_task is not None else 0)


@dataclass(frozen=True, slots=True)
class TaskFailed:
    """What a task that raised sends back in place of its TaskResult: its topic's other tasks go
    on, and only that topic's cycle fails (a cycle's job holds the tasks of many topics)."""

    index: int
    error: str
    trace: str


class CycleTaskError(Exception):
    """A task of a topic's cycle failed (on an executor or here): the cycle of that topic fails,
    retried at the next; the files its other tasks wrote are deleted."""


Work = tuple[TaskContext, Sequence[Task]]  # one topic's tasks, with their context
Item = tuple[int, TaskContext, int, Task]  # (the topic's place in the job, its context, the task's index, the task)


def run_cycle(spark: SparkSession, work: Sequence[Work], slices: int) -> list[list[TaskResult] | Exception]:
    """The tasks of every topic of a cycle in one Spark job of about `slices` Spark tasks (the
    executors' cores), each a bundle of whole compaction tasks of about as many WAL bytes: a job's
    fixed cost is paid once a cycle, not once a topic, and a thousand small topics are not a
    thousand Spark tasks. Per topic, in `work`'s order: its results in task order, or the error
    that failed it (CycleTaskError, its files deleted). Blocks for the whole job: call it off the
    event loop. A job that fails as a whole (an executor lost) raises."""
    items = [(w, context, i, task) for w, (context, tasks) in enumerate(work) for i, task in enumerate(tasks)]
    if not items:
        return [[] for _ in work]
    bundles = bundle(items, slices)
    with warnings.catch_warnings():
        # pyspark 3.5 leaves the local socket a job's results are read from to the garbage
        # collector: its ResourceWarning is pyspark's, not a leak of ours (an error where warnings are)
        warnings.simplefilter("ignore", ResourceWarning)
        # SparkContext.runJob, not collect(): Spark 3.5 cleans an action's closures at every job,
        # parsing with ASM the class each was defined in, and collect's is RDD (180 KB) where
        # runJob's is PythonRDD (44 KB): 6-8 ms of the JVM's 41-46 ms a job
        rdd = spark.sparkContext.parallelize(bundles, numSlices=len(bundles))
        outcomes = spark.sparkContext.runJob(rdd, _run_bundles)
        gc.collect()
    return _by_topic(work, outcomes)


def run_cycle_in_process(work: Sequence[Work], threads: int) -> list[list[TaskResult] | Exception]:
    """run_cycle on `threads` threads of this process (Spark off: tests, small machines). A task's
    Parquet encoding and compression release the GIL, so one task's writing runs beside another's
    decoding."""
    items = [(w, context, i, task) for w, (context, tasks) in enumerate(work) for i, task in enumerate(tasks)]
    if not items:
        return [[] for _ in work]
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(items))), thread_name_prefix="compaction-task") as pool:
        outcomes = list(pool.map(lambda item: (item[0], _run_item(item, on_spark=False)), items))
    return _by_topic(work, outcomes)


def bundle(items: Sequence[Item], slices: int) -> list[list[Item]]:
    """`items` in at most `slices` bundles of about as many WAL bytes (the largest task first, each
    to the lightest bundle so far), each bundle's items in their order."""
    n = max(1, min(slices, len(items)))
    loads = [0] * n
    bundles: list[list[tuple[int, Item]]] = [[] for _ in range(n)]
    for at in sorted(range(len(items)), key=lambda k: -items[k][3].size):
        lightest = loads.index(min(loads))
        bundles[lightest].append((at, items[at]))
        loads[lightest] += items[at][3].size
    return [[item for _, item in sorted(b, key=lambda x: x[0])] for b in bundles if b]


def _run_bundles(bundles: Iterable[list[Item]]) -> list[tuple[int, TaskResult | TaskFailed]]:
    """run_cycle's Spark partition: its bundles' tasks, one after another."""
    return [(item[0], _run_item(item, on_spark=True)) for items in bundles for item in items]


def _run_item(item: Item, on_spark: bool) -> TaskResult | TaskFailed:
    _, context, index, task = item
    try:
        return run_task_tuple((context, index, task)) if on_spark else run_task(context, task, index)
    except Exception as e:  # this topic's cycle fails; the job's other topics go on
        return TaskFailed(index, f"{type(e).__name__}: {e}", traceback.format_exc())


def _by_topic(work: Sequence[Work], outcomes: Iterable[tuple[int, TaskResult | TaskFailed]]) -> list[list[TaskResult] | Exception]:
    results: list[list[TaskResult | TaskFailed]] = [[] for _ in work]
    for w, outcome in outcomes:
        results[w].append(outcome)
    out: list[list[TaskResult] | Exception] = []
    for (context, _), got in zip(work, results, strict=True):
        got.sort(key=lambda r: r.index)
        failed = [r for r in got if isinstance(r, TaskFailed)]
        if not failed:
            out.append(got)  # type: ignore[arg-type]
            continue
        _delete_written(context, [r for r in got if isinstance(r, TaskResult)])
        out.append(CycleTaskError(f"task {failed[0].index} of topic {context.topic!r} failed: {failed[0].error}\n{failed[0].trace}"))
    return out


def _delete_written(context: TaskContext, results: Sequence[TaskResult]) -> None:
    """The files of a failed topic's tasks that did finish: never committed, deleted at once."""
    paths = [written.path for result in results for written in result.files]
    if not paths:
        return
    from pyiceberg.io import load_file_io

    io = load_file_io(context.io_properties, context.data_location)
    for path in paths:
        _delete_quietly(io, path)


def run_tasks(spark: SparkSession, context: TaskContext, tasks: Sequence[Task]) -> list[TaskResult]:
    """One topic's tasks on Spark (run_cycle), one Spark task each; the results in task order.
    Raises the first failed task's error (CycleTaskError)."""
    return _one(run_cycle(spark, [(context, tasks)], len(tasks)))


def run_tasks_in_process(context: TaskContext, tasks: Sequence[Task], threads: int | None = None) -> list[TaskResult]:
    """One topic's tasks here (run_cycle_in_process), on `threads` threads (default: one a task).
    If one fails, the files of the others are deleted, then its error raised (CycleTaskError)."""
    return _one(run_cycle_in_process([(context, tasks)], threads or len(tasks)))


def _one(outcomes: list[list[TaskResult] | Exception]) -> list[TaskResult]:
    (outcome,) = outcomes
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


# -- reading ----------------------------------------------------------------------------------------


# Readers of this process that tasks run here read WAL objects through, by object-store URL: a
# compactor inside a node registers the node's (cache/reader.py: its recent objects, the zone's
# chunk cache), so a cycle that runs beside the brokers reads what they already hold (seed 003
# §4.3.3). Tasks on Spark executors (other processes) read the object store themselves.
_LOCAL_READERS: dict[str, tuple[Callable[[str, int, int], Awaitable[bytes]], asyncio.AbstractEventLoop]] = {}


def register_local_reader(url: str, read: Callable[[str, int, int], Awaitable[bytes]] | None, loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Tasks of this process read objects of `url` with `read(key, start, size)` run on `loop`
    (None: unregister)."""
    if read is None:
        _LOCAL_READERS.pop(url, None)
    else:
        assert loop is not None
        _LOCAL_READERS[url] = (read, loop)


async def _fetch(url: str, reads: Sequence[ObjectRead], into: list[bytes], fetched: Callable[[int], None]) -> None:
    """Each read's bytes into `into`, `fetched(i)` called as read i lands. Not returned: on the main
    thread asyncio.run ends by looking up its SIGINT handler, whose failed enum lookup formats the
    main task's repr, result included (a second per 24 MiB, CPython 3.11)."""
    local = _LOCAL_READERS.get(url)
    if local is not None:
        read, loop = local

        async def get_local(i: int, r: ObjectRead) -> None:
            data = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(read(r.object_key, r.start, r.end - r.start), loop))
            if len(data) != r.end - r.start:
                raise OSError(f"{r.object_key}: read [{r.start}, {r.end}) gave {len(data)} bytes")
            into[i] = bytes(data)
            fetched(i)

        await asyncio.gather(*(get_local(i, r) for i, r in enumerate(reads)))
        return
    store = load_object_store(url)
    limit = asyncio.Semaphore(READ_CONCURRENCY)

    async def get(i: int, read: ObjectRead) -> None:
        async with limit:
            data = await store.get(read.object_key, read.start, read.end)
        if len(data) != read.end - read.start:
            raise OSError(f"{read.object_key}: read [{read.start}, {read.end}) gave {len(data)} bytes")
        into[i] = data
        fetched(i)

    try:
        await asyncio.gather(*(get(i, r) for i, r in enumerate(reads)))
    finally:
        await store.close()


class _Ranges:
    """An index entry's bytes, sliced out of the task's reads (one read may hold many entries). The
    reads are fetched on a thread of their own, in order, while the rows of those already landed
    are decoded and written: a task does not wait for all of its bytes before it starts (a
    tenth of a second per 64 MiB from local files, more from S3)."""

    def __init__(self, url: str, reads: Sequence[ObjectRead]) -> None:
        self._data: list[bytes] = [b""] * len(reads)
        self._landed = [threading.Event() for _ in reads]
        self._failed: BaseException | None = None
        self._by_object: dict[str, list[tuple[int, ObjectRead]]] = {}
        for i, read in enumerate(reads):
            self._by_object.setdefault(read.object_key, []).append((i, read))
        self._views: dict[int, memoryview] = {}
        self._thread: threading.Thread | None = None
        if sum(r.end - r.start for r in reads) <= FETCH_FIRST_BYTES:  # a small topic's cycle: nothing to overlap
            self._fetch_all(url, reads)
            return
        self._thread = threading.Thread(target=self._fetch_all, args=(url, reads), name="compaction-fetch", daemon=True)
        self._thread.start()

    def _fetch_all(self, url: str, reads: Sequence[ObjectRead]) -> None:
        try:
            asyncio.run(_fetch(url, reads, self._data, lambda i: self._landed[i].set()))
        except BaseException as e:  # raised to the task at its next slice (or at close)
            self._failed = e
        finally:
            for landed in self._landed:
                landed.set()

    def slice(self, entry: IndexEntry) -> memoryview:
        end = entry.start + entry.size
        for i, read in self._by_object.get(entry.object_key, ()):
            if read.start <= entry.start and end <= read.end:
                return self._view(i)[entry.start - read.start : end - read.start]
        raise ValueError(f"no read of the task covers {entry.object_key} [{entry.start}, {end}) (offsets {entry.base_offset}-{entry.last_offset})")

    def _view(self, i: int) -> memoryview:
        view = self._views.get(i)
        if view is None:
            self._landed[i].wait()
            if self._failed is not None:
                raise self._failed
            view = self._views[i] = memoryview(self._data[i])
        return view

    def close(self) -> None:
        """Wait for the reads to end (a task that failed early must not leave them running)."""
        if self._thread is not None:
            self._thread.join()

    @property
    def bytes_read(self) -> int:
        if self._failed is not None:
            raise self._failed
        return sum(len(d) for d in self._data)


def _resolver(context: TaskContext) -> Resolver | None:
    """Schema id → WriterSchema from the context's map, each parsed on first use; an id not in the
    map is raw with a reason. None for a topic without a schema: its values are raw, no error."""
    if not context.schemas:
        return None
    parsed: dict[int, WriterSchema] = {}
    not_found = f"is not a version of subject {context.value_subject}"

    def resolve(schema_id: int) -> WriterSchema:
        writer = parsed.get(schema_id)
        if writer is None:
            known = context.schemas.get(schema_id)
            if known is None:
                writer = WriterSchema(schema_id, None, None, f"schema id {schema_id} {not_found}")
            else:
                writer = writer_schema(schema_id, known[0], "AVRO", known[1])
            parsed[schema_id] = writer
        return writer

    return resolve


# -- rows -------------------------------------------------------------------------------------------


def _entry_rows(partition: int, entry: IndexEntry, data: memoryview, first_offset: int, resolve: Resolver | None, aborted: Sequence[Aborted] = ()) -> Iterator[tuple[Any, str | None]]:
    """(row, outcome) for each record of one entry from `first_offset` on. A batch that does not
    decode is one MALFORMED row at its first offset holding its stored bytes; when its framing is
    broken (nothing after it can be found), the row holds the rest of the entry's bytes. For a
    topic without a schema (`resolve` None) a decoded batch comes whole instead, as
    ((kafka columns, its records from `first_offset`), None): the writer takes it as columns."""
    for item in _entry_batches(partition, entry, data, first_offset, aborted):
        if isinstance(item, dict):
            yield item, MALFORMED
        else:
            yield from _batch_rows(partition, *item, first_offset, resolve)


def _batch_rows(partition: int, view: memoryview, batch: Batch, first_offset: int, resolve: Resolver | None) -> Iterator[tuple[Any, str | None]]:
    """_entry_rows' rows of one batch whose framing and checksum are sound (`view` holds it).
    A batch whose records do not become rows, whatever the reason, is one MALFORMED row holding
    it as stored, never an error that stops the topic's compaction."""
    stored = view[batch.position : batch.position + batch.size]
    try:
        decode_records(view, batch)
        _check_offsets(batch)
        kafka = kafka_columns(partition, batch)
        records = [r for r in batch.records if r.offset >= first_offset]
        if resolve is None:
            rows: list[tuple[Any, str | None]] = []
            if records:
                rows.append(((kafka, records, lambda e: _malformed(partition, batch, stored, e)), None))
        else:
            rows = [translate(record, kafka, resolve) for record in records]
    except Exception as e:  # CorruptBatch, or anything a producer's bytes make the decoding raise
        yield _malformed(partition, batch, stored, e), MALFORMED
        return
    yield from rows


def _check_offsets(batch: Batch) -> None:
    """Raises CorruptBatch unless the batch's records' offsets rise within its own range (a record
    past its lastOffsetDelta would take an offset of the batch after it)."""
    last = batch.base_offset - 1
    for record in batch.records:
        if not last < record.offset <= batch.last_offset:
            raise CorruptBatch(batch.index, batch.position, batch.base_offset, f"record offset {record.offset} after {last}, outside {batch.base_offset}-{batch.last_offset}")
        last = record.offset


def _run_raw_rows(run: Run, ranges: _Ranges, schema: Any, values: ValueColumns | None = None) -> Iterator[tuple[Any, str | None]]:
    """_entry_rows' rows of every entry of `run`, except that consecutive batches whose records
    all decode (and, with `values`, whose values it reads) come as columns, ((RawRows, [(view,
    batch)]), RAW_ROWS), decoded at once (rows/columns.py, rows/avro_columns.py); the others as _entry_rows
    has them (with `values`' resolver)."""
    batches: list[tuple[memoryview, Batch]] = []
    payloads: list[Any] = []
    size = 0
    for entry in run.entries:
        for item in _entry_batches(run.partition, entry, ranges.slice(entry), run.first_offset, run.aborted):
            if isinstance(item, dict):
                yield from _decoded_rows(run.partition, batches, payloads, run.first_offset, schema, values)
                batches, payloads, size = [], [], 0
                yield item, MALFORMED
                continue
            view, batch = item
            payload = view[batch.position + BATCH_HEADER_SIZE : batch.position + batch.size]
            if batch.codec:
                try:
                    payload = decompress(batch.codec, payload)
                except Exception:  # as decode_records: the batch goes its way, which names the error
                    payload = None
            batches.append(item)
            payloads.append(payload)
            size += len(payload) if payload is not None else 0
            if size >= RAW_ROWS_BYTES:
                yield from _decoded_rows(run.partition, batches, payloads, run.first_offset, schema, values)
                batches, payloads, size = [], [], 0
    yield from _decoded_rows(run.partition, batches, payloads, run.first_offset, schema, values)


def _decoded_rows(partition: int, batches: list[tuple[memoryview, Batch]], payloads: list[Any], first_offset: int, schema: Any, values: ValueColumns | None) -> Iterator[tuple[Any, str | None]]:
    if not batches:
        return
    resolve = values.resolve if values is not None else None
    try:
        rows, taken, counts = decode_batches(partition, [b for _, b in batches], payloads, first_offset, schema, values_apart=values is not None)
        parents, part = [rows], [0 if t else -1 for t in taken]
        if values is not None:
            parents, part = values.read(rows, taken, counts)
    except Exception:  # batches the columns cannot take: each goes its own way, which names what fails
        parents, part, counts = [], [-1] * len(batches), [0] * len(batches)
    at = [0] * len(parents)  # each parent's next row
    i = 0
    while i < len(batches):
        k = part[i]
        if k < 0:
            yield from _batch_rows(partition, *batches[i], first_offset, resolve)
            i += 1
            continue
        j, n = i, 0  # the batches after it whose rows come next in the same parent
        while j < len(batches) and part[j] == k:
            n += counts[j]
            j += 1
        if n:
            whole = parents[k]
            yield ((whole if n == len(whole) else whole.slice(at[k], at[k] + n)), batches[i:j]), RAW_ROWS
        at[k] += n
        i = j


def _entry_batches(partition: int, entry: IndexEntry, data: memoryview, first_offset: int, aborted: Sequence[Aborted] = ()) -> Iterator[tuple[memoryview, Batch] | dict[str, Any]]:
    """Each batch of one entry holding offsets from `first_offset` on whose framing and checksum
    are sound, as (the view of the entry's bytes it is in, its header); one that fails them as its
    MALFORMED row instead (its framing broken: the row holds the rest of the entry's bytes).
    Control batches and the batches of `aborted` transactions are left out: never rows."""
    pos, base = 0, entry.base_offset
    while pos < len(data):
        view = data[pos:]
        try:
            for batch in iter_batches(view, base):
                if batch.last_offset >= first_offset and not (batch.attributes & _TRANSACTION_BITS and _not_a_row(batch, aborted)):
                    yield view, batch
            return
        except CorruptBatch as e:  # iter_batches: framing, magic or CRC
            batch, parsed = _header(view, e, entry)
            framed = batch.size > 0
            stored = view[e.position : e.position + batch.size] if framed else view[e.position :]
            if not framed:
                batch.last_offset_delta = entry.last_offset - batch.base_offset
            if batch.last_offset >= first_offset and not (parsed and batch.attributes & _TRANSACTION_BITS and _not_a_row(batch, aborted)):
                yield _malformed(partition, batch, stored, e, parsed)
            if not framed:
                return
            pos += e.position + batch.size
            base = batch.last_offset + 1


def _not_a_row(batch: Batch, aborted: Sequence[Aborted]) -> bool:
    """Whether `batch` (transactional or control) holds no row: a marker, or a batch of one of the
    producer's aborted transactions (its offsets within the transaction's)."""
    if batch.is_control:
        return True
    if not batch.is_transactional:
        return False
    pid, first, last = batch.producer_id, batch.base_offset, batch.last_offset
    return any(a[0] == pid and a[1] <= first and last <= a[2] for a in aborted)


def _header(view: memoryview, error: CorruptBatch, entry: IndexEntry) -> tuple[Batch, bool]:
    """The header of a batch iter_batches refused, and whether it parsed (a whole magic-2 header).
    Its size is 0 when its framing is broken; what does not parse is -1, its timestamps the entry's
    max."""
    at = error.position
    fields = BATCH_HEADER.unpack_from(view, at) if len(view) - at >= BATCH_HEADER_SIZE else None  # a batch rows/records.py refused
    if fields is None or fields[3] != 2:
        magic = view[at + 16] if len(view) - at > 16 else -1
        return Batch(error.index, at, 0, error.base_offset, SERVED_LEADER_EPOCH, magic, 0, 0, entry.max_timestamp, entry.max_timestamp, -1, -1, -1, -1), False
    (_, batch_length, _, magic, _, attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, record_count) = fields
    size = LOG_OVERHEAD + batch_length
    # A CRC failure with sound framing: the batch can be stepped over (by its own lastOffsetDelta,
    # as a fetch of it would assign offsets) when that stays inside the entry.
    sound = BATCH_HEADER_SIZE <= size <= len(view) - at and 0 <= last_offset_delta <= entry.last_offset - error.base_offset
    batch = Batch(
        error.index, at, size if sound else 0, error.base_offset, SERVED_LEADER_EPOCH, magic, attributes, last_offset_delta,
        _ms(base_timestamp, entry.max_timestamp), _ms(max_timestamp, entry.max_timestamp), producer_id, producer_epoch, base_sequence, record_count,
    )  # fmt: skip
    return batch, True


def _ms(timestamp: int, fallback: int) -> int:
    # A header's timestamps are trusted for a row only within Iceberg's years 1-9999 (a batch
    # failing its CRC may carry anything there); otherwise the entry's max timestamp stands in.
    return timestamp if MIN_MS <= timestamp <= MAX_MS else fallback


def _malformed(partition: int, batch: Batch, stored: memoryview, error: Exception, parsed: bool = True) -> dict[str, Any]:
    """The row of a batch whose records are not rows: its bytes as stored, at its last offset (so
    that a read of any of its offsets finds it). One whose framing is sound (`batch.size`) is
    served back as it is (stored_batch)."""
    kafka = kafka_columns(partition, batch)
    kafka[OFFSET] = batch.last_offset
    kafka[TIMESTAMP] = clamp_ms(_ms(batch.base_timestamp, batch.max_timestamp)) * 1000
    kafka[STORED_BATCH] = batch.size > 0 and parsed
    if not parsed:
        kafka[BATCH_COMPRESSION] = "unknown"
    return {
        KAFKA: kafka,
        HEADERS: [],
        KEY_RAW: None,
        VALUE: None,
        VALUE_RAW: bytes(stored),
        VALUE_SCHEMA_ID: None,
        VALUE_ERROR: f"batch does not decode: {error}" if isinstance(error, CorruptBatch) else f"batch does not become rows: {type(error).__name__}: {error}",
    }


# -- files ------------------------------------------------------------------------------------------


class _RecordingIO:
    """A FileIO that remembers what it created, so a failed task deletes exactly its own files."""

    def __init__(self, io: FileIO) -> None:
        self._io = io
        self.created: list[str] = []

    def new_output(self, location: str) -> Any:
        self.created.append(location)
        return self._io.new_output(location)

    def delete_created(self) -> None:
        for location in self.created:
            _delete_quietly(self._io, location)


def _delete_quietly(io: FileIO, location: str) -> None:
    try:
        io.delete(location)
    except (FileNotFoundError, OSError):  # never created, or already gone: the error being raised matters more
        pass


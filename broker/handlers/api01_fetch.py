"""Fetch (key 1), v4-v17; v13+ names topics by id.

For each partition the offset index gives the entries from the fetch offset on; their bytes come
from the recent-objects cache or the object store, batches wholly before the fetch offset are cut
off, and each batch's base offset is injected on the way out. Limits follow Kafka: the first batch
of the response is returned even if it exceeds max_bytes / partition_max_bytes (KIP-74), the rest
must fit; once max_bytes runs out inside a partition, the partitions after it are not read. With
fewer than min_bytes available the request sleeps until a commit touches one of its partitions or
max_wait passes (long poll); min_bytes 0 is answered at once. Sessions (KIP-227) are not kept:
every response is full and session_id is 0, which clients accept (broker/fetch_response.py writes
such responses of many partitions).

Isolation: read_uncommitted reads up to the high watermark. read_committed (isolation_level 1)
stops at the partition's last stable offset: no batch at or past it is returned (an entry that
straddles it is cut at its batch there, where the oldest open transaction starts), and an offset
from it up to the high watermark has no records yet, without error. Its partitions list the
aborted transactions their records meet (`_aborted_in`), for the client to skip those batches.
Every response carries the real last stable offset.

Errors, per partition; the request's other partitions are served as usual:
- OFFSET_OUT_OF_RANGE below the log start offset, and beyond the high watermark once the store
  confirms it. Clients reset on it (auto.offset.reset), so it is answered only when the offset
  is known not to be there: a view's log start offset never moves back, so it can only lag
  behind the real one, and an offset below it is below the real one too; but a view's high
  watermark may lag behind a commit another broker made durable and handed to the consumer
  (the etcd view's watch delivers a commit a moment after it is durable, or not at all while it
  is broken). So beyond the view's high watermark, when the answer is about to be sent (after
  the long poll, which serves the records if the view catches up within max_wait), the store's
  durable high watermarks are read (`MetadataStore.durable_high_watermarks`: the etcd store
  reads the heads, one request for all such partitions of the response; the embedded store's
  view is always current): an offset beyond the durable one is OFFSET_OUT_OF_RANGE.
- OFFSET_NOT_AVAILABLE beyond the view's high watermark but not beyond the durable one (the view
  has not caught up), and wherever the store cannot say: a view that is not current (the etcd
  store's while its watch is broken and it reloads) is not asked, nor is an unreachable store.
  It is Kafka's code for a high watermark that has not caught up (OffsetNotAvailableException),
  retriable: librdkafka and the Java client refresh metadata and fetch again after a backoff,
  by when the view has the records.
- KAFKA_STORAGE_ERROR when an object-store read fails (ObjectStoreError: the S3 backend turns its
  I/O failures and timeouts into it, after its retries). It is Kafka's own answer when a log
  read fails (KafkaStorageException), retriable in Kafka, librdkafka (metadata refresh, fetch
  backoff) and the Java client, and what Produce answers when the object store fails. The
  records read before the failure, if any, are served instead, without an error; the client's
  next fetch starts at the failed read. A response with a failure is sent at once, not after
  the long poll (Kafka's delayed fetch completes on a storage error too), and the failures are
  logged (one line per response) and counted in neve_object_read_failures_total. Other
  exceptions are bugs, and still close the connection.
- TOPIC_AUTHORIZATION_FAILED for a topic the principal may not READ, with ACLs
  (broker/authorization.py); a topic id no topic has is UNKNOWN_TOPIC_ID still."""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from metadata.model import ObjectType
from metadata.store import MetadataUnavailable
from wal.batch import inject_offsets, iter_headers
from wal.store import ObjectStoreError

from ..authorization import READ, TOPIC, allowed_names
from ..codec import has_field
from ..fetch_response import FIRST_BY_ID, FetchAnswer
from ..metrics import FETCH_BYTES, FETCH_READ_FAILURES
from ..registry import handles

NONE, OUT_OF_RANGE = int(ErrorCode.none), int(ErrorCode.offset_out_of_range)
NOT_AVAILABLE, STORAGE_ERROR = int(ErrorCode.offset_not_available), int(ErrorCode.kafka_storage_error)
UNKNOWN_TOPIC_ID, UNKNOWN_TOPIC_OR_PARTITION = int(ErrorCode.unknown_topic_id), int(ErrorCode.unknown_topic_or_partition)
TOPIC_AUTHORIZATION_FAILED = int(ErrorCode.topic_authorization_failed)
ENTRIES_PER_PARTITION = 32  # index entries looked up per partition and fetch
NO_END = 2**63  # read_range's end offset when the fetch may read up to the high watermark

log = logging.getLogger("neve.broker.fetch")


async def read_range(services, entry, fetch_offset: int, byte_budget: int, first: bool, prefetched=None, source=None, end_offset: int = NO_END) -> tuple[bytes | bytearray | None, bool]:
    """Stored batches of one index entry from the batch holding `fetch_offset`, within
    `byte_budget` bytes (at least one batch when `first`), with offsets injected; and whether the
    entry was read to its end (if not, nothing after it may be added, or offsets would skip).
    Batches from `end_offset` on are left out (a read_committed fetch's last stable offset, where
    a batch starts: the first batch of the oldest open transaction); the entry then counts as read
    to its end, the caller reading no entry past it.
    `prefetched` holds entries' bytes already read, by (object key, start, size). `source` is the
    (topic info, partition) the entry is of: a compacted entry's batches are rebuilt from the
    table's rows (table/serve.py). Raises ObjectStoreError when the object store fails the read."""
    if entry.object_type == ObjectType.PARQUET and services.compacted is not None and source is not None:
        info, partition = source
        compression = info.configs.get("compression.type", "producer")
        return await services.compacted.read(info.topic_id, partition, entry, fetch_offset, byte_budget, first, compression)
    data = prefetched.get((entry.object_key, entry.start, entry.size)) if prefetched else None
    if data is None:
        data = await services.reader.read(entry.object_key, entry.start, entry.size)
    base = entry.base_offset
    cut_start = None
    cut_end = 0
    first_base = base
    complete = True
    for h in iter_headers(data):
        if base >= end_offset:
            break
        last = base + h.last_offset_delta
        if last >= fetch_offset:
            if cut_start is None:
                cut_start, first_base = h.position, base
            if h.position + h.size - cut_start > byte_budget and not (first and cut_end == 0):
                complete = False
                break
            cut_end = h.position + h.size
        base = last + 1
    if cut_start is None or cut_end <= cut_start:
        return None, complete
    # inject_offsets' copy is handed on as it is (nothing changes it after): the response
    # writes it to the socket without copying it again (broker/codec.py, FramePieces)
    return inject_offsets(memoryview(data)[cut_start:cut_end], first_base), complete


def _resolve(services, version, topic):
    store = services.metadata
    if has_field(topic, "topic_id"):
        return store.topic_by_id(topic.topic_id)
    return store.topics().get(topic.topic)


@handles(1, "Fetch", 4, 17)
async def fetch(ctx, request):
    s = ctx.services
    store = s.metadata
    by_id = ctx.api_version >= FIRST_BY_ID
    unknown_topic = UNKNOWN_TOPIC_ID if by_id else UNKNOWN_TOPIC_OR_PARTITION
    deadline = time.monotonic() + max(request.max_wait.total_seconds(), 0)
    max_bytes = min(request.max_bytes if request.max_bytes > 0 else s.settings.fetch_max_bytes, s.settings.fetch_max_bytes)
    refused = _unreadable(ctx, request) if s.authorizer is not None else None  # positions of topics refused
    watched = []
    for ti, topic in enumerate(request.topics):
        info = None if refused and ti in refused else _resolve(s, ctx.api_version, topic)
        if info is not None:
            watched.append((info.topic_id, frozenset(p.partition for p in topic.partitions)))

    read_committed = request.isolation_level == 1
    # The fetch_past_lso plant (a deliberate bug, test only: [faults] fetch_past_lso): a
    # read_committed fetch read to the high watermark, which its answer names as the last stable
    # offset too, with no aborted transactions listed (answered as read_committed all the same).
    past_lso = read_committed and s.faults.fetch_past_lso
    bounded = read_committed and not past_lso  # stopped at the last stable offset, aborted ones listed
    while True:
        current = store.is_current()
        resolved = []
        for ti, topic in enumerate(request.topics):
            info = None if refused and ti in refused else _resolve(s, ctx.api_version, topic)
            resolved.append((topic, info, store.topic_views(info.topic_id) if info is not None else ()))
        # Every range the loop below will read, read at once: concurrently, and one GET for the
        # close ranges of one object (many partitions' slices of one WAL object).
        planned, ranges = _plan_reads(resolved, max_bytes, compacted=s.compacted, read_committed=bounded)
        if not planned and watched and request.min_bytes > 0:
            # Nothing to read yet: sleep before building an answer (10,000 partitions of a
            # tailing consumer take milliseconds to answer, and this one would be thrown away).
            remaining = deadline - time.monotonic()
            if remaining > 0:
                await store.wait_for_commit_in(watched, remaining)
                continue
        unread: dict = {}  # ranges the object store failed, with their errors: not read again
        prefetched = await s.reader.read_many(ranges, unread) if ranges else {}
        failures = []  # (topic, partition, fetch offset, object key, error)
        beyond = []  # (topic position, partition position, topic id, partition, fetch offset)
        aborted: dict = {}  # read_committed: by topic position and partition, those returned
        total = 0
        full = False
        topics_out = []
        for ti, (topic, info, views) in enumerate(resolved):
            parts_out = []
            if info is None:
                code = TOPIC_AUTHORIZATION_FAILED if refused and ti in refused else unknown_topic
                parts_out = [(p.partition, code, 0, 0, 0, b"") for p in topic.partitions]
            else:
                count, known = info.partitions, len(views)
                for pi, p in enumerate(topic.partitions):
                    index, fetch_offset = p.partition, p.fetch_offset
                    if not 0 <= index < count:
                        parts_out.append((index, unknown_topic, 0, 0, 0, b""))
                        continue
                    view = views[index] if index < known else None
                    hw, log_start = (view.next_offset, view.log_start_offset) if view is not None else (0, 0)
                    # The last stable offset is the high watermark until a partition first has a
                    # transaction (most never do; the view makes its transaction state then):
                    # testing for that state costs a sixth of the property's call, per partition
                    # of every fetch.
                    stable = hw if view is None or view.txn_starts is None or past_lso else view.last_stable_offset
                    end = stable if read_committed else hw  # where this fetch's records stop
                    records = None
                    if fetch_offset < log_start:
                        code = OUT_OF_RANGE
                    elif fetch_offset > hw:
                        # the rule and its reasons: the module docstring; a current view's answer
                        # waits for the store's word (`_beyond_the_view`)
                        code = NOT_AVAILABLE
                        if current:
                            beyond.append((len(topics_out), len(parts_out), info.topic_id, index, fetch_offset))
                    else:
                        # from the last stable offset to the high watermark, a read_committed fetch
                        # has nothing yet, and no error (the long poll waits for more)
                        code = NONE
                        if fetch_offset < end and not full:
                            plan = planned.get((info.topic_id, index))
                            if plan is None:
                                # Beyond the plan (it counts whole entries, so it may stop short of
                                # the byte budget), or readable only since it was made: plan and
                                # read the rest of the request the same way, not entry by entry.
                                more, more_ranges = _plan_reads(resolved, max_bytes - total, start=(ti, pi), compacted=s.compacted, read_committed=bounded)
                                planned.update(more)
                                if more_ranges:
                                    prefetched.update(await s.reader.read_many(more_ranges, unread))
                                plan = planned.get((info.topic_id, index))
                                if plan is None:
                                    plan = _plan_partition(view, fetch_offset, bounded, _read_end(view, bounded))
                            budget = min(p.partition_max_bytes, max_bytes - total)
                            # a read_committed fetch's records stop where they stopped when planned
                            records, cut, failed = await _partition_records(s, plan.entries, fetch_offset, budget, total == 0, prefetched, unread, (info, index), plan.end if bounded else NO_END)
                            if failed is not None:
                                failures.append((info.name, index, fetch_offset, *failed))
                                if records is None:
                                    code = STORAGE_ERROR
                            total += len(records) if records else 0
                            # The response's budget ran out within this partition: stop reading.
                            # Another partition's first batch might fit the bytes left, but finding
                            # out costs a read (a GET, for a backlog) per partition.
                            full = total >= max_bytes or (cut and budget < p.partition_max_bytes)
                            if bounded and records:
                                marks = _aborted_in(plan.aborted, records)
                                if marks:
                                    aborted.setdefault(len(topics_out), {})[index] = marks
                    # records empty, never null: some clients require bytes
                    parts_out.append((index, code, hw, stable, log_start, records or b""))
            topics_out.append((topic.topic_id if by_id else topic.topic, parts_out))
        remaining = deadline - time.monotonic()
        # min_bytes 0 (or less) asks for no data: answered at once, as Kafka does
        if total >= request.min_bytes or failures or remaining <= 0 or not watched:
            FETCH_BYTES.inc(total)
            if failures:
                _log_failures(failures)
            if beyond:
                await _beyond_the_view(store, beyond, topics_out)
            # aborted transactions: null for read_uncommitted, as Kafka answers
            return FetchAnswer(topics_out, read_committed=read_committed, aborted=aborted or None)
        await store.wait_for_commit_in(watched, remaining)


def _unreadable(ctx, request) -> set[int]:
    """The positions in the request of the topics the principal may not READ (a topic id no
    topic has is left to answer UNKNOWN_TOPIC_ID)."""
    names = []
    for topic in request.topics:
        if has_field(topic, "topic_id"):
            info = ctx.services.metadata.topic_by_id(topic.topic_id)
            names.append(info.name if info is not None else None)
        else:
            names.append(topic.topic)
    readable = allowed_names(ctx, READ, TOPIC, [n for n in names if n is not None])
    return {i for i, n in enumerate(names) if n is not None and n not in readable}


class _Plan(NamedTuple):
    """What a fetch serves of one partition, all taken from its view at one moment (no await in
    between): the index entries from the fetch offset, where the records stop, and for
    read_committed the aborted transactions whose markers are in the WAL. A compactor's swap
    between the entries and the aborted transactions would otherwise serve WAL bytes of an
    aborted transaction with no aborted entry for it (the swap drops those its table entry
    covers), and an abort between them would leave out the transaction whose records the later
    last stable offset lets through."""

    entries: list
    end: int
    aborted: tuple = ()


def _read_end(view, read_committed: bool) -> int:
    """Where a fetch's records stop: the high watermark, or for read_committed the last stable
    offset (the high watermark until the partition first has a transaction: the cheap test)."""
    return view.next_offset if not read_committed or view.txn_starts is None else view.last_stable_offset


def _plan_partition(view, fetch_offset: int, read_committed: bool, end: int) -> _Plan:
    """The partition's _Plan; `end` is `_read_end` taken at the same moment."""
    entries = view.from_offset(fetch_offset, ENTRIES_PER_PARTITION)
    return _Plan(entries, end, _aborted_candidates(view, fetch_offset, end) if read_committed else ())


def _plan_reads(resolved, max_bytes: int, start: tuple[int, int] = (0, 0), compacted=None, read_committed: bool = False):
    """For each readable partition of the fetch from `start` (topic and partition position in the
    request) on, the index entries from its fetch offset; and the (object key, start, size) of
    those the fetch loop will read, in its order and within its byte budgets (up to the last
    stable offset for `read_committed`). Whole entries are counted, so the ranges may stop before
    the loop does: the loop plans the rest again from where this plan stopped."""
    planned, ranges = {}, []
    total = 0
    first_topic, first_partition = start
    for ti in range(first_topic, len(resolved)):
        topic, info, views = resolved[ti]
        if info is None:
            continue
        count = min(info.partitions, len(views))
        partitions = topic.partitions if ti != first_topic or not first_partition else topic.partitions[first_partition:]
        for p in partitions:
            index, fetch_offset = p.partition, p.fetch_offset
            if not 0 <= index < count:
                continue
            view = views[index]
            if view is None:
                continue
            end = _read_end(view, read_committed)
            if not view.log_start_offset <= fetch_offset < end:
                continue
            if total >= max_bytes:
                return planned, ranges
            plan = planned[(info.topic_id, index)] = _plan_partition(view, fetch_offset, read_committed, end)
            budget = min(p.partition_max_bytes, max_bytes - total)
            used = 0
            for entry in plan.entries:
                if (used and used >= budget) or entry.base_offset >= end:
                    break
                if entry.object_type != ObjectType.PARQUET or compacted is None:  # rebuilt from rows, not read as bytes
                    ranges.append((entry.object_key, entry.start, entry.size))
                used += entry.size
            total += used
    return planned, ranges


async def _partition_records(s, entries, fetch_offset: int, budget: int, first: bool, prefetched, unread, source, end_offset: int = NO_END) -> tuple[bytes | bytearray | None, bool, tuple | None]:
    """The partition's records from `fetch_offset` within `budget` bytes and before
    `end_offset`, whether the budget cut them short (more of the entries were there to read), and
    the (object key, error) of an object-store read that failed (the records are then those read
    before it). `unread` holds the ranges whose read already failed in this request, with their
    errors."""
    if not entries:
        return None, False, None
    pieces = []
    used = 0
    for entry in entries:
        if entry.base_offset >= end_offset:
            break
        if used and used >= budget:
            return _joined(pieces), True, None
        error = unread.get((entry.object_key, entry.start, entry.size))
        if error is None:
            try:
                piece, complete = await read_range(s, entry, fetch_offset, budget - used, first and not pieces, prefetched, source, end_offset)
            except ObjectStoreError as e:
                error = e
        if error is not None:
            return _joined(pieces), False, (entry.object_key, error)
        if piece is not None:
            pieces.append(piece)
            used += len(piece)
        if not complete:
            return _joined(pieces), True, None
        if piece is None:
            break
    return _joined(pieces), False, None


def _aborted_candidates(view, fetch_offset: int, end: int) -> tuple:
    """The aborted transactions whose records meet [fetch_offset, end) and whose marker is at or
    after the fetch offset (as Kafka lists them), of those whose abort marker lies in a WAL entry.
    A partition without aborted transactions costs one call.

    The client skips a listed producer's batches from the first offset until it reads that
    producer's abort marker; in a range served from the table (compacted), aborted records and
    markers are gone, so a listed transaction whose marker was compacted away would hide the
    producer's later committed batches for good. A marker still in the WAL is served, at the
    latest by a later fetch."""
    candidates = view.aborted_between(fetch_offset, end - 1)
    if not candidates:
        return ()
    listed = []
    for a in candidates:
        holder = view.from_offset(a.last_offset, 1)
        if holder and holder[0].base_offset <= a.last_offset and holder[0].object_type == ObjectType.WAL:
            listed.append(a)
    return tuple(listed)


def _aborted_in(candidates: tuple, records) -> list[tuple[int, int]]:
    """(producer id, first offset) of the `candidates` (_aborted_candidates, planned with the
    entries the records came from) that a read_committed client must know of to skip the aborted
    batches among `records`: those whose records meet the returned range."""
    if not candidates:
        return []
    for h in iter_headers(records):
        last = h.base_offset + h.last_offset_delta  # offsets were injected: the real ones
    return [(a.producer_id, a.first_offset) for a in candidates if a.first_offset <= last]


async def _beyond_the_view(store, beyond: list, topics_out: list) -> None:
    """Partitions asked beyond a current view's high watermark answer OFFSET_OUT_OF_RANGE where
    the store's durable high watermark confirms the offset is beyond it too, and keep
    OFFSET_NOT_AVAILABLE where the view lags behind it or the store cannot be read."""
    try:
        durable = await store.durable_high_watermarks({(tid, index) for _, _, tid, index, _ in beyond})
    except MetadataUnavailable as e:
        log.info("fetch_durable_high_watermark_unread", extra={"partitions": len(beyond), "error": str(e)})
        return
    for ti, pi, tid, index, fetch_offset in beyond:
        hw = durable.get((tid, index))
        if hw is not None and fetch_offset > hw:
            parts = topics_out[ti][1]
            parts[pi] = (parts[pi][0], OUT_OF_RANGE, *parts[pi][2:])


def _log_failures(failures: list) -> None:
    """One line per response, however many partitions failed: in an outage every partition of
    every consumer fails, and the reader has logged each failed GET already."""
    FETCH_READ_FAILURES.inc(len(failures))
    topic, partition, offset, key, error = failures[0]
    log.warning(
        "fetch_read_failed",
        extra={"partitions": len(failures), "topic": topic, "partition": partition, "offset": offset, "object": key, "error": repr(error)},
    )


def _joined(pieces: list) -> bytes | bytearray | None:
    if not pieces:
        return None
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)

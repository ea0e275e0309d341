"""FetchResponses of many partitions, written without an entity per partition.

librdkafka keeps no fetch session (KIP-227): every Fetch names every partition the consumer reads
from this broker, and every response must answer each of them, most with no records. At 10,000
partitions kio took 3.2 µs to build a partition's entity and 6.7 to encode it (its writer opens a
buffer for the tagged fields of each): 100 ms of the event loop per response. The Fetch handler
answers with a `FetchAnswer` instead, plain tuples, and `FetchAnswer.frame` writes each partition
with one precompiled struct (kio's own writers for the names, lengths and records). The bytes
equal kio's encoding of `FetchAnswer.entity` in every version (tests/broker/test_fetch_response_encoding.py;
with aborted transactions, tests/broker/test_read_committed.py).
Aborted transactions are null for read_uncommitted and a list for read_committed: empty but for
the few partitions named in `FetchAnswer.aborted`. The fields neve never sets are written as their
defaults: no throttling, no preferred read replica (-1), and no tagged fields (diverging epoch,
current leader, snapshot id, node endpoints)."""

from __future__ import annotations

import functools
import io
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode
from kio.serial import writers

from .codec import NO_THROTTLE, FramePieces, OwnFrame, build, response_module

FIRST_FLEXIBLE = 12  # Fetch v12 is the first with compact arrays and tagged fields
FIRST_BY_ID = 13  # topics named by id from v13

# (partition index, error code, high watermark, last stable offset, log start offset, records)
Partition = tuple[int, int, int, int, int, "bytes | bytearray | memoryview | None"]
# by topic position in the answer, then partition index: (producer id, first offset) of each
# aborted transaction a read_committed partition returns (most have none, and are not named)
Aborted = dict[int, dict[int, list[tuple[int, int]]]]


@dataclass(slots=True)
class FetchAnswer(OwnFrame):
    """A FetchResponse: per topic, its name (before v13) or id and its partitions' values."""

    topics: list[tuple[str | uuid.UUID, list[Partition]]]
    read_committed: bool = False
    error_code: int = 0
    session_id: int = 0
    aborted: Aborted | None = None  # read_committed only

    def frame(self, version: int, correlation_id: int) -> list[bytes | bytearray]:
        layout = _layout(version, self.read_committed)
        flexible = version >= FIRST_FLEXIBLE
        out = FramePieces()
        write = out.write
        write(layout.head(correlation_id, self.error_code, self.session_id))
        array_length = writers.write_compact_array_length if flexible else writers.write_legacy_array_length
        write_key = writers.write_uuid if version >= FIRST_BY_ID else (writers.write_compact_string if flexible else writers.write_legacy_string)
        pack, tail, empty_tail, write_records = layout.pack, layout.tail, layout.empty_tail, layout.write_records
        aborted = self.aborted
        array_length(out, len(self.topics))
        for ti, (key, partitions) in enumerate(self.topics):
            write_key(out, key)
            array_length(out, len(partitions))
            marked = aborted.get(ti) if aborted else None
            # Runs of partitions without records are joined before they are written: one write
            # for thousands of them.
            run = []
            for index, code, high_watermark, last_stable, log_start, records in partitions:
                if marked is not None and index in marked:
                    run.append(pack(index, code, high_watermark, last_stable, log_start) + _aborted_array(version, marked[index]) + layout.replica)
                    write(b"".join(run))
                    run.clear()
                    write_records(out, records)
                    if flexible:
                        run.append(b"\x00")
                    continue
                if records is not None and not records:
                    run.append(pack(index, code, high_watermark, last_stable, log_start) + empty_tail)
                    continue
                run.append(pack(index, code, high_watermark, last_stable, log_start) + tail)
                write(b"".join(run))
                run.clear()
                write_records(out, records)
                if flexible:
                    run.append(b"\x00")  # the partition's tagged fields: none
            if flexible:
                run.append(b"\x00")  # the topic's tagged fields
            write(b"".join(run))
        if flexible:
            write(b"\x00")  # the response's tagged fields
        return out.pieces()

    def entity(self, version: int):
        """The same response as kio's entities (what `frame` must equal, byte for byte)."""
        r = response_module(1, version)
        by_id = version >= FIRST_BY_ID
        topics = []
        for ti, (key, partitions) in enumerate(self.topics):
            marked = (self.aborted or {}).get(ti, {})
            parts = tuple(
                build(
                    r.PartitionData,
                    partition_index=index,
                    error_code=ErrorCode(code),
                    high_watermark=high_watermark,
                    last_stable_offset=last_stable,
                    log_start_offset=log_start,
                    aborted_transactions=tuple(build(r.AbortedTransaction, producer_id=pid, first_offset=first) for pid, first in marked.get(index, ())) if self.read_committed else None,
                    preferred_read_replica=-1,
                    records=records,
                )
                for index, code, high_watermark, last_stable, log_start, records in partitions
            )
            topics.append(build(r.FetchableTopicResponse, partitions=parts, **({"topic_id": key} if by_id else {"topic": key})))
        return build(r.FetchResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode(self.error_code), session_id=self.session_id, responses=tuple(topics))


@dataclass(frozen=True)
class _Layout:
    head: Callable[[int, int, int], bytes]  # (correlation id, error code, session id): header and the body's fixed fields
    pack: Callable[[int, int, int, int, int], bytes]  # a partition's fixed fields up to its aborted transactions
    tail: bytes  # the fields between those and the records, all constant
    replica: bytes  # the end of `tail` after the aborted transactions
    empty_tail: bytes  # and empty records with the partition's end
    write_records: Callable


@functools.cache
def _layout(version: int, read_committed: bool) -> _Layout:
    """One version's fixed fields, after the Fetch schemas: FetchResponse v4-v17 (v12 flexible)."""
    flexible = version >= FIRST_FLEXIBLE
    if response_module(1, version).FetchResponse.__flexible__ is not flexible:
        raise AssertionError(f"Fetch v{version}: flexible versions are not where the schemas put them")
    # the response header (correlation id, and its tagged fields when flexible); throttle time,
    # then error code and session id from v7
    head_struct = struct.Struct(">i" + ("B" if flexible else "") + "i" + ("hi" if version >= 7 else ""))
    if version >= 7:
        head = (lambda c, e, s: head_struct.pack(c, 0, 0, e, s)) if flexible else (lambda c, e, s: head_struct.pack(c, 0, e, s))
    else:
        head = lambda c, e, s: head_struct.pack(c, 0)  # noqa: E731
    # partition index, error code, high watermark, last stable offset, log start offset (v5+)
    if version >= 5:
        pack = struct.Struct(">ihqqq").pack
    else:
        four = struct.Struct(">ihqq").pack
        pack = lambda i, c, h, log_start, _s: four(i, c, h, log_start)  # noqa: E731
    # aborted transactions: an empty array for read_committed, else null
    if flexible:
        tail = struct.pack(">B", 1 if read_committed else 0)
    else:
        tail = struct.pack(">i", 0 if read_committed else -1)
    replica = struct.pack(">i", -1) if version >= 11 else b""  # preferred read replica: none
    tail += replica
    empty_tail = tail + (b"\x01\x00" if flexible else struct.pack(">i", 0))  # zero-length records (compact: 0 + 1); no tagged fields
    write_records = writers.write_nullable_compact_string if flexible else writers.write_nullable_legacy_bytes
    return _Layout(head, pack, tail, replica, empty_tail, write_records)


_ABORTED = struct.Struct(">qq")  # producer id, first offset


def _aborted_array(version: int, aborted: list[tuple[int, int]]) -> bytes:
    """A read_committed partition's aborted transactions (rare: built per partition)."""
    if version >= FIRST_FLEXIBLE:
        out = io.BytesIO()
        writers.write_unsigned_varint(out, len(aborted) + 1)
        for producer_id, first_offset in aborted:
            out.write(_ABORTED.pack(producer_id, first_offset) + b"\x00")  # no tagged fields
        return out.getvalue()
    return struct.pack(">i", len(aborted)) + b"".join(_ABORTED.pack(p, f) for p, f in aborted)

"""Transaction markers: the control batch that ends a producer's transaction on one partition,
written through the WAL like any produced batch, so it takes an offset in the partition's order
(readers see the transaction end exactly there) and the sequencer closes the transaction with it.

A marker is what Kafka's partition leader appends on WriteTxnMarkers: a v2 batch with the
transactional and control bits, the producer's id and epoch, no sequence, and one control record
whose key is (version 0, type: 0 abort, 1 commit) and whose value is (version 0, coordinator
epoch)."""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import Iterable

from kio.schema.errors import ErrorCode

from metadata.model import ABORT_MARKER, COMMIT_MARKER
from wal.batch import RecordsSummary
from wal.batch_builder import build_batch
from wal.format import Chunk

_KEY = struct.Struct(">hh")  # version, type
_VALUE = struct.Struct(">hi")  # version, coordinator epoch


class MarkersNotWritten(Exception):
    """Some marker could not be stored (the object store or the metadata store failed): the
    transaction stays decided but not complete, and is completed again later."""


def marker_batch(producer_id: int, producer_epoch: int, kind: int, timestamp_ms: int, coordinator_epoch: int = 0) -> bytes:
    record = (0, timestamp_ms, _KEY.pack(0, kind), _VALUE.pack(0, coordinator_epoch), ())
    return build_batch([record], producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=-1, is_transactional=True, is_control=True)


async def write_markers(wal, partitions: Iterable[tuple[uuid.UUID, int]], producer_id: int, producer_epoch: int, commit: bool, generation: int, within_s: float | None = None, first_offset: int | None = None) -> None:
    """Store the marker ending the producer's transaction `generation` (-1: whichever is open;
    `first_offset`, if given: only the open one that starts there) on each partition; returns
    once every one is stored, or found late (its transaction ended there already: it changes
    nothing). A partition whose topic is gone needs none; one where a
    newer epoch of the producer already wrote has had its transaction ended by that epoch's marker. Raises
    MarkersNotWritten if any other marker failed (those that were stored stay: a marker written
    twice ends nothing the first did not). `within_s`: the WAL object holding them is sealed at
    most this long from now (`WalWriter.submit`), whatever the linger of produced records."""
    kind = COMMIT_MARKER if commit else ABORT_MARKER
    now = int(time.time() * 1000)
    data = marker_batch(producer_id, producer_epoch, kind, now)
    summary = RecordsSummary(1, 1, now, now, producer_id, producer_epoch, -1, True, 0, kind, txn_guard=first_offset, txn_generation=generation)
    futures = []
    try:
        for topic_id, partition in partitions:
            futures.append(wal.submit(Chunk(topic_id, partition, data, 1, 1, now), summary, within_s))
    except Exception as e:
        for fut in futures:
            fut.cancel()
        raise MarkersNotWritten(f"the WAL refused a marker: {e}") from e
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    failed = [o for o in outcomes if isinstance(o, BaseException) or o.error_code not in (ErrorCode.none, ErrorCode.invalid_producer_epoch, ErrorCode.unknown_topic_or_partition, ErrorCode.unknown_topic_id)]
    if failed:
        raise MarkersNotWritten(f"{len(failed)} of {len(futures)} markers not stored: {failed[0]!r}")

"""The offsets a compacted topic's Kafka readers skip: the records its table's rows no longer hold.

A compacted topic's cycle deletes from the table the rows its records supersede (older records of
the same key) and its keys' tombstones (upsert.py in the compactor). Kafka readers of the compacted
range skip the superseded records at once, and a tombstone once `delete.retention.ms` has passed
since the cycle (until then it is served, as Kafka's log cleaner keeps it). Each cycle writes the
offsets it removes, with the time each stops being served, to one removal object (an Arrow IPC
file, rows sorted by partition then offset); a manifest's part names its rows of such objects
(wal.manifest.Removal), and a reader applies them to the rows it reads (`Removed`).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa

PARTITION, OFFSET, HIDDEN_FROM = "partition", "offset", "hidden_from_ms"
SCHEMA = pa.schema([(PARTITION, pa.int32()), (OFFSET, pa.int64()), (HIDDEN_FROM, pa.int64())])


def encode(removed: Mapping[int, tuple[np.ndarray, np.ndarray]]) -> tuple[bytes, dict[int, tuple[int, int]]]:
    """One removal object of `removed` (partition → (offsets, the ms from which each is hidden)):
    its bytes, and each partition's (first row, rows) in it."""
    rows: dict[int, tuple[int, int]] = {}
    columns: list[list[np.ndarray]] = [[], [], []]
    at = 0
    for p in sorted(removed):
        offsets, hidden = removed[p]
        order = np.argsort(offsets, kind="stable")
        n = len(order)
        columns[0].append(np.full(n, p, dtype=np.int32))
        columns[1].append(np.asarray(offsets, dtype=np.int64)[order])
        columns[2].append(np.asarray(hidden, dtype=np.int64)[order])
        rows[p] = (at, n)
        at += n
    arrays = [pa.array(np.concatenate(c) if c else np.empty(0, dtype=t.to_pandas_dtype())) for c, t in zip(columns, SCHEMA.types, strict=True)]
    sink = io.BytesIO()
    # sorted offsets compress well (zstd: about a fifth of their 20 bytes a row raw)
    with pa.ipc.new_file(sink, SCHEMA, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(pa.Table.from_arrays(arrays, schema=SCHEMA))
    return sink.getvalue(), rows


def decode(data: bytes | memoryview) -> pa.Table:
    """A removal object's rows (raises pa.ArrowInvalid for bytes that are not one)."""
    table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
    if not table.schema.equals(SCHEMA):
        raise pa.ArrowInvalid(f"a removal object with columns {table.schema.names}")
    return table


class Removed:
    """The removed offsets of one partition: those hidden at once, and the tombstones hidden from a
    time on. Built from the removal objects' rows a manifest part names."""

    __slots__ = ("always", "nbytes", "timed", "timed_from")

    def __init__(self, pieces: Sequence[pa.Table]) -> None:
        offsets = np.concatenate([p.column(OFFSET).to_numpy() for p in pieces]) if pieces else np.empty(0, dtype=np.int64)
        hidden = np.concatenate([p.column(HIDDEN_FROM).to_numpy() for p in pieces]) if pieces else np.empty(0, dtype=np.int64)
        at_once = hidden <= 0
        self.always = np.unique(offsets[at_once])
        order = np.argsort(offsets[~at_once], kind="stable")
        self.timed, self.timed_from = offsets[~at_once][order], hidden[~at_once][order]
        self.nbytes = self.always.nbytes + self.timed.nbytes + self.timed_from.nbytes

    def __bool__(self) -> bool:
        return bool(len(self.always) or len(self.timed))

    def changes_after(self, now_ms: int) -> int | None:
        """The next time (ms) after `now_ms` from which more offsets are hidden (a tombstone's
        retention ends), None if none: rows read now are right until then."""
        later = self.timed_from[self.timed_from > now_ms]
        return int(later.min()) if len(later) else None

    def hidden(self, offsets: np.ndarray, now_ms: int) -> np.ndarray:
        """Which of `offsets` a reader skips at `now_ms` (a boolean mask)."""
        out = _members(self.always, offsets)
        if len(self.timed):
            due = self.timed[self.timed_from <= now_ms]
            if len(due):
                out |= _members(np.unique(due), offsets)
        return out


def _members(sorted_set: np.ndarray, values: np.ndarray) -> np.ndarray:
    if not len(sorted_set):
        return np.zeros(len(values), dtype=bool)
    at = np.searchsorted(sorted_set, values)
    at[at == len(sorted_set)] = 0
    return sorted_set[at] == values

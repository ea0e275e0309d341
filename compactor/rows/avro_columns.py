"""Confluent-framed Avro values decoded straight into the table's `value` column (Arrow), a writer
schema at a time: each field a numpy step over many values at once, no Python object a value.

Read here: records of primitives, enums, fixed, unions of null and one type, dates, timestamps
(local too), times of day, uuids, decimals (bytes, and fixed of up to 16), and arrays and maps of any
of them (nested too). A value is taken only when its bytes are the one encoding of what they decode
to (every varint and union index minimal, booleans 0 or 1, no NaN float, strings UTF-8, dates and
timestamps within Python's datetime, times of day within a day, uuids lowercase with hyphens,
decimals in fastavro's length and within their precision, arrays and maps in one block with no key
twice, nothing after the value): exactly the values whose re-encoding gives the produced bytes back,
which the translator keeps as columns alone and the writer can store so (tests/compactor/
test_avro_columns.py holds the two paths equal). Every other value (and one with more than MAX_ITEMS
items in an array or map) goes the translator's way, and so does every value of a schema holding a
type not read here (a union of two types, a primitive with another logical type)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.stride_tricks import sliding_window_view

from table.layout import VALUE, VALUE_ERROR, VALUE_RAW, VALUE_SCHEMA_ID

from .columns import RawRows, ValueSpans, _binary, _varints
from .translator import Resolver

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# Python's datetime and date hold years 1-9999 (fastavro's decoding raises outside them): day numbers
# since the epoch of 0001-01-01 and 9999-12-31, and the microseconds of the same span.
_MIN_DAY, _MAX_DAY = -719_162, 2_932_896
_MIN_MICROS, _MAX_MICROS = _MIN_DAY * 86_400_000_000, (_MAX_DAY + 1) * 86_400_000_000 - 1
# An array or map of more items is not taken (its batch goes record by record): reading item k of
# every value that has one is a numpy step of its own, so one odd value must not cost thousands.
# Measured: an array of ints and a map of doubles in one value of 10,000 cost 0.06-0.07 ms an
# item each over the others' 6.5 ms; a batch of 200 values record by record costs about 5 ms.
MAX_ITEMS = 128
# Item steps one read makes at most, all arrays and maps together (a nested one makes its steps
# again at each step of the one around it): the values that would need more are not taken. At
# 0.03-0.07 ms a step, a read spends about 0.1 s on them at most.
MAX_STEPS = 2048
_PAIRWISE_KEYS = 5  # maps of at most this many items have their keys compared pair by pair, not sorted
_PAD = 16  # bytes after the values: the longest read past a value's end is a varint's 10, a double's 8
_FRAME = 5  # Confluent's framing: a zero byte, then the schema id (4 bytes, big-endian)


@dataclass(frozen=True, slots=True)
class _Leaf:
    kind: str  # a primitive's name (boolean ... bytes) or a logical type's (date, uuid, timestamp-millis ...)


@dataclass(frozen=True, slots=True)
class _Enum:
    symbols: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Fixed:
    size: int
    uuid: bool = False  # a fixed of 16 with logicalType uuid: its bytes are the uuid column's


@dataclass(frozen=True, slots=True)
class _Nullable:
    null_index: int  # the null branch's index in the union (0 or 1)
    inner: Any


@dataclass(frozen=True, slots=True)
class _Record:
    fields: tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class _Decimal:
    precision: int
    scale: int
    size: int | None  # a fixed's; None: bytes, their length before them


@dataclass(frozen=True, slots=True)
class _Array:
    items: Any


@dataclass(frozen=True, slots=True)
class _Map:
    values: Any  # keys are strings


_LEAVES = {"boolean", "int", "long", "float", "double", "string", "bytes"}
_LOGICAL = {
    ("int", "date"), ("long", "timestamp-millis"), ("long", "timestamp-micros"), ("long", "local-timestamp-millis"),
    ("long", "local-timestamp-micros"), ("int", "time-millis"), ("long", "time-micros"), ("string", "uuid"),
}  # fmt: skip
# Times of day fastavro decodes (datetime.time: below 24 hours, not negative), and the column's
# microseconds a unit (avro_types keeps them as long microseconds since midnight).
_TIMES_OF_DAY = {"time-millis": (86_400_000, 1000), "time-micros": (86_400_000_000, 1)}
_UUID_HYPHENS = (8, 13, 18, 23)  # where str(uuid.UUID) puts them, the one form fastavro writes back


class ValueColumns:
    """The value columns of one task's rows (a table with a value column), read here where they can
    be; a schema id's plan made once."""

    def __init__(self, resolve: Resolver, arrow: pa.Schema) -> None:
        self.resolve = resolve
        self.value_type = arrow.field(VALUE).type
        self._plans: dict[int, _Record | None] = {}

    def read(self, rows: RawRows, taken: list[bool], counts: list[int]) -> tuple[list[RawRows], list[int]]:
        """columns.decode_batches' answer (rows of the taken batches, which batches, rows of each)
        with the values read into the value column, a schema id at a time (a batch's is its first
        framed value's; a batch of tombstones alone goes with the first batch's): (the rows read,
        one RawRows a schema id, each holding its batches' rows in order; each batch's index in
        that list, -1 for a batch to go the translator's way: one not taken, or holding a value
        not read here)."""
        part = [-1] * len(counts)
        batch_of = np.repeat(np.arange(len(counts)), counts)
        spans = value_spans(rows)
        framed = np.flatnonzero((spans.length >= _FRAME) & (spans.buf[np.minimum(spans.at, len(spans.buf) - 1)] == 0))
        if not framed.size:
            return [], part
        # each batch's schema id: its first framed value's (-1: none framed, the chunk's first then)
        ids = np.full(len(counts), -1, dtype=np.int64)
        batches, first = np.unique(batch_of[framed], return_index=True)
        ids[batches] = _framed_ids(spans.buf, spans.at[framed[first]])
        ids[ids < 0] = ids[batches[0]]
        ids[~np.array(taken, dtype=bool)] = -1
        parents: list[RawRows] = []
        for schema_id in dict.fromkeys(ids[ids >= 0].tolist()):
            record = self._plan(schema_id)
            if record is None:
                continue
            mine = ids == schema_id
            rows_mine = mine[batch_of]  # (batches not taken hold no rows here)
            chosen = None if rows_mine.all() else np.flatnonzero(rows_mine)
            subset = rows if chosen is None else rows.take(chosen)
            read = value_columns(subset, schema_id, record, self.value_type, spans if chosen is None else subset.values)
            if read is None:
                continue
            read_rows, ok = read
            subset_batch_of = batch_of if chosen is None else batch_of[chosen]
            mine[np.unique(subset_batch_of[~ok])] = False  # a batch with a value not read here
            if not ok.all():
                read_rows = read_rows.take(np.flatnonzero(mine[subset_batch_of]))
            if len(read_rows) or mine.any():
                for b in np.flatnonzero(mine).tolist():
                    part[b] = len(parents)
                parents.append(read_rows)
        return parents, part

    def _plan(self, schema_id: int) -> _Record | None:
        if schema_id not in self._plans:
            writer = self.resolve(schema_id)
            usable = writer is not None and writer.raw_reason is None and writer.layout is not None
            # A layout's fix (times of day as microseconds, uuids as bytes) the reader makes itself;
            # the one that drops unrepresentable fields never comes here.
            if usable and writer.layout.iceberg is not None and not writer.layout.unrepresentable:
                self._plans[schema_id] = plan(writer.parsed)
            else:
                self._plans[schema_id] = None
        return self._plans[schema_id]


def _framed_ids(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The schema id Confluent's framing at each of `at` names (its bytes 1-4, big-endian)."""
    return (sliding_window_view(buf, _FRAME)[at][:, 1:].astype(np.int64) << np.array([24, 16, 8, 0])).sum(axis=1)


def value_spans(rows: RawRows) -> ValueSpans:
    """Where each of `rows`' values is: as decode_batches left them (values_apart), or else its
    value_raw copied once into a padded buffer."""
    if rows.values is not None:
        return rows.values
    n = len(rows)
    raw = rows.rows.column(VALUE_RAW)
    if not pa.types.is_large_binary(raw.type):
        raw = raw.cast(pa.large_binary())
    offsets = np.frombuffer(raw.buffers()[1], dtype=np.int64, count=n + 1, offset=raw.offset * 8)
    first = int(offsets[0])
    size = int(offsets[-1]) - first
    buf = np.zeros(size + _PAD, dtype=np.uint8)  # padded: reads past a value's end stay inside
    if size:
        buf[:size] = np.frombuffer(raw.buffers()[2], dtype=np.uint8, count=size, offset=first)
    valid = raw.is_valid().to_numpy(zero_copy_only=False)
    return ValueSpans(buf, offsets[:-1] - first, np.where(valid, np.diff(offsets), -1))


def plan(parsed: Any) -> _Record | None:
    """How values of `parsed` (a fastavro-parsed writer schema) are read here; None when the
    schema is not a record or holds a type not read here."""
    names = parsed.get("__named_schemas", {}) if isinstance(parsed, dict) else {}
    try:
        node = _plan(parsed, names, ())
    except _Unsupported:
        return None
    return node if isinstance(node, _Record) else None


class _Unsupported(Exception):
    pass


def _plan(avro: Any, names: dict[str, Any], records: tuple[str, ...]) -> Any:
    if isinstance(avro, list):
        if len(avro) != 2 or "null" not in avro:
            raise _Unsupported
        null_index = avro.index("null")
        inner = _plan(avro[1 - null_index], names, records)
        if isinstance(inner, _Nullable):
            raise _Unsupported
        return _Nullable(null_index, inner)
    if isinstance(avro, str):
        if avro in _LEAVES:
            return _Leaf(avro)
        if avro in names and avro not in records:
            return _plan(names[avro], names, records)
        raise _Unsupported
    kind, logical = avro.get("type"), avro.get("logicalType")
    if kind == "record":
        name = avro.get("name")
        if name in records:
            raise _Unsupported
        fields = tuple((f["name"], _plan(f["type"], names, (*records, name))) for f in avro["fields"])
        if not fields:
            raise _Unsupported
        return _Record(fields)
    if logical is None and kind in _LEAVES:
        return _Leaf(kind)
    if kind == "enum":
        return _Enum(tuple(avro["symbols"]))
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale, size = avro.get("precision", 0), avro.get("scale", 0), avro.get("size")
        # 38 digits are Iceberg's most (avro_types leaves wider out); they fit 16 bytes, and a
        # longer fixed would need its leading bytes checked too
        if not 0 < precision <= 38 or (size is not None and size > 16):
            raise _Unsupported
        return _Decimal(precision, scale, size)
    if kind == "array":
        return _Array(_plan(avro["items"], names, records))
    if kind == "map":
        return _Map(_plan(avro["values"], names, records))
    if kind == "fixed" and logical in (None, "uuid"):  # fastavro keeps a uuid fixed's bytes; avro_types a 16's as uuid
        return _Fixed(avro["size"], uuid=logical == "uuid" and avro["size"] == 16)
    if (kind, logical) in _LOGICAL:
        return _Leaf(logical)
    raise _Unsupported


def value_columns(rows: RawRows, schema_id: int, record: _Record, value_type: pa.StructType, spans: ValueSpans | None = None) -> tuple[RawRows, np.ndarray] | None:
    """`rows` (columns.decode_batches'; their values where `spans` says, value_spans(rows) by
    default) with each value of schema `schema_id` read into `value_type` (the table's value
    column): (the rows as the translator makes them, COLUMNS or, for a null value, TOMBSTONE;
    whether each row was taken). Rows not taken keep whatever the arrays hold: only taken ones
    may be used. None when `value_type` cannot take the schema's fields (a field
    the table lacks)."""
    n = len(rows)
    spans = value_spans(rows) if spans is None else spans
    buf, start, length = spans.buf, spans.at, spans.length
    dead = length < 0  # tombstones: taken, their value columns all null
    end = start + np.maximum(length, 0)
    ok = length >= _FRAME
    at = np.minimum(start, len(buf) - _FRAME)
    ok &= (buf[at] == 0) & (_framed_ids(buf, at) == schema_id)
    reader = _Reader(buf, np.where(ok, start + _FRAME, end), end, pa.py_buffer(buf), ~ok)
    value = reader.record(record, None, value_type)
    if value is None:
        return None
    ok &= ~reader.bad & (reader.at == end)
    schema_ids = pa.array(np.full(n, schema_id, dtype=np.int32), mask=dead if dead.any() else None)
    if dead.any():
        value = pa.StructArray.from_arrays([value.field(i) for i in range(value.type.num_fields)], fields=list(value.type), mask=pa.array(dead))
    arrays = []
    for f in rows.rows.schema:
        if f.name == VALUE:
            arrays.append(value)
        elif f.name == VALUE_SCHEMA_ID:
            arrays.append(schema_ids.cast(f.type))
        elif f.name in (VALUE_RAW, VALUE_ERROR):
            arrays.append(pa.nulls(n, type=f.type))
        else:
            arrays.append(rows.rows.column(f.name))
    batch = pa.RecordBatch.from_arrays(arrays, schema=rows.rows.schema)
    return RawRows(batch, rows.offsets, rows.timestamps, int(dead.sum()), schema_id), ok | dead


class _Reader:
    """Reads one field after another of every value at once: `at` is each value's position, `bad`
    marks the values that are not taken. A `live` mask says which values hold the field being read
    (a union's null branch holds none); the others stay where they are."""

    def __init__(self, buf: np.ndarray, at: np.ndarray, end: np.ndarray, buffer: pa.Buffer, bad: np.ndarray, steps: list[int] | None = None) -> None:
        self.buf, self.at, self.end, self.buffer, self.bad = buf, at.astype(np.int64), end, buffer, bad
        self.steps = steps if steps is not None else [MAX_STEPS]  # item steps left, shared with the readers of items

    def _advance(self, after: np.ndarray, failed: np.ndarray | None, live: np.ndarray | None) -> None:
        if live is None:
            self.at = after
            if failed is not None:
                self.bad |= failed
        else:
            self.at = np.where(live, after, self.at)
            if failed is not None:
                self.bad |= failed & live
        over = self.at > self.end
        if over.any():
            self.bad |= over
            np.minimum(self.at, self.end, out=self.at)

    def fail(self, failed: np.ndarray, live: np.ndarray | None) -> None:
        """Marks bad the values `failed` names among the `live` ones."""
        self.bad |= failed if live is None else failed & live

    def varint(self, live: np.ndarray | None) -> np.ndarray:
        failed = np.zeros(len(self.at), dtype=bool)
        values, after = _varints(self.buf, self.at, failed)
        failed |= (after - self.at > 1) & (self.buf[after - 1] == 0)  # not minimal: re-encoding is shorter
        self._advance(after, failed, live)
        return values

    def fixed(self, size: int, live: np.ndarray | None) -> np.ndarray:
        """The `size` bytes at each position, a row a value (a value they overrun is marked bad)."""
        rows = self.window(self.at, size)
        self._advance(self.at + size, None, live)
        return rows

    def window(self, at: np.ndarray, size: int) -> np.ndarray:
        """The `size` bytes at each of `at`, a row a position; positions too near the buffer's end
        for them (past a value's end: padding is shorter than some fixed) read from further back."""
        buf = self.buf if len(self.buf) >= size else np.concatenate([self.buf, np.zeros(size - len(self.buf), dtype=np.uint8)])
        return np.ascontiguousarray(sliding_window_view(buf, size)[np.minimum(at, len(buf) - size)])

    def record(self, record: _Record, live: np.ndarray | None, arrow: pa.DataType) -> pa.Array | None:
        if not pa.types.is_struct(arrow):
            return None
        read: dict[str, pa.Array] = {}
        for name, node in record.fields:
            index = arrow.get_field_index(name)
            if index < 0:
                return None
            array = self.node(node, live, arrow.field(index).type)
            if array is None:
                return None
            read[name] = array
        n = len(self.at)
        children = [read[f.name] if f.name in read else pa.nulls(n, type=f.type) for f in arrow]
        mask = None if live is None else pa.array(~live)
        return pa.StructArray.from_arrays(children, fields=list(arrow), mask=mask)

    def node(self, node: Any, live: np.ndarray | None, arrow: pa.DataType) -> pa.Array | None:
        if isinstance(node, _Record):
            return self.record(node, live, arrow)
        if isinstance(node, _Array | _Map):
            return self.items(node, live, arrow)
        if isinstance(node, _Decimal):
            return self.decimal(node, live, arrow)
        if isinstance(node, _Nullable):
            index = self.varint(live)
            self.fail((index != 0) & (index != 1), live)
            present = index != node.null_index
            return self.node(node.inner, present if live is None else present & live, arrow)
        if isinstance(node, _Enum):
            index = self.varint(live)
            failed = (index < 0) | (index >= len(node.symbols))
            self.fail(failed, live)
            valid = ~failed if live is None else live & ~failed
            symbols = pa.array(node.symbols, type=pa.large_string())
            return _cast(symbols.take(pa.array(np.where(valid, index, 0), mask=~valid)), arrow)
        if isinstance(node, _Fixed):
            rows = self.fixed(node.size, live)
            validity = None if live is None else pa.py_buffer(np.packbits(live, bitorder="little"))
            array = pa.FixedSizeBinaryArray.from_buffers(pa.binary(node.size), len(rows), [validity, pa.py_buffer(rows)])
            return _cast(pa.ExtensionArray.from_storage(pa.uuid(), array) if node.uuid else array, arrow)
        return self.leaf(node.kind, live, arrow)

    def items(self, node: _Array | _Map, live: np.ndarray | None, arrow: pa.DataType) -> pa.Array | None:
        """An array or map: taken only as fastavro writes it, one block of all its items (its count
        then the items) and an empty block (0) after, or the empty block alone. Step k reads item k
        of every value with more than k items (a reader over those values alone); the items are then
        put in list order, each value's after one another."""
        if isinstance(node, _Array) != (pa.types.is_large_list(arrow) or pa.types.is_list(arrow)) or isinstance(node, _Map) != pa.types.is_map(arrow):
            return None
        count = self.varint(live)
        self.fail((count < 0) | (count > MAX_ITEMS), live)
        count = np.where(self.bad if live is None else self.bad | ~live, 0, count)
        n, steps, columns, k = len(count), [], [], 0
        while True:  # at least one step, so a type the table cannot take is found even with no items
            at = np.flatnonzero(count > k)
            if at.size and self.steps[0] <= 0:  # no steps left: the values with more items are not taken
                self.bad[at] = True
                count[at] = k
                at = at[:0]
            self.steps[0] -= bool(at.size)
            step = _Reader(self.buf, self.at[at], self.end[at], self.buffer, self.bad[at], self.steps)
            if isinstance(node, _Map):
                read = [step.leaf("string", None, arrow.key_type), step.node(node.values, None, arrow.item_type)]
            else:
                read = [step.node(node.items, None, arrow.value_type)]
            if any(r is None for r in read):
                return None
            self.at[at], self.bad[at] = step.at, step.bad
            steps.append(at)
            columns.append(read)
            k += 1
            if not at.size:
                break
        after = count > 0
        self.fail(self.varint(after) != 0, after)  # the empty block that ends them
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(count, out=offsets[1:])
        order = np.empty(int(offsets[-1]), dtype=np.int64)  # where each read item goes in list order
        order[np.concatenate([offsets[at] + k for k, at in enumerate(steps)])] = np.arange(len(order))
        placed = [pa.concat_arrays(list(parts)).take(order) for parts in zip(*columns, strict=True)]
        mask = None if live is None else pa.array(~live)
        if isinstance(node, _Array):
            lists = pa.LargeListArray if pa.types.is_large_list(arrow) else pa.ListArray
            return lists.from_arrays(pa.array(offsets if lists is pa.LargeListArray else offsets.astype(np.int32)), placed[0], type=arrow, mask=mask)
        keys, values = placed
        if len(steps) <= _PAIRWISE_KEYS + 1:  # the last step read none
            self._unique_keys_pairwise([c[0] for c in columns], steps)
        else:
            self._unique_keys(keys, count, offsets)
        return pa.MapArray.from_arrays(pa.array(offsets.astype(np.int32)), pc.fill_null(keys, ""), values, type=arrow, mask=mask)

    def _unique_keys_pairwise(self, keys: list[pa.Array], steps: list[np.ndarray]) -> None:
        """Marks bad the maps holding a key twice (see _unique_keys), comparing each value's key of
        step j with its key of each step before: few comparisons for small maps."""
        for j in range(1, len(steps)):
            for i in range(j):
                earlier = keys[i]
                if len(steps[i]) != len(steps[j]):  # the values of step j are fewer: find theirs
                    earlier = earlier.take(pa.array(np.searchsorted(steps[i], steps[j])))
                same = pc.equal(earlier, keys[j]).fill_null(False).to_numpy(zero_copy_only=False)
                self.bad[steps[j][same]] = True

    def _unique_keys(self, keys: pa.Array, count: np.ndarray, offsets: np.ndarray) -> None:
        """Marks bad the maps holding a key twice: fastavro decodes them to a dict of fewer items,
        whose re-encoding differs."""
        several = np.flatnonzero((count > 1) & ~self.bad)  # keys of values marked bad may be null
        if not several.size:
            return
        entries = keys.take(pa.array(_ranges(offsets[several], count[several])))
        ids = pc.dictionary_encode(entries).indices.to_numpy(zero_copy_only=False).astype(np.int64)
        # (value, key) as one number, sorted: a key twice in a value is two equal neighbours
        width = int(ids.max()) + 1
        codes = np.sort(np.repeat(np.arange(len(several), dtype=np.int64), count[several]) * width + ids)
        twice = several[codes[1:][codes[1:] == codes[:-1]] // width]
        self.bad[twice] = True

    def decimal(self, node: _Decimal, live: np.ndarray | None, arrow: pa.DataType) -> pa.Array | None:
        """A decimal's unscaled value (big-endian two's complement) as Arrow's decimal128. Taken
        only within its precision: fastavro decodes a wider one rounded to it, and one it writes
        back the same (trailing zeros) no decimal column of that precision can hold, so the writer
        keeps it raw. Bytes are taken only in the length fastavro writes: the fewest that hold the
        magnitude and a sign bit (so -128 takes two, 0xff80)."""
        if node.size is None:
            length = self.varint(live)
            at = self.at
            self.fail((length < 1) | (length > 16), live)
            length = np.clip(length, 1, 16)
            self._advance(at + length, None, live)
        else:
            at, length = self.at, np.full(len(self.at), node.size, dtype=np.int64)
            self._advance(at + node.size, None, live)
        window = self.window(at, 16)  # the value's bytes first, then whatever follows
        column = np.arange(16)
        negative = window[:, 0] >= 0x80
        if node.size is None:
            first, second = window[:, 0], window[:, 1]
            zeros = (window == 0) | (column >= length[:, None])
            after_first, after_second = zeros[:, 1:].all(axis=1), zeros[:, 2:].all(axis=1)
            longer = ~negative & (length > 1) & (first == 0) & (second < 0x80)  # a leading 0x00 it would not write
            # -2**(8 * length - 1), whose magnitude takes another byte; and from -2**(8 * length - 9)
            # up, whose magnitude fits a byte less
            shorter = negative & (first == 0xFF) & (length > 1) & ((second > 0x80) | ((second == 0x80) & ~after_second))
            self.fail(longer | shorter | (negative & (first == 0x80) & after_first), live)
        # big-endian, sign-extended to 16 bytes, then little-endian as Arrow holds it
        source = column - (16 - length)[:, None]
        wide = np.where(source >= 0, np.take_along_axis(window, np.maximum(source, 0), axis=1), np.where(negative, 0xFF, 0)[:, None].astype(np.uint8))
        little = np.ascontiguousarray(wide[:, ::-1])
        low, high = little[:, :8].copy().view("<u8").reshape(-1), little[:, 8:].copy().view("<u8").reshape(-1)
        # the magnitude (two's complement negation of the negative ones) against 10 ** precision
        low_abs = np.where(negative, ~low + np.uint64(1), low)
        high_abs = np.where(negative, ~high + (low == 0).astype(np.uint64), high)
        bound_high, bound_low = divmod(10**node.precision, 2**64)
        within = (high_abs < np.uint64(bound_high)) | ((high_abs == np.uint64(bound_high)) & (low_abs < np.uint64(bound_low)))
        self.fail(~within, live)
        validity = None if live is None else pa.py_buffer(np.packbits(live, bitorder="little"))
        array = pa.Array.from_buffers(pa.decimal128(node.precision, node.scale), len(little), [validity, pa.py_buffer(little)])
        return _cast(array, arrow)

    def leaf(self, kind: str, live: np.ndarray | None, arrow: pa.DataType) -> pa.Array | None:
        n = len(self.at)
        mask = None if live is None else ~live
        if kind == "uuid":
            return self._uuid(live, arrow)
        if kind in ("string", "bytes"):
            length = self.varint(live)
            at = self.at
            failed = length < 0
            self._advance(at + np.where(failed, 0, length), failed, live)
            valid = ~self.bad if live is None else live & ~self.bad
            array = _binary(self.buffer, at, np.where(valid, length, -1))
            if kind == "string":
                array = self._utf8(array, valid)
            return _cast(array, arrow)
        if kind == "boolean":
            byte = self.buf[self.at]
            self._advance(self.at + 1, byte > 1, live)
            return _cast(pa.array(byte == 1, mask=mask), arrow)
        if kind == "float":
            values = self.fixed(4, live).view("<f4").reshape(n)
            nan = np.isnan(values)
            self.bad |= nan if live is None else nan & live
            return _cast(pa.array(values, mask=mask), arrow)
        if kind == "double":
            return _cast(pa.array(self.fixed(8, live).view("<f8").reshape(n), mask=mask), arrow)
        values = self.varint(live)
        if kind == "int":
            failed = (values < _INT32_MIN) | (values > _INT32_MAX)
            values = values.astype(np.int32) if not failed.any() else np.where(failed, 0, values).astype(np.int32)
        elif kind == "date":
            failed = (values < _MIN_DAY) | (values > _MAX_DAY)
            values = np.where(failed, 0, values).astype(np.int32)
        elif kind in _TIMES_OF_DAY:
            bound, scale = _TIMES_OF_DAY[kind]
            failed = (values < 0) | (values >= bound)
            values = np.where(failed, 0, values) * scale
        elif kind != "long":  # a timestamp, as microseconds
            scale = 1000 if kind.endswith("-millis") else 1
            failed = (values < _MIN_MICROS // scale) | (values > _MAX_MICROS // scale)
            values = np.where(failed, 0, values) * scale
        else:
            failed = None
        if failed is not None:
            self.bad |= failed if live is None else failed & live
        array = pa.array(values, mask=mask)
        if kind == "date":
            array = array.view(pa.date32())
        elif kind.startswith("timestamp"):
            array = array.view(pa.timestamp("us", tz="UTC"))
        elif kind.startswith("local-timestamp"):
            array = array.view(pa.timestamp("us"))
        return _cast(array, arrow)

    def _uuid(self, live: np.ndarray | None, arrow: pa.DataType) -> pa.Array | None:
        """A uuid string as its 16 bytes; taken only in the form str(uuid.UUID) gives (36
        characters, lowercase hex, hyphens at 8, 13, 18 and 23), which is what fastavro writes back
        whatever form it decoded."""
        n = len(self.at)
        length = self.varint(live)
        text = self.fixed(36, live)
        hyphen = np.zeros(36, dtype=bool)
        hyphen[list(_UUID_HYPHENS)] = True
        hex_ = text[:, ~hyphen]
        digit = (hex_ >= ord("0")) & (hex_ <= ord("9"))
        letter = (hex_ >= ord("a")) & (hex_ <= ord("f"))
        failed = (length != 36) | ~(digit | letter).all(axis=1) | (text[:, hyphen] != ord("-")).any(axis=1)
        self.bad |= failed if live is None else failed & live
        nibbles = np.where(digit, hex_ - ord("0"), hex_ - (ord("a") - 10)).astype(np.uint8)
        raw = np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2])
        validity = None if live is None else pa.py_buffer(np.packbits(live, bitorder="little"))
        storage = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), n, [validity, pa.py_buffer(raw)])
        return _cast(pa.ExtensionArray.from_storage(pa.uuid(), storage), arrow)

    def _utf8(self, array: pa.Array, valid: np.ndarray) -> pa.Array:
        """`array` as strings; values that are not UTF-8 marked bad (and null)."""
        try:
            return array.cast(pa.large_string())
        except pa.ArrowInvalid:
            pass
        broken = np.zeros(len(array), dtype=bool)
        for i in np.flatnonzero(valid).tolist():
            try:
                array[i].as_py().decode()
            except UnicodeDecodeError:
                broken[i] = True
        self.bad |= broken
        return pc.if_else(pa.array(broken), pa.nulls(len(array), pa.large_binary()), array).cast(pa.large_string())


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions start, start + 1, ... start + length - 1 of each (start, length), in order."""
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1])) - np.repeat(ends - lengths - starts, lengths)


def _cast(array: pa.Array, arrow: pa.DataType) -> pa.Array | None:
    """`array` as the table's type of its field (the same, or a promotion: int to long, float to
    double); None when the table's type is another."""
    if array.type.equals(arrow):
        return array
    if pa.types.is_decimal128(array.type) and pa.types.is_decimal128(arrow) and array.type.scale == arrow.scale and array.type.precision < arrow.precision:
        return array.cast(arrow)
    if (array.type, arrow) in ((pa.int32(), pa.int64()), (pa.float32(), pa.float64())) or (pa.types.is_large_binary(array.type) and pa.types.is_binary(arrow)) or (pa.types.is_large_string(array.type) and pa.types.is_string(arrow)):
        return array.cast(arrow)
    return None

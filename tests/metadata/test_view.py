"""The offset index's in-memory view (metadata/view.py): its columns answer every read as a plain
list of IndexEntry values would, and hold an entry in a quarter of the memory."""

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.model import IndexEntry, ObjectType
from metadata.view import PartitionView

WAL, PARQUET = ObjectType.WAL, ObjectType.PARQUET


class ListView:
    """The model: entries in a list, sorted by base offset, read by scanning."""

    def __init__(self):
        self.entries: list[IndexEntry] = []

    def add(self, e):
        self.entries = [x for x in self.entries if x.base_offset != e.base_offset] + [e]
        self.entries.sort(key=lambda x: x.base_offset)

    def replace(self, e):
        gone = [x for x in self.entries if e.base_offset <= x.base_offset and x.last_offset <= e.last_offset]
        self.entries = sorted([x for x in self.entries if x not in gone] + [e], key=lambda x: x.base_offset)
        return gone

    def remove(self, base):
        self.entries = [x for x in self.entries if x.base_offset != base]

    def from_offset(self, offset, n):
        return [x for x in self.entries if x.last_offset >= offset][: max(n, 0)]

    def covering(self, first, last):
        # from the entry holding `first` through the one holding `last` (or the first after it)
        out = []
        for x in self.entries:
            if x.last_offset >= first:
                out.append(x)
                if x.last_offset >= last:
                    break
        return out

    def for_timestamp(self, ts):
        # the first entry whose running maximum of max_timestamp reaches ts
        running = None
        for x in self.entries:
            running = x.max_timestamp if running is None else max(running, x.max_timestamp)
            if running >= ts:
                return x
        return None


# Entries of 1-4 offsets in slots of 4, so that any set of them is disjoint and a replace covers
# whole entries: slot s holds [4s, 4s + length - 1].
slots = st.integers(0, 30)
lengths = st.integers(1, 4)
stamps = st.integers(-5, 50)
keys = st.sampled_from(["wal/a", "wal/b", "wal/c"])


def entry(slot, length, key, ts, kind=WAL):
    return IndexEntry(4 * slot, 4 * slot + length - 1, key, kind, 10 * slot, length, ts)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), slots, lengths, keys, stamps),
        st.tuples(st.just("replace"), slots, st.integers(1, 5), stamps),
        st.tuples(st.just("remove"), slots),
    ),
    max_size=40,
)


@settings(deadline=None, max_examples=300)
@given(operations, st.integers(-1, 130), st.integers(0, 6), stamps)
def test_the_columns_answer_as_a_list_of_entries_would(ops, offset, count, timestamp):
    view, model = PartitionView(), ListView()
    for op in ops:
        if op[0] == "add":
            e = entry(*op[1:])
            if any(x.base_offset != e.base_offset and x.base_offset <= e.last_offset and e.base_offset <= x.last_offset for x in model.entries):
                continue  # offsets are in one entry at a time; the same base offset again replaces it
            view.add(e)
            model.add(e)
        elif op[0] == "replace":
            _, slot, span, ts = op
            first, last = 4 * slot, 4 * (slot + span) - 1
            covered = model.covering(first, last)
            if covered:  # a replace covers whole entries, exactly: from the first's base to the last's end
                e = IndexEntry(covered[0].base_offset, covered[-1].last_offset, f"table/{slot}.parquet", PARQUET, 0, 9, ts)
                assert view.replace(e) == model.replace(e)
        else:
            view.remove(4 * op[1])
            model.remove(4 * op[1])
        assert view.from_offset(0, 1000) == model.entries
    assert len(view) == len(model.entries)
    assert view.from_offset(offset, count) == model.from_offset(offset, count)
    assert view.covering(offset, offset + count) == model.covering(offset, offset + count)
    assert view.for_timestamp(timestamp) == model.for_timestamp(timestamp)
    assert view.object_keys() == {x.object_key for x in model.entries}


def test_an_entry_takes_a_quarter_of_the_memory_of_an_index_entry_object():
    """100,000 entries over 1,000 WAL objects (each object's key one string, as a wal-index
    record's decode gives): the view holds them in under 70 bytes each; as IndexEntry objects in
    a list (the view before) they took 244, measured the same way."""
    objects = [f"wal/{i:013d}-1-{'0' * 32}.wal" for i in range(1000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        view = PartitionView()
        for i in range(100_000):
            view.add_fields(1_000_000_000 + 10 * i, 1_000_000_000 + 10 * i + 9, objects[i // 100], 0, 1_000_000 + i * 4096, 4096, 1_764_000_000_000 + i)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held / 100_000 < 70, held / 100_000
    assert [e.base_offset for e in view.from_offset(1_000_000_000 + 10 * 500 + 5, 3)] == [1_000_000_000 + 10 * i for i in (500, 501, 502)]
    assert view.from_offset(1_000_000_000 + 10 * 99_999, 5)[0].object_key is objects[999]

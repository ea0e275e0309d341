"""The etcd store's value formats, without an etcd: a wal-index record, an index entry and a head
decode to what was encoded, whatever the object key and the object type."""

from __future__ import annotations

import json
import uuid

import pytest

from metadata.etcd import EtcdMetadataStore, _decode_entry, _Keys, decode_wal_index, encode_wal_index
from metadata.etcd.keys import decode_producer, encode_producer
from metadata.model import IndexEntry, ObjectType, TopicInfo
from metadata.sequencer import BatchSequence, ProducerState

KEYS = ["wal/0000000001234-1-abcdef.wal", 'odd "key", with, commas\\ and é', "parquet/t/p=0/00001.parquet"]


@pytest.mark.parametrize("key", KEYS)
def test_a_wal_index_record_decodes_to_the_entries_encoded(key):
    """Entries of two topics, one partition with two entries: each comes back named by its
    partition's path, as the store's map of partitions names them."""
    t, u = uuid.uuid4(), uuid.uuid4()
    a = IndexEntry(0, 4, key, ObjectType.WAL, 12, 6_200, 1_700_000_000_123)
    b = IndexEntry(9, 2**62, key, ObjectType.WAL, 6_212, 100, 1_700_000_000_124)
    c = IndexEntry(7, 7, key, ObjectType.WAL, 6_312, 80, -1)
    d = IndexEntry(0, 0, key, ObjectType.WAL, 6_392, 70, 0)
    decoded = decode_wal_index(encode_wal_index(key, {(t, 0): [a, b], (u, 1_234_567): [c], (t, 123_456): [d]}))
    path = _Keys.partition_path
    assert decoded == (key, [(path(t, 0), a), (path(t, 0), b), (path(t, 123_456), d), (path(u, 1_234_567), c)])


def test_a_wal_index_record_fills_the_partitions_a_store_knows():
    store = EtcdMetadataStore("127.0.0.1", 1)  # never started: only its value formats are used
    tid, gone = uuid.uuid4(), uuid.uuid4()
    store._adopt_topic(TopicInfo("t", tid, 2), created=1)
    a = IndexEntry(0, 4, "wal/x", ObjectType.WAL, 12, 100, 5)
    b = IndexEntry(3, 3, "wal/x", ObjectType.WAL, 112, 50, 6)
    store._apply_wal_index(encode_wal_index("wal/x", {(tid, 1): [a], (gone, 0): [a], (tid, 0): [b]}))
    assert store.entries(tid, 0, 0) == [b] and store.entries(tid, 1, 0) == [a]  # a deleted topic's entry is passed over


@pytest.mark.parametrize("kind", list(ObjectType))
@pytest.mark.parametrize("key", KEYS)
def test_an_index_entry_of_its_own_key_decodes(kind, key):
    """`index/<partition>/<base offset>` keys, one entry each: written before wal-index records, still read."""
    raw = f"[{2**62},{json.dumps(key)},{int(kind)},17,6200,1700000000123]".encode()
    decoded = _decode_entry(1_000, raw)
    assert decoded == IndexEntry(1_000, 2**62, key, kind, 17, 6_200, 1_700_000_000_123)
    assert type(decoded.object_type) is ObjectType


def test_a_head_and_a_producer_key_decode_to_what_was_encoded():
    """A head holds the next offset and log start only, whatever producers write the partition;
    each producer's state is a value of its own, taken only if newer than the view's."""
    store = EtcdMetadataStore("127.0.0.1", 1)  # never started: only its value formats are used
    tid = uuid.uuid4()
    store._adopt_topic(TopicInfo("t", tid, 4), created=1)
    part = store._partitions[(tid, 3)]
    value = store._encode_head(part, 20)
    assert value == b'{"n":20,"s":0}'
    assert store._apply_head(f"{tid.hex}/000003", value, mod_revision=5) == (tid, 3)
    assert (part.next_offset, part.log_start_offset, part.mod_revision) == (20, 0, 5)
    assert store._apply_head(f"{tid.hex}/000003", store._encode_head(part, 30, log_start=4), mod_revision=5) is None  # not newer: not taken

    state = ProducerState(2, (BatchSequence(0, 4, 10), BatchSequence(5, 9, 15)))
    raw = encode_producer(state, 1_700_000_000_000)
    assert decode_producer(raw) == (state, 1_700_000_000_000)
    for kept in (state._replace(txn_first_offset=15), state._replace(last_marker=14), state._replace(txn_first_offset=15, last_marker=14, txn_generation=3)):
        assert decode_producer(encode_producer(kept, 1)) == (kept, 1)  # each transaction field, as far as any is known
    store._apply_producer(f"{tid.hex}/000003/7", raw, mod_revision=8)
    assert (part.producers, part.producer_used, part.producer_revisions) == ({7: state}, {7: 1_700_000_000_000}, {7: 8})
    store._apply_producer(f"{tid.hex}/000003/7", encode_producer(ProducerState(1, ()), 1), mod_revision=7)  # older: not taken
    assert part.producers == {7: state}
    part.drop_producer(7, revision=9)  # its lease expired
    assert (part.producers, part.producer_used, part.producer_revisions) == ({}, {}, {})
    assert store.keys.producer(tid, 3, 7) == f"/neve/producers/{tid.hex}/000003/7".encode()


def test_head_and_index_keys_name_the_partition_by_its_path():
    keys, tid = _Keys("neve"), uuid.uuid4()
    for partition in (0, 7, 123_456, 1_234_567):
        path = _Keys.partition_path(tid, partition)
        assert keys.head(tid, partition) == f"/neve/heads/{path}".encode()
        assert keys.index(tid, partition, 42) == f"/neve/index/{path}/{42:020d}".encode()

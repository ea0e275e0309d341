"""The recent-objects cache holds an object as the parts it was joined from."""

from __future__ import annotations

from cache.recent import RecentObjects

PARTS = [b"HEAD0123", b"a" * 5, b"", b"bcdefghij", b"k", b"FOOTER"]
OBJECT = b"".join(PARTS)


def test_every_range_reads_the_bytes_of_the_joined_object():
    recent = RecentObjects(1 << 20)
    recent.add("o", PARTS)
    reads = 0
    for start in range(len(OBJECT) + 2):
        for end in range(start, len(OBJECT) + 3):
            got = recent.get("o", start, end)
            reads += 1
            assert bytes(got) == OBJECT[start:end], (start, end)
    assert (recent.hits, recent.misses, recent.size) == (reads, 0, len(OBJECT))


def test_a_range_within_one_part_is_a_view_of_it_and_across_parts_a_copy():
    recent = RecentObjects(1 << 20)
    recent.add("o", PARTS)
    inside = recent.get("o", 14, 20)  # within "bcdefghij" (bytes 13..22)
    assert isinstance(inside, memoryview) and inside.obj is PARTS[3] and bytes(inside) == b"cdefgh"
    across = recent.get("o", 6, 15)  # header tail, the a's, the empty part, "bc"
    assert isinstance(across, bytes) and across == b"23aaaaabc"


def test_eviction_counts_the_bytes_of_all_parts():
    recent = RecentObjects(2 * len(OBJECT))
    recent.add("a", PARTS)
    recent.add("b", [OBJECT])
    assert recent.size == 2 * len(OBJECT) and recent.has("a") and recent.has("b")
    assert bytes(recent.get("a", 0, 4)) == b"HEAD"  # a is now the most recently used
    recent.add("c", [b"x"])
    assert (recent.has("a"), recent.has("b"), recent.has("c")) == (True, False, True)
    assert recent.size == len(OBJECT) + 1
    recent.add("a", [b"yz"])  # replacing a key replaces its bytes in the count
    assert recent.size == 3 and bytes(recent.get("a", 0, 10)) == b"yz"
    assert recent.get("b", 0, 1) is None and recent.misses == 1


def test_an_object_larger_than_the_cache_is_not_held():
    recent = RecentObjects(len(OBJECT) - 1)
    recent.add("o", PARTS)
    assert not recent.has("o") and recent.size == 0

"""Deterministic record sets for scenario tests, and the exact check of what a client read back.

A record set is generated from a seed (same seed, same bytes), with an explicit partition and
timestamp per record, so every client produces the same thing and a failure can be reproduced
from the seed alone. `verify` compares what was consumed with what was produced, field by field,
and names the first differences precisely instead of answering "not equal".
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient, NewTopic

LOG = logging.getLogger("tests.scenarios")  # librdkafka logs go here (captured by pytest), not to stderr
BASE_TIMESTAMP = 1_700_000_000_000  # ms; 2023-11-14, well inside every client's range
BIG_VALUE = 100 * 1024
MAX_VALUE = 1024


@dataclass(frozen=True, slots=True)
class Rec:
    """One record to produce. `value` is never None here; keys may be None (a null key)."""

    partition: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int


@dataclass(frozen=True, slots=True)
class Got:
    """One record as a client returned it, normalised (headers as a tuple, bytes as bytes)."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int
    create_time: bool  # timestamp type is CreateTime (not LogAppendTime / none)


def make_records(seed: int, count: int = 10_000, partitions: int = 3, big: int = 5) -> list[Rec]:
    """`count` records over `partitions`: values of 0..1024 bytes (both ends included) plus `big`
    values of exactly 100 KiB, keys of 0..40 bytes (about 1 in 50 null), 0..3 headers (header
    names may repeat; values 0..32 bytes) and timestamps within ±1000 s of BASE_TIMESTAMP, in no
    particular order, so batches carry negative timestamp deltas too."""
    rnd = random.Random(seed)
    big_at = set(rnd.sample(range(count), big))
    edge_sizes = {0: 0, 1: MAX_VALUE, 2: 1}  # the first records pin the ends of the size range
    records = []
    for i in range(count):
        size = BIG_VALUE if i in big_at else edge_sizes.get(i, rnd.randint(0, MAX_VALUE))
        key = None if rnd.random() < 0.02 else rnd.randbytes(rnd.randint(0, 40))
        names = ["trace", "origin", "n", "x-Ω"]
        headers = tuple((rnd.choice(names), rnd.randbytes(rnd.randint(0, 32))) for _ in range(rnd.randint(0, 3)))
        records.append(
            Rec(
                partition=rnd.randrange(partitions),
                key=key,
                value=rnd.randbytes(size),
                headers=headers,
                timestamp=BASE_TIMESTAMP + rnd.randint(-1_000_000, 1_000_000),
            )
        )
    return records


def by_partition(records: Iterable[Rec]) -> dict[int, list[Rec]]:
    out: dict[int, list[Rec]] = {}
    for r in records:
        out.setdefault(r.partition, []).append(r)
    return out


def _short(b: bytes | None) -> str:
    if b is None:
        return "None"
    return f"{len(b)}B {b[:12].hex()}{'…' if len(b) > 12 else ''}"


def _diff(want: Rec, got: Got) -> list[str]:
    problems = []
    if got.key != want.key:
        problems.append(f"key {_short(got.key)} != produced {_short(want.key)}")
    if got.value != want.value:
        problems.append(f"value {_short(got.value)} != produced {_short(want.value)}")
    if tuple(got.headers) != want.headers:
        problems.append(f"headers {[(k, _short(v)) for k, v in got.headers]} != produced {[(k, _short(v)) for k, v in want.headers]}")
    if got.timestamp != want.timestamp:
        problems.append(f"timestamp {got.timestamp} != produced {want.timestamp}")
    if not got.create_time:
        problems.append("timestamp type is not CreateTime")
    return problems


def verify(produced: Sequence[Rec], consumed: Sequence[Got], acked_offsets: Sequence[int] | None = None, limit: int = 10) -> None:
    """Assert that `consumed` is exactly `produced`: per partition the same records in produce
    order at offsets 0, 1, 2, ... with identical keys, values, headers and CreateTime timestamps.
    `acked_offsets[i]`, when given, is the offset the producer was told for `produced[i]`; it must
    be where the record was read."""
    want = by_partition(produced)
    got: dict[int, list[Got]] = {}
    for g in consumed:
        got.setdefault(g.partition, []).append(g)
    problems: list[str] = []
    for p in sorted(set(want) | set(got)):
        w, g = want.get(p, []), got.get(p, [])
        if len(w) != len(g):
            problems.append(f"partition {p}: consumed {len(g)} records, produced {len(w)}")
        offsets = [x.offset for x in g]
        if offsets != list(range(len(g))):
            first_bad = next(i for i, o in enumerate(offsets) if o != i)
            problems.append(f"partition {p}: offsets not contiguous from 0: at position {first_bad} got offset {offsets[first_bad]} (around {offsets[max(0, first_bad - 2) : first_bad + 3]})")
        for i, (wr, gr) in enumerate(zip(w, g)):
            for problem in _diff(wr, gr):
                problems.append(f"partition {p} offset {gr.offset} (record {i} of the partition): {problem}")
            if len(problems) >= limit:
                break
    if acked_offsets is not None:
        position = {p: 0 for p in want}
        for i, r in enumerate(produced):
            expected_offset = position[r.partition]
            position[r.partition] += 1
            if acked_offsets[i] != expected_offset:
                problems.append(f"record {i} (partition {r.partition}) acknowledged at offset {acked_offsets[i]}, but is the partition's record number {expected_offset}")
                if len(problems) >= limit:
                    break
    assert not problems, f"{len(produced)} produced / {len(consumed)} consumed; first differences:\n  " + "\n  ".join(problems[:limit])


def create_topic(bootstrap: str, partitions: int, prefix: str = "t", timeout: float = 30.0) -> str:
    """Create a fresh topic through CreateTopics (confluent-kafka's AdminClient); returns its name."""
    topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": LOG})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)], operation_timeout=timeout)
    futures[topic].result(timeout=timeout)
    return topic

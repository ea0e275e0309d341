"""Many topics for the freshness benchmark: created in bulk, produced to by one producer at a steady
rate spread evenly over every topic's partitions, a fixed sample of them followed for freshness
(reading a thousand tables every poll is not possible), and each sampled partition's current lag
(the age of its oldest acknowledged record not yet visible in the table)."""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .table_load import PRODUCER_CONFIG, count_delivery

CREATE_CHUNK = 100  # topics per CreateTopics request: a few requests for a thousand, each well inside its timeout


def sample(topics: int, k: int) -> list[int]:
    """Indices of `k` topics spread evenly over `topics` (each the middle of its stretch); every
    topic when there are no more than `k`."""
    if k <= 0:
        raise ValueError(f"a sample of {k} topics")
    if topics <= k:
        return list(range(topics))
    return [(2 * j + 1) * topics // (2 * k) for j in range(k)]


def target(i: int, topics: int, partitions: int) -> tuple[int, int]:
    """(topic index, partition) of the i-th record: topic after topic, then the next partition, so
    at any rate each topic receives its share evenly spaced in time."""
    return i % topics, (i // topics) % partitions


def due(i: int, rate: float) -> float:
    """Seconds after the start at which the i-th record is sent, at `rate` records a second."""
    return i / rate


def create_topics(bootstrap: str, names: Sequence[str], partitions: int, progress: Callable[[str], None] | None = None) -> None:
    """Create every topic, CREATE_CHUNK to a request, and wait for each."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    for start in range(0, len(names), CREATE_CHUNK):
        chunk = names[start : start + CREATE_CHUNK]
        futures = admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1) for n in chunk], request_timeout=120, operation_timeout=120)
        for future in futures.values():
            future.result(timeout=180)
        if progress is not None and len(names) > CREATE_CHUNK:
            progress(f"{start + len(chunk):,} of {len(names):,} topics created")


@dataclass
class Acks:
    """What one producer saw: every acknowledgement counted; for the followed topics, each record's
    offset and acknowledgement time (wall clock) kept per (sample index, partition) slot, in offset
    order (one producer, acks in order per partition)."""

    slots: int
    acked: int = 0
    failed: int = 0
    value_bytes: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    offsets: list[list[int]] = field(default_factory=list)
    times: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.offsets = [[] for _ in range(self.slots)]
        self.times = [[] for _ in range(self.slots)]

    def add(self, slot: int, offset: int, at: float) -> None:
        self.offsets[slot].append(offset)
        self.times[slot].append(at)

    def oldest_unseen(self, slot: int, highest_seen: int) -> float | None:
        """Acknowledgement time of the slot's first record past `highest_seen`; None if none is."""
        offsets = self.offsets[slot]
        k = bisect.bisect_right(offsets, highest_seen)
        return self.times[slot][k] if k < len(offsets) else None


def current_lags(acks: Acks, highest_seen: Sequence[int], now: float) -> list[float]:
    """Per followed slot: seconds since its oldest acknowledged record not yet seen in the table
    was acknowledged (0 when the table has caught up)."""
    out = []
    for slot in range(acks.slots):
        t = acks.oldest_unseen(slot, highest_seen[slot])
        out.append(0.0 if t is None else max(0.0, now - t))
    return out


def produce(
    bootstrap: str, names: Sequence[str], partitions: int, pool: list[bytes], rate: float, followed: dict[str, int], out: Acks, until: Callable[[], bool]
) -> None:
    """Records of `pool` in turn at `rate` a second, spread by `target`, until `until()` (asked
    about ten times a second, and at every record below ten a second) is true; waits for every
    acknowledgement, counted into `out`. `followed`: topic name -> sample index, whose records'
    acknowledgements `out` keeps."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})

    def delivered(err, msg) -> None:
        if not count_delivery(out, err):
            return
        k = followed.get(msg.topic())
        if k is not None:
            out.add(k * partitions + msg.partition(), msg.offset(), time.time())

    ask_every = max(1, int(rate / 10))
    started = time.monotonic()
    i = 0
    while not (i % ask_every == 0 and until()):
        # poll() returns as soon as it has served an acknowledgement: wait again until due
        while (wait := started + due(i, rate) - time.monotonic()) > 0.01:
            producer.poll(wait)
        topic, partition = target(i, len(names), partitions)
        value = pool[i % len(pool)]
        out.value_bytes += len(value)
        while True:
            try:
                producer.produce(names[topic], value, partition=partition, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
        i += 1
    left = producer.flush(300)
    out.seconds = time.monotonic() - started
    if left:
        out.errors.append(f"{left} records not acknowledged after 300 s")

"""The compacted workload: keyed updates and tombstones over a small key space of a topic with
cleanup.policy=compact; the checker compares each key's latest acknowledged value with what the
compacted Kafka view and the upsert table (one row per live key) hold."""

from __future__ import annotations

from . import Workload
from .clients import ClientThread
from .queue import IdempotentProducer, Member

PARTITIONS = 3
KEYS_PER_PARTITION = 12
TOMBSTONE_SHARE = 0.1
# Tombstones leave the Kafka view this long after a compaction cycle reaches them (the table drops
# the key's row at once): short, so that a run sees both happen.
DELETE_RETENTION_MS = 10_000


class KeyedProducer(IdempotentProducer):
    """Idempotent ops of 1-3 keyed updates, ~10% of them tombstones (value null); a key always goes
    to the same partition, as a keyed producer's partitioner would send it."""

    def sends(self) -> list[tuple[str, int | None, str | None]]:
        topic = self.workload.topics[0]
        out = []
        for _ in range(self.rng.randint(1, 3)):
            partition = self.rng.randrange(PARTITIONS)
            record_key = f"k{partition}-{self.rng.randrange(KEYS_PER_PARTITION)}"
            out.append((f"{topic}/{partition}", None if self.rng.random() < TOMBSTONE_SHARE else self.shared.value(), record_key))
        return out


class CompactedWorkload(Workload):
    name = "compacted"
    compacted = True

    def __init__(self, run_id, rng, recorder, *, scale: float = 1.0) -> None:
        super().__init__(run_id, rng, recorder, scale=scale)
        self._topic("kv", PARTITIONS, {"cleanup.policy": "compact", "delete.retention.ms": str(DELETE_RETENTION_MS), "min.compaction.lag.ms": "0"})
        self.producers = 2 if scale >= 1 else 1

    def threads(self, bootstrap: str) -> list[ClientThread]:
        threads: list[ClientThread] = [KeyedProducer(self, f"producer-{i}", bootstrap, keyed=True) for i in range(self.producers)]
        threads.append(Member(self, "reader", bootstrap, mode="assign", group=f"chaos-{self.run_id}-compacted-reader", isolation="read_uncommitted"))
        return threads

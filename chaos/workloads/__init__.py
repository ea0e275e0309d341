"""The workloads: real Kafka clients (librdkafka) driven against the cluster, every operation recorded
in the history (chaos/history.py). Owns the Workload interface, the registry and the reads that end a run.

A workload is one per run: `setup` creates its topics, `start` starts its client threads, `stop`
ends them, then `final_reads` reads every partition from offset 0 and `table_reads` reads every
topic's Iceberg table. Each client thread is one history process at a time; a client that is closed
and opened again takes a new process number (clients.Shared hands them out, unique in the run).
"""

from __future__ import annotations

import random
import threading
import time

from chaos.history import Recorder

from . import clients


class Workload:
    """One workload of a run; its topics are named with the run's id."""

    name: str = ""
    compacted = False  # records carry their record key ([offset, v, record_key]) in reads

    def __init__(self, run_id: str, rng: random.Random, recorder: Recorder, *, scale: float = 1.0) -> None:
        self.run_id = run_id
        self.rng = rng
        self.recorder = recorder
        self.scale = max(0.05, scale)
        self.shared = clients.Shared.of(recorder)
        self.topics: list[str] = []
        self.partitions: dict[str, int] = {}  # topic -> partition count
        self.topic_configs: dict[str, dict[str, str]] = {}
        self._stop = threading.Event()
        self._threads: list[clients.ClientThread] = []

    # -- lifecycle -------------------------------------------------------------------------------

    def _topic(self, suffix: str, partitions: int, config: dict[str, str] | None = None) -> str:
        topic = f"chaos-{self.run_id}-{self.name}-{suffix}"
        self.topics.append(topic)
        self.partitions[topic] = partitions
        self.topic_configs[topic] = config or {}
        return topic

    def keys(self, topics: list[str] | None = None) -> list[str]:
        return [f"{t}/{p}" for t in (topics or self.topics) for p in range(self.partitions[t])]

    def setup(self, bootstrap: str) -> None:
        clients.create_topics(bootstrap, self.partitions, self.topic_configs, self.shared)

    def threads(self, bootstrap: str) -> list[clients.ClientThread]:
        """The client threads of this workload (not started)."""
        raise NotImplementedError

    def start(self, bootstrap: str) -> None:
        self._stop.clear()
        self._threads = self.threads(bootstrap)
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        deadline = time.monotonic() + clients.STOP_JOIN_S
        for thread in self._threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
        # a thread stuck in a librdkafka call past the deadline is abandoned (daemon), its client's close recorded as info by itself

    # -- the reads after the heal ----------------------------------------------------------------

    def final_reads(self, bootstrap: str, timeout: float) -> None:
        self.last_offsets: dict[str, int] = {}
        for isolation in ("read_committed", "read_uncommitted"):
            deadline = time.monotonic() + timeout / 2  # one stuck read leaves the other its time
            records = clients.final_read(bootstrap, self.recorder, self.shared, self.partitions, isolation, deadline, keyed=self.compacted)
            if isolation == "read_committed" and records is not None:
                self.last_offsets = {k: r[-1][0] for k, r in records.items() if r}

    def table_reads(self, catalog, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        process = self.shared.process()
        for topic in self.topics:
            wanted = {k: o for k, o in getattr(self, "last_offsets", {}).items() if k.rpartition("/")[0] == topic}
            clients.table_read(catalog, self.recorder, process, topic, wanted, deadline, keyed=self.compacted)


from .compacted import CompactedWorkload  # noqa: E402
from .queue import QueueWorkload  # noqa: E402
from .txn import TxnWorkload  # noqa: E402

WORKLOADS: dict[str, type[Workload]] = {w.name: w for w in (QueueWorkload, TxnWorkload, CompactedWorkload)}

__all__ = ["WORKLOADS", "Workload"]

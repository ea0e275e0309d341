"""The queue workload: idempotent producers and consumers of every kind (assigned, a classic group, a
KIP-848 group) over 2 topics x 4 partitions; the checker looks for lost, duplicated and reordered
records, reads of unwritten values and commits that move backwards."""

from __future__ import annotations

import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from chaos.history import FAIL, INFO, OK, Op, split_key

from . import Workload, clients
from .clients import ClientThread, RecordedConsumer

PARTITIONS = 4
SEND_EVERY_S = 0.15  # per producer, between ops (each op then waits for its acknowledgements)
POLL_EVERY_S = 0.2
COMMIT_EVERY = 4  # polls
OFFSETS_EVERY_S = 2.0
MEMBER_LIFETIME_S = (8.0, 25.0)  # a group member leaves (and a new one joins) after this long


class QueueWorkload(Workload):
    name = "queue"

    def __init__(self, run_id, rng, recorder, *, scale: float = 1.0) -> None:
        super().__init__(run_id, rng, recorder, scale=scale)
        self._topic("a", PARTITIONS)
        self._topic("b", PARTITIONS)
        self.producers = 3 if scale >= 1 else 2
        self.groups = {"classic": f"chaos-{run_id}-queue-classic", "consumer": f"chaos-{run_id}-queue-kip848"}

    def threads(self, bootstrap: str) -> list[ClientThread]:
        threads: list[ClientThread] = [IdempotentProducer(self, f"producer-{i}", bootstrap) for i in range(self.producers)]
        threads.append(Member(self, "assign", bootstrap, mode="assign", group=f"chaos-{self.run_id}-queue-assign", isolation="read_uncommitted"))
        for mode, group in self.groups.items():
            threads += [Member(self, f"{mode}-{i}", bootstrap, mode=mode, group=group, isolation="read_committed") for i in range(2)]
        threads.append(OffsetsReader(self, "offsets", bootstrap, list(self.groups.values())))
        return threads


class IdempotentProducer(ClientThread):
    """Ops of 1-4 sends to random partitions: produce all, flush, then one completion with every
    send's acknowledged offset (ok), or info if any delivery failed or is still pending. A fatal
    error ends the producer: a new one opens as a new process."""

    def __init__(self, workload: Workload, name: str, bootstrap: str, keyed: bool = False) -> None:
        super().__init__(workload, name)
        self.bootstrap = bootstrap
        self.producer: Producer | None = None
        self.process = -1
        self.current: Op | None = None
        self.fatal = False
        self.keyed = keyed

    def _on_error(self, err) -> None:
        if err.fatal():
            self.fatal = True

    def body(self) -> None:
        self.process = self.shared.process()
        self.fatal = False
        config = clients.producer_config(self.shared, self.bootstrap, f"chaos-{self.process}", on_error=self._on_error)
        self.producer = clients.record_open(self.recorder, self.process, {"role": "producer"}, lambda: Producer(config))
        while self.pause(SEND_EVERY_S):
            self.send_op(self.sends())
            if self.fatal:
                return

    def sends(self) -> list[tuple[str, int | None, str | None]]:
        """(key, value, record key) of the next op's sends."""
        keys = self.workload.keys()
        return [(self.rng.choice(keys), self.shared.value(), None) for _ in range(self.rng.randint(1, 4))]

    def micro(self, k: str, v, record_key: str | None) -> list:
        return ["send", k, v] + ([record_key] if self.keyed else [])

    def send_op(self, sends: list[tuple[str, int | None, str | None]]) -> None:
        producer = self.producer
        assert producer is not None
        self.current = self.recorder.invoke(self.process, "send", [self.micro(k, v, rk) for k, v, rk in sends])
        results: list = [None] * len(sends)  # offset or KafkaError, by send

        def delivered(i: int):
            def on_delivery(err, msg) -> None:
                results[i] = err if err is not None else msg.offset()

            return on_delivery

        produced, error = 0, None
        try:
            for i, (k, v, rk) in enumerate(sends):
                topic, partition = split_key(k)
                producer.produce(topic, value=None if v is None else str(v).encode(), key=None if rk is None else rk.encode(), partition=partition, on_delivery=delivered(i))
                produced += 1
        except Exception as e:  # noqa: BLE001 - BufferError, a fatal producer: the rest were never handed over
            error = e
        remaining = producer.flush(clients.FLUSH_S) if produced else 0
        value = [self.micro(k, [results[i] if isinstance(results[i], int) else None, v], rk) for i, (k, v, rk) in enumerate(sends)]
        op, self.current = self.current, None
        if produced == len(sends) and remaining == 0 and all(isinstance(r, int) for r in results):
            self.recorder.complete(op, OK, value)
        elif produced == 0:
            self.recorder.complete(op, FAIL, value, error=str(error))
        else:
            errors = [str(r) for r in results if r is not None and not isinstance(r, int)]
            self.recorder.complete(op, INFO, value, error=str(error or (errors[0] if errors else f"{remaining} deliveries pending")))
            if remaining or error is not None:
                self.fatal = True  # deliveries still pending or a refused produce: a fresh producer

    def teardown(self) -> None:
        if self.current is not None:
            self.recorder.complete(self.current, INFO, self.current["value"])
            self.current = None
        producer, self.producer = self.producer, None
        if producer is not None:

            def close() -> None:
                producer.flush(2.0)
                producer.close()

            clients.record_close(self.recorder, self.process, close)


class Member(ClientThread):
    """A consumer polling: by `assign` of every partition, or a member of a group (classic or
    KIP-848) committing its consumed positions synchronously now and then, leaving after a while
    (a new member, a new process, joins in its place) so the group rebalances."""

    def __init__(self, workload: Workload, name: str, bootstrap: str, *, mode: str, group: str, isolation: str, topics: list[str] | None = None) -> None:
        super().__init__(workload, name)
        self.bootstrap = bootstrap
        self.mode = mode
        self.group = group
        self.isolation = isolation
        self.topics = topics or workload.topics
        self.consumer: RecordedConsumer | None = None

    def body(self) -> None:
        c = self.consumer = RecordedConsumer(self.shared, self.recorder, self.bootstrap, isolation=self.isolation, group=self.group, mode=self.mode, client_id=f"chaos-{self.name}", keyed=self.workload.compacted)
        if self.mode == "assign":
            c.assign(self.workload.keys(self.topics))
            leave_at = float("inf")
        else:
            c.subscribe(self.topics)
            leave_at = time.monotonic() + self.rng.uniform(*MEMBER_LIFETIME_S) / min(1.0, self.scale)
        polls = 0
        while self.pause(POLL_EVERY_S):
            c.poll(50, 0.5)
            polls += 1
            if self.mode != "assign" and polls % COMMIT_EVERY == 0:
                c.commit()
            if time.monotonic() >= leave_at:
                c.commit()
                return

    def teardown(self) -> None:
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            consumer.close()


class OffsetsReader(ClientThread):
    """Reads each group's committed offsets with the admin client, as "offsets" ops."""

    def __init__(self, workload: Workload, name: str, bootstrap: str, groups: list[str]) -> None:
        super().__init__(workload, name)
        self.bootstrap = bootstrap
        self.groups = groups

    def body(self) -> None:
        process = self.shared.process()
        admin = AdminClient(clients.base_config(self.shared, self.bootstrap, f"chaos-offsets-{process}"))
        while self.pause(OFFSETS_EVERY_S):
            for group in self.groups:
                op = self.recorder.invoke(process, "offsets", {"group": group})
                try:
                    offsets = clients.group_offsets(admin, group)
                except Exception as e:  # noqa: BLE001 - a read refused or timed out changes nothing
                    self.recorder.complete(op, FAIL, {"group": group}, error=str(e))
                    continue
                self.recorder.complete(op, OK, {"group": group, "offsets": offsets})

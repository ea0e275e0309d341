"""The txn workload: transactional producers (fencing each other through a small pool of
transactional ids), read_committed and read_uncommitted readers, and a consume-transform-produce loop
committing its group's offsets in its transactions; the checker looks for aborted reads, lost or torn
commits and offsets committed without their transaction."""

from __future__ import annotations

from confluent_kafka import Producer, TopicPartition

from chaos.history import FAIL, INFO, OK, Op, split_key

from . import Workload, clients
from .clients import ClientBroken, ClientThread, RecordedConsumer, error_of
from .queue import Member

PARTITIONS = 3
TXN_EVERY_S = 0.3  # per producer, between transactions
CTP_EVERY_S = 0.3
ABORT_SHARE = 0.25  # of the producers' transactions, aborted on purpose
CTP_ABORT_SHARE = 0.1
TXN_TIMEOUT_S = 30.0  # commit, abort, init, send_offsets
COMMIT_TRIES = 3  # a commit that times out (retriable) is called again, as Kafka's client allows
INSTANCE_TXNS = (15, 40)  # transactions of one producer instance before a new instance of an id takes over mid-transaction


class Abort(Exception):
    """The workload's own decision to abort the transaction."""


class TxnClient:
    """One transactional producer instance: open (with init_transactions) and the transaction
    protocol with Kafka's error classes: abortable → abort → fail; fatal (fenced among them) →
    info and the instance is done; a commit that times out → tried again, then info."""

    def __init__(self, thread: ClientThread, bootstrap: str, transactional_id: str, process: int) -> None:
        self.thread = thread
        self.recorder = thread.recorder
        self.process = process
        self.transactional_id = transactional_id
        self.broken = False
        config = clients.producer_config(thread.shared, bootstrap, f"chaos-{process}", transactional_id=transactional_id)
        self.producer: Producer | None = None

        def make() -> Producer:
            producer = Producer(config)
            try:
                producer.init_transactions(TXN_TIMEOUT_S)
            except Exception:
                clients.bounded(producer.close, clients.CLOSE_S)
                raise
            self.producer = producer
            return producer

        clients.record_open(self.recorder, process, {"role": "txn-producer", "transactional_id": transactional_id}, make)

    def produce(self, sends: list[tuple[str, int]], results: list) -> None:
        assert self.producer is not None

        def delivered(i: int):
            def on_delivery(err, msg) -> None:
                results[i] = err if err is not None else msg.offset()

            return on_delivery

        for i, (k, v) in enumerate(sends):
            topic, partition = split_key(k)
            self.producer.produce(topic, value=str(v).encode(), partition=partition, on_delivery=delivered(i))
        self.producer.poll(0)

    def commit(self) -> None:
        """commit_transaction, called again while it fails retriably (a timeout); raises otherwise."""
        assert self.producer is not None
        for attempt in range(COMMIT_TRIES):
            try:
                self.producer.commit_transaction(TXN_TIMEOUT_S)
                return
            except Exception as e:
                err = error_of(e)
                if err is None or not err.retriable() or err.txn_requires_abort() or err.fatal() or attempt == COMMIT_TRIES - 1:
                    raise

    def abort(self) -> bool:
        """abort_transaction (retried while retriable); False if it could not be aborted."""
        assert self.producer is not None
        for _ in range(COMMIT_TRIES):
            try:
                self.producer.abort_transaction(TXN_TIMEOUT_S)
                self.producer.poll(0)
                return True
            except Exception as e:  # noqa: BLE001 - classified below
                err = error_of(e)
                if err is None or not err.retriable() or err.fatal():
                    break
        self.broken = True
        return False

    def ended(self, op: Op, error: BaseException, committing: bool) -> tuple[str, str]:
        """The completion type of a transaction that raised `error`, aborting it where Kafka's
        client says to: (type, reason)."""
        err = error_of(error)
        if isinstance(error, Abort) or (err is not None and err.txn_requires_abort() and not err.fatal()) or (err is None and not committing):
            return (FAIL, str(error)) if self.abort() else (INFO, f"{error}; abort failed")
        self.broken = True  # fatal (fenced), a commit that kept timing out, a state error: this instance is done
        return INFO, str(error)

    def close(self) -> None:
        producer, self.producer = self.producer, None
        if producer is not None:
            clients.record_close(self.recorder, self.process, producer.close)


class TxnProducer(ClientThread):
    """Transactions of 2-6 sends over the first two topics, ~25% aborted on purpose. Its
    transactional id comes from a pool one larger than the producers, so two threads may hold one id
    and fence each other; and now and then a new instance of its id starts while the old one is
    in a transaction (which must then fail to commit: a zombie fenced)."""

    def __init__(self, workload: TxnWorkload, name: str, bootstrap: str) -> None:
        super().__init__(workload, name)
        self.bootstrap = bootstrap
        self.client: TxnClient | None = None
        self.successor: TxnClient | None = None
        self.current: Op | None = None

    def body(self) -> None:
        workload: TxnWorkload = self.workload
        self.client = TxnClient(self, self.bootstrap, self.rng.choice(workload.transactional_ids), self.shared.process())
        left = self.rng.randint(*INSTANCE_TXNS)
        while self.pause(TXN_EVERY_S) and self.client is not None and not self.client.broken:
            left -= 1
            self.transaction(zombie=left <= 0)
            if left <= 0:
                left = self.rng.randint(*INSTANCE_TXNS)

    def transaction(self, zombie: bool = False) -> None:
        client = self.client
        assert client is not None and client.producer is not None
        keys = self.workload.keys(self.workload.topics[:2])
        sends = [(self.rng.choice(keys), self.shared.value()) for _ in range(self.rng.randint(2, 6))]
        results: list = [None] * len(sends)

        def value() -> list:
            return [["send", k, [results[i] if isinstance(results[i], int) else None, v]] for i, (k, v) in enumerate(sends)]

        op = self.current = self.recorder.invoke(client.process, "txn", [["send", k, v] for k, v in sends])
        commit_time = None
        try:
            client.producer.begin_transaction()
        except Exception as e:  # noqa: BLE001 - nothing was sent in it
            self.current = None
            self.recorder.complete(op, FAIL, value(), commit_time=None, error=str(e))
            client.broken = True
            return
        try:
            client.produce(sends, results)
            if zombie:
                # a new instance of the same id, while this one is in its transaction: its
                # init_transactions fences this one (and aborts what it has open)
                self.successor = TxnClient(self, self.bootstrap, client.transactional_id, self.shared.process())
            if self.rng.random() < ABORT_SHARE:
                raise Abort("aborted by the workload")
            client.producer.flush(clients.FLUSH_S)
            commit_time = self.recorder.now()
            client.commit()
            client.producer.poll(0)
            type, error = OK, None
        except Exception as e:  # noqa: BLE001 - classified as Kafka's transactional client does
            type, error = client.ended(op, e, committing=commit_time is not None)
        self.current = None
        extra = {"error": error} if error else {}
        self.recorder.complete(op, type, value(), commit_time=commit_time, **extra)
        if zombie and self.successor is not None:
            client.close()
            self.client, self.successor = self.successor, None

    def teardown(self) -> None:
        if self.current is not None:
            self.recorder.complete(self.current, INFO, self.current["value"], commit_time=None)
            self.current = None
        for client in (self.client, self.successor):
            if client is not None:
                client.close()
        self.client = self.successor = None


class ConsumeTransformProduce(ClientThread):
    """A read_committed member of a classic group polls the first topic; a transactional producer
    writes fresh values to the third and commits the consumer's positions in the same transaction
    (send_offsets_to_transaction with the consumer's group metadata). One "txn" op: the poll, the
    sends, then ["offsets", {"group", "offsets"}]. After an abort the consumer seeks back to its
    group's committed offsets (a "seek" op). A rebalance during the transaction aborts it (its
    positions are no longer the member's to commit); its events are recorded after the op."""

    def __init__(self, workload: TxnWorkload, name: str, bootstrap: str) -> None:
        super().__init__(workload, name)
        self.bootstrap = bootstrap
        self.group = f"chaos-{workload.run_id}-txn-ctp"
        self.consumer: RecordedConsumer | None = None
        self.client: TxnClient | None = None

    def body(self) -> None:
        workload: TxnWorkload = self.workload
        c = self.consumer = RecordedConsumer(self.shared, self.recorder, self.bootstrap, isolation="read_committed", group=self.group, mode="classic", client_id=f"chaos-{self.name}")
        self.client = TxnClient(self, self.bootstrap, f"chaos-{workload.run_id}-txn-ctp", c.process)
        c.subscribe(workload.topics[:1])
        while self.pause(CTP_EVERY_S) and not self.client.broken:
            self.transaction()

    def transaction(self) -> None:
        c, client = self.consumer, self.client
        assert c is not None and client is not None and client.producer is not None
        keys = self.workload.keys(self.workload.topics[2:])
        sends = [(self.rng.choice(keys), self.shared.value()) for _ in range(self.rng.randint(1, 3))]
        results: list = [None] * len(sends)
        polled: dict[str, list] | None = None
        offsets: dict[str, int] = {}

        def value() -> list:
            micro: list = [["poll", polled] if polled is not None else ["poll"]]
            micro += [["send", k, [results[i] if isinstance(results[i], int) else None, v]] for i, (k, v) in enumerate(sends)]
            return micro + ([["offsets", {"group": self.group, "offsets": offsets}]] if offsets else [])

        c.hold_events, c.rebalanced = True, False
        op = c.invoke("txn", [["poll"]] + [["send", k, v] for k, v in sends] + [["offsets", {"group": self.group}]])
        commit_time = None
        try:
            try:
                client.producer.begin_transaction()
            except Exception as e:  # noqa: BLE001 - nothing was read or sent in it
                c.complete(FAIL, value(), commit_time=None, error=str(e))
                client.broken = True
                return
            try:
                polled = c.consume(50, 0.5)
                client.produce(sends, results)
                offsets = {k: o for k, o in c.positions.items() if k in c.assignment}
                if c.rebalanced:
                    raise Abort("a rebalance during the transaction")
                if offsets:
                    tps = [TopicPartition(*split_key(k), o) for k, o in offsets.items()]
                    client.producer.send_offsets_to_transaction(tps, c.consumer.consumer_group_metadata(), TXN_TIMEOUT_S)
                if self.rng.random() < CTP_ABORT_SHARE:
                    raise Abort("aborted by the workload")
                client.producer.flush(clients.FLUSH_S)
                commit_time = self.recorder.now()
                client.commit()
                client.producer.poll(0)
                type, error = OK, None
            except ClientBroken as e:
                type, error = client.ended(op, e, committing=False)
                client.broken = True
            except Exception as e:  # noqa: BLE001 - classified as Kafka's transactional client does
                type, error = client.ended(op, e, committing=commit_time is not None)
            extra = {"error": error} if error else {}
            c.complete(type, value(), commit_time=commit_time, **extra)
        finally:
            c.hold_events = False
            c.flush_events()
        if type != OK and not client.broken:
            # what the aborted transaction consumed is consumed again: back to the committed offsets
            assigned = sorted(c.assignment)
            if assigned:
                committed = c.committed(assigned)
                c.seek({k: committed.get(k, 0) for k in assigned})

    def teardown(self) -> None:
        if self.consumer is not None and self.consumer.current is not None:
            self.recorder.complete(self.consumer.current, INFO, self.consumer.current["value"], commit_time=None)
            self.consumer.current = None
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None


class TxnWorkload(Workload):
    name = "txn"

    def __init__(self, run_id, rng, recorder, *, scale: float = 1.0) -> None:
        super().__init__(run_id, rng, recorder, scale=scale)
        for suffix in ("a", "b", "c"):
            self._topic(suffix, PARTITIONS)
        self.producers = 3 if scale >= 1 else 2
        # one more id than producers: two producers holding one id (fencing each other) is common, not constant
        self.transactional_ids = [f"chaos-{run_id}-txn-{i}" for i in range(self.producers + 1)]

    def threads(self, bootstrap: str) -> list[ClientThread]:
        threads: list[ClientThread] = [TxnProducer(self, f"producer-{i}", bootstrap) for i in range(self.producers)]
        threads.append(ConsumeTransformProduce(self, "ctp", bootstrap))
        threads.append(Member(self, "read-committed", bootstrap, mode="assign", group=f"chaos-{self.run_id}-txn-rc", isolation="read_committed"))
        threads.append(Member(self, "read-uncommitted", bootstrap, mode="assign", group=f"chaos-{self.run_id}-txn-ru", isolation="read_uncommitted"))
        return threads

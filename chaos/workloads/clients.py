"""The client plumbing the workloads share: process numbers and unique values for a run, librdkafka
configs with bounded timeouts and logs to a file, bounded close, a consumer that records its polls,
commits and rebalances, topic creation that retries, and the final reads of partitions and tables.

Every librdkafka call here has a timeout: a paused broker must not hold a client thread forever, and
close (which can hang in librdkafka) runs in a daemon thread the caller stops waiting for.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import re
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from chaos.history import FAIL, INFO, OK, Op, Recorder, key_of, split_key

STOP_JOIN_S = 60.0  # the longest stop() waits for all of a workload's threads together
CLOSE_S = 10.0  # a client's close, before it is abandoned (close recorded as info)
REQUEST_TIMEOUT_MS = 10_000
MESSAGE_TIMEOUT_MS = 20_000  # an idempotent send is acknowledged or reported failed within this
FLUSH_S = MESSAGE_TIMEOUT_MS / 1000 + 10  # every delivery report is in by then, unless librdkafka is stuck
ADMIN_S = 10.0
CREATE_TOPICS_S = 180.0
TABLE_NAMESPACE = "neve"  # the compactor's default namespace (compactor/config.py)

# Errors of a commit that say the coordinator refused it: the offsets were certainly not committed.
# Anything else (a timeout, a lost connection, a coordinator moving) leaves the outcome unknown.
COMMIT_REFUSED = {
    KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS, KafkaError.FENCED_INSTANCE_ID,
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.OFFSET_METADATA_TOO_LARGE, KafkaError.INVALID_COMMIT_OFFSET_SIZE, KafkaError._NO_OFFSET, KafkaError._STATE,
    KafkaError._INVALID_ARG, KafkaError._ASSIGNMENT_LOST, KafkaError._UNKNOWN_PARTITION,
    getattr(KafkaError, "FENCED_MEMBER_EPOCH", -9999), getattr(KafkaError, "STALE_MEMBER_EPOCH", -9999),
}  # fmt: skip


class Shared:
    """What every workload of a run shares through its recorder: process numbers and record values
    (unique in the run, so several workloads on one history never collide) and the clients' log."""

    _by_recorder: weakref.WeakKeyDictionary[Recorder, Shared] = weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    def __init__(self, recorder: Recorder) -> None:
        # a worker process records on a range of its own (chaos/workloads/worker.py)
        self._processes = itertools.count(recorder.id_base)
        self._values = itertools.count(recorder.id_base + 1)
        self._lock = threading.Lock()
        self.log = logging.getLogger(f"chaos.clients.{id(recorder):x}")
        self.log.propagate = False
        self.log.setLevel(logging.INFO)
        if not self.log.handlers:
            handler = logging.FileHandler(recorder.path.parent / "clients.log", encoding="utf-8")
            handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(levelname)s %(message)s"))
            self.log.addHandler(handler)

    @classmethod
    def of(cls, recorder: Recorder) -> Shared:
        with cls._lock:
            shared = cls._by_recorder.get(recorder)
            if shared is None:
                shared = cls._by_recorder[recorder] = cls(recorder)
            return shared

    def process(self) -> int:
        with self._lock:
            return next(self._processes)

    def value(self) -> int:
        with self._lock:
            return next(self._values)


# -- configs --------------------------------------------------------------------------------------


def base_config(shared: Shared, bootstrap: str, client_id: str, on_error: Callable[[KafkaError], None] | None = None) -> dict[str, Any]:
    def error_cb(err: KafkaError) -> None:
        shared.log.warning("%s: error %s (fatal=%s)", client_id, err, err.fatal())
        if on_error is not None:
            on_error(err)

    return {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "logger": shared.log,
        "error_cb": error_cb,
        "socket.timeout.ms": REQUEST_TIMEOUT_MS,
        "socket.connection.setup.timeout.ms": REQUEST_TIMEOUT_MS,
        "reconnect.backoff.ms": 100,
        "reconnect.backoff.max.ms": 2000,
        "topic.metadata.refresh.interval.ms": 10_000,
    }


def producer_config(shared: Shared, bootstrap: str, client_id: str, on_error=None, transactional_id: str | None = None) -> dict[str, Any]:
    config = base_config(shared, bootstrap, client_id, on_error) | {
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "request.timeout.ms": REQUEST_TIMEOUT_MS,
        "message.timeout.ms": MESSAGE_TIMEOUT_MS,
        "retry.backoff.ms": 100,
    }
    if transactional_id is not None:
        # a short transaction timeout: the coordinator aborts what an abandoned instance left open
        # soon, so read_committed readers (and the final read) are not held behind it for long
        config |= {"transactional.id": transactional_id, "transaction.timeout.ms": MESSAGE_TIMEOUT_MS}  # librdkafka: not below message.timeout.ms
    return config


def consumer_config(shared: Shared, bootstrap: str, client_id: str, group: str, isolation: str, mode: str, on_error=None) -> dict[str, Any]:
    config = base_config(shared, bootstrap, client_id, on_error) | {
        "group.id": group,
        "isolation.level": isolation,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 200,
    }
    if mode == "consumer":
        config["group.protocol"] = "consumer"
    elif mode == "classic":
        config |= {"group.protocol": "classic", "session.timeout.ms": 10_000, "heartbeat.interval.ms": 1000, "max.poll.interval.ms": 60_000}
    return config


# -- bounded calls --------------------------------------------------------------------------------


def bounded(fn: Callable[[], Any], timeout: float, name: str = "close") -> bool:
    """Run fn in a daemon thread and wait at most `timeout`: True if it returned (raising counts as
    returned), False if it is still running (abandoned)."""
    thread = threading.Thread(target=_quietly, args=(fn,), name=f"chaos-{name}", daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive()


# librdkafka's Python binding warns when a fenced or failed producer's close cannot abort its open
# transaction: the workload records that close itself, the warning would only fill the terminal.
warnings.filterwarnings("ignore", message="Producer abort_transaction failed during close", category=RuntimeWarning)


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - a close that fails has still ended the client
        pass


def record_close(recorder: Recorder, process: int, close: Callable[[], Any], timeout: float = CLOSE_S) -> None:
    op = recorder.invoke(process, "close")
    recorder.complete(op, OK if bounded(close, timeout) else INFO)


def record_open(recorder: Recorder, process: int, value: dict[str, Any], make: Callable[[], Any]) -> Any:
    """Open a client as an "open" op: the client, or raises (recorded as fail)."""
    op = recorder.invoke(process, "open", value)
    try:
        client = make()
    except Exception as e:
        recorder.complete(op, FAIL, value, error=str(e))
        raise
    recorder.complete(op, OK, value)
    return client


def error_of(e: BaseException) -> KafkaError | None:
    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        return e.args[0]
    return None


def decode(value: bytes | None) -> int | str | None:
    """A record value as the history writes it: the int it spells, None for a tombstone, the text
    itself if it is not an int (which the checker will name)."""
    if value is None:
        return None
    text = value.decode("utf-8", "replace")
    try:
        return int(text)
    except ValueError:
        return text


def entry(msg: Message, keyed: bool) -> list:
    record_key = msg.key()
    return [msg.offset(), decode(msg.value())] + ([record_key.decode("utf-8", "replace") if record_key is not None else None] if keyed else [])


# -- topics ---------------------------------------------------------------------------------------


def create_topics(bootstrap: str, partitions: Mapping[str, int], configs: Mapping[str, Mapping[str, str]], shared: Shared, timeout: float = CREATE_TOPICS_S) -> None:
    """Create the topics, retrying while the cluster is faulty; one that exists already is fine."""
    admin = AdminClient(base_config(shared, bootstrap, "chaos-admin"))
    deadline = time.monotonic() + timeout
    missing = dict(partitions)
    last: BaseException | None = None
    while missing and time.monotonic() < deadline:
        futures = admin.create_topics([NewTopic(t, n, 1, config=dict(configs.get(t, {}))) for t, n in missing.items()], operation_timeout=ADMIN_S, request_timeout=ADMIN_S)
        for topic, future in futures.items():
            try:
                future.result(ADMIN_S + 5)
                missing.pop(topic)
            except KafkaException as e:
                err = error_of(e)
                if err is not None and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    missing.pop(topic)
                else:
                    last = e
            except Exception as e:  # noqa: BLE001 - a future that timed out: try again
                last = e
        if missing:
            time.sleep(1)
    if missing:
        raise RuntimeError(f"topics not created in {timeout}s: {sorted(missing)}: {last}")


# -- a consumer that records what it does ---------------------------------------------------------


class ClientBroken(Exception):
    """The client can no longer be used (a fatal error, a call that raised): close and reopen it."""


class RecordedConsumer:
    """A librdkafka consumer as one history process: "open", "assign"/"subscribe", "poll",
    "commit", the rebalance callbacks as "rebalance" info events, "seek", "close".

    A rebalance callback runs inside consume(), while the poll op is outstanding; an event recorded
    then would be read as the poll's completion. So the callback completes the poll first (ok, no
    records) and consume()'s records go to a new poll op invoked after the event: they are read
    after the rebalance in the history, where the checker lets a poll start anywhere. While a
    transaction op is outstanding (hold_events) the events wait until it completes."""

    def __init__(self, shared: Shared, recorder: Recorder, bootstrap: str, *, isolation: str, group: str, mode: str, client_id: str, keyed: bool = False) -> None:
        self.shared = shared
        self.recorder = recorder
        self.process = shared.process()
        self.isolation = isolation
        self.group = group
        self.mode = mode
        self.keyed = keyed
        self.current: Op | None = None
        self.hold_events = False
        self.closing = False
        self.pending: list[dict] = []
        self.rebalanced = False  # a rebalance event since the flag was last cleared
        self.fatal = False
        self.assignment: set[str] = set()
        self.positions: dict[str, int] = {}  # next offset of each key, by the records consumed
        value = {"role": "consumer", "isolation": isolation, "group": group, "mode": mode}
        config = consumer_config(shared, bootstrap, client_id, group, isolation, mode, on_error=self._on_error)
        self.consumer = record_open(recorder, self.process, value, lambda: Consumer(config))

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self.fatal = True

    # -- ops --------------------------------------------------------------------------------------

    def invoke(self, f: str, value: Any = None) -> Op:
        self.current = self.recorder.invoke(self.process, f, value)
        return self.current

    def complete(self, type: str, value: Any = None, **extra: Any) -> None:
        op, self.current = self.current, None
        if op is not None:
            self.recorder.complete(op, type, value, **extra)
        if not self.hold_events:
            self.flush_events()

    def flush_events(self) -> None:
        while self.pending and self.current is None:
            self.recorder.record(self.process, INFO, "rebalance", self.pending.pop(0))

    def _event(self, value: dict) -> None:
        self.rebalanced = True
        if self.closing:
            return  # the revoke of close(): the process is ending, its close op is outstanding
        if self.hold_events or (self.current is not None and self.current["f"] != "poll"):
            self.pending.append(value)
            return
        if self.current is not None:
            self.recorder.complete(self.current, OK, [["poll", {}]])
            self.current = None
        self.flush_events()
        self.recorder.record(self.process, INFO, "rebalance", value)

    def on_assign(self, consumer, partitions: list[TopicPartition]) -> None:
        keys = [key_of(tp.topic, tp.partition) for tp in partitions]
        self.assignment.update(keys)
        for k in keys:
            self.positions.pop(k, None)
        self._event({"assigned": keys})

    def on_revoke(self, consumer, partitions: list[TopicPartition]) -> None:
        keys = [key_of(tp.topic, tp.partition) for tp in partitions]
        self.assignment.difference_update(keys)
        for k in keys:
            self.positions.pop(k, None)
        self._event({"revoked": keys})

    def subscribe(self, topics: list[str]) -> None:
        self.invoke("subscribe", list(topics))
        try:
            self.consumer.subscribe(list(topics), on_assign=self.on_assign, on_revoke=self.on_revoke, on_lost=self.on_revoke)
        except Exception as e:
            self.complete(FAIL, list(topics), error=str(e))
            raise ClientBroken(str(e)) from e
        self.complete(OK, list(topics))

    def assign(self, keys: list[str], offsets: Mapping[str, int] | None = None) -> None:
        self.invoke("assign", list(keys))
        tps = [TopicPartition(*split_key(k), (offsets or {}).get(k, OFFSET_BEGINNING)) for k in keys]
        try:
            self.consumer.assign(tps)
        except Exception as e:
            self.complete(FAIL, list(keys), error=str(e))
            raise ClientBroken(str(e)) from e
        self.assignment = set(keys)
        self.positions = {}
        self.complete(OK, list(keys))

    def consume(self, max_messages: int, timeout: float) -> dict[str, list]:
        """consume() as the caller's current op's poll: {key: [[offset, v], ...]} in the order returned.
        Raises ClientBroken (the op completed as info) if the consumer failed."""
        try:
            msgs = self.consumer.consume(num_messages=max_messages, timeout=timeout)
        except Exception as e:
            raise ClientBroken(str(e)) from e
        records: dict[str, list] = {}
        for msg in msgs:
            err = msg.error()
            if err is not None:
                self.shared.log.info("consumer %d: %s", self.process, err)
                if err.fatal():
                    self.fatal = True
                continue
            k = key_of(msg.topic(), msg.partition())
            records.setdefault(k, []).append(entry(msg, self.keyed))
            self.positions[k] = msg.offset() + 1
        return records

    def poll(self, max_messages: int = 50, timeout: float = 0.5) -> dict[str, list]:
        self.invoke("poll", [["poll"]])
        try:
            records = self.consume(max_messages, timeout)
        except ClientBroken as e:
            if self.current is None:
                self.invoke("poll", [["poll"]])
            self.complete(INFO, [["poll"]], error=str(e))
            raise
        if self.current is None:  # a rebalance event completed the poll; what consume() returned is read after it
            self.invoke("poll", [["poll"]])
        self.complete(OK, [["poll", records]])
        if self.fatal:
            raise ClientBroken("fatal error")
        return records

    def commit(self) -> None:
        """A synchronous commit of the consumed positions of the assigned partitions, as a "commit" op."""
        offsets = {k: o for k, o in self.positions.items() if k in self.assignment}
        if not offsets:
            return
        value = {"group": self.group, "offsets": offsets}
        self.invoke("commit", value)
        try:
            result = self.consumer.commit(offsets=[TopicPartition(*split_key(k), o) for k, o in offsets.items()], asynchronous=False)
        except KafkaException as e:
            err = error_of(e)
            self.complete(FAIL if err is not None and err.code() in COMMIT_REFUSED else INFO, value, error=str(e))
            return
        except Exception as e:  # noqa: BLE001 - a closed or broken client
            self.complete(INFO, value, error=str(e))
            raise ClientBroken(str(e)) from e
        errors = [tp.error for tp in result or () if tp.error is not None]
        if not errors:
            self.complete(OK, value)
        elif all(err.code() in COMMIT_REFUSED for err in errors):
            self.complete(FAIL, value, error=str(errors[0]))
        else:
            self.complete(INFO, value, error=str(errors[0]))

    def committed(self, keys: list[str], timeout: float = ADMIN_S) -> dict[str, int]:
        tps = self.consumer.committed([TopicPartition(*split_key(k)) for k in keys], timeout=timeout)
        return {key_of(tp.topic, tp.partition): tp.offset for tp in tps if tp.error is None and tp.offset >= 0}

    def seek(self, offsets: Mapping[str, int]) -> None:
        self.invoke("seek", dict(offsets))
        try:
            for k, o in offsets.items():
                self.consumer.seek(TopicPartition(*split_key(k), o))
        except Exception as e:
            self.complete(INFO, dict(offsets), error=str(e))
            raise ClientBroken(str(e)) from e
        for k, o in offsets.items():
            self.positions[k] = o
        self.complete(OK, dict(offsets))

    def close(self) -> None:
        if self.current is not None:  # abandoned mid-op
            self.recorder.complete(self.current, INFO, self.current["value"])
            self.current = None
        self.hold_events = False
        self.flush_events()
        self.closing = True
        record_close(self.recorder, self.process, self.consumer.close)


def group_offsets(admin: AdminClient, group: str, timeout: float = ADMIN_S) -> dict[str, int]:
    """A group's committed offsets read with the admin client: {key: offset}."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)], request_timeout=timeout)
    result = futures[group].result(timeout + 5)
    return {key_of(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions if tp.error is None and tp.offset >= 0}


# -- the client threads ---------------------------------------------------------------------------


class ClientThread(threading.Thread):
    """A workload's client: runs `body` until the workload stops, reopening its clients (as new
    processes) after an unexpected error; `pause` paces it and returns False once it should stop."""

    def __init__(self, workload, name: str) -> None:
        super().__init__(name=f"chaos-{workload.name}-{name}", daemon=True)
        self.workload = workload
        self.recorder: Recorder = workload.recorder
        self.shared: Shared = workload.shared
        self.stopping: threading.Event = workload._stop
        self.rng = random.Random(workload.rng.getrandbits(64))
        self.scale = workload.scale

    def pause(self, seconds: float) -> bool:
        """Wait `seconds` scaled down by the workload's scale (jittered); False once stopping."""
        return not self.stopping.wait(seconds * self.rng.uniform(0.5, 1.5) / self.scale)

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.body()
            except Exception:
                self.shared.log.exception("%s: unexpected error; reopening its clients", self.name)
            finally:
                try:
                    self.teardown()
                except Exception:
                    self.shared.log.exception("%s: teardown", self.name)
            if not self.stopping.is_set():
                self.stopping.wait(1.0)

    def body(self) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        """Complete what is outstanding as info and close the clients (bounded)."""


# -- the reads after the heal ---------------------------------------------------------------------


def final_read(bootstrap: str, recorder: Recorder, shared: Shared, partitions: Mapping[str, int], isolation: str, deadline: float, *, keyed: bool = False) -> dict[str, list] | None:
    """One "final-read" op: every partition from offset 0 up to the end offset seen when its read
    began (the last stable offset for read_committed), by a fresh consumer, retrying (with a fresh
    consumer, from where it got) while faults clear. ok with every partition read to its end; info
    with what it read if the deadline came first (`incomplete` names the partitions)."""
    process = shared.process()
    op = recorder.invoke(process, "final-read", {"isolation": isolation})
    keys = [key_of(t, p) for t, n in partitions.items() for p in range(n)]
    records: dict[str, list] = {k: [] for k in keys}
    ends: dict[str, int] = {}
    done: set[str] = set()
    group = f"chaos-final-{uuid_hex(shared)}"
    while len(done) < len(keys) and time.monotonic() < deadline:
        consumer = None
        try:
            # partition EOF events say when the fetch position passed the end: a partition ending
            # in control records (transaction markers) or aborted records has no last message to see
            config = consumer_config(shared, bootstrap, f"chaos-final-{process}", group, isolation, "assign") | {"enable.partition.eof": True}
            consumer = Consumer(config)
            for k in keys:
                if k not in ends:
                    ends[k] = consumer.get_watermark_offsets(TopicPartition(*split_key(k)), timeout=ADMIN_S, cached=False)[1]
            for k in keys:
                if ends[k] <= 0 or (records[k] and records[k][-1][0] + 1 >= ends[k]):
                    done.add(k)
            todo = [k for k in keys if k not in done]
            consumer.assign([TopicPartition(*split_key(k), records[k][-1][0] + 1 if records[k] else OFFSET_BEGINNING) for k in todo])
            checked = time.monotonic()
            while len(done) < len(keys) and time.monotonic() < deadline:
                for msg in consumer.consume(num_messages=500, timeout=0.5):
                    k = key_of(msg.topic(), msg.partition())
                    if msg.error() is not None:
                        if msg.error().code() == KafkaError._PARTITION_EOF and k in ends and msg.offset() >= ends[k]:
                            done.add(k)
                        continue
                    if k in done or (records[k] and msg.offset() <= records[k][-1][0]):
                        continue
                    records[k].append(entry(msg, keyed))
                    if msg.offset() + 1 >= ends[k]:
                        done.add(k)
                if time.monotonic() - checked > 1.0:
                    checked = time.monotonic()
                    for tp in consumer.position([TopicPartition(*split_key(k)) for k in keys if k not in done]):
                        if tp.offset >= ends[key_of(tp.topic, tp.partition)]:
                            done.add(key_of(tp.topic, tp.partition))
        except Exception as e:  # noqa: BLE001 - a fault not cleared yet: a fresh consumer, from where this one got
            shared.log.info("final read (%s): %s; retrying", isolation, e)
            time.sleep(1.0)
        finally:
            if consumer is not None:
                bounded(consumer.close, CLOSE_S)
    value = {"isolation": isolation, "records": records}
    if len(done) == len(keys):
        recorder.complete(op, OK, value, ends=ends)
        return records
    recorder.complete(op, INFO, value, ends=ends, incomplete=sorted(set(keys) - done))
    return records


def uuid_hex(shared: Shared) -> str:
    return f"{shared.value()}-{random.getrandbits(32):08x}"


def table_identifier(topic: str, namespace: str = TABLE_NAMESPACE) -> str:
    """The topic's table as the compactor names it (table/names.py: every character outside
    [A-Za-z0-9_] made `_`)."""
    return f"{namespace}.{re.sub(r'[^A-Za-z0-9_]', '_', topic)}"


def table_coverage(table, rows: Mapping[int, list]) -> dict[int, int]:
    """The last Kafka offset of each partition the table has taken in: the compactor's committed
    table property (`neve.committed.<topic id>`: {partition: [last offset, manifest]}), which also
    covers what left no row (tombstones, superseded records, transaction markers), else the last row."""
    covered = {p: r[-1][0] for p, r in rows.items() if r}
    for name, value in table.properties.items():
        if name.startswith("neve.committed."):
            try:
                for p, (last, *_) in json.loads(value).items():
                    covered[int(p)] = max(covered.get(int(p), -1), int(last))
            except (ValueError, TypeError):
                pass
    return covered


def table_read(catalog, recorder: Recorder, process: int, topic: str, wanted: Mapping[str, int], deadline: float, *, keyed: bool = False) -> None:
    """One "table-read" op of the topic's Iceberg table, read with pyiceberg once it covers `wanted`
    ({key: the Kafka view's last offset}) or at the deadline, whichever is first."""
    op = recorder.invoke(process, "table-read", {"topic": topic})
    identifier = table_identifier(topic)
    rows: dict[str, list] | None = None
    complete = False
    error = None
    while True:
        try:
            table = catalog.load_table(identifier)
            columns = ("kafka", "key_raw", "value_raw")
            by_partition: dict[int, list] = {}
            for row in table.scan(selected_fields=columns).to_arrow().to_pylist():
                kafka = row["kafka"]
                item = [kafka["offset"], decode(row["value_raw"])]
                if keyed:
                    item.append(row["key_raw"].decode("utf-8", "replace") if row["key_raw"] is not None else None)
                by_partition.setdefault(kafka["partition"], []).append(item)
            for items in by_partition.values():
                items.sort(key=lambda item: item[0])
            covered = table_coverage(table, by_partition)
            rows = {key_of(topic, p): items for p, items in sorted(by_partition.items())}
            complete = all(covered.get(split_key(k)[1], -1) >= last for k, last in wanted.items())
        except Exception as e:  # noqa: BLE001 - no table yet, a catalog or S3 hiccup: wait and read again
            error = f"{type(e).__name__}: {e}"
        if complete or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    if rows is None:
        recorder.complete(op, INFO, {"topic": topic, "rows": {}, "complete": False}, error=error)
    else:
        recorder.complete(op, OK, {"topic": topic, "rows": rows, "complete": complete})

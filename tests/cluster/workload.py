"""The load and the checker of the cluster tests.

Producers are librdkafka clients, each in its own thread, writing values `<producer>:<seq>` to
partition seq % partitions and remembering every delivery report. The checker reads every
partition from one chosen broker (its zone in client.id makes Metadata name only that broker, so
every Fetch goes there) and `check_log` compares what each broker served with what was
acknowledged, naming the first differences instead of answering "not equal".
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.fixtures import NeveNode
from tests.raw import Raw, metadata_v12


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> float:
    """Poll `predicate` until it is truthy; returns the seconds it took, fails after `timeout`."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def file_logger(path: Path) -> logging.Logger:
    """A logger writing to `path` only (librdkafka's log lines go there, not to the test output)."""
    logger = logging.getLogger(f"cluster-test.{path}")
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.FileHandler(path))
    return logger


def create_topic(bootstrap: str, partitions: int, prefix: str = "t") -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)], operation_timeout=30)[topic].result(timeout=30)
    return topic


def metadata_brokers(bootstrap: str, client_id: str = "checker", timeout: float = 5.0, log_dir: Path | None = None) -> dict[int, str]:
    """The brokers a Metadata answer lists, by node id, as host:port."""
    config = {"bootstrap.servers": bootstrap, "client.id": client_id}
    if log_dir is not None:
        config["logger"] = file_logger(log_dir / "librdkafka-metadata.log")
    admin = AdminClient(config)
    md = admin.list_topics(timeout=timeout)
    return {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}


def brokers_listed_by(node: NeveNode) -> set[int]:
    """The node ids that `node` itself lists in its Metadata answer, asked over a raw connection
    to it. `metadata_brokers` cannot ask one broker: librdkafka sends an application's Metadata
    request to any broker that is up, not necessarily the one it bootstrapped from."""
    raw = Raw(node.port)
    try:
        cid = raw.request(metadata_v12(), client_id="checker")
        return {b.node_id for b in raw.response(3, 12, cid).brokers}
    finally:
        raw.close()


# -- producers ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProducerSpec:
    name: str
    zone: str
    idempotent: bool

    @property
    def client_id(self) -> str:
        return f"{self.name},zone_id={self.zone}"


@dataclass
class LoadProducer:
    """One librdkafka producer sending `count` records from its own thread, `rate` records per
    second (None: as fast as the client takes them; it may be changed while sending). Delivery
    reports are kept per sequence."""

    spec: ProducerSpec
    bootstrap: str
    topic: str
    count: int
    partitions: int
    log_dir: Path
    rate: float | None = None
    value_bytes: int = 0  # pad values to this size with "|xxx..." after "<producer>:<seq>"
    config: dict = field(default_factory=dict)
    flush_timeout: float = 120.0
    acks: dict[int, tuple[int, int]] = field(default_factory=dict)  # seq -> (partition, offset)
    acked_at: dict[int, float] = field(default_factory=dict)  # seq -> monotonic time of its report
    failures: dict[int, KafkaError] = field(default_factory=dict)  # seq -> delivery error
    client_errors: list[KafkaError] = field(default_factory=list)  # error_cb: retriable or fatal
    last_ack_at: dict[int, float] = field(default_factory=dict)  # partition -> monotonic time of its latest ack
    sent: int = 0
    unflushed: int = -1
    crashed: BaseException | None = None

    def __post_init__(self) -> None:
        self.producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": self.spec.client_id,
                "enable.idempotence": self.spec.idempotent,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": int(self.flush_timeout * 1000),
                "logger": file_logger(self.log_dir / f"librdkafka-{self.spec.name}.log"),
                "error_cb": self.client_errors.append,
                **self.config,
            }
        )
        self.thread = threading.Thread(target=self._run, name=f"producer-{self.spec.name}", daemon=True)
        self._stop = threading.Event()

    @property
    def fatal_errors(self) -> list[KafkaError]:
        return [e for e in self.client_errors if e.fatal()]

    def value(self, seq: int) -> bytes:
        head = f"{self.spec.name}:{seq}".encode()
        pad = self.value_bytes - len(head) - 1
        return head + b"|" + b"x" * pad if pad >= 0 else head

    def _on_delivery(self, err: KafkaError | None, msg) -> None:
        seq = int(msg.value().split(b":", 1)[1].split(b"|", 1)[0])
        if err is not None:
            self.failures[seq] = err
        else:
            self.acks[seq] = (msg.partition(), msg.offset())
            self.acked_at[seq] = self.last_ack_at[msg.partition()] = time.monotonic()

    def start(self) -> LoadProducer:
        self.thread.start()
        return self

    def stop_sending(self) -> None:
        """Send no further records (those already sent are still delivered)."""
        self._stop.set()

    def _run(self) -> None:
        try:
            due = time.monotonic()  # when the next record is due; `rate` may change while sending
            for seq in range(self.count):
                if self._stop.is_set():
                    break
                if self.rate is not None:
                    ahead = due - time.monotonic()
                    if ahead > 0:
                        self.producer.poll(ahead)
                    due += 1 / self.rate
                while True:
                    try:
                        self.producer.produce(self.topic, value=self.value(seq), partition=seq % self.partitions, on_delivery=self._on_delivery)
                        break
                    except BufferError:
                        self.producer.poll(0.05)
                self.sent = seq + 1
                self.producer.poll(0)
            self.unflushed = self.producer.flush(self.flush_timeout)
        except BaseException as e:  # reported by join()
            self.crashed = e

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"producer {self.spec.name} still running after {timeout}s ({len(self.acks)} acked of {self.sent} sent)"
        assert self.crashed is None, f"producer {self.spec.name} crashed: {self.crashed!r}"
        assert self.unflushed == 0, f"producer {self.spec.name}: {self.unflushed} records undelivered after flush"

    def leaders(self, timeout: float = 10.0) -> tuple[dict[int, int], set[int]]:
        """From this producer's own Metadata view: the leader per partition and the brokers listed."""
        md = self.producer.list_topics(self.topic, timeout=timeout)
        return {p: pm.leader for p, pm in md.topics[self.topic].partitions.items()}, set(md.brokers)


def start_producers(specs, bootstrap: str, topic: str, count: int, partitions: int, log_dir: Path, **kwargs) -> list[LoadProducer]:
    """Create every producer first, then start them together."""
    producers = [LoadProducer(s, bootstrap, topic, count, partitions, log_dir, **kwargs) for s in specs]
    for p in producers:
        p.start()
    return producers


def finish(producers: list[LoadProducer], count: int, timeout: float) -> None:
    """Wait for every producer to end and assert each had all `count` records acknowledged."""
    for p in producers:
        p.join(timeout=timeout)
    for p in producers:
        assert not p.fatal_errors, f"{p.spec.name}: fatal errors {p.fatal_errors}"
        assert not p.failures, f"{p.spec.name}: {len(p.failures)} delivery failures, first {next(iter(p.failures.items()))}"
        assert len(p.acks) == count


def six_producers() -> list[ProducerSpec]:
    """Two producers per zone, one idempotent and one not."""
    return [ProducerSpec(f"p{zone}{'i' if idem else 'n'}", zone, idem) for zone in "abc" for idem in (True, False)]


# -- reading back ---------------------------------------------------------------------------------

Log = dict[int, list[tuple[int, bytes]]]  # partition -> [(offset, value)] in offset order


def read_from_broker(node: NeveNode, node_id: int, zone: str, topic: str, partitions: int, log_dir: Path, timeout: float = 60.0) -> tuple[Log, dict[int, int]]:
    """Every record of every partition as `node` serves it (assigned from offset 0, up to the high
    watermark it reports), and those high watermarks. Asserts that the consumer's Metadata named
    `node` the leader of every partition, so no other broker served a byte."""
    consumer = Consumer(
        {
            "bootstrap.servers": node.bootstrap,
            "client.id": f"checker-{node_id},zone_id={zone}",
            "group.id": f"checker-{uuid.uuid4().hex[:8]}",  # required by the client; assign() never joins
            "enable.auto.commit": False,
            "logger": file_logger(log_dir / f"librdkafka-checker-{node_id}.log"),
        }
    )
    try:
        md = consumer.list_topics(topic, timeout=10)
        leaders = {p: pm.leader for p, pm in md.topics[topic].partitions.items()}
        assert leaders == {p: node_id for p in range(partitions)}, f"checker of broker {node_id} was given leaders {leaders}"
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        log: Log = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + timeout
        while any(len(log[p]) < ends[p] for p in log):
            assert time.monotonic() < deadline, f"broker {node_id}: read {[len(log[p]) for p in log]} records of {ends} in {timeout}s"
            for msg in consumer.consume(10_000, timeout=0.5):
                assert msg.error() is None, f"broker {node_id}: consume error {msg.error()}"
                if msg.offset() < ends[msg.partition()]:
                    log[msg.partition()].append((msg.offset(), msg.value()))
        return log, ends
    finally:
        consumer.close()


def read_everywhere(nodes: dict[int, tuple[NeveNode, str]], topic: str, partitions: int, log_dir: Path) -> Log:
    """Read every partition from every broker in `nodes` ({node id: (node, zone)}); assert every
    broker serves the same high watermarks and the same records at the same offsets; returns the
    one log they all agree on."""
    logs = {nid: read_from_broker(node, nid, zone, topic, partitions, log_dir) for nid, (node, zone) in nodes.items()}
    (first, (reference, ref_ends)), *others = logs.items()
    for nid, (log, ends) in others:
        assert ends == ref_ends, f"high watermarks: broker {nid} {ends}, broker {first} {ref_ends}"
        for p in range(partitions):
            if log[p] != reference[p]:
                i = next((i for i, (a, b) in enumerate(zip(log[p], reference[p])) if a != b), min(len(log[p]), len(reference[p])))
                raise AssertionError(
                    f"partition {p}: broker {nid} and broker {first} differ at position {i}: "
                    f"{log[p][i:i + 3]} vs {reference[p][i:i + 3]} ({len(log[p])} vs {len(reference[p])} records)"
                )
    return reference


# -- the check ------------------------------------------------------------------------------------


@dataclass
class LogCheck:
    records: int
    duplicates: dict[str, int]  # producer -> extra copies of its records (non-exact producers only)
    unacked_present: dict[str, int]  # producer -> records stored whose delivery was not reported ok


def check_log(log: Log, producers: list[LoadProducer], exact: Callable[[LoadProducer], bool] = lambda p: True, ordered: Callable[[LoadProducer], bool] = lambda p: True, limit: int = 10) -> LogCheck:
    """Assert, for the log every broker agreed on: offsets are 0, 1, 2, ... in every partition; every
    value is `<known producer>:<seq>` in partition seq % partitions; every acknowledged record is
    present at its acknowledged offset. Producers for which `exact` holds have every record at most
    once (and acknowledged ones exactly once); others may have duplicates, which are counted.
    Producers for which `ordered` holds have their records in sequence order within each
    partition (first copies, for producers allowed duplicates)."""
    by_name = {p.spec.name: p for p in producers}
    partitions = len(log)
    problems: list[str] = []
    where: dict[str, dict[int, list[tuple[int, int]]]] = {name: defaultdict(list) for name in by_name}
    for part, records in log.items():
        offsets = [o for o, _ in records]
        if offsets != list(range(len(records))):
            bad = next(i for i, o in enumerate(offsets) if o != i)
            problems.append(f"partition {part}: offsets not gap-free from 0; position {bad} holds offset {offsets[bad]}")
        for offset, value in records:
            name, _, rest = (value or b"").decode(errors="replace").partition(":")
            seq_text = rest.partition("|")[0]
            if name not in by_name or not seq_text.isdigit() or value != by_name[name].value(int(seq_text)):
                problems.append(f"partition {part} offset {offset}: foreign value {value!r}")
                continue
            seq = int(seq_text)
            if seq % partitions != part or seq >= by_name[name].count:
                problems.append(f"partition {part} offset {offset}: {value!r} does not belong in this partition")
                continue
            where[name][seq].append((part, offset))
    duplicates: dict[str, int] = {}
    unacked: dict[str, int] = {}
    for name, producer in by_name.items():
        copies = where[name]
        for seq, (part, offset) in sorted(producer.acks.items()):
            found = copies.get(seq, [])
            if not found:
                problems.append(f"{name}:{seq} acknowledged at partition {part} offset {offset} but missing")
            elif offset is None:
                # librdkafka acknowledges some records without an offset: an idempotent producer's
                # batch whose request timed out is reported delivered, offset unknown, once a later
                # batch's acknowledgement (or the broker's answer to its retry) proves it stored.
                # It must still be stored on the partition it was acknowledged for.
                if not any(p == part for p, _ in found):
                    problems.append(f"{name}:{seq} acknowledged at partition {part} without an offset but stored at {found}")
            elif (part, offset) not in found:
                problems.append(f"{name}:{seq} acknowledged at partition {part} offset {offset} but stored at {found}")
            if len(problems) >= limit:
                break
        extra = sum(len(c) - 1 for c in copies.values())
        if exact(producer) and extra:
            dup = sorted((seq, c) for seq, c in copies.items() if len(c) > 1)
            problems.append(f"{name} (idempotent={producer.spec.idempotent}): {extra} duplicate copies, first {dup[:3]}")
        duplicates[name] = extra
        unacked[name] = sum(1 for seq in copies if seq not in producer.acks)
        if ordered(producer):
            for part in range(partitions):
                firsts = sorted((min(o for pp, o in c if pp == part), seq) for seq, c in copies.items() if any(pp == part for pp, _ in c))
                seqs = [seq for _, seq in firsts]
                bad = next((i for i in range(1, len(seqs)) if seqs[i] <= seqs[i - 1]), None)
                if bad is not None:
                    problems.append(f"{name}: partition {part} out of order at offset {firsts[bad][0]}: seq {seqs[bad - 1]} then {seqs[bad]}")
    assert not problems, f"{sum(len(r) for r in log.values())} records; first problems:\n  " + "\n  ".join(problems[:limit])
    return LogCheck(sum(len(r) for r in log.values()), duplicates, unacked)


# -- looking inside ---------------------------------------------------------------------------------


def s3_client(cluster):
    """A boto3 S3 client of the cluster's SeaweedFS (path-style addressing, few retries)."""
    import boto3
    from botocore.config import Config as BotoConfig

    from tests.fixtures import S3_KEY, S3_SECRET

    return boto3.client(
        "s3",
        endpoint_url=cluster.s3.endpoint,
        aws_access_key_id=S3_KEY,
        aws_secret_access_key=S3_SECRET,
        region_name="us-east-1",
        config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
    )


def objects_holding(metadata_url: str, topic: str, records: set[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """From the offset index in etcd: the key of the object holding each (partition, offset)."""
    from urllib.parse import urlparse

    from metadata.etcd import EtcdMetadataStore

    url = urlparse(metadata_url)

    async def read() -> dict[tuple[int, int], str]:
        store = EtcdMetadataStore(url.hostname, url.port, root=url.path.strip("/"))
        await store.start()
        try:
            topic_id = store.topics()[topic].topic_id
            out = {}
            for partition, offset in records:
                entry = store.entries(topic_id, partition, offset, max_entries=1)[0]
                assert entry.base_offset <= offset <= entry.last_offset, f"no index entry holds {partition}/{offset}"
                out[(partition, offset)] = entry.object_key
            return out
        finally:
            await store.close()

    return asyncio.run(read())


def writers_by_partition(metadata_url: str, topic: str) -> dict[int, dict[int, tuple[int, int]]]:
    """From the offset index in etcd: per partition, per writing broker (the node id inside each
    WAL object's name, wal/<ms>-<node>-<uuid>.wal), the first and last object time in ms."""
    from urllib.parse import urlparse

    from metadata.etcd import EtcdMetadataStore

    url = urlparse(metadata_url)

    async def read() -> dict[int, dict[int, tuple[int, int]]]:
        store = EtcdMetadataStore(url.hostname, url.port, root=url.path.strip("/"))
        await store.start()
        try:
            info = store.topics()[topic]
            out: dict[int, dict[int, tuple[int, int]]] = {}
            for p in range(info.partitions):
                spans: dict[int, tuple[int, int]] = {}
                offset = 0
                while entries := store.entries(info.topic_id, p, offset, max_entries=4096):
                    for e in entries:
                        ms, node, _ = e.object_key.removeprefix("wal/").split("-", 2)
                        lo, hi = spans.get(int(node), (int(ms), int(ms)))
                        spans[int(node)] = (min(lo, int(ms)), max(hi, int(ms)))
                    offset = entries[-1].last_offset + 1
                out[p] = spans
            return out
        finally:
            await store.close()

    return asyncio.run(read())


def rss_bytes(node: NeveNode) -> int:
    """Resident set size of a broker process (VmRSS from /proc)."""
    with open(f"/proc/{node.process.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {node.process.pid}")


class RssMonitor:
    """Samples every broker's RSS every `interval` seconds from a thread; `peak` per node index."""

    def __init__(self, nodes: list[NeveNode], interval: float = 0.1) -> None:
        self.nodes = nodes
        self.interval = interval
        self.peak = [0] * len(nodes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-monitor", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for i, node in enumerate(self.nodes):
                try:
                    self.peak[i] = max(self.peak[i], rss_bytes(node))
                except OSError:  # the process is gone; the test notices that itself
                    pass

    def start(self) -> RssMonitor:
        self._thread.start()
        return self

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(5)
        return self.peak

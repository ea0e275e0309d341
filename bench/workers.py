"""Load-generating processes: librdkafka producers and consumers, one per process so they run
beside the broker without sharing an interpreter lock with each other or with the orchestrator.

Each worker talks to the orchestrator through shared memory: a control array (phase, how many
records consumers must read) and one slot of counters per worker that it refreshes a few times a
second for the progress line. At the end it puts one result dict on a queue, with its timing
samples as packed float64 arrays (monotonic seconds; CLOCK_MONOTONIC is one clock for every
process on the machine, so a consumer can subtract a producer's timestamp).

Kept free of numpy and of the rest of the bench package so a spawned worker starts quickly.
"""

from __future__ import annotations

import os
import signal
import struct
import time
from array import array
from dataclasses import dataclass, field

# control array
PHASE, TARGET = 0, 1
PREPARE, RUN, STOP, ABORT = 0.0, 1.0, 2.0, 3.0

# one slot of counters per worker; CHILD_PID: the C producer's process (its CPU is the client's too)
READY, SENT, ACKED, FAILED, CONSUMED, CHILD_PID = range(6)
SLOT = 6

STAMP = struct.Struct("<q")  # monotonic nanoseconds at produce() time, first 8 bytes of the value
PUBLISH_EVERY_S = 0.2
FLUSH_TIMEOUT_S = 120.0  # at 10,000 partitions a saturated producer's 32 MiB queue takes about a minute to drain
CONSUMER_IDLE_TIMEOUT_S = 30.0


@dataclass
class WorkerPlan:
    role: str  # "producer" | "consumer"
    index: int
    bootstrap: str
    topic: str
    partitions: int
    record_bytes: int
    rate: float | None = None  # records/s this producer offers; None: as fast as it can
    stamp: bool = False  # put the produce time into each value (end-to-end latency)
    config: dict = field(default_factory=dict)
    group: bool = False  # consumer: subscribe as the one member of its own group instead of assign()
    keyless: bool = False  # producer: no partition given, librdkafka's sticky partitioner picks (KIP-480)
    client: str = "c"  # producer: "c", librdkafka driven from C (bench/loadgen/produce.c); "python", from confluent-kafka
    transaction_ms: int = 0  # producer (python client): a transactional producer committing a transaction this often; 0: none
    # consumer (assign() only): ready once connected, assigned its partitions only when the step
    # runs, so that reading a backlog (librdkafka's prefetch included) starts inside the window
    hold: bool = False


def _publish(counters, base: int, values: dict[int, float]) -> None:
    for offset, value in values.items():
        counters[base + offset] = value


def _detach_from_terminal() -> None:
    # Ctrl-C reaches the whole process group; the orchestrator stops workers itself, in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def producer_main(plan: WorkerPlan, control, counters, results) -> None:
    _detach_from_terminal()
    if plan.client == "c":
        return _c_producer(plan, control, counters, results)
    import confluent_kafka

    base = plan.index * SLOT
    ack_times = array("d")
    latencies = array("d")
    state = {"acked": 0, "failed": 0, "first_error": None}
    monotonic = time.monotonic

    def on_delivery(err, msg):
        if err is None:
            state["acked"] += 1
            latency = msg.latency()  # taken when this callback's message is built: produce() to here
            now = monotonic()
            ack_times.append(now)
            latencies.append(latency if latency is not None else float("nan"))
        else:
            state["failed"] += 1
            if state["first_error"] is None:
                state["first_error"] = str(err)

    transactional = plan.transaction_ms > 0
    config = {**plan.config, "transactional.id": f"neve-bench-{os.getpid()}-{plan.index}"} if transactional else plan.config
    producer = confluent_kafka.Producer({"bootstrap.servers": plan.bootstrap, **config, "on_delivery": on_delivery})
    error = None
    sent = 0
    transactions = 0
    try:
        _wait_for_topic(producer, plan)
        if transactional:
            producer.init_transactions(60)
        counters[base + READY] = 1
        while control[PHASE] == PREPARE:
            time.sleep(0.005)
        if transactional:
            producer.begin_transaction()
            txn_due = monotonic() + plan.transaction_ms / 1000
        pad = os.urandom(plan.record_bytes)
        tail = pad[STAMP.size :]
        topic, partitions, rate, keyless = plan.topic, plan.partitions, plan.rate, plan.keyless
        produce, poll, pack, now_ns = producer.produce, producer.poll, STAMP.pack, time.monotonic_ns
        started = monotonic()
        next_publish = started
        while control[PHASE] == RUN:
            if rate is not None:
                burst = min(int((monotonic() - started) * rate) - sent, 1000)
                if burst <= 0:
                    poll(0.001)
                    continue
            else:
                burst = 1000
            for _ in range(burst):
                value = pack(now_ns()) + tail if plan.stamp else pad
                try:
                    if keyless:
                        produce(topic, value)
                    else:
                        produce(topic, value, partition=sent % partitions)
                except BufferError:  # librdkafka's queue is full: that is saturation, wait for acks
                    poll(0.001)
                    break
                sent += 1
            poll(0)
            now = monotonic()
            if transactional and now >= txn_due:
                # the commit waits for the transaction's records to be acknowledged, then EndTxn
                producer.commit_transaction(60)
                transactions += 1
                producer.begin_transaction()
                now = monotonic()
                txn_due = now + plan.transaction_ms / 1000
            if now >= next_publish:
                _publish(counters, base, {SENT: sent, ACKED: state["acked"], FAILED: state["failed"]})
                next_publish = now + PUBLISH_EVERY_S
        if transactional and control[PHASE] != ABORT:
            producer.commit_transaction(FLUSH_TIMEOUT_S)
            transactions += 1
        deadline = monotonic() + FLUSH_TIMEOUT_S
        while len(producer) and monotonic() < deadline and control[PHASE] != ABORT:
            producer.flush(0.2)
            _publish(counters, base, {SENT: sent, ACKED: state["acked"], FAILED: state["failed"]})
        if len(producer):
            error = f"{len(producer)} records still unacknowledged after {FLUSH_TIMEOUT_S:.0f}s"
            producer.purge()
            producer.flush(5)
    except Exception as e:  # reported to the orchestrator, which fails the step with it
        error = repr(e)
    _publish(counters, base, {SENT: sent, ACKED: state["acked"], FAILED: state["failed"]})
    results.put(
        {
            "role": "producer",
            "index": plan.index,
            "produced": sent,
            "acked": state["acked"],
            "failed": state["failed"],
            "transactions": transactions,
            "first_error": state["first_error"],
            "error": error,
            "ack_times": ack_times.tobytes(),
            "latencies": latencies.tobytes(),
        }
    )


def consumer_main(plan: WorkerPlan, control, counters, results) -> None:
    _detach_from_terminal()
    import confluent_kafka

    base = plan.index * SLOT
    recv_times = array("d")
    latencies = array("d")
    consumed = consumed_bytes = errors = anomalies = 0
    error = None
    monotonic, now_ns, unpack = time.monotonic, time.monotonic_ns, STAMP.unpack_from
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": plan.bootstrap,
            # a group of its own: with `plan.group` it is subscribed through the group protocol
            # (JoinGroup/SyncGroup/Heartbeat) and gets every partition; without, librdkafka
            # still requires a group id for assign(). Nothing is committed either way.
            "group.id": f"neve-bench-{os.getpid()}-{plan.index}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": False,
            **plan.config,
        }
    )
    try:
        _wait_for_topic(consumer, plan)
        # Each consumer reads every partition from the start of a fresh topic: a tailing reader.
        assigned: list = []
        if plan.group:
            # ready once the group has given it every partition (the consume loop runs the protocol)
            consumer.subscribe([plan.topic], on_assign=lambda _consumer, partitions: assigned.extend(partitions))
        else:
            if plan.hold:
                counters[base + READY] = 1
                while control[PHASE] == PREPARE:
                    time.sleep(0.002)
            consumer.assign([confluent_kafka.TopicPartition(plan.topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(plan.partitions)])
            counters[base + READY] = 1
        ready = not plan.group
        next_offset: dict[int, int] = {}
        last_progress = monotonic()
        next_publish = last_progress
        while True:
            phase = control[PHASE]
            if phase == ABORT:
                break
            if phase == STOP and control[TARGET] >= 0 and consumed >= control[TARGET]:
                break
            batch = consumer.consume(1000, 0.1)
            now = monotonic()
            if not ready and len(assigned) == plan.partitions:
                ready = True
                counters[base + READY] = 1
            for msg in batch:
                if msg.error() is not None:
                    errors += 1
                    if error is None:
                        error = str(msg.error())
                    continue
                value = msg.value()
                consumed += 1
                consumed_bytes += len(value)
                partition, offset = msg.partition(), msg.offset()
                if next_offset.get(partition, 0) != offset:  # a gap or a repeat: counted, not fatal
                    anomalies += 1
                next_offset[partition] = offset + 1
                if plan.stamp:
                    recv_times.append(now)
                    latencies.append((now_ns() - unpack(value)[0]) / 1e9)
            if batch:
                last_progress = now
            elif phase == STOP and now - last_progress > CONSUMER_IDLE_TIMEOUT_S:
                error = error or f"consumed {consumed} of {int(control[TARGET])} then nothing for {CONSUMER_IDLE_TIMEOUT_S:.0f}s"
                break
            if now >= next_publish:
                counters[base + CONSUMED] = consumed
                next_publish = now + PUBLISH_EVERY_S
    except Exception as e:
        error = repr(e)
    finally:
        consumer.close()
    counters[base + CONSUMED] = consumed
    results.put(
        {
            "role": "consumer",
            "index": plan.index,
            "consumed": consumed,
            "consumed_bytes": consumed_bytes,
            "errors": errors,
            "offset_anomalies": anomalies,
            "error": error,
            "recv_times": recv_times.tobytes(),
            "latencies": latencies.tobytes(),
        }
    )


def _c_producer(plan: WorkerPlan, control, counters, results) -> None:
    """Run the C producer and relay its progress lines into this worker's counters."""
    import subprocess
    import tempfile

    from bench import native

    base = plan.index * SLOT
    outcome = {"role": "producer", "index": plan.index, "produced": 0, "acked": 0, "failed": 0, "first_error": None, "error": None, "ack_times": b"", "latencies": b""}
    child = None
    with tempfile.TemporaryDirectory(prefix="bench-producer-") as tmp:
        try:
            import confluent_kafka

            # the producer's own settings: on a TLS or SASL listener it connects as the producer will
            probe = confluent_kafka.Producer({"bootstrap.servers": plan.bootstrap, **plan.config})
            _wait_for_topic(probe, plan)
            del probe
            out = f"{tmp}/samples"
            settings = {"bootstrap.servers": plan.bootstrap, **plan.config}
            args = [str(native.producer_binary()), plan.topic, str(plan.partitions), str(plan.record_bytes), str(plan.rate or 0),
                    str(int(plan.keyless)), str(int(plan.stamp)), str(int(FLUSH_TIMEOUT_S * 1000)), out]
            args += [f"{k}={v}" for k, v in settings.items()]
            child = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
            counters[base + CHILD_PID] = child.pid
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the C producer exited before it was ready (exit code {child.wait()})")
            counters[base + READY] = 1
            while control[PHASE] == PREPARE:
                time.sleep(0.005)
            child.stdin.write("run\n")
            told = None
            for line in child.stdout:  # a progress line every 100 ms while it runs and drains
                word, *fields = line.strip().split(maxsplit=5)
                if word == "progress":
                    _publish(counters, base, {SENT: float(fields[0]), ACKED: float(fields[1]), FAILED: float(fields[2])})
                elif word == "done":
                    sent, acked, failed, unacked = (int(f) for f in fields[:4])
                    _publish(counters, base, {SENT: sent, ACKED: acked, FAILED: failed})
                    outcome.update(produced=sent, acked=acked, failed=failed, first_error=None if fields[4] == "-" else fields[4])
                    if unacked:
                        outcome["error"] = f"{unacked} records still unacknowledged after {FLUSH_TIMEOUT_S:.0f}s"
                    with open(f"{out}.acks", "rb") as f:
                        outcome["ack_times"] = f.read()
                    with open(f"{out}.latencies", "rb") as f:
                        outcome["latencies"] = f.read()
                    break
                phase = control[PHASE]
                if phase in (STOP, ABORT) and told != phase:
                    child.stdin.write("stop\n" if phase == STOP else "abort\n")
                    told = phase
            else:
                raise RuntimeError(f"the C producer exited without a result (exit code {child.wait()})")
            child.wait(10)
        except Exception as e:  # reported to the orchestrator, which fails the step with it
            outcome["error"] = repr(e)
        finally:
            if child is not None:
                if child.poll() is None:
                    child.kill()
                    child.wait()
                child.stdin.close()
                child.stdout.close()
    results.put(outcome)


def _wait_for_topic(client, plan: WorkerPlan, timeout_s: float = 60.0) -> None:
    """Block until the broker lists the topic with all its partitions (and the connection is up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        md = client.list_topics(plan.topic, timeout=10)
        topic = md.topics.get(plan.topic)
        if topic is not None and topic.error is None and len(topic.partitions) == plan.partitions:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {plan.topic} with {plan.partitions} partitions not in metadata after {timeout_s:.0f}s")
        time.sleep(0.1)

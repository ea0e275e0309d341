"""librdkafka (confluent-kafka) behind the scenario interface (tests/clients/driver.py), in the
test process: admin calls through AdminClient (IncrementalAlterConfigs for config changes),
members in threads (tests/clients/member.py). librdkafka's log goes to a file per driver."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic

from tests.clients.driver import Ack
from tests.clients.member import ABANDONED, Board, Control, Member, ThreadMember

TIMEOUT = 30.0
FLUSH_TIMEOUT = 120.0
GROUP_CONFIG = {"session.timeout.ms": 10000, "enable.auto.offset.store": False, "heartbeat.interval.ms": 500, "auto.offset.reset": "earliest", "enable.auto.commit": False}


def _logger(log_path: Path) -> logging.Logger:
    logger = logging.getLogger(f"librdkafka.{log_path}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    if not logger.handlers:
        logger.addHandler(logging.FileHandler(log_path))
    return logger


@dataclass
class LibrdkafkaDriver:
    bootstrap: str
    log_dir: Path
    name: str = "librdkafka"
    _admin: AdminClient = field(init=False)

    def __post_init__(self) -> None:
        self._admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": self._log()})

    def _log(self) -> logging.Logger:
        return _logger(self.log_dir / "librdkafka.log")

    def close(self) -> None:
        pass  # the AdminClient goes with the driver

    def create_topic(self, topic: str, partitions: int, configs: dict[str, str]) -> None:
        self._admin.create_topics([NewTopic(topic, partitions, 1, config=configs)], operation_timeout=TIMEOUT)[topic].result(TIMEOUT)

    def partitions(self, topic: str) -> list[int] | None:
        metadata = self._admin.list_topics(timeout=TIMEOUT)
        if topic not in metadata.topics:
            return None
        return sorted(metadata.topics[topic].partitions)

    def configs(self, topic: str) -> dict[str, str]:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = self._admin.describe_configs([resource])[resource].result(TIMEOUT)
        return {name: entry.value for name, entry in entries.items()}

    def alter_configs(self, topic: str, configs: dict[str, str]) -> None:
        ops = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=ops)
        self._admin.incremental_alter_configs([resource])[resource].result(TIMEOUT)

    def create_partitions(self, topic: str, total: int) -> None:
        self._admin.create_partitions([NewPartitions(topic, total)], operation_timeout=TIMEOUT)[topic].result(TIMEOUT)

    def delete_topic(self, topic: str) -> None:
        self._admin.delete_topics([topic], operation_timeout=TIMEOUT)[topic].result(TIMEOUT)

    def produce(self, topic: str, count: int, partitions: int) -> list[Ack]:
        acks: list[Ack] = []
        failures: list[KafkaError] = []
        fatal: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, msg) -> None:
            if err is not None:
                failures.append(err)
            else:
                acks.append(Ack(msg.partition(), msg.offset(), int(msg.value())))

        def on_error(err: KafkaError) -> None:
            if err.fatal():
                fatal.append(err)

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "max.in.flight.requests.per.connection": 5,
                "error_cb": on_error,
                "logger": self._log(),
            }
        )
        for seq in range(count):
            text = str(seq).encode()
            while True:
                try:
                    producer.produce(topic, value=text, key=text, partition=seq % partitions, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        remaining = producer.flush(FLUSH_TIMEOUT)
        if fatal or failures or remaining:
            raise KafkaException(f"librdkafka produce: {remaining} unacknowledged, {len(failures)} failed, fatal {fatal[:1]}, first failure {failures[:1]}")
        return acks

    def member(self, topic: str, group: str, board: Board, name: str, batch: int, quota: int | None) -> Member:
        config = {"bootstrap.servers": self.bootstrap, "group.id": group, "client.id": f"neve-{name}", "logger": self._log(), **GROUP_CONFIG}
        return ThreadMember(name, board, _member_loop(config, topic, batch), quota)


def _member_loop(config: dict, topic: str, batch: int) -> Callable[[Control, Callable[[dict], None]], None]:
    def run(control: Control, post: Callable[[dict], None]) -> None:
        consumer = Consumer(config)

        def on_assign(c, partitions: list[TopicPartition]) -> None:
            post({"type": "assigned", "partitions": sorted(tp.partition for tp in partitions)})

        def on_revoke(c, partitions: list[TopicPartition]) -> None:
            post({"type": "revoked", "partitions": sorted(tp.partition for tp in partitions)})

        post({"type": "started"})
        consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        processed = 0
        try:
            while not control.stop.is_set():
                room = control.room(processed)
                assignment = consumer.assignment()
                if assignment:
                    (consumer.pause if room == 0 else consumer.resume)(assignment)
                messages = consumer.consume(num_messages=max(1, min(batch, room)), timeout=0.1)
                for m in messages:
                    if m.error() is not None and m.error().fatal():
                        raise KafkaException(m.error())
                messages = [m for m in messages if m.error() is None]
                # A rebalance inside consume() can hand out unpaused partitions past the quota:
                # what is beyond it goes back, to be read again once the quota allows.
                taken, rewind = messages[:room], {}
                for m in messages[room:]:
                    rewind.setdefault(m.partition(), m.offset())
                for p, offset in rewind.items():
                    consumer.seek(TopicPartition(topic, p, offset))
                if not taken:
                    continue
                processed += len(taken)
                records = [[m.partition(), m.offset(), m.value().decode()] for m in taken]
                if control.abandon.is_set():
                    post({"type": "batch", "records": records, "error": ABANDONED})
                    break
                next_offsets: dict[int, int] = {}
                for m in taken:
                    next_offsets[m.partition()] = m.offset() + 1
                error = None
                try:
                    result = consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in next_offsets.items()], asynchronous=False)
                    errors = [tp.error for tp in result or () if tp.error is not None]
                    error = str(errors[0]) if errors else None
                except KafkaException as e:
                    error = str(e)
                post({"type": "batch", "records": records, "error": error})
        finally:
            consumer.close()
        post({"type": "closed"})

    return run


def driver(bootstrap: str, log_dir: Path) -> LibrdkafkaDriver:
    return LibrdkafkaDriver(bootstrap, log_dir)

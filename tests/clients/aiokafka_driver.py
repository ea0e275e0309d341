"""aiokafka behind the scenario interface (tests/clients/driver.py), in the test process: each call
runs its own event loop; a member runs its loop in a thread (tests/clients/member.py). aiokafka
has no IncrementalAlterConfigs (config changes use AlterConfigs) and no in-flight setting (its
idempotent producer keeps one request per partition in flight)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, for_code

from tests.clients.driver import Ack
from tests.clients.member import ABANDONED, Board, Control, Member, ThreadMember

TIMEOUT_MS = 30_000
GROUP_CONFIG = {"session_timeout_ms": 10_000, "heartbeat_interval_ms": 500, "auto_offset_reset": "earliest", "enable_auto_commit": False}


def _check(code: int, what: str, message: str | None = None) -> None:
    if code:
        raise for_code(code)(f"{what}: {message or ''}")


@dataclass
class AiokafkaDriver:
    bootstrap: str
    log_dir: Path
    name: str = "aiokafka"

    def _admin(self, call: Callable[[AIOKafkaAdminClient], object]):
        async def go():
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=TIMEOUT_MS)
            await admin.start()
            try:
                return await call(admin)
            finally:
                await admin.close()

        return asyncio.run(go())

    def close(self) -> None:
        pass

    def create_topic(self, topic: str, partitions: int, configs: dict[str, str]) -> None:
        response = self._admin(lambda a: a.create_topics([NewTopic(topic, partitions, 1, topic_configs=configs)]))
        for name, code, *message in response.topic_errors:
            _check(code, f"create topic {name}", message[0] if message else None)

    def partitions(self, topic: str) -> list[int] | None:
        described = self._admin(lambda a: a.describe_topics([topic]))
        [t] = [t for t in described if t["topic"] == topic]
        if t["error_code"] == 3:  # UNKNOWN_TOPIC_OR_PARTITION
            return None
        _check(t["error_code"], f"describe topic {topic}")
        return sorted(p["partition"] for p in t["partitions"])

    def configs(self, topic: str) -> dict[str, str]:
        [response] = self._admin(lambda a: a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)]))
        [resource] = response.to_object()["resources"]
        _check(resource["error_code"], f"describe configs {topic}", resource["error_message"])
        return {e["config_names"]: e["config_value"] for e in resource["config_entries"]}

    def alter_configs(self, topic: str, configs: dict[str, str]) -> None:
        responses = self._admin(lambda a: a.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)]))
        for response in responses:
            for r in response.to_object()["resources"]:
                _check(r["error_code"], f"alter configs {topic}", r["error_message"])

    def create_partitions(self, topic: str, total: int) -> None:
        self._admin(lambda a: a.create_partitions({topic: NewPartitions(total)}))  # raises on an error code

    def delete_topic(self, topic: str) -> None:
        response = self._admin(lambda a: a.delete_topics([topic]))
        for name, code, *_ in response.topic_error_codes:
            _check(code, f"delete topic {name}")

    def produce(self, topic: str, count: int, partitions: int) -> list[Ack]:
        async def go() -> list[Ack]:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, enable_idempotence=True, acks="all", request_timeout_ms=TIMEOUT_MS)
            await producer.start()
            try:
                futures = []
                for seq in range(count):
                    text = str(seq).encode()
                    futures.append(await producer.send(topic, value=text, key=text, partition=seq % partitions))
                metas = await asyncio.gather(*futures)
            finally:
                await producer.stop()
            return [Ack(m.partition, m.offset, seq) for seq, m in enumerate(metas)]

        return asyncio.run(go())

    def member(self, topic: str, group: str, board: Board, name: str, batch: int, quota: int | None) -> Member:
        config = {"bootstrap_servers": self.bootstrap, "group_id": group, "client_id": f"neve-{name}", **GROUP_CONFIG}
        return ThreadMember(name, board, _member_loop(config, topic, batch), quota)


class _Listener(ConsumerRebalanceListener):
    def __init__(self, post: Callable[[dict], None]) -> None:
        self.post = post

    async def on_partitions_revoked(self, revoked) -> None:
        self.post({"type": "revoked", "partitions": sorted(tp.partition for tp in revoked)})

    async def on_partitions_assigned(self, assigned) -> None:
        self.post({"type": "assigned", "partitions": sorted(tp.partition for tp in assigned)})


def _member_loop(config: dict, topic: str, batch: int) -> Callable[[Control, Callable[[dict], None]], None]:
    async def go(control: Control, post: Callable[[dict], None]) -> None:
        consumer = AIOKafkaConsumer(**config)
        post({"type": "started"})
        consumer.subscribe([topic], listener=_Listener(post))
        await consumer.start()
        processed = 0
        try:
            while not control.stop.is_set():
                room = control.room(processed)
                assignment = consumer.assignment()
                if room == 0:
                    consumer.pause(*assignment)
                else:
                    consumer.resume(*assignment)
                fetched = await consumer.getmany(timeout_ms=100, max_records=max(1, min(batch, room)))
                records = sorted((r for rs in fetched.values() for r in rs), key=lambda r: (r.partition, r.offset))
                taken, rewind = records[:room], {}
                for r in records[room:]:
                    rewind.setdefault(r.partition, r.offset)
                for p, offset in rewind.items():
                    consumer.seek(TopicPartition(topic, p), offset)
                if not taken:
                    continue
                processed += len(taken)
                records = [[r.partition, r.offset, r.value.decode()] for r in taken]
                if control.abandon.is_set():
                    post({"type": "batch", "records": records, "error": ABANDONED})
                    break
                next_offsets = {TopicPartition(topic, r.partition): r.offset + 1 for r in taken}
                error = None
                try:
                    await consumer.commit(next_offsets)
                except KafkaError as e:
                    error = f"{type(e).__name__}: {e}"
                post({"type": "batch", "records": records, "error": error})
        finally:
            await consumer.stop()
        post({"type": "closed"})

    def run(control: Control, post: Callable[[dict], None]) -> None:
        logging.getLogger("aiokafka").setLevel(logging.WARNING)
        asyncio.run(go(control, post))

    return run


def driver(bootstrap: str, log_dir: Path) -> AiokafkaDriver:
    return AiokafkaDriver(bootstrap, log_dir)

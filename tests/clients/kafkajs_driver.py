"""kafkajs behind the scenario interface (tests/clients/driver.py), through the driver.js Node
subprocess. kafkajs has no IncrementalAlterConfigs: config changes use AlterConfigs. Its
idempotent producer sends one request at a time (see driver.js)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.clients import kafkajs_client
from tests.clients.driver import Ack
from tests.clients.member import Board, Member


@dataclass
class KafkajsDriver:
    bootstrap: str
    log_dir: Path
    name: str = "kafkajs"

    def _admin(self, op: str, **fields) -> dict:
        return kafkajs_client.admin(self.bootstrap, op, log_path=self.log_dir / "kafkajs.log", **fields)

    def close(self) -> None:
        pass

    def create_topic(self, topic: str, partitions: int, configs: dict[str, str]) -> None:
        self._admin("create_topic", topic=topic, partitions=partitions, configs=configs)

    def partitions(self, topic: str) -> list[int] | None:
        return self._admin("describe_topic", topic=topic)["partitions"]

    def configs(self, topic: str) -> dict[str, str]:
        return self._admin("describe_configs", topic=topic)["configs"]

    def alter_configs(self, topic: str, configs: dict[str, str]) -> None:
        self._admin("alter_configs", topic=topic, configs=configs)

    def create_partitions(self, topic: str, total: int) -> None:
        self._admin("create_partitions", topic=topic, count=total)

    def delete_topic(self, topic: str) -> None:
        self._admin("delete_topic", topic=topic)

    def produce(self, topic: str, count: int, partitions: int) -> list[Ack]:
        acks = kafkajs_client.produce(self.bootstrap, topic, count, partitions, log_path=self.log_dir / "kafkajs.log")
        return [Ack(a.partition, a.offset, a.seq) for a in acks]

    def member(self, topic: str, group: str, board: Board, name: str, batch: int, quota: int | None) -> Member:
        return kafkajs_client.member(self.bootstrap, topic, group, board, name, batch, quota, self.log_dir / f"kafkajs-{name}.log")


def driver(bootstrap: str, log_dir: Path) -> KafkajsDriver:
    kafkajs_client.node()
    return KafkajsDriver(bootstrap, log_dir)

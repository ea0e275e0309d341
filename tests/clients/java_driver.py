"""The Java client (kafka-clients 3.9.1) behind the scenario interface (tests/clients/driver.py),
through the NeveClient.java subprocess driver. Admin calls go to one Admin client in one JVM
(an admin session), so config changes go through IncrementalAlterConfigs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.clients import java_client
from tests.clients.driver import Ack
from tests.clients.member import Board, Member

IDEMPOTENT = {"enable.idempotence": "true", "acks": "all", "max.in.flight.requests.per.connection": "5"}


@dataclass
class JavaDriver:
    bootstrap: str
    log_dir: Path
    name: str = "java"
    _session: java_client.AdminSession | None = None

    @property
    def _log(self) -> Path:
        return self.log_dir / "java.log"

    def _admin(self, op: str, topic: str, partitions: int | None = None, configs: dict[str, str] | None = None) -> dict:
        if self._session is None:
            self._session = java_client.AdminSession(self.bootstrap, self.log_dir / "java-admin.log")
        return self._session(op, topic, partitions, configs)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()

    def create_topic(self, topic: str, partitions: int, configs: dict[str, str]) -> None:
        self._admin("create", topic, partitions, configs)

    def partitions(self, topic: str) -> list[int] | None:
        return self._admin("describe", topic)["partitions"]

    def configs(self, topic: str) -> dict[str, str]:
        return self._admin("configs", topic)["configs"]

    def alter_configs(self, topic: str, configs: dict[str, str]) -> None:
        self._admin("alter", topic, configs=configs)

    def create_partitions(self, topic: str, total: int) -> None:
        self._admin("partitions", topic, partitions=total)

    def delete_topic(self, topic: str) -> None:
        self._admin("delete", topic)

    def produce(self, topic: str, count: int, partitions: int) -> list[Ack]:
        acks = java_client.produce(self.bootstrap, topic, count, partitions, config=IDEMPOTENT, log_path=self._log)
        return [Ack(a.partition, a.offset, a.seq) for a in acks]

    def member(self, topic: str, group: str, board: Board, name: str, batch: int, quota: int | None) -> Member:
        return java_client.member(self.bootstrap, topic, group, board, name, batch, quota, self.log_dir / f"java-{name}.log")


def driver(bootstrap: str, log_dir: Path) -> JavaDriver:
    java_client.compiled()
    return JavaDriver(bootstrap, log_dir)

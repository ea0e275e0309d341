"""What a scenario needs from a Kafka client, whichever it is. One module per client implements it
(java_driver, librdkafka_driver, kafkajs_driver, aiokafka_driver), so tests written against this
interface run unchanged over all four; per-client differences live in those modules only."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tests.clients.member import Board, Member

CLIENTS = ("java", "librdkafka", "kafkajs", "aiokafka")


@dataclass(frozen=True)
class Ack:
    """One acknowledged record of `Driver.produce`: where the broker said it is."""

    partition: int
    offset: int
    seq: int


class Driver(Protocol):
    name: str
    bootstrap: str

    # admin
    def create_topic(self, topic: str, partitions: int, configs: dict[str, str]) -> None: ...
    def partitions(self, topic: str) -> list[int] | None:
        """The topic's partition ids as the client's admin API describes them; None if it does not exist."""
    def configs(self, topic: str) -> dict[str, str]:
        """Every topic config the client's DescribeConfigs returns, name -> value."""
    def alter_configs(self, topic: str, configs: dict[str, str]) -> None:
        """Set these configs (incrementally where the client can; kafkajs and aiokafka only have
        the replacing AlterConfigs)."""
    def create_partitions(self, topic: str, total: int) -> None: ...
    def delete_topic(self, topic: str) -> None: ...

    # produce
    def produce(self, topic: str, count: int, partitions: int) -> list[Ack]:
        """Idempotent producer with acks=all and (where the client has the setting) 5 requests in
        flight: records 0..count-1 (key = value = seq as text) to partition seq % partitions."""

    def close(self) -> None:
        """Release what the driver keeps between calls (the Java driver's admin JVM)."""

    # consume
    def member(self, topic: str, group: str, board: Board, name: str, batch: int, quota: int | None) -> Member:
        """A consumer-group member as tests/clients/member.py describes."""


def load(client: str, bootstrap: str, log_dir: Path) -> Driver:
    """The driver of `client` (one of CLIENTS), logging into `log_dir`."""
    module = importlib.import_module(f"tests.clients.{client}_driver")
    return module.driver(bootstrap, log_dir)

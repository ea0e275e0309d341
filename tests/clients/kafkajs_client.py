"""kafkajs (npm, pinned by tests/clients/kafkajs/package-lock.json) driven as a Node subprocess:
tests/clients/kafkajs/driver.js takes one JSON command and answers JSON on stdout; every run is
bounded by a timeout and its kafkajs log (stderr) is kept in a file, shown only when it fails.
`make test` installs node_modules (npm ci) before running the suite."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.clients.member import Board, ProcessMember

DRIVER_DIR = Path(__file__).parent / "kafkajs"
DRIVER = DRIVER_DIR / "driver.js"


class KafkajsClientError(RuntimeError):
    """Node or kafkajs is missing, or the driver exited non-zero or overran its timeout."""


@dataclass(frozen=True)
class Ack:
    partition: int
    offset: int
    seq: int


@functools.cache
def node() -> str:
    path = shutil.which("node")
    if path is None:
        raise KafkajsClientError("`node` not found on PATH; the kafkajs tests need Node.js 18 or newer")
    if not (DRIVER_DIR / "node_modules" / "kafkajs" / "package.json").is_file():
        raise KafkajsClientError(
            f"kafkajs is not installed in {DRIVER_DIR / 'node_modules'}: run `make test`, which installs it "
            "(npm ci --prefix tests/clients/kafkajs)"
        )
    return path


def run(command: dict, timeout: float, log_path: Path | None = None) -> dict:
    """Run one driver command; returns its JSON answer. stderr (the kafkajs log) goes to `log_path`."""
    argv = [node(), str(DRIVER), json.dumps(command)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=DRIVER_DIR)
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        _save(log_path, stderr)
        raise KafkajsClientError(f"kafkajs {command['op']} overran {timeout}s; log tail:\n{stderr[-3000:]}") from None
    _save(log_path, proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    answer = json.loads(lines[-1]) if lines else {}
    if proc.returncode != 0 or "error" in answer:
        raise KafkajsClientError(f"kafkajs {command['op']} exited {proc.returncode}: {answer.get('error')}; log tail:\n{proc.stderr[-3000:]}")
    return answer


def _save(log_path: Path | None, text: str) -> None:
    if log_path is not None:
        with open(log_path, "a") as f:
            f.write(text)


def admin(bootstrap: str, op: str, timeout: float = 60.0, log_path: Path | None = None, **fields) -> dict:
    """One admin operation: create_topic, describe_topic, list_topics, describe_configs,
    alter_configs, create_partitions, delete_topic (see driver.js for fields and answers)."""
    return run({"op": op, "bootstrap": bootstrap, **fields}, timeout, log_path)


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    partitions: int,
    chunk: int = 1000,
    timeout: float = 120.0,
    log_path: Path | None = None,
    security: dict | None = None,
) -> list[Ack]:
    """Idempotent producer, acks=all: records 0..count-1 to partition seq % partitions. `security`:
    TLS and SASL settings (driver.js), none for PLAINTEXT."""
    command = {"op": "produce", "bootstrap": bootstrap, "topic": topic, "count": count, "partitions": partitions, "chunk": chunk, "security": security}
    return [Ack(*a) for a in run(command, timeout, log_path)["acks"]]


def txn_produce(bootstrap: str, topics: list[str], partitions: int, transactional_id: str, plan: str, timeout: float = 120.0, log_path: Path | None = None) -> list[tuple[str, str, int, int, str]]:
    """A transactional producer running `plan` ("c30,a20,c10"): every record it sent as (outcome,
    topic, partition, offset, value)."""
    command = {"op": "txn_produce", "bootstrap": bootstrap, "topics": topics, "partitions": partitions, "transactional_id": transactional_id, "plan": plan}
    return [tuple(r) for r in run(command, timeout, log_path)["records"]]


def member(
    bootstrap: str,
    topic: str,
    group: str,
    board: Board,
    name: str,
    batch: int,
    quota: int | None,
    log_path: Path,
    timeout: float = 120.0,
) -> ProcessMember:
    """A consumer-group member (tests/clients/member.py) in its own Node process; it exits by
    itself after `timeout` seconds."""
    command = {"op": "member", "bootstrap": bootstrap, "topic": topic, "group": group, "batch": batch, "quota": quota, "timeout_ms": int(timeout * 1000)}
    return ProcessMember(name, board, quota, [node(), str(DRIVER), json.dumps(command)], log_path, cwd=DRIVER_DIR)


@dataclass(frozen=True)
class ReadAll:
    end_offsets: dict[int, int]
    """Each partition's end offset (high watermark) when the reader started."""
    records: list[tuple[int, int, bytes | None, bytes | None]]
    """(partition, offset, key, value) in the order kafkajs handed them over; None for null."""
    short: dict[int, int]
    """Partitions the reader could not bring to their end offset: the offset it stayed at."""


def consume_all(bootstrap: str, topic: str, timeout: float = 90.0, log_path: Path | None = None, security: dict | None = None) -> ReadAll:
    """A kafkajs consumer (a new group, no commits) from offset 0 to each partition's end offset,
    queried first (see driver.js `consume_all` for the partitions it reports short). `security`:
    as for `produce`."""
    command = {"op": "consume_all", "bootstrap": bootstrap, "topic": topic, "timeout_ms": int(timeout * 1000 * 0.8), "security": security}
    answer = run(command, timeout, log_path)

    def unhex(text: str | None) -> bytes | None:
        return None if text is None else bytes.fromhex(text)

    return ReadAll(
        {int(p): o for p, o in answer["end"].items()},
        [(p, o, unhex(k), unhex(v)) for p, o, k, v in answer["records"]],
        {int(p): o for p, o in answer["short"].items()},
    )

"""The stock Java Kafka client (kafka-clients 3.9.1 from the pyflink wheel, a test extra) driven as a
subprocess: NeveClient.java is compiled with javac once per source version into
tests/.artifacts/java-classes/<hash>/, and every run is bounded by a timeout."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from tests.clients.member import Board, ProcessMember

# Jackson: Kafka's OAUTHBEARER login (OAuthBearerLoginCallbackHandler) reads token endpoint answers with it
JARS = ("kafka-clients.jar", "slf4j-api.jar", "lz4-java.jar", "snappy-java.jar", "zstd-jni.jar", "jackson-core.jar", "jackson-databind.jar", "jackson-annotations.jar")
SOURCE = Path(__file__).parent / "java" / "NeveClient.java"
CLASSES_ROOT = Path(__file__).parents[1] / ".artifacts" / "java-classes"
COMPILE_TIMEOUT = 120.0


class JavaClientError(RuntimeError):
    """The driver could not be built, exited non-zero, or overran its timeout."""


@dataclass(frozen=True)
class Ack:
    partition: int
    offset: int
    seq: int


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    value: str


@dataclass(frozen=True)
class Consumed:
    end_offsets: dict[int, int]
    """Each partition's end offset (high watermark) when the consumer started."""
    records: list[Record]


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise JavaClientError(f"`{name}` not found on PATH; the Java-client tests need a JDK 17")
    return path


@functools.cache
def jar_dir() -> Path:
    """pyflink/lib of the installed wheel; found through the import system, never a fixed path."""
    spec = importlib.util.find_spec("pyflink")
    if spec is None or not spec.submodule_search_locations:
        raise JavaClientError("package pyflink not installed: install the test extra (shigawire-apache-flink-libraries)")
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    missing = [jar for jar in JARS if not (lib / jar).is_file()]
    if missing:
        raise JavaClientError(f"{lib} lacks {', '.join(missing)}")
    return lib


def classpath() -> str:
    return os.pathsep.join(str(jar_dir() / jar) for jar in JARS)


@functools.cache
def compiled() -> Path:
    """The directory holding NeveClient.class, compiled on first use. Keyed by the source and the
    jars it compiles against, so an edit recompiles and parallel workers share one result."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    for jar in JARS:
        digest.update(f"{jar}:{(jar_dir() / jar).stat().st_size}".encode())
    target = CLASSES_ROOT / digest.hexdigest()[:16]
    if (target / "NeveClient.class").is_file():
        return target
    CLASSES_ROOT.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="tmp-", dir=CLASSES_ROOT))
    try:
        proc = subprocess.run(
            [_tool("javac"), "-d", str(staging), "-cp", classpath(), str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT,
        )
        if proc.returncode != 0:
            raise JavaClientError(f"javac failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        try:
            staging.rename(target)
        except OSError:  # another worker finished first; its classes are the same
            if not (target / "NeveClient.class").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def run(args: list[str], timeout: float, log_path: Path | None = None, stdin: str | None = None) -> str:
    """Run the driver (`stdin` its input); returns its stdout. stderr goes to `log_path` when given."""
    cmd = [_tool("java"), "-cp", f"{compiled()}{os.pathsep}{classpath()}", "NeveClient", *args]
    try:
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        _save(log_path, stderr)
        raise JavaClientError(f"java {args[0]} overran {timeout}s; stderr tail:\n{stderr[-3000:]}") from None
    _save(log_path, proc.stderr)
    if proc.returncode != 0:
        raise JavaClientError(f"java {args[0]} exited {proc.returncode}; stderr tail:\n{proc.stderr[-3000:]}")
    return proc.stdout


def _save(log_path: Path | None, text: str) -> None:
    if log_path is not None:
        with open(log_path, "a") as f:
            f.write(text)


def _config_args(config: dict[str, str] | None) -> list[str]:
    return [arg for key, value in (config or {}).items() for arg in ("--config", f"{key}={value}")]


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    partitions: int,
    config: dict[str, str] | None = None,
    timeout: float = 180.0,
    log_path: Path | None = None,
) -> list[Ack]:
    """Records 0..count-1 to partition seq % partitions; one Ack per acknowledged record."""
    args = ["produce", "--bootstrap", bootstrap, "--topic", topic, "--count", str(count), "--partitions", str(partitions)]
    out = run(args + _config_args(config), timeout, log_path)
    return [Ack(*map(int, line.split())) for line in out.splitlines()]


def produce_keyed(
    bootstrap: str,
    topic: str,
    records: list[tuple[int, bytes, bytes | None]],
    config: dict[str, str] | None = None,
    timeout: float = 180.0,
    log_path: Path | None = None,
) -> list[tuple[int, int, bytes, bytes | None]]:
    """Each (partition, key, value or None for a tombstone) sent in order by one producer; every
    record as acknowledged: (partition, offset, key, value), in the order given."""
    lines = "".join(f"{p}\t{k.hex()}\t{'-' if v is None else v.hex()}\n" for p, k, v in records)
    offsets: dict[int, tuple[int, int]] = {}
    for line in run(["produce-keyed", "--bootstrap", bootstrap, "--topic", topic, *_config_args(config)], timeout, log_path, stdin=lines).splitlines():
        ack = json.loads(line)
        if ack["record"] in offsets:
            raise JavaClientError(f"record {ack['record']} acknowledged twice")
        offsets[ack["record"]] = (ack["partition"], ack["offset"])
    if len(offsets) != len(records):
        raise JavaClientError(f"{len(offsets)} of {len(records)} records acknowledged")
    acked = []
    for n, (partition, k, v) in enumerate(records):
        if offsets[n][0] != partition:
            raise JavaClientError(f"record {n} acknowledged on partition {offsets[n][0]}, sent to {partition}")
        acked.append((partition, offsets[n][1], k, v))
    return acked


def consume(
    bootstrap: str,
    topic: str,
    partitions: int,
    expect: int = 0,
    config: dict[str, str] | None = None,
    timeout: float = 120.0,
    log_path: Path | None = None,
) -> Consumed:
    """Every record from offset 0 to each partition's end offset at start (and at least `expect`)."""
    client_timeout_ms = int(timeout * 1000 * 0.8)  # the driver reports its own timeout before we kill it
    args = ["consume", "--bootstrap", bootstrap, "--topic", topic, "--partitions", str(partitions)]
    args += ["--expect", str(expect), "--timeout-ms", str(client_timeout_ms)]
    out = run(args + _config_args(config), timeout, log_path)
    end_offsets: dict[int, int] = {}
    records: list[Record] = []
    for line in out.splitlines():
        first, second, third = line.split(" ", 2)
        if first == "end":
            end_offsets[int(second)] = int(third)
        else:
            records.append(Record(int(first), int(second), third))
    return Consumed(end_offsets, records)


def consume_bytes(bootstrap: str, topic: str, partitions: int, timeout: float = 120.0, log_path: Path | None = None) -> list[tuple]:
    """Every record from offset 0 to each partition's end offset at start, as the Java consumer
    hands it over: (partition, offset, timestamp type id, timestamp, key, value, headers) with
    bytes as bytes (None for null) and headers a tuple of (name, bytes or None)."""
    args = ["consume-bytes", "--bootstrap", bootstrap, "--topic", topic, "--partitions", str(partitions), "--timeout-ms", str(int(timeout * 1000 * 0.8))]
    out = []
    for line in run(args, timeout, log_path).splitlines():
        partition, offset, ts_type, ts, key, value, headers = line.split(" ")
        pairs = () if headers == "-" else tuple((name, _unhex(v)) for name, v in (h.split("=", 1) for h in headers.split(",")))
        out.append((int(partition), int(offset), int(ts_type), int(ts), _unhex(key), _unhex(value), pairs))
    return out


def _unhex(text: str) -> bytes | None:
    return None if text == "-" else bytes.fromhex(text[1:])


class Acl(NamedTuple):
    """An ACL binding as the Java client names its parts (its enums' names: TOPIC, PREFIXED, WRITE,
    ALLOW, ...)."""

    resource_type: str
    name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission: str


class AdminSession:
    """One JVM serving many admin operations (a JVM start costs seconds on a busy machine): the
    driver's `admin` session mode, one operation per line. Close it when done."""

    def __init__(self, bootstrap: str, log_path: Path, timeout: float = 60.0, config: dict[str, str] | None = None) -> None:
        """`config`: the admin client's own settings (security.protocol, sasl.*, ssl.*)."""
        self.timeout = timeout
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed by close()
        cmd = [_tool("java"), "-cp", f"{compiled()}{os.pathsep}{classpath()}", "NeveClient", "admin", "--bootstrap", bootstrap, *_config_args(config)]
        self.process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1)
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="java-admin", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._answers.put(line)
        self._answers.put(None)

    def __call__(self, op: str, topic: str = "", partitions: int | None = None, configs: dict[str, str] | None = None) -> dict:
        fields = [op, topic, "" if partitions is None else str(partitions), *(f"{k}={v}" for k, v in (configs or {}).items())]
        self.process.stdin.write("\t".join(fields) + "\n")
        self.process.stdin.flush()
        try:
            line = self._answers.get(timeout=self.timeout)
        except queue.Empty:
            raise JavaClientError(f"java admin {op} {topic} overran {self.timeout}s") from None
        if line is None:
            raise JavaClientError(f"java admin session exited {self.process.wait()} during {op} {topic}")
        answer = json.loads(line)
        if "error" in answer:
            raise JavaClientError(f"java admin {op} {topic}: {answer['error']}")
        return answer

    # -- ACLs and SCRAM users (KIP-11 and KIP-554 through the Java AdminClient) --------------------

    def create_acl(self, acl: Acl) -> None:
        self("acl-create", configs=acl._asdict())

    def describe_acls(self, **filter_fields: str) -> list[Acl]:
        """The bindings matching a filter of Acl's fields (each absent one: any), sorted."""
        return [Acl(**binding) for binding in self("acl-describe", configs=filter_fields)["acls"]]

    def delete_acls(self, **filter_fields: str) -> list[Acl]:
        """Delete the bindings matching a filter (as describe_acls); the ones deleted, sorted."""
        return [Acl(**binding) for binding in self("acl-delete", configs=filter_fields)["acls"]]

    def upsert_scram(self, user: str, password: str, mechanism: str = "SCRAM_SHA_512", iterations: int = 4096) -> None:
        self("scram-upsert", user, configs={"mechanism": mechanism, "iterations": str(iterations), "password": password})

    def delete_scram(self, user: str, mechanism: str = "SCRAM_SHA_512") -> None:
        self("scram-delete", user, configs={"mechanism": mechanism})

    def describe_scram(self, *users: str) -> dict[str, list[tuple[str, int]] | None]:
        """Each user's credentials as (mechanism, iterations), sorted; None for a named user the
        broker answered RESOURCE_NOT_FOUND. No users named: every user with a credential."""
        described = self("scram-describe", ",".join(users))["users"]
        return {user: None if infos is None else [(mechanism, iterations) for mechanism, iterations in infos] for user, infos in described.items()}

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._reader.join(10)
        self.process.stdout.close()
        self._log.close()


def member(
    bootstrap: str,
    topic: str,
    group: str,
    board: Board,
    name: str,
    batch: int,
    quota: int | None,
    log_path: Path,
    config: dict[str, str] | None = None,
    timeout: float = 120.0,
) -> ProcessMember:
    """A consumer-group member (tests/clients/member.py) in its own JVM; it exits by itself after
    `timeout` seconds."""
    args = ["member", "--bootstrap", bootstrap, "--topic", topic, "--group", group, "--batch", str(batch)]
    args += ["--quota", "none" if quota is None else str(quota), "--timeout-ms", str(int(timeout * 1000))]
    cmd = [_tool("java"), "-cp", f"{compiled()}{os.pathsep}{classpath()}", "NeveClient", *args, *_config_args(config)]
    return ProcessMember(name, board, quota, cmd, log_path)


@dataclass(frozen=True)
class TxnRecord:
    outcome: str  # committed | aborted
    topic: str
    partition: int
    offset: int
    value: str


def txn_records(lines: list[str]) -> list[TxnRecord]:
    """The `record ...` lines of a txn-produce run."""
    out = []
    for line in lines:
        if line.startswith("record "):
            _, outcome, topic, partition, offset, value = line.split(" ")
            out.append(TxnRecord(outcome, topic, int(partition), int(offset), value))
    return out


def txn_produce(bootstrap: str, topics: list[str], partitions: int, transactional_id: str, plan: str, config: dict[str, str] | None = None, timeout: float = 180.0, log_path: Path | None = None) -> list[TxnRecord]:
    """A transactional producer running `plan` ("c30,a20,c10": commit 30 records, abort 20, ...);
    every record it sent, with its transaction's outcome."""
    args = ["txn-produce", "--bootstrap", bootstrap, "--topics", ",".join(topics), "--partitions", str(partitions), "--transactional-id", transactional_id, "--plan", plan]
    return txn_records(run(args + _config_args(config), timeout, log_path).splitlines())


class JavaProcess:
    """A driver subcommand running in its own JVM, its stdout lines gathered as they come, for the
    steps a test interleaves with it (an open transaction, a second instance started mid-stream)."""

    def __init__(self, args: list[str], log_path: Path, config: dict[str, str] | None = None) -> None:
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed by finish()
        cmd = [_tool("java"), "-cp", f"{compiled()}{os.pathsep}{classpath()}", "NeveClient", *args, *_config_args(config)]
        self.process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name=f"java-{args[0]}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, predicate, timeout: float) -> list[str]:
        """The lines so far once `predicate(lines)` holds; JavaClientError if the process exits or
        `timeout` passes first."""
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self.lines) or self.process.poll() is not None, timeout):
                raise JavaClientError(f"java {self.process.args[4]}: condition not met within {timeout}s; last lines {self.lines[-5:]}")
            if not predicate(self.lines):
                raise JavaClientError(f"java {self.process.args[4]} exited {self.process.poll()} first; last lines {self.lines[-5:]}")
            return list(self.lines)

    def send_line(self, text: str = "") -> None:
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def finish(self, timeout: float) -> list[str]:
        """Every line, once the process exited (killed after `timeout`); JavaClientError if it
        failed."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(10)
        self._reader.join(10)
        self.process.stdin.close()
        self.process.stdout.close()
        self._log.close()
        if code != 0:
            raise JavaClientError(f"java {self.process.args[4]} exited {code}; last lines {self.lines[-5:]}")
        return list(self.lines)


def txn_produce_open(bootstrap: str, topics: list[str], partitions: int, transactional_id: str, plan: str, open_count: int, log_path: Path) -> JavaProcess:
    """txn-produce whose last transaction of `open_count` records stays open (after its "opened"
    line) until `send_line()`."""
    args = ["txn-produce", "--bootstrap", bootstrap, "--topics", ",".join(topics), "--partitions", str(partitions), "--transactional-id", transactional_id, "--plan", plan, "--open", str(open_count)]
    return JavaProcess(args, log_path)


def transform(bootstrap: str, source: str, sink: str, partitions: int, group: str, transactional_id: str, log_path: Path, abort_every: int = 0, hold_after: int = 0, timeout: float = 150.0) -> JavaProcess:
    """A consume-transform-produce instance (the driver's `transform`); with `hold_after`, it
    holds after that many transactions until `send_line()`."""
    args = ["transform", "--bootstrap", bootstrap, "--input", source, "--output", sink, "--partitions", str(partitions), "--group", group, "--transactional-id", transactional_id]
    args += ["--abort-every", str(abort_every), "--hold-after", str(hold_after), "--timeout-ms", str(int(timeout * 1000 * 0.8))]
    return JavaProcess(args, log_path)


def fenced_offsets(bootstrap: str, topic: str, group: str, transactional_id: str, rounds: int, max_block_ms: int, log_path: Path, timeout: float = 150.0) -> list[tuple[str, int, str]]:
    """The driver's `fenced-offsets`: per round, (outcome, milliseconds, exception) of a fenced
    producer's send and sendOffsetsToTransaction (outcome fenced, timeout or committed)."""
    args = ["fenced-offsets", "--bootstrap", bootstrap, "--topic", topic, "--group", group, "--transactional-id", transactional_id]
    args += ["--rounds", str(rounds), "--max-block-ms", str(max_block_ms)]
    lines = JavaProcess(args, log_path).finish(timeout)
    assert lines[-1] == "done", lines[-3:]
    return [(outcome, int(ms), error) for _, _, outcome, ms, error in (line.split(" ", 4) for line in lines if line.startswith("round "))]

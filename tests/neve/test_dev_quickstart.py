"""`neve dev` as a new user meets it: the node says where Kafka, the registry and the tables are;
records a stock client produced to a topic created on first use come back, exactly, from the line
the node prints for that topic's table (`neve sql`, DuckDB over the table), seconds after their
acknowledgement; the compactor's metrics count them. A node or `neve compactor` without Java, or
with a catalog it cannot reach, does not start and says why in one line."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from bench.servers import scrape
from tests.fixtures import NeveNode, free_port

pytestmark = pytest.mark.integration

WAIT_S = 240.0  # events awaited (a JVM started, rows in the table): generous for a slow, busy machine
RECORDS = 20
TABLE_LINE = re.compile(r"^table (\S+) of topic (\S+) has rows; read them: (.+)$", re.MULTILINE)


def wait_for_log(node: NeveNode, pattern: re.Pattern, timeout: float = WAIT_S) -> re.Match:
    """The first match of `pattern` in the node's output (stdout and stderr), once it is there."""
    deadline = time.monotonic() + timeout
    while True:
        found = pattern.search(node.log_path.read_text(errors="replace"))
        if found:
            return found
        assert node.process.poll() is None, f"the node exited with {node.process.returncode}:\n{node.log_path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {pattern.pattern!r} in the node's output after {timeout} s:\n{node.log_path.read_text()[-3000:]}"
        time.sleep(0.1)


def produce(bootstrap: str, topic: str) -> tuple[list[tuple[int, int, bytes, bytes]], float]:
    """RECORDS keyed records, acks=all: [(partition, offset, key, value)] as acknowledged, and
    the monotonic time of the last acknowledgement."""
    acked: list[tuple[int, int, bytes, bytes]] = []
    last_ack = 0.0

    def on_delivery(err, msg) -> None:
        nonlocal last_ack
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
        last_ack = time.monotonic()

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(topic, key=b"customer-%d" % (i % 4), value=b"order %d of %d" % (i, RECORDS), on_delivery=on_delivery)
    assert producer.flush(60) == 0
    assert len(acked) == RECORDS
    return sorted(acked), last_ack


def seconds_until_rows(command: str, acked: list, last_ack: float) -> float:
    """Seconds from `last_ack` until the one-liner answers exactly `acked` (run again and again:
    what a user would do), each answer holding no row twice and none that was not produced."""
    while (rows := rows_of(command)) != acked:
        assert set(rows) <= set(acked) and len(rows) == len(set(rows)), rows
        assert time.monotonic() < last_ack + WAIT_S, f"{len(rows)} of {len(acked)} rows after {WAIT_S} s"
    return time.monotonic() - last_ack


def box_rows(output: str) -> list[list[str]]:
    """The data rows of DuckDB's boxes, each a list of cell texts."""
    lines = output.splitlines()
    body = lines[next(i for i, line in enumerate(lines) if line.startswith("├")) + 1 :]
    return [[cell.strip() for cell in line.strip("│").split("│")] for line in body if line.startswith("│")]


def rows_of(command: str) -> list[tuple[int, int, bytes, bytes]]:
    """What the printed one-liner answers, run as the user would run it in a shell."""
    done = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    header = box_rows_header(done.stdout)
    assert header == ["partition", "offset", "key_raw", "value_raw", "value_schema_id", "value_error"], done.stdout
    rows = []
    for partition, offset, key, value, schema_id, error in box_rows(done.stdout):
        assert (schema_id, error) == ("NULL", "NULL")
        rows.append((int(partition), int(offset), key.encode(), value.encode()))
    return sorted(rows)


def box_rows_header(output: str) -> list[str]:
    first = next(line for line in output.splitlines() if line.startswith("│"))
    return [cell.strip() for cell in first.strip("│").split("│")]


def metric(samples: dict[str, float], name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # as prometheus_client writes them
    return samples.get(f"{name}{{{want}}}")


def wait_for_metrics(port: int, topic: str, rows: int) -> dict[str, float]:
    """The samples once the compactor counted `rows` raw rows of `topic` and its next cycle found
    no lag (the lag gauges are set as a cycle starts)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        samples = scrape(f"http://127.0.0.1:{port}/metrics")
        if metric(samples, "neve_compactor_rows_total", topic=topic, outcome="raw") == rows and metric(samples, "neve_compactor_table_lag_offsets", topic=topic, partition="0") == 0:
            return samples
        assert time.monotonic() < deadline, {k: v for k, v in samples.items() if "compactor" in k}
        time.sleep(0.2)


def data_files(data_dir: Path, table: str) -> int:
    """Data files of the table's current snapshot, as pyiceberg reads the node's catalog."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("neve", uri=f"sqlite:///{data_dir / 'catalog.db'}", warehouse=f"file://{data_dir / 'warehouse'}")
    return catalog.load_table(table).inspect.files().num_rows


@pytest.mark.xdist_group("spark")
def test_the_printed_one_liner_returns_the_produced_rows_seconds_after_the_acknowledgement(neve_factory):
    registry_port, metrics_port = free_port(), free_port()
    # what `make dev` runs, with the compactor in the node and its default (Spark) runner
    node = neve_factory(env={"NEVE_COMPACTOR_IN_NODE": "true", "NEVE_REGISTRY_PORT": str(registry_port), "NEVE_BROKER_METRICS_PORT": str(metrics_port)})
    data_dir = os.path.abspath(node.data_dir)
    banner = wait_for_log(node, re.compile(r"^  query +(.+)$", re.MULTILINE))
    log = node.log_path.read_text()
    assert f"  Kafka      bootstrap.servers=127.0.0.1:{node.port} (a topic is created on first use)" in log
    assert f"  registry   http://127.0.0.1:{registry_port}" in log
    assert f"catalog {data_dir}/catalog.db, warehouse file://{data_dir}/warehouse, tasks on spark" in log
    assert banner.group(1).endswith(f"sql --data-dir {data_dir} 'SELECT kafka.partition, kafka.offset, * EXCLUDE (kafka, headers) FROM <topic>'")

    topic = "quickstart-orders"
    acked, last_ack = produce(node.bootstrap, topic)
    assert [(p, o) for p, o, _k, _v in acked] == [(0, i) for i in range(RECORDS)]  # created on first use: one partition
    table, announced_topic, command = wait_for_log(node, TABLE_LINE).groups()
    assert (table, announced_topic) == ("neve.quickstart_orders", topic)
    assert command.endswith(f"sql --data-dir {data_dir} 'SELECT kafka.partition, kafka.offset, * EXCLUDE (kafka, headers) FROM quickstart_orders'")

    first = seconds_until_rows(command, acked, last_ack)
    # a warm node (its Spark session started by the first cycle): the next records as fast as the freshness setting allows
    more, last_ack = produce(node.bootstrap, topic)
    assert [(p, o) for p, o, _k, _v in more] == [(0, i) for i in range(RECORDS, 2 * RECORDS)]
    acked = sorted(acked + more)
    then = seconds_until_rows(command, acked, last_ack)
    print(f"\nquickstart: the printed one-liner returned the rows {first:.1f} s after the last acknowledgement (Spark started on this first need), {then:.1f} s for the next {RECORDS}")

    # the same table as JSON lines, for scripts
    query = "SELECT kafka.offset AS o, key_raw::VARCHAR AS k FROM quickstart_orders ORDER BY o"
    done = subprocess.run([sys.executable, "-m", "neve", "sql", "--data-dir", data_dir, "--format", "json", query], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [{"o": o, "k": k.decode()} for _p, o, k, _v in acked]

    samples = wait_for_metrics(metrics_port, topic, len(acked))
    assert metric(samples, "neve_compactor_files_total", topic=topic) == data_files(node.data_dir, table)
    assert metric(samples, "neve_compactor_table_lag_seconds", topic=topic, partition="0") == 0
    assert samples["neve_compactor_cycle_failures_total"] == 0
    assert samples["neve_compactor_cycle_seconds_count"] == samples[f'neve_compactor_cycles_total{{topic="{topic}"}}'] >= 1


def test_neve_compactor_serves_its_metrics(neve_factory, artifacts_dir):
    node = neve_factory()  # the compactor off: `neve compactor` does the work afterwards
    acked, _ = produce(node.bootstrap, "metered")
    assert node.stop() == 0
    port = free_port()
    env = {**os.environ, "NEVE_COMPACTOR_RUNNER": "in-process", "NEVE_COMPACTOR_INTERVAL_MS": "200"}
    with open(artifacts_dir / "compactor.log", "wb") as log:
        compactor = subprocess.Popen([sys.executable, "-m", "neve", "compactor", "--data-dir", str(node.data_dir), "--metrics-port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        samples = wait_for_metrics(port, "metered", len(acked))
        assert metric(samples, "neve_compactor_files_total", topic="metered") == data_files(node.data_dir, "neve.metered") >= 1
        assert metric(samples, "neve_compactor_parquet_bytes_total", topic="metered") > 0
    finally:
        compactor.send_signal(signal.SIGINT)
        assert compactor.wait(60) == 0


def test_neve_compactor_once_exits_non_zero_naming_the_topic_it_could_not_compact(neve_factory, artifacts_dir):
    """`neve compactor --once` is what scripts and jobs run: a topic whose compaction fails (here
    its WAL objects are gone) makes it exit 1 and say which, not print "caught up"."""
    node = neve_factory()
    produce(node.bootstrap, "lost")
    assert node.stop() == 0
    wal = [p for p in (Path(node.data_dir) / "objects").rglob("*") if p.is_file() and "wal" in p.relative_to(Path(node.data_dir) / "objects").parts[:1]]
    assert wal
    for path in wal:
        path.unlink()
    env = {**os.environ, "NEVE_COMPACTOR_RUNNER": "in-process"}
    done = subprocess.run([sys.executable, "-m", "neve", "compactor", "--once", "--data-dir", str(node.data_dir)], capture_output=True, text=True, env=env, timeout=WAIT_S)
    (artifacts_dir / "compactor.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "neve compactor: compaction failed for lost after 0 cycles" in done.stderr
    assert "caught up" not in done.stdout


def test_neve_sql_says_when_there_is_no_table_yet(tmp_path):
    done = subprocess.run([sys.executable, "-m", "neve", "sql", "--data-dir", str(tmp_path), "SELECT * FROM t"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == f"neve sql: no tables yet: {tmp_path}/catalog.db does not exist (the compactor creates a topic's table at its first records)\n"


NO_JAVA = {"PATH": str(Path(sys.executable).parent), "JAVA_HOME": "/nonexistent"}


@pytest.mark.parametrize("command", ["dev", "compactor"])
@pytest.mark.parametrize("missing", ["java", "catalog"])
def test_a_missing_dependency_stops_the_start_with_one_line(tmp_path, command, missing):
    port = free_port()
    if missing == "java":
        env = dict(NO_JAVA)
        fix = "or run the tasks without Spark: NEVE_COMPACTOR_RUNNER=in-process"
        want = f"neve: the compactor runs its tasks on Spark, which needs Java 17: JAVA_HOME=/nonexistent has no bin/java (apt-get install openjdk-17-jre-headless, or set JAVA_HOME to a JDK); {fix}"
        if command == "dev":
            want += ", or the node without tables: NEVE_COMPACTOR_IN_NODE=false"
    else:
        closed = free_port()  # nothing listens there
        env = {"NEVE_COMPACTOR_CATALOG_URL": f"postgresql://neve:secret@127.0.0.1:{closed}/x", "NEVE_COMPACTOR_WAREHOUSE": f"file://{tmp_path}/warehouse", "NEVE_COMPACTOR_RUNNER": "in-process"}
        want = (
            f"neve: cannot open the Iceberg catalog postgresql+psycopg2://neve:***@127.0.0.1:{closed}/x: OperationalError: connection to server at "
            f'"127.0.0.1", port {closed} failed: Connection refused (check compactor.catalog_url, NEVE_COMPACTOR_CATALOG_URL, and that its server runs)'
        )
    args = ["dev", "--port", str(port)] if command == "dev" else ["compactor"]
    env = {**os.environ, "NEVE_REGISTRY_PORT": "0", **env}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "neve", *args, "--data-dir", str(tmp_path / "data")], env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", want + "\n")
    assert time.monotonic() - started < 60  # fails fast: no retries, no hang

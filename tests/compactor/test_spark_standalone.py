"""Issue 21: nothing in the compactor's job assumes one machine. `neve compactor --once` with
spark.master naming a Spark standalone cluster (a master and one 1-core worker on loopback)
compacts what a `neve dev` node acknowledged: the tasks run in the worker's executor, a JVM and
Python workers of its own that read the WAL objects and write the Parquet files themselves, and
the driver commits them. The table then holds exactly one row per acknowledged offset, byte for
byte, and the index names Parquet only."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from metadata.model import ObjectType
from tests.compactor.produced import CODECS, PARTITIONS, check_rows, produce_raw
from tests.compactor.test_service import WAIT_S, index_types
from tests.readers import rows_pyiceberg

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900), pytest.mark.xdist_group("spark")]

PER_CODEC = 400  # records per codec: 2,000 over two partitions, every ninth a tombstone
COMPACT_TIMEOUT_S = 600.0  # a driver JVM, an executor JVM and the jars shipped to it, on a busy 2-core machine


def test_the_compactor_runs_its_tasks_on_a_spark_standalone_cluster(neve_factory, spark_standalone, artifacts_dir):
    node = neve_factory(env={"NEVE_WAL_LINGER_MS": "5"})  # the compactor off (tests/fixtures.py)
    produced = produce_raw(node.bootstrap, per_codec=PER_CODEC)
    assert len(produced.want) == len(CODECS) * PER_CODEC and set(produced.counts()) == set(range(PARTITIONS))
    assert node.stop() == 0
    data_dir = node.data_dir.resolve()
    assert index_types(data_dir, produced.topic) == {ObjectType.WAL}

    # SPARK_LOCAL_IP: the driver binds and advertises loopback (the Helm chart sets the pod IP);
    # without it Spark picks the host's first non-loopback address for executors to call back to
    env = {**os.environ, "NEVE_COMPACTOR_RUNNER": "spark", "NEVE_COMPACTOR_SPARK_MASTER": spark_standalone.master_url, "SPARK_LOCAL_IP": "127.0.0.1"}
    log = artifacts_dir / "compactor.log"
    with open(log, "wb") as out:
        done = subprocess.run([sys.executable, "-m", "neve", "compactor", "--once", "--data-dir", str(data_dir)], stdout=out, stderr=subprocess.STDOUT, env=env, timeout=COMPACT_TIMEOUT_S, check=False)
    output = log.read_text(errors="replace")
    assert done.returncode == 0, output[-3000:]
    assert "tasks run spark" in output
    assert re.search(rf"^caught up: \d+ cycles, {len(produced.want)} rows$", output, re.MULTILINE), output[-3000:]

    catalog = SqlCatalog("neve", uri=f"sqlite:///{data_dir / 'catalog.db'}", warehouse=f"file://{data_dir / 'warehouse'}")
    check_rows(produced, rows_pyiceberg(catalog.load_table("neve." + produced.topic.replace("-", "_"))), where="standalone")
    assert index_types(data_dir, produced.topic) == {ObjectType.PARQUET}

    # The tasks ran in the cluster's executor, which called the driver back on loopback.
    app = wait_completed_app(spark_standalone)
    assert (app["name"], app["state"]) == ("neve-compactor", "FINISHED")
    executor_logs = sorted(spark_standalone.work_dir.glob(f"{app['id']}/*/stderr"))
    assert len(executor_logs) == 1, executor_logs  # one worker of one core: one executor
    executor_log = executor_logs[0].read_text(errors="replace")
    assert re.search(r"Connecting to driver: spark://CoarseGrainedScheduler@(127\.0\.0\.1|localhost):\d+$", executor_log, re.MULTILINE), executor_log[-3000:]
    running, finished = re.findall(r"Running task (\S+) in stage (\S+)", executor_log), re.findall(r"Finished task (\S+) in stage (\S+)", executor_log)
    assert finished and sorted(finished) == sorted(running), (running, finished)


def wait_completed_app(cluster) -> dict:
    """The master's one completed application: the driver's exit unregisters it, which the master
    hears a moment later."""
    deadline = time.monotonic() + WAIT_S
    while True:
        state = cluster.state()
        if state["completedapps"] or time.monotonic() > deadline:
            assert not state["activeapps"] and len(state["completedapps"]) == 1, state
            return state["completedapps"][0]
        time.sleep(0.2)

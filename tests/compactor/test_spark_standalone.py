"""Issue 21: nothing in the compactor's job assumes one machine. `neve compactor --once` with
spark.master naming a Spark standalone cluster (a master and one 1-core worker on loopback, whose
environment holds none of the driver's S3 keys, as another machine's would not) compacts what a
`neve dev` node acknowledged: the tasks run in the worker's executor, a JVM and Python workers of
its own that read the WAL objects and write the Parquet files themselves, and the driver commits
them. The table then holds exactly one row per acknowledged offset, byte for byte, and the index
names Parquet only; with the WAL in the node's data dir, and with the WAL and the table's files
on S3 (SeaweedFS), whose keys the executors get from the driver."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from compactor.config import CompactorConfig
from compactor.files.spark import session_conf
from metadata.model import ObjectType
from tests.compactor.produced import CODECS, PARTITIONS, check_rows, produce_raw
from tests.compactor.test_service import WAIT_S, index_types
from tests.fixtures import S3_KEY, S3_SECRET
from tests.readers import rows_pyiceberg

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900), pytest.mark.xdist_group("spark")]

PER_CODEC = 400  # records per codec: 2,000 over two partitions, every ninth a tombstone
SMALL_TOPICS = 3  # topics of a few records beside it
COMPACT_TIMEOUT_S = 600.0  # a driver JVM, an executor JVM and the jars shipped to it, on a busy 2-core machine


@pytest.mark.parametrize("storage", ["data-dir", "s3"])
def test_the_compactor_runs_its_tasks_on_a_spark_standalone_cluster(storage, neve_factory, spark_standalone, artifacts_dir, request):
    stores, io = {}, {}
    if storage == "s3":  # the WAL and the table's files in the worker's SeaweedFS, under a prefix of this test's
        s3 = request.getfixturevalue("seaweedfs")
        prefix = f"standalone-{uuid.uuid4().hex[:10]}"
        stores = {**s3.env, "NEVE_WAL_OBJECT_STORE": s3.object_store_url(prefix), "NEVE_COMPACTOR_WAREHOUSE": f"s3://{s3.bucket}/{prefix}/warehouse",
                  "NEVE_COMPACTOR_S3_ENDPOINT": s3.endpoint, "NEVE_COMPACTOR_S3_ACCESS_KEY_ID": S3_KEY, "NEVE_COMPACTOR_S3_SECRET_ACCESS_KEY": S3_SECRET}  # fmt: skip
        io = {"s3.endpoint": s3.endpoint, "s3.access-key-id": S3_KEY, "s3.secret-access-key": S3_SECRET, "s3.region": "us-east-1"}
    node = neve_factory(env={"NEVE_WAL_LINGER_MS": "5", **stores})  # the compactor off (tests/fixtures.py)
    produced = produce_raw(node.bootstrap, per_codec=PER_CODEC)
    assert len(produced.want) == len(CODECS) * PER_CODEC and set(produced.counts()) == set(range(PARTITIONS))
    small = [produce_raw(node.bootstrap, per_codec=30 + i) for i in range(SMALL_TOPICS)]  # compacted in the same cycle, by the same job
    assert node.stop() == 0
    data_dir = node.data_dir.resolve()
    assert {t for p in (produced, *small) for t in index_types(data_dir, p.topic)} == {ObjectType.WAL}

    # SPARK_LOCAL_IP: the driver binds and advertises loopback (the Helm chart sets the pod IP);
    # without it Spark picks the host's first non-loopback address for executors to call back to
    env = {**os.environ, **stores, "NEVE_COMPACTOR_RUNNER": "spark", "NEVE_COMPACTOR_SPARK_MASTER": spark_standalone.master_url, "SPARK_LOCAL_IP": "127.0.0.1"}
    log = artifacts_dir / "compactor.log"
    with open(log, "wb") as out:
        done = subprocess.run([sys.executable, "-m", "neve", "compactor", "--once", "--data-dir", str(data_dir)], stdout=out, stderr=subprocess.STDOUT, env=env, timeout=COMPACT_TIMEOUT_S, check=False)
    output = log.read_text(errors="replace")
    assert done.returncode == 0, output[-3000:]
    assert "tasks run spark" in output
    rows = len(produced.want) + sum(len(p.want) for p in small)
    assert re.search(rf"^caught up: {1 + SMALL_TOPICS} cycles, {rows} rows$", output, re.MULTILINE), output[-3000:]
    # one cycle, one job: the tasks of every topic ran in it
    assert re.findall(r"cycle's tasks ran.*", output) and all(f'"topics": {1 + SMALL_TOPICS}' in line for line in re.findall(r"cycle's tasks ran.*", output)), output[-3000:]

    catalog = SqlCatalog("neve", uri=f"sqlite:///{data_dir / 'catalog.db'}", warehouse=f"file://{data_dir / 'warehouse'}", **io)
    table = catalog.load_table("neve." + produced.topic.replace("-", "_"))
    check_rows(produced, rows_pyiceberg(table), where="standalone")
    for p in small:
        check_rows(p, rows_pyiceberg(catalog.load_table("neve." + p.topic.replace("-", "_"))), where="standalone")
        assert index_types(data_dir, p.topic) == {ObjectType.PARQUET}
    warehouse = stores.get("NEVE_COMPACTOR_WAREHOUSE", f"file://{data_dir / 'warehouse'}")
    files = table.inspect.files().column("file_path").to_pylist()
    assert files and all(f.startswith(f"{warehouse}/") for f in files), files
    assert index_types(data_dir, produced.topic) == {ObjectType.PARQUET}

    # The tasks ran in the cluster's executor, which called the driver back on loopback.
    app = wait_completed_app(spark_standalone)
    assert (app["name"], app["state"]) == ("neve-compactor", "FINISHED")
    executor_logs = {path: path.read_text(errors="replace") for path in sorted(spark_standalone.work_dir.glob(f"{app['id']}/*/stderr"))}
    # one worker of one core: one executor ran the tasks. When that executor exits with the app,
    # the master may have the worker start another before it hears the app is over (seen on a
    # loaded machine): killed at once, it runs nothing.
    ran = [log for log in executor_logs.values() if "Running task" in log]
    assert len(ran) == 1, list(executor_logs)
    executor_log = ran[0]
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


def test_a_clusters_executors_get_the_drivers_s3_keys_and_a_local_masters_inherit_them():
    environ = {"AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_REGION": "eu-west-1", "AWS_SESSION_TOKEN": "", "HOME": "/root"}
    handed = {k: v for k, v in session_conf(CompactorConfig(spark_master="spark://h:7077"), [], environ).items() if k.startswith("spark.executorEnv.")}
    assert handed == {"spark.executorEnv.AWS_ACCESS_KEY_ID": "key", "spark.executorEnv.AWS_SECRET_ACCESS_KEY": "secret", "spark.executorEnv.AWS_REGION": "eu-west-1"}
    assert not any(k.startswith("spark.executorEnv.") for k in session_conf(CompactorConfig(spark_master="local[2]"), [], environ))
    assert not any(k.startswith("spark.executorEnv.") for k in session_conf(CompactorConfig(spark_master="spark://h:7077"), [], {"HOME": "/root"}))  # an IAM role

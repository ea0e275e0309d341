"""`neve broker` fails fast, saying why, when its object store cannot be used."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from tests.fixtures import free_port

pytestmark = pytest.mark.integration


def run_broker(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "neve", "broker", "--port", str(free_port())],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_broker_refuses_to_start_without_its_bucket(etcd_server, seaweedfs):
    root = f"t{uuid.uuid4().hex[:12]}"
    env = {**seaweedfs.env, "NEVE_METADATA_URL": f"{etcd_server.url}/{root}", "NEVE_WAL_OBJECT_STORE": f"s3://no-such-bucket/{root}?endpoint={seaweedfs.endpoint}"}
    done = run_broker(env)
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"neve: object store s3://no-such-bucket/{root}: s3://no-such-bucket/{root}/: no such bucket" in done.stderr


def test_broker_refuses_to_start_when_s3_does_not_answer(etcd_server):
    root = f"t{uuid.uuid4().hex[:12]}"
    closed = free_port()  # nothing listens there
    env = {"NEVE_METADATA_URL": f"{etcd_server.url}/{root}", "NEVE_WAL_OBJECT_STORE": f"s3://neve/{root}?endpoint=http://127.0.0.1:{closed}&retries=1&timeout=2"}
    done = run_broker(env)
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"neve: object store s3://neve/{root}: list s3://neve/{root}/" in done.stderr

"""The image (deploy/Dockerfile), checked the ways that exist without a Docker engine: hadolint
passes; what it copies is every component package pyproject.toml installs and nothing the
.dockerignore leaves out; the extras it installs exist; it runs as a non-root user with a health
check and `neve` as its entry point; and that health check (deploy/docker/healthcheck.py) tells a
serving broker from a dead one, run against a real `neve dev`."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
import tomllib

import pytest

from tests.deploy.tools import DEPLOY, ROOT, run, tool
from tests.fixtures import free_port

DOCKERFILE = DEPLOY / "Dockerfile"
HEALTHCHECK = DEPLOY / "docker" / "healthcheck.py"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def test_hadolint_passes():
    done = run([tool("hadolint"), "--failure-threshold", "info", str(DOCKERFILE)])
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_copies_every_component_package_and_the_ignore_file_lets_them_in():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # the benchmark and the fault harness run from a checkout, beside the image, not in it
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]} - {"bench", "chaos"}
    copies = [args.split() for word, args in instructions() if word == "COPY" and "--from" not in args]
    sources = {src.rstrip("/") for *srcs, _dest in copies for src in srcs}
    assert packages <= sources, f"packages the image does not copy: {packages - sources}"
    allowed = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")]
    for source in sources:
        assert (ROOT / source).exists(), source
        assert any(fnmatch.fnmatch(source, a) or source.startswith(a + "/") for a in allowed), f"{source} is left out of the build context by .dockerignore"
    installs = " ".join(args for word, args in instructions() if word == "RUN" and "pip install" in args)
    extras = re.search(r"'\.\[([a-z0-9,]+)\]'", installs).group(1).split(",")
    assert set(extras) <= set(project["project"]["optional-dependencies"]), extras
    assert {"s3", "etcd", "table"} <= set(extras)  # S3 WAL, etcd metadata, the compactor and registry


def test_the_image_runs_neve_as_a_non_root_user_with_a_health_check():
    final = instructions()
    final = final[max(i for i, (word, _) in enumerate(final) if word == "FROM") :]
    users = [args for word, args in final if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    (health,) = [args for word, args in final if word == "HEALTHCHECK"]
    assert health.endswith('CMD ["neve-healthcheck"]')
    assert "COPY deploy/docker/healthcheck.py /usr/local/bin/neve-healthcheck" in [f"COPY {args}" for word, args in final if word == "COPY"]
    (entrypoint,) = [args for word, args in final if word == "ENTRYPOINT"]
    assert entrypoint == '["tini", "--", "neve"]'
    packages = " ".join(args for word, args in final if word == "RUN")
    for package in ("openjdk-17-jre-headless", "procps", "libpostgresql-jdbc-java", "libxerial-sqlite-jdbc-java", "tini"):
        assert package in packages  # Java for Spark, and the JDBC drivers compactor/files/spark.py looks for


def healthcheck(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HEALTHCHECK), *args], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)


@pytest.mark.integration
def test_the_health_check_answers_for_a_serving_broker_and_not_for_a_dead_one(neve_node):
    env = {**os.environ, "NEVE_BROKER_PORT": str(neve_node.port)}
    done = healthcheck("dev", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"neve dev healthy: Kafka on 127.0.0.1:{neve_node.port} (PLAINTEXT)"
    closed = {**os.environ, "NEVE_BROKER_PORT": str(free_port())}
    done = healthcheck("broker", env=closed)
    assert done.returncode == 1 and done.stderr.startswith("neve broker unhealthy: ConnectionRefusedError"), done.stderr
    done = healthcheck("compactor", env={**os.environ, "NEVE_COMPACTOR_METRICS_PORT": str(free_port())})
    assert done.returncode == 1 and "unhealthy" in done.stderr


def test_the_health_check_finds_the_command_on_the_init_process_command_line():
    sys.path.insert(0, str(HEALTHCHECK.parent))
    try:
        import healthcheck as module
    finally:
        sys.path.remove(str(HEALTHCHECK.parent))
    assert module.parse(["tini", "--", "neve", "broker", "--config", "/etc/neve.toml"]) == ("broker", "/etc/neve.toml")
    assert module.parse(["tini", "--", "neve", "compactor", "--config=/c.toml"]) == ("compactor", "/c.toml")
    assert module.parse(["tini", "--", "neve", "dev", "--host", "0.0.0.0"]) == ("dev", None)
    with pytest.raises(SystemExit):
        module.parse(["tini", "--", "neve", "sql"])

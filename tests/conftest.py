from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.fixtures import NeveNode

ARTIFACTS = Path(__file__).parent / ".artifacts"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call" or report.failed:
        item.stash.setdefault(_FAILED, False)
        if report.failed:
            item.stash[_FAILED] = True
    return report


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def artifacts_dir(request) -> Path:
    """A per-test directory for logs and data; removed if the test passes, kept if it fails."""
    name = request.node.nodeid.replace("/", "_").replace("::", "__").replace("[", "-").replace("]", "")
    path = ARTIFACTS / name[:150]
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    yield path
    if not request.node.stash.get(_FAILED, False):
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def neve_factory(artifacts_dir):
    """Start `neve dev` nodes: `neve_factory(env={...}, extra_args=[...])`; all stopped at teardown."""
    nodes: list[NeveNode] = []

    def make(env: dict[str, str] | None = None, extra_args: list[str] | None = None) -> NeveNode:
        n = len(nodes)
        node = NeveNode(
            data_dir=artifacts_dir / f"node{n}-data",
            log_path=artifacts_dir / f"node{n}.log",
            env=env or {},
            extra_args=extra_args or [],
        )
        nodes.append(node)
        return node.start()

    yield make
    for node in nodes:
        try:
            node.stop()
        except Exception:
            node.kill9()


@pytest.fixture
def neve_node(neve_factory) -> NeveNode:
    return neve_factory()


@pytest.fixture(scope="session")
def java_client():
    """The stock Java Kafka client as a subprocess driver (tests/clients/java_client.py),
    compiled once per session: `java_client.produce(...)`, `java_client.consume(...)`."""
    from tests.clients import java_client as driver

    driver.compiled()
    return driver

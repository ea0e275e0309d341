from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import settings

from tests.fixtures import NeveNode

# No Hypothesis deadlines: they time the machine, not the code (a slower machine ran the WAL
# format's round trip example in 694 ms against the default 200 ms).
settings.register_profile("neve", deadline=None)
settings.load_profile("neve")

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


# -- a leaderless cluster: brokers over a real etcd and a real SeaweedFS (S3) ------------------------

import time  # noqa: E402
import uuid  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

from tests.cluster.workload import brokers_listed_by  # noqa: E402
from tests.fixtures import Etcd, SeaweedFS  # noqa: E402


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory) -> Etcd:
    """One etcd per xdist worker, shared by its tests; each test keeps its keys under its own root
    (a cluster_factory cluster does). Tests that stop etcd use `private_etcd` instead."""
    server = Etcd("etcd", tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory) -> SeaweedFS:
    """One SeaweedFS (`weed mini`: S3 + Iceberg REST) per xdist worker, shared by its tests; each
    test keeps its objects under its own prefix. Tests that stop S3 use `private_seaweedfs`."""
    server = SeaweedFS("seaweedfs", tmp_path_factory.mktemp("seaweedfs")).start()
    yield server
    server.stop()


@pytest.fixture
def private_etcd(artifacts_dir) -> Etcd:
    """An etcd of this test alone (it may stop, kill and restart it: `.start()` reuses the ports
    and data dir); its log is kept with the test's artifacts."""
    server = Etcd("etcd", artifacts_dir / "etcd").start()
    yield server
    server.stop()


@pytest.fixture
def private_seaweedfs(artifacts_dir) -> SeaweedFS:
    """A SeaweedFS of this test alone, like `private_etcd`."""
    server = SeaweedFS("seaweedfs", artifacts_dir / "seaweedfs").start()
    yield server
    server.stop()


@dataclass
class Cluster:
    """Brokers sharing one metadata root in etcd and one object prefix in S3."""

    etcd: Etcd
    s3: SeaweedFS
    root: str  # etcd key prefix
    prefix: str  # S3 key prefix inside SeaweedFS.bucket
    nodes: list[NeveNode] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def metadata_url(self) -> str:
        return f"{self.etcd.url}/{self.root}"

    @property
    def object_store_url(self) -> str:
        return self.s3.object_store_url(self.prefix)

    def wait_formed(self, timeout: float = 60.0) -> None:
        """Until every broker's Metadata lists every broker: a broker learns of the others through
        the etcd watch, some time after it listens (a slow machine's second broker was not yet seen)."""
        want = list(range(len(self.nodes)))
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            while (seen := sorted(brokers_listed_by(node))) != want:
                assert time.monotonic() < deadline, f"broker {node.port} lists brokers {seen} after {timeout}s, not {want}"
                time.sleep(0.05)



@pytest.fixture
def cluster_factory(request, artifacts_dir):
    """Start a cluster: `cluster_factory(zones=("a", "b", "c"), env={...}, etcd=..., s3=...)` starts
    one `neve broker` per zone (node ids 0, 1, ...; logs broker<i>.log in the artifacts dir) over the
    session's `etcd_server` and `seaweedfs` unless private servers are given, under a metadata root
    and an object prefix unique to this call, and returns once every broker sees every other.
    Every broker is stopped at teardown."""
    clusters: list[Cluster] = []

    def make(zones=("a", "b", "c"), env: dict[str, str] | None = None, etcd: Etcd | None = None, s3: SeaweedFS | None = None) -> Cluster:
        etcd = etcd or request.getfixturevalue("etcd_server")
        s3 = s3 or request.getfixturevalue("seaweedfs")
        name = f"t{uuid.uuid4().hex[:12]}"
        cluster = Cluster(etcd, s3, root=name, prefix=name)
        clusters.append(cluster)
        for i, zone in enumerate(zones):
            n = sum(len(c.nodes) for c in clusters)
            data_dir = artifacts_dir / f"broker{n}-data"
            node_env = {
                **s3.env,
                "NEVE_METADATA_URL": cluster.metadata_url,
                "NEVE_WAL_OBJECT_STORE": cluster.object_store_url,
                "NEVE_BROKER_NODE_ID": str(i),
                "NEVE_BROKER_ZONE": zone or "",
                "NEVE_WAL_LINGER_MS": "20",
                "NEVE_DATA_DIR": str(data_dir),
                **(env or {}),
            }
            node = NeveNode(data_dir=data_dir, log_path=artifacts_dir / f"broker{n}.log", env=node_env, command="broker")
            cluster.nodes.append(node)
            node.start()
        cluster.wait_formed()
        return cluster

    yield make
    for cluster in clusters:
        for node in cluster.nodes:
            try:
                node.stop()
            except Exception:
                node.kill9()


# -- PostgreSQL (the JDBC-compatible Iceberg catalog) -----------------------------------------------

from bench.servers import Postgres, SparkStandalone  # noqa: E402


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory) -> Postgres:
    """One PostgreSQL (Debian's) per xdist worker, fsync off; each test takes a database of its
    own from `postgres_db`."""
    work = tmp_path_factory.mktemp("postgres")
    server = Postgres(work, work / "postgres.log", durable=False)
    server.start()
    yield server
    server.remove_data()


@pytest.fixture
def postgres_db(postgres_server) -> str:
    """A fresh database of this test on the session's PostgreSQL: its URL,
    postgresql://postgres@127.0.0.1:PORT/NAME (trust auth, no password)."""
    return postgres_server.create_database(f"t{uuid.uuid4().hex[:12]}")


# -- Iceberg catalogs and the one Spark session (tests/readers.py reads the tables) ------------------

from tests.readers import IcebergCatalog  # noqa: E402

ICEBERG_NAMESPACE = "neve"


def _iceberg_catalog(config) -> IcebergCatalog:
    from compactor.catalog import catalog_target, load_catalog

    catalog = load_catalog(config)
    catalog.create_namespace_if_not_exists(config.namespace)
    return IcebergCatalog(config, catalog_target(config), catalog)


@pytest.fixture(scope="session")
def sqlite_catalog(tmp_path_factory) -> IcebergCatalog:
    """A SQL catalog on SQLite, its warehouse a local directory, shared by the worker's tests
    (each creates tables of its own names). Its name differs from the other catalogs' so the
    one Spark session can hold them all (a JDBC catalog sees tables only under pyiceberg's name)."""
    from compactor.config import CompactorConfig

    root = tmp_path_factory.mktemp("sqlite-catalog")
    return _iceberg_catalog(CompactorConfig(catalog_url=f"sqlite://{root / 'catalog.db'}", catalog_name="neve_sqlite", namespace=ICEBERG_NAMESPACE))


@pytest.fixture(scope="session")
def postgres_catalog(postgres_server, tmp_path_factory) -> IcebergCatalog:
    """A SQL catalog on the worker's PostgreSQL (a database of its own), warehouse a local directory."""
    from compactor.config import CompactorConfig

    url = postgres_server.create_database("iceberg_catalog")
    warehouse = tmp_path_factory.mktemp("postgres-warehouse").as_uri()
    return _iceberg_catalog(CompactorConfig(catalog_url=url, warehouse=warehouse, catalog_name="neve_postgres", namespace=ICEBERG_NAMESPACE))


@pytest.fixture(scope="session")
def rest_catalog(seaweedfs) -> IcebergCatalog:
    """SeaweedFS's Iceberg REST catalog (the worker's `seaweedfs`), tables in its table bucket on
    its S3; the catalog takes the S3 keys as its OAuth2 client credential."""
    from compactor.config import CompactorConfig
    from tests.fixtures import S3_KEY, S3_SECRET

    config = CompactorConfig(
        catalog_url=f"rest+http://127.0.0.1:{seaweedfs.ports['s3.port.iceberg']}", catalog_name="neve_rest", namespace=ICEBERG_NAMESPACE,
        warehouse=f"s3://{seaweedfs.table_bucket}/", s3_endpoint=seaweedfs.endpoint, s3_access_key_id=S3_KEY, s3_secret_access_key=S3_SECRET,
    )  # fmt: skip
    return _iceberg_catalog(config)


@pytest.fixture(scope="session")
def spark_session():
    """The compactor's SparkSession (compactor/files/spark.py, local[2]) with the jars of every catalog
    kind; a test registers its catalog with compactor.files.spark.register_catalog. One JVM per worker:
    mark Spark tests @pytest.mark.xdist_group("spark") so that one worker runs them all."""
    from compactor.config import CompactorConfig
    from compactor.files.spark import spark_session as start

    spark = start(CompactorConfig(spark_master="local[2]"), all_catalog_kinds=True)
    yield spark
    spark.stop()


@pytest.fixture
def spark_standalone(artifacts_dir) -> SparkStandalone:
    """A Spark standalone master and one worker (1 core, 1 GiB) of this test on loopback; their
    logs and the worker's executor dirs (spark/work/app-*/) are kept with the test's artifacts.
    A driver reaches it as `spark_standalone.master_url`, from a process of its own (this one may
    hold the local `spark_session`: one SparkContext a process)."""
    cluster = SparkStandalone(artifacts_dir / "spark" / "work", artifacts_dir / "spark")
    cluster.start()
    yield cluster
    cluster.stop()

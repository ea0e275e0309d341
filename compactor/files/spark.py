"""The one SparkSession the compactor uses: its jars (the Iceberg runtime, the JDBC drivers, the
AWS SDK for S3 tables), Iceberg's SQL extensions and the catalog pyiceberg commits to, found and
checked here so that a missing Java or jar is one clear error at start. Starting it takes seconds
(a JVM): call `spark_session` off the event loop."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..catalog import TABLE_EXTRA, CatalogTarget, catalog_target
from ..config import CompactorConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ICEBERG_RUNTIME = "iceberg-spark-runtime-3.5_2.12-*.jar"  # Spark 3.5, Scala 2.12 (pyspark 3.5's)
ICEBERG_RUNTIME_PACKAGE = "snowpark_connect_deps_iceberg"  # PyPI snowpark-connect-deps-iceberg==1.0.2
AWS_SDK_PACKAGE = "bodo_iceberg_connector"  # PyPI bodo-iceberg-connector: AWS SDK v2 jars under jars/libs/
# JDBC drivers: Debian's (libpostgresql-jdbc-java, libxerial-sqlite-jdbc-java), then the test
# extra's Flink wheel, which carries the PostgreSQL one too
JDBC_DRIVERS = {
    "postgresql": ("/usr/share/java/postgresql.jar", ("pyflink", "lib/postgresql.jar"), "libpostgresql-jdbc-java"),
    "sqlite": ("/usr/share/java/sqlite-jdbc.jar", None, "libxerial-sqlite-jdbc-java"),
}
SPARK_CATALOG = "org.apache.iceberg.spark.SparkCatalog"
# What a task reads the WAL's S3 with (wal/s3.py, obstore: the AWS environment). A local master's
# executors are this process's Python workers and inherit it; a cluster's run on other machines,
# in their workers' environment, so the driver hands these on (spark.executorEnv.*). Absent here
# (an IAM role): nothing is handed on, and executors use their own machine's role.
EXECUTOR_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION")
S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
DAEMON_MODULE = "compactor.files.spark_daemon"  # forks Python workers with the tasks' modules imported


class SparkStartError(RuntimeError):
    """Spark cannot start here (no Java, a jar missing); the message says what to install."""


def check_java() -> str:
    """`java -version`'s first line, or SparkStartError if there is no working Java."""
    home = os.environ.get("JAVA_HOME")
    java = shutil.which("java", path=os.path.join(home, "bin") if home else None)
    if java is None:
        where = f"JAVA_HOME={home} has no bin/java" if home else "no `java` on PATH"
        raise SparkStartError(f"the compactor runs its tasks on Spark, which needs Java 17: {where} (apt-get install openjdk-17-jre-headless, or set JAVA_HOME to a JDK)")
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SparkStartError(f"`{java} -version` failed: {e}") from e
    if done.returncode != 0:
        raise SparkStartError(f"`{java} -version` exited with {done.returncode}: {done.stderr.strip()[-500:]}")
    return (done.stderr or done.stdout).splitlines()[0]


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None


def iceberg_runtime_jar() -> Path:
    package = _package_dir(ICEBERG_RUNTIME_PACKAGE)
    found = sorted(package.glob(f"jars/{ICEBERG_RUNTIME}")) if package else []
    if not found:
        raise SparkStartError(f"the Iceberg Spark runtime ({ICEBERG_RUNTIME}) is not installed: {TABLE_EXTRA} (snowpark-connect-deps-iceberg==1.0.2)")
    return found[-1]


def jdbc_driver_jar(kind: str) -> Path:
    """The JDBC driver for `kind` ("postgresql", "sqlite")."""
    system, in_wheel, debian = JDBC_DRIVERS[kind]
    candidates = [Path(system)]
    if in_wheel and (package := _package_dir(in_wheel[0])):
        candidates.append(package / in_wheel[1])
    for path in candidates:
        if path.exists():
            return path
    raise SparkStartError(f"Spark's JDBC catalog needs the {kind} JDBC driver, not found at {', '.join(map(str, candidates))}: apt-get install {debian}")


def aws_sdk_jars() -> list[Path]:
    """The AWS SDK v2 jars Iceberg's S3FileIO needs (S3 tables, REST catalogs)."""
    libs = (_package_dir(AWS_SDK_PACKAGE) or Path("/nonexistent")) / "jars" / "libs"
    s3 = sorted(libs.glob("s3-2.*.jar"))
    if not s3:
        raise SparkStartError(f"Spark reads S3 tables through the AWS SDK v2 jars, not found: {TABLE_EXTRA} (bodo-iceberg-connector)")
    version = s3[-1].name.removeprefix("s3-").removesuffix(".jar")
    # the SDK's modules share its version; reactive-streams and eventstream are what they use besides
    return sorted(libs.glob(f"*-{version}.jar")) + sorted(libs.glob("reactive-streams-*.jar")) + sorted(libs.glob("eventstream-*.jar"))


def spark_jars(target: CatalogTarget | None = None, *, everything: bool = False) -> list[Path]:
    """The jars a session needs for `target` (or, `everything`, for any catalog kind: the
    catalogs of a session may be added after its JVM started, its jars may not)."""
    jars = [iceberg_runtime_jar()]
    needs_sql = everything or (target is not None and target.kind == "sql")
    if needs_sql and (everything or target.jdbc_url.startswith("jdbc:postgresql:")):
        jars.append(jdbc_driver_jar("postgresql"))
    if needs_sql and (everything or target.jdbc_url.startswith("jdbc:sqlite:")):
        jars.append(jdbc_driver_jar("sqlite"))
    if everything or (target is not None and uses_s3(target)):
        jars += aws_sdk_jars()
    return jars


def uses_s3(target: CatalogTarget) -> bool:
    return target.kind == "rest" or target.warehouse.startswith(("s3://", "s3a://"))


def catalog_conf(target: CatalogTarget, name: str | None = None) -> dict[str, str]:
    """Spark settings registering `target` as Spark catalog `name` (default: its own name, which
    a JDBC catalog must keep to see pyiceberg's tables)."""
    prefix = f"spark.sql.catalog.{name or target.name}"
    # no caching of tables: each query sees what the committer (pyiceberg, another process) last committed
    conf = {prefix: SPARK_CATALOG, f"{prefix}.cache-enabled": "false"}
    if target.kind == "sql":
        conf |= {f"{prefix}.type": "jdbc", f"{prefix}.uri": target.jdbc_url, f"{prefix}.warehouse": target.warehouse}
        # pyiceberg's SqlCatalog creates the catalog's tables (load_catalog does, first). Iceberg
        # 1.10's JdbcCatalog, when it checks for them itself, leaves a result set open on its
        # pooled connection: on SQLite that is a read transaction held for good, so every later
        # pyiceberg commit fails "database is locked" (and in WAL mode Spark reads a stale catalog).
        conf[f"{prefix}.jdbc.init-catalog-tables"] = "false"
        if target.jdbc_user:
            conf[f"{prefix}.jdbc.user"] = target.jdbc_user
        if target.jdbc_password:
            conf[f"{prefix}.jdbc.password"] = target.jdbc_password
    else:
        conf |= {f"{prefix}.type": "rest", f"{prefix}.uri": target.uri}
        if target.warehouse:
            conf[f"{prefix}.warehouse"] = target.warehouse
        if target.credential:
            conf |= {f"{prefix}.credential": target.credential, f"{prefix}.rest.auth.type": "oauth2", f"{prefix}.oauth2-server-uri": target.oauth2_server_uri}
    if uses_s3(target):
        io = target.io
        conf[f"{prefix}.io-impl"] = S3_FILE_IO
        conf[f"{prefix}.client.region"] = io.get("s3.region", "us-east-1")
        for key in ("s3.endpoint", "s3.access-key-id", "s3.secret-access-key"):
            if key in io:
                conf[f"{prefix}.{key}"] = io[key]
        if "s3.endpoint" in io:  # a local S3 (SeaweedFS, MinIO) has no bucket DNS names
            conf[f"{prefix}.s3.path-style-access"] = "true"
    return conf


def session_conf(config: CompactorConfig, jars: list[Path], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every setting of the compactor's session (pure but for `environ`, the process's environment
    by default, whose EXECUTOR_ENV a cluster's executors get: `spark_session` applies it)."""
    target = catalog_target(config) if config.catalog_url else None
    conf = {
        "spark.master": config.spark_master,
        "spark.app.name": "neve-compactor",
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        # Parquet that Spark's own writer produces and pyiceberg then commits must hold Iceberg's
        # micros; Spark's default, INT96, is no Iceberg type
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": config.spark_driver_memory,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "8",  # the compactor's shuffles are small; 200 tasks each is pure overhead
        "spark.python.daemon.module": DAEMON_MODULE,
    }
    if is_local(config.spark_master):  # executors on other machines must reach a cluster's driver
        conf |= {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    else:
        environ = os.environ if environ is None else environ
        conf |= {f"spark.executorEnv.{name}": environ[name] for name in EXECUTOR_ENV if environ.get(name)}
    if target is not None:  # not the default catalog: `neve.t` would then name table t of no namespace
        conf |= catalog_conf(target)
    return conf


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def spark_session(config: CompactorConfig, *, all_catalog_kinds: bool = False) -> SparkSession:
    """Start the compactor's SparkSession (or return the running one: one JVM per process, whose
    jars are fixed at its start; `all_catalog_kinds` loads the jars of every catalog kind, so
    that any catalog can be registered later with `register_catalog`)."""
    check_java()
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:
        raise SparkStartError(f"the compactor needs pyspark 3.5: {TABLE_EXTRA} ({e})") from e
    target = catalog_target(config) if config.catalog_url else None
    jars = spark_jars(target, everything=all_catalog_kinds)
    for jar in jars:
        if not jar.exists():
            raise SparkStartError(f"jar not found: {jar}")
    # the JVM that pyspark launches reads these: loopback only, and executors run this interpreter
    if is_local(config.spark_master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in session_conf(config, jars).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def register_catalog(spark: SparkSession, target: CatalogTarget, name: str | None = None) -> str:
    """Add `target` to a running session as catalog `name` (default: its own name); returns the name.
    Spark builds a catalog on its first use, so this works on a started session as long as its
    jars cover the catalog's kind, and a name once used keeps its first settings."""
    for key, value in catalog_conf(target, name).items():
        spark.conf.set(key, value)
    return name or target.name

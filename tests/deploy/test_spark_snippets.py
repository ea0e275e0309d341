"""deploy/spark/*.conf, the Spark settings users read neve's tables with, say what the compactor's
own Spark session says (compactor/files/spark.py, for the same catalog): the REST one for the compose
file's compactor, the JDBC one for the PostgreSQL catalog deploy/trino/jdbc names."""

from __future__ import annotations

import pytest

from tests.deploy.compose import resolved
from tests.deploy.tools import DEPLOY

SPARK = DEPLOY / "spark"


def spark_conf(path) -> dict[str, str]:
    pairs = (line.split(None, 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return {k: v.strip() for k, v in pairs}


def compose_compactor_env() -> dict[str, str]:
    return resolved()["services"]["compactor"]["environment"]


JDBC_ENV = {
    "NEVE_COMPACTOR_CATALOG_URL": "postgresql://neve:CHANGE-ME@postgres:5432/iceberg",
    "NEVE_COMPACTOR_WAREHOUSE": "s3://neve/warehouse",
    "NEVE_COMPACTOR_S3_ENDPOINT": "http://seaweedfs:8333",
    "NEVE_COMPACTOR_S3_ACCESS_KEY_ID": "admin",
    "NEVE_COMPACTOR_S3_SECRET_ACCESS_KEY": "password",
}


@pytest.mark.parametrize(("snippet", "env"), [("neve-rest.conf", None), ("neve-jdbc.conf", JDBC_ENV)])
def test_the_spark_snippet_is_the_compactor_s_own_catalog(snippet, env):
    from compactor.catalog import catalog_target
    from compactor.files.spark import catalog_conf, session_conf
    from neve.config import load_config

    config = load_config(env=env or {k: v for k, v in compose_compactor_env().items() if k.startswith("NEVE_COMPACTOR_")}).compactor
    conf = spark_conf(SPARK / snippet)
    want = catalog_conf(catalog_target(config))
    assert {k: v for k, v in conf.items() if k.startswith("spark.sql.catalog.")} == want
    assert conf["spark.sql.extensions"] == session_conf(config, [])["spark.sql.extensions"]
    packages = conf["spark.jars.packages"].split(",")
    assert packages[0].startswith("org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.")
    assert ("org.postgresql:postgresql" in conf["spark.jars.packages"]) == (env is JDBC_ENV)

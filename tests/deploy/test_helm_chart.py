"""deploy/helm/neve checked offline with Helm v3 (`make deploy-tools`) and PyPI kubernetes-validate,
for the default values and for ci/cluster-values.yaml (external etcd, two zones, a Spark master):
`helm lint --strict` passes; `helm template` renders manifests that validate strictly against a
current Kubernetes' schemas; every neve container's environment is one neve's own loader accepts
(values from the downward API and Secrets filled in as the kubelet would); brokers get unique node
ids and their zone; the install notes say how to connect and query."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.deploy.compose import neve_env_names
from tests.deploy.tools import DEPLOY, run, tool

CHART = DEPLOY / "helm" / "neve"
CLUSTER_VALUES = CHART / "ci" / "cluster-values.yaml"
KUBERNETES = "1.37.0"  # kubernetes-validate's newest schemas
RELEASE = "t"
VALUES = {"default": [], "cluster": ["-f", str(CLUSTER_VALUES)]}


def helm(*args: str) -> str:
    done = run([tool("helm"), *args])
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def rendered(values: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(helm("template", RELEASE, str(CHART), *VALUES[values])) if d]


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container_env(container: dict, secrets: dict[str, dict], pod_labels: dict[str, str]) -> dict[str, str]:
    """The variables as the kubelet would set them: downward-API fields and Secret keys resolved."""
    env = {}
    for var in container.get("env", ()):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        source = var["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]]["stringData"][ref["key"]]
        else:
            path = source["fieldRef"]["fieldPath"]
            if path.startswith("metadata.labels['"):
                env[var["name"]] = pod_labels.get(path[len("metadata.labels['") : -2], "")
            else:
                env[var["name"]] = {"status.podIP": "10.1.2.3", "metadata.name": "pod-0"}[path]
    return env


@pytest.mark.parametrize("values", sorted(VALUES))
def test_helm_lint_strict_passes(values):
    out = helm("lint", "--strict", str(CHART), *VALUES[values])
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("values", sorted(VALUES))
def test_rendered_manifests_validate_against_kubernetes_schemas(values):
    import kubernetes_validate

    docs = rendered(values)
    for doc in docs:
        if doc["apiVersion"] == "monitoring.coreos.com/v1":  # the Prometheus Operator's CRD: no schema in Kubernetes'
            assert doc["kind"] == "ServiceMonitor" and doc["spec"]["endpoints"][0]["port"] == "metrics"
            continue
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    kinds = {d["kind"] for d in docs}
    assert {"StatefulSet", "Service", "PodDisruptionBudget", "ServiceAccount"} <= kinds


@pytest.mark.parametrize("values", sorted(VALUES))
def test_every_neve_container_environment_loads(values):
    from neve.config import load_config

    docs = rendered(values)
    secrets = by_kind(docs, "Secret")
    known = neve_env_names()
    workloads = [d for d in docs if d["kind"] in ("StatefulSet", "Deployment") and d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] != "etcd"]
    assert workloads
    for workload in workloads:
        pod = workload["spec"]["template"]
        labels = {**pod["metadata"]["labels"], "apps.kubernetes.io/pod-index": str(workload["spec"].get("ordinals", {}).get("start", 0))}
        for container in pod["spec"]["containers"]:
            env = container_env(container, secrets, labels)
            assert {k for k in env if k.startswith("NEVE_")} <= known, workload["metadata"]["name"]
            load_config(env=env)  # raises ConfigError on a misspelt variable or a value it cannot use
            assert container["securityContext"]["readOnlyRootFilesystem"] and pod["spec"]["securityContext"]["runAsNonRoot"]
            assert container["resources"]["requests"] and container["readinessProbe"] and container["livenessProbe"]


def test_default_values_bundle_etcd_and_run_brokers_without_a_zone():
    docs = rendered("default")
    sets = by_kind(docs, "StatefulSet")
    assert set(sets) == {f"{RELEASE}-neve-broker", f"{RELEASE}-neve-etcd"}
    etcd = sets[f"{RELEASE}-neve-etcd"]
    assert etcd["spec"]["replicas"] == 3
    cluster = next(a for a in etcd["spec"]["template"]["spec"]["containers"][0]["args"] if a.startswith("--initial-cluster="))
    assert cluster.count("=http://") == 3
    broker = sets[f"{RELEASE}-neve-broker"]["spec"]["template"]["spec"]["containers"][0]
    env = {v["name"]: v.get("value") for v in broker["env"]}
    assert env["NEVE_METADATA_URL"] == f"etcd://{RELEASE}-neve-etcd:2379/neve"
    assert not by_kind(docs, "Deployment")  # no catalog, no compactor (the notes say how to add one)
    peers = by_kind(docs, "Service")[f"{RELEASE}-neve-broker-peers"]
    assert peers["spec"]["clusterIP"] == "None" and {p["port"] for p in peers["spec"]["ports"]} >= {int(env["NEVE_CACHE_PORT"])}


def test_two_zones_external_etcd_and_a_spark_master():
    docs = rendered("cluster")
    secrets = by_kind(docs, "Secret")
    sets = by_kind(docs, "StatefulSet")
    assert set(sets) == {f"{RELEASE}-neve-broker-eu-west-1a", f"{RELEASE}-neve-broker-eu-west-1b"}  # etcd is external
    ids = {}
    for name, workload in sets.items():
        pod = workload["spec"]["template"]
        zone = name.removeprefix(f"{RELEASE}-neve-broker-")
        assert pod["spec"]["nodeSelector"] == {"topology.kubernetes.io/zone": zone}
        start = workload["spec"].get("ordinals", {}).get("start", 0)
        for index in range(start, start + workload["spec"]["replicas"]):
            env = container_env(pod["spec"]["containers"][0], secrets, {**pod["metadata"]["labels"], "apps.kubernetes.io/pod-index": str(index)})
            assert env["NEVE_BROKER_ZONE"] == zone and env["NEVE_METADATA_URL"] == "etcd://etcd.platform.svc:2379/neve"
            assert env["NEVE_WAL_LINGER_MS"] == "50" and env["AWS_ACCESS_KEY_ID"] == "admin"
            ids[env["NEVE_BROKER_NODE_ID"]] = zone
    assert len(ids) == 5  # unique node ids across the zones' StatefulSets
    (compactor,) = by_kind(docs, "Deployment").values()
    env = container_env(compactor["spec"]["template"]["spec"]["containers"][0], secrets, {})
    assert env["NEVE_COMPACTOR_SPARK_MASTER"] == "spark://spark-master.spark.svc:7077"
    assert env["NEVE_COMPACTOR_CATALOG_URL"] == "postgresql://neve:secret@postgres.platform.svc:5432/iceberg"
    assert env["NEVE_COMPACTOR_S3_ENDPOINT"] == "http://seaweedfs-s3.storage.svc:8333" and env["SPARK_LOCAL_IP"] == "10.1.2.3"
    # compactor.spark.conf: a spark-defaults.conf where SPARK_CONF_DIR says (spark-submit reads it; neve's own settings win)
    pod = compactor["spec"]["template"]["spec"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == env["SPARK_CONF_DIR"]]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    spark_defaults = by_kind(docs, "ConfigMap")[volume["configMap"]["name"]]["data"]["spark-defaults.conf"]
    assert spark_defaults.splitlines() == ["spark.cores.max 8", "spark.executor.memory 4g"]
    assert {p["metadata"]["name"] for p in by_kind(docs, "NetworkPolicy").values()} == {f"{RELEASE}-neve-broker"}  # no etcd here; the compactor talks to a Spark cluster


def notes(values: str, tmp_path: Path) -> str:
    """NOTES.txt as `helm install` prints it: rendered through a copy of the chart (helm template
    leaves the notes out, and helm install --dry-run wants a cluster)."""
    chart = tmp_path / "neve"
    shutil.copytree(CHART, chart)
    text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "notes-rendered.yaml").write_text('{{- define "notes-rendered" -}}\n' + text + '{{- end }}\nnotes: {{ include "notes-rendered" . | toJson }}\n')
    return yaml.safe_load(helm("template", RELEASE, str(chart), *VALUES[values], "--show-only", "templates/notes-rendered.yaml"))["notes"]


def test_the_install_notes_say_how_to_connect_and_query(tmp_path):
    cluster = notes("cluster", tmp_path)
    assert f"bootstrap.servers={RELEASE}-neve-kafka.default.svc:9092" in cluster
    assert "eu-west-1a, eu-west-1b" in cluster and f"http://{RELEASE}-neve-registry.default.svc:8081" in cluster
    assert "FROM neve.neve.<topic>" in cluster and "spark://spark-master.spark.svc:7077" in cluster
    assert "No compactor: set compactor.catalog.url" in notes("default", tmp_path / "default")

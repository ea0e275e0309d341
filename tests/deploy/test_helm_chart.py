"""deploy/helm/neve checked offline with Helm v3 (`make deploy-tools`) and PyPI kubernetes-validate,
for the default values (security on), ci/cluster-values.yaml (external etcd, two zones, a Spark
master), ci/secure-values.yaml (cert-manager, client certificates, Secrets of other names) and
security off:
`helm lint --strict` passes; `helm template` renders manifests that validate strictly against a
current Kubernetes' schemas; every neve container's environment is one neve's own loader accepts
(values from the downward API and Secrets filled in as the kubelet would); brokers get unique node
ids and their zone; with security on, every broker listener is SASL_SSL, named by a pod DNS name
the certificate covers, every file a setting names is a key of a mounted Secret, and the
authorizer is on with the brokers' user a super user; with it off, the plain network is said
explicitly; the install notes say how to connect and query."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.deploy.compose import neve_env_names
from tests.deploy.tools import DEPLOY, run, tool

CHART = DEPLOY / "helm" / "neve"
CLUSTER_VALUES = CHART / "ci" / "cluster-values.yaml"
SECURE_VALUES = CHART / "ci" / "secure-values.yaml"
KUBERNETES = "1.37.0"  # kubernetes-validate's newest schemas
RELEASE = "t"
VALUES = {"default": [], "cluster": ["-f", str(CLUSTER_VALUES)], "secure": ["-f", str(SECURE_VALUES)], "plain": ["--set", "security.enabled=false"]}
OPERATOR_SECRET = "stand-in-from-the-operator's-secret"  # a Secret the chart names but does not make


def helm(*args: str) -> str:
    done = run([tool("helm"), *args])
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def rendered(values: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(helm("template", RELEASE, str(CHART), *VALUES[values])) if d]


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container_env(container: dict, secrets: dict[str, dict], pod_labels: dict[str, str]) -> dict[str, str]:
    """The variables as the kubelet would set them: downward-API fields and Secret keys resolved
    (a Secret the chart does not make, the operator's, as a stand-in), `$(NAME)` of an earlier
    variable expanded."""
    env = {}
    for var in container.get("env", ()):
        if "value" in var:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), var["value"])
            continue
        source = var["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]]["stringData"][ref["key"]] if ref["name"] in secrets else OPERATOR_SECRET
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
        if doc["apiVersion"] == "cert-manager.io/v1":  # cert-manager's CRD: checked in test_cert_manager_issues_the_certificate_the_pods_mount
            assert doc["kind"] == "Certificate"
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
    assert "eu-west-1a, eu-west-1b" in cluster and f"https://{RELEASE}-neve-registry.default.svc:8081" in cluster
    assert "FROM neve.neve.<topic>" in cluster and "spark://spark-master.spark.svc:7077" in cluster
    default = notes("default", tmp_path / "default")
    assert "No compactor: set compactor.catalog.url" in default
    assert "security.protocol=SASL_SSL, sasl.mechanism=SCRAM-SHA-512" in default  # security is on by default
    for secret in (f"{RELEASE}-neve-tls", f"{RELEASE}-neve-scram", f"{RELEASE}-neve-chunk-secret"):
        assert f"create secret generic {secret} " in default  # the Secrets the pods wait for, and how to make them
    assert f"https://{RELEASE}-neve-registry.default.svc:8081" in default
    assert "written by cert-manager (the Certificate t-neve-tls, issuer platform-ca)" in notes("secure", tmp_path / "secure")
    assert "PLAINTEXT and an open chunk port" in notes("plain", tmp_path / "plain")


def broker_pods(docs: list[dict]) -> list[tuple[dict, dict]]:
    """(pod template, its first ordinal's labels) of each broker StatefulSet."""
    out = []
    for workload in by_kind(docs, "StatefulSet").values():
        pod = workload["spec"]["template"]
        if pod["metadata"]["labels"]["app.kubernetes.io/component"] == "broker":
            out.append((pod, {**pod["metadata"]["labels"], "apps.kubernetes.io/pod-index": str(workload["spec"].get("ordinals", {}).get("start", 0))}))
    return out


def mounted_secret_file(pod: dict, container: dict, path: str) -> tuple[str, str]:
    """(Secret name, key) of the file at `path` in the container: a mounted Secret volume's item."""
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for mount in container["volumeMounts"]:
        if path.startswith(mount["mountPath"] + "/"):
            secret = volumes[mount["name"]]["secret"]
            (item,) = [i for i in secret["items"] if i["path"] == path[len(mount["mountPath"]) + 1 :]]
            return secret["secretName"], item["key"]
    raise AssertionError(f"{path}: no mounted Secret holds it")


@pytest.mark.parametrize("values", ["default", "secure", "cluster"])
def test_security_is_on_sasl_ssl_listeners_the_authorizer_and_secrets_from_mounted_secrets(values):
    from broker.listeners import check_listeners, listeners_of
    from neve.config import load_config

    docs = rendered(values)
    secure = yaml.safe_load(SECURE_VALUES.read_text())["security"] if values == "secure" else {}
    names = {"tls": f"{RELEASE}-neve-tls", "scram": f"{RELEASE}-neve-scram", "chunk": f"{RELEASE}-neve-chunk-secret"}
    if secure:
        names = {"tls": secure["tls"]["secretName"], "scram": secure["scram"]["secretName"], "chunk": secure["chunkSecretName"]}
    internal = secure.get("internalPort", 9095)
    peers = f"{RELEASE}-neve-broker-peers.default.svc"
    assert f"{RELEASE}-neve-tls" not in by_kind(docs, "Secret")  # the operator's (or cert-manager's), never the chart's
    pods = broker_pods(docs)
    assert pods
    for pod, labels in pods:
        (container,) = pod["spec"]["containers"]
        env = container_env(container, by_kind(docs, "Secret"), labels)
        assert not {k for k in env if "INSECURE" in k}
        b = load_config(env=env).broker
        listeners = listeners_of(b)
        check_listeners(listeners, b, cluster=True)  # what a cluster broker refuses to start with
        assert [(item.name, item.protocol, item.port, item.advertised_host, item.advertised_port) for item in listeners] == [
            ("CLIENT", "SASL_SSL", 9092, f"pod-0.{peers}", 9092),
            ("INTERNAL", "SASL_SSL", internal, f"pod-0.{peers}", internal),
        ]
        assert b.inter_broker_listener_name == "INTERNAL" and b.inter_broker_sasl_username == "neve-broker" and b.inter_broker_sasl_password == OPERATOR_SECRET
        assert b.authorizer_enabled and not b.allow_everyone_if_no_acl_found
        assert b.super_users.split(";") == ["User:neve-broker", *(secure.get("authorizer", {}).get("superUsers") or ["User:admin"])]
        assert b.ssl_client_auth == secure.get("tls", {}).get("clientAuth", "none")
        files = {b.ssl_certfile: (names["tls"], "tls.crt"), b.ssl_keyfile: (names["tls"], "tls.key"), b.ssl_cafile: (names["tls"], "ca.crt"), b.sasl_scram_users_file: (names["scram"], "users")}
        cache = load_config(env=env).cache
        files |= {cache.peer_secret_file: (names["chunk"], "secret"), cache.peer_tls_cert_file: (names["tls"], "tls.crt"), cache.peer_tls_ca_file: (names["tls"], "ca.crt")}
        registry = load_config(env=env).registry  # the registry every broker serves: HTTPS, the Kafka users and the Secret's
        files |= {registry.tls_cert_file: (names["tls"], "tls.crt"), registry.tls_key_file: (names["tls"], "tls.key")}
        assert registry.scram_users and registry.scram_roles == secure.get("registry", {}).get("scramRoles", "write")
        if secure:
            files[registry.users_file] = ("neve-registry-users", "users")
        else:
            assert not registry.users_file
        for path, secret_key in files.items():
            assert mounted_secret_file(pod, container, path) == secret_key, path
        assert {p["containerPort"] for p in container["ports"]} >= {9092, internal}
    service_ports = {p["port"] for p in by_kind(docs, "Service")[f"{RELEASE}-neve-broker-peers"]["spec"]["ports"]}
    assert internal in service_ports  # each broker's DNS name under the peers Service
    for compactor in by_kind(docs, "Deployment").values():
        pod = compactor["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        cache = load_config(env=container_env(container, by_kind(docs, "Secret"), {})).cache
        assert mounted_secret_file(pod, container, cache.peer_secret_file) == (names["chunk"], "secret") and not cache.peer_insecure


def test_cert_manager_issues_the_certificate_the_pods_mount():
    docs = rendered("secure")
    (certificate,) = [d for d in docs if d["kind"] == "Certificate"]
    spec = certificate["spec"]
    assert certificate["apiVersion"] == "cert-manager.io/v1" and spec["secretName"] == "neve-kafka-tls"
    assert spec["issuerRef"] == {"name": "platform-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    assert {"server auth", "client auth"} <= set(spec["usages"])
    # every name a client is told (each broker's advertised pod name) or bootstraps with
    assert {f"*.{RELEASE}-neve-broker-peers.default.svc", f"{RELEASE}-neve-kafka.default.svc"} <= set(spec["dnsNames"])
    assert not [d for d in rendered("default") if d["kind"] == "Certificate"]  # no issuer named: the operator's Secret


def test_security_off_says_the_plain_network_explicitly():
    from broker.listeners import check_listeners, listeners_of
    from neve.config import load_config

    docs = rendered("plain")
    for pod, labels in broker_pods(docs):
        env = container_env(pod["spec"]["containers"][0], by_kind(docs, "Secret"), labels)
        assert env["NEVE_BROKER_ALLOW_INSECURE_LISTENERS"] == "true" and env["NEVE_CACHE_PEER_INSECURE"] == "true"
        config = load_config(env=env)
        check_listeners(listeners_of(config.broker), config.broker, cluster=True)
        assert [item.protocol for item in listeners_of(config.broker)] == ["PLAINTEXT"] and not config.broker.authorizer_enabled
        assert not {v["name"] for v in pod["spec"]["volumes"]} & {"tls", "scram", "chunk-secret"}

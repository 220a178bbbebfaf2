"""The Helm chart: lint, render with the default values and every ci/*-values.yaml, validate the
objects against the Kubernetes schemas, and check what matters for this service: one writer,
a locked-down pod, probes and metrics on the service's port, secrets only by reference,
settings the service accepts, and in kubernetes mode a driver that can start its executors."""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path

import pytest

from app.settings import load_settings
from streaming.contract import load_contract
from tests.deploy.conftest import CHART, ROOT, Helm

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

CI_FILES = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
CASES = ["(chart defaults)", *CI_FILES]
KUBERNETES_CASE = "kubernetes-mode-values.yaml"
NAMESPACE = "ingest"
RELEASE = "geo"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest the schemas know.
KUBE_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
SECRET_WORDS = ("password", "secret", "token", "jaas", "credential")
# Settings whose names have a secret word but whose values are not secrets.
NOT_SECRET_SETTINGS = {"spark.kubernetes.container.image.pullsecrets"}  # names of image pull Secrets
SERVICE_UID = 10001


def test_ci_values_cover_both_modes_and_monitoring():
    assert {"default-values.yaml", "kubernetes-mode-values.yaml"} <= set(CI_FILES)
    assert any("monitoring" in name for name in CI_FILES)


# ---------------------------------------------------------------------------------------------
# rendering


@pytest.fixture(scope="module")
def render(helm: Helm):
    @cache
    def rendered(case: str, *sets: str) -> tuple[dict, ...]:
        args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
        if case in CI_FILES:
            args += ["--values", str(CHART / "ci" / case)]
        for s in sets:
            args += ["--set", s]
        out = helm.run(*args).stdout
        return tuple(doc for doc in yaml.safe_load_all(out) if doc)

    return rendered


def values_of(case: str) -> dict:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if case in CI_FILES:
        _merge(values, yaml.safe_load((CHART / "ci" / case).read_text()) or {})
    return values


def _merge(base: dict, over: dict) -> None:
    for key, value in over.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def kind(docs, kind_: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind_]


def one(docs, kind_: str, name: str | None = None) -> dict:
    found = [d for d in kind(docs, kind_) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind_} objects named {name or '*'}"
    return found[0]


def deployment(docs) -> dict:
    return one(docs, "Deployment")


def main_container(docs) -> dict:
    return next(c for c in deployment(docs)["spec"]["template"]["spec"]["containers"] if c["name"] == "geoingest")


def config_map(docs) -> dict:
    return one(docs, "ConfigMap", f"{RELEASE}-geoingest")


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def pod_specs(docs) -> list[tuple[str, dict]]:
    """Every pod spec the chart makes: the Deployment's, the Spark executor pod template and the
    maintenance CronJob's."""
    specs = [("deployment", deployment(docs)["spec"]["template"]["spec"])]
    for cm in kind(docs, "ConfigMap"):
        if "executor-pod-template.yaml" in cm.get("data", {}):
            specs.append(("executor", yaml.safe_load(cm["data"]["executor-pod-template.yaml"])["spec"]))
    for job in kind(docs, "CronJob"):
        specs.append(("maintenance", job["spec"]["jobTemplate"]["spec"]["template"]["spec"]))
    return specs


def settings_of(docs, tmp_path: Path) -> tuple:
    """The service's own settings loader over the rendered settings.toml and the container env
    (values from Secrets stand in as placeholders)."""
    toml = tmp_path / "settings.toml"
    toml.write_text(config_map(docs)["data"]["settings.toml"])
    env = {}
    for name, entry in env_of(main_container(docs)).items():
        if "value" in entry:
            env[name] = entry["value"]
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            env[name] = f"<secret {entry['valueFrom']['secretKeyRef']['key']}>"
        elif "fieldRef" in entry.get("valueFrom", {}):
            env[name] = "<pod name>" if entry["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name" else "<field>"
    env.pop("GEOINGEST_CONFIG")
    return load_settings(config_file=toml, env=env), env


# ---------------------------------------------------------------------------------------------
# lint and schema


@pytest.mark.parametrize("case", CASES)
def test_lint(helm: Helm, case: str):
    args = ["lint", str(CHART), "--strict", "--namespace", NAMESPACE]
    if case in CI_FILES:
        args += ["--values", str(CHART / "ci" / case)]
    result = helm.run(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "bad, why",
    [
        ("replicaCount=abc", "got string, want integer"),
        ("replicaCount=2", "maximum"),
        ("spark.mode=cluster", "spark/mode"),
        ("metrics.port=abc", "metrics/port"),
        ("config.max_vertices=lots", "config/max_vertices"),
        ("config.checkpoint_location=/elsewhere", "checkpoint_location"),
        # Spark's checkpoint is the driver's volume; the table goes to the object store through FileIO.
        ("checkpoint.uri=s3a://lake/checkpoints", "checkpoint/uri"),
        ("podSecurityContext=null,securityContext.privileged=true,image.pullPolicy=Sometimes", "pullPolicy"),
    ],
)
def test_schema_rejects_bad_values(helm: Helm, bad: str, why: str):
    lint = helm.run("lint", str(CHART), "--set", bad, check=False)
    assert lint.returncode != 0 and why in lint.stdout + lint.stderr, lint.stdout + lint.stderr
    template = helm.run("template", RELEASE, str(CHART), "--set", bad, check=False)
    assert template.returncode != 0


@pytest.mark.parametrize(
    "bad, why",
    [
        ("config.catalog.password=hunter2", "looks like a secret"),
        ("config.kafka.sasl\\.jaas\\.config=PlainLoginModule", "looks like a secret"),
        ("config.catalog.s3\\.secret-access-key=abc", "looks like a secret"),
        ("config.catalog.uri=postgresql+psycopg2://svc:hunter2@db/iceberg", "URI with a password"),
        ("spark.mode=kubernetes", "executors (other pods) cannot write"),
        ("secrets.objectStore.existingSecret=s3,config.catalog_name=my_lake", "letters and digits"),
    ],
)
def test_chart_refuses_secrets_in_config_and_unworkable_values(helm: Helm, bad: str, why: str):
    result = helm.run("template", RELEASE, str(CHART), "--set", bad, "--skip-schema-validation", check=False)
    assert result.returncode != 0 and why in result.stderr, result.stderr


@pytest.mark.parametrize("case", CASES)
def test_objects_are_valid_kubernetes(render, case: str):
    docs = render(case)
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            (check_service_monitor_shape if doc["kind"] == "ServiceMonitor" else check_prometheus_rule_shape)(doc)
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{name} on Kubernetes {version}: {exc.message} at {list(exc.absolute_path)}")
        assert doc["metadata"].get("namespace", NAMESPACE) == NAMESPACE or doc["kind"] == "ConfigMap"
    for where, spec in pod_specs(docs):
        if where == "executor":  # Spark adds image, resources and env; the rest must be a valid Pod
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "executor"}, "spec": spec}
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(pod, version, strict=True)


def check_prometheus_rule_shape(doc: dict) -> None:
    """PrometheusRule is a CRD too: groups of named rules, each an alert or a record with an expr."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    assert set(doc["spec"]) == {"groups"} and doc["spec"]["groups"]
    for group in doc["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "record", "expr", "for", "labels", "annotations"}, set(rule)
            assert ("alert" in rule) != ("record" in rule) and isinstance(rule["expr"], str)


def check_service_monitor_shape(doc: dict) -> None:
    """ServiceMonitor is a CRD the Kubernetes schemas do not have: its shape is checked here."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "ServiceMonitor"
    spec = doc["spec"]
    assert set(spec) <= {
        "jobLabel",
        "namespaceSelector",
        "selector",
        "endpoints",
        "targetLabels",
        "podTargetLabels",
        "sampleLimit",
    }, set(spec)
    assert isinstance(spec["selector"]["matchLabels"], dict) and spec["selector"]["matchLabels"]
    assert spec["endpoints"] and all(isinstance(e, dict) for e in spec["endpoints"])
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {
            "port",
            "path",
            "interval",
            "scrapeTimeout",
            "scheme",
            "relabelings",
            "metricRelabelings",
            "honorLabels",
            "tlsConfig",
        }, set(endpoint)
        assert re.fullmatch(r"\d+(ms|s|m|h)", endpoint["interval"])
        assert re.fullmatch(r"\d+(ms|s|m|h)", endpoint["scrapeTimeout"])
        for relabel in endpoint.get("relabelings", []) + endpoint.get("metricRelabelings", []):
            assert relabel.get("action", "replace") in {
                "replace",
                "keep",
                "drop",
                "labelmap",
                "labeldrop",
                "labelkeep",
                "hashmod",
                "lowercase",
                "uppercase",
                "keepequal",
                "dropequal",
            }
    assert isinstance(spec["namespaceSelector"].get("matchNames", []), list)


# ---------------------------------------------------------------------------------------------
# what every rendering must hold


@pytest.mark.parametrize("case", CASES)
def test_pods_are_locked_down(render, case: str):
    for where, spec in pod_specs(render(case)):
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == SERVICE_UID, where
        assert pod["seccompProfile"]["type"] == "RuntimeDefault", where
        containers = spec.get("initContainers", []) + spec["containers"]
        for container in containers:
            ctx = container["securityContext"]
            assert ctx["runAsNonRoot"] is True, (where, container["name"])
            assert ctx["readOnlyRootFilesystem"] is True, (where, container["name"])
            assert ctx["allowPrivilegeEscalation"] is False, (where, container["name"])
            assert ctx["capabilities"]["drop"] == ["ALL"], (where, container["name"])
            assert not ctx.get("capabilities", {}).get("add"), (where, container["name"])
            assert not ctx.get("privileged"), (where, container["name"])
            # The read-only root needs writable scratch: /scratch and /tmp on emptyDirs.
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            volumes = {v["name"]: v for v in spec["volumes"]}
            for path in ("/scratch", "/tmp"):
                assert path in mounts, (where, container["name"], path)
                assert "emptyDir" in volumes[mounts[path]], (where, path)
        assert spec.get("hostNetwork") is not True and spec.get("hostPID") is not True


@pytest.mark.parametrize("case", CASES)
def test_one_writer(render, case: str):
    spec = deployment(render(case))["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize("case", CASES)
def test_probes_and_metrics_port(render, case: str, tmp_path):
    docs = render(case)
    container = main_container(docs)
    port = values_of(case)["metrics"]["port"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == port
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    service = one(docs, "Service", f"{RELEASE}-geoingest")
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [("metrics", port, "metrics")]
    settings, _ = settings_of(docs, tmp_path)
    assert settings.metrics_port == port
    pod_labels = deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert "resources" in container and container["resources"]["limits"]["memory"]


@pytest.mark.parametrize("case", CASES)
def test_settings_are_what_the_service_reads(render, case: str, tmp_path):
    docs = render(case)
    values = values_of(case)
    settings, env = settings_of(docs, tmp_path)
    assert settings.bootstrap_servers == values["config"]["bootstrap_servers"]
    assert settings.topic == values["config"]["topic"]
    assert settings.checkpoint_location == (values["checkpoint"]["uri"] or "/data/checkpoints")
    assert settings.spark["spark.local.dir"] == "/scratch/spark-local"
    catalog = {k: str(v) for k, v in values["config"]["catalog"].items() if v is not None}
    assert {k: v for k, v in settings.catalog.items() if k in catalog} == catalog
    mounts = {m["mountPath"]: m["name"] for m in main_container(docs)["volumeMounts"]}
    assert env["GEOINGEST_CHECKPOINT_LOCATION"] == settings.checkpoint_location
    routed = bool(values.get("routes"))
    assert main_container(docs)["args"] == (["--routes"] if routed else ["--contract", "/etc/geoingest/contract.json"])
    assert "/etc/geoingest" in mounts and "/data" in mounts
    if not values["checkpoint"]["uri"]:
        volumes = {v["name"]: v for v in deployment(docs)["spec"]["template"]["spec"]["volumes"]}
        data = volumes[mounts["/data"]]
        if values["persistence"]["enabled"]:
            claim = values["persistence"]["existingClaim"] or f"{RELEASE}-geoingest"
            assert data["persistentVolumeClaim"]["claimName"] == claim
            if not values["persistence"]["existingClaim"]:
                one(docs, "PersistentVolumeClaim", claim)


@pytest.mark.parametrize("case", CASES)
def test_contract_is_one_the_service_loads(render, case: str, tmp_path):
    contract_json = config_map(render(case))["data"]["contract.json"]
    path = tmp_path / "contract.json"
    path.write_text(contract_json)
    contract = load_contract(path)
    inline = values_of(case)["contract"]["inline"]
    if inline:
        assert contract.table == inline["table"]
    else:
        assert contract_json.strip() == (ROOT / "schemas" / "demo_events.json").read_text().strip()


def test_routes_reach_the_service_with_contracts_it_loads(render, tmp_path):
    """A release of several routes: the settings hold them as the service parses them, each route's
    contract is a file of the config map the service loads, and the service, not an init container,
    creates their tables."""
    from app.routing import load_templates
    from streaming.job.routes import parse_routes

    docs = render("routes-values.yaml")
    values = values_of("routes-values.yaml")
    settings, _ = settings_of(docs, tmp_path)
    routes = parse_routes(settings.routes)
    assert [r.name for r in routes] == [r["name"] for r in values["routes"]]
    data = config_map(docs)["data"]
    for i, route in enumerate(routes):
        assert route.contract == f"/etc/geoingest/route-{i}.json"
        (tmp_path / f"route-{i}.json").write_text(data[f"route-{i}.json"])
    local = parse_routes(
        [{**raw, "contract": str(tmp_path / f"route-{i}.json")} for i, raw in enumerate(settings.routes)]
    )
    templates = load_templates(local)
    assert templates["fleet"] == load_contract(ROOT / "schemas" / "demo_events.json"), "no contract: the chart's"
    assert templates["audit"].table == "ops.audit" and [c.name for c in templates["audit"].columns] == [
        "event_id",
        "actor",
    ]
    fleet = routes.route_of("fleet.paris.positions")
    assert fleet is not None and fleet.table_for_topic("fleet.paris.positions") == "fleet.positions_paris"
    assert "initContainers" not in deployment(docs)["spec"]["template"]["spec"]
    # Not empty: an empty args list runs the image's CMD, which names the demo contract.
    assert main_container(docs)["args"] == ["--routes"]


def test_chart_demo_contract_is_the_projects():
    assert (CHART / "files" / "demo_events.json").read_bytes() == (ROOT / "schemas" / "demo_events.json").read_bytes()


@pytest.mark.parametrize("case", CASES)
def test_no_secret_in_any_config_map_and_no_secret_object(render, case: str):
    docs = render(case)
    assert not kind(docs, "Secret"), "the chart references Secrets, it never makes one"
    for cm in kind(docs, "ConfigMap"):
        if cm["metadata"]["name"].endswith("-dashboard"):
            continue
        for key, text in cm["data"].items():
            for line in text.splitlines():
                if line.lstrip().startswith("#"):
                    continue
                assert not re.search(r"://[^/@\s\"]+:[^/@\s\"]+@", line), f"{cm['metadata']['name']}/{key}: {line}"
    for line in config_map(docs)["data"]["settings.toml"].splitlines():
        setting = line.split("=", 1)[0].strip().strip('"').lower()
        if "=" not in line or line.startswith("#") or setting in NOT_SECRET_SETTINGS:
            continue
        assert not any(word in setting for word in SECRET_WORDS), f"settings.toml: {line}"


@pytest.mark.parametrize("case", CASES)
def test_secrets_come_in_by_reference(render, case: str, tmp_path):
    docs = render(case)
    values = values_of(case)
    env = env_of(main_container(docs))
    expected = {}
    refs = values["secrets"]
    if refs["catalog"]["existingSecret"]:
        for env_name, key in (
            ("GEOINGEST_CATALOG__URI", "uriKey"),
            ("GEOINGEST_CATALOG__CREDENTIAL", "credentialKey"),
            ("GEOINGEST_CATALOG__TOKEN", "tokenKey"),
        ):
            if refs["catalog"][key]:
                expected[env_name] = (refs["catalog"]["existingSecret"], refs["catalog"][key])
    if refs["objectStore"]["existingSecret"]:
        prefix = f"PYICEBERG_CATALOG__{values['config']['catalog_name'].upper()}__S3__"
        for suffix, key in (
            ("ACCESS_KEY_ID", "accessKeyIdKey"),
            ("SECRET_ACCESS_KEY", "secretAccessKeyKey"),
            ("SESSION_TOKEN", "sessionTokenKey"),
        ):
            if refs["objectStore"][key]:
                expected[prefix + suffix] = (refs["objectStore"]["existingSecret"], refs["objectStore"][key])
    if refs["kafka"]["existingSecret"]:
        expected["GEOINGEST_KAFKA__SASL_JAAS_CONFIG"] = (
            refs["kafka"]["existingSecret"],
            refs["kafka"]["saslJaasConfigKey"],
        )
    for name, (secret, key) in expected.items():
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": key}, name
    secret_env = {n for n, e in env.items() if "secretKeyRef" in e.get("valueFrom", {})}
    from_extra = {e["name"] for e in values.get("extraEnv", [])}
    assert secret_env - from_extra == set(expected)
    for name, entry in env.items():
        if any(word in name.lower() for word in SECRET_WORDS) or name.endswith(("__URI", "__SASL_JAAS_CONFIG")):
            assert "value" not in entry, f"{name} carries its value in the pod spec"
    # The init container that creates the table sees the same credentials.
    init = deployment(docs)["spec"]["template"]["spec"].get("initContainers", [])
    if values["createTable"]["enabled"] and not values.get("routes"):
        assert env_of(init[0]).keys() >= secret_env
    # And the names mean what they should to the service and to pyiceberg.
    settings, _ = settings_of(docs, tmp_path)
    if "GEOINGEST_CATALOG__URI" in expected:
        assert settings.catalog["uri"].startswith("<secret ")
    if "GEOINGEST_KAFKA__SASL_JAAS_CONFIG" in expected:
        assert settings.kafka["sasl.jaas.config"].startswith("<secret ")
    if refs["objectStore"]["existingSecret"]:
        assert pyiceberg_catalog_properties(
            values["config"]["catalog_name"], {name: "x" for name in expected if name.startswith("PYICEBERG_")}
        ).keys() >= {"s3.access-key-id", "s3.secret-access-key"}


def pyiceberg_catalog_properties(catalog_name: str, env: dict[str, str]) -> dict:
    """What pyiceberg merges into a catalog's properties from PYICEBERG_* environment variables."""
    from pyiceberg.utils.config import Config

    saved = dict(os.environ)
    try:
        for name in [n for n in os.environ if n.startswith("PYICEBERG_")]:
            del os.environ[name]
        os.environ.update(env)
        os.environ["PYICEBERG_HOME"] = "/nonexistent"
        return Config().get_catalog_config(catalog_name) or {}
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.parametrize("case", CASES)
def test_disruption_budget_covers_the_pod(render, case: str):
    docs = render(case)
    pdb = one(docs, "PodDisruptionBudget")
    labels = deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert ("minAvailable" in pdb["spec"]) != ("maxUnavailable" in pdb["spec"])


def test_monitoring_objects(render):
    case = next(name for name in CI_FILES if "monitoring" in name)
    docs = render(case)
    values = values_of(case)
    monitor = one(docs, "ServiceMonitor")
    check_service_monitor_shape(monitor)
    assert monitor["metadata"]["labels"].items() >= values["metrics"]["serviceMonitor"]["labels"].items()
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    selected = [
        s
        for s in kind(docs, "Service")
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert [s["metadata"]["name"] for s in selected] == [f"{RELEASE}-geoingest"]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]

    dashboard = one(docs, "ConfigMap", f"{RELEASE}-geoingest-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == values["grafanaDashboard"]["namespace"]
    shipped = json.loads((ROOT / "dashboards" / "geoingest.json").read_text())
    assert json.loads(dashboard["data"]["geoingest.json"]) == shipped

    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules_file = yaml.safe_load((ROOT / "helm" / "geoingest" / "alerts" / "geoingest.rules.yaml").read_text())
    assert rule["spec"]["groups"] == rules_file["groups"], "the PrometheusRule holds the rules file's groups"


def test_monitoring_is_off_by_default(render):
    docs = render("(chart defaults)")
    assert not kind(docs, "ServiceMonitor") and not kind(docs, "PrometheusRule")
    assert not [cm for cm in kind(docs, "ConfigMap") if "grafana_dashboard" in cm["metadata"]["labels"]]


# ---------------------------------------------------------------------------------------------
# the two Spark modes


def test_local_mode_has_no_spark_on_kubernetes_objects(render, tmp_path):
    docs = render("(chart defaults)")
    assert not kind(docs, "Role") and not kind(docs, "RoleBinding")
    assert not [s for s in kind(docs, "Service") if s["spec"].get("clusterIP") == "None"]
    assert len(pod_specs(docs)) == 1
    settings, _ = settings_of(docs, tmp_path)
    assert settings.spark_master.startswith("local")
    assert deployment(docs)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_kubernetes_mode_makes_a_driver_that_can_run_executors(render, tmp_path):
    docs = render("kubernetes-mode-values.yaml")
    values = values_of("kubernetes-mode-values.yaml")
    k8s = values["spark"]["kubernetes"]
    settings, env = settings_of(docs, tmp_path)
    spark = settings.spark
    assert settings.spark_master == "k8s://https://kubernetes.default.svc"

    # The driver's stable address: a headless Service on the driver and block manager ports.
    headless = [s for s in kind(docs, "Service") if s["spec"].get("clusterIP") == "None"]
    assert len(headless) == 1
    driver_service = headless[0]
    assert driver_service["spec"]["publishNotReadyAddresses"] is True
    assert spark["spark.driver.host"] == f"{driver_service['metadata']['name']}.{NAMESPACE}.svc"
    assert {p["name"]: p["port"] for p in driver_service["spec"]["ports"]} == {
        "driver-rpc": k8s["driverPort"],
        "blockmanager": k8s["blockManagerPort"],
    }
    assert spark["spark.driver.port"] == str(k8s["driverPort"])
    assert spark["spark.blockManager.port"] == str(k8s["blockManagerPort"])
    container_ports = {p["name"]: p["containerPort"] for p in main_container(docs)["ports"]}
    assert container_ports["driver-rpc"] == k8s["driverPort"]
    assert container_ports["blockmanager"] == k8s["blockManagerPort"]
    labels = deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert driver_service["spec"]["selector"].items() <= labels.items()

    # Executors: the same image, namespace, counts and sizes from values, and the pod template.
    image = values["image"]
    assert spark["spark.kubernetes.container.image"] == f"{image['repository']}@{image['digest']}"
    assert main_container(docs)["image"] == spark["spark.kubernetes.container.image"]
    assert spark["spark.kubernetes.namespace"] == NAMESPACE
    assert spark["spark.executor.instances"] == str(k8s["executor"]["instances"])
    assert spark["spark.executor.cores"] == str(k8s["executor"]["cores"])
    assert spark["spark.executor.memory"] == k8s["executor"]["memory"]
    assert spark["spark.executor.memoryOverhead"] == k8s["executor"]["memoryOverhead"]
    assert spark["spark.kubernetes.executor.limit.cores"] == str(k8s["executor"]["limitCores"])
    assert env["GEOINGEST_SPARK__SPARK_KUBERNETES_DRIVER_POD_NAME"] == "<pod name>"
    assert spark["spark.kubernetes.driver.pod.name"] == "<pod name>"

    template_file = spark["spark.kubernetes.executor.podTemplateFile"]
    directory, filename = template_file.rsplit("/", 1)
    mounts = {m["mountPath"]: m["name"] for m in main_container(docs)["volumeMounts"]}
    volume = next(v for v in deployment(docs)["spec"]["template"]["spec"]["volumes"] if v["name"] == mounts[directory])
    sources = [s["configMap"]["name"] for s in volume["projected"]["sources"]]
    template_cm = next(cm for cm in kind(docs, "ConfigMap") if filename in cm.get("data", {}))
    assert template_cm["metadata"]["name"] in sources
    template = yaml.safe_load(template_cm["data"][filename])
    executor = template["spec"]["containers"][0]
    assert executor["name"] == spark["spark.kubernetes.executor.podTemplateContainerName"]
    assert executor["command"] == ["/opt/geoingest/bin/spark-executor"]
    assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "spark-executor"
    assert template["spec"]["nodeSelector"] == k8s["executor"]["nodeSelector"]
    # No selector of the chart picks executor pods.
    for obj in kind(docs, "Service") + kind(docs, "PodDisruptionBudget") + kind(docs, "Deployment"):
        selector = obj["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert not selector.items() <= template["metadata"]["labels"].items(), obj["metadata"]["name"]

    # RBAC: the driver's service account may manage executor pods and what goes with them.
    account = deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    assert deployment(docs)["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    one(docs, "ServiceAccount", account)
    role = one(docs, "Role")
    rules = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    for resource in ("pods", "services", "configmaps", "persistentvolumeclaims"):
        for verb in ("create", "get", "list", "watch", "delete"):
            assert (resource, verb) in rules, (resource, verb)
    binding = one(docs, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]


def test_kubernetes_mode_secures_spark_rpc_and_opens_the_driver_ports_to_executors_only(render, tmp_path):
    """Tasks carry the catalog's and the object store's credentials over Spark's RPC: authenticated
    and encrypted by default; a NetworkPolicy opens the driver's RPC and block manager ports to this
    release's executor pods only, its metrics port to the peers the values name."""
    case = "kubernetes-mode-values.yaml"
    k8s = values_of(case)["spark"]["kubernetes"]
    settings, _ = settings_of(render(case), tmp_path)
    assert settings.spark["spark.authenticate"] == "true" and settings.spark["spark.network.crypto.enabled"] == "true"
    assert "spark.authenticate.secret.driver.file" not in settings.spark, "Spark makes the secret per application"

    (policy,) = kind(render(case), "NetworkPolicy")
    driver_labels = deployment(render(case))["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= driver_labels.items()
    rpc, metrics = policy["spec"]["ingress"]
    assert {p["port"] for p in rpc["ports"]} == {k8s["driverPort"], k8s["blockManagerPort"]}
    (peer,) = rpc["from"]
    executor_labels = peer["podSelector"]["matchLabels"]
    assert executor_labels["app.kubernetes.io/component"] == "spark-executor"
    assert not executor_labels.items() <= driver_labels.items(), "the driver's own labels do not open its ports"
    assert [p["port"] for p in metrics["ports"]] == [values_of(case)["metrics"]["port"]] and "from" not in metrics

    # The secret from an existing Secret: mounted in the driver and in the executors' pod template.
    sets = (
        "spark.kubernetes.rpcSecurity.secret.name=spark-rpc",
        "spark.kubernetes.networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring",
    )
    docs = render(case, *sets)
    settings, _ = settings_of(docs, tmp_path)
    path = "/etc/geoingest-spark-auth/secret"
    assert (
        settings.spark["spark.authenticate.secret.driver.file"]
        == path
        == settings.spark["spark.authenticate.secret.executor.file"]
    )
    volumes = {v["name"]: v for v in deployment(docs)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["spark-auth"]["secret"]["secretName"] == "spark-rpc"
    assert {"name": "spark-auth", "mountPath": "/etc/geoingest-spark-auth", "readOnly": True} in main_container(docs)[
        "volumeMounts"
    ]
    template = yaml.safe_load(
        one(docs, "ConfigMap", f"{RELEASE}-geoingest-executor-template")["data"]["executor-pod-template.yaml"]
    )
    assert any(v.get("secret", {}).get("secretName") == "spark-rpc" for v in template["spec"]["volumes"])
    assert any(m["name"] == "spark-auth" for m in template["spec"]["containers"][0]["volumeMounts"])
    (policy,) = kind(docs, "NetworkPolicy")
    assert policy["spec"]["ingress"][1]["from"] == [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    assert not kind(render("(chart defaults)"), "NetworkPolicy"), "local mode: no Spark ports to fence"


def test_kubernetes_mode_extra_conf_wins_over_the_charts(render, tmp_path):
    docs = render("kubernetes-mode-values.yaml", "spark.kubernetes.conf.spark\\.sql\\.shuffle\\.partitions=48")
    settings, _ = settings_of(docs, tmp_path)
    assert settings.spark["spark.sql.shuffle.partitions"] == "48"


def rendered_notes(helm: Helm, tmp_path: Path, case: str, sets: tuple[str, ...] = ()) -> str:
    """NOTES.txt is only rendered on install; a copy of the chart renders it through tpl instead."""
    import shutil

    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "files" / "NOTES.check").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "zz-notes-check.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-check\n"
        'data:\n  notes: {{ tpl (.Files.Get "files/NOTES.check") . | quote }}\n'
    )
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE, "--show-only", "templates/zz-notes-check.yaml"]
    if case in CI_FILES:
        args += ["--values", str(CHART / "ci" / case)]
    for value in sets:
        args += ["--set", value]
    return yaml.safe_load(helm.run(*args).stdout)["data"]["notes"]


@pytest.mark.parametrize("case", CASES)
def test_notes_render(helm: Helm, case: str, tmp_path):
    notes = rendered_notes(helm, tmp_path, case)
    values = values_of(case)
    assert "<no value>" not in notes and "%!" not in notes, notes
    assert f"localhost:{values['metrics']['port']}/readyz" in notes
    assert ("Spark on Kubernetes" in notes) == (values["spark"]["mode"] == "kubernetes")


def test_lakehouse_values_reach_the_bucket_the_broker_and_the_executors_as_the_tests_run_them(render, tmp_path):
    """ci/lakehouse-values.yaml is the shape tests/streaming/job/test_lakehouse.py runs: REST catalog
    and bucket through the catalog's properties, SASL_SSL with a PEM CA that the driver and every
    executor mount (both read Kafka; executors also write dead letters), and so does the maintenance
    job, which gets the same settings."""
    from streaming.source.admin import client_config

    docs = render("lakehouse-values.yaml")
    values = values_of("lakehouse-values.yaml")
    settings, _ = settings_of(docs, tmp_path)
    assert settings.catalog["type"] == "rest" and settings.catalog["warehouse"].startswith("s3://")
    assert {"s3.endpoint", "s3.region", "s3.path-style-access"} <= settings.catalog.keys()
    assert settings.checkpoint_location == "/data/checkpoints", "the checkpoint stays on the driver's volume"
    python_client = client_config(
        {
            **settings.kafka,
            "sasl.jaas.config": (
                'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";'
            ),
        }
    )
    ca = values["config"]["kafka"]["ssl.truststore.location"]
    assert python_client["security_protocol"] == "SASL_SSL" and python_client["ssl_cafile"] == ca
    for name, spec in pod_specs(docs):
        container = spec["containers"][0]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert ca.startswith(mounts["kafka-tls"] + "/"), name
        assert volumes["kafka-tls"]["secret"]["secretName"] == "kafka-ca", name


def test_the_python_the_charts_pods_run_imports_what_the_image_has():
    # A pod's inline script (the helm test hook) runs in the image: every project name it imports
    # must exist, or `helm test` fails on the user's cluster rather than here.
    import importlib

    imports = re.compile(r"^\s*from ((?:app|streaming)(?:\.\w+)*) import ([\w, ]+)$", re.MULTILINE)
    found = []
    for template in sorted((CHART / "templates").rglob("*.yaml")):
        for module, names in imports.findall(template.read_text()):
            loaded = importlib.import_module(module)
            for name in (n.strip() for n in names.split(",")):
                assert hasattr(loaded, name), f"{template.relative_to(CHART)}: {module} has no {name}"
                found.append(f"{module}.{name}")
    assert "streaming.table.catalog.open_catalog" in found, "the test hook's imports were read"

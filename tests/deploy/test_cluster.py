"""The chart installed as a user installs it, on a real single-node Kubernetes cluster started here
(app/local/kubernetes.py: kube-apiserver, controller manager, scheduler, kubelet, containerd, a CNI
bridge), with the image `make image` builds imported into the node as if pulled.

The broker listens on the cluster's bridge (NODE_IP), which the pods and the tests reach; nothing
leaves the machine. The table is read back with the image's own `geoingest query` on the pod's
volume. These run under `make test-cluster` (marker `cluster`), not `make test`.
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import shapely
from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from pyiceberg.catalog import load_catalog

from app.local.broker import LocalBroker, free_port
from app.local.image import DEFAULT_TAG, Podman
from app.local.kubernetes import NODE_IP, NODE_NAME, Cluster
from app.local.object_store import LocalObjectStore
from app.local.rest_catalog import LocalRestCatalog
from streaming.maintenance.lease import lease_state
from tests.conftest import CACHE_DIR, produce_records
from tests.deploy.conftest import CHART, Helm, build_helm
from tests.deploy.test_image import count_records

pytestmark = pytest.mark.cluster

REPOSITORY, TAG = DEFAULT_TAG.rsplit(":", 1)
NAMESPACE = "geoingest"
RELEASE = "geoingest"


@pytest.fixture(scope="session")
def node_state() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="geoingest-node-") as folder:
        yield Path(folder)


@pytest.fixture(scope="session")
def cluster(node_state, podman) -> Iterator[Cluster]:
    cluster = Cluster(CACHE_DIR, node_state, podman, shared=[Path(tempfile.gettempdir())])
    started = time.monotonic()
    with cluster:
        print(f"cluster started in {time.monotonic() - started:.1f} s")
        archive = node_state / "geoingest-image.tar"
        podman.run("save", "--format=docker-archive", f"--output={archive}", DEFAULT_TAG, timeout=900)
        cluster.import_image(archive)
        archive.unlink()
        cluster.api(
            "POST",
            "/api/v1/namespaces",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": NAMESPACE,
                    "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
                },
            },
        )
        yield cluster


@pytest.fixture(scope="session")
def bridge_broker(cluster, tmp_path_factory) -> Iterator[LocalBroker]:
    """A broker on the cluster's bridge: the pods' way to the host."""
    broker = LocalBroker(tmp_path_factory.mktemp("bridge-kafka"), CACHE_DIR, port=free_port(), host=NODE_IP)
    broker.ensure_jars()
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def helm(cluster, tmp_path_factory) -> Helm:
    helm = Helm(build_helm(), tmp_path_factory.mktemp("helm-home"))
    helm.env["KUBECONFIG"] = str(cluster.kubeconfig)
    return helm


def new_topic(broker: LocalBroker) -> str:
    name = f"geo-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=1)])
    finally:
        admin.close()
    return name


def events(start: int, count: int) -> list[tuple[bytes, bytes, list]]:
    return [
        (f"e{i}".encode(), shapely.to_wkb(shapely.Point(-170 + (i % 3400) * 0.1, -80 + (i % 1600) * 0.1)), [])
        for i in range(start, start + count)
    ]


def pods(cluster: Cluster, selector: str) -> list[dict]:
    # The Deployment's pods alone carry geoingest.io/spark-mode (not executors, jobs or tests).
    found = cluster.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={urllib.parse.quote(selector)}")
    return found["items"]


def ready_pod(cluster: Cluster, selector: str, timeout_s: float, not_named: str = "") -> dict:
    deadline = time.monotonic() + timeout_s
    last: list[dict] = []
    while time.monotonic() < deadline:
        last = pods(cluster, selector)
        for pod in last:
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            if pod["metadata"]["name"] != not_named and conditions.get("Ready") == "True":
                return pod
        time.sleep(2)
    states = [(p["metadata"]["name"], p["status"].get("phase"), p["status"].get("containerStatuses")) for p in last]
    raise AssertionError(f"no ready pod for {selector} after {timeout_s:.0f} s: {states}")


def metric(pod_ip: str, name: str, port: int = 9108) -> float:
    text = urllib.request.urlopen(f"http://{pod_ip}:{port}/metrics", timeout=5).read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", text, re.MULTILINE))


def table_rows(podman: Podman, volume: Path, table: str = "demo.events") -> int:
    """The rows of a table (demo.events), read with the image's own CLI on the pod's volume."""
    out = podman.run(
        "run", "--rm", "--network=none", "--read-only", "--tmpfs=/tmp", "--tmpfs=/scratch:mode=1777",
        f"--volume={volume}:/data",
        "-e", "GEOINGEST_CATALOG__URI=sqlite:////data/catalog.db",
        "-e", "GEOINGEST_CATALOG__WAREHOUSE=file:///data/warehouse",
        "--entrypoint=geoingest", DEFAULT_TAG,
        "query", "--table", table, "--bbox=-180,-90,180,90", "--format", "count",
    ).stdout  # fmt: skip
    return int(json.loads(out)["count"])


def test_local_mode_ingests_survives_a_pod_kill_an_upgrade_and_an_eviction(cluster, helm, bridge_broker, podman):
    topic = new_topic(bridge_broker)
    volume = cluster.add_volume("geoingest-data-local")
    selector = f"app.kubernetes.io/instance={RELEASE},geoingest.io/spark-mode"
    started = time.monotonic()
    helm.run(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--values", str(CHART / "ci" / "default-values.yaml"),
        "--set", f"image.repository={REPOSITORY},image.tag={TAG}",
        "--set", f"config.bootstrap_servers={bridge_broker.bootstrap},config.topic={topic}",
        "--set", "config.trigger_interval=1 second,config.driver_memory=1g",
        "--set", "resources.requests.cpu=250m",
        # A frozen driver restarted within half a minute, not the default's two and more.
        "--set", "livenessProbe.periodSeconds=5,livenessProbe.failureThreshold=4",
        "--set", "livenessProbe.terminationGracePeriodSeconds=5",
        "--wait", "--timeout", "10m", timeout=660,
    )  # fmt: skip
    pod = ready_pod(cluster, selector, 60)
    print(f"helm install to ready: {time.monotonic() - started:.1f} s")

    first = events(0, 2000)
    bad = [(f"bad{i}".encode(), b"not an event", []) for i in range(10)]
    assert produce_records(bridge_broker.bootstrap, topic, first + bad) == 2010
    wait_until(lambda: metric(pod["status"]["podIP"], "geoingest_events_consumed_total") >= 2010, 300, "2010 consumed")

    # Mid-stream: a second wave is being produced while the pod is killed (no grace period).
    second = events(2000, 3000)
    producer = threading.Thread(target=lambda: produce_records(bridge_broker.bootstrap, topic, second))
    producer.start()
    time.sleep(1)
    name = pod["metadata"]["name"]
    cluster.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", {"gracePeriodSeconds": 0})
    producer.join()
    killed_at = time.monotonic()
    replacement = ready_pod(cluster, selector, 600, not_named=name)
    print(f"pod killed to replacement ready: {time.monotonic() - killed_at:.1f} s")

    wait_until(lambda: table_rows(podman, volume) >= 5000, 300, "5000 rows in the table")
    time.sleep(5)  # anything doubled would land by now
    rows = table_rows(podman, volume)
    dead = count_records(bridge_broker.bootstrap, f"{topic}.dlq")
    assert (rows, dead) == (5000, 10), f"table rows {rows} + dead letters {dead} != 5010 produced (5000 + 10 bad)"

    # What a user runs after installing: the chart's test hook, from a pod of its own.
    tested = helm.run("test", RELEASE, "--namespace", NAMESPACE, "--logs", "--timeout", "5m", timeout=330)
    assert "answered 200" in tested.stdout and "catalog: table demo.events loaded" in tested.stdout, tested.stdout
    assert re.search(r"Phase:\s+Succeeded", tested.stdout), tested.stdout

    # A rolling upgrade to a new image tag while events keep coming: nothing lost or doubled.
    podman.run("tag", DEFAULT_TAG, f"{REPOSITORY}:upgraded")
    archive = cluster.state / "upgraded.tar"
    podman.run("save", "--format=docker-archive", f"--output={archive}", f"{REPOSITORY}:upgraded", timeout=900)
    cluster.import_image(archive)
    archive.unlink()
    third = events(5000, 2000)
    producer = threading.Thread(target=lambda: produce_records(bridge_broker.bootstrap, topic, third))
    producer.start()
    started = time.monotonic()
    helm.run(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values",
        "--set", "image.tag=upgraded", "--wait", "--timeout", "10m", timeout=660,
    )  # fmt: skip
    producer.join()
    upgraded = ready_pod(cluster, selector, 600, not_named=replacement["metadata"]["name"])
    print(f"helm upgrade to ready: {time.monotonic() - started:.1f} s")
    assert upgraded["spec"]["containers"][0]["image"] == f"{REPOSITORY}:upgraded"
    wait_until(lambda: table_rows(podman, volume) >= 7000, 300, "7000 rows in the table")
    time.sleep(5)
    rows = table_rows(podman, volume)
    dead = count_records(bridge_broker.bootstrap, f"{topic}.dlq")
    assert (rows, dead) == (7000, 10), f"table rows {rows} + dead letters {dead} != 7010 produced (7000 + 10 bad)"

    # A node drain evicts the pod: the PodDisruptionBudget (maxUnavailable 1) lets it, and the
    # Deployment brings the pod back.
    name = upgraded["metadata"]["name"]
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": NAMESPACE}}
    cluster.api("POST", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/eviction", eviction)
    evicted_to = ready_pod(cluster, selector, 600, not_named=name)

    # The driver frozen (SIGSTOP to the container's first process, the driver) while events come:
    # /healthz stops answering, the kubelet restarts the container, and the stream lands whole.
    restarted = freeze_while_producing(cluster, evicted_to, selector, bridge_broker, topic, events(7000, 2000))
    frozen_at = time.monotonic()
    wait_until(restarted, 300, "container restarted by its liveness probe and ready")
    print(f"driver frozen to its container restarted and ready: {time.monotonic() - frozen_at:.1f} s")
    wait_until(lambda: table_rows(podman, volume) >= 9000, 300, "9000 rows in the table")
    time.sleep(5)
    rows = table_rows(podman, volume)
    dead = count_records(bridge_broker.bootstrap, f"{topic}.dlq")
    assert (rows, dead) == (9000, 10), f"table rows {rows} + dead letters {dead} != 9010 produced (9000 + 10 bad)"
    helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", timeout=300)


def freeze_while_producing(
    cluster: Cluster, pod: dict, selector: str, broker: LocalBroker, topic: str, records: list
) -> Callable[[], bool]:
    """SIGSTOP to the first process of the pod's container (the driver), sent through containerd
    while `records` are produced; returns the check that the kubelet restarted it and it is ready."""
    producer = threading.Thread(target=lambda: produce_records(broker.bootstrap, topic, records))
    producer.start()
    (before,) = pod["status"]["containerStatuses"]
    cluster.ctr("tasks", "kill", "--signal", "SIGSTOP", before["containerID"].split("://", 1)[1], timeout=60)
    producer.join()

    def restarted() -> bool:
        (now_pod,) = [p for p in pods(cluster, selector) if p["metadata"]["name"] == pod["metadata"]["name"]]
        (now,) = now_pod["status"]["containerStatuses"]
        return now["restartCount"] > before["restartCount"] and now.get("ready") is True

    return restarted


def landed_exactly(rows: Callable[[], int], broker: LocalBroker, topic: str, good: int, bad: int) -> None:
    """Waits for `good` rows in the table, then (anything doubled would have landed by then)
    checks the rows and the dead letters are exactly what was produced."""
    wait_until(lambda: rows() >= good, 420, f"{good} rows in the table")
    time.sleep(5)
    found, dead = rows(), count_records(broker.bootstrap, f"{topic}.dlq")
    assert (found, dead) == (good, bad), f"table rows {found} + dead letters {dead} != {good + bad} produced"


def wait_until(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, ValueError, AssertionError, RuntimeError) as exc:
            error = exc
        time.sleep(3)
    raise AssertionError(f"no {what} after {timeout_s:.0f} s (last error: {error})")


@pytest.fixture(scope="session")
def bridge_lakehouse(cluster, tmp_path_factory) -> Iterator[tuple[LocalObjectStore, LocalRestCatalog]]:
    """The object store (bucket `lake`) and the REST catalog on the cluster's bridge."""
    store = LocalObjectStore(tmp_path_factory.mktemp("bridge-s3"), CACHE_DIR, host=NODE_IP)
    catalog: LocalRestCatalog | None = None
    try:
        store.start()
        store.create_bucket("lake")
        catalog = LocalRestCatalog(
            tmp_path_factory.mktemp("bridge-rest"),
            CACHE_DIR,
            "s3://lake/warehouse",
            store.io_properties(),
            host=NODE_IP,
        )
        catalog.start()
        yield store, catalog
    finally:
        if catalog is not None:
            catalog.stop()
        store.stop()


def test_kubernetes_mode_executor_pods_land_a_stream_through_a_driver_kill_and_maintenance(
    cluster, helm, bridge_broker, bridge_lakehouse
):
    """ci/kubernetes-mode-values.yaml, with this machine's broker, catalog, bucket and image, and
    executors sized for one 2-core node; the node carries the label the values select."""
    store, rest = bridge_lakehouse
    topic = new_topic(bridge_broker)
    release, namespace = "lake", NAMESPACE
    cluster.add_volume("geoingest-data-kubernetes")
    cluster.api(
        "PATCH",
        f"/api/v1/nodes/{NODE_NAME}",
        {"metadata": {"labels": {"workload": "spark"}}},
        content_type="application/merge-patch+json",
    )
    cluster.api(
        "POST",
        f"/api/v1/namespaces/{namespace}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "lake-s3"},
            "stringData": {"access-key-id": store.access_key, "secret-access-key": store.secret_key},
        },
    )
    started = time.monotonic()
    helm.run(
        "install", release, str(CHART), "--namespace", namespace,
        "--values", str(CHART / "ci" / "kubernetes-mode-values.yaml"),
        "--set", f"image.repository={REPOSITORY},image.tag={TAG},image.digest=",
        "--set", f"config.bootstrap_servers={bridge_broker.bootstrap},config.topic={topic}",
        "--set", "config.trigger_interval=1 second,config.driver_memory=1g",
        "--set-string", f"config.catalog.uri={rest.uri}",
        "--set-string", f"config.catalog.s3\\.endpoint={store.endpoint},config.catalog.s3\\.region={store.region}",
        "--set", "spark.kubernetes.executor.instances=2,spark.kubernetes.executor.cores=1",
        "--set", "spark.kubernetes.executor.requestCores=250m,spark.kubernetes.executor.limitCores=null",
        "--set", "spark.kubernetes.executor.memory=1g,spark.kubernetes.executor.memoryOverhead=512m",
        "--set", "resources.requests.cpu=250m,resources.requests.memory=1Gi,resources.limits.memory=3Gi",
        "--set", "livenessProbe.periodSeconds=5,livenessProbe.failureThreshold=4",
        "--set", "livenessProbe.terminationGracePeriodSeconds=5",
        "--wait", "--timeout", "10m", timeout=660,
    )  # fmt: skip
    driver = ready_pod(cluster, f"app.kubernetes.io/instance={release},geoingest.io/spark-mode", 60)
    print(f"helm install (kubernetes mode) to ready: {time.monotonic() - started:.1f} s")

    executors = [p for p in cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
                 if p["metadata"].get("labels", {}).get("spark-role") == "executor"]  # fmt: skip
    assert len(executors) == 2, [p["metadata"]["name"] for p in executors]
    assert all(p["status"]["phase"] == "Running" for p in executors), [p["status"] for p in executors]

    good = events(0, 3000)
    bad = [(f"bad{i}".encode(), b"not an event", []) for i in range(10)]
    assert produce_records(bridge_broker.bootstrap, topic, good + bad) == 3010
    table = lambda: load_catalog("check", **rest.catalog_properties()).load_table("demo.events")  # noqa: E731
    landed_exactly(lambda: table().scan().count(), bridge_broker, topic, 3000, 10)
    assert metric(driver["status"]["podIP"], "geoingest_events_consumed_total") == 3010

    # The driver's ServiceAccount may manage pods and no more: no Secrets, nothing cluster-wide.
    account = f"system:serviceaccount:{namespace}:{release}-geoingest"
    for verb, resource, allowed in (
        ("create", "pods", True),
        ("deletecollection", "pods", True),
        ("get", "secrets", False),
        ("list", "nodes", False),
        ("create", "deployments", False),
    ):
        review = cluster.api(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": account,
                    "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                    "resourceAttributes": {"namespace": namespace, "verb": verb, "resource": resource},
                },
            },
        )
        assert review["status"].get("allowed", False) is allowed, f"{account} {verb} {resource}: {review['status']}"

    # A kill of the driver pod mid-stream: its executors go with it, the new driver starts new ones.
    second = events(3000, 2000)
    producer = threading.Thread(target=lambda: produce_records(bridge_broker.bootstrap, topic, second))
    producer.start()
    time.sleep(1)
    name = driver["metadata"]["name"]
    cluster.api("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", {"gracePeriodSeconds": 0})
    producer.join()
    killed_at = time.monotonic()
    selector = f"app.kubernetes.io/instance={release},geoingest.io/spark-mode"
    driver = ready_pod(cluster, selector, 600, not_named=name)
    print(f"driver killed to replacement ready (kubernetes mode): {time.monotonic() - killed_at:.1f} s")
    landed_exactly(lambda: table().scan().count(), bridge_broker, topic, 5000, 10)

    # The driver frozen while events come: its liveness probe fails, the kubelet restarts the
    # container in the same pod, the restarted driver starts executors of its own, and the frozen
    # driver's executors stop running once its process is gone.
    frozen_app = running_executor_apps(cluster, namespace)
    assert len(frozen_app) == 1, frozen_app
    restarted = freeze_while_producing(cluster, driver, selector, bridge_broker, topic, events(5000, 2000))
    frozen_at = time.monotonic()
    wait_until(restarted, 300, "driver container restarted by its liveness probe and ready (kubernetes mode)")
    print(f"driver frozen to its container restarted and ready (kubernetes mode): {time.monotonic() - frozen_at:.1f} s")
    landed_exactly(lambda: table().scan().count(), bridge_broker, topic, 7000, 10)
    keys = set(table().scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist())
    assert keys == {f"e{i}" for i in range(7000)}
    wait_until(
        lambda: (
            len(apps := running_executor_apps(cluster, namespace)) == 1
            and apps != frozen_app
            and sum(apps.values()) == 2
        ),
        300,
        f"2 running executors of the restarted driver alone (the frozen driver's were {frozen_app})",
    )

    # The maintenance CronJob, run once now (as `kubectl create job --from=cronjob/...` does): it
    # takes the table's lease (a new generation) and releases it.
    before = lease_state(table()).generation
    cronjob = cluster.api("GET", f"/apis/batch/v1/namespaces/{namespace}/cronjobs/{release}-geoingest-maintenance")
    job = f"{release}-maintenance-once"
    cluster.api(
        "POST",
        f"/apis/batch/v1/namespaces/{namespace}/jobs",
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": job},
            "spec": cronjob["spec"]["jobTemplate"]["spec"],
        },
    )
    started = time.monotonic()
    wait_until(lambda: job_finished(cluster, namespace, job), 420, f"job {job} to finish")
    status = cluster.api("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{job}")["status"]
    (pod,) = cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=job-name%3D{job}")["items"][-1:]
    logs = cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/log")
    assert status.get("succeeded") == 1, f"maintenance job: {status}\n{str(logs)[-3000:]}"
    print(f"maintenance job: {time.monotonic() - started:.1f} s")
    report = json.loads([line for line in str(logs).splitlines() if line.startswith('{"table"')][-1])
    assert report["table"] == "demo.events" and not report["skipped"], report
    after = lease_state(table())
    assert after.generation >= before + 2 and after.holder is None, (before, after)
    assert table().scan().count() == 7000


def running_executor_apps(cluster: Cluster, namespace: str) -> dict[str, int]:
    """The running executor pods of each Spark application (its spark-app-selector label)."""
    found = cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=spark-role%3Dexecutor")["items"]
    apps: dict[str, int] = {}
    for pod in found:
        if pod["status"].get("phase") == "Running":
            app = pod["metadata"]["labels"].get("spark-app-selector", "")
            apps[app] = apps.get(app, 0) + 1
    return apps


def job_finished(cluster: Cluster, namespace: str, name: str) -> bool:
    status = cluster.api("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")["status"]
    return bool(status.get("succeeded") or status.get("failed"))


def test_one_release_routes_topics_into_their_own_tables(cluster, helm, bridge_broker, podman):
    """ci/routes-values.yaml: a pattern route (a table per city, made from the chart's contract), a
    topic route with a contract of its own, and a topic split by its records' `kind` header, in one
    release. A city's topic created while the pod runs gets its table; every table holds its events,
    once, through a pod kill; a record without a kind is a dead letter."""
    release = "routed"
    volume = cluster.add_volume("geoingest-data-routes")
    selector = f"app.kubernetes.io/instance={release},geoingest.io/spark-mode"
    admin = KafkaAdminClient(bootstrap_servers=bridge_broker.bootstrap)
    try:
        admin.create_topics(
            [
                NewTopic(t, num_partitions=2, replication_factor=1)
                for t in ("fleet.paris.positions", "audit-log", "sensor-readings")
            ]
        )
    finally:
        admin.close()
    bad = [(f"bad{i}".encode(), b"not an event", []) for i in range(5)]
    assert produce_records(bridge_broker.bootstrap, "fleet.paris.positions", events(0, 1500)) == 1500
    assert produce_records(bridge_broker.bootstrap, "audit-log", events(0, 500) + bad) == 505
    kinds = [(k, v, [("kind", b"air" if i % 3 else b"noise")]) for i, (k, v, _) in enumerate(events(0, 600))]
    assert produce_records(bridge_broker.bootstrap, "sensor-readings", kinds + events(600, 2)) == 602
    helm.run(
        "install", release, str(CHART), "--namespace", NAMESPACE,
        "--values", str(CHART / "ci" / "routes-values.yaml"),
        "--set", f"image.repository={REPOSITORY},image.tag={TAG}",
        "--set", f"config.bootstrap_servers={bridge_broker.bootstrap}",
        "--set", "config.trigger_interval=1 second,config.driver_memory=1g,config.routes_refresh_s=5",
        "--set", "resources.requests.cpu=250m",
        "--wait", "--timeout", "10m", timeout=660,
    )  # fmt: skip
    pod = ready_pod(cluster, selector, 60)
    wait_until(lambda: table_rows(podman, volume, "fleet.positions_paris") >= 1500, 300, "paris's 1500 rows")

    # A city's topic made while the service runs, then the pod killed while events come.
    admin = KafkaAdminClient(bootstrap_servers=bridge_broker.bootstrap)
    try:
        admin.create_topics([NewTopic("fleet.lyon.positions", num_partitions=2, replication_factor=1)])
    finally:
        admin.close()
    assert produce_records(bridge_broker.bootstrap, "fleet.lyon.positions", events(0, 1000)) == 1000
    wait_until(lambda: table_rows(podman, volume, "fleet.positions_lyon") >= 1000, 300, "lyon's new table")
    producer = threading.Thread(
        target=lambda: produce_records(bridge_broker.bootstrap, "fleet.paris.positions", events(1500, 2000))
    )
    producer.start()
    time.sleep(1)
    name = pod["metadata"]["name"]
    cluster.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", {"gracePeriodSeconds": 0})
    producer.join()
    ready_pod(cluster, selector, 600, not_named=name)
    wait_until(lambda: table_rows(podman, volume, "fleet.positions_paris") >= 3500, 300, "paris's 3500 rows")
    wait_until(lambda: table_rows(podman, volume, "sensors.noise") >= 200, 300, "the split topic's tables")
    time.sleep(5)  # anything doubled would land by now
    tables = ("fleet.positions_paris", "fleet.positions_lyon", "ops.audit", "sensors.air", "sensors.noise")
    rows = {t: table_rows(podman, volume, t) for t in tables}
    assert rows == dict(zip(tables, (3500, 1000, 500, 400, 200), strict=True)), rows
    assert count_records(bridge_broker.bootstrap, "audit-log.dlq") == 5
    assert count_records(bridge_broker.bootstrap, "sensor-readings.dlq") == 2

    tested = helm.run("test", release, "--namespace", NAMESPACE, "--logs", "--timeout", "5m", timeout=330)
    assert "routes: 5 routed tables" in tested.stdout and "catalog: table ops.audit loaded" in tested.stdout, (
        tested.stdout
    )
    helm.run("uninstall", release, "--namespace", NAMESPACE, "--wait", timeout=300)

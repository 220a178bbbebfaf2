"""A Spark standalone cluster on this machine: the tasks run in executor JVMs of their own, with
the project's Python, its daemon module and the Kafka connector, and with none of the driver's
environment."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

import pyarrow as pa
import pytest
from pyspark import SparkContext, cloudpickle

from app.java import java_home
from app.local.spark_cluster import LocalSparkCluster
from app.spark import _cores, spark_session
from tests.conftest import CACHE_DIR, produce_records
from tests.spark_shapes import LOCAL_MASTER, session_for

pytestmark = pytest.mark.integration

# Set in the driver's environment before the cluster starts: executors must not see them.
DRIVER_ONLY = {"GEOINGEST_DRIVER_ONLY": "1", "AWS_ACCESS_KEY_ID": "driver-only"}
CLUSTER_CONF = {"spark.executorEnv.GeoIngest_Case": "Kept"}
# Executors import the installed project only, not the tests: this module's functions travel by
# value, as closures do, rather than as a reference to tests.app.local.test_spark_cluster.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
PROBE_SCHEMA = "rows long, jvm long, jvm_command string, daemon_command string, python string, env string, zips long"


@pytest.fixture(scope="module", autouse=True)
def driver_only_environment():
    saved = {key: os.environ.get(key) for key in DRIVER_ONLY}
    os.environ.update(DRIVER_ONLY)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def session(spark_cluster):  # noqa: F811
    return session_for(spark_cluster.master_url, CLUSTER_CONF)


def probe(batches):
    """Per task: what runs it. The Python worker's parent is the daemon, whose parent is the JVM
    that ran the task's Java side."""
    rows = sum(batch.num_rows for batch in batches)

    def command(pid: int) -> str:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()

    daemon = os.getppid()
    with open(f"/proc/{daemon}/stat") as f:
        jvm = int(f.read().rsplit(")", 1)[1].split()[1])
    zips = [p for p in sys.path if p.endswith((".zip", ".jar")) and os.path.exists(p)]
    yield pa.RecordBatch.from_pydict(
        {
            "rows": [rows],
            "jvm": [jvm],
            "jvm_command": [command(jvm)],
            "daemon_command": [command(daemon)],
            "python": [sys.executable],
            "env": [json.dumps(dict(os.environ))],
            "zips": [len(zips)],
        }
    )


def driver_jvm(session) -> int:
    return session.sparkContext._gateway.proc.pid


def test_start_is_idempotent_and_a_second_handle_finds_the_cluster_from_its_home(spark_cluster):  # noqa: F811
    started = time.monotonic()
    spark_cluster.start()
    assert time.monotonic() - started < 5
    again = LocalSparkCluster(spark_cluster.home, CACHE_DIR)
    assert again.running() and again.master_url == spark_cluster.master_url
    workers = again.state()["workers"]
    assert [(w["state"], w["cores"], w["memory"]) for w in workers] == [("ALIVE", 2, 3072)]


def test_tasks_run_in_an_executor_jvm_with_the_projects_python_and_none_of_the_drivers_environment(session):
    tasks = session.range(0, 100, 1, 2).mapInArrow(probe, PROBE_SCHEMA).collect()
    assert sum(t.rows for t in tasks) == 100
    for task in tasks:
        assert task.jvm not in (driver_jvm(session), os.getpid())
        assert "org.apache.spark.executor.CoarseGrainedExecutorBackend" in task.jvm_command
        assert "-m app.spark_daemon" in task.daemon_command
        assert task.python == sys.executable
        assert task.zips == 0
        env = json.loads(task.env)
        assert not [key for key in env if key in DRIVER_ONLY or key.startswith(("AWS_", "GEOINGEST_"))]
        assert env["JAVA_HOME"] == str(java_home(CACHE_DIR))


def test_an_executor_sees_spark_executor_env_with_the_case_of_its_name_kept(session):
    [task] = session.range(0, 1, 1, 1).mapInArrow(probe, PROBE_SCHEMA).collect()
    env = json.loads(task.env)
    assert env.get("GeoIngest_Case") == "Kept"
    assert "GEOINGEST_CASE" not in env and "geoingest_case" not in env


def test_the_kafka_source_reads_a_topic_in_the_executors(session, kafka, topic):
    records = [(f"k{i}".encode(), f'{{"n": {i}}}'.encode(), []) for i in range(300)]
    assert produce_records(kafka.bootstrap, topic, records) == 300
    source = (
        session.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    assert source.count() == 300
    # The Kafka scan and the Python stage share one task: the scan ran in the probed JVM.
    tasks = source.select("value").mapInArrow(probe, PROBE_SCHEMA).collect()
    assert sum(t.rows for t in tasks) == 300
    assert len(tasks) == 3
    assert all("CoarseGrainedExecutorBackend" in t.jvm_command and t.jvm != driver_jvm(session) for t in tasks)


def test_shuffles_are_partitioned_for_the_cores_the_application_gets(session):
    assert session.conf.get("spark.sql.shuffle.partitions") == "2"
    assert session.sparkContext.getConf().get("spark.cores.max") == "2"
    assert session.sparkContext.getConf().get("spark.executor.memory") == "2g"
    assert _cores("spark://127.0.0.1:7077", {"spark.cores.max": "3"}) == 3
    assert _cores("spark://127.0.0.1:7077", {"spark.default.parallelism": "4"}) == 4
    assert _cores("local[3]") == 3


def test_a_session_on_another_master_is_refused_while_one_runs(session):
    with pytest.raises(RuntimeError, match=r"a Spark session on spark://127\.0\.0\.1:\d+ is active"):
        spark_session(LOCAL_MASTER, str(CACHE_DIR))


def test_the_local_shape_replaces_the_cluster_session_and_the_cluster_shape_comes_back(spark_cluster):  # noqa: F811
    on_cluster = session_for(spark_cluster.master_url, CLUSTER_CONF)
    local = session_for(LOCAL_MASTER)
    assert on_cluster.sparkContext._jsc is None  # stopped
    assert SparkContext._active_spark_context.master == LOCAL_MASTER
    conf = dict(local.sparkContext.getConf().getAll())
    # Nothing of the cluster session's configuration is left in the driver's JVM.
    leftovers = [
        key
        for key in conf
        if key.startswith("spark.executorEnv.")
        or key in ("spark.cores.max", "spark.executor.memory", "spark.driver.bindAddress")
    ]
    assert not leftovers
    [task] = local.range(0, 10, 1, 1).mapInArrow(probe, PROBE_SCHEMA).collect()
    assert task.rows == 10 and task.jvm == driver_jvm(local)
    assert session_for(LOCAL_MASTER) is local

    back = session_for(spark_cluster.master_url, CLUSTER_CONF)
    assert local.sparkContext._jsc is None
    [task] = back.range(0, 10, 1, 1).mapInArrow(probe, PROBE_SCHEMA).collect()
    assert "CoarseGrainedExecutorBackend" in task.jvm_command
    assert json.loads(task.env).get("GeoIngest_Case") == "Kept"


def test_stop_ends_the_master_and_the_worker(tmp_path):
    cluster = LocalSparkCluster(tmp_path / f"cluster-{uuid.uuid4().hex[:6]}", CACHE_DIR, cores=1, memory="1g")
    cluster.start()
    pids = [cluster._master.pid(), cluster._worker.pid()]
    assert cluster.running() and all(pids)
    cluster.stop()
    assert not cluster.running()
    assert not [pid for pid in pids if alive(pid)]


def alive(pid: int) -> bool:
    """Running, as opposed to gone or exited and not yet reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

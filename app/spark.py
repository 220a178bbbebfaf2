"""The Spark session: local by default, with the Kafka connector resolved from Maven Central.

A `spark://` master is a standalone cluster on this machine (app/local/spark_cluster.py): its
executors are JVMs of their own, started by the cluster's worker with an environment of their
own, so everything they need comes from the session's configuration: the Python to run
(`spark.pyspark.python` and `spark.executorEnv.PYSPARK_PYTHON`), the JVM options, the Kafka
connector's jars (`spark.jars`, fetched from the driver's file server) and the daemon module
(`spark.python.daemon.module`, importable because the executors run this project's venv).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import pyspark
from pyspark import SparkContext
from pyspark.sql import SparkSession

from app.java import java_home, trust_store_options
from app.maven import artifact_name, resolve, spark_home, without_spark_jars


def kafka_connector_package() -> str:
    """The spark-sql-kafka artifact that matches the installed pyspark exactly."""
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def kafka_connector_jars(cache_dir: Path) -> list[Path]:
    """The connector's jars to add to Spark's classpath: none where Spark's own jars folder holds
    it already (the container image bakes it in), else resolved from Maven Central once."""
    shipped = {artifact_name(Path(p).name) for p in glob.glob(os.path.join(spark_home(), "jars", "*.jar"))}
    if "spark-sql-kafka-0-10_2.13" in shipped:
        return []
    jars = resolve(
        [kafka_connector_package()],
        cache_dir,
        f"spark-sql-kafka-{pyspark.__version__}",
        progress=lambda message: print(message, file=sys.stderr),
    )
    return without_spark_jars(jars)


_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _cores(master: str, conf: Mapping[str, str] | None = None) -> int:
    """The task slots the session will have: what shuffles are partitioned for."""
    if master.startswith("local[") and master[6:-1].isdigit():
        return int(master[6:-1])
    if master.startswith("spark://"):
        for key in ("spark.cores.max", "spark.default.parallelism"):
            value = (conf or {}).get(key, "")
            if value.isdigit() and int(value) > 0:
                return int(value)
    return os.cpu_count() or 2


def _standalone_conf(master: str) -> dict[str, str]:
    """Defaults for a `spark://` master, which the caller's extra_conf overrides key by key.

    Such a cluster runs on this machine beside the driver (app/local/spark_cluster.py), so the
    application takes the machine's cores in one executor (the worker starts one per
    application when spark.executor.cores is unset) with a heap beside the driver's."""
    conf = {
        "spark.pyspark.python": sys.executable,
        # The executor JVM's own environment too: what a Python process it starts outside
        # pyspark's worker factory would run.
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.executor.memory": "2g",
        "spark.cores.max": str(os.cpu_count() or 2),
    }
    host = urlsplit(master).hostname or ""
    if host in _LOOPBACK_HOSTS or host.startswith("127."):
        # Executors call the driver back at the address it advertises; by default that is the
        # machine's hostname, which need not resolve to an address a loopback-bound worker reaches.
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    return conf


def _refuse_another_master(master: str) -> None:
    # getOrCreate() would hand back the running session whatever master it runs on, and one
    # process holds one SparkContext at a time.
    active = SparkContext._active_spark_context
    if active is not None and active.master != master:
        raise RuntimeError(
            f"a Spark session on {active.master} is active in this process; stop it "
            f"before starting one on {master} (a process holds one SparkContext at a time)"
        )


def local_checkpoint_conf(checkpoint_location: str) -> dict[str, str]:
    """For a checkpoint on the local disk: Spark's checkpoint files written through Hadoop's
    FileSystem API with its raw local file system, which opens a new file without setting its
    permissions. Through FileContext (Spark's default) every offset and commit log entry is a file
    created with permissions, which Hadoop's local file system sets by forking `chmod` when its
    native library is absent (Spark's distribution has none): 38 ms of CPU per micro-batch in the
    reaped processes alone, against 7 with this (40 s of a streaming query, 41 batches each), and
    the fork's own cost in the micro-batch thread besides. The logs' files are the same, and a rename
    makes each visible as before; other checkpoint locations (S3, HDFS) keep Spark's default."""
    scheme = urlsplit(checkpoint_location).scheme
    if scheme not in ("", "file"):
        return {}
    return {
        "spark.sql.streaming.checkpointFileManagerClass": (
            "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager"
        ),
        "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    }


def spark_session(
    master: str,
    cache_dir: str,
    driver_memory: str = "2g",
    extra_conf: dict[str, str] | None = None,
    app_name: str = "geoingest",
    extra_jars: list[Path] | None = None,
) -> SparkSession:
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["JAVA_HOME"] = str(java_home(cache))
    # Executors run Python workers; they must be the interpreter that has this project installed.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    java_options = " ".join(trust_store_options())
    # Keys kept exactly as given: spark.executorEnv.<NAME> names an environment variable, whose
    # case matters.
    conf = {**(_standalone_conf(master) if master.startswith("spark://") else {}), **(extra_conf or {})}
    _refuse_another_master(master)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.jars", ",".join(str(j) for j in [*kafka_connector_jars(cache), *(extra_jars or [])]))
        # The workers' daemon without pyspark's zips on the import path (app/spark_daemon.py).
        .config("spark.python.daemon.module", "app.spark_daemon")
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.executor.extraJavaOptions", java_options)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.adaptive.enabled", "false")
        # Batch aggregates are a few rows: Spark's default of 200 shuffle partitions is all overhead.
        .config("spark.sql.shuffle.partitions", str(_cores(master, conf)))
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "20000")
        # ... or fewer, so that a burst of large records (the source topic may allow tens of MB
        # each) never fills one Arrow batch past the 2 GiB a binary column can hold.
        .config("spark.sql.execution.arrow.maxBytesPerBatch", str(256 * 1024 * 1024))
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        # A local checkpoint without Hadoop's .crc side files: each offset and commit log entry
        # was then two files written and renamed, about 35 ms of every micro-batch (measured at
        # 40k events per batch). The logs are JSON that Spark parses on read, and the atomic
        # rename that makes an entry visible is the same.
        .config("spark.hadoop.fs.AbstractFileSystem.file.impl", "org.apache.hadoop.fs.local.RawLocalFs")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def stop_spark(timeout_s: float = 60.0) -> None:
    """Stop this process's Spark context and wait for its JVM to exit.

    Left to the interpreter's exit, the JVM stops after Python has printed its last line, and
    what it logs on the way down (executors disconnecting, shutdown hooks) lands after that
    line, where a user or a supervisor reads the cause of a failure."""
    context = SparkContext._active_spark_context
    gateway = SparkContext._gateway
    if context is not None:
        try:
            context.stop()
        except Exception:  # noqa: BLE001 - the JVM is going away either way; its exit is what counts
            pass
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()
    except Exception:  # noqa: BLE001 - a gateway whose JVM already died
        pass
    if process is not None:
        # Spark's gateway server exits when its standard input closes.
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    SparkContext._gateway = None
    SparkContext._jvm = None

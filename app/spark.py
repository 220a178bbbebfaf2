"""The Spark session: local by default, with the Kafka connector resolved from Maven Central."""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

import pyspark
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
    jars = resolve([kafka_connector_package()], cache_dir, f"spark-sql-kafka-{pyspark.__version__}",
                   progress=lambda message: print(message, file=sys.stderr))
    return without_spark_jars(jars)


def _cores(master: str) -> int:
    if master.startswith("local[") and master[6:-1].isdigit():
        return int(master[6:-1])
    return os.cpu_count() or 2


def spark_session(master: str, cache_dir: str, driver_memory: str = "2g",
                  extra_conf: dict[str, str] | None = None, app_name: str = "geoingest",
                  extra_jars: list[Path] | None = None) -> SparkSession:
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["JAVA_HOME"] = str(java_home(cache))
    # Executors run Python workers; they must be the interpreter that has this project installed.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    java_options = " ".join(trust_store_options())
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
        .config("spark.sql.shuffle.partitions", str(_cores(master)))
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
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session

"""The Spark session: local by default, with the Kafka connector resolved from Maven Central."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from app.java import java_home, trust_store_options


def kafka_connector_package() -> str:
    """The spark-sql-kafka artifact that matches the installed pyspark exactly."""
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def _cores(master: str) -> int:
    if master.startswith("local[") and master[6:-1].isdigit():
        return int(master[6:-1])
    return os.cpu_count() or 2


def spark_session(master: str, cache_dir: str, driver_memory: str = "2g",
                  extra_conf: dict[str, str] | None = None, app_name: str = "geoingest") -> SparkSession:
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
        .config("spark.jars.packages", kafka_connector_package())
        .config("spark.jars.ivy", str(cache / "ivy"))
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
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
    )
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session

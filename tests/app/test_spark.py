"""The Spark session as the service starts it."""

from __future__ import annotations

import pyarrow as pa
import pytest

from app.service import spark_conf
from app.settings import load_settings
from app.spark import local_checkpoint_conf

pytestmark = pytest.mark.integration


def test_python_workers_import_pyspark_without_its_zip_archives(spark):
    # pyspark 4.0 re-reads every zip on the import path before each task: they must not be there.
    def report(batches):
        import os
        import sys
        import zipimport

        for _ in batches:
            pass
        zips = [p for p in sys.path if p.endswith((".zip", ".jar")) and os.path.exists(p)]
        cached = [k for k, v in sys.path_importer_cache.items() if isinstance(v, zipimport.zipimporter)]
        import pyspark

        yield pa.RecordBatch.from_pydict({"zips": [len(zips) + len(cached)], "pyspark": [pyspark.__file__]})

    rows = spark.range(0, 4, 1, 2).mapInArrow(report, "zips long, pyspark string").collect()
    assert [r.zips for r in rows] == [0, 0]
    assert all("site-packages" in r.pyspark and ".zip" not in r.pyspark for r in rows)


def test_the_kafka_connector_comes_from_the_cache_not_from_ivy(spark):
    jars = spark.sparkContext.getConf().get("spark.jars", "")
    assert "spark-sql-kafka-0-10" in jars
    assert spark.sparkContext.getConf().get("spark.jars.packages", "") == ""


def test_stop_spark_leaves_no_jvm_to_log_after_the_last_line(tmp_path):
    """A command's last line names the cause of its failure; a JVM still stopping after it would
    print below it. Its own interpreter: the session fixture's JVM must outlive this test."""
    import subprocess
    import sys

    from app.settings import load_settings

    script = f"""
import os, sys
from pyspark import SparkContext
from app.spark import spark_session, stop_spark
spark_session("local[1]", {load_settings(None).cache_dir!r})
process = SparkContext._gateway.proc
stop_spark()
print(process.poll() is not None, SparkContext._gateway is None, SparkContext._active_spark_context is None)
stop_spark()  # again, with nothing left to stop
print("done", file=sys.stderr)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "True", "True"]
    assert result.stderr.strip().splitlines()[-1] == "done"


@pytest.mark.parametrize(
    ("location", "raw_local"),
    [
        ("/srv/geoingest/checkpoints", True),
        ("file:///srv/checkpoints", True),
        ("s3a://bucket/ck", False),
        ("hdfs://nn/ck", False),
    ],
)
def test_only_a_local_checkpoint_is_written_through_the_raw_local_file_system(location, raw_local):
    """Spark's default checkpoint manager stays for stores whose FileContext renames atomically;
    the service's kill -9 tests (tests/streaming/job/test_chaos.py) resume from local ones."""
    conf = local_checkpoint_conf(location)
    assert bool(conf) is raw_local
    if raw_local:
        assert conf["spark.hadoop.fs.file.impl"] == "org.apache.hadoop.fs.RawLocalFileSystem"
        assert conf["spark.sql.streaming.checkpointFileManagerClass"].endswith("FileSystemBasedCheckpointFileManager")


def test_the_services_own_spark_settings_win_over_the_checkpoints(tmp_path):
    settings = load_settings(
        env={}, checkpoint_location=str(tmp_path), spark={"spark.hadoop.fs.file.impl": "org.example.Mine"}
    )
    conf = spark_conf(settings)
    assert conf["spark.hadoop.fs.file.impl"] == "org.example.Mine"
    assert conf["spark.sql.streaming.checkpointFileManagerClass"].endswith("FileSystemBasedCheckpointFileManager")

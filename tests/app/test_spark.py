"""The Spark session as the service starts it."""

from __future__ import annotations

import pyarrow as pa
import pytest

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

"""The service's reading of a streaming query's progress (app/progress.py) against a real query:
each report once, in order, the same as pyspark's own conversion of it."""

from __future__ import annotations

import logging
import time

import pytest

from app.progress import ProgressReader


@pytest.mark.integration
def test_each_report_is_read_once_in_order_as_pyspark_reads_it(spark, caplog):
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 2000)
        .load()
        .writeStream.format("noop")
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    reader = ProgressReader(query, "rates")
    read: list[dict] = []
    reads_with_several = 0
    caplog.set_level(logging.INFO, logger="geoingest.service")
    try:
        deadline = time.monotonic() + 120
        while sum(1 for r in read if r["numInputRows"]) < 12 and time.monotonic() < deadline:
            # Read once two more batches ran (pyspark's own view): a read finds several new reports.
            newest = read[-1]["batchId"] if read else -1
            while time.monotonic() < deadline and (query.lastProgress or {"batchId": -1})["batchId"] < newest + 2:
                time.sleep(0.05)
            new = reader.new_reports()
            reads_with_several += len(new) > 1
            read += new
    finally:
        query.stop()
    read += reader.new_reports()  # what came in before the stop

    # pyspark's conversion of the same reports, field by field through py4j: the reference.
    expected = [p for p in query.recentProgress]
    assert len(expected) < 100, "the query kept every report (spark.sql.streaming.numRecentProgressUpdates)"
    assert [r["batchId"] for r in read] == [p.batchId for p in expected]
    assert [r["timestamp"] for r in read] == [p.timestamp for p in expected]
    assert [r["numInputRows"] for r in read] == [p.numInputRows for p in expected]
    assert [r["durationMs"] for r in read] == [dict(p.durationMs) for p in expected]
    assert reads_with_several > 0, "the reads were to fall behind the batches"
    assert reader.new_reports() == [], "nothing read twice"

    lines = [rec.batch for rec in caplog.records if rec.getMessage() == "progress"]
    with_rows = [r for r in read if r["numInputRows"]]
    assert [line["batch_id"] for line in lines] == [r["batchId"] for r in with_rows]
    assert all(line["query"] == "rates" for line in lines)
    assert [line["duration_ms"]["triggerExecution"] for line in lines] == [
        r["durationMs"]["triggerExecution"] for r in with_rows
    ]

"""A streaming query's progress as the service reads it: Spark's own JSON of each report, and
the "progress" log line of each batch that read records.

pyspark builds a progress object from the JVM's field by field: `StreamingQuery.lastProgress`
and a Python `StreamingQueryListener` (which Spark calls back through py4j on every trigger) each
cost hundreds of py4j round trips per report, most of them a type check that makes the JVM look a
class name up in every jar. The service did both, and at 100,000 GeoJSON points/s (trigger "0
seconds") the driver's Python and the JVM's py4j and listener threads used 0.30 CPU-seconds per
batch; reading each report as one round trip, its JSON as Spark renders it
(`StreamingQueryProgress.json`), they use 0.07 (bench/sustained.py's CPU by part; docs/benchmarks.md).
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger("geoingest.service")


class ProgressReader:
    """The reports of one query not read yet, oldest first, each as the dict of Spark's JSON.

    Spark keeps the last `spark.sql.streaming.numRecentProgressUpdates` (100) reports; a reader
    polled every second sees each batch's, and an idle query's (every 10 s, without a new batch id)."""

    def __init__(self, query: Any, name: str) -> None:
        """`query`: a pyspark StreamingQuery of this process's JVM; `name`: the query's, in the log
        lines (the table it feeds, or "topic-<topic>" for a split topic's)."""
        self.query = query
        self.name = name
        self.seen: str | None = None  # the newest report's timestamp read so far (ISO 8601, UTC)

    def new_reports(self) -> list[dict]:
        recent = self.query._jsq.recentProgress()  # one round trip; its length and items one each
        reports: list[dict] = []
        for index in range(len(recent) - 1, -1, -1):
            report = json.loads(recent[index].json())
            # Spark's timestamps are of one width and zone, so their text orders as their time.
            if self.seen is not None and report.get("timestamp", "") <= self.seen:
                break
            reports.append(report)
        reports.reverse()
        if reports:
            self.seen = reports[-1].get("timestamp")
        for report in reports:
            self._log(report)
        return reports

    def _log(self, report: dict) -> None:
        """Spark's timing of a trigger that read records (`duration_ms`: latestOffset, walCommit
        (the offset log), getBatch, queryPlanning, addBatch (the foreachBatch call, whose parts
        the "batch" line's `seconds` give), commitOffsets (the commit log), triggerExecution)."""
        if report.get("numInputRows"):
            log.info(
                "progress",
                extra={
                    "batch": {
                        "query": self.name,
                        "batch_id": report.get("batchId"),
                        "rows": report.get("numInputRows"),
                        "duration_ms": report.get("durationMs", {}),
                    }
                },
            )

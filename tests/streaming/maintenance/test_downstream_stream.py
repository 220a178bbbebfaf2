"""A downstream streaming reader of a geoingest table: Spark Structured Streaming with Iceberg's own
source (`spark.readStream.format("iceberg")`, Iceberg's Spark runtime) follows an append table through
ingest batches, a compaction (with its manifest merge) and a retention drop, and stops once expiry
removed the snapshot it had read up to.

Iceberg's source reads the files each "append" snapshot adds, skips "replace" snapshots (a rewrite of
rows it already read) by itself, and stops at a "delete" or "overwrite" snapshot unless told to skip
them (docs/reading.md says which options a downstream reader sets)."""

from __future__ import annotations

import pytest

from streaming.contract import parse_contract
from streaming.maintenance.maintain import maintain
from streaming.maintenance.plan import MaintenancePolicy
from streaming.storage import data_location
from streaming.table.catalog import create_table, partition_layout
from streaming.table.commit import BatchCommit, Committer
from streaming.write.data_files import GeoParquetWriter
from tests.iceberg_spark import iceberg_spark_conversation
from tests.partitioned_tables import DAY_US, rows
from tests.streaming.write.test_upsert import DEMO

pytestmark = pytest.mark.integration

DAY0 = 20_000  # 2024-10-04

# The downstream query, run again from its checkpoint on each metadata file it is sent (the table
# as it is after each step, as a query on a catalog would see it), trigger availableNow, the event
# ids it read into a Parquet sink; it answers with all the ids in the sink, or the error it stopped with.
STREAM_READER = """
import json, sys
from pathlib import Path
from app.spark import spark_session
cache, jars, work = sys.argv[1:4]
spark = spark_session("local[1]", cache, "1g", extra_jars=[Path(j) for j in jars.split(",")])
for line in sys.stdin:
    query = (
        spark.readStream.format("iceberg")
        .option("streaming-skip-delete-snapshots", "true")
        .load(line.strip())
        .select("event_id")
        .writeStream.format("parquet")
        .option("path", work + "/rows")
        .option("checkpointLocation", work + "/checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
        answer = {"ids": [r.event_id for r in spark.read.parquet(work + "/rows").collect()]}
    except Exception as exc:
        answer = {"error": str(exc)[:3000]}
    print("ANSWER " + json.dumps(answer), flush=True)
spark.stop()
"""


def test_a_downstream_stream_reads_every_row_once_through_compaction_and_retention(catalog, tmp_path):
    contract = parse_contract({**DEMO, "partition": ["day(event_time)"]})
    table, _ = create_table(catalog, contract)
    committer = Committer(table)
    appended: list[str] = []

    def ingest(batch_id: int) -> None:
        """One batch as ingest commits it: 40 rows on each of day 0 and day 1, a file per day."""
        parts = [rows(contract, day, f"b{batch_id}", 40, seed=batch_id * 10 + day - DAY0) for day in (DAY0, DAY0 + 1)]
        writer = GeoParquetWriter(
            contract,
            dict(table.properties),
            dict(table.io.properties),
            data_location(table),
            f"w-b{batch_id:09d}",
            partition_layout(table),
        )
        files = tuple(record for part in parts for record in writer.write(part.to_batches()))
        offsets = {"t": {0: (batch_id * 80, batch_id * 80 + 79)}}
        assert committer.commit(BatchCommit("w", batch_id, offsets, files)).status == "committed"
        appended.extend(id_ for part in parts for id_ in part.column("event_id").to_pylist())

    with iceberg_spark_conversation(STREAM_READER, tmp_path, str(tmp_path / "stream")) as ask:

        def stream_reads(after: str) -> None:
            table.refresh()
            answer = ask(table.metadata_location)
            assert "error" not in answer, f"after {after} the stream stopped: {answer['error']}"
            assert sorted(answer["ids"]) == sorted(appended), f"after {after}: every appended row once"

        for batch_id in range(4):
            ingest(batch_id)
        stream_reads("4 ingest batches")

        compacted = maintain(table, MaintenancePolicy(min_file_age_s=0, max_manifests=1), steps=("compact",))
        assert compacted.compaction.files_rewritten == 8 and compacted.manifests.snapshot_id is not None
        ingest(4)
        stream_reads("a compaction, its manifest merge and a batch")
        compaction = table.metadata.snapshot_by_id(compacted.compaction.snapshot_id)
        assert compaction.summary.operation.value == "replace", "what Java's RewriteFiles commits"

        # Day 0 wholly past the horizon: its files leave the table in a "delete" snapshot.
        now_ms = (DAY0 + 3) * DAY_US // 1000
        dropped = maintain(table, MaintenancePolicy(retention_s=2 * 86400), steps=("retention",), now_ms=now_ms)
        assert dropped.retention.rows_dropped == 5 * 40
        ingest(5)
        stream_reads("a retention drop and a batch")

        # A reader that fell behind expiry stops: the snapshot it had read up to is gone.
        ingest(6)
        maintain(table, MaintenancePolicy(snapshot_max_age_s=0, keep_snapshots=1, max_snapshots=1), steps=("expire",))
        ingest(7)
        table.refresh()
        behind = ask(table.metadata_location)
        assert "the snapshot was expired or removed" in behind.get("error", ""), behind

"""A partitioned table on the lakehouse shape (the bucket behind s3proxy, Iceberg's REST catalog, a
Spark standalone cluster, the broker over SASL_SSL), everything run as `geoingest` commands: a
stream over several days and many places lands in the right partitions; `geoingest query` with a
time window and a bbox returns exactly the brute-force answer from the files of the right partitions
only; retention drops the old days on the bucket without rewriting a data file; compaction keeps
every file inside one partition."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from streaming.kernels.geohash import covering_cells, enclosing_cells
from streaming.read.predicate import Predicate
from streaming.read.query import query
from tests.streaming.job.test_lakehouse import contract_file, geoingest, lakehouse, new_topic, no_aws_variables
from tests.streaming.job.test_partitioning import (
    DAY_MS,
    WINDOW,
    brute_force,
    iso,
    make_events,
    midnight_ms,
    produce_timed,
)

pytestmark = pytest.mark.integration
__all__ = ["lakehouse", "no_aws_variables"]  # fixtures this module uses

SPEC = ["day(event_time)", "geohash(geometry, 1)"]
ROOT = Path(__file__).resolve().parents[3]
DAY_US = DAY_MS * 1000


def file_partitions(table, bucket_dir) -> dict[str, tuple]:
    """Each live data file's (day, cell) partition, after checking that its rows, read from the
    bucket, all have that day and that cell."""
    found = {}
    for task in table.scan().plan_files():
        day, cell = task.file.partition[0], task.file.partition[1]
        data = pq.read_table(bucket_dir / task.file.file_path.removeprefix("s3://"))
        micros = data.column("event_time").cast("int64").to_numpy()
        assert set((micros // DAY_US).tolist()) == {day}, task.file.file_path
        bbox = data.column("bbox").combine_chunks()
        cells = enclosing_cells(
            *(bbox.field(n).to_numpy(zero_copy_only=False) for n in ("xmin", "ymin", "xmax", "ymax")), 1
        )
        assert set(cells.tolist()) == {cell} == set(data.column("geometry_geohash1").to_pylist()), task.file.file_path
        found[task.file.file_path] = (day, cell)
    return found


def test_a_partitioned_table_on_the_lakehouse_prunes_drops_old_days_and_compacts_within_partitions(lakehouse, tmp_path):
    # Four days: the last 6 hours of 4 days ago, two whole days, and yesterday up to 06:00.
    events = make_events(2_000, seed=7, start_ms=midnight_ms(2) - 6 * 3_600_000, span_ms=2 * DAY_MS + 12 * 3_600_000)
    topic = new_topic(lakehouse)
    table_name = "lh_partitioned.events"
    contract = contract_file(tmp_path, table_name, partition=SPEC)
    assert produce_timed(lakehouse.broker.bootstrap, topic, events) == len(events)
    env = lakehouse.env(
        topic,
        tmp_path,
        GEOINGEST_MAX_OFFSETS_PER_TRIGGER="700",
        GEOINGEST_MAINTENANCE_MIN_FILE_AGE_S="0",
        GEOINGEST_MAINTENANCE_SNAPSHOT_MAX_AGE_S="0",
        GEOINGEST_MAINTENANCE_KEEP_SNAPSHOTS="1",
        GEOINGEST_RETENTION="3 days",
        # The executors' Python workers import the checkout under test, not the one the venv was
        # installed from (an editable install), as the driver does.
        GEOINGEST_SPARK=json.dumps({"spark.executorEnv.PYTHONPATH": str(ROOT)}),
    )
    geoingest(env, tmp_path, "table", "create", "--contract", str(contract))
    summary = json.loads(geoingest(env, tmp_path, "run", "--contract", str(contract), "--until-idle").stdout)
    assert summary["batches"] >= 3, summary

    table = lakehouse.open_catalog().load_table(table_name)
    assert [f.name for f in table.spec().fields] == ["event_time_day", "geometry_geohash1"]
    bucket_dir = lakehouse.store.data_dir
    partitions = file_partitions(table, bucket_dir)
    days = {d for d, _ in partitions.values()}
    assert len(days) == 4 and len({c for _, c in partitions.values()}) > 10
    assert table.scan().to_arrow().num_rows == len(events)

    # A day-and-a-half window and a bbox: the brute-force answer, from the right partitions only.
    lo, hi = midnight_ms(1) - 6 * 3_600_000, midnight_ms(0) + 6 * 3_600_000
    expected = brute_force(events, WINDOW, lo, hi)
    assert len(expected) > 50
    bbox_arg = ",".join(str(v) for v in WINDOW)
    window = ("--from", iso(lo), "--to", iso(hi))
    out = geoingest(env, tmp_path, "query", "--table", table_name, f"--bbox={bbox_arg}", *window).stdout
    assert sorted(json.loads(line)["id"] for line in out.splitlines()) == sorted(expected)
    count = json.loads(
        geoingest(
            env, tmp_path, "query", "--table", table_name, f"--bbox={bbox_arg}", *window, "--format", "count"
        ).stdout
    )
    wanted_days = set(range(lo // DAY_MS, (hi - 1) // DAY_MS + 1))
    cover = set(covering_cells(WINDOW, 1))
    right = [p for p, (d, c) in partitions.items() if d in wanted_days and c in cover]
    assert count["count"] == len(expected)
    assert 0 < count["files_scanned"] <= len(right) < len(partitions), (count, len(right), len(partitions))

    # Retention of 3 days: the oldest day (wholly past) goes, as a delete of its files; the day the
    # horizon cuts stays whole. No data file is written, and the dropped ones stay on the bucket
    # (time travel) until expiry.
    oldest = min(days)
    report = json.loads(
        geoingest(env, tmp_path, "table", "maintain", "--table", table_name, "--retention").stdout.splitlines()[-1]
    )
    dropped = {p for p, (d, _) in partitions.items() if d == oldest}
    assert report["retention"]["partitions_dropped"] == len({partitions[p] for p in dropped}), report
    assert report["retention"]["files_dropped"] == len(dropped)
    assert report["retention"]["rows_dropped"] == sum(1 for *_, t in events if t // DAY_MS == oldest)
    table = lakehouse.open_catalog().load_table(table_name)
    snapshot = table.current_snapshot()
    assert snapshot.summary.operation.value == "delete"
    assert "added-data-files" not in snapshot.summary.additional_properties
    assert set(file_partitions(table, bucket_dir)) == set(partitions) - dropped, "nothing rewritten"
    assert all((bucket_dir / p.removeprefix("s3://")).exists() for p in dropped)
    kept = {k.decode() for k, _, t in events if t // DAY_MS != oldest}
    assert set(table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()) == kept

    # Compaction merges the batches' small files of each partition, never two partitions; expiry
    # then frees the dropped days' files from the bucket.
    before = file_partitions(table, bucket_dir)
    geoingest(env, tmp_path, "table", "maintain", "--table", table_name, "--compact", "--expire")
    table = lakehouse.open_catalog().load_table(table_name)
    after = file_partitions(table, bucket_dir)  # checks every file's rows against its partition
    assert len(after) < len(before)
    assert set(after.values()) == set(before.values()), "the same partitions, fewer files"
    assert not any((bucket_dir / p.removeprefix("s3://")).exists() for p in dropped), "expiry freed them"
    assert set(table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()) == kept
    result = query(table, Predicate.from_bbox(WINDOW), time_from=iso(lo), time_to=iso(hi))
    assert set(result.table.column("event_id").to_pylist()) == expected - {
        k.decode() for k, _, t in events if t // DAY_MS == oldest
    }

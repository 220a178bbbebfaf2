"""Maintenance of native-geometry (v3) tables (streaming/maintenance/native.py): retention, compaction
along the Hilbert curve, expiry and orphans committed through Iceberg Java on a real SQLite catalog,
checked by what DuckDB reads of the table (rows, GEOMETRY, files pruned by the manifests' geometry
bounds) and by the files themselves."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from app.maven import configure_iceberg_java
from streaming.contract import parse_contract
from streaming.maintenance.maintain import maintain
from streaming.maintenance.plan import MaintenancePolicy
from streaming.read.predicate import Predicate
from streaming.read.query import query
from streaming.storage import data_location
from streaming.table.catalog import create_table
from streaming.table.native import native_table
from streaming.write.data_files import GeoParquetWriter
from tests.conftest import CACHE_DIR, duckdb_connection
from tests.partitioned_tables import DAY_US, HOUR_US, rows
from tests.streaming.maintenance.test_maintain import EAGER, expected_ids, table_ids, write_batches

pytestmark = pytest.mark.integration

configure_iceberg_java(CACHE_DIR)

CONTRACT_PATH = Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json"
DAY0 = 20_000  # 2024-10-04


def native_contract(partition: list[str], covering: bool = True, **clustering):
    """`covering` False: the table stores no bbox covering (`bbox.stored: false`)."""
    raw = json.loads(CONTRACT_PATH.read_text())
    raw["geometry"]["native"] = True
    if not covering:
        raw["bbox"] = {"stored": False}
    raw["partition"] = partition
    raw["clustering"].update(clustering)
    return parse_contract(raw)


def append_days(table, contract, days: range, n: int = 50) -> None:
    """One batch per day: that day's rows, written by the service's writer, appended by Iceberg Java."""
    handle = native_table(table)
    for day in days:
        writer = GeoParquetWriter(contract, dict(table.properties), {}, data_location(table), f"d{day}")
        records = [
            dataclasses.replace(record, partition_values=(day,))
            for record in writer.write(rows(contract, day, "a", n, seed=day).to_batches())
        ]
        handle.append(records, contract.geometry.id, {}, handle.current_snapshot_id())
    table.refresh()


def duckdb_days(table) -> dict[int, int]:
    found = duckdb_connection().execute(
        "SELECT epoch_us(event_time) // 86400000000 AS day, count(*) "
        f"FROM iceberg_scan('{table.metadata_location}') GROUP BY day ORDER BY day"
    )
    return {int(day): int(n) for day, n in found.fetchall()}


def test_retention_drops_old_days_of_a_native_table_and_expiry_frees_their_files(catalog):
    contract = native_contract(["day(event_time)"])
    table, _ = create_table(catalog, contract)
    append_days(table, contract, range(DAY0, DAY0 + 4))
    before = {Path(f) for f in _data_files(table)}
    assert duckdb_days(table) == {DAY0 + d: 50 for d in range(4)}
    now_ms = (DAY0 + 3) * DAY_US // 1000 + 12 * HOUR_US // 1000  # horizon: noon of day 1

    report = maintain(table, MaintenancePolicy(min_file_age_s=0, retention_s=2 * 86400), ("retention",), now_ms=now_ms)

    assert (report.retention.partitions_dropped, report.retention.rows_dropped) == (1, 50)
    assert duckdb_days(table) == {DAY0 + d: 50 for d in (1, 2, 3)}, "day 0 gone, day 1 kept whole"
    snapshot = table.current_snapshot()
    assert snapshot.summary.operation.value == "delete" and snapshot.summary["deleted-data-files"] == "1"
    assert table.metadata.format_version == 3
    dropped = before - {Path(f) for f in _data_files(table)}
    assert len(dropped) == 1 and all(p.exists() for p in dropped), "kept for time travel until expiry"

    report = maintain(
        table,
        dataclasses.replace(EAGER, retention_s=2 * 86400, keep_snapshots=1, max_snapshots=1),
        now_ms=now_ms + 86_400_000,
    )
    assert report.retention.partitions_dropped == 1 and report.skipped is None
    assert duckdb_days(table) == {DAY0 + 2: 50, DAY0 + 3: 50}
    assert not any(p.exists() for p in dropped), "expiry deleted the first dropped day's files"
    assert report.expiry.snapshots_expired >= 4


def _data_files(table) -> list[str]:
    scan = f"iceberg_scan('{table.metadata_location}')"
    return [
        row[0].removeprefix("file://")
        for row in duckdb_connection().execute(f"SELECT DISTINCT filename FROM {scan}").fetchall()
    ]


@pytest.mark.parametrize("covering", [True, False], ids=["bbox", "no-bbox"])
def test_compaction_of_a_native_table_keeps_every_row_as_geometry_with_bounds_that_prune(catalog, covering):
    # Small target files, so that the rewrite is several stretches of the curve.
    contract = native_contract([], covering, target_file_bytes=32_768, row_group_rows=100)
    table, _ = create_table(catalog, contract)
    write_batches(table, contract, 12)
    small = _data_files(table)
    assert len(small) == 24

    report = maintain(table, EAGER)

    assert report.skipped is None and report.compaction.files_rewritten == 24 and report.conflicts == 0
    assert table_ids(table) == expected_ids(range(12)), "every row once"
    compacted = _data_files(table)
    assert 1 < len(compacted) < 24 and all(Path(p).name.startswith("compacted") for p in compacted)
    for path in compacted:
        parquet = pq.ParquetFile(path)
        assert parquet.schema.column(parquet.schema_arrow.get_field_index("geometry")).logical_type.type == "GEOMETRY"
        assert ("bbox" in parquet.schema_arrow.names) == covering
    snapshot = table.current_snapshot()
    assert snapshot.summary.operation.value == "replace"
    assert snapshot.summary.additional_properties["geoingest.maintenance"] == "compaction"
    assert len(table.metadata.snapshots) <= EAGER.keep_snapshots + 1

    # Each compacted file is one stretch of the curve: a small window reads fewer files than there are.
    con = duckdb_connection()
    scan = f"iceberg_scan('{table.metadata_location}')"
    xmin, ymin = con.execute(f"SELECT ST_XMin(geometry), ST_YMin(geometry) FROM {scan} LIMIT 1").fetchone()
    window = f"ST_MakeEnvelope({xmin - 0.1}, {ymin - 0.1}, {xmin + 0.1}, {ymin + 0.1})"
    plan = "\n".join(
        row[1]
        for row in con.execute(f"EXPLAIN ANALYZE SELECT event_id FROM {scan} WHERE geometry && {window}").fetchall()
    )
    read = int(plan.split("Total Files Read: ")[1].split()[0])
    assert 1 <= read < len(compacted), plan

    # `geoingest query` finds what DuckDB finds, pruning by the covering or the geometry bounds.
    box = (xmin - 0.1, ymin - 0.1, xmin + 0.1, ymin + 0.1)
    found = query(table, Predicate.from_bbox(box))
    expected = con.execute(f"SELECT event_id FROM {scan} WHERE ST_Intersects(geometry, {window})").fetchall()
    assert sorted(found.table.column("event_id").to_pylist()) == sorted(r[0] for r in expected)
    assert 1 <= found.stats.files_scanned < len(compacted)
    assert found.stats.row_groups_scanned < found.stats.row_groups_total


def test_orphans_of_a_native_table_are_deleted_under_its_lease_and_referenced_files_kept(catalog):
    contract = native_contract([])
    table, _ = create_table(catalog, contract)
    write_batches(table, contract, 2)
    stray = Path(_data_files(table)[0]).with_name("stray.parquet")
    stray.write_bytes(b"left by a writer that died")
    two_hours_ago = time.time() - 7200
    os.utime(stray, (two_hours_ago, two_hours_ago))

    report = maintain(table, MaintenancePolicy(orphan_min_age_s=3600), ("orphans",))

    assert report.skipped is None and (report.orphans.found, report.orphans.deleted) == (1, 1)
    assert not stray.exists()
    assert table_ids(table) == expected_ids(range(2))

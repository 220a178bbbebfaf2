"""Table maintenance: pure planning on hard-coded values, then maintenance of real tables (SQLite
catalog) whose micro-batches are written the way ingest writes them, without Spark or Kafka:
Kafka-like record batches of GeoJSON points through `PartitionTask` (decode, Hilbert sort,
GeoParquet files: the code a Spark task runs), committed by `Committer`. The batch writer here is
shared with tests/streaming/maintenance/test_maintenance_integration.py and bench/maintenance.py."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.conversions import from_bytes
from pyiceberg.table import Table
from pyiceberg.types import DoubleType

from streaming.contract import Contract, load_contract, parse_contract
from streaming.decode.decoder import DecodeOptions
from streaming.kernels.hilbert import hilbert_keys_of_bounds
from streaming.maintenance import maintain as maintain_module
from streaming.maintenance.commits import MAINTENANCE, MaintenanceGaveUp, Retrier
from streaming.maintenance.compaction import COMPACTION_FILE_PREFIX, compact
from streaming.maintenance.maintain import (
    data_manifest_count,
    delete_orphans,
    expire_snapshots,
    maintain,
    merge_manifests,
)
from streaming.maintenance.orphans import referenced_files, referenced_metadata_files
from streaming.maintenance.plan import (
    LiveFile,
    MaintenancePolicy,
    SnapshotFacts,
    compaction_candidates,
    parse_steps,
    plan_bins,
    plan_expiry,
)
from streaming.read.predicate import Predicate
from streaming.read.query import query
from streaming.table.catalog import create_table, open_catalog, partition_layout
from streaming.table.commit import (
    BATCH_ID,
    WRITER_ID,
    WRITERS,
    BatchCommit,
    CommitOutcome,
    Committer,
    WriterHistory,
    committed_snapshot,
    recorded_offsets,
    resume_offsets,
)
from streaming.table.deletes import snapshot_files
from streaming.table.native import is_native
from streaming.write.data_files import FileSettings
from streaming.write.merge import LastTaskMerge
from streaming.write.task import BatchResults, PartitionTask
from streaming.write.upsert import equality_field_ids
from tests.conftest import duckdb_connection
from tests.streaming.write.test_upsert import duckdb_rows_and_keys, spark_iceberg_state, table_state

TOPIC = "geo-events"


def event_id(writer_id: str, batch_id: int, row: int) -> str:
    return f"{writer_id}-b{batch_id:05d}-r{row:06d}"


def kafka_batch(lon: np.ndarray, lat: np.ndarray, ids: list[str], partition: int, first_offset: int) -> pa.RecordBatch:
    """What Spark's Kafka source hands a task: GeoJSON point features, one per record."""
    n = len(ids)
    values = [
        json.dumps(
            {
                "type": "Feature",
                "id": ids[i],
                "geometry": {"type": "Point", "coordinates": [round(float(lon[i]), 6), round(float(lat[i]), 6)]},
                "properties": {"kind": "probe", "speed": float(i % 97)},
            }
        ).encode()
        for i in range(n)
    ]
    return pa.record_batch(
        {
            "key": pa.nulls(n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": pa.array([TOPIC] * n),
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
            "timestamp": pa.array([1_700_000_000_000_000 + first_offset] * n, pa.timestamp("us")),
        }
    )


@dataclass
class BatchWriter:
    """Writes and commits micro-batches of one writer, `tasks` input partitions per batch (as the
    local clustering mode does: each task sorts and writes its own share of the batch)."""

    table: Table
    contract: Contract
    writer_id: str = "writer-a"
    tasks: int = 2
    next_offset: int = 0

    def __post_init__(self) -> None:
        self.committer = Committer(self.table)

    def files(self, batch_id: int, lon: np.ndarray, lat: np.ndarray, ids: list[str] | None = None):
        """The batch's data files, its equality delete files (an upsert table's) and its offsets;
        its events' ids are `ids`, else unique to the writer, batch and row."""
        n = len(lon)
        ids = ids or [event_id(self.writer_id, batch_id, i) for i in range(n)]
        settings = FileSettings(
            dict(self.table.properties),
            dict(self.table.io.properties),
            f"{self.table.location().rstrip('/')}/data",
            f"{self.writer_id}-b{batch_id:09d}",
            partition_layout(self.table),
        )
        parts = [part for part in np.array_split(np.arange(n), self.tasks) if len(part)]
        records, deletes = [], []
        offsets: dict[int, tuple[int, int]] = {}
        for t, part in enumerate(parts):
            task = PartitionTask(self.contract, DecodeOptions(), settings)
            if self.contract.mode == "upsert":
                # an upsert batch stages its versions and its last task writes them, as the job's do
                task = dataclasses.replace(
                    task,
                    staging=f"{self.table.location().rstrip('/')}/staging/{self.writer_id}-b{batch_id}",
                    last_merge=LastTaskMerge(lambda t=t: (t, len(parts)), 2, 1_000_000, 1_000_000),
                )
            first = self.next_offset
            batch = kafka_batch(lon[part], lat[part], [ids[i] for i in part], t, first)
            self.next_offset += len(part)
            results = BatchResults.from_rows(next(iter(task([batch]))).to_pylist())
            if any(tally.reason is not None for tally in results.tallies):
                raise AssertionError(f"batch {batch_id}: rows were rejected: {results.tallies}")
            for merged in results.merged.values():
                results.take_files(merged)
            records += results.files
            deletes += results.delete_files
            offsets[t] = (first, first + len(part) - 1)
        return tuple(records), tuple(deletes), {TOPIC: offsets}

    def commit(self, batch_id: int, lon: np.ndarray, lat: np.ndarray, ids: list[str] | None = None) -> CommitOutcome:
        files, deletes, offsets = self.files(batch_id, lon, lat, ids)
        equality_ids = tuple(equality_field_ids(self.contract)) if deletes else ()
        return self.committer.commit(
            BatchCommit(self.writer_id, batch_id, offsets, files, delete_files=deletes, equality_ids=equality_ids)
        )


def world_points(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.uniform(-179.0, 179.0, n), rng.uniform(-85.0, 85.0, n)


CONTRACT_PATH = Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json"
# Maintenance that touches everything at once (the tests have no commit in flight), but orphans at
# their default age: a younger age is refused (below the table's commit window), and the tests that
# delete orphans date theirs back.
EAGER = MaintenancePolicy(min_file_age_s=0, snapshot_max_age_s=0, keep_snapshots=3, max_manifests=2)
MiB = 1024 * 1024


def live(path: str, size: int, key: int | None, added_ms: int | None = 0, records: int = 10) -> LiveFile:
    return LiveFile(path, size, records, key, added_ms)


# -- pure planning ----------------------------------------------------------------------------------
def test_bins_follow_the_curve_and_stay_under_the_size_limit():
    files = [live("e", 3, 50), live("a", 4, 10), live("c", 2, 30), live("b", 4, 20), live("d", 3, 40)]
    bins = plan_bins(files, max_bin_bytes=8, min_files=1)
    assert [[f.path for f in b.files] for b in bins] == [["a", "b"], ["c", "d", "e"]]
    assert [b.bytes for b in bins] == [8, 8]
    assert [b.key_range for b in bins] == [(10, 20), (30, 50)]


def test_bins_are_balanced_rather_than_leaving_a_small_last_bin():
    files = [live(f"f{i}", 10, i) for i in range(10)]  # 100 bytes into bins of at most 60
    bins = plan_bins(files, max_bin_bytes=60, min_files=1)
    assert [len(b.files) for b in bins] == [5, 5]


def test_bins_of_too_few_files_are_dropped_and_a_large_file_stands_alone():
    files = [live("a", 2, 1), live("big", 50, 2), live("c", 2, 3), live("d", 2, 4)]
    bins = plan_bins(files, max_bin_bytes=10, min_files=2)
    assert [[f.path for f in b.files] for b in bins] == [["c", "d"]]
    assert plan_bins([], 10, 2) == []


def test_equal_keys_are_ordered_by_path_so_plans_are_repeatable():
    files = [live("z", 1, 5), live("m", 1, 5), live("a", 1, 5)]
    assert [f.path for f in plan_bins(files, 100, 1)[0].files] == ["a", "m", "z"]


def test_candidates_are_small_old_files_with_bounds():
    now = 1_000_000
    files = [
        live("small-old", 10, 1, added_ms=now - 5000),
        live("small-young", 10, 2, added_ms=now - 10),
        live("large-old", 100, 3, added_ms=now - 5000),
        live("no-bounds", 10, None, added_ms=now - 5000),
        live("expired-snapshot", 10, 4, added_ms=None),
    ]
    picked = compaction_candidates(files, small_file_bytes=50, min_age_ms=1000, now_ms=now)
    assert [f.path for f in picked] == ["small-old", "expired-snapshot"]


def facts(i: int, ts: int, carrier: bool = False) -> SnapshotFacts:
    return SnapshotFacts(snapshot_id=100 + i, sequence_number=i, timestamp_ms=ts, carries_history=carrier)


def test_expiry_keeps_the_newest_young_protected_and_uncovered_snapshots():
    snaps = [facts(1, 0), facts(2, 0), facts(3, 0, carrier=True), facts(4, 0), facts(5, 900), facts(6, 990)]
    plan = plan_expiry(snaps, protected={106}, now_ms=1000, max_age_ms=500, keep=2)
    # 105 and 106 are the newest two; 103 carries the history of 101-102, which may go; 104 came
    # after the carrier, so a new carrier must come first.
    assert plan.expire == (101, 102)
    assert plan.uncovered == (104,)


def test_expiry_without_any_carrier_expires_nothing_and_asks_for_one():
    snaps = [facts(1, 0), facts(2, 0), facts(3, 0)]
    plan = plan_expiry(snaps, protected={103}, now_ms=10_000, max_age_ms=0, keep=1)
    assert plan.expire == () and plan.uncovered == (101, 102)


def test_writer_history_keeps_batch_ranges_and_offset_extremes():
    h = WriterHistory((), None, {})
    for batch, offsets in ((0, (0, 9)), (1, (10, 19)), (3, (30, 39)), (2, (20, 29))):
        h = h.with_batch(batch, 500 + batch, {"t": {0: offsets}})
    assert h.batches == ((0, 3),)
    assert h.last_batch_snapshot_id == 503
    assert h.offsets == {"t": {0: (0, 39)}}
    assert h.has_batch(2) and not h.has_batch(4)
    assert WriterHistory.from_json(h.to_json()) == h


def test_policy_and_steps_reject_nonsense_naming_the_value():
    with pytest.raises(ValueError, match="keep_snapshots: 0"):
        MaintenancePolicy(keep_snapshots=0)
    with pytest.raises(ValueError, match="min_file_age_s: -1"):
        MaintenancePolicy(min_file_age_s=-1)
    with pytest.raises(ValueError, match="'compact,vacuum'"):
        parse_steps("compact,vacuum")
    assert parse_steps("orphans, compact") == ("compact", "orphans")


# -- real tables ------------------------------------------------------------------------------------
@pytest.fixture
def contract():
    return load_contract(CONTRACT_PATH)


@pytest.fixture
def table(catalog, contract):
    table, created = create_table(catalog, contract)
    assert created
    return table


def write_batches(
    table, contract, batches: int, rows: int = 100, writer_id: str = "writer-a", seed: int = 3, start: int = 0
) -> BatchWriter:
    writer = BatchWriter(table, contract, writer_id=writer_id, next_offset=start * rows)
    rng = np.random.default_rng(seed)
    for batch_id in range(start, start + batches):
        assert writer.commit(batch_id, *world_points(rng, rows)).status == "committed"
    return writer


def table_ids(table, snapshot_id: int | None = None) -> list[str]:
    table.refresh()
    if is_native(table) and snapshot_id is None:
        # pyiceberg 0.12 reads no v3 geometry column into Arrow; DuckDB reads the table
        scan = f"iceberg_scan('{table.metadata_location}')"
        return sorted(row[0] for row in duckdb_connection().execute(f"SELECT event_id FROM {scan}").fetchall())
    return sorted(
        table.scan(snapshot_id=snapshot_id, selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()
    )


def expected_ids(batches, rows: int = 100, writer_id: str = "writer-a") -> list[str]:
    return sorted(event_id(writer_id, b, r) for b in batches for r in range(rows))


def data_paths(table) -> list[str]:
    table.refresh()
    return sorted(task.file.file_path for task in table.scan().plan_files())


def test_compaction_rewrites_small_batches_into_hilbert_clustered_files(table, contract):
    write_batches(table, contract, 30)
    before_snapshot = table.current_snapshot().snapshot_id
    small_files = data_paths(table)
    assert len(small_files) == 60  # 2 tasks per batch

    report = compact(table, EAGER)

    assert report.files_rewritten == 60 and report.rows == 3000 and report.conflicts == 0
    ids = table_ids(table)
    assert ids == expected_ids(range(30)), "every row exactly once"
    new_files = data_paths(table)
    assert len(new_files) == report.files_written < 10
    assert all(Path(p).name.startswith(COMPACTION_FILE_PREFIX) for p in new_files)
    snapshot = table.current_snapshot()
    assert snapshot.summary.operation.value == "replace"
    assert snapshot.summary.additional_properties[MAINTENANCE] == "compaction"
    # Time travel to the snapshot before compaction still reads the small files.
    assert table_ids(table, before_snapshot) == ids

    ids_of = contract.bbox_field_ids
    key_ranges = []
    for task in table.scan().plan_files():
        parquet = pq.ParquetFile(task.file.file_path.removeprefix("file://"))
        geo = json.loads(parquet.metadata.metadata[b"geo"])
        assert geo["version"] == "1.1.0" and geo["primary_column"] == "geometry"
        assert geo["columns"]["geometry"]["covering"]["bbox"]["xmin"] == ["bbox", "xmin"]
        assert parquet.schema_arrow.field("event_id").metadata[b"PARQUET:field_id"] == b"1"
        rows = parquet.read()
        bbox = rows.column("bbox").combine_chunks()
        xmin, ymin, xmax, ymax = (bbox.field(n).to_numpy() for n in ("xmin", "ymin", "xmax", "ymax"))
        # Manifest bounds are the file's bbox, as ingest writes them.
        lower = {n: from_bytes(DoubleType(), task.file.lower_bounds[fid]) for n, fid in ids_of.items()}
        upper = {n: from_bytes(DoubleType(), task.file.upper_bounds[fid]) for n, fid in ids_of.items()}
        file_bbox = [xmin.min(), ymin.min(), xmax.max(), ymax.max()]
        assert [lower["xmin"], lower["ymin"], upper["xmax"], upper["ymax"]] == file_bbox
        assert geo["columns"]["geometry"]["bbox"] == file_bbox
        assert parquet.metadata.num_row_groups == -(-rows.num_rows // contract.clustering.row_group_rows)
        keys = hilbert_keys_of_bounds(
            xmin, ymin, xmax, ymax, contract.clustering.extent, contract.clustering.hilbert_bits
        )
        assert (np.diff(keys) >= 0).all(), "rows sorted along the curve"
        key_ranges.append((int(keys[0]), int(keys[-1])))
    key_ranges.sort()
    assert all(a[1] <= b[0] for a, b in zip(key_ranges, key_ranges[1:])), "files are disjoint stretches of the curve"
    assert all(Path(p.removeprefix("file://")).exists() for p in small_files), "sources stay for time travel"


def test_compaction_prunes_a_window_to_fewer_files(table, contract):
    write_batches(table, contract, 30, rows=200)
    window = Predicate.from_bbox((2.0, 40.0, 12.0, 50.0))
    before = query(table, window).stats
    compact(table, dataclasses.replace(EAGER, small_file_bytes=MiB))
    after = query(table, window).stats
    assert after.rows_matched == before.rows_matched > 0
    assert before.files_scanned == 60
    assert after.files_scanned <= 2 < before.files_scanned


def test_young_and_large_files_are_left_alone(table, contract):
    write_batches(table, contract, 4)
    assert compact(table, MaintenancePolicy(min_file_age_s=3600)).files_rewritten == 0, "all too young"
    assert compact(table, dataclasses.replace(EAGER, small_file_bytes=100)).files_rewritten == 0, "all too large"
    assert len(table.metadata.snapshots) == 4, "nothing committed"
    assert compact(table, EAGER).files_rewritten == 8


def race_on_refresh(monkeypatch, table, other_commit, on_calls: set[int]) -> list:
    """Another writer commits right after `table` refreshes, on the given refresh calls (1-based).
    A real second commit through the catalog, so the catalog's own check refuses the stale one."""
    refresh = table.refresh
    calls, outcomes = [], []

    def refresh_then_race():
        result = refresh()
        calls.append(1)
        if len(calls) in on_calls:
            outcomes.append(other_commit())
        return result

    monkeypatch.setattr(table, "refresh", refresh_then_race)
    return outcomes


def test_a_compaction_racing_ingest_commits_is_retried_on_the_fresh_table(monkeypatch, catalog, table, contract):
    writer = write_batches(table, contract, 6)
    mine = open_catalog(catalog.name, dict(catalog.properties)).load_table(contract.table)
    rng = np.random.default_rng(99)
    # Refresh 1 looks for work, 2 takes the maintenance lease, 3 plans the compaction; 4 and 5 start
    # commit attempts, and an ingest batch lands right after each; attempt 3 (refresh 6) commits.
    raced = race_on_refresh(
        monkeypatch, mine, lambda: writer.commit(6 + len(raced), *world_points(rng, 100)), on_calls={4, 5}
    )
    sleeps: list[float] = []
    report = maintain(mine, EAGER, steps=("compact",), sleep=sleeps.append).compaction

    assert [o.status for o in raced] == ["committed", "committed"]
    assert report.conflicts == 2 and len(sleeps) == 2
    assert report.files_rewritten == 12 and report.bins_abandoned == 0
    assert table_ids(table) == expected_ids(range(8)), "compacted rows and the racing batches, each once"
    current = data_paths(table)
    assert sum(1 for p in current if Path(p).name.startswith("writer-a-b")) == 4, "the racing batches' files"
    # The ingest history goes on: the racing batches are found by the replay check.
    assert committed_snapshot(table, "writer-a", 7) is not None


def test_a_bin_whose_files_another_compaction_replaced_is_given_up(monkeypatch, catalog, table, contract):
    write_batches(table, contract, 5)
    mine = open_catalog(catalog.name, dict(catalog.properties)).load_table(contract.table)
    other = race_on_refresh(monkeypatch, mine, lambda: compact(table, EAGER), on_calls={2})
    report = compact(mine, EAGER)

    assert other[0].files_rewritten == 10
    assert report.bins_abandoned == 1 and report.files_rewritten == 0 and report.snapshot_id is None
    assert table_ids(table) == expected_ids(range(5)), "no row lost, none twice"
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    # rglob: a partitioned table's files are in its partitions' folders
    on_disk = {str(p) for p in data_dir.rglob(f"{COMPACTION_FILE_PREFIX}*")}
    assert on_disk == {p.removeprefix("file://") for p in data_paths(table)}, "the loser's files were deleted"


def test_a_rewrite_lands_though_an_upsert_batch_replaced_its_keys_meanwhile(monkeypatch, catalog, tmp_path):
    """An upsert table: a batch moves a third of the keys and its equality deletes land while a
    compaction rewrites the files that hold their old versions. The rewrite still lands, on the
    sequence number of the snapshot it read, so the batch's deletes reach its files: every key
    reads its newest version only, in geoingest, in Spark's Iceberg reader and in DuckDB."""
    contract = parse_contract({**json.loads(CONTRACT_PATH.read_text()), "mode": "upsert"})
    table, _ = create_table(catalog, contract)
    writer = BatchWriter(table, contract)
    rng = np.random.default_rng(11)
    keys = [f"k{i:04d}" for i in range(400)]
    for batch_id in range(4):
        ids = keys[batch_id * 100 : (batch_id + 1) * 100]
        assert writer.commit(batch_id, *world_points(rng, 100), ids=ids).status == "committed"
    read_sequence_number = table.current_snapshot().sequence_number
    moved = keys[::3]
    lon, lat = world_points(rng, len(moved))

    mine = open_catalog(catalog.name, dict(catalog.properties)).load_table(contract.table)
    # Refresh 1 plans the compaction; the batch lands right after refresh 2, the first commit attempt's.
    raced = race_on_refresh(monkeypatch, mine, lambda: writer.commit(4, lon, lat, ids=moved), on_calls={2})
    report = compact(mine, EAGER)

    assert [o.status for o in raced] == ["committed"]
    assert report.files_rewritten == 8 and report.bins_abandoned == 0 and report.conflicts == 1
    table.refresh()
    # as the batch writes them (6 decimals) and table_state reads them (5)
    newest = {key: (round(round(float(x), 6), 5), round(round(float(y), 6), 5)) for key, x, y in zip(moved, lon, lat)}
    state = table_state(table)
    assert sorted(state) == keys, "every key once"
    assert {key: state[key][:2] for key in moved} == newest, "the moved keys at their new places only"
    assert spark_iceberg_state(table.metadata_location, tmp_path) == state, "Spark's Iceberg reader agrees"
    assert duckdb_rows_and_keys(table.metadata_location) == (len(keys), len(keys)), (
        "DuckDB's iceberg_scan reads every key once"
    )
    planned = snapshot_files(table, table.current_snapshot())
    compacted = [p for p in planned.data if Path(p.file.file_path).name.startswith(COMPACTION_FILE_PREFIX)]
    assert compacted and {p.sequence_number for p in compacted} == {read_sequence_number}
    assert planned.reaching_deletes(), "the racing batch's deletes reach the rewritten files"


def losing_every_race(monkeypatch, catalog, table, contract, on_calls: set[int]) -> Table:
    """Three batches in `table`, one commit retry allowed, and a second handle on it after whose
    refreshes `on_calls` an ingest batch lands: the maintenance through it loses both attempts."""
    writer = write_batches(table, contract, 3)
    with table.transaction() as tx:
        tx.set_properties({"commit.retry.num-retries": "1", "commit.retry.min-wait-ms": "1"})
    mine = open_catalog(catalog.name, dict(catalog.properties)).load_table(contract.table)
    rng = np.random.default_rng(5)
    batch_ids = iter(range(3, 100))
    race_on_refresh(monkeypatch, mine, lambda: writer.commit(next(batch_ids), *world_points(rng, 100)), on_calls)
    return mine


def test_a_compaction_that_keeps_losing_gives_up_and_leaves_the_table_as_it_was(monkeypatch, catalog, table, contract):
    # Refresh 1 looks for work, 2 takes the maintenance lease, 3 plans; both commit attempts (4, 5)
    # lose to a batch.
    mine = losing_every_race(monkeypatch, catalog, table, contract, on_calls={4, 5})
    with pytest.raises(MaintenanceGaveUp, match=r"compaction of demo.events gave up after 2 conflict"):
        maintain(mine, EAGER, steps=("compact",), sleep=lambda s: None)
    assert table_ids(table) == expected_ids(range(5))
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    assert not list(data_dir.rglob(f"{COMPACTION_FILE_PREFIX}*"))


# -- manifest merging racing ingest -----------------------------------------------------------------
MERGE_ALL = MaintenancePolicy(max_manifests=1)


def data_manifest_paths(table) -> set[str]:
    table.refresh()
    return {m.manifest_path for m in table.current_snapshot().manifests(table.io) if m.content.value == 0}


def merges_written(monkeypatch) -> list:
    """Every set of merged manifests the merge writes (the real writer, recorded)."""
    written: list = []
    write = maintain_module._write_merged_manifests

    def recorded(view, policy):
        written.append(write(view, policy))
        return written[-1]

    monkeypatch.setattr(maintain_module, "_write_merged_manifests", recorded)
    return written


def test_a_manifest_merge_racing_ingest_commits_lands_its_merge_once_written_on_the_new_base(
    monkeypatch, catalog, table, contract
):
    writer = write_batches(table, contract, 6)
    mine = open_catalog(catalog.name, dict(catalog.properties)).load_table(contract.table)
    rng = np.random.default_rng(7)
    # Refresh 1 counts the manifests; 2, 3 and 4 start commit attempts, and an ingest batch lands
    # right after the first two: attempt 3 commits.
    raced = race_on_refresh(
        monkeypatch, mine, lambda: writer.commit(6 + len(raced), *world_points(rng, 100)), on_calls={2, 3}
    )
    written = merges_written(monkeypatch)
    report = merge_manifests(mine, MERGE_ALL, retrier=Retrier(mine, sleep=lambda s: None))

    assert [o.status for o in raced] == ["committed", "committed"] and report.conflicts == 2
    assert len(written) == 1, "written once, for the base it planned on; the retries only swap manifests"
    racing = {
        m.manifest_path for o in raced for m in table.metadata.snapshot_by_id(o.snapshot_id).manifests(table.io)
    } - written[0].replaced
    assert len(racing) == 2
    merged = {m.manifest_path for m in written[0].merged}
    assert data_manifest_paths(table) == merged | racing, "the merge beside the racing batches' manifests, as they are"
    assert report.manifests_before == 6 and report.manifests_after == len(merged) + 2
    assert table_ids(table) == expected_ids(range(8)), "every row once"
    snapshot = table.current_snapshot()
    assert snapshot.snapshot_id == written[0].snapshot_id == report.snapshot_id
    assert snapshot.summary.additional_properties[MAINTENANCE] == "manifest-merge"
    # The ingest history goes on: the racing batches are found by the replay check.
    assert committed_snapshot(table, "writer-a", 7) is not None


def test_a_manifest_merge_whose_base_lost_files_writes_again_and_deletes_its_first_merge(
    monkeypatch, catalog, table, contract
):
    write_batches(table, contract, 5)
    mine = open_catalog(catalog.name, dict(catalog.properties)).load_table(contract.table)
    # A compaction lands right after the first attempt's refresh: the manifests it planned on are gone.
    other = race_on_refresh(monkeypatch, mine, lambda: compact(table, EAGER), on_calls={2})
    written = merges_written(monkeypatch)
    report = merge_manifests(mine, MERGE_ALL, retrier=Retrier(mine, sleep=lambda s: None))

    assert other[0].files_rewritten == 10 and report.conflicts == 1
    assert len(written) == 2
    assert data_manifest_paths(table) == {m.manifest_path for m in written[1].merged}
    assert not any(Path(m.manifest_path.removeprefix("file://")).exists() for m in written[0].merged)
    assert table_ids(table) == expected_ids(range(5))


def test_a_manifest_merge_that_keeps_losing_gives_up_and_deletes_what_it_wrote(monkeypatch, catalog, table, contract):
    # Refresh 1 counts the manifests; both commit attempts (2, 3) lose to a batch.
    mine = losing_every_race(monkeypatch, catalog, table, contract, on_calls={2, 3})
    written = merges_written(monkeypatch)
    before = data_manifest_paths(table)
    with pytest.raises(MaintenanceGaveUp, match=r"manifest merge of demo.events gave up after 2 conflict"):
        merge_manifests(mine, MERGE_ALL, retrier=Retrier(mine, sleep=lambda s: None))
    assert len(written) == 1 and written[0].merged
    assert not any(Path(m.manifest_path.removeprefix("file://")).exists() for m in written[0].merged)
    assert data_manifest_paths(table) >= before and len(data_manifest_paths(table)) == 5
    assert table_ids(table) == expected_ids(range(5))


# -- expiry keeps exactly-once working --------------------------------------------------------------
def test_after_expiry_replays_are_still_recognised_and_resume_offsets_unchanged(catalog, table, contract):
    write_batches(table, contract, 12)
    write_batches(table, contract, 3, writer_id="writer-b", seed=4)
    offsets_before = recorded_offsets(table)
    resume_before = resume_offsets(table, TOPIC, [0, 1, 2])
    snapshots_before = len(table.metadata.snapshots)

    report = maintain(table, EAGER, steps=("compact", "expire"))

    table.refresh()
    assert report.expiry.snapshots_expired > 0
    assert len(table.metadata.snapshots) <= EAGER.keep_snapshots + 1 < snapshots_before
    identities = {
        (s.summary.additional_properties.get(WRITER_ID), s.summary.additional_properties.get(BATCH_ID))
        for s in table.metadata.snapshots
    }
    assert ("writer-a", "0") not in identities, "the first batch's snapshot has expired"
    # Yet every batch is still known, from the history the maintenance snapshot carries.
    for writer_id, batches in (("writer-a", 12), ("writer-b", 3)):
        for batch_id in range(batches):
            assert committed_snapshot(table, writer_id, batch_id) is not None, (writer_id, batch_id)
        assert committed_snapshot(table, writer_id, batches) is None
    assert recorded_offsets(table) == offsets_before
    assert recorded_offsets(table, "writer-b") == {TOPIC: {0: (0, 249), 1: (50, 299)}}
    assert resume_offsets(table, TOPIC, [0, 1, 2]) == resume_before

    # A restarted writer replays its last batch and an old one, each over the offsets it read the
    # first time (100 a batch): both skipped, nothing added twice.
    restarted = open_catalog(catalog.name, dict(catalog.properties)).load_table(contract.table)
    replayer = BatchWriter(restarted, contract, writer_id="writer-a", next_offset=1100)
    rng = np.random.default_rng(3)
    assert replayer.commit(11, *world_points(rng, 100)).status == "skipped_replay"
    replayer.next_offset = 200
    assert replayer.commit(2, *world_points(rng, 100)).status == "skipped_replay"
    replayer.next_offset = 1200
    assert replayer.commit(12, *world_points(rng, 100)).status == "committed"
    assert table_ids(table) == sorted(expected_ids(range(13)) + expected_ids(range(3), writer_id="writer-b"))


def test_expiry_without_compaction_first_commits_a_carrier_snapshot(table, contract):
    write_batches(table, contract, 6)
    report = expire_snapshots(table, EAGER)
    table.refresh()
    carriers = [s for s in table.metadata.snapshots if WRITERS in s.summary.additional_properties]
    assert len(carriers) == 1 and report.snapshots_expired == 4
    assert carriers[0].summary.additional_properties[MAINTENANCE] == "manifest-merge"
    assert all(committed_snapshot(table, "writer-a", b) is not None for b in range(6))
    assert table_ids(table) == expected_ids(range(6))


def test_expiry_deletes_only_files_no_kept_snapshot_references(table, contract):
    write_batches(table, contract, 10)
    small_files = data_paths(table)
    compact(table, EAGER)
    compacted = table.current_snapshot().snapshot_id
    report = expire_snapshots(table, dataclasses.replace(EAGER, keep_snapshots=1))

    table.refresh()
    assert [s.snapshot_id for s in table.metadata.snapshots] == [compacted]
    assert report.files_deleted >= len(small_files)
    assert not any(Path(p.removeprefix("file://")).exists() for p in small_files), "compacted-away files deleted"
    kept = {p.removeprefix("file://") for p in data_paths(table)} | referenced_metadata_files(table)
    assert all(Path(p).exists() for p in kept), "everything a kept snapshot needs is there"
    assert table_ids(table) == expected_ids(range(10))
    # Time travel: the kept snapshot reads; an expired one is an error that names it.
    assert table_ids(table, compacted) == expected_ids(range(10))
    with pytest.raises(ValueError, match="no such snapshot"):
        query(table, Predicate.from_bbox((0, 0, 1, 1)), snapshot_id=compacted - 1)


def test_files_whose_snapshots_expired_keep_their_age_from_their_names(table, contract):
    """At a fast trigger, `max_snapshots` expires a batch's snapshot within seconds: its files'
    age then comes from their names, so `min_file_age_s` still keeps young files out of compaction."""
    write_batches(table, contract, 10)
    files = data_paths(table)
    policy = dataclasses.replace(EAGER, min_file_age_s=3600, keep_snapshots=1, max_snapshots=1)
    expire_snapshots(table, policy)
    table.refresh()
    assert len(table.metadata.snapshots) == 1, "every batch's snapshot expired"

    assert compact(table, policy).files_rewritten == 0, "written seconds ago: too young"
    in_two_hours = int(time.time() * 1000) + 2 * 3600 * 1000
    assert compact(table, policy, now_ms=in_two_hours).files_rewritten == len(files) == 20
    assert table_ids(table) == expected_ids(range(10))


def test_snapshots_younger_than_the_max_age_never_expire(table, contract):
    write_batches(table, contract, 5)
    maintain(table, MaintenancePolicy(min_file_age_s=0, max_manifests=2, keep_snapshots=1), steps=("compact", "expire"))
    table.refresh()
    assert len(table.metadata.snapshots) == 6, "5 days by default: all five batches and the compaction stay"


def test_many_small_commits_stay_bounded_with_maintenance_between_batches(table, contract):
    policy = dataclasses.replace(EAGER, keep_snapshots=10, max_manifests=4)
    writer = BatchWriter(table, contract)
    rng = np.random.default_rng(1)
    seen = []
    for batch_id in range(150):
        writer.commit(batch_id, *world_points(rng, 20))
        if (batch_id + 1) % 30 == 0:
            maintain(table, policy)
            table.refresh()
            seen.append(
                (
                    len(table.metadata.snapshots),
                    data_manifest_count(table),
                    len(data_paths(table)),
                    len(table.io.new_input(table.metadata_location)),
                )
            )
    assert all(snapshots <= 11 for snapshots, *_ in seen)
    assert all(manifests <= 4 for _, manifests, *_ in seen)
    assert all(files <= 5 for *_, files, _ in seen)
    # Once the metadata log is full (write.metadata.previous-versions-max, 100) the size stays put.
    assert abs(seen[-1][3] - seen[-2][3]) < 0.1 * seen[-2][3], "metadata.json stops growing"
    assert table_ids(table) == sorted(event_id("writer-a", b, r) for b in range(150) for r in range(20))
    assert committed_snapshot(table, "writer-a", 0) is not None


# -- orphans and dry runs ---------------------------------------------------------------------------
def test_orphans_of_a_dead_batch_and_of_old_metadata_are_deleted_after_the_safety_age(table, contract):
    writer = write_batches(table, contract, 3)
    dead_files, _, _ = writer.files(3, *world_points(np.random.default_rng(8), 50))  # never committed
    dead = [f.path for f in dead_files]
    # the sorted run a batch staged before it died between its two passes (clustering "batch")
    staged = Path(table.location().removeprefix("file://")) / "staging" / "w-b000000009" / "run.arrow"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"ARROW1")
    dead.append(str(staged))
    # the metadata file of a commit attempt that lost its race
    lost = Path(table.location().removeprefix("file://")) / "metadata" / "00099-lost-attempt.metadata.json"
    lost.write_text("{}")
    dead.append(str(lost))
    young = maintain(table, MaintenancePolicy(orphan_min_age_s=3600), steps=("orphans",)).orphans
    assert young.found == 0, "young files may belong to a commit in flight"

    two_hours_ago = time.time() - 2 * 3600  # as a run two hours later finds every file of the table
    for path in Path(table.location().removeprefix("file://")).rglob("*"):
        os.utime(path, (two_hours_ago, two_hours_ago))
    report, orphans = delete_orphans(table, MaintenancePolicy(orphan_min_age_s=3600))
    assert {o.path for o in orphans} >= {p.removeprefix("file://") for p in dead}
    assert report.deleted == report.found == len(orphans)
    assert not any(Path(p.removeprefix("file://")).exists() for p in dead)
    kept = referenced_files(table) | referenced_metadata_files(table)
    assert all(Path(p).exists() for p in kept)
    assert table_ids(table) == expected_ids(range(3))


def test_a_dry_run_changes_nothing(table, contract):
    write_batches(table, contract, 6)
    location = table.metadata_location
    files = sorted(Path(table.location().removeprefix("file://")).rglob("*"))
    report = maintain(table, EAGER, dry_run=True)
    table.refresh()
    assert table.metadata_location == location
    assert sorted(Path(table.location().removeprefix("file://")).rglob("*")) == files
    assert report.compaction.files_rewritten == 12 and report.expiry.snapshots_expired == 3

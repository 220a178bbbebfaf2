"""Maintenance on partitioned tables: retention drops whole time partitions past the horizon without
rewriting a data file, and compaction keeps every file inside one partition of one spec.

The tables are partitioned directly with pyiceberg (day of event_time, identity of `kind` as a
spatial cell column would be), their files written by the project's GeoParquetWriter, one file per
partition and batch, as a partitioning writer lays them out."""

from __future__ import annotations

import calendar
import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry
from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform

from app.cli import main
from app.metrics import MaintenanceMetrics
from streaming.contract import load_contract, parse_contract
from streaming.maintenance.commits import MAINTENANCE, Retrier
from streaming.maintenance.compaction import compact
from streaming.maintenance.maintain import data_manifest_count, maintain, merge_manifests
from streaming.maintenance.plan import (
    LiveFile,
    MaintenancePolicy,
    TimeField,
    partition_time_range_us,
    plan_bins,
    plan_manifests,
    plan_retention,
)
from streaming.maintenance.retention import apply_retention
from streaming.table.catalog import create_table
from tests.partitioned_tables import DAY_US, HOUR_US, append, rows
from tests.streaming.maintenance.test_maintain import race_on_refresh

CONTRACT_PATH = Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json"
DAY0 = 20_000  # 2024-10-04
EAGER = MaintenancePolicy(min_file_age_s=0, keep_snapshots=1, max_snapshots=1)


# -- pure planning ----------------------------------------------------------------------------------
def test_time_partition_values_cover_their_whole_range():
    assert partition_time_range_us("day", DAY0) == (DAY0 * DAY_US, (DAY0 + 1) * DAY_US)
    assert partition_time_range_us("hour", 5) == (5 * HOUR_US, 6 * HOUR_US)
    # Months and years since 1970: 2024-12 and 2024.
    dec = calendar.timegm((2024, 12, 1, 0, 0, 0)) * 1_000_000
    assert partition_time_range_us("month", 54 * 12 + 11) == (dec, calendar.timegm((2025, 1, 1, 0, 0, 0)) * 1_000_000)
    assert partition_time_range_us("year", 54) == (
        calendar.timegm((2024, 1, 1, 0, 0, 0)) * 1_000_000,
        dec + 31 * DAY_US,
    )


def part(path: str, spec_id: int, partition: tuple, key: int = 0, size: int = 10, upper: int | None = None) -> LiveFile:
    return LiveFile(path, size, 5, key, 0, spec_id, partition, upper)


def test_retention_drops_partitions_wholly_past_the_horizon_and_keeps_the_one_it_cuts():
    day = {0: (TimeField(0, "day"),), 1: (TimeField(1, "hour"),), 2: ()}
    files = [
        part("d0-a", 0, (DAY0, "a")),
        part("d0-b", 0, (DAY0, "b")),
        part("d1-a", 0, (DAY0 + 1, "a")),  # the horizon cuts this day: kept whole
        part("d2-a", 0, (DAY0 + 2, "a")),
        part("null-day", 0, (None, "a")),  # no time: never dropped
        part("hour-old", 1, ("a", (DAY0 + 1) * 24)),  # spec 1 by hour: 00:00-01:00 of day 1 is past
        part("hour-new", 1, ("a", (DAY0 + 1) * 24 + 20)),
        part("unpartitioned-old", 2, (), upper=DAY0 * DAY_US + 5),
        part("unpartitioned-new", 2, (), upper=(DAY0 + 2) * DAY_US),
        part("unpartitioned-no-bounds", 2, ()),
    ]
    plan = plan_retention(files, day, horizon_us=(DAY0 + 1) * DAY_US + 12 * HOUR_US)
    assert [f.path for f in plan.drop] == ["d0-a", "d0-b", "hour-old", "unpartitioned-old"]
    assert plan.partitions == ((0, (DAY0, "a")), (0, (DAY0, "b")), (1, ("a", (DAY0 + 1) * 24)))
    assert plan.partly_past == ((0, (DAY0 + 1, "a")),)
    assert plan.undated == 2 and plan.rows == 20 and plan.bytes == 40


def test_bins_never_mix_partitions_or_specs():
    files = [
        part("a1", 1, (DAY0, "a"), key=1),
        part("b1", 1, (DAY0, "b"), key=2),
        part("a2", 1, (DAY0, "a"), key=3),
        part("b2", 1, (DAY0, "b"), key=4),
        part("c1", 1, (DAY0 + 1, "a"), key=0),
        part("old1", 0, (DAY0, "a"), key=5),  # same values, another spec
        part("old2", 0, (DAY0, "a"), key=6),
        part("alone", 1, (None, "a"), key=7),
    ]
    bins = plan_bins(files, max_bin_bytes=1000, min_files=2)
    assert [[f.path for f in b.files] for b in bins] == [["old1", "old2"], ["a1", "a2"], ["b1", "b2"]]
    assert [(b.spec_id, b.partition) for b in bins] == [(0, (DAY0, "a")), (1, (DAY0, "a")), (1, (DAY0, "b"))]
    # Within a partition, bins still follow the curve and keep to the size limit.
    many = [part(f"f{i}", 1, (DAY0, "a"), key=9 - i) for i in range(6)]
    assert [[f.path for f in b.files] for b in plan_bins(many, max_bin_bytes=30, min_files=1)] == [
        ["f5", "f4", "f3"],
        ["f2", "f1", "f0"],
    ]


def test_manifests_are_regrouped_by_spec_and_partition_and_cut_at_partition_boundaries():
    days = [(1, (DAY0 + d % 3, "a")) for d in range(9)] + [(0, ()), (0, ())]  # 3 days interleaved, 2 old
    groups = plan_manifests(days, bytes_per_entry=100, target_bytes=200)
    assert [[days[i] for i in g] for g in groups] == [
        [(0, ()), (0, ())],
        [(1, (DAY0, "a"))] * 3,
        [(1, (DAY0 + 1, "a"))] * 3,
        [(1, (DAY0 + 2, "a"))] * 3,
    ]
    # Small partitions share a manifest up to the target; a large one is cut within.
    small = [(1, (DAY0 + d, "a")) for d in range(4)] + [(1, (DAY0 + 9, "a"))] * 5
    assert [len(g) for g in plan_manifests(small, bytes_per_entry=100, target_bytes=200)] == [2, 2, 4, 1]


# -- real tables ------------------------------------------------------------------------------------
@pytest.fixture
def contract():
    """demo.events' contract without a partition spec of its own: each test gives its table the spec it needs."""
    return parse_contract({**json.loads(CONTRACT_PATH.read_text()), "partition": []})


@pytest.fixture
def table(catalog, contract):
    """demo.events partitioned by day(event_time) and identity(kind)."""
    table, _ = create_table(catalog, contract)
    with table.update_spec() as spec:
        spec.add_field("event_time", DayTransform(), "event_time_day")
        spec.add_field("kind", IdentityTransform(), "kind")
    return table


def write_days(table, contract, days: range, kinds=("a", "b"), batches: int = 2, n: int = 50) -> None:
    for batch in range(batches):
        append(
            table,
            contract,
            [
                ((day, kind), rows(contract, day, kind, n, seed=day * 100 + batch, first_id=batch * n))
                for day in days
                for kind in kinds
            ],
        )


def live_paths(table) -> set[str]:
    table.refresh()
    return {task.file.file_path for task in table.scan().plan_files()}


def day_counts(table) -> dict[int, int]:
    table.refresh()
    times = table.scan(selected_fields=("event_time",)).to_arrow().column("event_time")
    days = (times.cast(pa.int64()).to_numpy() // DAY_US).tolist()
    return {d: days.count(d) for d in sorted(set(days))}


def now_ms_at(day: int, hour: int) -> int:
    return (day * DAY_US + hour * HOUR_US) // 1000


def test_retention_drops_old_days_without_rewriting_a_file_and_expiry_frees_them(table, contract):
    write_days(table, contract, range(DAY0, DAY0 + 4))
    before = live_paths(table)
    assert len(before) == 16 and day_counts(table) == {DAY0 + d: 200 for d in range(4)}
    policy = MaintenancePolicy(min_file_age_s=0, retention_s=2 * 86400)
    now = now_ms_at(DAY0 + 3, 12)  # horizon: noon of day 1

    report = maintain(table, policy, steps=("retention",), now_ms=now)

    r = report.retention
    assert (r.partitions_dropped, r.files_dropped, r.rows_dropped, r.partitions_partly_past) == (2, 4, 200, 2)
    assert r.horizon == "2024-10-05T12:00:00+00:00" and r.column == "event_time"
    assert day_counts(table) == {DAY0 + 1: 200, DAY0 + 2: 200, DAY0 + 3: 200}, "day 0 gone, day 1 kept whole"
    after = live_paths(table)
    assert after < before, "no file added: nothing was rewritten"
    snapshot = table.current_snapshot()
    assert snapshot.summary.operation.value == "delete"
    assert (
        snapshot.summary["deleted-data-files"] == "4"
        and "added-data-files" not in snapshot.summary.additional_properties
    )
    assert snapshot.summary.additional_properties[MAINTENANCE] == "retention"
    assert json.loads(json.dumps(report.to_json()))["retention"]["rows_dropped"] == 200

    dropped = sorted(before - after)
    assert all(Path(p.removeprefix("file://")).exists() for p in dropped), "kept for time travel until expiry"
    registry = CollectorRegistry()
    metrics = MaintenanceMetrics(registry, "demo.events")
    metrics.observe(report, len(table.metadata.snapshots), 1)
    assert registry.get_sample_value("geoingest_retention_partitions_dropped_total", {"table": "demo.events"}) == 2
    assert registry.get_sample_value("geoingest_retention_rows_dropped_total", {"table": "demo.events"}) == 200

    # A day later day 1 is wholly past; then expiry deletes the dropped days' files.
    report = maintain(table, dataclasses.replace(EAGER, retention_s=2 * 86400), now_ms=now + 86400_000)
    assert report.retention.partitions_dropped == 2 and report.retention.rows_dropped == 200
    assert day_counts(table) == {DAY0 + 2: 200, DAY0 + 3: 200}
    assert not any(Path(p.removeprefix("file://")).exists() for p in dropped), "expiry freed them"
    assert report.expiry.files_deleted >= 8


def test_retention_from_the_contract_and_nothing_to_drop(catalog, contract, tmp_path):
    raw = json.loads(CONTRACT_PATH.read_text())
    raw.update(partition=["day(event_time)"], retention="3 days")
    path = tmp_path / "contract.json"
    path.write_text(json.dumps(raw))
    with_retention = load_contract(path)
    table, _ = create_table(catalog, with_retention)
    for day in range(DAY0, DAY0 + 2):
        append(table, with_retention, [((day,), rows(with_retention, day, "a", 20, seed=day))])
    policy = MaintenancePolicy()  # no retention setting: the contract's
    assert maintain(table, policy, steps=("retention",), now_ms=now_ms_at(DAY0 + 3, 0)).retention.files_dropped == 0
    report = maintain(table, policy, steps=("retention",), now_ms=now_ms_at(DAY0 + 4, 0))
    assert report.retention.retention_s == 3 * 86400 and report.retention.rows_dropped == 20
    assert (
        maintain(
            table,
            MaintenancePolicy(retention_s=3600),
            steps=("retention",),
            dry_run=True,
            now_ms=now_ms_at(DAY0 + 4, 0),
        ).retention.partitions_dropped
        == 1
    ), "the setting wins"


def test_retention_on_a_table_without_a_time_partition_names_it(catalog, contract):
    table, _ = create_table(catalog, contract)
    append(table, contract, [((), rows(contract, DAY0, "a", 10, seed=1))])
    with pytest.raises(ValueError, match="retention: table demo.events has no time partition"):
        maintain(table, MaintenancePolicy(retention_s=86400), steps=("retention",))


def file_day_span(path: str) -> tuple[int, int]:
    times = pq.read_table(path.removeprefix("file://"), columns=["event_time"]).column("event_time")
    values = times.cast(pa.int64()).to_numpy()
    return int(values.min() // DAY_US), int(values.max() // DAY_US)


def test_compaction_keeps_every_file_inside_one_partition_and_spec(table, contract):
    write_days(table, contract, range(DAY0, DAY0 + 2), batches=3, n=30)
    assert len(live_paths(table)) == 12
    merge_all = MaintenancePolicy(min_file_age_s=0, small_file_bytes=1 << 30)

    report = compact(table, merge_all)

    assert report.files_rewritten == 12 and report.files_written == 4, "one file per day and kind"
    table.refresh()
    for task in table.scan().plan_files():
        day, kind = task.file.partition[0], task.file.partition[1]
        assert task.file.spec_id == 1
        assert file_day_span(task.file.file_path) == (day, day), "a compacted file spans its day only"
        kinds = pq.read_table(task.file.file_path.removeprefix("file://"), columns=["kind"]).column("kind")
        assert set(kinds.to_pylist()) == {kind}
    day_files = live_paths(table)

    # The partition evolves to hours: the old files keep their spec, new ones take the new one.
    with table.update_spec() as spec:
        spec.remove_field("event_time_day")
        spec.add_field("event_time", HourTransform(), "event_time_hour")
    hour = (DAY0 + 2) * 24 + 3
    for batch in range(3):
        data = rows(contract, DAY0 + 2, "a", 30, seed=900 + batch, first_id=batch * 30, hour_of_day=3)
        append(table, contract, [(("a", hour), data)])
        append(
            table,
            contract,
            [
                (
                    ("a", DAY0 * 24),
                    rows(contract, DAY0, "a", 5, seed=950 + batch, first_id=900 + batch * 5, hour_of_day=0),
                )
            ],
        )
    table.refresh()
    assert table.metadata.default_spec_id == 2

    report = compact(table, merge_all)

    assert report.files_rewritten == 6 and report.files_written == 2, "per hour, never with the day files"
    table.refresh()
    tasks = list(table.scan().plan_files())
    assert {t.file.file_path for t in tasks if t.file.spec_id == 1} == day_files, "the older spec's files untouched"
    hours = sorted(tuple(t.file.partition[i] for i in range(2)) for t in tasks if t.file.spec_id == 2)
    assert hours == [("a", DAY0 * 24), ("a", hour)]
    assert sum(t.file.record_count for t in tasks) == 12 * 30 + 90 + 15


def test_cli_maintain_retention_and_a_contract_without_time_partition(catalog, contract, tmp_path, monkeypatch, capsys):
    table, _ = create_table(catalog, contract)
    with table.update_spec() as spec:
        spec.add_field("event_time", DayTransform(), "event_time_day")
    append(table, contract, [((DAY0,), rows(contract, DAY0, "a", 20, seed=1))])
    for key, value in {
        "GEOINGEST_CATALOG__URI": catalog.properties["uri"],
        "GEOINGEST_CATALOG__WAREHOUSE": catalog.properties["warehouse"],
        "GEOINGEST_CATALOG_NAME": catalog.name,
        "GEOINGEST_METRICS_PORT": "0",
        "GEOINGEST_RETENTION": "30 days",
    }.items():
        monkeypatch.setenv(key, value)

    assert main(["table", "maintain", "--table", "demo.events", "--retention"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["retention"]["partitions_dropped"] == 1 and report["retention"]["rows_dropped"] == 20
    assert report["compaction"] is None
    monkeypatch.setenv("GEOINGEST_RETENTION", "a month")
    assert main(["table", "maintain", "--table", "demo.events", "--retention"]) != 0
    assert "retention (setting): 'a month' is not a retention" in capsys.readouterr().err

    raw = json.loads(CONTRACT_PATH.read_text())
    raw.update(table="other.events", partition=["kind"], retention="30 days")
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    assert main(["table", "create", "--contract", str(path)]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "retention: '30 days' needs a time partition" in err
    assert "other" not in [ns[0] for ns in catalog.list_namespaces()], "nothing created"


def manifest_days(table) -> list[tuple[int, int, int]]:
    """(spec id, first day, last day) of each data manifest of the current snapshot, from its
    partition summary."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import IntegerType

    table.refresh()
    out = []
    for manifest in table.current_snapshot().manifests(table.io):
        summary = manifest.partitions[0]
        out.append(
            (
                manifest.partition_spec_id,
                from_bytes(IntegerType(), summary.lower_bound),
                from_bytes(IntegerType(), summary.upper_bound),
            )
        )
    return sorted(out)


def test_merged_manifests_each_cover_a_run_of_days_of_one_spec(table, contract):
    write_days(table, contract, range(DAY0, DAY0 + 4), batches=3, n=10)
    assert data_manifest_count(table) == 3 and all(lo == DAY0 and hi == DAY0 + 3 for _, lo, hi in manifest_days(table))
    with table.update_spec() as spec:
        spec.remove_field("kind")
    append(table, contract, [((DAY0 + 4,), rows(contract, DAY0 + 4, "a", 10, seed=7))])
    entry_bytes = table.current_snapshot().manifests(table.io)[0].manifest_length / 8

    report = merge_manifests(table, MaintenancePolicy(max_manifests=1, manifest_target_bytes=int(entry_bytes * 6)))

    assert report.manifests_before == 4
    days = manifest_days(table)
    assert days[-1] == (2, DAY0 + 4, DAY0 + 4), "the new spec's file in a manifest of its own spec"
    assert all(hi - lo <= 1 for spec_id, lo, hi in days), f"each manifest a run of at most 2 days: {days}"
    assert sum(t.file.record_count for t in table.scan().plan_files()) == 4 * 2 * 3 * 10 + 10
    assert table.scan(row_filter="event_time >= '2024-10-07T00:00:00+00:00'").to_arrow().num_rows == 2 * 3 * 10 + 10


def test_retention_racing_an_ingest_commit_plans_again_and_drops_the_late_file_too(
    monkeypatch, catalog, table, contract
):
    write_days(table, contract, range(DAY0, DAY0 + 3), batches=1)
    mine = catalog.load_table(table.name())

    def late_event():  # another writer commits a late file of day 0 right after retention looked
        append(table, contract, [((DAY0, "a"), rows(contract, DAY0, "a", 7, seed=5, first_id=500))])

    race_on_refresh(monkeypatch, mine, late_event, on_calls={1})
    sleeps: list[float] = []
    report = apply_retention(
        mine, MaintenancePolicy(retention_s=86400), now_ms=now_ms_at(DAY0 + 2, 0), retrier=Retrier(mine, sleeps.append)
    )

    assert report.conflicts == 1 and len(sleeps) == 1
    assert (report.partitions_dropped, report.files_dropped, report.rows_dropped) == (2, 3, 107)
    assert day_counts(table) == {DAY0 + 1: 100, DAY0 + 2: 100}


def test_retention_reads_only_the_manifests_that_hold_partitions_older_than_the_horizon(table, contract):
    from streaming.maintenance.retention import _may_hold_past_rows, time_column, time_fields

    for day in range(DAY0, DAY0 + 6):  # one commit, so one manifest, per day
        append(table, contract, [((day, "a"), rows(contract, day, "a", 5, seed=day))])
    table.refresh()
    horizon = (DAY0 + 1) * DAY_US + 12 * HOUR_US
    read = _may_hold_past_rows(table, time_fields(table, time_column(table)), horizon)
    manifests = table.current_snapshot().manifests(table.io)
    assert sum(read(m) for m in manifests) == 2, "day 0 (past) and day 1 (partly past); days 2-5 skipped"

    report = apply_retention(table, MaintenancePolicy(retention_s=86400), now_ms=now_ms_at(DAY0 + 2, 12))
    assert (report.partitions_dropped, report.partitions_partly_past, report.rows_dropped) == (1, 1, 5)
    assert day_counts(table) == {DAY0 + d: 5 for d in range(1, 6)}

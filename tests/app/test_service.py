"""The service's own maintenance (app/service.py MaintenanceRunner) on its default settings, against a
real table on the embedded SQLite catalog: when it runs, what it runs, and what a held lease does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from app.metrics import MaintenanceMetrics
from app.service import MaintenanceRunner
from app.settings import load_settings
from streaming.contract import load_contract
from streaming.job.processor import BatchReport
from streaming.maintenance.lease import MaintenanceLease
from streaming.table.catalog import create_table, open_catalog
from streaming.table.commit import CommitOutcome
from tests.streaming.maintenance.test_maintain import CONTRACT_PATH, write_batches


def committed(batch_id: int) -> BatchReport:
    return BatchReport(batch_id, 100, 100, {}, (), {}, CommitOutcome("committed", 1, 1, 0, 0.01), {})


@pytest.fixture
def settings(tmp_path: Path):
    return load_settings(
        env={},
        catalog={
            "type": "sql",
            "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
            "warehouse": f"file://{tmp_path / 'warehouse'}",
        },
        # Ages 0: the runner's schedule is what is tested, not the policy's ages.
        maintenance_min_file_age_s=0,
        maintenance_snapshot_max_age_s=0,
        maintenance_orphan_min_age_s=0,
        maintenance_keep_snapshots=5,
        maintenance_max_snapshots=5,
    )


@pytest.fixture
def table(settings):
    table, _ = create_table(open_catalog(settings.catalog_name, settings.catalog), load_contract(CONTRACT_PATH))
    return table


def test_between_batches_maintains_every_10_commits_a_minute_apart_without_orphans(settings, table):
    settings = dataclasses.replace(settings, maintenance_mode="between-batches")
    assert (
        settings.maintenance_interval_commits,
        settings.maintenance_interval_s,
        settings.maintenance_min_gap_s,
    ) == (10, 3600, 60)
    registry = CollectorRegistry()
    runner = MaintenanceRunner(settings, "demo.events", MaintenanceMetrics(registry, "demo.events"))
    runs = []
    run_once = runner.run_once
    runner.run_once = lambda steps=None, **kw: runs.append(steps) or run_once(steps, **kw)  # type: ignore[method-assign]

    write_batches(table, load_contract(CONTRACT_PATH), 30)
    runner._last_run -= 60  # the service started a minute ago
    for batch_id in range(9):
        runner.after_batch(committed(batch_id))
    assert runs == [], "not before the 10th commit"
    runner.after_batch(committed(9))
    assert runs == [("retention", "compact", "expire")], "the count's run leaves orphans to the hourly one"
    for batch_id in range(10, 30):
        runner.after_batch(committed(batch_id))
    assert len(runs) == 1, "20 more commits, but within a minute of the last run"
    runner._last_run -= 60
    runner.after_batch(committed(30))
    assert len(runs) == 2, "a minute later, at the next commit"

    table.refresh()
    assert len(table.metadata.snapshots) <= 6, "expired down to maintenance_max_snapshots (and a carrier)"
    completed = registry.get_sample_value(
        "geoingest_maintenance_runs_total", {"table": "demo.events", "outcome": "completed"}
    )
    assert completed == 2


def test_a_run_meeting_another_maintainers_lease_is_skipped_and_counted(settings, table):
    write_batches(table, load_contract(CONTRACT_PATH), 3)
    other = MaintenanceLease(open_catalog(settings.catalog_name, settings.catalog).load_table("demo.events"), 600)
    assert other.acquire()
    registry = CollectorRegistry()
    runner = MaintenanceRunner(settings, "demo.events", MaintenanceMetrics(registry, "demo.events"))
    report = runner.run_once(("compact", "expire"))

    assert report is not None and report.skipped and other.holder in report.skipped
    assert report.compaction is None and report.expiry is None
    skipped = registry.get_sample_value(
        "geoingest_maintenance_runs_total", {"table": "demo.events", "outcome": "skipped"}
    )
    assert skipped == 1
    table.refresh()
    assert len(table.metadata.snapshots) == 3, "nothing committed by the skipped run"
    other.release()

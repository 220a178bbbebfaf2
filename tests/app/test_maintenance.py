"""Maintenance beside the stream (app/maintenance.py): the child process on a real table on the
embedded SQLite catalog, its priority and CPU share, and its stop on SIGTERM with the lease released."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from app.maintenance import CpuBudget, MaintenanceRunner
from app.metrics import MaintenanceMetrics
from app.settings import load_settings
from streaming.contract import load_contract
from streaming.maintenance.lease import lease_state
from streaming.table.catalog import open_catalog
from tests.app.test_service import committed, settings, table  # noqa: F401 (fixtures)
from tests.streaming.maintenance.test_maintain import CONTRACT_PATH, data_paths, expected_ids, table_ids, write_batches


def runs(registry: CollectorRegistry, outcome: str) -> float:
    return registry.get_sample_value("geoingest_maintenance_runs_total", {"table": "demo.events", "outcome": outcome})


def runner_of(settings, registry: CollectorRegistry) -> MaintenanceRunner:
    """The service's maintenance runner of demo.events, its metrics in `registry`."""
    return MaintenanceRunner(settings, "demo.events", MaintenanceMetrics(registry, "demo.events"))


def tell_of_commits(runner: MaintenanceRunner, batches: int = 10) -> None:
    """What the service tells the runner after each committed batch: enough commits for a run."""
    for batch_id in range(batches):
        runner.after_batch(committed(batch_id))


def wait_until(condition, timeout_s: float = 90.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_the_cpu_budget_sleeps_until_the_run_is_within_its_share():
    cpu, wall, slept = [0.0], [0.0], []

    def sleep(s: float) -> None:
        slept.append(s)
        wall[0] += s

    budget = CpuBudget(0.25, cpu=lambda: cpu[0], clock=lambda: wall[0], sleep=sleep)
    cpu[0], wall[0] = 1.0, 1.0  # a second of CPU in a second: 3 s owed at a quarter of a core
    budget.pace()
    assert slept == [pytest.approx(3.0)] and budget.owed() == pytest.approx(0.0)
    wall[0] += 2.0  # idle: nothing owed
    budget.pace()
    assert len(slept) == 1
    with pytest.raises(ValueError, match="CPU share of 0"):
        CpuBudget(0)


def test_beside_is_the_default_and_runs_in_a_niced_child_process_on_the_commit_count(settings, table):
    assert load_settings(env={}).maintenance_mode == "beside"
    settings = dataclasses.replace(settings, maintenance_min_gap_s=0)
    registry = CollectorRegistry()
    runner = runner_of(settings, registry)
    write_batches(table, load_contract(CONTRACT_PATH), 30)
    runner.start()
    try:
        child = runner._child
        assert child is not None and child.process.pid != os.getpid()
        assert wait_until(lambda: os.getpriority(os.PRIO_PROCESS, child.process.pid) >= settings.maintenance_nice)
        started = time.monotonic()
        tell_of_commits(runner)
        assert time.monotonic() - started < 0.5, "the batches never wait for maintenance"
        assert wait_until(lambda: runs(registry, "completed") == 1), "the child's run, counted by the service"
        elapsed = time.monotonic() - started
    finally:
        runner.stop()
    assert not runner._child.process.is_alive()
    table.refresh()
    assert len(table.metadata.snapshots) <= 6 and len(data_paths(table)) < 60, "compacted and expired"
    assert table_ids(table) == expected_ids(range(30))
    rewritten = registry.get_sample_value("geoingest_maintenance_files_rewritten_total", {"table": "demo.events"})
    assert rewritten == 60
    assert lease_state(table).holder is None, "the lease released"
    # The run's CPU is the child's, and it stayed within its share of a core over the time the service
    # waited for it (the steps' own total leaves out loading the table in the child). Whether it had to
    # sleep for that depends on the machine: on a busy one its low priority alone holds it back, so
    # the sleeping is counted (at least 0) and checked on its own clock in the test above.
    sample = lambda name, **labels: registry.get_sample_value(name, {"table": "demo.events", **labels})  # noqa: E731
    cpu = sample("geoingest_maintenance_cpu_seconds_total")
    paced = sample("geoingest_maintenance_paced_seconds_total")
    assert cpu > 0.05 and paced is not None and paced >= 0
    assert cpu <= settings.maintenance_cpu_percent / 100 * elapsed + 0.05


def test_the_child_maintains_a_native_table_through_its_own_iceberg_java(settings):
    """A native-geometry (v3) table: the child starts Iceberg Java in its own JVM, compacts and
    expires through it, and releases the lease."""
    import json

    from app.maven import configure_iceberg_java
    from streaming.contract import parse_contract
    from streaming.table.catalog import create_table
    from tests.conftest import CACHE_DIR

    configure_iceberg_java(CACHE_DIR)  # this process makes and writes the table; the child starts its own

    raw = json.loads(CONTRACT_PATH.read_text())
    raw["geometry"]["native"] = True
    contract = parse_contract(raw)
    settings = dataclasses.replace(settings, maintenance_min_gap_s=0, cache_dir=str(CACHE_DIR))
    table, _ = create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    write_batches(table, contract, 12)
    registry = CollectorRegistry()
    runner = runner_of(settings, registry)
    runner.start()
    try:
        tell_of_commits(runner)
        assert wait_until(lambda: (runs(registry, "completed") or 0) >= 1, 180), "the child's run on the v3 table"
        assert not runs(registry, "failed")
    finally:
        runner.stop()
    table.refresh()
    assert table.metadata.format_version == 3
    assert len(table.metadata.snapshots) <= 6 and len(data_paths(table)) < 24, "compacted and expired"
    assert table_ids(table) == expected_ids(range(12))
    assert lease_state(table).holder is None, "the lease released"


def test_sigterm_abandons_a_long_compaction_releases_the_lease_and_loses_nothing(settings, table):
    # Many tiny bins at a twentieth of a core: a compaction that lasts long enough to be stopped.
    slow = dataclasses.replace(
        settings, maintenance_max_bin_bytes=48 * 1024, maintenance_cpu_percent=5.0, maintenance_min_gap_s=0
    )
    write_batches(table, load_contract(CONTRACT_PATH), 60, rows=150)
    before = table.current_snapshot().snapshot_id
    registry = CollectorRegistry()
    runner = runner_of(slow, registry)
    runner.start()
    try:
        tell_of_commits(runner)
        reader = open_catalog(settings.catalog_name, settings.catalog).load_table("demo.events")

        def leased() -> bool:
            reader.refresh()
            return lease_state(reader).holder is not None

        assert wait_until(leased), "the run took the lease"
        time.sleep(1.0)
    finally:
        stopping = time.monotonic()
        runner.stop(timeout_s=30)
        stopped_in = time.monotonic() - stopping
    assert runner._child.process.exitcode == 0, "it stopped by itself, not killed"
    assert stopped_in < 15, f"stopped in {stopped_in:.1f} s"
    table.refresh()
    assert lease_state(table).holder is None, "the lease released"
    snapshots = [s for s in table.metadata.snapshots if s.snapshot_id != before]
    assert all("geoingest.maintenance" not in (s.summary or {}).additional_properties for s in snapshots), (
        "no compaction committed"
    )
    assert table_ids(table) == expected_ids(range(60), rows=150)
    data = Path(table.location().removeprefix("file://")) / "data"
    assert {str(p) for p in data.rglob("*.parquet")} == {p.removeprefix("file://") for p in data_paths(table)}, (
        "the abandoned run's new files deleted"
    )
    assert runs(registry, "completed") == 0 and runs(registry, "failed") == 0

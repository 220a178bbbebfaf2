"""Orphan deletion against commits in flight: nothing a pending compaction or ingest commit may
still reference is deleted. A compaction keeps its maintenance lease alive however long it runs,
commits only while it holds it, and never commits a file that is gone; `geoingest table orphans
--delete` and the orphans step take the lease; an orphan age below the table's commit window is
refused. Real tables on the SQLite catalog, the real `geoingest` command; the compactions are slowed
down by a hook in the test or stopped with SIGSTOP, and their files dated back (os.utime) as an hour
long rewrite would have left them."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from streaming.contract import load_contract
from streaming.maintenance import compaction as compaction_module
from streaming.maintenance.compaction import COMPACTION_FILE_PREFIX
from streaming.maintenance.lease import lease_state
from streaming.maintenance.maintain import maintain
from streaming.maintenance.orphans import ORPHAN_AGE_MARGIN_S, orphan_age_floor_s
from streaming.maintenance.plan import MaintenancePolicy
from streaming.table.catalog import create_table, open_catalog
from tests.streaming.maintenance.test_maintain import (
    CONTRACT_PATH,
    data_paths,
    expected_ids,
    table_ids,
    world_points,
    write_batches,
)
from tests.streaming.maintenance.test_maintenance_integration import GEOINGEST, cli_env, compacted_files

TWO_HOURS_S = 2 * 3600


def local(path: str) -> str:
    return path.removeprefix("file://")


def date_back(paths, seconds: float = TWO_HOURS_S) -> None:
    then = time.time() - seconds
    for path in paths:
        os.utime(local(str(path)), (then, then))


def readable_with_every_row_once(table, expected: list[str]) -> None:
    assert all(Path(local(p)).exists() for p in data_paths(table)), "every file the table references is there"
    assert table_ids(table) == expected, "every row once"


def pause_compactions_after_writing(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """(written, go): each compaction bin, once it has written its files (dated back as a rewrite at a
    quarter of a core an hour long leaves them), sets `written` and waits until `go` is set."""
    rewrite_bin, written, go = compaction_module.rewrite_bin, threading.Event(), threading.Event()

    def slow_rewrite(*args, **kwargs):
        outputs = rewrite_bin(*args, **kwargs)
        date_back(r.path for r in outputs)
        written.set()
        go.wait(60)
        return outputs

    monkeypatch.setattr(compaction_module, "rewrite_bin", slow_rewrite)
    return written, go


@pytest.fixture
def contract():
    return load_contract(CONTRACT_PATH)


@pytest.fixture
def table(catalog, contract):
    table, _ = create_table(catalog, contract)
    return table


@pytest.fixture
def cli_table(tmp_path):
    """An empty demo.events on the SQLite catalog that the `geoingest` command run with `cli_env` opens."""
    env = cli_env(tmp_path)
    catalog = open_catalog(
        "geoingest",
        {"type": "sql", "uri": env["GEOINGEST_CATALOG__URI"], "warehouse": env["GEOINGEST_CATALOG__WAREHOUSE"]},
    )
    contract = load_contract(CONTRACT_PATH)
    table, _ = create_table(catalog, contract)
    return env, catalog, contract, table


def test_an_orphan_age_below_the_tables_commit_window_is_refused(table, contract):
    writer = write_batches(table, contract, 3)
    dead, _, _ = writer.files(3, *world_points(np.random.default_rng(8), 50))  # never committed
    with pytest.raises(
        ValueError,
        match=r"maintenance_orphan_min_age_s: 0 s is below 2466 s, .*table demo.events.*"
        r"commit.retry.total-timeout-ms 1800000 and commit.retry.max-wait-ms 60000",
    ):
        maintain(table, MaintenancePolicy(orphan_min_age_s=0), steps=("orphans",))
    assert all(Path(local(f.path)).exists() for f in dead)
    table.refresh()
    assert lease_state(table).generation == 0, "refused before anything was done: no lease taken"

    # A table whose commits give up after a second: the margin is what is left of the floor.
    with table.transaction() as tx:
        tx.set_properties({"commit.retry.total-timeout-ms": "1000", "commit.retry.max-wait-ms": "100"})
    floor = orphan_age_floor_s(table)
    assert floor == pytest.approx(1.11 + ORPHAN_AGE_MARGIN_S)
    date_back([f.path for f in dead[:1]], floor + 60)
    report = maintain(table, MaintenancePolicy(orphan_min_age_s=floor), steps=("orphans",)).orphans
    assert not Path(local(dead[0].path)).exists(), "older than the floor: deleted"
    assert all(Path(local(f.path)).exists() for f in dead[1:]), "younger: kept, its commit may be in flight"
    assert report.deleted >= 1
    readable_with_every_row_once(table, expected_ids(range(3)))


def test_a_compacted_file_gone_before_the_commit_gives_its_bin_up(monkeypatch, table, contract):
    write_batches(table, contract, 6)
    rewrite_bin, gone = compaction_module.rewrite_bin, []

    def rewrite_then_lose_a_file(*args, **kwargs):
        outputs = rewrite_bin(*args, **kwargs)
        if not gone:  # deleted for real, as by hand or by a remover that takes no lease
            os.remove(local(outputs[0].path))
            gone.append(outputs[0].path)
        return outputs

    monkeypatch.setattr(compaction_module, "rewrite_bin", rewrite_then_lose_a_file)
    policy = MaintenancePolicy(min_file_age_s=0, max_bin_bytes=24 * 1024)
    report = maintain(table, policy, steps=("compact",)).compaction

    assert report.bins >= 2 and report.bins_abandoned == 1 and report.files_rewritten > 0
    assert gone[0] not in data_paths(table)
    readable_with_every_row_once(table, expected_ids(range(6)))


def test_a_slow_compaction_keeps_its_lease_and_orphan_deletion_waits_for_it(monkeypatch, cli_table):
    """The compaction pauses after writing its files, for longer than two of its leases: the lease
    stays its own, so `geoingest table orphans --delete` is refused with one line and the
    compaction lands. (Before, the lease ran out and the command deleted the compaction's files,
    which the compaction then committed.)"""
    env, catalog, contract, table = cli_table
    write_batches(table, contract, 6)
    written, go = pause_compactions_after_writing(monkeypatch)
    mine = open_catalog(catalog.name, dict(catalog.properties)).load_table(contract.table)
    reports = []
    compaction = threading.Thread(
        target=lambda: reports.append(
            maintain(mine, MaintenancePolicy(min_file_age_s=0, lease_s=4), steps=("compact",))
        )
    )
    compaction.start()
    try:
        assert written.wait(60)
        time.sleep(8)  # two leases
        orphans = subprocess.run(
            [str(GEOINGEST), "table", "orphans", "--table", contract.table, "--delete"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        go.set()
        compaction.join(60)

    assert orphans.returncode == 2, orphans.stdout
    last = orphans.stderr.strip().splitlines()[-1]
    assert last.startswith("geoingest: table demo.events: maintenance lease held by"), orphans.stderr[-2000:]
    assert reports[0].skipped is None and reports[0].compaction.files_rewritten == 12
    readable_with_every_row_once(table, expected_ids(range(6)))
    assert all(Path(local(p)).name.startswith(COMPACTION_FILE_PREFIX) for p in data_paths(table))


def stop_outside_a_catalog_commit(pid: int, catalog_db: Path) -> None:
    """SIGSTOP the process group, at a moment it holds no write lock on the SQLite catalog (else
    every other maintainer would wait on it)."""
    for _ in range(100):
        os.killpg(pid, signal.SIGSTOP)
        try:
            with sqlite3.connect(catalog_db, timeout=0.2) as probe:
                probe.execute("BEGIN IMMEDIATE")
                probe.rollback()
            return
        except sqlite3.OperationalError:
            os.killpg(pid, signal.SIGCONT)
            time.sleep(0.02)
    raise AssertionError("the compaction held the catalog's lock at every try")


def test_a_compaction_stopped_past_its_lease_commits_nothing_after_its_files_were_deleted(cli_table, tmp_path):
    """`geoingest table maintain --compact` (lease 2 s) is stopped with SIGSTOP once it has written
    files; the lease runs out, `geoingest table orphans --delete` takes it and deletes those files
    (dated back as an hour long rewrite leaves them). Continued, the compaction finds its lease taken
    over and commits nothing: the table keeps every row once and references no deleted file."""
    env, catalog, contract, table = cli_table
    env = {**env, "GEOINGEST_MAINTENANCE_LEASE_S": "2"}
    write_batches(table, contract, 60, rows=150)  # many small bins: a rewrite of some seconds
    expected = expected_ids(range(60), rows=150)
    data_dir = Path(local(table.location())) / "data"
    compaction = subprocess.Popen(
        [str(GEOINGEST), "table", "maintain", "--table", contract.table, "--compact"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        started = time.monotonic()
        while not compacted_files(data_dir) and compaction.poll() is None and time.monotonic() - started < 120:
            time.sleep(0.01)
        assert compaction.poll() is None, "the compaction finished before it could be stopped"
        stop_outside_a_catalog_commit(compaction.pid, tmp_path / "catalog.db")
        written = compacted_files(data_dir)
        date_back(written)
        time.sleep(3)  # past its lease
        deleted = subprocess.run(
            [str(GEOINGEST), "table", "orphans", "--table", contract.table, "--delete"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert deleted.returncode == 0, deleted.stderr[-2000:]
        assert {json.loads(line)["path"] for line in deleted.stdout.splitlines()} >= {str(p) for p in written}
    finally:
        os.killpg(compaction.pid, signal.SIGCONT)
    out, err = compaction.communicate(timeout=300)

    assert compaction.returncode == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert "maintenance lease taken over by" in (report["skipped"] or ""), report
    readable_with_every_row_once(table, expected)
    assert not compacted_files(data_dir), "the compaction deleted what it had written"
    table.refresh()
    assert not any(
        (s.summary or {}).additional_properties.get("geoingest.maintenance") for s in table.metadata.snapshots
    ), "no maintenance commit landed"

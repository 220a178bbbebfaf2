"""Maintenance against real components: the PostgreSQL catalog, `kill -9` of the real
`geoingest table maintain` command in the middle of a compaction, and the real service (Spark,
Kafka broker) ingesting while maintenance compacts and expires beside it."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from app.service import run
from app.settings import load_settings
from streaming.contract import load_contract, parse_contract
from streaming.job.checkpoint import writer_id_for_checkpoint
from streaming.maintenance.compaction import COMPACTION_FILE_PREFIX
from streaming.maintenance.maintain import maintain
from streaming.maintenance.orphans import referenced_files, referenced_metadata_files
from streaming.table.catalog import create_table, open_catalog
from streaming.table.commit import committed_snapshot, recorded_offsets
from tests.conftest import CACHE_DIR, produce_records
from tests.postgres import postgres_server_info, postgres_uri  # noqa: F401  (fixtures)
from tests.streaming.maintenance.test_maintain import (
    EAGER,
    BatchWriter,
    data_paths,
    expected_ids,
    table_ids,
    world_points,
    write_batches,
)
from tests.streaming.write.test_upsert import (
    DEMO,
    every_snapshot_matches,
    make_stream,
    record_positions,
    reference_state,
    table_state,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
CONTRACT_FILE = ROOT / "schemas" / "demo_events.json"
GEOINGEST = Path(sys.executable).parent / "geoingest"


def test_maintenance_on_the_postgresql_catalog_keeps_every_row_and_every_batch(postgres_uri, tmp_path):
    catalog = open_catalog("pg", {"type": "sql", "uri": postgres_uri, "warehouse": f"file://{tmp_path / 'wh'}"})
    contract = load_contract(CONTRACT_FILE)
    table, _ = create_table(catalog, contract)
    writer = BatchWriter(table, contract)
    rng = np.random.default_rng(2)
    for batch_id in range(60):
        writer.commit(batch_id, *world_points(rng, 50))
        if (batch_id + 1) % 20 == 0:
            report = maintain(table, EAGER)
            assert report.compaction.files_rewritten > 0 and report.expiry.snapshots_expired > 0
    table.refresh()
    assert len(table.metadata.snapshots) <= EAGER.keep_snapshots + 1
    assert table_ids(table) == sorted(f"writer-a-b{b:05d}-r{r:06d}" for b in range(60) for r in range(50))
    assert all(committed_snapshot(table, "writer-a", b) is not None for b in range(60))
    assert recorded_offsets(table) == {"geo-events": {0: (0, 59 * 50 + 24), 1: (25, 59 * 50 + 49)}}
    # Batch 59 read again over the offsets it read the first time (50 a batch).
    replay = BatchWriter(
        open_catalog("pg", dict(catalog.properties)).load_table(contract.table), contract, next_offset=59 * 50
    )
    assert replay.commit(59, *world_points(rng, 50)).status == "skipped_replay"


# -- kill -9 --------------------------------------------------------------------------------------
def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEOINGEST_")}
    env.update(
        {
            "GEOINGEST_CATALOG__URI": f"sqlite:///{tmp_path / 'catalog.db'}",
            "GEOINGEST_CATALOG__WAREHOUSE": f"file://{tmp_path / 'warehouse'}",
            "GEOINGEST_CACHE_DIR": str(CACHE_DIR),
            "GEOINGEST_MAINTENANCE_MIN_FILE_AGE_S": "0",
            "GEOINGEST_MAINTENANCE_SNAPSHOT_MAX_AGE_S": "0",
            "GEOINGEST_MAINTENANCE_KEEP_SNAPSHOTS": "3",
            # Many small bins: a long rewrite with many moments to die in.
            "GEOINGEST_MAINTENANCE_MAX_BIN_BYTES": str(48 * 1024),
            **extra,
        }
    )
    return env


def compacted_files(data_dir: Path) -> list[Path]:
    # rglob: a partitioned table's files are in its partitions' folders
    return list(data_dir.rglob(f"{COMPACTION_FILE_PREFIX}*"))


def test_kill_9_during_compaction_leaves_the_table_readable_with_nothing_lost(tmp_path):
    env = cli_env(tmp_path)
    catalog = open_catalog(
        "geoingest",
        {"type": "sql", "uri": env["GEOINGEST_CATALOG__URI"], "warehouse": env["GEOINGEST_CATALOG__WAREHOUSE"]},
    )
    contract = load_contract(CONTRACT_FILE)
    table, _ = create_table(catalog, contract)
    write_batches(table, contract, 60, rows=150)
    expected = expected_ids(range(60), rows=150)
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    rng = random.Random(17)
    kills = []
    # The first kill as soon as the rewrite has written a file; then at random moments of a run.
    for moment in ("first file written", *(rng.uniform(0.5, 4.0) for _ in range(3))):
        before = set(compacted_files(data_dir))
        process = subprocess.Popen(
            [str(GEOINGEST), "table", "maintain", "--table", contract.table, "--compact"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        started = time.monotonic()
        while process.poll() is None and time.monotonic() - started < 120:
            new_files = set(compacted_files(data_dir)) - before
            if (moment == "first file written" and new_files) or (
                isinstance(moment, float) and time.monotonic() - started >= moment
            ):
                break
            time.sleep(0.01)
        finished = process.poll() is not None
        if not finished:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        kills.append({"moment": moment, "killed": not finished, "returncode": process.returncode})

        # After each kill: the table reads, every row once, every referenced file there.
        assert table_ids(table) == expected, f"after kill at {moment}"
        assert all(Path(p.removeprefix("file://")).exists() for p in data_paths(table))
        assert all(Path(p).exists() for p in referenced_metadata_files(table))
    assert kills[0]["killed"], f"the first kill came too late: {kills}"

    # A complete run two hours later compacts what is left and deletes what the killed runs left
    # behind (at the default orphan age: a younger one is refused).
    two_hours_ago = time.time() - 2 * 3600
    for path in Path(table.location().removeprefix("file://")).rglob("*"):
        os.utime(path, (two_hours_ago, two_hours_ago))
    done = subprocess.run(
        [str(GEOINGEST), "table", "maintain", "--table", contract.table],
        env={**env, "GEOINGEST_MAINTENANCE_MAX_BIN_BYTES": str(64 * 1024 * 1024)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["compaction"]["files_rewritten"] > 0
    assert table_ids(table) == expected
    table.refresh()
    on_disk = {str(p) for p in data_dir.rglob("*") if p.is_file()}
    assert on_disk <= referenced_files(table), "no orphan left on disk"
    for snapshot in table.metadata.snapshots:  # every kept snapshot still reads
        assert {
            t.file.file_path.removeprefix("file://") for t in table.scan(snapshot_id=snapshot.snapshot_id).plan_files()
        } <= on_disk
    print(f"\nkills: {kills}; final run: {report['compaction']}, orphans {report['orphans']}")


# -- concurrent ingest ----------------------------------------------------------------------------
def city_records(n: int, seed: int, prefix: str) -> list[tuple]:
    rng = np.random.default_rng(seed)
    lon, lat = world_points(rng, n)
    return [
        (
            f"{prefix}{i}".encode(),
            json.dumps(
                {
                    "type": "Feature",
                    "id": f"{prefix}{i}",
                    "properties": {"kind": "probe"},
                    "geometry": {"type": "Point", "coordinates": [round(float(lon[i]), 5), round(float(lat[i]), 5)]},
                }
            ).encode(),
            [],
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("mode", ["beside", "background"])
def test_ingest_with_concurrent_maintenance_keeps_every_row_exactly_once(kafka, spark, topic, tmp_path, mode):
    """The real service with Spark and the broker, maintenance back to back in a child process
    ("beside") or on a thread of the driver ("background"): compactions and expiries race the batch
    commits; no batch fails, every row lands once."""
    n = 24_000
    assert produce_records(kafka.bootstrap, topic, city_records(n, 1, "a")) == n
    catalog_props = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path / 'wh'}"}
    settings = load_settings(
        env={},
        bootstrap_servers=kafka.bootstrap,
        topic=topic,
        catalog=catalog_props,
        checkpoint_location=str(tmp_path / "ck"),
        metrics_port=0,
        cache_dir=str(CACHE_DIR),
        max_offsets_per_trigger=1_000,
        maintenance_mode=mode,
        # The race is the point: the child at the service's priority, not below it (at the default
        # nice 10 a machine as busy as a CI run's leaves it too little CPU to race at all).
        maintenance_nice=0,
        maintenance_cpu_percent=100.0,
        maintenance_interval_s=0,
        maintenance_min_file_age_s=0,
        maintenance_snapshot_max_age_s=0,
        maintenance_keep_snapshots=3,
        maintenance_max_manifests=2,
        maintenance_steps="compact,expire",
    )
    contract = load_contract(CONTRACT_FILE)
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    registry = CollectorRegistry()
    totals = run(settings, contract, until_idle=True, spark=spark, registry=registry)

    assert totals.commits.get("failed", 0) == 0 and totals.commits["committed"] == totals.batches >= 20

    def metric(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, {"table": contract.table, **labels}) or 0.0

    runs = metric("geoingest_maintenance_runs_total", outcome="completed")
    gave_up = metric("geoingest_maintenance_runs_total", outcome="gave_up")
    failed = metric("geoingest_maintenance_runs_total", outcome="failed")
    conflicts = metric("geoingest_maintenance_conflicts_total")
    rewritten = metric("geoingest_maintenance_files_rewritten_total")
    ingest_conflicts = metric("geoingest_commit_conflicts_total")
    print(
        f"\n{totals.batches} batches; maintenance: {runs:.0f} runs, {gave_up:.0f} gave up, {failed:.0f} failed, "
        f"{conflicts:.0f} conflicts, {rewritten:.0f} files rewritten; ingest conflicts {ingest_conflicts:.0f}"
    )
    assert runs >= 2 and failed == 0 and rewritten > 0

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    ids = table_ids(table)
    assert len(ids) == n and set(ids) == {f"a{i}" for i in range(n)}, "every row exactly once"
    writer_id = writer_id_for_checkpoint(settings.checkpoint_for(contract.table))
    assert all(committed_snapshot(table, writer_id, b) is not None for b in range(totals.batches))
    assert sum(last - first + 1 for first, last in recorded_offsets(table)[topic].values()) == n

    # Between batches, on the driver: more events, the same checkpoint, maintenance after each batch.
    assert produce_records(kafka.bootstrap, topic, city_records(4_000, 2, "b")) == 4_000
    between = load_settings(
        env={}, **{**settings.__dict__, "maintenance_mode": "between-batches", "maintenance_steps": "compact"}
    )
    registry = CollectorRegistry()
    more = run(between, contract, until_idle=True, spark=spark, registry=registry)
    assert more.commits.get("failed", 0) == 0
    assert (
        registry.get_sample_value("geoingest_maintenance_runs_total", {"table": contract.table, "outcome": "completed"})
        == more.batches
    )
    ids = table_ids(table)
    assert len(ids) == n + 4_000 and len(set(ids)) == len(ids)
    assert len(data_paths(table)) <= 4, "compacted after every batch"


def test_upsert_ingest_racing_maintenance_beside_never_shows_a_stale_row(kafka, spark, topic, tmp_path):
    """An upsert table: the service ingests updates and tombstones in 50 batches back to back (a
    minute or more on 2 shared cores) while its maintenance process compacts (applying the deletes)
    and merges manifests back to back. A rewrite that an ingest commit's deletes overtook lands on
    the sequence number it read, so those deletes reach its files and no replaced or deleted
    version comes back: every snapshot, ingest's and maintenance's, holds exactly the current
    version of each key for the offsets it covers; every record lands once; no bin is given up."""
    contract = parse_contract({**DEMO, "mode": "upsert"})
    records = make_stream(n_keys=2_000, n_events=20_000, seed=7)
    assert produce_records(kafka.bootstrap, topic, records) == len(records)
    positions = record_positions(kafka.bootstrap, topic, records)
    settings = load_settings(
        env={},
        bootstrap_servers=kafka.bootstrap,
        topic=topic,
        catalog={"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path / 'wh'}"},
        checkpoint_location=str(tmp_path / "ck"),
        metrics_port=0,
        cache_dir=str(CACHE_DIR),
        max_offsets_per_trigger=400,
        trigger_interval="0 seconds",
        maintenance_mode="beside",
        maintenance_nice=0,  # racing, as above
        maintenance_cpu_percent=100.0,
        maintenance_interval_s=0,
        maintenance_min_file_age_s=0,
        maintenance_max_manifests=2,
        # Every snapshot is kept: each is checked.
        maintenance_max_snapshots=0,
        maintenance_keep_snapshots=100_000,
        maintenance_steps="compact,expire",
    )
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    registry = CollectorRegistry()
    started = time.monotonic()
    totals = run(settings, contract, until_idle=True, spark=spark, registry=registry)
    racing_s = time.monotonic() - started

    def metric(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, {"table": contract.table, **labels}) or 0.0

    completed = metric("geoingest_maintenance_runs_total", outcome="completed")
    rewritten = metric("geoingest_maintenance_files_rewritten_total")
    abandoned = metric("geoingest_maintenance_bins_abandoned_total")
    conflicts = metric("geoingest_maintenance_conflicts_total")
    ingest_conflicts = metric("geoingest_commit_conflicts_total")
    print(
        f"\n{racing_s:.0f} s racing, {totals.batches} batches, ingest conflicts {ingest_conflicts:.0f}; "
        f"maintenance: {completed:.0f} runs, {rewritten:.0f} files rewritten, {abandoned:.0f} bins abandoned, "
        f"{conflicts:.0f} conflicts, gave up {metric('geoingest_maintenance_runs_total', outcome='gave_up'):.0f}"
    )
    assert totals.commits.get("failed", 0) == 0 and totals.commits["committed"] == totals.batches >= 40
    assert metric("geoingest_maintenance_runs_total", outcome="failed") == 0
    assert completed >= 3 and rewritten > 0, "maintenance raced ingest"
    assert abandoned == 0, "a rewrite that a batch's deletes overtook still lands"

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    maintenance_snapshots = [
        s for s in table.metadata.snapshots if "geoingest.maintenance" in (s.summary or {}).additional_properties
    ]
    assert len(maintenance_snapshots) >= 3
    assert every_snapshot_matches(table, topic, records, positions) == len(table.metadata.snapshots)
    final = reference_state(records, positions, {p: len(indices) - 1 for p, indices in positions.items()})
    assert table_state(table) == final
    assert sum(last - first + 1 for first, last in recorded_offsets(table)[topic].values()) == len(records)


# -- the command ----------------------------------------------------------------------------------
def test_table_maintain_command_dry_run_then_steps_then_errors(tmp_path):
    env = cli_env(tmp_path, GEOINGEST_MAINTENANCE_MAX_BIN_BYTES=str(64 * 1024 * 1024))
    catalog = open_catalog(
        "geoingest",
        {"type": "sql", "uri": env["GEOINGEST_CATALOG__URI"], "warehouse": env["GEOINGEST_CATALOG__WAREHOUSE"]},
    )
    contract = load_contract(CONTRACT_FILE)
    table, _ = create_table(catalog, contract)
    write_batches(table, contract, 8)

    def geoingest(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(GEOINGEST), "table", "maintain", *args], env=env, capture_output=True, text=True, timeout=300
        )
        assert not check or done.returncode == 0, done.stderr[-3000:]
        return done

    location = table.metadata_location
    dry = json.loads(geoingest("--table", contract.table, "--dry-run").stdout)
    table.refresh()
    assert dry["dry_run"] and dry["compaction"]["files_rewritten"] == 16 and table.metadata_location == location

    only_compact = json.loads(geoingest("--contract", str(CONTRACT_FILE), "--compact").stdout)
    assert only_compact["compaction"]["files_rewritten"] == 16 and only_compact["expiry"] is None
    assert only_compact["orphans"] is None
    expired = json.loads(geoingest("--table", contract.table, "--expire").stdout)
    assert expired["compaction"] is None and expired["expiry"]["snapshots_expired"] > 0
    assert table_ids(table) == expected_ids(range(8))

    missing = geoingest("--table", "demo.nothing", check=False)
    assert missing.returncode == 2 and "demo.nothing" in missing.stderr
    bad = subprocess.run(
        [str(GEOINGEST), "table", "maintain", "--table", contract.table],
        capture_output=True,
        text=True,
        env={**env, "GEOINGEST_MAINTENANCE_STEPS": "compact,vacuum"},
        timeout=300,
    )
    assert bad.returncode == 2 and "'compact,vacuum'" in bad.stderr

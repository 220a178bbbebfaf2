"""The service streaming into a native-geometry table (Iceberg v3, `geometry.native`): real broker,
Spark and SQLite catalog, the commits through Iceberg Java. Checked against the reference of what was
produced, read by DuckDB as GEOMETRY; a restart adds nothing; a kill -9 after a commit is replayed
and skipped, never committed twice."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import shapely
from prometheus_client import CollectorRegistry

from app.local.rest_catalog import LocalRestCatalog
from app.maven import configure_iceberg_java
from app.service import run
from streaming.contract import parse_contract
from streaming.table.catalog import create_table, open_catalog
from streaming.table.native import is_native
from tests.conftest import CACHE_DIR, duckdb_connection, local_settings
from tests.streaming.job.test_matrix import (
    DEMO,
    Reference,
    dead_letters,
    differences,
    killed_after_a_commit_then_rerun,
    make_stream,
    new_topic,
    produce,
)

pytestmark = pytest.mark.integration

NATIVE = {**DEMO, "geometry": {**DEMO["geometry"], "native": True}}

configure_iceberg_java(CACHE_DIR)


def read_native(table) -> list[tuple]:
    """(event_id, partition, offset, lon, lat, speed) of every row, as DuckDB reads the v3 table."""
    con = duckdb_connection()
    found = con.execute(
        "SELECT event_id, source_partition, source_offset, ST_AsWKB(geometry), speed, typeof(geometry) "
        f"FROM iceberg_scan('{table.metadata_location}')"
    ).fetchall()
    assert {row[-1].split("(")[0] for row in found} <= {"GEOMETRY"}
    rows = []
    for event_id, partition, offset, wkb, speed, _ in found:
        point = shapely.from_wkb(bytes(wkb))
        rows.append(
            (event_id, partition, offset, round(shapely.get_x(point), 5), round(shapely.get_y(point), 5), speed)
        )
    return rows


def days_of_files(table) -> set[tuple[str, int]]:
    """(file, the day its partition says) of every data file, from the table's manifests."""
    return {
        (entry.data_file.file_path.removeprefix("file://"), entry.data_file.partition[0])
        for snapshot in table.metadata.snapshots
        for manifest in snapshot.manifests(table.io)
        if manifest.added_snapshot_id == snapshot.snapshot_id
        for entry in manifest.fetch_manifest_entry(table.io)
    }


def days_of_rows(table) -> set[tuple[str, int]]:
    """(file, day) of every row's event time, read from the files themselves."""
    import pyarrow.parquet as pq

    found = set()
    for path, _ in days_of_files(table):
        times = pq.read_table(path, columns=["event_time"]).column(0).cast("int64").to_numpy()
        found |= {(path, int(t // 86_400_000_000)) for t in times}
    return found


def _reasons(found) -> dict[tuple[int, int], str]:
    return {(p, o): reason for p, o, reason in found}


@pytest.fixture
def file_rest_catalog(tmp_path) -> Iterator[dict[str, str]]:
    """A REST catalog server of its own whose warehouse is a file:// folder: its client properties."""
    server = LocalRestCatalog(tmp_path / "rest", CACHE_DIR, f"file://{tmp_path / 'rest-warehouse'}")
    try:
        server.start()
        yield server.catalog_properties()
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("source", "shape"),
    [("spark-kafka", "sqlite"), ("python", "sqlite"), ("python", "rest-file-nobbox")],
)
def test_a_native_table_fed_by_the_stream_holds_its_reference_and_a_restart_adds_nothing(
    kafka, spark, tmp_path, request, source, shape
):
    """`rest-file-nobbox`: a REST catalog over a file:// warehouse, the table without its covering."""
    topic = new_topic(kafka.bootstrap, 2)
    records = make_stream(n_keys=2_000, n_events=2_000, seed=5)
    positions = produce(kafka.bootstrap, topic, records)
    more = {"catalog": request.getfixturevalue("file_rest_catalog")} if shape.startswith("rest") else {}
    settings = local_settings(
        kafka, topic, tmp_path, source=source, max_offsets_per_trigger=600, maintenance_mode="off", **more
    )
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    contract = parse_contract({**NATIVE, "bbox": {"stored": False}} if shape.endswith("nobbox") else NATIVE)
    table, created = create_table(catalog, contract)
    assert created and is_native(table) and table.metadata.format_version == 3
    assert [str(f.transform) for f in table.spec().fields] == ["day"]  # the demo contract's default

    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.commits.get("failed", 0) == 0 and totals.batches >= 3
    table.refresh()
    reference = Reference.of("append", records, positions)
    assert set(differences(reference, read_native(table)).values()) == {0}
    assert days_of_files(table) == days_of_rows(table), "every file in the partition of its rows' day"
    assert _reasons(dead_letters(kafka.bootstrap, f"{topic}.dlq")) == reference.dead
    snapshots = len(table.metadata.snapshots)

    again = run(settings, contract, until_idle=True, spark=spark)
    assert again.commits.get("committed", 0) == 0
    table.refresh()
    assert len(table.metadata.snapshots) == snapshots
    assert set(differences(reference, read_native(table)).values()) == {0}


@pytest.mark.parametrize("source", ["spark-kafka", "python"])
def test_a_native_upsert_table_holds_each_keys_last_version_from_a_one_partition_topic(kafka, spark, tmp_path, source):
    """Every key written several times and some deleted (tombstones), on one partition: the table
    holds each live key's last version once, deleted keys never come back, across a restart."""
    topic = new_topic(kafka.bootstrap, 1)
    records = make_stream(n_keys=400, n_events=3_000, seed=29)
    positions = produce(kafka.bootstrap, topic, records)
    settings = local_settings(
        kafka, topic, tmp_path, source=source, max_offsets_per_trigger=500, maintenance_mode="off"
    )
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    contract = parse_contract({**NATIVE, "mode": "upsert"})
    table, _ = create_table(catalog, contract)
    assert sorted(len(spec.fields) for spec in table.specs().values()) == [0, 1]  # deletes go to spec 0

    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.commits.get("failed", 0) == 0 and totals.batches >= 5
    table.refresh()
    reference = Reference.of("upsert", records, positions)
    assert set(differences(reference, read_native(table)).values()) == {0}
    more = make_stream(n_keys=400, n_events=600, seed=31)
    positions += produce(kafka.bootstrap, topic, more)
    run(settings, contract, until_idle=True, spark=spark)
    table.refresh()
    assert set(differences(Reference.of("upsert", records + more, positions), read_native(table)).values()) == {0}


def test_kill_9_after_a_native_commit_is_replayed_and_skipped(kafka, tmp_path):
    """killed_after_a_commit_then_rerun, the commit Iceberg Java's, with compaction beside the stream
    after every commit (Iceberg Java's too)."""
    from tests.streaming.job.test_chaos import catalog_of, service_env

    contract_file = tmp_path / "native.json"
    contract_file.write_text(json.dumps(NATIVE))
    contract = parse_contract(NATIVE)
    topic = new_topic(kafka.bootstrap, 1)
    records = make_stream(n_keys=2_500, n_events=2_500, seed=93)
    positions = produce(kafka.bootstrap, topic, records)
    env = service_env(
        kafka.bootstrap,
        topic,
        tmp_path / "work",
        GEOINGEST_SOURCE="python",
        GEOINGEST_MAX_OFFSETS_PER_TRIGGER="500",
        GEOINGEST_MAINTENANCE_INTERVAL_COMMITS="1",
        GEOINGEST_MAINTENANCE_MIN_GAP_S="0",
        GEOINGEST_MAINTENANCE_MIN_FILE_AGE_S="0",
        GEOINGEST_MAINTENANCE_STEPS="compact",
    )
    create_table(catalog_of(env), contract)
    table = killed_after_a_commit_then_rerun(env, tmp_path, contract_file, contract.table)
    assert set(differences(Reference.of("append", records, positions), read_native(table)).values()) == {0}


def test_a_native_table_gains_the_columns_its_events_bring_under_add_columns(kafka, spark, tmp_path):
    """schema_evolution add-columns on a v3 table: a number and an object property that only the
    later events carry become a column and a struct column, committed by Iceberg Java with the
    batch that first holds them; DuckDB reads them back for exactly those events."""
    from kafka import KafkaProducer

    topic = new_topic(kafka.bootstrap, 1)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    expected = {}
    for i in range(1_200):
        properties = {"kind": "probe", "speed": float(i)}
        if i >= 600:
            properties |= {"battery": i, "sensor": {"model": f"m{i % 3}"}}
            expected[f"e{i}"] = (i, f"m{i % 3}")
        else:
            expected[f"e{i}"] = (None, None)
        feature = {
            "type": "Feature",
            "id": f"e{i}",
            "geometry": {"type": "Point", "coordinates": [i % 170, i % 80]},
            "properties": properties,
        }
        producer.send(topic, json.dumps(feature).encode())
    producer.flush()
    producer.close()
    settings = local_settings(kafka, topic, tmp_path, max_offsets_per_trigger=300, maintenance_mode="off")
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    contract = parse_contract({**NATIVE, "schema_evolution": {"mode": "add-columns"}})
    create_table(catalog, contract)
    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.commits.get("failed", 0) == 0
    table = catalog.load_table(contract.table)
    assert is_native(table) and {"battery", "sensor"} <= set(table.schema().column_names)
    con = duckdb_connection()
    found = con.execute(
        f"SELECT event_id, battery, sensor.model FROM iceberg_scan('{table.metadata_location}')"
    ).fetchall()
    assert {i: (b, m) for i, b, m in found} == expected


def test_maintenance_beside_a_native_stream_fails_no_run_and_loses_no_row(kafka, spark, tmp_path):
    """The default maintenance mode on a v3 table, at every chance: whatever of its runs (retention,
    compaction, expiry, each an Iceberg Java commit fenced by the lease) land between the stream's
    commits, and however many (the child's own JVM may still be starting when the topic is
    drained on a busy machine: tests/app/test_maintenance.py waits for a run), no run fails and
    the table holds the reference."""
    topic = new_topic(kafka.bootstrap, 2)
    records = make_stream(n_keys=3_000, n_events=3_000, seed=41)
    positions = produce(kafka.bootstrap, topic, records)
    settings = local_settings(
        kafka,
        topic,
        tmp_path,
        source="python",
        max_offsets_per_trigger=300,
        maintenance_interval_commits=1,
        maintenance_min_gap_s=0,
        maintenance_cpu_percent=100,
        maintenance_min_file_age_s=0,
        maintenance_keep_snapshots=3,
        maintenance_snapshot_max_age_s=0,
    )
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    contract = parse_contract(NATIVE)
    create_table(catalog, contract)
    registry = CollectorRegistry()

    totals = run(settings, contract, until_idle=True, spark=spark, registry=registry)

    assert totals.commits.get("failed", 0) == 0 and totals.batches >= 5
    runs = {
        outcome: registry.get_sample_value(
            "geoingest_maintenance_runs_total", {"table": contract.table, "outcome": outcome}
        )
        or 0
        for outcome in ("completed", "skipped", "gave_up", "failed")
    }
    assert runs["failed"] == runs["gave_up"] == 0, runs
    table = catalog.load_table(contract.table)
    reference = Reference.of("append", records, positions)
    assert set(differences(reference, read_native(table)).values()) == {0}

"""Partitioned tables through the real service (broker, Spark, SQLite catalog): a stream of several
days and many places lands in the right partitions, a query with a time window and a bbox finds
exactly the brute-force answer from the files of the right partitions only (long lines and large
polygons included, whose centre lies in a cell outside the window), DuckDB reads the same rows, and
an upsert stream whose features move across days and cells keeps one current row per key."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import shapely
from kafka import KafkaProducer

from app.service import run
from streaming.contract import parse_contract
from streaming.kernels.geohash import covering_cells, enclosing_cells
from streaming.maintenance.maintain import maintain
from streaming.maintenance.plan import MaintenancePolicy
from streaming.read.predicate import Predicate
from streaming.read.query import query, sql_where
from streaming.table.catalog import create_table, open_catalog
from tests.conftest import duckdb_connection, local_settings
from tests.iceberg_spark import run_with_iceberg_spark
from tests.streaming.write.test_upsert import (
    every_snapshot_matches,
    record_positions,
    reference_state,
    table_state,
)

ROOT = Path(__file__).resolve().parents[3]
DEMO = json.loads((ROOT / "schemas" / "demo_events.json").read_text())
SPEC = ["day(event_time)", "geohash(geometry, 2)"]
DAY_MS = 86_400_000
# Places events crowd around (skewed, as real traffic is): Paris, New York, Tokyo, Lagos, Sydney.
HOTSPOTS = [(2.35, 48.86), (-74.0, 40.7), (139.7, 35.7), (3.4, 6.5), (151.2, -33.9)]
WINDOW = (-10.0, 35.0, 30.0, 60.0)


def midnight_ms(days_ago: int) -> int:
    """The start of the day `days_ago` days before yesterday. The tests write days no later than
    yesterday: a broker refuses a record stamped more than an hour ahead of its clock (Kafka 4's
    `log.message.timestamp.after.max.ms`), so "today up to 06:00" fails before 05:00."""
    now = int(time.time() * 1000)
    return now - now % DAY_MS - (days_ago + 1) * DAY_MS


def geometry_of(rng: np.random.Generator, i: int) -> dict:
    """Mostly points near a hotspot; every 20th a long line, every 25th a large polygon."""
    x, y = (
        HOTSPOTS[rng.integers(len(HOTSPOTS))] if rng.random() < 0.8 else (rng.uniform(-170, 170), rng.uniform(-70, 70))
    )
    x, y = float(np.clip(x + rng.normal(0, 3), -175, 175)), float(np.clip(y + rng.normal(0, 2), -80, 80))
    if i % 20 == 0:
        # 15-40 degrees long: its centre is often outside the window while it crosses it
        length = rng.uniform(15, 40)
        return {"type": "LineString", "coordinates": [[max(x - length, -179.0), y], [min(x + length, 179.0), y + 1]]}
    if i % 25 == 0:
        w, h = rng.uniform(8, 20), rng.uniform(6, 12)
        ring = [[x - w, y - h], [x + w, y - h], [x + w, y + h], [x - w, y + h], [x - w, y - h]]
        return {
            "type": "Polygon",
            "coordinates": [[[max(-179.0, min(179.0, a)), max(-85.0, min(85.0, b))] for a, b in ring]],
        }
    return {"type": "Point", "coordinates": [round(x, 5), round(y, 5)]}


def make_events(n: int, seed: int, start_ms: int, span_ms: int) -> list[tuple[bytes, bytes, int]]:
    """(key, GeoJSON value, Kafka timestamp ms): times spread over the span in no order."""
    rng = np.random.default_rng(seed)
    events = []
    for i in range(n):
        feature = {"type": "Feature", "id": f"e{i}", "geometry": geometry_of(rng, i), "properties": {"speed": float(i)}}
        events.append((f"e{i}".encode(), json.dumps(feature).encode(), int(start_ms + rng.integers(span_ms))))
    return events


def produce_timed(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None, int]]) -> int:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        futures = [producer.send(topic, key=k, value=v, timestamp_ms=t) for k, v, t in records]
        producer.flush(timeout=60)
        return sum(1 for f in futures if f.succeeded())
    finally:
        producer.close()


def brute_force(events, bbox, lo_ms: int, hi_ms: int) -> set[str]:
    box = shapely.box(*bbox)
    return {
        key.decode()
        for key, value, t in events
        if lo_ms <= t < hi_ms
        and shapely.intersects(shapely.from_geojson(json.dumps(json.loads(value)["geometry"])), box)
    }


def duckdb_window_ids(metadata_location: str, where: str) -> set[str]:
    """The ids of the events DuckDB reads with the condition `where` that intersect WINDOW."""
    con = duckdb_connection()
    con.execute("SET enable_geoparquet_conversion = false")
    con.execute("SET TimeZone = 'UTC'")
    found = con.execute(f"SELECT event_id, geometry FROM iceberg_scan('{metadata_location}') WHERE {where}").fetchall()
    box = shapely.box(*WINDOW)
    return {i for i, g in found if shapely.intersects(shapely.from_wkb(bytes(g)), box)}


def iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000))


@pytest.fixture(scope="module")
def events() -> list[tuple[bytes, bytes, int]]:
    return make_events(4_000, seed=31, start_ms=midnight_ms(2) - 6 * 3_600_000, span_ms=2 * DAY_MS + 12 * 3_600_000)


@pytest.mark.integration
@pytest.mark.parametrize(("clustering", "source"), [("batch", "spark-kafka"), ("task", "python")])
def test_a_stream_over_days_and_places_lands_in_its_partitions_and_queries_prune_by_them(
    kafka, spark, topic, tmp_path, events, clustering, source, monkeypatch, capsys
):
    contract = parse_contract({**DEMO, "partition": SPEC})
    assert produce_timed(kafka.bootstrap, topic, events) == len(events)
    settings = local_settings(
        kafka, topic, tmp_path, clustering=clustering, source=source, max_offsets_per_trigger=1_500
    )
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.commits.get("failed", 0) == 0 and totals.batches >= 2

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    assert [f.name for f in table.spec().fields] == ["event_time_day", "geometry_geohash2"]
    assert table.properties["geoingest.partition.cell.geometry_geohash2"] == "geohash:2:geometry"

    # Every file holds the rows of its partition only: their day and the cell of their bbox.
    tasks = list(table.scan().plan_files())
    partitions: set[tuple] = set()
    rows = 0
    for task in tasks:
        day, cell = task.file.partition[0], task.file.partition[1]
        data = pq.read_table(task.file.file_path.removeprefix("file://"))
        micros = data.column("event_time").cast("int64").to_numpy()
        assert set((micros // 86_400_000_000).tolist()) == {day}
        bbox = data.column("bbox").combine_chunks()
        cells = enclosing_cells(
            *(bbox.field(n).to_numpy(zero_copy_only=False) for n in ("xmin", "ymin", "xmax", "ymax")), 2
        )
        assert set(cells.tolist()) == {cell} == set(data.column("geometry_geohash2").to_pylist())
        assert task.file.spec_id == table.spec().spec_id
        partitions.add((day, cell))
        rows += data.num_rows
    assert rows == len(events)
    assert len({d for d, _ in partitions}) >= 3 and len({c for _, c in partitions}) > 20
    assert any(len(c) < 2 for _, c in partitions), "lines and polygons across cell edges sit in coarser cells"

    # Files per batch and partition stay few: the merge ranges (batch) or input partitions (task) at most.
    per_batch = Counter()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id == snapshot.snapshot_id:
                for entry in manifest.fetch_manifest_entry(table.io):
                    per_batch[(snapshot.snapshot_id, tuple(entry.data_file.partition))] += 1
    assert max(per_batch.values()) <= 3

    # A day-and-a-half window and a bbox: exactly the brute-force answer, from the right partitions.
    lo, hi = midnight_ms(1) - 6 * 3_600_000, midnight_ms(0) + 6 * 3_600_000
    expected = brute_force(events, WINDOW, lo, hi)
    centres_outside = [
        key
        for key, value, t in events
        if key.decode() in expected
        and not shapely.box(*WINDOW).contains(
            shapely.from_geojson(json.dumps(json.loads(value)["geometry"])).envelope.centroid
        )
    ]
    assert len(expected) > 100 and centres_outside, "the answer holds geometries whose centre is outside the window"
    result = query(table, Predicate.from_bbox(WINDOW), time_from=iso(lo), time_to=iso(hi))
    assert set(result.table.column("event_id").to_pylist()) == expected and result.table.num_rows == len(expected)
    days = set(range(lo // DAY_MS, (hi - 1) // DAY_MS + 1))
    cover = set(covering_cells(WINDOW, 2))
    right = [t for t in tasks if t.file.partition[0] in days and t.file.partition[1] in cover]
    assert 0 < result.stats.files_scanned <= len(right) < len(tasks)

    # The command says the same.
    monkeypatch.delenv("GEOINGEST_CONFIG", raising=False)
    monkeypatch.setenv("GEOINGEST_CATALOG_NAME", settings.catalog_name)
    monkeypatch.setenv("GEOINGEST_CATALOG__URI", settings.catalog["uri"])
    monkeypatch.setenv("GEOINGEST_CATALOG__WAREHOUSE", settings.catalog["warehouse"])
    from app.cli import main

    bbox_arg = ",".join(str(v) for v in WINDOW)
    assert (
        main(
            [
                "query",
                "--table",
                contract.table,
                f"--bbox={bbox_arg}",
                "--from",
                iso(lo),
                "--to",
                iso(hi),
                "--format",
                "count",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["count"] == len(expected) and out["files_scanned"] == result.stats.files_scanned

    # DuckDB reads the same rows with the condition `geoingest query --format sql` prints.
    assert (
        main(
            [
                "query",
                "--table",
                contract.table,
                f"--bbox={bbox_arg}",
                "--from",
                iso(lo),
                "--to",
                iso(hi),
                "--format",
                "sql",
            ]
        )
        == 0
    )
    where = capsys.readouterr().out.strip()
    assert (
        where == sql_where(table, Predicate.from_bbox(WINDOW), iso(lo), iso(hi)) and "geometry_geohash2 IN (" in where
    )
    assert duckdb_window_ids(table.metadata_location, where) == expected

    if source == "spark-kafka":  # once: Spark with Iceberg's runtime, the same condition, in SQL
        found, metrics = spark_iceberg_window(table.metadata_location, where, tmp_path)
        assert {i for i, g in found if shapely.intersects(shapely.from_wkb(g), shapely.box(*WINDOW))} == expected
        # Iceberg planned only files of the matching days and cells (fewer still: the bbox and
        # event_time bounds of each file prune too).
        assert 0 < metrics["resultDataFiles"] <= len(right) < len(tasks), metrics
        assert metrics["resultDataFiles"] + metrics["skippedDataFiles"] <= len(tasks), metrics


SPARK_WINDOW = """
import json, sys
from pathlib import Path
from app.spark import spark_session
cache, jars, location, where, out = sys.argv[1:6]
spark = spark_session("local[1]", cache, "1g", extra_jars=[Path(j) for j in jars.split(",")])
spark.conf.set("spark.sql.adaptive.enabled", "false")  # the scan node's metrics, in the plan that ran
spark.read.format("iceberg").load(location).createOrReplaceTempView("events")
df = spark.sql(f"SELECT event_id, geometry FROM events WHERE {where}")
rows = df.collect()
metrics = {}
leaves = df._jdf.queryExecution().executedPlan().collectLeaves()
for i in range(leaves.size()):
    if leaves.apply(i).nodeName().startswith("BatchScan"):
        entries = leaves.apply(i).metrics().iterator()
        while entries.hasNext():
            entry = entries.next()
            metrics[entry._1()] = entry._2().value()
json.dump({"rows": [[r.event_id, bytes(r.geometry).hex()] for r in rows], "metrics": metrics}, open(out, "w"))
spark.stop()
"""


def spark_iceberg_window(metadata_location: str, where: str, tmp_path: Path) -> tuple[list, dict[str, int]]:
    """The rows Spark with Iceberg's runtime reads for `where` (docs/partitioning.md's words), and
    its scan's metrics (resultDataFiles: the files Iceberg planned), in a process of its own: the
    session needs the runtime jar on its classpath from the start."""
    answer = run_with_iceberg_spark(SPARK_WINDOW, tmp_path, metadata_location, where)
    return [(i, bytes.fromhex(g)) for i, g in answer["rows"]], answer["metrics"]


def make_moving_stream(n_keys: int, n_events: int, seed: int, start_ms: int, span_ms: int) -> list:
    """Every key created, then moved anywhere and to later days (times rise with offsets), 10 % tombstones."""
    rng = np.random.default_rng(seed)
    alive: set[int] = set()
    records = []
    order = list(range(n_keys)) + rng.integers(0, n_keys, n_events - n_keys).tolist()
    for i, key in enumerate(order):
        name = f"k{key}".encode()
        t = start_ms + span_ms * i // n_events
        if key in alive and rng.random() < 0.1:
            records.append((name, None, t))
            alive.discard(key)
            continue
        lon, lat = round(float(rng.uniform(-179, 179)), 5), round(float(rng.uniform(-80, 80)), 5)
        feature = {
            "type": "Feature",
            "id": name.decode(),
            "properties": {"speed": float(i)},
            "geometry": {"type": "Point", "coordinates": [lon, lat]},
        }
        records.append((name, json.dumps(feature).encode(), t))
        alive.add(key)
    return records


@pytest.mark.integration
def test_an_upsert_stream_moving_across_days_and_cells_keeps_one_current_row_per_key(kafka, spark, topic, tmp_path):
    contract = parse_contract({**DEMO, "mode": "upsert", "partition": SPEC})
    records = make_moving_stream(500, 5_000, seed=5, start_ms=midnight_ms(2), span_ms=2 * DAY_MS + 3_600_000)
    assert produce_timed(kafka.bootstrap, topic, records) == len(records)
    with_headers = [(k, v, []) for k, v, _ in records]
    positions = record_positions(kafka.bootstrap, topic, with_headers)
    settings = local_settings(kafka, topic, tmp_path, clustering="batch", max_offsets_per_trigger=1_000)
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.commits.get("failed", 0) == 0 and totals.batches >= 4

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    assert every_snapshot_matches(table, topic, with_headers, positions) >= totals.batches
    final = reference_state(with_headers, positions, {p: len(ix) - 1 for p, ix in positions.items()})
    assert len(final) > 300 and table_state(table) == final
    # The deletes are unpartitioned (spec 0), so every engine applies them across partitions.
    con = duckdb_connection()
    con.execute("SET enable_geoparquet_conversion = false")
    n, keys = con.execute(
        f"SELECT count(*), count(DISTINCT event_id) FROM iceberg_scan('{table.metadata_location}')"
    ).fetchone()
    assert (n, keys) == (len(final), len(final))
    days = pc.unique(query(table, Predicate.from_bbox((-180, -90, 180, 90))).table.column("event_time").cast("int64"))
    assert len(set((v // 86_400_000_000) for v in days.to_pylist())) == 3


@pytest.mark.integration
def test_the_cell_length_evolves_and_a_window_over_old_and_new_files_stays_exact(
    kafka, spark, topic, tmp_path, events, monkeypatch, capsys
):
    """Precision 1, then `geoingest table evolve` to precision 2: a new optional cell column, the
    spec's identity field swapped; the files written before keep their spec and cells, the files
    after fill both columns, and each file is pruned by its own spec's cells."""
    from app.cli import main

    raw = {**DEMO, "partition": ["day(event_time)", "geohash(geometry, 1)"]}
    first, second = events[:2_000], events[2_000:]
    settings = local_settings(kafka, topic, tmp_path, max_offsets_per_trigger=1_000)
    create_table(open_catalog(settings.catalog_name, settings.catalog), parse_contract(raw))
    assert produce_timed(kafka.bootstrap, topic, first) == len(first)
    run(settings, parse_contract(raw), until_idle=True, spark=spark)

    evolved = {**raw, "partition": ["day(event_time)", "geohash(geometry, 2)"]}
    path = tmp_path / "evolved.json"
    path.write_text(json.dumps(evolved))
    monkeypatch.delenv("GEOINGEST_CONFIG", raising=False)
    monkeypatch.setenv("GEOINGEST_CATALOG_NAME", settings.catalog_name)
    monkeypatch.setenv("GEOINGEST_CATALOG__URI", settings.catalog["uri"])
    monkeypatch.setenv("GEOINGEST_CATALOG__WAREHOUSE", settings.catalog["warehouse"])
    assert main(["table", "evolve", "--contract", str(path)]) == 0
    changes = json.loads(capsys.readouterr().out)["changes"]
    assert {"change": "partition-remove", "field": "geometry_geohash1", "transform": "identity"} in changes
    assert {"change": "partition-add", "field": "geometry_geohash2", "transform": "identity"} in changes
    assert any(c["change"] == "cell-add" and c["column"] == "geometry_geohash2" for c in changes)

    assert produce_timed(kafka.bootstrap, topic, second) == len(second)
    totals = run(settings, parse_contract(evolved), until_idle=True, spark=spark)
    assert totals.commits.get("failed", 0) == 0 and totals.batches >= 2

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(parse_contract(raw).table)
    assert [f.name for f in table.spec().fields] == ["event_time_day", "geometry_geohash2"]
    assert table.properties["geoingest.partition.cell.geometry_geohash1"] == "geohash:1:geometry"
    assert table.properties["geoingest.partition.cell.geometry_geohash2"] == "geohash:2:geometry"
    old_column, new_column = (table.schema().find_field(f"geometry_geohash{p}") for p in (1, 2))
    assert old_column.required and not new_column.required and new_column.field_id > old_column.field_id

    # Old files: precision-1 partitions, no precision-2 cells; new files: precision-2 partitions,
    # both columns filled from each row's bbox.
    tasks = list(table.scan().plan_files())
    by_spec = Counter(t.file.spec_id for t in tasks)
    assert len(by_spec) == 2, by_spec
    partition_cells: dict[str, tuple[int, str]] = {}
    for task in tasks:
        data = pq.read_table(task.file.file_path.removeprefix("file://"))
        bbox = data.column("bbox").combine_chunks()
        corners = [bbox.field(n).to_numpy(zero_copy_only=False) for n in ("xmin", "ymin", "xmax", "ymax")]
        assert data.column("geometry_geohash1").to_pylist() == enclosing_cells(*corners, 1).tolist()
        cell = task.file.partition[1]
        if task.file.spec_id == table.spec().spec_id:
            assert set(data.column("geometry_geohash2").to_pylist()) == {cell}
            assert data.column("geometry_geohash2").to_pylist() == enclosing_cells(*corners, 2).tolist()
            partition_cells[task.file.file_path] = (2, cell)
        else:
            assert "geometry_geohash2" not in data.column_names and set(enclosing_cells(*corners, 1)) == {cell}
            partition_cells[task.file.file_path] = (1, cell)
    assert sum(1 for p, c in partition_cells.values() if p == 2 and len(c) == 2) > 20

    # A window over both: exactly the brute-force answer, each file pruned by its own spec's cells.
    lo, hi = midnight_ms(1) - 6 * 3_600_000, midnight_ms(0) + 6 * 3_600_000
    expected = brute_force(events, WINDOW, lo, hi)
    assert expected & brute_force(first, WINDOW, lo, hi) and expected & brute_force(second, WINDOW, lo, hi)
    result = query(table, Predicate.from_bbox(WINDOW), time_from=iso(lo), time_to=iso(hi))
    assert set(result.table.column("event_id").to_pylist()) == expected and result.table.num_rows == len(expected)
    days = set(range(lo // DAY_MS, (hi - 1) // DAY_MS + 1))
    covers = {p: set(covering_cells(WINDOW, p)) for p in (1, 2)}
    right = [
        t
        for t in tasks
        if t.file.partition[0] in days
        and partition_cells[t.file.file_path][1] in covers[partition_cells[t.file.file_path][0]]
    ]
    assert 0 < result.stats.files_scanned <= len(right) < len(tasks)

    # The SQL condition lets the rows of the old files through the new column (IS NULL); DuckDB
    # reads the same rows with it.
    where = sql_where(table, Predicate.from_bbox(WINDOW), iso(lo), iso(hi))
    assert "geometry_geohash2 IS NULL" in where and "geometry_geohash1 IN (" in where
    assert duckdb_window_ids(table.metadata_location, where) == expected

    # Compaction rewrites the new spec's small files, still one partition each, both cells filled.
    report = maintain(table, MaintenancePolicy(min_file_age_s=0), steps=("compact",))
    assert report.compaction is not None and report.compaction.files_written > 0, report
    table = open_catalog(settings.catalog_name, settings.catalog).load_table(parse_contract(raw).table)
    for task in table.scan().plan_files():
        if task.file.spec_id == table.spec().spec_id:
            data = pq.read_table(task.file.file_path.removeprefix("file://"))
            assert set(data.column("geometry_geohash2").to_pylist()) == {task.file.partition[1]}
            assert data.column("geometry_geohash1").null_count == 0
    result = query(table, Predicate.from_bbox(WINDOW), time_from=iso(lo), time_to=iso(hi))
    assert set(result.table.column("event_id").to_pylist()) == expected and result.table.num_rows == len(expected)

"""Native-geometry tables (streaming/table/native.py): a v3 table made and appended to by Iceberg Java
1.12 in its own JVM, on a SQLite catalog, its files written by the service's writer with Parquet's
GEOMETRY type; read back by DuckDB (geometry, files pruned by the manifests' geometry bounds) and
pyarrow."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from app.java import java_executable
from app.maven import iceberg_java_classpath
from streaming.contract import Contract, ContractError, load_contract, parse_contract
from streaming.decode.decoder import HILBERT, REJECT_REASON, Decoder
from streaming.table.native import IcebergJava, NativeTableError, configure, java_catalog_properties
from streaming.write.data_files import GeoParquetWriter
from tests.conftest import CACHE_DIR, duckdb_connection
from tests.streaming.decode.test_decoder import feature, kafka_batch, point

pytestmark = pytest.mark.integration

configure(lambda: (iceberg_java_classpath(CACHE_DIR), java_executable(CACHE_DIR)))

CONTRACT_PATH = Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json"


def native_contract() -> Contract:
    raw = json.loads(CONTRACT_PATH.read_text())
    raw["geometry"]["native"] = True
    return parse_contract(raw)


def decoded(contract: Contract, first: int, geometries: list[dict]) -> pa.Table:
    """Decoded, Hilbert-sorted features e<first>.. of these geometries, every one valid."""
    values = [feature(g, f"e{first + i}", kind="probe", speed=float(first + i)) for i, g in enumerate(geometries)]
    table = pa.Table.from_batches([Decoder(contract).decode(kafka_batch(values))])
    assert table.filter(pc.is_valid(table.column(REJECT_REASON))).num_rows == 0
    return table.sort_by(HILBERT)


def line(*vertices: tuple[float, float]) -> dict:
    return {"type": "LineString", "coordinates": [list(v) for v in vertices]}


def decoded_points(contract: Contract, first: int, lon: float, lat: float, n: int = 40) -> pa.Table:
    return decoded(contract, first, [point(lon + i * 0.01, lat + i * 0.01) for i in range(n)])


def written(table, contract: Contract, rows: pa.Table) -> tuple:
    """The data files the service's writer makes of `rows` for `table` (not committed)."""
    from streaming.table.catalog import partition_layout

    writer = GeoParquetWriter(contract, table.properties, {}, table.location() + "/data", "t", partition_layout(table))
    return tuple(writer.write(rows.to_batches()))


def files_read(con, sql: str) -> tuple[int, list]:
    plan = "\n".join(row[1] for row in con.execute(f"EXPLAIN ANALYZE {sql}").fetchall())
    return int(re.search(r"Total Files Read: (\d+)", plan).group(1)), con.execute(sql).fetchall()


def test_a_native_table_is_v3_with_geometry_that_duckdb_reads_and_prunes_by_its_bounds(tmp_path):
    contract = native_contract()
    warehouse = tmp_path / "warehouse"
    catalog = IcebergJava.shared().catalog(
        "test", {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": f"file://{warehouse}"}
    )
    schema_json = contract.iceberg_schema.model_dump_json()
    table = catalog.create_table(contract.table, schema_json, contract.geometry.id, None)
    assert table.format_version == 3
    geometry_field = next(f for f in json.loads(table.schema_json())["fields"] if f["id"] == contract.geometry.id)
    assert geometry_field["type"].startswith("geometry")
    # Made again (a restart): the same table, not an error.
    assert catalog.create_table(contract.table, schema_json, contract.geometry.id, None).metadata_location == (
        table.metadata_location
    )

    writer = GeoParquetWriter(contract, {}, {}, f"file://{warehouse}/events/data", "t")
    europe = list(writer.write(decoded_points(contract, 0, 2.0, 48.0).to_batches()))
    pacific = list(writer.write(decoded_points(contract, 100, -120.0, -40.0).to_batches()))
    table.append(europe, contract.geometry.id, {"geoingest.writer-id": "w", "geoingest.batch-id": "0"})
    table.append(
        pacific,
        contract.geometry.id,
        {"geoingest.writer-id": "w", "geoingest.batch-id": "1"},
        table.current_snapshot_id(),
    )
    assert [(s["geoingest.writer-id"], s["geoingest.batch-id"]) for s in table.summaries()] == [("w", "0"), ("w", "1")]

    # pyarrow reads the files' geometry as Parquet's GEOMETRY type.
    parquet_schema = pq.ParquetFile(europe[0].path.removeprefix("file://")).schema
    columns = {parquet_schema.column(i).name: parquet_schema.column(i) for i in range(len(parquet_schema))}
    assert columns[contract.geometry.name].logical_type.type == "GEOMETRY"

    con = duckdb_connection()
    scan = f"iceberg_scan('{table.metadata_location}')"
    types = dict(con.execute(f"SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM {scan})").fetchall())
    assert types[contract.geometry.name].startswith("GEOMETRY"), types
    count, rows = files_read(con, f"SELECT event_id FROM {scan}")
    assert count == 2 and len(rows) == 80
    box = "ST_MakeEnvelope(0, 40, 20, 60)"
    count, rows = files_read(con, f"SELECT event_id FROM {scan} WHERE {contract.geometry.name} && {box} ORDER BY 1")
    assert count == 1
    assert [r[0] for r in rows] == sorted(f"e{i}" for i in range(40))


def test_native_tables_take_sqlite_and_rest_catalogs_and_name_any_other():
    impl, props = java_catalog_properties({"type": "sql", "uri": "sqlite:////data/c.db", "warehouse": "file:///w"})
    assert impl.endswith("JdbcCatalog") and props["uri"] == "jdbc:sqlite:/data/c.db"
    impl, props = java_catalog_properties({"uri": "http://127.0.0.1:8181", "warehouse": "file:///w"})
    assert impl.endswith("RESTCatalog") and props["uri"] == "http://127.0.0.1:8181"
    impl, props = java_catalog_properties(
        {"uri": "http://127.0.0.1:8181", "warehouse": "s3://b/w", "s3.region": "eu-west-3", "s3.endpoint": "http://e"}
    )
    assert props["io-impl"].endswith("S3FileIO") and props["client.region"] == "eu-west-3"
    assert props["s3.endpoint"] == "http://e" and "s3.region" not in props
    with pytest.raises(NativeTableError, match="warehouse 'gs://b/w': native-geometry tables are written to file://"):
        java_catalog_properties({"uri": "http://127.0.0.1:8181", "warehouse": "gs://b/w"})
    with pytest.raises(NativeTableError, match="catalog uri 'postgresql://u@h/db'"):
        java_catalog_properties({"type": "sql", "uri": "postgresql://u@h/db"})
    with pytest.raises(NativeTableError, match="catalog type 'glue'"):
        java_catalog_properties({"type": "glue"})


def test_the_native_switch_is_a_boolean():
    raw = json.loads(CONTRACT_PATH.read_text())
    raw["geometry"]["native"] = "yes"
    with pytest.raises(ContractError, match="geometry.native: expected true or false, got 'yes'"):
        parse_contract(raw)
    assert not load_contract(CONTRACT_PATH).geometry.native
    assert dataclasses.replace(native_contract().geometry, epsg=3857).native_crs == "srid:3857"


def test_create_table_makes_a_native_contracts_table_v3_and_pyiceberg_loads_it(catalog):
    from streaming.table.catalog import check_table_matches, create_table
    from streaming.table.native import is_native

    contract = native_contract()
    table, created = create_table(catalog, contract)
    assert created and is_native(table) and table.metadata.format_version == 3
    assert table.properties["geo.column.geometry.crs"] == "EPSG:4326"
    again, created = create_table(catalog, contract)
    assert not created and again.metadata_location == table.metadata_location
    check_table_matches(again, contract)


def test_a_second_instance_landing_the_same_batch_mid_commit_makes_the_commit_skip_it(catalog, monkeypatch):
    """Another instance under the same writer id (a zombie) commits the same batch after this
    committer's replay check and before its Iceberg Java commit: Iceberg Java must not re-apply
    ours over theirs; the committer checks again and skips. The race is made by committing theirs,
    for real, at that moment."""
    import streaming.table.commit as commit_module
    from streaming.table.catalog import create_table
    from streaming.table.commit import BatchCommit, Committer

    contract = native_contract()
    table, _ = create_table(catalog, contract)
    ours = written(table, contract, decoded_points(contract, 0, 2.0, 48.0))
    theirs = written(table, contract, decoded_points(contract, 0, 2.0, 48.0))

    def batch(files) -> BatchCommit:
        return BatchCommit("w", 7, {"t": {0: (0, 39)}}, files)

    real_native_table = commit_module.native_table
    raced: list = []

    def racing(pyiceberg_table):
        handle = real_native_table(pyiceberg_table)
        if not raced:
            raced.append(None)
            raced.append(Committer(catalog.load_table(contract.table)).commit(batch(theirs)))
        return handle

    monkeypatch.setattr(commit_module, "native_table", racing)
    outcome = Committer(table).commit(batch(ours))
    assert raced[1].status == "committed"
    assert (outcome.status, outcome.conflicts) == ("skipped_replay", 1)
    table.refresh()
    batches = [(s.summary["geoingest.writer-id"], s.summary["geoingest.batch-id"]) for s in table.metadata.snapshots]
    assert batches == [("w", "7")]


SPARK_41 = "4.1.1"
SPARK_41_READER = """
import json, sys
from pyspark.sql import SparkSession
name, uri, warehouse, jars, out = sys.argv[1:6]
spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.jars", jars)
    .config(f"spark.sql.catalog.{name}", "org.apache.iceberg.spark.SparkCatalog")
    .config(f"spark.sql.catalog.{name}.type", "jdbc")
    .config(f"spark.sql.catalog.{name}.uri", uri)
    .config(f"spark.sql.catalog.{name}.jdbc.schema-version", "V1")
    .config(f"spark.sql.catalog.{name}.warehouse", warehouse)
    .config("spark.sql.geospatial.enabled", "true")
    .config("spark.ui.enabled", "false")
    .getOrCreate()
)
frame = spark.table(f"{name}.demo.events")
rows = frame.selectExpr("event_id", "hex(ST_AsBinary(geometry))").collect()
with open(out, "w") as answer:
    json.dump({"type": str(frame.schema["geometry"].dataType), "rows": [list(r) for r in rows]}, answer)
spark.stop()
"""


def spark_41_python() -> Path:
    """A Python with pyspark 4.1, made once in the cache folder: the engine the issue of native
    geometry names as a reader (Spark 4.1 with Iceberg's runtime, spark.sql.geospatial.enabled)."""
    import fcntl
    import subprocess
    import sys

    home = CACHE_DIR / f"venv-pyspark-{SPARK_41}"
    python = home / "bin" / "python"
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / "venv-pyspark.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / "ready").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(home)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"pyspark=={SPARK_41}"], check=True)
            (home / "ready").write_text(SPARK_41)
    return python


def test_spark_4_1_with_icebergs_runtime_reads_the_column_as_geometry(catalog, tmp_path):
    import subprocess

    from app.java import java_home
    from app.maven import ICEBERG_JAVA, SQLITE_JDBC
    from streaming.table.catalog import create_table
    from streaming.table.commit import BatchCommit, Committer

    contract = native_contract()
    table, _ = create_table(catalog, contract)
    files = written(table, contract, decoded_points(contract, 0, 2.0, 48.0))
    Committer(table).commit(BatchCommit("w", 0, {"t": {0: (0, 39)}}, files))
    wkb_by_id = {}
    for record in files:
        found = pq.read_table(record.path.removeprefix("file://"), columns=["event_id", "geometry"])
        geometry = found.column("geometry").combine_chunks()
        wkb = getattr(geometry, "storage", geometry).to_pylist()
        wkb_by_id.update(zip(found.column("event_id").to_pylist(), (w.hex().upper() for w in wkb)))

    jars = [
        p
        for p in iceberg_java_classpath(CACHE_DIR)
        if p.name.startswith(("org.apache.iceberg_iceberg-spark-runtime", "org.xerial_sqlite"))
    ]
    assert len(jars) == 2, (ICEBERG_JAVA, SQLITE_JDBC, jars)
    out = tmp_path / "answer.json"
    script = tmp_path / "read.py"
    script.write_text(SPARK_41_READER)
    done = subprocess.run(
        [
            str(spark_41_python()),
            str(script),
            catalog.name,
            "jdbc:sqlite:" + catalog.properties["uri"].removeprefix("sqlite:///"),
            catalog.properties["warehouse"],
            ",".join(str(j) for j in jars),
            str(out),
        ],
        env={"PATH": "/usr/bin:/bin", "JAVA_HOME": str(java_home(CACHE_DIR)), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(out.read_text())
    assert answer["type"].startswith("GeometryType")
    assert dict(answer["rows"]) == wkb_by_id and len(wkb_by_id) == 40


def test_a_file_of_lines_across_the_anti_meridian_is_bounded_by_its_planar_extent_so_no_reader_misses_it(catalog):
    """The bbox covering wraps for these rows (read the short way), but an engine reads a `geometry`
    as planar: the line from 179 to -179 crosses x = 0. DuckDB, pruning by the manifests' bounds,
    must find what a scan of every file finds, for boxes on either side and in between."""
    import shapely

    from streaming.table.catalog import create_table
    from streaming.table.commit import BatchCommit, Committer

    contract = native_contract()
    table, _ = create_table(catalog, contract)
    across = written(
        table, contract, decoded(contract, 0, [line((179.0, 10.0), (-179.0, 11.0)), line((178.5, 12), (-178.5, 13))])
    )
    east = written(table, contract, decoded(contract, 10, [line((10.0, 10.0), (11.0, 11.0))]))
    assert across[0].bbox[0] > across[0].bbox[2], "the covering wraps"
    assert across[0].geometry_extent == (-179.0, 10.0, 179.0, 13.0)
    Committer(table).commit(BatchCommit("w", 0, {"t": {0: (0, 1)}}, tuple(across)))
    Committer(table).commit(BatchCommit("w", 1, {"t": {0: (10, 10)}}, tuple(east)))
    table.refresh()

    con = duckdb_connection()
    scan = f"iceberg_scan('{table.metadata_location}')"
    everything = con.execute(f"SELECT event_id, ST_AsWKB(geometry) FROM {scan}").fetchall()
    for box in ((179.2, 5, 180, 15), (-180, 5, -178.8, 15), (0, 5, 20, 15), (100, 5, 120, 15), (100, 50, 120, 60)):
        expected = sorted(
            i
            for i, wkb in everything
            if shapely.box(*shapely.from_wkb(bytes(wkb)).bounds).intersects(shapely.box(*box))
        )
        _, rows = files_read(con, f"SELECT event_id FROM {scan} WHERE geometry && ST_MakeEnvelope{box} ORDER BY 1")
        assert [r[0] for r in rows] == expected, box
    count, _ = files_read(con, f"SELECT event_id FROM {scan} WHERE geometry && ST_MakeEnvelope(100, 50, 120, 60)")
    assert count == 0  # still pruned where nothing can be


def test_a_committed_files_metrics_are_what_iceberg_java_reads_from_its_footer(catalog):
    """The committer hands Iceberg the metrics its writer recorded instead of having Iceberg Java read
    each footer again: they must be the footer's, and the geometry bounds Iceberg's own encoding."""
    from streaming.table.catalog import create_table
    from streaming.table.native import geometry_bound, native_table

    contract = native_contract()
    table, _ = create_table(catalog, contract)
    handle = native_table(table)
    files = written(table, contract, decoded(contract, 0, [point(2.5, 48.1), line((-3.0, 40.0), (7.25, 51.5))]))
    handle.append(files, contract.geometry.id, {}, None)
    iceberg = handle.java.iceberg
    manifest = handle.table.currentSnapshot().dataManifests(handle.table.io()).get(0)
    committed = iceberg.ManifestFiles.read(manifest, handle.table.io(), handle.table.specs()).iterator().next()
    footer = iceberg.parquet.ParquetUtil.fileMetrics(
        handle.table.io().newInputFile(committed.location()), iceberg.MetricsConfig.forTable(handle.table)
    )

    def plain(java_map, skip=()) -> dict:
        return {
            int(k): bytes(v.array()) if hasattr(v, "array") else int(v)
            for k, v in dict(java_map or {}).items()
            if int(k) not in skip
        }

    assert int(committed.recordCount()) == int(footer.recordCount()) == 2
    for name in ("valueCounts", "nullValueCounts", "nanValueCounts", "columnSizes"):
        assert plain(getattr(committed, name)()) == plain(getattr(footer, name)()), name
    geometry = contract.geometry.id
    for name in ("lowerBounds", "upperBounds"):
        assert plain(getattr(committed, name)(), {geometry}) == plain(getattr(footer, name)(), {geometry}), name
    geometry_type = handle.table.schema().findType(geometry)
    bound = iceberg.geospatial.GeospatialBound
    expected_low = iceberg.types.Conversions.toByteBuffer(geometry_type, bound.createXY(-3.0, 40.0))
    expected_high = iceberg.types.Conversions.toByteBuffer(geometry_type, bound.createXY(7.25, 51.5))
    assert geometry_bound(-3.0, 40.0) == bytes(expected_low.array())
    assert plain(committed.lowerBounds())[geometry] == geometry_bound(-3.0, 40.0)
    assert plain(committed.upperBounds())[geometry] == bytes(expected_high.array())


def test_table_evolve_changes_a_native_tables_columns_and_spec_in_one_commit_and_rows_follow(catalog):
    """Rename, widen, make optional, drop, add and a new partition spec, made by Iceberg Java in one
    commit with the ids the contract gives; batches before and after read back by DuckDB."""
    from streaming.table.catalog import create_table
    from streaming.table.commit import BatchCommit, Committer
    from streaming.table.evolve import CONTRACT_PROPERTY, apply_evolution
    from tests.streaming.table.test_evolve import base_raw, events, evolved_raw

    def native(raw: dict, partition: list[str]) -> Contract:
        return parse_contract({**raw, "geometry": {**raw["geometry"], "native": True}, "partition": partition})

    before = native(base_raw(), ["day(event_time)"])
    table, _ = create_table(catalog, before)
    Committer(table).commit(BatchCommit("w", 0, {"t": {3: (0, 29)}}, written(table, before, events(before, 0))))
    after = native(evolved_raw(), ["hour(event_time)"])
    snapshot = catalog.load_table(after.table).current_snapshot().snapshot_id

    changes = [c.to_json() for c in apply_evolution(catalog.load_table(after.table), after)]

    assert {"change": "add", "id": 15, "column": "heading", "type": "double"} in changes
    assert {"change": "rename", "id": 3, "column": "kind", "to": "category"} in changes
    assert {"change": "partition-add", "field": "event_time_hour", "transform": "hour"} in changes
    assert {"change": "partition-remove", "field": "event_time_day", "transform": "day"} in changes
    table = catalog.load_table(after.table)
    assert table.metadata.format_version == 3 and table.current_snapshot().snapshot_id == snapshot
    fields = {f.field_id: (f.name, str(f.field_type), f.required) for f in table.schema().fields}
    assert fields[3][0] == "category" and 6 not in fields and fields[15] == ("heading", "double", False)
    assert fields[5] == ("speed", "double", False) and fields[7] == ("source_partition", "long", False)
    assert [str(f.transform) for f in table.spec().fields] == ["hour"]
    assert table.properties[CONTRACT_PROPERTY] == after.table_properties()[CONTRACT_PROPERTY]

    Committer(table).commit(BatchCommit("w", 1, {"t": {3: (30, 59)}}, written(table, after, events(after, 30))))
    scan = f"iceberg_scan('{catalog.load_table(after.table).metadata_location}')"
    found = duckdb_connection().execute(f"SELECT event_id, category, heading FROM {scan} ORDER BY event_id").fetchall()
    assert len(found) == 60 and found[0] == ("e000", "k0", None) and found[-1] == ("e059", "k59", 59.0)


def test_an_evolve_planned_on_a_native_table_that_changed_meanwhile_changes_nothing(catalog, monkeypatch):
    import streaming.table.evolve as evolve_module
    from streaming.table.catalog import create_table
    from streaming.table.evolve import EvolutionError, apply_evolution
    from tests.streaming.table.test_evolve import base_raw, evolved_raw

    def native(raw: dict) -> Contract:
        return parse_contract({**raw, "geometry": {**raw["geometry"], "native": True}})

    table, _ = create_table(catalog, native(base_raw()))
    real = evolve_module._commit_native

    def after_another_commit(table, changes, staged):
        from streaming.table.native import native_table

        # another writer commits between the plan and the evolve's commit
        native_table(table).table.updateProperties().set("touched", "meanwhile").commit()
        return real(table, changes, staged)

    monkeypatch.setattr(evolve_module, "_commit_native", after_another_commit)
    with pytest.raises(EvolutionError, match="it changed while the evolve ran"):
        apply_evolution(table, native(evolved_raw()))
    assert catalog.load_table(table.name()).schema().find_field(3).name == "kind", "nothing changed"


def test_a_native_commit_waits_out_another_writer_holding_the_sqlite_catalog(catalog, monkeypatch):
    """Another writer's transaction holds the SQLite catalog for 6 s (longer than its JDBC driver
    waits by default) just as Iceberg Java commits (the lock taken for real, from this process):
    the commit waits, then lands once."""
    import sqlite3
    import threading

    import streaming.table.commit as commit_module
    from streaming.table.catalog import create_table
    from streaming.table.commit import BatchCommit, Committer

    contract = native_contract()
    table, _ = create_table(catalog, contract)
    files = written(table, contract, decoded_points(contract, 0, 2.0, 48.0))
    holder = sqlite3.connect(
        catalog.properties["uri"].removeprefix("sqlite:///"), isolation_level=None, check_same_thread=False
    )
    real_native_table = commit_module.native_table

    def locked_before_the_commit(pyiceberg_table):
        handle = real_native_table(pyiceberg_table)
        holder.execute("BEGIN EXCLUSIVE")
        threading.Timer(6.0, lambda: holder.execute("COMMIT")).start()
        return handle

    monkeypatch.setattr(commit_module, "native_table", locked_before_the_commit)
    outcome = Committer(table).commit(BatchCommit("w", 0, {"t": {0: (0, 39)}}, files))
    assert outcome.status == "committed" and outcome.duration_s >= 5.5
    table.refresh()
    assert [s.summary["geoingest.batch-id"] for s in table.metadata.snapshots] == ["0"]


def test_a_native_table_has_the_partition_specs_a_v2_table_of_its_contract_has(catalog):
    """Every kind of partition field (a time transform, a geohash cell, a bucket, a truncate): the
    v3 table Iceberg Java makes holds the specs pyiceberg makes for the v2 table of the same contract."""
    from streaming.table.catalog import create_table

    raw = json.loads(CONTRACT_PATH.read_text())
    raw["partition"] = ["day(event_time)", "geohash(geometry, 1)", "bucket(4, event_id)", "truncate(1, kind)"]
    v2, _ = create_table(catalog, parse_contract({**raw, "table": "demo.v2"}))
    raw["geometry"]["native"] = True
    v3, _ = create_table(catalog, parse_contract({**raw, "table": "demo.v3"}))

    def specs(table) -> dict:
        return {
            spec_id: [(f.source_id, f.field_id, str(f.transform), f.name) for f in spec.fields]
            for spec_id, spec in table.specs().items()
        }

    assert specs(v3) == specs(v2) and len(specs(v3)[1]) == 4


def test_a_native_table_without_its_covering_answers_queries_as_one_with_it_pruned_by_its_geometry_bounds(tmp_path):
    """`bbox.stored: false`: the same rows written to a v3 table with the covering and to one
    without. `geoingest query` returns the same rows from both, for windows in Europe, the Pacific,
    on either side of the anti-meridian (lines across it, read the short way) and where nothing is;
    the one without reads its files' bounds from the manifests' geometry bounds."""
    from streaming.read.inspect import file_extents
    from streaming.read.predicate import Predicate
    from streaming.read.query import query
    from streaming.table.catalog import create_table, open_catalog
    from streaming.table.commit import BatchCommit, Committer

    raw = json.loads(CONTRACT_PATH.read_text())
    raw["geometry"]["native"] = True
    tables = {}
    for covering in (True, False):
        contract = parse_contract({**raw, "bbox": raw["bbox"] if covering else {"stored": False}})
        root = tmp_path / ("bbox" if covering else "no-bbox")
        catalog = open_catalog(
            "test", {"type": "sql", "uri": f"sqlite:///{root}.db", "warehouse": f"file://{root}/warehouse"}
        )
        table, _ = create_table(catalog, contract)
        groups = [
            decoded_points(contract, 0, 2.0, 48.0),
            decoded_points(contract, 100, -120.0, -40.0),
            decoded(contract, 200, [line((179.0, 10.0), (-179.0, 11.0)), line((178.5, 12), (-178.5, 13))]),
        ]
        for batch, rows in enumerate(groups):
            Committer(table).commit(
                BatchCommit("w", batch, {"t": {0: (batch * 100, batch * 100)}}, written(table, contract, rows))
            )
        table.refresh()
        tables[covering] = table

    without = tables[False]
    assert "bbox" not in without.schema().column_names and "bbox" in tables[True].schema().column_names
    layout = file_extents(without)
    assert len(layout.files) == 3 and all(f.bbox is not None for f in layout.files)
    for f in layout.files:
        parquet = pq.ParquetFile(f.path.removeprefix("file://"))
        assert "bbox" not in parquet.schema_arrow.names
        assert "covering" not in json.loads(parquet.metadata.metadata[b"geo"])["columns"]["geometry"]

    windows = {
        (0, 40, 20, 60): 1,
        (-125, -45, -110, -30): 1,
        (179.2, 5, 180, 15): 1,
        (-180, 5, -178.8, 15): 1,
        (100, 50, 120, 60): 0,
    }
    for box, files in windows.items():
        found = {covering: query(table, Predicate.from_bbox(box)) for covering, table in tables.items()}
        ids = {covering: sorted(r.table.column("event_id").to_pylist()) for covering, r in found.items()}
        assert ids[False] == ids[True], box
        assert (len(ids[False]) > 0) == (files > 0), box
        assert found[False].stats.files_scanned == files, box

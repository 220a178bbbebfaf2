"""Can DuckDB prune the files of a geoingest table, and what does it cost the other readers?

DuckDB 1.5.5's iceberg_scan prunes data files on the manifest bounds of top-level columns, not on
those of fields nested in a struct, and the GeoParquet 1.1 covering is the struct `bbox`. The same
skewed city points are written as three tables, Hilbert-sorted, with the project's writer:

- `nested`: the table as geoingest writes it by default (bounds on bbox.xmin .. bbox.ymax only);
- `flat`: the contract's `bbox.flat_columns`, the covering's values again as top-level columns
  bbox_xmin .. bbox_ymax (GeoParquet allows extra columns), with their own manifest bounds;
- `partition`: an identity partition on a coarse Hilbert cell (a top-level int column, files cut
  at cell boundaries); a query names the cells its window overlaps, which the client computes.

For windows of 0.1 % of the data extent it reports the files DuckDB reads (EXPLAIN ANALYZE's
"Total Files Read") and its query time, and for every table the bytes on disk, the writer's
rows/s, pyiceberg's scan planning and read, `geoingest query` and (unless --no-spark) Spark's
Iceberg reader with the same filter. Every reader's answer is checked against brute force.

Writes bench/results/duckdb_pruning.json.

    .venv/bin/python bench/duckdb_pruning.py [--points 1000000] [--windows 20] [--no-spark]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import shapely
from cities import city_points  # bench/cities.py, beside this script
from pruning import decoded_wkb  # bench/pruning.py: the same decoded WKB rows
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThanOrEqual
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.typedef import Record

from streaming.contract import Contract, parse_contract
from streaming.decode.decoder import HILBERT
from streaming.kernels.hilbert import grid_cells, hilbert_distance
from streaming.read.query import query_bbox
from streaming.table.catalog import create_table, open_catalog
from streaming.table.commit import to_data_file
from streaming.write.data_files import DataFileRecord, GeoParquetWriter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.conftest: DuckDB with the extensions of its wheels
RESULTS = ROOT / "bench" / "results"
WINDOW_FRACTION = 0.001
ROW_GROUP_ROWS = 16_384
TARGET_FILE_BYTES = 3 * 1024 * 1024  # ~60k points a file: enough files for pruning to show
PARTITION_LEVEL = 3  # Hilbert cells of 1/8 of the extent a side: 64 partition values
PARTITION_COLUMN = "hilbert_cell"
WRITE_REPEATS = 2  # the faster write of each table is kept (2 cores shared with other work)
VARIANTS = ("nested", "flat", "partition")


def contract_for(variant: str) -> Contract:
    raw = json.loads((ROOT / "schemas" / "demo_events.json").read_text())
    raw["clustering"].update(row_group_rows=ROW_GROUP_ROWS, target_file_bytes=TARGET_FILE_BYTES)
    raw["partition"] = []  # this bench partitions its own way (below)
    if variant == "flat":
        raw["bbox"]["flat_columns"] = True
    if variant == "partition":
        # One more top-level column before the geometry: the ids after it move up by one.
        raw["columns"].append({"id": 9, "name": PARTITION_COLUMN, "type": "int", "from": ["kafka.partition"]})
        raw["geometry"]["id"], raw["bbox"]["id"] = 10, 11
    return parse_contract(raw)


def decoded_points(contract: Contract, n: int) -> pa.Table:
    x, y = city_points(n, seed=3, jitter_deg=0.08, bounds=(-180, -89.9, 180, 89.9))
    return decoded_wkb(contract, shapely.points(x, y)).sort_by(HILBERT)


def cells_of(x: np.ndarray, y: np.ndarray, extent) -> np.ndarray:
    ix, iy = grid_cells(x, y, extent, PARTITION_LEVEL)
    return hilbert_distance(ix, iy, PARTITION_LEVEL).astype(np.int32)


def window_cells(window, extent) -> list[int]:
    """The partition cells a window overlaps. Rows are keyed by their bbox centre, so this is
    exact for points; geometries with extent would need the window grown by their half-size."""
    x0, y0, x1, y1 = window
    (ix0, ix1), (iy0, iy1) = grid_cells(np.array([x0, x1]), np.array([y0, y1]), extent, PARTITION_LEVEL)
    gx, gy = np.meshgrid(np.arange(ix0, ix1 + 1), np.arange(iy0, iy1 + 1))
    return sorted(set(hilbert_distance(gx.ravel(), gy.ravel(), PARTITION_LEVEL).tolist()))


def write_files(
    table: Table, contract: Contract, rows: pa.Table, variant: str
) -> list[tuple[DataFileRecord, int | None]]:
    """The rows as data files, with their partition value (None when unpartitioned)."""
    data = f"{table.location()}/data"
    prefix = f"{variant}-{uuid.uuid4().hex[:8]}"
    if variant != "partition":
        writer = GeoParquetWriter(contract, table.properties, table.io.properties, data, prefix)
        return [(r, None) for r in writer.write(rows.to_batches(max_chunksize=ROW_GROUP_ROWS))]
    # Hilbert-sorted rows hold each cell as one run: cut the files at the run boundaries.
    cells = rows.column(PARTITION_COLUMN).to_numpy()
    starts = np.flatnonzero(np.r_[True, cells[1:] != cells[:-1]])
    ends = np.r_[starts[1:], len(cells)]
    out = []
    for start, end in zip(starts, ends):
        cell = int(cells[start])
        writer = GeoParquetWriter(
            contract, table.properties, table.io.properties, f"{data}/{PARTITION_COLUMN}={cell}", prefix
        )
        piece = rows.slice(start, end - start)
        out += [(r, cell) for r in writer.write(piece.to_batches(max_chunksize=ROW_GROUP_ROWS))]
    return out


def commit(table: Table, files: list[tuple[DataFileRecord, int | None]]) -> None:
    spec_id = table.metadata.default_spec_id
    with table.transaction() as tx:
        with tx.update_snapshot().fast_append() as append:
            for record, cell in files:
                if cell is None:
                    append.append_data_file(to_data_file(record, spec_id))
                    continue
                append.append_data_file(
                    DataFile.from_args(
                        content=DataFileContent.DATA,
                        file_path=record.path,
                        file_format=FileFormat.PARQUET,
                        partition=Record(cell),
                        file_size_in_bytes=record.file_size_in_bytes,
                        record_count=record.record_count,
                        spec_id=spec_id,
                        **record.statistics(),
                    )
                )


def build(variant: str, n: int, workdir: Path) -> dict:
    contract = contract_for(variant)
    rows = decoded_points(contract, n)
    if variant == "partition":
        bbox = rows.column(contract.bbox_name).combine_chunks()
        cx = (bbox.field("xmin").to_numpy() + bbox.field("xmax").to_numpy()) / 2
        cy = (bbox.field("ymin").to_numpy() + bbox.field("ymax").to_numpy()) / 2
        cells = cells_of(cx, cy, contract.clustering.extent)
        rows = rows.set_column(rows.schema.get_field_index(PARTITION_COLUMN), PARTITION_COLUMN, pa.array(cells))
        # Equal cells together, Hilbert order within (already so when cells are Hilbert prefixes).
        rows = rows.take(pa.array(np.lexsort((rows.column(HILBERT).to_numpy(), cells))))
    catalog = open_catalog(
        variant, {"type": "sql", "uri": f"sqlite:///{workdir}/{variant}.db", "warehouse": f"file://{workdir}/{variant}"}
    )
    table, _ = create_table(catalog, contract)
    if variant == "partition":
        with table.update_spec() as spec:
            spec.add_identity(PARTITION_COLUMN)
    write_s, files = [], []
    for _ in range(WRITE_REPEATS):
        for record, _cell in files:  # the files of the slower repeat are not committed
            table.io.delete(record.path)
        started = time.perf_counter()
        files = write_files(table, contract, rows, variant)
        write_s.append(time.perf_counter() - started)
    commit(table, files)
    table = catalog.load_table(contract.table)
    return {
        "contract": contract,
        "table": table,
        "rows": rows.num_rows,
        "files": len(files),
        "bytes_on_disk": sum(r.file_size_in_bytes for r, _ in files),
        "write_rows_per_s": rows.num_rows / min(write_s),
    }


# -- readers ------------------------------------------------------------------------------------
def duckdb_where(variant: str, window, extent) -> str:
    x0, y0, x1, y1 = (float(v) for v in window)
    prefix = "bbox_" if variant == "flat" else "bbox."
    where = f"{prefix}xmin <= {x1!r} AND {prefix}xmax >= {x0!r} AND {prefix}ymin <= {y1!r} AND {prefix}ymax >= {y0!r}"
    if variant == "partition":
        where = f"{PARTITION_COLUMN} IN ({', '.join(map(str, window_cells(window, extent)))}) AND {where}"
    return f"{where} AND ST_Intersects(ST_GeomFromWKB(geometry), ST_MakeEnvelope({x0!r}, {y0!r}, {x1!r}, {y1!r}))"


def measure_duckdb(built: dict, variant: str, windows: np.ndarray, expected: list[int]) -> dict:
    from tests.conftest import duckdb_connection

    con = duckdb_connection()
    con.execute("SET enable_geoparquet_conversion = false")
    scan = f"iceberg_scan('{built['table'].metadata_location}')"
    extent = built["contract"].clustering.extent
    files_read, seconds = [], []
    for window, want in zip(windows, expected):
        sql = f"SELECT count(*) FROM {scan} WHERE {duckdb_where(variant, window, extent)}"
        plan = "\n".join(row[1] for row in con.execute(f"EXPLAIN ANALYZE {sql}").fetchall())
        files_read.append(int(re.search(r"Total Files Read: (\d+)", plan).group(1)))
        started = time.perf_counter()
        got = con.execute(sql).fetchone()[0]
        seconds.append(time.perf_counter() - started)
        assert got == want, (variant, window, got, want)
    return {"files_read_per_window": float(np.mean(files_read)), "query_ms_median": _ms(seconds)}


def measure_pyiceberg(built: dict, variant: str, windows: np.ndarray, expected: list[int]) -> dict:
    """pyiceberg's scan with the bbox filter: files planned, planning and read time (the read is
    of the candidate rows, whose bbox overlaps the window; for points that is the answer)."""
    prefix = "bbox_" if variant == "flat" else "bbox."
    planned, plan_s, read_s = [], [], []
    for (x0, y0, x1, y1), want in zip(windows, expected):
        row_filter = And(
            LessThanOrEqual(f"{prefix}xmin", float(x1)),
            GreaterThanOrEqual(f"{prefix}xmax", float(x0)),
            LessThanOrEqual(f"{prefix}ymin", float(y1)),
            GreaterThanOrEqual(f"{prefix}ymax", float(y0)),
        )
        scan = built["table"].scan(row_filter=row_filter, selected_fields=("event_id",))
        started = time.perf_counter()
        tasks = list(scan.plan_files())
        plan_s.append(time.perf_counter() - started)
        planned.append(len(tasks))
        started = time.perf_counter()
        got = scan.to_arrow().num_rows
        read_s.append(time.perf_counter() - started)
        assert got == want, (variant, "pyiceberg", got, want)
    return {
        "files_planned_per_window": float(np.mean(planned)),
        "plan_ms_median": _ms(plan_s),
        "read_ms_median": _ms(read_s),
    }


def measure_geoingest(built: dict, windows: np.ndarray, expected: list[int]) -> dict:
    scanned, seconds = [], []
    for window, want in zip(windows, expected):
        started = time.perf_counter()
        result = query_bbox(built["table"], tuple(float(v) for v in window))
        seconds.append(time.perf_counter() - started)
        scanned.append(result.stats.files_scanned)
        assert result.stats.rows_matched == want, ("geoingest", window, result.stats.rows_matched, want)
    return {"files_scanned_per_window": float(np.mean(scanned)), "query_ms_median": _ms(seconds)}


def measure_spark(tables: dict[str, dict], windows: np.ndarray, expected: list[int], workdir: Path) -> dict:
    """Spark's Iceberg reader (iceberg-spark-runtime, as bench/plain_stack.py resolves it), the
    table loaded from its metadata file, the same bbox filter (and the cells for `partition`)."""
    from plain_stack import plain_stack_jars  # bench/plain_stack.py

    from app.settings import load_settings
    from app.spark import spark_session

    cache_dir = load_settings(env={}).cache_dir
    spark = spark_session("local[2]", cache_dir, extra_jars=plain_stack_jars(cache_dir), app_name="duckdb-pruning")
    out = {}
    try:
        for variant, built in tables.items():
            frame = spark.read.format("iceberg").load(built["table"].metadata_location)
            extent = built["contract"].clustering.extent
            prefix = "bbox_" if variant == "flat" else "bbox."
            seconds = []
            for window, want in zip(windows, expected):
                x0, y0, x1, y1 = (float(v) for v in window)
                condition = f"{prefix}xmin <= {x1!r} AND {prefix}xmax >= {x0!r} AND {prefix}ymin <= {y1!r} AND {prefix}ymax >= {y0!r}"
                if variant == "partition":
                    cells = ", ".join(map(str, window_cells((x0, y0, x1, y1), extent)))
                    condition = f"{PARTITION_COLUMN} IN ({cells}) AND {condition}"
                frame.where(condition).count()  # warm: the first query of a table compiles
                started = time.perf_counter()
                got = frame.where(condition).count()
                seconds.append(time.perf_counter() - started)
                assert got == want, (variant, "spark", got, want)
            out[variant] = {"count_ms_median": _ms(seconds)}
    finally:
        spark.stop()
    return out


def _ms(seconds: list[float]) -> float:
    return round(1000 * float(np.median(seconds)), 1)


def random_windows(rows: pa.Table, count: int) -> np.ndarray:
    bbox = rows.column("bbox").combine_chunks()
    bounds = np.column_stack([bbox.field(f).to_numpy() for f in ("xmin", "ymin", "xmax", "ymax")])
    area = (bounds[:, 2].max() - bounds[:, 0].min()) * (bounds[:, 3].max() - bounds[:, 1].min())
    half = np.sqrt(WINDOW_FRACTION * area) / 2
    centres = bounds[np.random.default_rng(9).choice(len(bounds), count), :2]
    return np.column_stack([centres - half, centres + half])


def brute_force_counts(rows: pa.Table, windows: np.ndarray) -> list[int]:
    geometries = shapely.from_wkb(rows.column("geometry").to_numpy(zero_copy_only=False))
    tree = shapely.STRtree(geometries)
    return [len(tree.query(shapely.box(*w), predicate="intersects")) for w in windows]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--spark-windows", type=int, default=5)
    parser.add_argument("--no-spark", action="store_true")
    args = parser.parse_args()

    results: dict = {
        "points": args.points,
        "window": f"{WINDOW_FRACTION * 100:g} % of the data extent, centred on data",
        "windows": args.windows,
        "row_group_rows": ROW_GROUP_ROWS,
        "target_file_bytes": TARGET_FILE_BYTES,
        "partition": f"identity on a Hilbert cell of level {PARTITION_LEVEL} ({4**PARTITION_LEVEL} cells)",
        "duckdb": "1.5.5, iceberg_scan of the current metadata file, SET enable_geoparquet_conversion = false",
        "tables": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        tables: dict[str, dict] = {}
        for variant in VARIANTS:
            tables[variant] = build(variant, args.points, workdir)
            print(variant, "written:", tables[variant]["files"], "files", flush=True)
        reference = tables["nested"]["table"].scan().to_arrow()
        windows = random_windows(reference, args.windows)
        expected = brute_force_counts(reference, windows)
        for variant, built in tables.items():
            entry = {
                "files": built["files"],
                "bytes_on_disk": built["bytes_on_disk"],
                "bytes_per_row": round(built["bytes_on_disk"] / built["rows"], 2),
                "write_rows_per_s": round(built["write_rows_per_s"]),
                "duckdb": measure_duckdb(built, variant, windows, expected),
                "pyiceberg": measure_pyiceberg(built, variant, windows, expected),
                "geoingest_query": measure_geoingest(built, windows, expected),
            }
            results["tables"][variant] = entry
            print(variant, json.dumps(entry), flush=True)
        if not args.no_spark:
            spark_windows = windows[: args.spark_windows]
            try:
                spark = measure_spark(tables, spark_windows, expected[: args.spark_windows], workdir)
            except Exception as exc:  # a missing jar or Java must not lose the other figures
                results["spark_error"] = f"{type(exc).__name__}: {exc}"[:500]
            else:
                results["spark_windows"] = len(spark_windows)
                for variant, figures in spark.items():
                    results["tables"][variant]["spark"] = figures
    base = results["tables"]["nested"]
    for entry in results["tables"].values():
        entry["vs_nested"] = {
            "bytes_on_disk": round(entry["bytes_on_disk"] / base["bytes_on_disk"], 3),
            "write_rows_per_s": round(entry["write_rows_per_s"] / base["write_rows_per_s"], 3),
        }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "duckdb_pruning.json").write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)


def print_table(results: dict) -> None:
    print(
        "| table | files | DuckDB files read per window | DuckDB ms | bytes on disk (vs nested) | write rows/s (vs nested) "
        "| pyiceberg files planned / plan ms / read ms | geoingest query files / ms | Spark count ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for variant, e in results["tables"].items():
        p, g = e["pyiceberg"], e["geoingest_query"]
        spark = e.get("spark", {}).get("count_ms_median", "-")
        print(
            f"| {variant} | {e['files']} | {e['duckdb']['files_read_per_window']:.2f} | {e['duckdb']['query_ms_median']} "
            f"| {e['bytes_on_disk']:,} ({e['vs_nested']['bytes_on_disk']}x) "
            f"| {e['write_rows_per_s']:,} ({e['vs_nested']['write_rows_per_s']}x) "
            f"| {p['files_planned_per_window']:.2f} / {p['plan_ms_median']} / {p['read_ms_median']} "
            f"| {g['files_scanned_per_window']:.2f} / {g['query_ms_median']} | {spark} |"
        )


if __name__ == "__main__":
    main()

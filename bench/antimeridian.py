"""Windows near the anti-meridian, before and after its short-way reading.

The same rows (points over the world, dense Pacific traffic on both sides of ±180, tracks across
it and tracks beside it) are ingested twice through the decoder and the writer and committed
to a SQLite-backed Iceberg table: once with the contract's `geometry.antimeridian = "planar"`
(the bounds every version before this one stored: a track from 179.9 to -179.9 is a box the
width of the world, its Hilbert key mid-map) and once with "short" (a wrapped box, xmin > xmax,
its key near 180, kept in files of its own). For windows of 0.1 % of the world near ±180, a third
of them across it, `geoingest query`'s planning is measured: files and row groups read, rows
read, and wrong answers against the brute force on the geometries cut at 180. The planar table
cannot take a window across ±180 (xmin > xmax): it is asked for the window's two halves, and
both queries are counted.

Writes bench/results/antimeridian.json and antimeridian.md.

    .venv/bin/python bench/antimeridian.py [--points 200000] [--windows 60]
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

from streaming.contract import load_contract
from streaming.decode.decoder import HILBERT, REJECT_REASON, Decoder
from streaming.kernels.antimeridian import split_at_antimeridian
from streaming.read.query import query_bbox
from streaming.table.catalog import create_table, open_catalog
from streaming.table.commit import BatchCommit, Committer
from streaming.write.data_files import GeoParquetWriter

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ROW_GROUP_ROWS = 4096
FILE_ROWS = 2 * ROW_GROUP_ROWS
WINDOW_FRACTION = 0.001  # of the world's 360 x 180 degrees


def geometries(rng: np.random.Generator, points: int) -> tuple[np.ndarray, int]:
    """Points (half worldwide, half in the Pacific within 10 degrees of ±180), and tracks: one
    in 20 rows crosses ±180 (179..179.99 to -179.99..-179), as many run beside it."""
    world = points // 2
    pacific = points - world
    x = np.r_[rng.uniform(-180, 180, world), rng.uniform(170, 190, pacific)]
    x = np.where(x > 180, x - 360, x)
    y = np.r_[rng.uniform(-80, 80, world), rng.uniform(-60, 60, pacific)]
    out = list(shapely.points(x, y))
    tracks = points // 20
    ty = rng.uniform(-60, 60, tracks)
    x0, x1 = rng.uniform(179.0, 179.99, tracks), rng.uniform(-179.99, -179.0, tracks)
    out += list(shapely.linestrings(np.stack([np.c_[x0, ty], np.c_[x1, ty + rng.uniform(-0.3, 0.3, tracks)]], axis=1)))
    side = np.where(rng.random(tracks) < 0.5, -1.0, 1.0)
    a, b = rng.uniform(171.0, 179.9, tracks), rng.uniform(171.0, 179.9, tracks)
    out += list(shapely.linestrings(np.stack([np.c_[side * a, ty], np.c_[side * b, ty + 0.3]], axis=1)))
    return np.array(out, dtype=object), tracks


def decoded(contract, geoms: np.ndarray) -> pa.Table:
    n = len(geoms)
    raw = pa.table(
        {
            "key": pa.array([f"e{i}".encode() for i in range(n)], pa.binary()),
            "value": pa.array(shapely.to_wkb(geoms), pa.binary()),
            "topic": pa.array(np.full(n, "bench", dtype=object), pa.string()),
            "partition": pa.array(np.zeros(n, np.int32)),
            "offset": pa.array(np.arange(n, dtype=np.int64)),
            "timestamp": pa.array(np.zeros(n, np.int64), pa.timestamp("us")),
        }
    )
    decoder = Decoder(contract)
    out = pa.concat_tables(pa.Table.from_batches([decoder.decode(b)]) for b in raw.to_batches(max_chunksize=100_000))
    out = out.filter(pc.is_null(out.column(REJECT_REASON)))
    assert out.num_rows == n
    return out


def file_bytes_for(rows: pa.Table, contract) -> int:
    """The target file size that cuts the rows' first FILE_ROWS into one file: so both readings
    get files of about FILE_ROWS rows, cut by bytes as ingest cuts them."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.parquet"
        pq.write_table(
            rows.slice(0, FILE_ROWS).select(contract.data_file_schema.names),
            path,
            row_group_size=ROW_GROUP_ROWS,
            compression="zstd",
        )
        return path.stat().st_size


def build(reading: str, geoms: np.ndarray, workdir: Path, target_bytes: int | None = None):
    contract = load_contract(ROOT / "schemas" / "demo_events.json")
    contract = dataclasses.replace(
        contract,
        geometry=dataclasses.replace(contract.geometry, antimeridian=reading),
        source={**contract.source, "geometry": {**contract.source["geometry"], "antimeridian": reading}},
    )
    rows = decoded(contract, geoms).sort_by(HILBERT)
    target_bytes = target_bytes or file_bytes_for(rows, contract)
    contract = dataclasses.replace(
        contract,
        clustering=dataclasses.replace(
            contract.clustering, row_group_rows=ROW_GROUP_ROWS, target_file_bytes=target_bytes
        ),
    )
    catalog = open_catalog(
        reading, {"type": "sql", "uri": f"sqlite:///{workdir / reading}.db", "warehouse": f"file://{workdir / reading}"}
    )
    table, _ = create_table(catalog, contract)
    writer = GeoParquetWriter(contract, table.properties, table.io.properties, f"{table.location()}/data", reading)
    files = tuple(writer.write(rows.to_batches(max_chunksize=ROW_GROUP_ROWS)))
    Committer(table).commit(BatchCommit(reading, 0, {}, files))
    table.refresh()
    groups = sum(pq.read_metadata(f.path.removeprefix("file://")).num_row_groups for f in files)
    bbox = rows.column("bbox").combine_chunks()
    wrapped = int(pc.sum(pc.greater(bbox.field("xmin"), bbox.field("xmax"))).as_py())
    return table, len(files), groups, wrapped, target_bytes


def windows(rng: np.random.Generator, count: int) -> list[tuple[float, float, float, float]]:
    side = float(np.sqrt(WINDOW_FRACTION * 360 * 180))
    out = []
    for i in range(count):
        y = float(rng.uniform(-55, 55 - side))
        if i % 3 == 0:  # across ±180
            x0 = float(rng.uniform(180 - side + 0.01, 179.99))
            out.append((x0, y, x0 + side - 360.0, y + side))
        else:
            x0 = float(rng.uniform(170.0, 180.0 - side)) * (1 if i % 3 == 1 else -1)
            lo = min(x0, x0 + side if x0 > 0 else x0 - side)
            out.append((lo, y, lo + side, y + side))
    return out


def brute_force(split: np.ndarray, ids: np.ndarray, window) -> set[str]:
    xmin, ymin, xmax, ymax = window
    halves = [(xmin, ymin, 180.0, ymax), (-180.0, ymin, xmax, ymax)] if xmin > xmax else [window]
    hit = np.zeros(len(split), dtype=bool)
    for h in halves:
        hit |= shapely.intersects(split, shapely.box(*h))
    return set(ids[hit].tolist())


def measure(table, wins, reading: str, split: np.ndarray, ids: np.ndarray) -> dict:
    per = []
    for w in wins:
        parts = [w] if (reading == "short" or w[0] <= w[2]) else [(w[0], w[1], 180.0, w[3]), (-180.0, w[1], w[2], w[3])]
        files = groups = rows = 0
        got: set[str] = set()
        started = time.perf_counter()
        for p in parts:
            r = query_bbox(table, p)
            files += r.stats.files_scanned
            groups += r.stats.row_groups_scanned
            rows += r.stats.rows_read
            got |= set(r.table.column("event_id").to_pylist())
        elapsed = time.perf_counter() - started
        want = brute_force(split, ids, w)
        per.append(
            {
                "window": w,
                "across": w[0] > w[2],
                "files": files,
                "row_groups": groups,
                "rows_read": rows,
                "matched": len(got),
                "wrong_extra": len(got - want),
                "wrong_missing": len(want - got),
                "ms": elapsed * 1000,
            }
        )
    return {"windows": per}


def summary(per: list[dict], files_total: int, groups_total: int) -> dict:
    def mean(key, rows):
        return round(float(np.mean([w[key] for w in rows])), 2) if rows else None

    out = {}
    for name, rows in (
        ("all", per),
        ("across", [w for w in per if w["across"]]),
        ("beside", [w for w in per if not w["across"]]),
    ):
        out[name] = {
            "windows": len(rows),
            "files_read_mean": mean("files", rows),
            "files_read_fraction": round(mean("files", rows) / files_total, 4),
            "row_groups_read_mean": mean("row_groups", rows),
            "row_groups_read_fraction": round(mean("row_groups", rows) / groups_total, 4),
            "rows_read_mean": mean("rows_read", rows),
            "wrong_rows_total": int(sum(w["wrong_extra"] + w["wrong_missing"] for w in rows)),
            "query_ms_median": round(float(np.median([w["ms"] for w in rows])), 1),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=200_000)
    parser.add_argument("--windows", type=int, default=60)
    args = parser.parse_args()
    rng = np.random.default_rng(35)
    geoms, tracks = geometries(rng, args.points)
    ids = np.array([f"e{i}" for i in range(len(geoms))], dtype=object)
    split = split_at_antimeridian(geoms)
    wins = windows(np.random.default_rng(36), args.windows)
    guinea = (0.0, -5.0, 10.0, 5.0)
    results: dict = {
        "rows": len(geoms),
        "tracks_across": tracks,
        "row_group_rows": ROW_GROUP_ROWS,
        "file_rows": FILE_ROWS,
        "window_fraction": WINDOW_FRACTION,
        "readings": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        target_bytes = None
        for reading in ("planar", "short"):
            table, files_total, groups_total, wrapped, target_bytes = build(reading, geoms, Path(tmp), target_bytes)
            measured = measure(table, wins, reading, split, ids)
            g = measure(table, [guinea], reading, split, ids)["windows"][0]
            results["readings"][reading] = {
                "files_total": files_total,
                "row_groups_total": groups_total,
                "wrapped_rows": wrapped,
                "summary": summary(measured["windows"], files_total, groups_total),
                "gulf_of_guinea": {k: g[k] for k in ("files", "row_groups", "matched", "wrong_extra", "wrong_missing")},
                "windows": measured["windows"],
            }
            print(reading, json.dumps(results["readings"][reading]["summary"]["all"]))
    write_results(results)


def write_results(results: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "antimeridian.json").write_text(json.dumps(results, indent=2))
    lines = [
        f"Anti-meridian: {results['rows']:,} rows ({results['tracks_across']:,} tracks across ±180), "
        f"row groups of {results['row_group_rows']:,} rows, files cut at the bytes of {results['file_rows']:,} rows; windows of {results['window_fraction'] * 100:g} % of the world within 10 degrees of ±180",
        "",
        "| reading | windows | files (of total) | files read | row groups read | rows read | wrong rows | median ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for reading, r in results["readings"].items():
        for name in ("beside", "across", "all"):
            s = r["summary"][name]
            lines.append(
                f"| {reading} | {name} ({s['windows']}) | {r['files_total']} | {s['files_read_mean']} "
                f"({s['files_read_fraction'] * 100:.1f} %) | {s['row_groups_read_mean']} "
                f"({s['row_groups_read_fraction'] * 100:.1f} %) | {s['rows_read_mean']:,} | {s['wrong_rows_total']} | "
                f"{s['query_ms_median']} |"
            )
    lines.append("")
    for reading, r in results["readings"].items():
        g = r["gulf_of_guinea"]
        lines.append(
            f"- {reading}: {r['wrapped_rows']:,} wrapped boxes stored; the Gulf of Guinea window (0,-5,10,5) read "
            f"{g['files']} files, {g['row_groups']} row groups and returned {g['matched']} rows, "
            f"{g['wrong_extra']} of them wrong."
        )
    lines.append(
        "- planar: a window across ±180 is refused; it is counted here as its two halves, queried one after the "
        "other (a file both read counts twice)."
    )
    (RESULTS / "antimeridian.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

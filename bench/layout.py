"""Row group size and file size against write speed and pruning: the figures behind the defaults.

Pure pyarrow / shapely / numpy, no Spark or Kafka: skewed points are decoded, Hilbert-sorted and
written with GeoParquetWriter at several row group sizes; then windows of 0.1 % of the data extent,
centred on data, are answered with the query's own pruning. Prints a table and writes
bench/results/layout.json and layout.md.

    .venv/bin/python bench/layout.py [--points 1000000] [--windows 100]
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
import shapely
from cities import city_points  # bench/cities.py, beside this script

from streaming.contract import DEFAULT_TARGET_FILE_BYTES, load_contract
from streaming.decode.decoder import HILBERT, REJECT_REASON, Decoder
from streaming.read.query import query_bbox
from streaming.table.catalog import create_table, open_catalog
from streaming.table.commit import BatchCommit, Committer
from streaming.write.data_files import GeoParquetWriter

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ROW_GROUP_SIZES = (4_096, 16_384, 65_536, 262_144)


def skewed_wkb_points(n: int, seed: int = 1) -> pa.RecordBatch:
    x, y = city_points(n, seed, jitter_deg=0.05, bounds=(-180, -90, 180, 90))
    values = shapely.to_wkb(shapely.points(x, y))
    return pa.RecordBatch.from_pydict(
        {
            "key": pa.array([f"e{i}".encode() for i in range(n)]),
            "value": pa.array(values, pa.binary()),
            "topic": pa.array(["bench"] * n),
            "partition": pa.array(np.zeros(n, np.int32)),
            "offset": pa.array(np.arange(n)),
            "timestamp": pa.array(np.zeros(n, np.int64), pa.timestamp("us")),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--windows", type=int, default=100)
    args = parser.parse_args()

    contract = load_contract(ROOT / "schemas" / "demo_events.json")
    raw = skewed_wkb_points(args.points)
    decoded = pa.Table.from_batches([Decoder(contract).decode(raw)])
    decoded = decoded.filter(pc.is_null(decoded.column(REJECT_REASON))).sort_by(HILBERT)
    bbox = decoded.column("bbox").combine_chunks()
    data_extent = [
        pc.min(bbox.field("xmin")).as_py(),
        pc.min(bbox.field("ymin")).as_py(),
        pc.max(bbox.field("xmax")).as_py(),
        pc.max(bbox.field("ymax")).as_py(),
    ]
    rng = np.random.default_rng(5)
    centres = np.column_stack([bbox.field("xmin").to_numpy(), bbox.field("ymin").to_numpy()])[
        rng.choice(decoded.num_rows, args.windows)
    ]
    # 0.1 % of the data extent's area, as a square in degrees
    side = np.sqrt(0.001 * (data_extent[2] - data_extent[0]) * (data_extent[3] - data_extent[1]))

    rows = []
    for row_group_rows in ROW_GROUP_SIZES:
        with tempfile.TemporaryDirectory() as tmp:
            # The demo contract cuts small files to draw many; the default file size is what is measured.
            clustering = dataclasses.replace(
                contract.clustering, row_group_rows=row_group_rows, target_file_bytes=DEFAULT_TARGET_FILE_BYTES
            )
            variant = dataclasses.replace(contract, clustering=clustering)
            catalog = open_catalog(
                "bench", {"type": "sql", "uri": f"sqlite:///{tmp}/c.db", "warehouse": f"file://{tmp}/wh"}
            )
            table, _ = create_table(catalog, variant)
            writer = GeoParquetWriter(
                variant, table.properties, table.io.properties, f"{table.location()}/data", "bench"
            )
            started = time.perf_counter()
            files = tuple(writer.write(decoded.to_batches(max_chunksize=20_000)))
            write_s = time.perf_counter() - started
            Committer(table).commit(BatchCommit("bench", 0, {}, files))
            scanned = read = 0
            groups_total = 0
            started = time.perf_counter()
            for cx, cy in centres:
                stats = query_bbox(table, (cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2)).stats
                scanned += stats.row_groups_scanned
                groups_total = max(groups_total, stats.row_groups_total)
                read += stats.rows_read
            query_ms = (time.perf_counter() - started) * 1000 / len(centres)
            size = sum(f.file_size_in_bytes for f in files)
            rows.append(
                {
                    "row_group_rows": row_group_rows,
                    "files": len(files),
                    "write_rows_per_s": round(decoded.num_rows / write_s),
                    "bytes_per_row": round(size / decoded.num_rows, 2),
                    "row_groups_scanned_per_window": round(scanned / len(centres), 2),
                    "rows_read_per_window": round(read / len(centres)),
                    "query_ms_per_window": round(query_ms, 1),
                }
            )
            print(rows[-1], flush=True)

    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {
        "points": decoded.num_rows,
        "windows": args.windows,
        "window_fraction_of_data_extent": 0.001,
        "results": rows,
    }
    (RESULTS / "layout.json").write_text(json.dumps(report, indent=2))
    header = list(rows[0])
    lines = [
        f"Layout: {decoded.num_rows:,} skewed points, {args.windows} windows of 0.1 % of the data extent",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += [
        "| " + " | ".join(f"{r[h]:,}" if isinstance(r[h], int) else str(r[h]) for h in header) + " |" for r in rows
    ]
    (RESULTS / "layout.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

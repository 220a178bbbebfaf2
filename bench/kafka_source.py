"""Spark's Kafka source against the Python one (streaming/source/python_source.py), reading alone.

The same topic of N small GeoJSON events (bench/ingest.py's geojson-points, 4 partitions) is read
by each source as the service's query reads it: the options of streaming.job.config.kafka_source_options,
the columns of streaming.job.layout._source_columns (headers as JSON text), coalesced to the cores, each
batch handed to Python workers that only count its rows (bench/ingest.py, "Kafka source alone").
Each run is a fresh process with its own JVM (local[2], the same driver memory); it first drains
a warm-up topic the same way, then is measured from query start to the batch that brings the
count to N, under a processing-time trigger ("0 seconds": the next batch starts when the last one
is done, as under a backlog). Runs alternate between the sources, --repeats times each, and the
faster run of each is kept. Besides events/s: how busy the machine's cores were (/proc/stat) and
the CPU it took per event.

Writes bench/results/kafka_source.json (--results names it otherwise), the producer's settings in it:
--compression produces the topics with a paced producer's settings (bench/ingest.py's
producer_settings) and that compression, to measure what a producer's compression costs the source.

    .venv/bin/python bench/kafka_source.py [--events 400000] [--batch-sizes 1000000,40000] [--repeats 2]
        [--compression none|lz4|...] [--results kafka_source]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):  # run as a script: app/, streaming/ and bench/ingest.py
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import pyarrow as pa  # noqa: E402
from ingest import busy_cpu_seconds, make_events, producer_settings  # noqa: E402

from app.local.broker import LocalBroker, free_port  # noqa: E402
from app.local.sample import produce  # noqa: E402
from app.settings import load_settings  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MASTER = "local[2]"
DRIVER_MEMORY = "4g"
DATASET = "geojson-points"
SOURCES = ("spark", "python")


def source_child(spec: dict) -> dict:
    from app.service import configure_logging, start_spark
    from streaming.job.config import kafka_source_options
    from streaming.job.layout import _source_columns
    from streaming.source.python_source import python_kafka_stream

    configure_logging("WARNING")
    spark = start_spark(load_settings(env={}, spark_master=MASTER, driver_memory=DRIVER_MEMORY))
    cores = spark.sparkContext.defaultParallelism
    workdir = Path(spec["workdir"])

    def count_rows(batches):
        yield pa.record_batch({"n": pa.array([sum(b.num_rows for b in batches)], pa.int64())})

    def stream(topic: str):
        options = {
            **kafka_source_options(spec["bootstrap"], topic, cores),
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": str(spec["per_batch"]),
        }
        if spec["source"] == "python":
            return python_kafka_stream(spark, options)
        return spark.readStream.format("kafka").options(**options).load()

    def drain(topic: str, events: int) -> tuple[float, float, int]:
        counted = [0]
        done = threading.Event()

        def count(batch, _batch_id):
            rows = _source_columns(batch).coalesce(cores).mapInArrow(count_rows, "n long").collect()
            counted[0] += sum(r.n for r in rows)
            if counted[0] >= events:
                done.set()

        started, busy_at_start = time.monotonic(), busy_cpu_seconds()
        query = (
            stream(topic)
            .writeStream.foreachBatch(count)
            .trigger(processingTime=spec["trigger"])
            .option("checkpointLocation", str(workdir / f"checkpoint-{topic}"))
            .start()
        )
        while not done.wait(0.05):
            if not query.isActive:
                raise RuntimeError(f"the {spec['source']} source's query on {topic} stopped: {query.exception()}")
        elapsed, busy = time.monotonic() - started, busy_cpu_seconds() - busy_at_start
        query.stop()
        return elapsed, busy, counted[0]

    drain(spec["warmup_topic"], spec["warmup_events"])
    seconds, busy, counted = drain(spec["topic"], spec["events"])
    if counted != spec["events"]:
        raise RuntimeError(f"the {spec['source']} source read {counted} of {spec['events']} events")
    return {
        "seconds": round(seconds, 2),
        "events_per_s": round(spec["events"] / seconds),
        "cores_busy": round(busy / seconds, 2),
        "cpu_us_per_event": round(busy / spec["events"] * 1e6, 2),
    }


def run_child(spec: dict, workdir: Path) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "spec.json").write_text(json.dumps(spec))
    with open(workdir / "child.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(workdir / "spec.json")],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(ROOT),
            start_new_session=True,
        )
        try:
            process.wait(timeout=1800)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    result_path = workdir / "result.json"
    if process.returncode != 0 or not result_path.exists():
        tail = "\n".join((workdir / "child.log").read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"the {spec['source']} source's run exited with {process.returncode}:\n{tail}")
    return json.loads(result_path.read_text())


def produce_with(
    bootstrap: str, topic: str, events: Iterable, compression: str, partitions: int = 4, round_robin: bool = False
) -> None:
    """The events, with confluent-kafka at producer_settings(compression), into a topic of `partitions`:
    by their keys, or `round_robin` (the same count in every partition)."""
    from confluent_kafka import Producer
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()
    producer = Producer({"bootstrap.servers": bootstrap, **producer_settings(compression)})
    for i, event in enumerate(events):
        where = {"partition": i % partitions} if round_robin else {}
        while True:
            try:
                producer.produce(topic, event.value, event.key, **where)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120):
        raise RuntimeError(f"{topic}: events left unsent after 120 s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--batch-sizes", default="1000000,40000", help="maxOffsetsPerTrigger of each run")
    parser.add_argument("--trigger", default="0 seconds")
    parser.add_argument("--warmup-events", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each source, alternating; the faster kept")
    parser.add_argument(
        "--compression",
        default=None,
        choices=("none", "lz4", "zstd", "snappy", "gzip"),
        help="produce the topics with confluent-kafka and this compression.type (bench/ingest.py's "
        "producer_settings); default: the demo's producer (kafka-python, lz4)",
    )
    parser.add_argument("--results", default="kafka_source", help="bench/results/<results>.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(Path(args.child).read_text())
        (Path(spec["workdir"]) / "result.json").write_text(json.dumps(source_child(spec)))
        return

    tmp = Path(tempfile.mkdtemp(prefix="geoingest-bench-kafka-source-"))
    broker = LocalBroker(tmp / "broker", Path(load_settings(env={}).cache_dir), port=free_port())
    broker.ensure_jars()
    broker.start()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    report: dict = {
        "events": args.events,
        "dataset": DATASET,
        "master": MASTER,
        "trigger": args.trigger,
        "batch_sizes": batch_sizes,
        "producer": producer_settings(args.compression) if args.compression else "kafka-python, lz4, 256 KiB batches",
        "runs": {},
    }
    try:
        events = make_events(DATASET, args.events)
        warmup_topic = f"{DATASET}-warmup"
        for topic, sent in ((DATASET, events), (warmup_topic, events[: args.warmup_events])):
            if args.compression:
                produce_with(broker.bootstrap, topic, sent, args.compression)
            else:
                produce(broker.bootstrap, topic, sent, total=len(sent), progress=False)
        for per_batch in batch_sizes:
            for repeat in range(args.repeats):
                for source in SOURCES:
                    label = f"{source}-{per_batch}"
                    workdir = tmp / f"{label}-{repeat}"
                    spec = {
                        "source": source,
                        "bootstrap": broker.bootstrap,
                        "topic": DATASET,
                        "events": args.events,
                        "per_batch": per_batch,
                        "trigger": args.trigger,
                        "warmup_topic": warmup_topic,
                        "warmup_events": args.warmup_events,
                        "workdir": str(workdir),
                    }
                    run = run_child(spec, workdir)
                    print(label, json.dumps(run), flush=True)
                    kept = report["runs"].get(label)
                    if kept is None or run["events_per_s"] > kept["events_per_s"]:
                        report["runs"][label] = run
            spark_run, python_run = (report["runs"][f"{s}-{per_batch}"] for s in SOURCES)
            report.setdefault("python_vs_spark", {})[str(per_batch)] = {
                "events_per_s": round(python_run["events_per_s"] / spark_run["events_per_s"], 2),
                "cpu_per_event": round(python_run["cpu_us_per_event"] / spark_run["cpu_us_per_event"], 2),
            }
    finally:
        broker.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.results}.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report["python_vs_spark"]), flush=True)


if __name__ == "__main__":
    main()

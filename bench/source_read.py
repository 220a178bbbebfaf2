"""What reading Kafka costs the Python source, per event, against a bare librdkafka consumer, with
Spark out of the way: where the source's CPU goes.

A local broker; --events of bench/ingest.py's dataset in a 2-partition topic, sent by a confluent-kafka
producer with bench/ingest.py's producer settings (--compression). Then, in this one process, each
partition read from its first offset to its last, --repeats times each, as:

  bare consume          a librdkafka consumer (confluent-kafka) with the source's settings, its
                        messages consumed 10,000 at a time and dropped: the floor
  bare consume + Arrow  the same, each batch made the source's Arrow batch (key, value, topic,
                        partition, offset, timestamp)
  read_range            the source's own read (streaming/source/read.py: a pooled consumer, errors
                        and range ends sorted out, Arrow batches of the source's size)

CPU per event is the process's (librdkafka's threads included, time.process_time) and the
broker's (/proc/<pid>/stat) over the read, the best of the repeats; a first read of each kind
warms the consumer pool and the broker's page cache and is not counted. Prints a table and writes
bench/results/source_read.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ingest import make_events, producer_settings  # noqa: E402
from kafka_source import produce_with  # noqa: E402

from app.local.broker import LocalBroker  # noqa: E402
from app.local.process import free_port  # noqa: E402
from app.settings import load_settings  # noqa: E402
from streaming.source.options import SourceSettings  # noqa: E402
from streaming.source.read import _record_batch, close_pooled_consumers, read_range  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TOPIC = "source-read"
PARTITIONS = 2


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def readers(settings: SourceSettings, per_partition: int) -> dict[str, Callable[[], int]]:
    from confluent_kafka import Consumer, TopicPartition

    def bare(arrow: bool) -> int:
        read = 0
        for partition in range(PARTITIONS):
            consumer = Consumer(settings.consumer_config())
            consumer.assign([TopicPartition(TOPIC, partition, 0)])
            got = 0
            while got < per_partition:
                messages = [m for m in consumer.consume(num_messages=10_000, timeout=0.2) if m.error() is None]
                if arrow and messages:
                    messages = _record_batch(messages, [m.offset() for m in messages], TOPIC, partition, False)
                got += len(messages)
            consumer.close()
            read += got
        return read

    def source() -> int:
        return sum(
            batch.num_rows
            for partition in range(PARTITIONS)
            for batch in read_range(settings, TOPIC, partition, 0, per_partition)
        )

    return {"bare consume": lambda: bare(False), "bare consume + Arrow": lambda: bare(True), "read_range": source}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="geojson-points")
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compression", default="lz4")
    args = parser.parse_args()

    cache_dir = Path(load_settings(env=dict(os.environ)).cache_dir)
    broker = LocalBroker(Path(tempfile.mkdtemp()), cache_dir, port=free_port(), secure_port=free_port())
    broker.start()
    try:
        # The same count in each partition: every reader reads each partition to a known offset.
        produce_with(
            broker.bootstrap,
            TOPIC,
            make_events(args.dataset, args.events),
            args.compression,
            PARTITIONS,
            round_robin=True,
        )
        settings = SourceSettings.parse({"kafka.bootstrap.servers": broker.bootstrap, "subscribe": TOPIC})
        broker_pid = broker._process.pid()
        assert broker_pid is not None
        results = {}
        for name, read in readers(settings, args.events // PARTITIONS).items():
            read()  # warm-up, not counted
            best = None
            for _ in range(args.repeats):
                broker_cpu, cpu, wall = process_cpu_s(broker_pid), time.process_time(), time.monotonic()
                n = read()
                figures = {
                    "events": n,
                    "seconds": round(time.monotonic() - wall, 3),
                    "reader_cpu_us_per_event": round((time.process_time() - cpu) / n * 1e6, 2),
                    "broker_cpu_us_per_event": round((process_cpu_s(broker_pid) - broker_cpu) / n * 1e6, 2),
                }
                if best is None or figures["reader_cpu_us_per_event"] < best["reader_cpu_us_per_event"]:
                    best = figures
            results[name] = best
            print(name, json.dumps(best), flush=True)
        close_pooled_consumers()
    finally:
        broker.stop()
    meta = {
        "dataset": args.dataset,
        "events": args.events,
        "repeats": args.repeats,
        "producer": producer_settings(args.compression),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "source_read.json").write_text(json.dumps({"settings": meta, "results": results}, indent=2) + "\n")
    floor = results["bare consume"]["reader_cpu_us_per_event"]
    lines = [
        "# What reading Kafka costs the Python source",
        "",
        f"{args.events:,} {args.dataset} events, producer {meta['producer']}, best of {args.repeats}; "
        "CPU per event of this process (librdkafka's threads included) and of the broker.",
        "",
        "| read | events/s | reader CPU us/event | / bare consume | broker CPU us/event |",
        "|---|---|---|---|---|",
    ]
    for name, figures in results.items():
        rate = figures["events"] / figures["seconds"]
        lines.append(
            f"| {name} | {rate:,.0f} | {figures['reader_cpu_us_per_event']} | "
            f"{figures['reader_cpu_us_per_event'] / floor:.2f} | {figures['broker_cpu_us_per_event']} |"
        )
    (RESULTS / "source_read.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Many tables from one service against one table alone, at the same total of events.

One broker. Three shapes of the same `--events` GeoJSON point events:
  one      one topic of two partitions into one table;
  routed   `--tables` topics of one partition each, each routed to its own table by one pattern
           route (docs/routing.md): a streaming query per table;
  split    one topic of two partitions, each record's `t` header naming its table among `--tables`
           (a field route): one streaming query for every table.
Each run in a fresh process with its own JVM (local[2], the same driver memory, maintenance off):

  drain      the service started on topics that already hold the events (`--until-idle`): from
             the call to its return, the lanes' start included (a table created and a query
             started per topic), and the peak memory of the whole process tree
  sustained  the service running while a producer sends `--rate` events per second in all, spread
             evenly over the topics, for `--seconds`; then every table's p99 freshness (Kafka
             timestamp to the commit that made the event visible) from the service's own histogram

The memory of `--tables` single-table services is that of the one-table run times the tables.
Writes bench/results/routing.json and routing.md.

    .venv/bin/python bench/routing.py [--tables 50] [--events 200000] [--rate 20000] [--seconds 60]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
from ingest import make_events  # noqa: E402
from memory import PeakMemory  # noqa: E402

from app.local.broker import LocalBroker, free_port  # noqa: E402
from app.settings import load_settings  # noqa: E402
from streaming.write.freshness import ages_at  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CONTRACT = ROOT / "schemas" / "demo_events.json"
MASTER = "local[2]"
DRIVER_MEMORY = "4g"
PREFIX = "bench"


def child(spec: dict) -> dict:
    """One service run as the spec says; its figures."""
    from prometheus_client import CollectorRegistry

    from app.routing import run_routes
    from app.service import configure_logging, run, start_spark
    from streaming.contract import load_contract
    from streaming.table.catalog import create_table, open_catalog

    configure_logging("WARNING")
    workdir = Path(spec["workdir"])
    routed = spec["shape"] != "one"
    if spec["shape"] == "split":
        routes = [{"name": "kinds", "topic": spec["topic"], "field": "header:t", "table": "split.t_{value}"}]
    else:
        routes = [
            {
                "name": "cities",
                "topic_pattern": rf"{PREFIX}-{spec['mode']}\.t(?<n>[0-9]+)",
                "table": "routed.city_{n}",
            }
        ]
    routes = [{**route, "contract": str(CONTRACT)} for route in routes]
    settings = load_settings(
        env={},
        bootstrap_servers=spec["bootstrap"],
        topic=spec["topic"],
        routes=routes if routed else (),
        metrics_port=0,
        catalog={"type": "sql", "uri": f"sqlite:///{workdir}/catalog.db", "warehouse": f"file://{workdir}/warehouse"},
        checkpoint_location=str(workdir / "checkpoints"),
        trigger_interval=spec["trigger"],
        spark_master=MASTER,
        driver_memory=DRIVER_MEMORY,
        maintenance_mode="off",
    )
    spark = start_spark(settings)
    registry = CollectorRegistry()
    committed: list[int] = []
    ages: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}  # by table: (ages at commit, events)
    done = threading.Event()

    def observe(report) -> None:
        landed = report.outcome is not None and report.outcome.status == "committed"
        committed.append(report.committed_rows if landed else 0)
        if landed and report.event_times:
            ages.setdefault(report.table, []).append(ages_at(time.time(), list(report.event_times)))
        if sum(committed) >= spec["events"]:
            done.set()

    until_idle = spec["mode"] == "drain"

    def ready_when_running() -> None:
        """The producer starts once every table's query runs and has had 10 s to settle."""
        while len(spark.streams.active) < (spec["tables"] if spec["shape"] == "routed" else 1):
            time.sleep(0.5)
        time.sleep(10)
        (workdir / "ready").touch()

    if not until_idle:
        threading.Thread(target=ready_when_running, daemon=True).start()
    started = time.monotonic()
    if routed:
        stop = threading.Event()
        threading.Thread(target=lambda: (done.wait(), stop.set()), daemon=True).start()
        run_routes(settings, until_idle=until_idle, observers=(observe,), spark=spark, registry=registry, stop=stop)
    else:
        contract = load_contract(CONTRACT)
        create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
        if not until_idle:
            threading.Thread(target=lambda: (done.wait(), os.kill(os.getpid(), signal.SIGTERM)), daemon=True).start()
        run(settings, contract, until_idle=until_idle, observers=(observe,), spark=spark, registry=registry)
    seconds = time.monotonic() - started
    return {
        "seconds": round(seconds, 2),
        "committed_rows": sum(committed),
        "batches": len(committed),
        "p99_freshness_s": {table: p99(parts) for table, parts in ages.items()},
    }


def p99(parts: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """The age at its commit that 99 % of a table's events stay within (Kafka timestamp to visible)."""
    age = np.concatenate([a for a, _ in parts])
    weight = np.concatenate([n for _, n in parts])
    order = np.argsort(age)
    reached = np.cumsum(weight[order])
    return round(float(age[order][np.searchsorted(reached, 0.99 * reached[-1])]), 2)


def run_child(spec: dict, workdir: Path, produce_while=None) -> dict:
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
        with PeakMemory(process.pid) as memory:
            try:
                if produce_while is not None:
                    while not (workdir / "ready").exists() and process.poll() is None:
                        time.sleep(0.2)
                    produce_while()
                process.wait(timeout=3600)
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
    result_path = workdir / "result.json"
    if process.returncode != 0 or not result_path.exists():
        tail = "\n".join((workdir / "child.log").read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"the service exited with {process.returncode}:\n{tail}")
    result = json.loads(result_path.read_text())
    figures = memory.figures()
    result["memory_mb"] = {
        **figures,
        "total": round(memory.driver_peak / 2**20) + figures["jvm"] + figures["python_workers"],
    }
    return result


def producer(bootstrap: str):
    from confluent_kafka import Producer

    return Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 10000, "compression.type": "lz4"}
    )


def send(client, topic: str, event, headers: list[tuple[str, bytes]] | None = None) -> None:
    while True:
        try:
            client.produce(topic, event.value, event.key, headers=headers)
            return
        except BufferError:
            client.poll(0.001)


def produce_at(bootstrap: str, topics: list[str], values: list, rate: int, seconds: float, tagged: int = 0) -> int:
    """Send the events round-robin over the topics at `rate` per second, every 10 ms (lz4, as
    bench/sustained.py); with `tagged`, each with a `t` header naming one of that many tables in turn."""
    client = producer(bootstrap)
    sent = 0
    started = time.monotonic()
    while sent < len(values):
        due = min(len(values), int((time.monotonic() - started) * rate))
        for i in range(sent, due):
            send(client, topics[i % len(topics)], values[i], tag(i, tagged))
        sent = due
        client.poll(0)
        time.sleep(0.01)
    client.flush(60)
    return sent


def tag(i: int, tables: int) -> list[tuple[str, bytes]] | None:
    return [("t", str(i % tables).encode())] if tables else None


def create_topics(bootstrap: str, topics: list[str], partitions: int) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        for i in range(0, len(topics), 20):
            admin.create_topics(
                [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics[i : i + 20]]
            )
    finally:
        admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=50)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rate", type=int, default=20_000)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--trigger", default="1 second")
    parser.add_argument("--shapes", default="one,routed,split", help="which of one, routed, split to run")
    parser.add_argument("--modes", default="drain,sustained", help="which of drain, sustained to run")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(Path(args.child).read_text())
        (Path(spec["workdir"]) / "result.json").write_text(json.dumps(child(spec)))
        return

    tmp = Path(tempfile.mkdtemp(prefix="geoingest-routing-"))
    broker = LocalBroker(tmp / "broker", Path(load_settings(env={}).cache_dir), port=free_port())
    broker.ensure_jars()
    broker.start()
    results: dict = {"tables": args.tables, "events": args.events, "rate": args.rate, "seconds": args.seconds}
    try:
        events = make_events("geojson-points", args.events)
        for mode in args.modes.split(","):
            sustained_events = events[: args.rate * args.seconds] if mode == "sustained" else events
            for shape in args.shapes.split(","):
                tables = args.tables if shape != "one" else 1
                tagged = args.tables if shape == "split" else 0
                if shape == "routed":
                    topics = [f"{PREFIX}-{mode}.t{i}" for i in range(tables)]
                else:
                    topics = [f"{PREFIX}-{mode}-{shape}"]
                create_topics(broker.bootstrap, topics, 1 if shape == "routed" else 2)
                spec = {
                    "bootstrap": broker.bootstrap,
                    "topic": topics[0],
                    "tables": tables,
                    "shape": shape,
                    "events": len(sustained_events),
                    "mode": mode,
                    "trigger": args.trigger,
                    "workdir": str(tmp / f"{mode}-{shape}"),
                }
                if mode == "drain":
                    client = producer(broker.bootstrap)
                    for i, e in enumerate(sustained_events):
                        send(client, topics[i % len(topics)], e, tag(i, tagged))
                    client.flush(60)
                    result = run_child(spec, Path(spec["workdir"]))
                else:
                    result = run_child(
                        spec,
                        Path(spec["workdir"]),
                        lambda topics=topics, sent=sustained_events, tagged=tagged: produce_at(
                            broker.bootstrap, topics, sent, args.rate, args.seconds, tagged
                        ),
                    )
                    result["events_per_s"] = round(len(sustained_events) / args.seconds)
                if mode == "drain":
                    result["events_per_s"] = round(len(sustained_events) / result["seconds"])
                p99 = sorted(result.pop("p99_freshness_s").values())
                if p99 and mode == "sustained":
                    result["p99_freshness_s"] = {"median_table": p99[len(p99) // 2], "worst_table": p99[-1]}
                results[f"{mode}_{shape}"] = result
                print(mode, shape, json.dumps(result), flush=True)
    finally:
        broker.stop()
    if any(f"{mode}_{shape}" not in results for mode in ("drain", "sustained") for shape in ("one", "routed", "split")):
        print("a partial run (--shapes, --modes): results printed above, none written")
        return
    one, routed = results["drain_one"], results["drain_routed"]
    results["memory_of_single_table_services_mb"] = one["memory_mb"]["total"] * args.tables
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "routing.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# Many tables from one service (bench/routing.py)",
        "",
        f"one: one topic of two partitions into one table; routed: {args.tables} topics of one partition into "
        f"{args.tables} tables (one pattern route, a query per table); split: one topic of two partitions whose "
        f"records' header names one of {args.tables} tables (a field route, one query); {args.events:,} GeoJSON "
        f"point events in all; local[2], maintenance off, trigger {args.trigger}.",
        "",
        "| run | events/s | seconds | batches | memory, MB (driver + JVM + workers) | p99 freshness, median table / worst |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key in ("drain_one", "drain_routed", "drain_split", "sustained_one", "sustained_routed", "sustained_split"):
        r = results[key]
        p99 = r.get("p99_freshness_s", {})
        lines.append(
            f"| {key.replace('_', ', ')} | {r['events_per_s']:,} | {r['seconds']} | {r['batches']} | {r['memory_mb']['total']:,} "
            f"| {p99.get('median_table', '')} / {p99.get('worst_table', '')} |"
        )
    lines += [
        "",
        f"{args.tables} single-table services would take {results['memory_of_single_table_services_mb']:,} MB "
        f"(the one-table run's {one['memory_mb']['total']:,} MB each); the routed service took {routed['memory_mb']['total']:,} MB.",
    ]
    (RESULTS / "routing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

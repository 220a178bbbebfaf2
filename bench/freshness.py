"""Freshness under steady load: how long from an event's Kafka timestamp to the commit that makes
it visible, for every event, at rates a producer keeps for minutes.

A broker of its own and the real service (`geoingest run`, its own process: driver, Spark JVM,
Python workers) on the demo contract, started and warm before the load. A producer process
(confluent-kafka) sends GeoJSON points at --rates events/s for --seconds each, paced every 10 ms,
the Kafka timestamp set by the client as it sends. For every batch snapshot the bench reads the
event times of the rows it added and takes each row's age at the snapshot's commit time: exact
per event, from the table itself (the service's own histogram, geoingest_event_freshness_seconds,
bins them). Reported per rate and trigger: p50, p95, p99 and max; the rate the producer kept;
and the highest rate whose p99 stayed under 1 s.

With --slow-record, one GeoJSON polygon whose ring crosses itself everywhere (2,000 vertices;
GEOS needs far longer than max_record_seconds to repair it) is sent halfway through each load: it
must come out as a time_budget_exceeded reject, and p99 must stay under the budget plus 1 s.

Writes bench/results/freshness.json and freshness.md (--results names them otherwise).

    .venv/bin/python bench/freshness.py [--rates 20000,50000,100000,200000] [--seconds 120]
        [--triggers "0 seconds,2 seconds"] [--sources spark-kafka,python] [--warmup 20] [--slow-record]
        [--results freshness]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the service harness lives in tests/

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench.upsert import broker_topic  # noqa: E402
from streaming.table.commit import KAFKA_OFFSETS  # noqa: E402
from tests.streaming.decode.test_decoder import self_crossing_ring  # noqa: E402
from tests.streaming.job.test_chaos import (  # noqa: E402
    CONTRACT,
    Service,
    all_consumed,
    catalog_of,
    end_offsets,
    kafka_client,
    service_env,
    wait_for,
)
from tests.streaming.job.test_faults import start_broker  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PARTITIONS = 4


def produce_at_rate(
    bootstrap: str, topic: str, rate: int, seconds: float, slow_at: float | None, out, bad_every: int | None = None
) -> None:
    """A child process: `rate` events/s for `seconds`, paced every 10 ms; puts (sent, seconds) on `out`.
    With bad_every, every bad_every-th record is not JSON (a dead letter)."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 10000, "compression.type": "lz4"}
    )
    rng = np.random.default_rng(rate)
    xs, ys = rng.uniform(-179, 179, 4096), rng.uniform(-80, 80, 4096)
    templates = [
        '{"type":"Feature","id":"%s","geometry":{"type":"Point","coordinates":[%.5f,%.5f]},'
        '"properties":{"kind":"probe","speed":12.5}}' % ("{}", x, y)
        for x, y in zip(xs, ys)
    ]
    slow = json.dumps(
        {
            "type": "Feature",
            "id": "slow",
            "geometry": {"type": "Polygon", "coordinates": [self_crossing_ring(2_000).tolist()]},
            "properties": {},
        }
    ).encode()
    sent = 0
    started = time.monotonic()
    tick = 0.01
    while True:
        elapsed = time.monotonic() - started
        if elapsed >= seconds:
            break
        due = int(rate * min(seconds, elapsed + tick))
        while sent < due:
            bad = bad_every is not None and sent % bad_every == 0
            value = b"not json" if bad else templates[sent % 4096].replace("{}", f"e{sent}").encode()
            try:
                producer.produce(topic, value)
            except BufferError:
                producer.poll(0.001)
                continue
            sent += 1
        if slow_at is not None and elapsed >= slow_at:
            producer.produce(topic, slow)
            slow_at = None
        producer.poll(0)
        pause = started + elapsed + tick - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    producer.flush(60)
    out.put((sent, time.monotonic() - started))


def ages_by_snapshot(table, since_ms: int) -> np.ndarray:
    """Age (s) of every row whose event time is since_ms or later, at the commit of the batch
    snapshot that added it."""
    ages = []
    for snapshot in table.metadata.snapshots:
        if KAFKA_OFFSETS not in (snapshot.summary or {}).additional_properties or snapshot.timestamp_ms < since_ms:
            continue
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io):
                with table.io.new_input(entry.data_file.file_path).open() as stream:
                    times = pq.read_table(stream, columns=["event_time"]).column("event_time")
                event_ms = times.cast("int64").to_numpy() // 1000
                event_ms = event_ms[event_ms >= since_ms]
                ages.append((snapshot.timestamp_ms - event_ms) / 1000)
    return np.concatenate(ages) if ages else np.zeros(0)


def one_load(
    bootstrap: str,
    workdir: Path,
    rate: int,
    seconds: float,
    trigger: str,
    slow: bool,
    maintenance: str,
    source: str,
    warmup_s: float,
    repeat: int = 0,
) -> dict:
    topic = f"load-{rate}-{trigger.split()[0]}-{maintenance}-{source}" + (f"-{repeat}" if repeat else "")
    broker_topic(bootstrap, topic)
    env = service_env(
        bootstrap,
        topic,
        workdir / topic,
        GEOINGEST_TRIGGER_INTERVAL=trigger,
        GEOINGEST_MAX_OFFSETS_PER_TRIGGER="2000000",
        GEOINGEST_DRIVER_MEMORY="2g",
        GEOINGEST_MAINTENANCE_MODE=maintenance,
        GEOINGEST_SOURCE=source,
        # Maintenance runs as by default, but keeps every snapshot: the ages are read from them.
        GEOINGEST_MAINTENANCE_MAX_SNAPSHOTS="0",
    )
    from streaming.table.catalog import create_table

    create_table(catalog_of(env), CONTRACT)
    (workdir / topic).mkdir(parents=True, exist_ok=True)
    service = Service(env, workdir / topic, "service")
    try:
        if not wait_for(service.query_started, timeout=180, service=service):
            raise RuntimeError(f"the service did not start its query:\n{service.stderr_tail()}")
        time.sleep(3)  # a few idle batches: the Python workers are up
        # The first batches after a start run in a JVM and Python workers that have not run the
        # pass yet (a few seconds for the first), and leave a backlog that takes a few more to
        # drain: the load runs warmup_s first, and events from then on are measured.
        started_ms = int((time.time() + warmup_s) * 1000)
        spawn = multiprocessing.get_context("spawn")
        out = spawn.Queue()
        load_s = warmup_s + seconds
        producer = spawn.Process(
            target=produce_at_rate,
            args=(bootstrap, topic, rate, load_s, warmup_s + seconds / 2 if slow else None, out),
        )
        producer.start()
        sent, produce_s = out.get(timeout=load_s + 300)
        producer.join()
        table = catalog_of(env).load_table(CONTRACT.table)

        ends = end_offsets(kafka_client(env), topic)

        def landed() -> bool:
            table.refresh()
            return all_consumed(table, topic, ends)

        caught_up = wait_for(landed, timeout=300, service=service, every_s=1.0)
        batches = [b for b in service.batches()]
        log = service.log()
    finally:
        service.stop()
    ages = ages_by_snapshot(table, started_ms)
    rejects: dict[str, int] = {}
    for batch in batches:
        for reason, n in (batch.get("rejected") or {}).items():
            rejects[reason] = rejects.get(reason, 0) + n
    q = np.percentile(ages, [50, 95, 99]) if ages.size else [float("nan")] * 3
    return {
        "rate": rate,
        "source": source,
        "trigger": trigger,
        "maintenance": maintenance,
        "repeat": repeat,
        "produced": sent,
        "rate_kept": round(sent / produce_s),
        "caught_up": caught_up,
        "rows_measured": int(ages.size),
        "p50_s": round(float(q[0]), 3),
        "p95_s": round(float(q[1]), 3),
        "p99_s": round(float(q[2]), 3),
        "max_s": round(float(ages.max()), 3) if ages.size else None,
        "batches": len(batches),
        "rejects": rejects,
        **batch_breakdown(log, started_ms),
    }


# The pieces of a micro-batch's wall time, from the service's "batch" lines (the foreachBatch call,
# streaming/job/processor.py) and "progress" lines (Spark's own timing of the trigger, app/service.py).
PIECES = (
    ("latestOffset", "Spark: latest offsets of the source"),
    ("walCommit", "Spark: offset log written"),
    ("getBatch", "Spark: the batch's frame"),
    ("queryPlanning", "Spark: query planning"),
    ("ingest_plan", "foreachBatch: the batch's job planned"),
    ("ingest_job", "foreachBatch: the one-pass job (Kafka read, Python workers: decode, sort, write)"),
    ("merge", "foreachBatch: merge (clustering batch, large batches only)"),
    ("commit", "foreachBatch: the Iceberg commit (driver)"),
    ("foreachBatch_other", "foreachBatch: the rest of the call (Py4J round trip, observers)"),
    ("commitOffsets", "Spark: commit log written"),
    ("trigger_other", "Spark: the rest of the trigger"),
    ("triggerExecution", "the whole trigger"),
)


def batch_breakdown(log: list[dict], since_ms: int) -> dict:
    """Median and p95 of every piece of the measured batches' wall time (ms), ingest commit
    conflicts and maintenance runs in the measured window."""
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(since_ms / 1000))
    measured = [line for line in log if line.get("ts", "") >= since]
    seconds = {b["batch"]["batch_id"]: b["batch"] for b in measured if b.get("msg") == "batch"}
    spark = {p["batch"]["batch_id"]: p["batch"]["duration_ms"] for p in measured if p.get("msg") == "progress"}
    rows = []
    for batch_id in sorted(set(seconds) & set(spark)):
        ours = {k: 1000 * v for k, v in seconds[batch_id].get("seconds", {}).items()}
        theirs = spark[batch_id]
        piece = {k: float(theirs.get(k, 0)) for k in ("latestOffset", "walCommit", "getBatch", "queryPlanning")}
        piece["ingest_plan"] = ours.get("ingest_plan", 0.0)
        piece["ingest_job"] = ours.get("ingest", 0.0) - piece["ingest_plan"]
        piece["merge"] = ours.get("merge", 0.0)
        piece["commit"] = ours.get("commit", 0.0)
        piece["foreachBatch_other"] = float(theirs.get("addBatch", 0)) - ours.get("total", 0.0)
        piece["commitOffsets"] = float(theirs.get("commitOffsets", 0))
        piece["triggerExecution"] = float(theirs.get("triggerExecution", 0))
        piece["trigger_other"] = (
            piece["triggerExecution"]
            - sum(
                float(theirs.get(k, 0)) for k in ("latestOffset", "walCommit", "getBatch", "queryPlanning", "addBatch")
            )
            - piece["commitOffsets"]
        )
        rows.append(piece)
    breakdown = {
        name: {
            "p50_ms": round(float(np.percentile([r[name] for r in rows], 50)), 1),
            "p95_ms": round(float(np.percentile([r[name] for r in rows], 95)), 1),
        }
        for name, _ in PIECES
        if rows
    }
    maintenance = [line for line in measured if line.get("msg") == "maintenance"]
    costs = [line["summary"] for line in measured if line.get("msg") == "maintenance cost"]
    return {
        "maintenance_cpu_s": round(sum(c["cpu_s"] for c in costs), 1),
        "batches_measured": len(rows),
        "breakdown_ms": breakdown,
        "ingest_commit_conflicts": sum(int(b.get("commit_conflicts") or 0) for b in seconds.values()),
        "maintenance_runs": len(maintenance),
        "maintenance_skipped": sum(1 for line in maintenance if (line.get("summary") or {}).get("skipped")),
        # A run that lost every commit race to ingest landed nothing: it is not in maintenance_runs.
        "maintenance_gave_up": sum(1 for line in measured if line.get("msg") == "maintenance gave up"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="20000,50000,100000,200000")
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--triggers", default="0 seconds,2 seconds")
    parser.add_argument("--slow-record", action="store_true")
    parser.add_argument("--sources", default="spark-kafka,python", help="the service's Kafka source(s)")
    parser.add_argument("--warmup", type=float, default=20, help="seconds of load before the measured ones")
    parser.add_argument("--results", default="freshness", help="name of the results files in bench/results/")
    parser.add_argument(
        "--maintenance",
        default="beside,off",
        help="the service's maintenance_mode (comma-separated to compare): beside (the default), "
        "between-batches, background, off",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the modes compared at a rate this many times, in turn (A B A B): the spread of one mode "
        "over its runs is the machine's noise the comparison must beat",
    )
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="geoingest-freshness-") as tmp:
        workdir = Path(tmp)
        broker = start_broker(workdir / "kafka")
        try:
            # The modes compared at one rate run one after the other: the machine's other load
            # changes less between them.
            for trigger in args.triggers.split(","):
                for rate in (int(r) for r in args.rates.split(",")):
                    for source in args.sources.split(","):
                        for repeat in range(args.repeat):
                            for maintenance in args.maintenance.split(","):
                                run = one_load(
                                    broker.bootstrap,
                                    workdir,
                                    rate,
                                    args.seconds,
                                    trigger.strip(),
                                    args.slow_record,
                                    maintenance.strip(),
                                    source.strip(),
                                    args.warmup,
                                    repeat,
                                )
                                print(json.dumps(run), flush=True)
                                runs.append(run)
        finally:
            broker.stop()
    report = {"args": vars(args), "runs": runs}
    for source, trigger, maintenance in sorted({(r["source"], r["trigger"], r["maintenance"]) for r in runs}):
        under = [
            r["rate"]
            for r in runs
            if (r["source"], r["trigger"], r["maintenance"]) == (source, trigger, maintenance)
            and r["caught_up"]
            and r["p99_s"] < 1.0
        ]
        report[f"highest_rate_p99_under_1s ({source} source, trigger {trigger}, maintenance {maintenance})"] = (
            max(under) if under else None
        )
    write_results(report, args.results)


def write_results(report: dict, name: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    a = report["args"]
    lines = [
        "# Freshness under steady load",
        "",
        f"Each load {a['seconds']:.0f} s measured after {a.get('warmup', 0):.0f} s of the same load, the service on "
        "the demo contract, Spark local[2] on 2 cores"
        + (", one slow record (a 2,000-vertex self-crossing ring) halfway" if a["slow_record"] else "")
        + ". Ages: event Kafka timestamp to the commit of the snapshot that added the row, every row.",
        "",
        "| source | maintenance | trigger | rate asked | rate kept | p50 s | p95 s | p99 s | max s | batches | caught up | rejects |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r.get('source', 'spark-kafka')} | {r['maintenance']} | {r['trigger']} | {r['rate']:,} | {r['rate_kept']:,} | {r['p50_s']} | {r['p95_s']} | {r['p99_s']} "
            f"| {r['max_s']} | {r['batches']} | {r['caught_up']} | {r['rejects'] or ''} |"
        )
    lines.append("")
    for key, value in report.items():
        if key.startswith("highest_rate"):
            lines.append(f"- {key}: {value}")
    lines.append("")
    runs = [r for r in report["runs"] if r.get("breakdown_ms")]
    if runs:
        lines += [
            "Where a measured micro-batch's wall time goes, ms, median (p95) over the measured batches "
            "(Spark's own trigger timing and the service's; `bench/freshness.py` PIECES):",
            "",
            "| piece | "
            + " | ".join(
                f"{r['maintenance']} {r['rate'] // 1000}k {r['source']} #{r.get('repeat', 0) + 1}" for r in runs
            )
            + " |",
            "|---|" + "---|" * len(runs),
        ]
        for piece, what in PIECES:
            cells = [f"{r['breakdown_ms'][piece]['p50_ms']} ({r['breakdown_ms'][piece]['p95_ms']})" for r in runs]
            lines.append(f"| {piece}: {what} | " + " | ".join(cells) + " |")
        lines.append("| batches measured | " + " | ".join(str(r["batches_measured"]) for r in runs) + " |")
        lines.append(
            "| ingest commit conflicts | " + " | ".join(str(r["ingest_commit_conflicts"]) for r in runs) + " |"
        )
        lines.append(
            "| maintenance runs (skipped; gave up) | "
            + " | ".join(
                f"{r['maintenance_runs']} ({r['maintenance_skipped']}; {r.get('maintenance_gave_up', 0)})" for r in runs
            )
            + " |"
        )
        lines.append("| maintenance CPU, s | " + " | ".join(str(r.get("maintenance_cpu_s", "")) for r in runs) + " |")
        lines.append("")
    (RESULTS / f"{name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

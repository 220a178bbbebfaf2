"""Sustained capacity: the highest steady rate each stack holds for --hold seconds with its lag
bounded, per dataset, and its freshness there. The headline figure of `make bench`; the burst
figures of bench/ingest.py (400,000 events drained from a backlog) are secondary.

One broker; for each dataset (bench/ingest.py's events: GeoJSON points, WKB points, WKB polygons)
and each stack, a topic of its own and the stack running on it as a service runs, trigger
"0 seconds", from an empty topic:

  geoingest (spark-kafka)  `geoingest run` on the demo contract, every setting at its default
  geoingest (python)       the same with its Python source
  plain                    the hand-wired stack of bench/plain_stack.py (Spark's Kafka source,
                           Sedona, iceberg-spark-runtime), its query left running

A producer process (confluent-kafka, paced every 10 ms, bench/ingest.py's producer_settings with
--compression, lz4 by default; the results print them) sends the dataset's events at a rate the
bench changes as it goes, so a stack is started once per dataset:

  warm     --warmup-seconds at half the first rate, not judged (the first batches of a fresh JVM
           and fresh Python workers take seconds), then drained
  ramp     steps of --step-seconds, each --step times the last, from --start times the stack's
           burst figure (bench/results/ingest.json, 1,000,000 events per batch) until a step's lag
           is not bounded
  drain    at half the last rate held, until the lag is back under --lag-bound seconds of events
  hold     the last rate held, for --hold seconds; if its lag is not bounded, drain and hold again
           at --step-down of it, up to --tries times

Lag is the topic's end offsets less what the table holds (geoingest: the offsets its snapshots
record; the plain stack: its rows), sampled every 2 s, in seconds of events at the rate asked.
A step or hold is bounded when the lag at its end and its mean over its second half are under
--lag-bound seconds, the lag did not grow over the second half by more than a third of the bound,
and after its first 20 s it never passed twice the bound. Freshness over the hold: every row
added by an append committed in it, from its Kafka timestamp to that commit (p50, p99), read
from the table as bench/freshness.py does. The service runs on its defaults (maintenance
beside, at most 100 snapshots kept), so its freshness comes from the hold's appends its expiry
kept (the last 100 or more); the plain stack keeps every snapshot.

The producer shares the 2 cores with the stack, as a producer on the same host would.

Each capacity is also given as a share of the limit chain (bench/ingest.py's: the decode, sort and
write of the events in memory, 2 processes, no Kafka), measured in the same run before each
dataset's stacks.

Writes bench/results/sustained.json and sustained.md (--results names them otherwise).

    .venv/bin/python bench/sustained.py [--datasets geojson-points,wkb-points,wkb-polygons]
        [--stacks spark-kafka,python,plain] [--hold 180] [--step-seconds 30] [--lag-bound 5]
        [--compression lz4|none|zstd|snappy|gzip] [--results sustained]
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the service harness lives in tests/
sys.path.insert(0, str(ROOT / "bench"))  # bench/ingest.py's imports of its neighbours

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from app.maven import configure_iceberg_java  # noqa: E402
from bench.ingest import CORES, limit_chain, make_events, producer_settings  # noqa: E402
from bench.memory import processes_cpu_s, tree_cpu_parts  # noqa: E402
from bench.plain_stack import DATASET_FORMATS, PlainStackProcess, launch_plain_stack  # noqa: E402
from bench.upsert import broker_topic  # noqa: E402
from streaming.contract import parse_contract  # noqa: E402
from streaming.table.commit import recorded_offsets  # noqa: E402
from tests.conftest import CACHE_DIR  # noqa: E402
from tests.streaming.job.test_chaos import (  # noqa: E402
    CONTRACT,
    CONTRACT_FILE,
    Service,
    catalog_of,
    end_offsets,
    kafka_client,
    service_env,
    wait_for,
)
from tests.streaming.job.test_faults import start_broker  # noqa: E402

RESULTS = ROOT / "bench" / "results"
STACKS = ("spark-kafka", "python", "plain")
# The burst figure each stack's ramp starts from, when bench/results/ingest.json has none.
BURST_KEYS = {"spark-kafka": "batch", "python": "python", "plain": "plain"}
POOL = 50_000  # distinct events a producer cycles through
LIMIT_CHAIN_EVENTS = 400_000  # as bench/ingest.py's datasets
SAMPLE_S = 2.0
SETTLE_S = 20.0  # a stage's first seconds, while the lag of the last rate settles


def produce_steadily(bootstrap: str, topic: str, dataset: str, rate, stop, sent, compression: str = "lz4") -> None:
    """A child process: the dataset's events at `rate.value` events/s (read every 10 ms) until
    `stop` is set; `sent.value` counts what it handed to the client."""
    from confluent_kafka import Producer

    events = make_events(dataset, POOL)
    keys, values = [e.key for e in events], [e.value for e in events]
    producer = Producer({"bootstrap.servers": bootstrap, **producer_settings(compression)})
    tick, due, count = 0.01, 0.0, 0
    next_tick = time.monotonic()
    parent = os.getppid()
    while not stop.is_set() and os.getppid() == parent:  # gone with the bench, however it ends
        due += rate.value * tick
        while count < due:
            try:
                producer.produce(topic, values[count % POOL], keys[count % POOL])
            except BufferError:
                producer.poll(0.001)
                continue
            count += 1
        sent.value = count
        producer.poll(0)
        next_tick += tick
        pause = next_tick - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        elif pause < -1.0:
            next_tick = time.monotonic()  # fell behind by a second: the rate asked is above what it can send
    producer.flush(60)
    sent.value = count


@dataclass
class Stage:
    kind: str  # "warm", "ramp", "drain" or "hold"
    rate: int
    started: float  # epoch seconds
    ended: float = 0.0
    lag_s: list[tuple[float, float]] = field(default_factory=list)  # (epoch s, lag in seconds of events)
    bounded: bool = False
    sent_rate: int = 0
    load: float = 0.0  # the machine's 1-minute load average at the stage's end: other work on the cores
    # CPU seconds the stack's own processes used over the stage, and the events it took in meanwhile.
    cpu_s: float | None = None
    events: int | None = None
    cpu_parts: dict[str, float] = field(default_factory=dict)  # cpu_s by part (bench.memory.tree_cpu_parts)

    def judge(self, bound_s: float, settle_s: float) -> bool:
        second_half = [lag for t, lag in self.lag_s if t >= (self.started + self.ended) / 2]
        settled = [lag for t, lag in self.lag_s if t >= self.started + settle_s]
        if not second_half:
            return False
        grew = second_half[-1] - second_half[0]
        self.bounded = (
            second_half[-1] < bound_s
            and float(np.mean(second_half)) < bound_s
            and grew < bound_s / 3
            and max(settled, default=0.0) < 2 * bound_s
        )
        return self.bounded

    def shown(self) -> dict:
        lags = [lag for _, lag in self.lag_s]
        return {
            "kind": self.kind,
            "rate": self.rate,
            "sent_rate": self.sent_rate,
            "seconds": round(self.ended - self.started, 1),
            "bounded": self.bounded,
            "lag_s_end": round(lags[-1], 2) if lags else None,
            "lag_s_max": round(max(lags), 2) if lags else None,
            "load": round(self.load, 1),
            **({"cpu_s": round(self.cpu_s, 1), "events": self.events} if self.cpu_s is not None else {}),
            **({"cpu_s_per_million_events": self.cpu_per_million} if self.cpu_per_million is not None else {}),
            **({"cpu_parts_s": {k: round(v, 1) for k, v in self.cpu_parts.items()}} if self.cpu_parts else {}),
        }

    @property
    def cpu_per_million(self) -> float | None:
        if self.cpu_s is None or not self.events:
            return None
        return round(self.cpu_s / self.events * 1e6, 1)


class Run:
    """One stack on one topic, the producer beside it, stepped through stages."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        dataset: str,
        lag_events: Callable[[], int],
        bound_s: float,
        compression: str = "lz4",
        cpu_parts: Callable[[], dict[str, float]] | None = None,
        taken_in: Callable[[], int] | None = None,
    ):
        """`cpu_parts`: CPU seconds the stack's processes used so far, by part (bench.memory.tree_cpu_parts);
        `taken_in`: events it consumed so far."""
        self.bootstrap, self.topic, self.lag_events, self.bound_s = bootstrap, topic, lag_events, bound_s
        self.cpu_parts, self.taken_in = cpu_parts, taken_in
        spawn = multiprocessing.get_context("spawn")
        self.rate, self.stop, self.sent = spawn.Value("d", 0.0), spawn.Event(), spawn.Value("q", 0)
        self.producer = spawn.Process(
            target=produce_steadily,
            args=(bootstrap, topic, dataset, self.rate, self.stop, self.sent, compression),
            daemon=True,
        )
        self.producer.start()
        self.stages: list[Stage] = []

    def stage(self, kind: str, rate: int, seconds: float, until_drained: bool = False) -> Stage:
        self.rate.value = float(rate)
        stage = Stage(kind, rate, time.time())
        sent_before, began = self.sent.value, time.monotonic()
        cpu_before = self.cpu_parts() if self.cpu_parts else None
        taken_before = self.taken_in() if self.taken_in else None
        while time.monotonic() - began < seconds:
            time.sleep(SAMPLE_S)
            if not self.producer.is_alive():
                raise RuntimeError(f"the producer of topic {self.topic!r} stopped (exit {self.producer.exitcode})")
            stage.lag_s.append((time.time(), self.lag_events() / max(rate, 1)))
            if until_drained and stage.lag_s[-1][1] < self.bound_s / 2:
                break
        stage.ended = time.time()
        if cpu_before is not None and taken_before is not None and self.cpu_parts and self.taken_in:
            after = self.cpu_parts()
            spent = {part: after[part] - cpu_before.get(part, 0.0) for part in sorted(after)}
            stage.cpu_s = processes_cpu_s(spent)
            stage.cpu_parts = {part: s for part, s in spent.items() if s >= 0.05}
            stage.events = self.taken_in() - taken_before
        stage.load = os.getloadavg()[0]
        stage.sent_rate = round((self.sent.value - sent_before) / max(time.monotonic() - began, 1e-9))
        stage.judge(self.bound_s, SETTLE_S)
        self.stages.append(stage)
        print(json.dumps({"topic": self.topic, **stage.shown()}), flush=True)
        return stage

    def close(self) -> None:
        self.stop.set()
        self.producer.join(90)
        if self.producer.is_alive():
            self.producer.kill()


def find_capacity(run: Run, start_rate: int, args: argparse.Namespace) -> Stage | None:
    """Ramp, then hold the last rate held (stepping down if it does not hold): the hold kept.
    With --hold-at, one step at that rate and one hold, whatever they show."""
    # The first seconds of load run in a JVM and Python workers that have not run the pass yet
    # (the first batch takes seconds): a warm-up, not judged, so the ramp's first step measures
    # the stack and not its start.
    warm = args.hold_at or start_rate
    run.stage("warm", warm // 2, args.warmup_seconds)
    run.stage("drain", warm // 4, args.drain_seconds, until_drained=True)
    if args.hold_at:
        return run.stage("hold", args.hold_at, args.hold)
    rate, held = start_rate, 0
    for _ in range(args.max_steps):
        if run.stage("ramp", rate, args.step_seconds).bounded:
            held, rate = rate, int(rate * args.step)
        elif held:
            break
        else:
            run.stage("drain", max(rate // 4, 1000), args.drain_seconds, until_drained=True)
            rate = int(rate / args.step / args.step)
    for _ in range(args.tries):
        if not held:
            return None
        run.stage("drain", held // 2, args.drain_seconds, until_drained=True)
        hold = run.stage("hold", held, args.hold)
        if hold.bounded:
            return hold
        held = int(held * args.step_down)
    return None


def ages_in(table, since_ms: int, until_ms: int) -> np.ndarray:
    """Seconds from each row's event_time (its Kafka timestamp) to the commit of the snapshot that
    added it, for snapshots committed within [since_ms, until_ms]."""
    from pyiceberg.manifest import ManifestEntryStatus
    from pyiceberg.table.snapshots import Operation

    ages = []
    for snapshot in table.metadata.snapshots:
        # Appends only: a compaction's files hold old rows, a manifest merge re-lists old files.
        if not since_ms <= snapshot.timestamp_ms <= until_ms or snapshot.summary.operation != Operation.APPEND:
            continue
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.status != ManifestEntryStatus.ADDED or entry.snapshot_id != snapshot.snapshot_id:
                    continue
                with table.io.new_input(entry.data_file.file_path).open() as stream:
                    times = pq.read_table(stream, columns=["event_time"]).column("event_time")
                event_ms = times.cast("int64").to_numpy() // 1000
                ages.append((snapshot.timestamp_ms - event_ms) / 1000)
    return np.concatenate(ages) if ages else np.zeros(0)


def maintenance_cost(log: list[dict], hold: Stage) -> dict:
    """The maintenance runs that ended within the hold, and the CPU they took (their
    "maintenance cost" lines, app/maintenance.py), as a share of one core over the hold."""
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(hold.started))
    until = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(hold.ended))
    costs = [line["summary"] for line in log if line.get("msg") == "maintenance cost" and since <= line["ts"] <= until]
    cpu_s = sum(c["cpu_s"] for c in costs)
    return {
        "maintenance_runs": len(costs),
        "maintenance_cpu_s": round(cpu_s, 1),
        "maintenance_core_share": round(cpu_s / max(hold.ended - hold.started, 1e-9), 3),
    }


def batch_stages(log: list[dict], hold: Stage) -> dict:
    """The batches that ended within the hold (their "batch" lines, streaming/job/processor.py):
    how many, and each stage's median and p99 seconds, where a batch's time went."""
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(hold.started))
    until = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(hold.ended))
    batches = [line["batch"] for line in log if line.get("msg") == "batch" and since <= line["ts"] <= until]
    stages = sorted({name for b in batches for name in b.get("seconds", {})})
    seconds = {
        name: [round(float(q), 3) for q in np.percentile([b["seconds"].get(name, 0.0) for b in batches], [50, 99])]
        for name in stages
    }
    return {"batches": len(batches), "batch_stage_s_p50_p99": seconds}


def plain_table(stack: PlainStackProcess):
    from pyiceberg.table import StaticTable

    versions = sorted(
        (stack.table_location / "metadata").glob("v*.metadata.json"), key=lambda p: int(p.name[1:].split(".")[0])
    )
    return StaticTable.from_metadata(str(versions[-1])) if versions else None


def one_stack(
    bootstrap: str,
    workdir: Path,
    dataset: str,
    stack: str,
    start_rate: int,
    args,
    table_format: str = "v2",
    repeat: int = 0,
) -> dict:
    """`table_format` v3: the table a native-geometry contract makes (docs/contracts.md#native-geometry-iceberg-v3);
    v3-nobbox: one that stores no bbox covering (`bbox.stored: false`). `repeat`: which of --repeats
    this run is (a topic and table of its own)."""
    topic = f"sustained-{dataset}-{stack}-{table_format}" + (f"-{repeat + 1}" if repeat else "")
    broker_topic(bootstrap, topic)
    client = {"bootstrap_servers": bootstrap}
    service: Service | None = None
    plain: PlainStackProcess | None = None
    if stack == "plain":
        plain = launch_plain_stack(
            bootstrap, topic, DATASET_FORMATS[dataset], 10**12, 2_000_000, workdir=workdir, timeout_s=24 * 3600
        )

        def consumed() -> int:
            table = plain_table(plain)
            return int(table.current_snapshot().summary["total-records"]) if table and table.current_snapshot() else 0

        def started() -> bool:
            # Spark writes the checkpoint's metadata as the query starts.
            return plain.process.poll() is None and (Path(plain.spec.run_dir) / "checkpoint" / "metadata").exists()

        def table():
            return plain_table(plain)
    else:
        env = service_env(
            bootstrap,
            topic,
            workdir / topic,
            GEOINGEST_TRIGGER_INTERVAL="0 seconds",
            GEOINGEST_MAX_OFFSETS_PER_TRIGGER="2000000",
            GEOINGEST_DRIVER_MEMORY="2g",
            GEOINGEST_SOURCE=stack,
            **({"GEOINGEST_MAINTENANCE_MODE": args.maintenance} if args.maintenance else {}),
            **dict(setting.split("=", 1) for setting in args.service_env),
        )
        from streaming.table.catalog import create_table

        contract, contract_file = CONTRACT, CONTRACT_FILE
        if table_format in ("v3", "v3-nobbox"):
            raw = json.loads(CONTRACT_FILE.read_text())
            raw["geometry"]["native"] = True
            if table_format == "v3-nobbox":
                raw["bbox"] = {"stored": False}
            contract_file = workdir / "native_contract.json"
            contract_file.write_text(json.dumps(raw))
            contract = parse_contract(raw)
        create_table(catalog_of(env), contract)
        (workdir / topic).mkdir(parents=True, exist_ok=True)
        service = Service(env, workdir / topic, "service", contract=contract_file)
        client = kafka_client(env)
        geo = catalog_of(env).load_table(CONTRACT.table)

        def consumed() -> int:
            geo.refresh()
            return sum(last + 1 for _, last in recorded_offsets(geo).get(topic, {}).values())

        def started() -> bool:
            return service.query_started()

        def table():
            geo.refresh()
            return geo

    try:
        if not wait_for(started, timeout=300, service=service):
            raise RuntimeError(f"{stack} on {dataset} did not start")
        time.sleep(5)

        def lag() -> int:
            return sum(end_offsets(client, topic).values()) - consumed()

        root = plain.process.pid if plain is not None else service.process.pid  # type: ignore[union-attr]
        run = Run(
            bootstrap, topic, dataset, lag, args.lag_bound, args.compression, lambda: tree_cpu_parts(root), consumed
        )
        try:
            hold = find_capacity(run, start_rate, args)
        finally:
            run.close()
        label = (
            (stack if table_format == "v2" else f"{stack} {table_format}")
            + (f" ({args.variant})" if args.variant else "")
            + (f" run {repeat + 1}" if args.repeats > 1 else "")
        )
        result: dict = {"dataset": dataset, "stack": label, "stages": [s.shown() for s in run.stages]}
        if service is not None:
            result["maintenance"] = args.maintenance or "beside"
        if hold is None:
            return {**result, "capacity": None}
        if service is not None:
            result.update(maintenance_cost(service.log(), hold))
            result.update(batch_stages(service.log(), hold))
        if args.hold_at and not hold.bounded:
            result["held"] = False
        ages = ages_in(table(), int(hold.started * 1000), int(hold.ended * 1000))
        q = np.percentile(ages, [50, 99]) if ages.size else [float("nan")] * 2
        return {
            **result,
            "capacity": hold.rate,
            "sent_rate": hold.sent_rate,
            "hold_s": round(hold.ended - hold.started),
            "lag_s_max": round(max(lag for _, lag in hold.lag_s), 2),
            "load": round(hold.load, 1),
            "p50_s": round(float(q[0]), 3),
            "p99_s": round(float(q[1]), 3),
            "cpu_s_per_million_events": hold.cpu_per_million,
            "cpu_parts_s": {**{k: round(v, 1) for k, v in hold.cpu_parts.items()}, "_events": hold.events},
            "rows_measured": int(ages.size),
        }
    finally:
        if service is not None:
            service.stop()
        if plain is not None:
            plain.stop()


def burst_figures() -> dict[tuple[str, str], int]:
    """(dataset, stack) -> events/s of bench/ingest.py's last run at 1,000,000 events per batch:
    where each stack's ramp starts."""
    path = RESULTS / "ingest.json"
    if not path.exists():
        return {}
    figures: dict[tuple[str, str], int] = {}
    for dataset, result in json.loads(path.read_text()).get("datasets", {}).items():
        for stack, key in BURST_KEYS.items():
            rate = (result.get("runs", {}).get(f"{key}-1000000") or {}).get("events_per_s")
            if rate:
                figures[(dataset, stack)] = int(rate)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default=",".join(DATASET_FORMATS))
    parser.add_argument("--stacks", default=",".join(STACKS))
    parser.add_argument("--hold", type=float, default=180, help="seconds a capacity must be held")
    parser.add_argument("--warmup-seconds", type=float, default=45, help="seconds of load at half the first rate first")
    parser.add_argument("--step-seconds", type=float, default=30, help="seconds of each ramp step")
    parser.add_argument("--step", type=float, default=1.25, help="each ramp step's rate over the last")
    parser.add_argument("--step-down", type=float, default=0.85, help="a failed hold's next rate over its own")
    parser.add_argument("--start", type=float, default=1.0, help="the ramp's first rate over the burst figure")
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--tries", type=int, default=2)
    parser.add_argument("--drain-seconds", type=float, default=120)
    parser.add_argument("--lag-bound", type=float, default=5.0, help="seconds of events")
    parser.add_argument("--results", default="sustained")
    parser.add_argument(
        "--compression",
        default="lz4",
        choices=("none", "lz4", "zstd", "snappy", "gzip"),
        help="the producer's compression.type (its other settings: producer_settings)",
    )
    parser.add_argument(
        "--maintenance",
        default=None,
        help="geoingest's maintenance_mode (default: its default, beside); a run records the mode it ran",
    )
    parser.add_argument(
        "--hold-at",
        type=int,
        default=None,
        help="no ramp: the warm-up, then hold this rate (events/s) once, held or not; for comparing modes",
    )
    parser.add_argument(
        "--resume", action="store_true", help="keep the runs the results file holds and measure only the others"
    )
    parser.add_argument(
        "--table-formats",
        default="v2",
        help="v2 (WKB in a binary column), v3 (native geometry), v3-nobbox (native, no bbox covering), or a list: v2,v3",
    )
    parser.add_argument(
        "--service-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of geoingest's for this run (GEOINGEST_SPARK__spark.driver.extraJavaOptions=...), repeatable",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs of each table format, alternating; the results say each one's"
    )
    parser.add_argument("--variant", default="", help="a name for the --service-env settings, shown beside the stack")
    args = parser.parse_args()
    if bad_env := [e for e in args.service_env if "=" not in e or not e.startswith("GEOINGEST_")]:
        parser.error(f"--service-env: {bad_env[0]!r} is not GEOINGEST_NAME=VALUE")
    table_formats = [f.strip() for f in args.table_formats.split(",")]
    if set(table_formats) - {"v2", "v3", "v3-nobbox"}:
        parser.error(f"--table-formats: {args.table_formats!r} is not a list of v2, v3, v3-nobbox")
    if {"v3", "v3-nobbox"} & set(table_formats):
        configure_iceberg_java(CACHE_DIR)
    datasets = [d.strip() for d in args.datasets.split(",")]
    stacks = [s.strip() for s in args.stacks.split(",")]
    if bad := [d for d in datasets if d not in DATASET_FORMATS] + [s for s in stacks if s not in STACKS]:
        parser.error(f"unknown dataset or stack: {', '.join(bad)}")
    burst = burst_figures()
    # `timeout` and friends send SIGTERM: leave through the finally blocks, stack and broker stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    runs: list[dict] = []
    if args.resume and (RESULTS / f"{args.results}.json").exists():
        runs = json.loads((RESULTS / f"{args.results}.json").read_text())["runs"]
    done = {(r["dataset"], r["stack"]) for r in runs}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="geoingest-sustained-") as tmp:
        workdir = Path(tmp)
        broker = start_broker(workdir / "kafka")
        try:
            for dataset in datasets:
                # The ratio's denominator measured in this run, on this machine's state, not read
                # from an older bench/results/ingest.json.
                limit = limit_chain(make_events(dataset, LIMIT_CHAIN_EVENTS), CORES, workdir / f"limit-{dataset}")
                print(dataset, "limit chain", json.dumps(limit), flush=True)
                for stack in stacks:
                    if (dataset, stack) in done:
                        continue
                    start_rate = int(args.start * burst.get((dataset, stack), 40_000))
                    formats = table_formats if stack != "plain" else ["v2"]
                    # Alternating (v2, v3, v2, v3, ...): a drift of the machine's state over the
                    # invocation falls on every table format alike.
                    for repeat, table_format in itertools.product(range(args.repeats), formats):
                        run = one_stack(
                            broker.bootstrap, workdir, dataset, stack, start_rate, args, table_format, repeat
                        )
                        run["burst"] = burst.get((dataset, stack))
                        run["limit_chain"] = limit["events_per_s"]
                        run["producer"] = producer_settings(args.compression)
                        print(json.dumps({k: v for k, v in run.items() if k != "stages"}), flush=True)
                        runs.append(run)
                        minutes = round((time.monotonic() - started) / 60)
                        # after each run: a run cut short keeps what it measured
                        write_results({"args": vars(args), "minutes": minutes, "runs": runs}, args.results)
        finally:
            broker.stop()


def held_rate(run: dict) -> int | None:
    """The rate a run held, or None: a --hold-at run records the rate it tried, held or not."""
    return None if run.get("held") is False else run.get("capacity")


def write_results(report: dict, name: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    a = report["args"]
    by = {(r["dataset"], r["stack"]): r for r in report["runs"]}
    lines = [
        "# Sustained capacity",
        "",
        f"The highest rate each stack held for {a['hold']:.0f} s with its lag under {a['lag_bound']:g} s of events, "
        "trigger '0 seconds', Spark local[2] on 2 cores shared with the producer; freshness over that hold "
        f"(Kafka timestamp to commit, every row). The last invocation took {report['minutes']} min "
        "(with --resume, runs of earlier ones are kept).",
        "",
        "Producer (confluent-kafka, paced every 10 ms): "
        + ", ".join(f"{k} {v}" for k, v in producer_settings(a.get("compression", "lz4")).items())
        + ". The limit chain (bench/ingest.py's, 2 processes, no Kafka) is measured in the same run, before "
        "each dataset's stacks.",
        "",
        "| dataset | stack | maintenance | events/s held | sent | p50 s | p99 s | max lag s | load average "
        "| maintenance runs, CPU (share of a core) | CPU s per million events | burst (1M per batch) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        held = f"{r['capacity']:,}" if held_rate(r) else "none held"
        if r.get("held") is False:
            held = f"{r['capacity']:,} not held"
        cost = (
            f"{r['maintenance_runs']}, {r['maintenance_cpu_s']} s ({r['maintenance_core_share']})"
            if "maintenance_runs" in r
            else ""
        )
        lines.append(
            f"| {r['dataset']} | {r['stack']} | {r.get('maintenance', '')} | {held} | {_count(r.get('sent_rate'))} "
            f"| {r.get('p50_s', '')} | {r.get('p99_s', '')} | {r.get('lag_s_max', '')} | {r.get('load', '')} "
            f"| {cost} | {r.get('cpu_s_per_million_events') or ''} | {_count(r.get('burst'))} |"
        )
    lines += [
        "",
        "| dataset | geoingest source | / plain stack (goal 3) | / limit chain (goal 0.5) |",
        "|---|---|---|---|",
    ]
    for (dataset, stack), r in by.items():
        capacity = held_rate(r)
        if stack == "plain" or not capacity:
            continue
        plain = held_rate(by.get((dataset, "plain")) or {})
        limit = r.get("limit_chain")
        lines.append(
            f"| {dataset} | {stack} | {round(capacity / plain, 2) if plain else ''} "
            f"| {round(capacity / limit, 2) if limit else ''} |"
        )
    lines += [
        "",
        "Each stage: rate asked (rate sent), kept up or behind, lag at its end / its max (seconds of events), "
        "load average at its end:",
        "",
    ]
    for r in report["runs"]:
        stages = "; ".join(
            f"{s['kind']} {s['rate']:,} ({s['sent_rate']:,}) {'ok' if s['bounded'] else 'behind'} "
            f"{s['lag_s_end']}/{s['lag_s_max']} (load {s['load']})"
            for s in r["stages"]
        )
        lines.append(f"- {r['dataset']}, {r['stack']}: {stages}")
    timed = [r for r in report["runs"] if r.get("batch_stage_s_p50_p99")]
    if timed:
        lines += [
            "",
            "Where a batch's time went over the hold: each stage's p50 / p99 seconds (the service's batch lines):",
            "",
        ]
    for r in timed:
        stages = ", ".join(f"{name} {p50}/{p99}" for name, (p50, p99) in r["batch_stage_s_p50_p99"].items())
        lines.append(f"- {r['dataset']}, {r['stack']}: {r['batches']} batches; {stages}")
    repeated: dict[tuple[str, str], list[dict]] = {}
    for r in report["runs"]:
        if " run " in r["stack"] and r.get("p99_s") is not None:
            repeated.setdefault((r["dataset"], r["stack"].rsplit(" run ", 1)[0]), []).append(r)
    if repeated:
        lines += [
            "",
            "Over the repeats (runs alternating between the stacks): the median of the runs' p50 and p99, "
            "each run's p99, and the median CPU seconds per million events:",
            "",
            "| dataset | stack | runs | median p50 s | median p99 s | each run's p99 s | CPU s per million events |",
            "|---|---|---|---|---|---|---|",
        ]
    for (dataset, stack), group in repeated.items():
        cpu = [r["cpu_s_per_million_events"] for r in group if r.get("cpu_s_per_million_events")]
        lines.append(
            f"| {dataset} | {stack} | {len(group)} | {round(float(np.median([r['p50_s'] for r in group])), 3)} "
            f"| {round(float(np.median([r['p99_s'] for r in group])), 3)} "
            f"| {', '.join(str(r['p99_s']) for r in group)} | {round(float(np.median(cpu)), 1) if cpu else ''} |"
        )
    parted = [r for r in report["runs"] if r.get("cpu_parts_s") and r.get("rows_measured")]
    if parted:
        lines += [
            "",
            "Where the CPU went over the hold: CPU seconds per million events taken in, by part of the stack "
            "(bench/memory.py tree_cpu_parts; Spark's JVM also by thread, the ten busiest):",
            "",
        ]
    for r in parted:
        events = r["cpu_parts_s"].get("_events") or r["rows_measured"]
        per_million = {k: v / events * 1e6 for k, v in r["cpu_parts_s"].items() if not k.startswith("_")}
        processes = {k: v for k, v in per_million.items() if " thread " not in k}
        threads = sorted(((v, k) for k, v in per_million.items() if " thread " in k), reverse=True)[:10]
        lines.append(
            f"- {r['dataset']}, {r['stack']}: "
            + ", ".join(f"{k} {v:.1f}" for k, v in sorted(processes.items(), key=lambda kv: -kv[1]))
            + "; Spark JVM threads: "
            + ", ".join(f"{k.removeprefix('spark_jvm thread ')} {v:.1f}" for v, k in threads)
        )
    lines.append("")
    (RESULTS / f"{name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


def _count(value: int | None) -> str:
    return f"{value:,}" if value else ""


if __name__ == "__main__":
    main()

"""The hand-wired stack a data engineer builds from standard parts: geoingest's yardstick.

    Spark's Kafka source
      -> Apache Sedona ST_GeomFromGeoJSON / ST_GeomFromWKB, rows without a geometry dropped
      -> bbox columns, the GeoJSON properties, the geometry as WKB
      -> orderBy(ST_GeoHash(geom, 12))
      -> writeTo(<iceberg table>).append() with iceberg-spark-runtime

The jars come from Maven Central (app/maven.py); every session setting other than what this
stack needs (Sedona's and Iceberg's SQL extensions, an Iceberg catalog) is geoingest's own
(app/spark.py), and the Kafka options are those of geoingest's query (streaming/job/processor.py).

`run_plain_stack(...)` runs one query in a fresh Python process with its own JVM, so neither stack
inherits the other's JIT warm-up or heap, and returns its figures: events/s from query start to the
last commit, batches, rows read back from the table, seconds per stage, session start apart.

Run alone, it produces N events of each dataset (bench/ingest.py's `make_events`) on a temporary
local broker and prints the figures as JSON:

    .venv/bin/python bench/plain_stack.py --events 400000 \\
        [--datasets geojson-points,wkb-points,wkb-polygons] [--batch-sizes 1000000,40000] \\
        [--trigger "0 seconds" | --trigger availableNow]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: app/ and streaming/ live at the project root
    sys.path.insert(0, str(ROOT))

from memory import PeakMemory  # noqa: E402  (bench/, the script's own folder)

from app.maven import resolve, without_spark_jars  # noqa: E402

SEDONA = "org.apache.sedona:sedona-spark-shaded-4.0_2.13:1.8.0"
# The GeoTools build Sedona 1.8.0's setup docs pair with it (no function used here needs it,
# but the documented setup ships both, so the classpath is the one users run).
GEOTOOLS = "org.datasyslab:geotools-wrapper:1.8.0-33.1"
ICEBERG = "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.10.2"
STACK_JARS = (SEDONA, GEOTOOLS, ICEBERG)
JARS_FOLDER = "plain-stack-sedona-1.8.0-iceberg-1.10.2"

CATALOG = "plain"
NAMESPACE = "bench"
AVAILABLE_NOW = "availableNow"

# What ends up in the table, as comparable as SQL makes it to schemas/demo_events.json: the same
# columns, the geometry as WKB and a GeoParquet-style bbox struct.
TABLE_COLUMNS = """
    event_id STRING, event_time TIMESTAMP, kind STRING, name STRING, speed DOUBLE, population BIGINT,
    source_partition INT, source_offset BIGINT, geometry BINARY,
    bbox STRUCT<xmin: DOUBLE, ymin: DOUBLE, xmax: DOUBLE, ymax: DOUBLE>
"""
_GEOJSON_FIELDS = "id STRING, properties STRUCT<kind: STRING, name: STRING, speed: DOUBLE, population: BIGINT>"
_KAFKA_COLUMNS = ("timestamp AS event_time", "partition AS source_partition", "offset AS source_offset")
PARSE = {
    "geojson": (
        "ST_GeomFromGeoJSON(CAST(value AS STRING)) AS geom",
        f"from_json(CAST(value AS STRING), '{_GEOJSON_FIELDS}') AS feature",
        "coalesce(feature.id, CAST(key AS STRING)) AS event_id",
        "feature.properties.kind AS kind",
        "feature.properties.name AS name",
        "feature.properties.speed AS speed",
        "feature.properties.population AS population",
        *_KAFKA_COLUMNS,
    ),
    "wkb": (
        "ST_GeomFromWKB(value) AS geom",
        "CAST(key AS STRING) AS event_id",
        "CAST(NULL AS STRING) AS kind",
        "CAST(NULL AS STRING) AS name",
        "CAST(NULL AS DOUBLE) AS speed",
        "CAST(NULL AS BIGINT) AS population",
        *_KAFKA_COLUMNS,
    ),
}
# Computed before the sort, so the shuffle carries the written columns and not Sedona's geometry.
OUTPUT = (
    "event_id",
    "event_time",
    "kind",
    "name",
    "speed",
    "population",
    "source_partition",
    "source_offset",
    "ST_AsBinary(geom) AS geometry",
    "named_struct('xmin', ST_XMin(geom), 'ymin', ST_YMin(geom), 'xmax', ST_XMax(geom), 'ymax', ST_YMax(geom)) AS bbox",
    "ST_GeoHash(geom, 12) AS geohash",
)
DATASET_FORMATS = {"geojson-points": "geojson", "wkb-points": "wkb", "wkb-polygons": "wkb"}


class PlainStackError(RuntimeError):
    """The plain stack's run failed or did not commit the events it was given."""


@dataclass(frozen=True)
class PlainStackRun:
    bootstrap: str
    topic: str
    fmt: str  # "geojson" or "wkb"
    expected_events: int
    max_offsets_per_trigger: int
    trigger: str  # a processingTime interval ("0 seconds") or "availableNow"
    run_dir: str
    cache_dir: str
    master: str
    driver_memory: str
    timeout_s: float
    # A topic of the same kind of events, drained by the same query into a table of its own before
    # the measured run, so that the JVM has compiled the hot paths (a service runs warm).
    warmup_topic: str | None = None


def plain_stack_jars(cache_dir: str | Path) -> list[Path]:
    """Sedona, GeoTools and Iceberg's Spark runtime from Maven Central, minus what Spark ships."""
    jars = resolve(
        STACK_JARS, Path(cache_dir), JARS_FOLDER, progress=lambda message: print(message, file=sys.stderr, flush=True)
    )
    return without_spark_jars(jars)


def session_conf(warehouse: Path) -> dict[str, str]:
    return {
        "spark.sql.extensions": "org.apache.sedona.sql.SedonaSqlExtensions,"
        "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        # Sedona's docs add Kryo with its registrator for the RDD API; DataFrame shuffles use
        # Spark's own row format whatever spark.serializer says, so it is left at geoingest's.
        # A Hadoop catalog on a local folder: Iceberg's runtime jar holds it (the JDBC catalog
        # would need a driver jar, Hive a metastore, REST a server), and its commit is one atomic
        # rename of the metadata file, about what geoingest's SQLite catalog costs.
        f"spark.sql.catalog.{CATALOG}": "org.apache.iceberg.spark.SparkCatalog",
        f"spark.sql.catalog.{CATALOG}.type": "hadoop",
        f"spark.sql.catalog.{CATALOG}.warehouse": warehouse.resolve().as_uri(),
    }


def table_name(topic: str, max_offsets_per_trigger: int) -> str:
    return f"{CATALOG}.{NAMESPACE}.{re.sub(r'[^0-9A-Za-z_]', '_', topic)}_{max_offsets_per_trigger}"


# -- the caller's side ----------------------------------------------------------------------------
@dataclass
class PlainStackProcess:
    """A plain stack's query running in a child process of its own session (its JVM and Python
    workers go with it): its folder, the Iceberg table's folder, and the process."""

    spec: PlainStackRun
    process: subprocess.Popen
    log_path: Path

    @property
    def table_location(self) -> Path:
        """The table's folder in the Hadoop catalog's warehouse (metadata/ holds its versions)."""
        _, namespace, name = table_name(self.spec.topic, self.spec.max_offsets_per_trigger).split(".")
        return Path(self.spec.run_dir) / "warehouse" / namespace / name

    def wait(self) -> dict:
        """Its figures, once it consumed and committed `expected_events` (or failed)."""
        spec, process = self.spec, self.process
        try:
            process.wait(timeout=spec.timeout_s + 300)
        except subprocess.TimeoutExpired as error:
            raise PlainStackError(
                f"plain stack on topic {spec.topic!r} ran past {spec.timeout_s + 300:.0f} s; log: {self.log_path}\n"
                f"{_tail(self.log_path)}"
            ) from error
        finally:
            self.stop()
        result_path = Path(spec.run_dir) / "result.json"
        if process.returncode != 0 or not result_path.exists():
            raise PlainStackError(
                f"plain stack on topic {spec.topic!r} (batches of {spec.max_offsets_per_trigger}, trigger "
                f"{spec.trigger!r}) exited with {process.returncode}; log: {self.log_path}\n{_tail(self.log_path)}"
            )
        return json.loads(result_path.read_text())

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def launch_plain_stack(
    bootstrap: str,
    topic: str,
    fmt: str,
    expected_events: int,
    max_offsets_per_trigger: int,
    trigger: str = "0 seconds",
    workdir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    master: str = "local[2]",
    driver_memory: str = "4g",
    timeout_s: float = 3600.0,
    warmup_topic: str | None = None,
) -> PlainStackProcess:
    """Start the plain stack over `topic` from the earliest offset in a fresh Python process and
    JVM; it stops once `expected_events` are consumed and committed (or at `stop()`).

    `trigger`: a processingTime interval (the default "0 seconds" is a service catching up on a
    backlog) or "availableNow". Each run works in a new folder under `workdir` (warehouse,
    checkpoint, the child's log, its result)."""
    if fmt not in PARSE:
        raise ValueError(f"fmt: {fmt!r} is not one of {sorted(PARSE)}")
    if expected_events <= 0 or max_offsets_per_trigger <= 0:
        raise ValueError(
            f"expected_events ({expected_events}) and max_offsets_per_trigger "
            f"({max_offsets_per_trigger}) must be positive"
        )
    if cache_dir is None:
        from app.settings import load_settings

        cache_dir = load_settings(env={}).cache_dir
    plain_stack_jars(cache_dir)  # downloaded here once, so the child's time is the stack's own
    base = Path(workdir) if workdir is not None else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    prefix = f"plain-{re.sub(r'[^0-9A-Za-z_.-]', '_', topic)}-{max_offsets_per_trigger}-"
    run_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    spec = PlainStackRun(
        bootstrap,
        topic,
        fmt,
        expected_events,
        max_offsets_per_trigger,
        trigger,
        str(run_dir),
        str(cache_dir),
        master,
        driver_memory,
        timeout_s,
        warmup_topic,
    )
    (run_dir / "spec.json").write_text(json.dumps(asdict(spec), indent=2))
    log_path = run_dir / "plain-stack.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with open(log_path, "wb") as log:
        command = [sys.executable, str(Path(__file__).resolve()), "--child", str(run_dir / "spec.json")]
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT), start_new_session=True
        )
    return PlainStackProcess(spec, process, log_path)


def run_plain_stack(*args: Any, **kwargs: Any) -> dict:
    """`launch_plain_stack(...)`, waited for: its figures (events/s from query start to the last
    commit, batches, rows read back from the table, seconds per stage, session start apart)."""
    return launch_plain_stack(*args, **kwargs).wait()


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# -- the child: one session, one query ------------------------------------------------------------
def _child(spec: PlainStackRun) -> dict:
    from pyspark.sql.streaming.listener import StreamingQueryListener

    from app.spark import spark_session

    run_dir = Path(spec.run_dir)
    table = table_name(spec.topic, spec.max_offsets_per_trigger)
    jars = plain_stack_jars(spec.cache_dir)

    started = time.monotonic()
    spark = spark_session(
        spec.master,
        spec.cache_dir,
        spec.driver_memory,
        extra_conf=session_conf(run_dir / "warehouse"),
        app_name="plain-stack",
        extra_jars=jars,
    )
    session_start_s = time.monotonic() - started
    memory = PeakMemory(os.getpid())

    started = time.monotonic()
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.{NAMESPACE}")
    for name in (table, f"{table}_warmup"):
        spark.sql(f"CREATE TABLE {name} ({TABLE_COLUMNS}) USING iceberg TBLPROPERTIES ('format-version'='2')")
    # A tiny batch through the whole stack first, as geoingest's benchmark starts its Python
    # workers before its query: classes loaded and every stage run once, into a table of its own.
    write_events(_warmup_events(spark, spec.fmt), spec.fmt, f"{table}_warmup")
    if spec.warmup_topic:
        warm = (
            _kafka_reader(spark, spec, spec.warmup_topic)
            .load()
            .writeStream.foreachBatch(lambda batch, _: write_events(batch, spec.fmt, f"{table}_warmup"))
            .option("checkpointLocation", str(run_dir / "warmup-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        warm.awaitTermination()
        if warm.exception() is not None:
            raise PlainStackError(f"the warm-up on topic {spec.warmup_topic!r} failed: {warm.exception()}")
    warmup_s = time.monotonic() - started

    batches: list[dict] = []  # one per foreachBatch call, wall clock in epoch seconds

    def write_batch(batch, batch_id: int) -> None:
        began = time.time()
        write_events(batch, spec.fmt, table)
        batches.append({"batch_id": batch_id, "began": began, "ended": time.time()})

    progress_by_batch: dict[int, dict] = {}
    listener_errors: list[str] = []
    consumed = threading.Event()

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event) -> None:
            pass

        def onQueryProgress(self, event) -> None:
            # Events are counted from the batch's offset range: numInputRows counts every job that
            # scans the batch, and the range partitioner's sample is one more.
            try:
                report = event.progress
                source = report.sources[0]
                progress_by_batch[report.batchId] = {
                    "batch_id": report.batchId,
                    "rows": _offset_count(source.startOffset, source.endOffset),
                    "num_input_rows": report.numInputRows,
                    "duration_ms": dict(report.durationMs),
                }
            except Exception as error:  # the listener bus only logs it: stop waiting instead
                listener_errors.append(f"progress of batch {getattr(event.progress, 'batchId', '?')}: {error!r}")
                consumed.set()
                return
            if sum(p["rows"] for p in progress_by_batch.values()) >= spec.expected_events:
                consumed.set()

        def onQueryIdle(self, event) -> None:
            pass

        def onQueryTerminated(self, event) -> None:
            consumed.set()

    spark.streams.addListener(Progress())
    writer = (
        _kafka_reader(spark, spec, spec.topic)
        .load()
        .writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", str(run_dir / "checkpoint"))
        .queryName("plain-stack")
    )
    if spec.trigger == AVAILABLE_NOW:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=spec.trigger)

    with memory:
        query_started = time.time()
        query = writer.start()
        finished = consumed.wait(spec.timeout_s)
        if spec.trigger == AVAILABLE_NOW:
            query.awaitTermination(max(1.0, spec.timeout_s - (time.time() - query_started)))
        failure = query.exception()
        query.stop()
    progress = sorted(progress_by_batch.values(), key=lambda p: p["batch_id"])
    if failure is not None:
        raise PlainStackError(f"the query on topic {spec.topic!r} failed: {failure}")
    if listener_errors:
        raise PlainStackError(f"topic {spec.topic!r}: unreadable query progress: {'; '.join(listener_errors)}")
    rows_in = sum(p["rows"] for p in progress)
    if not finished or (spec.trigger != AVAILABLE_NOW and rows_in < spec.expected_events):
        raise PlainStackError(
            f"topic {spec.topic!r}: {rows_in} of {spec.expected_events} events consumed within {spec.timeout_s:.0f} s"
        )

    batches = [b for b in batches if any(p["batch_id"] == b["batch_id"] and p["rows"] for p in progress)]
    last_commit = max(b["ended"] for b in batches)
    seconds = last_commit - query_started
    # The batches committed through foreachBatch's own session; this one's catalog caches the table.
    spark.sql(f"REFRESH TABLE {table}")
    committed_rows = spark.table(table).count()
    snapshots = spark.sql(f"SELECT summary['added-data-files'] AS files FROM {table}.snapshots").collect()
    in_batches = sum(p["duration_ms"].get("triggerExecution", 0) for p in progress if p["rows"]) / 1000
    result = {
        "stack": f"Spark Kafka source + {SEDONA} + {ICEBERG}",
        "jars": [jar.name for jar in jars],
        "topic": spec.topic,
        "format": spec.fmt,
        "trigger": spec.trigger,
        "max_offsets_per_trigger": spec.max_offsets_per_trigger,
        "master": spec.master,
        "driver_memory": spec.driver_memory,
        "table": table,
        "expected_events": spec.expected_events,
        "consumed_events": rows_in,
        "committed_rows": committed_rows,
        "batches": len(batches),
        "commits": len(snapshots),
        "files": sum(int(s.files or 0) for s in snapshots),
        "seconds": round(seconds, 2),
        "events_per_s": round(rows_in / seconds),
        "seconds_in_batches": round(in_batches, 2),
        "events_per_s_in_batches": round(rows_in / max(in_batches, 1e-9)),
        "startup_s": round(min(b["began"] for b in batches) - query_started, 2),
        "session_start_s": round(session_start_s, 2),
        "warmup_s": round(warmup_s, 2),
        "stage_seconds": _stage_seconds(spark, batches, progress),
        "jvm_peak_mb": memory.figures()["jvm"],
    }
    spark.stop()
    return result


def _kafka_reader(spark, spec: PlainStackRun, topic: str):
    """The Kafka source with geoingest's options (streaming/job/processor.py), without the headers it never reads."""
    from streaming.job.config import kafka_source_options

    options = {
        **kafka_source_options(spec.bootstrap, topic, spark.sparkContext.defaultParallelism),
        "includeHeaders": "false",
    }
    return (
        spark.readStream.format("kafka")
        .options(**options)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(spec.max_offsets_per_trigger))
    )


def write_events(events, fmt: str, table: str) -> None:
    """One micro-batch of Kafka rows into `table`: parse, drop rows without a geometry, bbox and
    WKB, sort by geohash, append (one Iceberg commit)."""
    # Only a null Kafka value gives a null geometry: Sedona's constructors raise on malformed
    # input (InferredExpressionException), which fails the batch and so the query.
    (
        events.selectExpr(*PARSE[fmt])
        .where("geom IS NOT NULL")
        .selectExpr(*OUTPUT)
        .orderBy("geohash")
        .drop("geohash")
        .writeTo(table)
        .append()
    )


def _warmup_events(spark, fmt: str, count: int = 64):
    """Kafka-shaped rows of valid points around Paris, in the run's format."""
    rows = []
    for i in range(count):
        lon, lat = 2.2 + i * 0.005, 48.8 + i * 0.002
        if fmt == "geojson":
            value = (
                '{"type":"Feature","id":"w%d","geometry":{"type":"Point","coordinates":[%.6f,%.6f]},'
                '"properties":{"kind":"warmup","speed":1.0}}' % (i, lon, lat)
            ).encode()
        else:
            value = struct.pack("<BIdd", 1, 1, lon, lat)  # little-endian WKB Point
        rows.append((f"w{i}".encode(), value, "warmup", i % 2, i, datetime.now(UTC), 0))
    return spark.createDataFrame(
        rows,
        "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, timestampType INT",
    )


def _offset_count(start: str | None, end: str | None) -> int:
    """Records between two Kafka source offsets ('{"topic": {"0": 12, ...}}'); a batch with no start
    offset began at the partitions' first offset, 0 on a topic whose records were never deleted."""

    def parsed(offsets: str | None) -> dict:
        # pyspark hands a missing offset over as the text "None".
        return json.loads(offsets) if offsets and offsets not in ("None", "null") else {}

    ends, starts = parsed(end), parsed(start)
    return sum(
        offset - starts.get(topic, {}).get(partition, 0)
        for topic, partitions in ends.items()
        for partition, offset in partitions.items()
    )


def _stage_seconds(spark, batches: list[dict], progress: list[dict]) -> dict:
    """Where each batch's time went, from Spark's own record of its stages (kept with the UI off).

    Within a foreachBatch call the stages run one after the other: the range partitioner's sample
    (Kafka read + parse, no shuffle), the map stage (Kafka read again + parse + shuffle write), the
    result stage (shuffle read + sort + Parquet write); the Iceberg commit follows the last task on
    the driver. Outside it, the trigger's own work (offsets, planning, checkpoint)."""
    stages = []
    store = spark.sparkContext._jsc.sc().statusStore()
    gateway = spark.sparkContext._gateway
    listed = store.stageList(None, False, False, gateway.new_array(gateway.jvm.double, 0), None)
    iterator = listed.iterator()
    while iterator.hasNext():
        stage = iterator.next()
        if not (stage.submissionTime().isDefined() and stage.completionTime().isDefined()):
            continue
        stages.append(
            {
                "began": stage.submissionTime().get().getTime() / 1000,
                "ended": stage.completionTime().get().getTime() / 1000,
                "shuffle_read": stage.shuffleReadRecords(),
                "shuffle_write": stage.shuffleWriteRecords(),
            }
        )
    totals = dict.fromkeys(
        (
            "plan",
            "read_parse_sample",
            "read_parse_shuffle",
            "sort_write",
            "commit",
            "other_in_batch",
            "trigger_overhead",
        ),
        0.0,
    )
    for batch in batches:
        # Stage and batch times come from one clock; a millisecond of slack for the stage's rounding.
        mine = sorted(
            (s for s in stages if batch["began"] - 0.001 <= s["began"] <= batch["ended"]), key=lambda s: s["began"]
        )
        wall = batch["ended"] - batch["began"]
        if not mine:
            totals["other_in_batch"] += wall
            continue
        for stage in mine:
            kind = (
                "sort_write"
                if stage["shuffle_read"]
                else "read_parse_shuffle"
                if stage["shuffle_write"]
                else "read_parse_sample"
            )
            totals[kind] += stage["ended"] - stage["began"]
        totals["plan"] += mine[0]["began"] - batch["began"]
        totals["commit"] += batch["ended"] - max(s["ended"] for s in mine)
    in_stages = sum(totals[k] for k in ("plan", "read_parse_sample", "read_parse_shuffle", "sort_write", "commit"))
    totals["other_in_batch"] += max(0.0, sum(b["ended"] - b["began"] for b in batches) - in_stages)
    totals["trigger_overhead"] = sum(
        (p["duration_ms"].get("triggerExecution", 0) - p["duration_ms"].get("addBatch", 0)) / 1000
        for p in progress
        if p["rows"]
    )
    totals["read_parse"] = totals["read_parse_sample"] + totals["read_parse_shuffle"]
    totals["sort_write_commit"] = totals["sort_write"] + totals["commit"]
    return {k: round(v, 2) for k, v in totals.items()}


# -- run alone ------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument(
        "--datasets",
        default="geojson-points,wkb-points,wkb-polygons",
        help=f"comma separated, of {', '.join(DATASET_FORMATS)}",
    )
    parser.add_argument("--batch-sizes", default="1000000,40000", help="maxOffsetsPerTrigger values, comma separated")
    parser.add_argument("--trigger", default="0 seconds", help=f"a processingTime interval or {AVAILABLE_NOW}")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--workdir", help="default: a new temporary folder")
    parser.add_argument("--cache-dir", help="default: geoingest's (GEOINGEST_CACHE_DIR)")
    args = parser.parse_args()
    if args.child:
        spec = PlainStackRun(**json.loads(Path(args.child).read_text()))
        result = _child(spec)
        (Path(spec.run_dir) / "result.json").write_text(json.dumps(result, indent=2))
        return

    from ingest import make_events  # bench/ingest.py, beside this script

    from app.local.broker import LocalBroker, free_port
    from app.local.sample import produce
    from app.settings import load_settings

    datasets = args.datasets.split(",")
    unknown = [d for d in datasets if d not in DATASET_FORMATS]
    if unknown:
        parser.error(f"--datasets: unknown dataset(s) {', '.join(unknown)}; known: {', '.join(DATASET_FORMATS)}")
    try:
        batch_sizes = [int(size) for size in args.batch_sizes.split(",")]
    except ValueError:
        parser.error(f"--batch-sizes: {args.batch_sizes!r} is not a comma separated list of integers")
    cache_dir = args.cache_dir or load_settings(env={}).cache_dir
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="plain-stack-"))
    plain_stack_jars(cache_dir)
    # `timeout` and friends send SIGTERM: leave through the finally blocks, the broker stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    broker = LocalBroker(workdir / "broker", Path(cache_dir), port=free_port())
    broker.ensure_jars()
    broker.start()
    report = {"events": args.events, "cores": os.cpu_count(), "trigger": args.trigger, "results": []}
    try:
        for dataset in datasets:
            events = make_events(dataset, args.events)
            produce(broker.bootstrap, dataset, events, total=len(events), progress=False)
            del events
            for size in batch_sizes:
                result = run_plain_stack(
                    broker.bootstrap,
                    dataset,
                    DATASET_FORMATS[dataset],
                    args.events,
                    size,
                    trigger=args.trigger,
                    workdir=workdir,
                    cache_dir=cache_dir,
                    master=args.master,
                    driver_memory=args.driver_memory,
                )
                result["dataset"] = dataset
                report["results"].append(result)
                print(json.dumps(result), file=sys.stderr, flush=True)
    finally:
        broker.stop()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

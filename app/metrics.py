"""Every metric the service exports, declared in one place, on a registry the caller injects.

The driver alone exports: executors send their counts back with the file metadata, and the
driver turns each batch report into metric updates here.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from streaming.decode.rejects import Reason
from streaming.job.processor import BatchReport
from streaming.maintenance.maintain import MaintenanceReport
from streaming.write.freshness import ages_at

_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_FRESHNESS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600, 21600, 86400)
# Event to visible: fine below the seconds a streaming table is judged by, coarse above.
_EVENT_FRESHNESS = (0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400)
_ROWS = (1_000, 10_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000)
_RETRIES = (0, 1, 2, 3, 5, 8, 13)
COMMIT_OUTCOMES = ("committed", "skipped_replay", "failed")
# The families declared on each registry, by name: a service writing many tables declares each once
# and every table's metrics are its labelled children.
_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, Any]] = weakref.WeakKeyDictionary()
_Family = TypeVar("_Family")


def _declared(kind: Callable[..., _Family], name: str, documentation: str, labels, registry, **more) -> _Family:
    """The registry's family of that name, declared by the first table that asks for it."""
    families = _FAMILIES.setdefault(registry, {})
    if name not in families:
        families[name] = kind(name, documentation, labels, registry=registry, **more)
    return families[name]


class IngestMetrics:
    def __init__(self, registry: CollectorRegistry, table: str, topic: str):
        self.registry = registry
        self.table = table
        self.topic = topic
        t = ("table",)
        tt = ("topic", "table")
        self.events_consumed = _declared(
            Counter, "geoingest_events_consumed", "Kafka records consumed", tt, registry=registry
        )
        self.events_committed = _declared(
            Counter, "geoingest_events_committed", "Rows committed to the table", tt, registry=registry
        )
        self.events_rejected = _declared(
            Counter, "geoingest_events_rejected", "Records rejected, by reason code", (*tt, "reason"), registry=registry
        )
        self.batches = _declared(Counter, "geoingest_batches", "Micro-batches processed", t, registry=registry)
        self.batch_duration = _declared(
            Histogram,
            "geoingest_batch_duration_seconds",
            "Micro-batch wall time",
            t,
            buckets=_SECONDS,
            registry=registry,
        )
        self.files_written = _declared(Counter, "geoingest_files_written", "Data files written", t, registry=registry)
        self.bytes_written = _declared(
            Counter, "geoingest_bytes_written", "Bytes of data files written", t, registry=registry
        )
        self.rows_per_file = _declared(
            Histogram, "geoingest_rows_per_file", "Rows in each data file written", t, buckets=_ROWS, registry=registry
        )
        self.commits = _declared(
            Counter,
            "geoingest_commits",
            "Commits by outcome (committed, skipped_replay, failed)",
            (*t, "outcome"),
            registry=registry,
        )
        self.commit_conflicts = _declared(
            Counter, "geoingest_commit_conflicts", "Commit attempts refused as conflicts", t, registry=registry
        )
        self.commit_retries = _declared(
            Histogram, "geoingest_commit_retries", "Retries a commit needed", t, buckets=_RETRIES, registry=registry
        )
        self.commit_duration = _declared(
            Histogram,
            "geoingest_commit_duration_seconds",
            "Commit wall time, retries included",
            t,
            buckets=_SECONDS,
            registry=registry,
        )
        self.last_snapshot_id = _declared(
            Gauge, "geoingest_last_snapshot_id", "Id of the last snapshot committed", t, registry=registry
        )
        self.last_commit_timestamp = _declared(
            Gauge, "geoingest_last_commit_timestamp_seconds", "Unix time of the last commit", t, registry=registry
        )
        self.freshness = _declared(
            Histogram,
            "geoingest_freshness_seconds",
            "Event timestamp to commit, per topic-partition of a batch (oldest event)",
            t,
            buckets=_FRESHNESS,
            registry=registry,
        )
        self.kafka_lag = _declared(
            Gauge,
            "geoingest_kafka_lag",
            "Offsets behind the latest, per topic-partition",
            ("topic", "partition", "table"),
            registry=registry,
        )
        self.last_progress = _declared(
            Gauge,
            "geoingest_last_progress_timestamp_seconds",
            "Unix time of the last batch or idle poll of the streaming query",
            t,
            registry=registry,
        )
        self.event_freshness = _declared(EventFreshness, EventFreshness.NAME, "", (), registry)
        self.event_freshness.watch(table)
        self.properties_ignored = _declared(
            Gauge,
            "geoingest_properties_ignored",
            "Property names no column maps in the last batch (schema_evolution off: in the decoders' sample "
            "of each batch; add-columns: those it could not add)",
            t,
            registry=registry,
        )
        self.columns_added = _declared(
            Counter, "geoingest_columns_added", "Columns added to the table by schema evolution", t, registry=registry
        )
        self.batch_running = _declared(
            Gauge,
            "geoingest_batch_running_seconds",
            "How long the batch in progress has run (0 between batches)",
            t,
            registry=registry,
        )
        self.batch_expected = _declared(
            Gauge,
            "geoingest_batch_expected_seconds",
            "How long a batch may run before /readyz calls it slow",
            t,
            registry=registry,
        )
        for gauge in (self.batch_running, self.batch_expected):
            gauge.labels(table).set(0)
        # Every series a batch can move, scraped at 0 from the start: rate() and increase() need a
        # sample before the first reject of a reason, the first conflict, the first failed commit.
        for counter in (self.events_consumed, self.events_committed):
            counter.labels(topic, table)
        for reason in Reason:
            self.events_rejected.labels(topic, table, reason.value)
        for outcome in COMMIT_OUTCOMES:
            self.commits.labels(table, outcome)
        for per_table in (
            self.batches,
            self.batch_duration,
            self.files_written,
            self.bytes_written,
            self.rows_per_file,
            self.commit_conflicts,
            self.commit_retries,
            self.commit_duration,
            self.freshness,
            self.columns_added,
        ):
            per_table.labels(table)

    def watch_health(self, health: Health) -> None:
        """Export how long the batch in progress has run, and how long a batch may (see Health)."""
        self.batch_running.labels(self.table).set_function(health.batch_running_s)
        self.batch_expected.labels(self.table).set_function(health.expected_batch_s)

    def observe_batch(self, report: BatchReport) -> None:
        table, topic = self.table, self.topic
        self.batches.labels(table).inc()
        self.batch_duration.labels(table).observe(report.seconds.get("total", 0.0))
        self.events_consumed.labels(topic, table).inc(report.consumed)
        self.properties_ignored.labels(table).set(len(report.ignored_properties))
        for reason, n in report.rejected.items():
            self.events_rejected.labels(topic, table, reason).inc(n)
        outcome = report.outcome
        if outcome is None:
            return
        self.commits.labels(table, outcome.status).inc()
        self.commit_conflicts.labels(table).inc(outcome.conflicts)
        self.commit_retries.labels(table).observe(outcome.conflicts)
        self.commit_duration.labels(table).observe(outcome.duration_s)
        if outcome.status != "committed":
            return
        self.events_committed.labels(topic, table).inc(report.committed_rows)
        self.columns_added.labels(table).inc(len(report.added_columns))
        self.files_written.labels(table).inc(len(report.files))
        self.bytes_written.labels(table).inc(sum(f.file_size_in_bytes for f in report.files))
        for f in report.files:
            self.rows_per_file.labels(table).observe(f.record_count)
        now = time.time()
        self.last_snapshot_id.labels(table).set(outcome.snapshot_id or 0)
        self.last_commit_timestamp.labels(table).set(now)
        for oldest_ms in report.oldest_event_ms.values():
            self.freshness.labels(table).observe(max(0.0, now - oldest_ms / 1000))
        self.event_freshness.observe(table, *ages_at(now, list(report.event_times)))
        self.last_progress.labels(table).set(now)

    def observe_failed_commit(self) -> None:
        self.commits.labels(self.table, "failed").inc()

    def observe_progress(self, progress: dict, latest_offsets: dict[tuple[str, int], int] | None = None) -> int:
        """A StreamingQueryProgress (as a dict): Kafka lag per partition, and that the query is alive.
        latest_offsets: the topic's end offsets when the source does not report them (the Python
        source reports the end of the batch it planned, capped by maxOffsetsPerTrigger). Returns
        the records waiting, over all partitions."""
        self.last_progress.labels(self.table).set(time.time())
        waiting = 0
        for source in progress.get("sources", []):
            if latest_offsets is None:
                latest = _offsets(source.get("latestOffset"))
            else:
                latest = {(topic, str(partition)): offset for (topic, partition), offset in latest_offsets.items()}
            done = _offsets(source.get("endOffset"))
            for (topic, partition), end in latest.items():
                behind = end - done.get((topic, partition), 0)
                self.kafka_lag.labels(topic, partition, self.table).set(max(0, behind))
                waiting += max(0, behind)
        return waiting


class EventFreshness(Collector):
    """geoingest_event_freshness_seconds: every committed event's age (Kafka timestamp to the
    commit that made it visible), per table. A histogram of its own, since a batch observes its
    events by the bin (streaming/write/freshness.py), many at once, which prometheus_client's
    Histogram cannot."""

    NAME = "geoingest_event_freshness_seconds"

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...], registry: CollectorRegistry):
        self.buckets = np.array(_EVENT_FRESHNESS, dtype=np.float64)
        # table -> counts per bucket (the last one: +Inf), and the sum of the ages
        self._tables: dict[str, tuple[np.ndarray, list[float]]] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def watch(self, table: str) -> None:
        """The table's series, at 0 until its first commit."""
        with self._lock:
            self._tables.setdefault(table, (np.zeros(len(self.buckets) + 1, dtype=np.int64), [0.0]))

    def observe(self, table: str, ages_s: np.ndarray, counts: np.ndarray) -> None:
        where = np.searchsorted(self.buckets, ages_s, side="left")  # le: an age on an edge is in it
        self.watch(table)
        with self._lock:
            bucket_counts, total = self._tables[table]
            np.add.at(bucket_counts, where, counts)
            total[0] += float(np.dot(ages_s, counts))

    def collect(self):
        family = HistogramMetricFamily(
            self.NAME, "Age of every committed event at the commit that made it visible", labels=["table"]
        )
        edges = [repr(float(b)) for b in self.buckets] + ["+Inf"]
        with self._lock:
            for table, (bucket_counts, total) in sorted(self._tables.items()):
                cumulative = np.cumsum(bucket_counts).tolist()
                family.add_metric([table], buckets=list(zip(edges, cumulative)), sum_value=total[0])
        yield family


class MaintenanceMetrics:
    """Table maintenance (streaming/maintenance/maintain.py), run by the service or `geoingest table maintain`."""

    OUTCOMES = ("completed", "skipped", "gave_up", "failed")
    STEPS = ("total", "retention", "compact", "expire", "orphans")

    def __init__(self, registry: CollectorRegistry, table: str):
        self.registry = registry
        self.table = table
        t = ("table",)
        self.runs = _declared(
            Counter,
            "geoingest_maintenance_runs",
            "Maintenance runs by outcome (completed, skipped: another maintainer held the table's lease, "
            "gave_up: a commit lost every retry to concurrent commits, failed)",
            (*t, "outcome"),
            registry=registry,
        )
        self.duration = _declared(
            Histogram,
            "geoingest_maintenance_duration_seconds",
            "Maintenance wall time, by step",
            (*t, "step"),
            buckets=_SECONDS,
            registry=registry,
        )
        self.files_rewritten = _declared(
            Counter, "geoingest_maintenance_files_rewritten", "Small data files compacted away", t, registry=registry
        )
        self.bytes_rewritten = _declared(
            Counter, "geoingest_maintenance_bytes_rewritten", "Bytes of data files compacted away", t, registry=registry
        )
        self.files_written = _declared(
            Counter, "geoingest_maintenance_files_written", "Data files written by compaction", t, registry=registry
        )
        self.bytes_written = _declared(
            Counter,
            "geoingest_maintenance_bytes_written",
            "Bytes of data files written by compaction",
            t,
            registry=registry,
        )
        self.conflicts = _declared(
            Counter,
            "geoingest_maintenance_conflicts",
            "Maintenance commits refused as conflicts (then retried on a fresh table)",
            t,
            registry=registry,
        )
        self.bins_abandoned = _declared(
            Counter,
            "geoingest_maintenance_bins_abandoned",
            "Compaction bins given up because their files were replaced meanwhile",
            t,
            registry=registry,
        )
        self.snapshots_expired = _declared(
            Counter, "geoingest_maintenance_snapshots_expired", "Snapshots expired", t, registry=registry
        )
        self.files_deleted = _declared(
            Counter,
            "geoingest_maintenance_files_deleted",
            "Files deleted: only referenced by expired snapshots (expired), or by nothing (orphan)",
            (*t, "reason"),
            registry=registry,
        )
        # Retention (streaming/maintenance/retention.py): what left the table as past the horizon.
        self.retention_partitions = _declared(
            Counter,
            "geoingest_retention_partitions_dropped",
            "Partitions dropped whole by retention (a metadata-only delete)",
            t,
            registry=registry,
        )
        self.retention_files = _declared(
            Counter, "geoingest_retention_files_dropped", "Data files dropped by retention", t, registry=registry
        )
        self.retention_rows = _declared(
            Counter, "geoingest_retention_rows_dropped", "Rows dropped by retention", t, registry=registry
        )
        self.retention_bytes = _declared(
            Counter,
            "geoingest_retention_bytes_dropped",
            "Bytes of data files dropped by retention (freed once the snapshots before the drop expire)",
            t,
            registry=registry,
        )
        self.retention_horizon = _declared(
            Gauge,
            "geoingest_retention_horizon_timestamp_seconds",
            "Unix time before which rows are dropped, at the last maintenance run with a retention",
            t,
            registry=registry,
        )
        self.cpu = _declared(
            Counter,
            "geoingest_maintenance_cpu_seconds",
            "CPU time maintenance runs took (in maintenance_mode beside: the child process's, every thread)",
            t,
            registry=registry,
        )
        self.paced = _declared(
            Counter,
            "geoingest_maintenance_paced_seconds",
            "Time maintenance runs slept to stay within maintenance_cpu_percent of one core",
            t,
            registry=registry,
        )
        self.data_manifests = _declared(
            Gauge,
            "geoingest_table_data_manifests",
            "Data manifests of the current snapshot, after the last maintenance run",
            t,
            registry=registry,
        )
        self.snapshots = _declared(
            Gauge,
            "geoingest_table_snapshots",
            "Snapshots in the table metadata, after the last maintenance run",
            t,
            registry=registry,
        )
        self.last_run = _declared(
            Gauge,
            "geoingest_maintenance_last_run_timestamp_seconds",
            "Unix time of the last completed maintenance run",
            t,
            registry=registry,
        )
        # Every series exists at 0 from the start: increase() and rate() need a sample before the
        # first run, or the first compaction, expiry and deletion never show on the dashboard.
        for outcome in self.OUTCOMES:
            self.runs.labels(table, outcome)
        for step in self.STEPS:
            self.duration.labels(table, step)
        for reason in ("expired", "orphan"):
            self.files_deleted.labels(table, reason)
        for counter in (
            self.files_rewritten,
            self.bytes_rewritten,
            self.files_written,
            self.bytes_written,
            self.conflicts,
            self.bins_abandoned,
            self.snapshots_expired,
            self.retention_partitions,
            self.retention_files,
            self.retention_rows,
            self.retention_bytes,
            self.cpu,
            self.paced,
        ):
            counter.labels(table)

    def observe_skip(self) -> None:
        self.runs.labels(self.table, "skipped").inc()

    def observe(self, report: MaintenanceReport, snapshots: int, data_manifests: int) -> None:
        t = self.table
        self.runs.labels(t, "completed").inc()
        self.duration.labels(t, "total").observe(report.seconds)
        self.conflicts.labels(t).inc(report.conflicts)
        if report.retention is not None:
            r = report.retention
            self.duration.labels(t, "retention").observe(r.seconds)
            self.retention_partitions.labels(t).inc(r.partitions_dropped)
            self.retention_files.labels(t).inc(r.files_dropped)
            self.retention_rows.labels(t).inc(r.rows_dropped)
            self.retention_bytes.labels(t).inc(r.bytes_dropped)
            self.retention_horizon.labels(t).set(datetime.fromisoformat(r.horizon).timestamp())
        if report.compaction is not None:
            c = report.compaction
            self.duration.labels(t, "compact").observe(c.seconds)
            self.files_rewritten.labels(t).inc(c.files_rewritten)
            self.bytes_rewritten.labels(t).inc(c.bytes_rewritten)
            self.files_written.labels(t).inc(c.files_written)
            self.bytes_written.labels(t).inc(c.bytes_written)
            self.bins_abandoned.labels(t).inc(c.bins_abandoned)
        if report.expiry is not None:
            self.duration.labels(t, "expire").observe(report.expiry.seconds)
            self.snapshots_expired.labels(t).inc(report.expiry.snapshots_expired)
            self.files_deleted.labels(t, "expired").inc(report.expiry.files_deleted)
        if report.orphans is not None:
            self.duration.labels(t, "orphans").observe(report.orphans.seconds)
            self.files_deleted.labels(t, "orphan").inc(report.orphans.deleted)
        self.snapshots.labels(t).set(snapshots)
        self.data_manifests.labels(t).set(data_manifests)
        self.last_run.labels(t).set(time.time())

    def observe_cost(self, cpu_s: float, paced_s: float) -> None:
        self.cpu.labels(self.table).inc(cpu_s)
        self.paced.labels(self.table).inc(paced_s)

    def observe_failure(self, outcome: str, conflicts: int = 0) -> None:
        self.runs.labels(self.table, outcome).inc()
        self.conflicts.labels(self.table).inc(conflicts)


def _offsets(raw) -> dict[tuple[str, str], int]:
    # pyspark renders a null offset (a batch recovered from the offset log) as the string "None".
    if not raw or raw == "None":
        return {}
    data = json.loads(raw) if isinstance(raw, str) else raw
    return {(topic, str(p)): int(o) for topic, parts in data.items() for p, o in parts.items()}


# A batch is slow once it has run this many times the median of the recent ones, and at least
# SLOW_BATCH_MIN_S (a batch of a backlog after a quiet spell may well take ten quiet batches' time).
SLOW_BATCH_FACTOR = 10
SLOW_BATCH_MIN_S = 30.0
RECENT_BATCHES = 20


@dataclass
class Health:
    """What /readyz answers: the query is active, has shown progress recently, and the batch in
    progress (if any) has not run far longer than batches do. And what /healthz answers (`alive`):
    whether the driver still works at all, for the kubelet to restart it when not."""

    max_silence_s: float
    # /healthz fails past this: the driver's loop silent, or no batch done while records wait
    max_stall_s: float = float("inf")
    query_active: bool = False
    last_progress: float = 0.0
    # Unix time the driver's watch loop last went round (it does every second while the query runs)
    loop_beat: float = field(default_factory=time.time)
    # Unix time the last batch ended, and the records the source had waiting at the last progress
    last_batch_end: float = field(default_factory=time.time)
    records_waiting: int = 0
    # Unix time the batch in progress started, or None between batches
    batch_started: Callable[[], float | None] = lambda: None
    recent_batch_s: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_BATCHES))

    def observe_batch(self, report: BatchReport) -> None:
        self.recent_batch_s.append(report.seconds.get("total", 0.0))
        self.last_batch_end = time.time()

    def batch_running_s(self) -> float:
        started = self.batch_started()
        return 0.0 if started is None else max(0.0, time.time() - started)

    def expected_batch_s(self) -> float:
        """How long a batch may run before it counts as slow: SLOW_BATCH_FACTOR times the median
        of the recent batches, at least SLOW_BATCH_MIN_S; max_silence_s before any batch ended."""
        if not self.recent_batch_s:
            return max(self.max_silence_s, SLOW_BATCH_MIN_S)
        return max(SLOW_BATCH_MIN_S, SLOW_BATCH_FACTOR * statistics.median(self.recent_batch_s))

    def ready(self) -> tuple[bool, str]:
        if not self.query_active:
            return False, "streaming query not active"
        running, expected = self.batch_running_s(), self.expected_batch_s()
        if running > expected:
            return False, f"the batch in progress has run for {running:.0f} s; batches take {expected:.0f} s at most"
        silence = time.time() - self.last_progress
        if silence > self.max_silence_s and not running:
            return False, f"no batch or idle poll for {silence:.0f} s"
        return True, "ok"

    def alive(self) -> tuple[bool, str]:
        """Whether the driver works: its watch loop goes round, no batch runs for ever, and batches
        end while records wait. A frozen process answers nothing, which the probe's timeout takes."""
        now = time.time()
        if now - self.loop_beat > self.max_stall_s:
            return False, f"the driver's watch loop has not gone round for {now - self.loop_beat:.0f} s"
        running = self.batch_running_s()
        if running > self.max_stall_s:
            return False, f"the batch in progress has run for {running:.0f} s"
        idle = now - max(self.last_batch_end, self.batch_started() or 0.0)
        if self.records_waiting > 0 and idle > self.max_stall_s:
            return False, f"no batch for {idle:.0f} s while {self.records_waiting} records wait"
        return True, "ok"


@dataclass
class TablesHealth:
    """/readyz and /healthz of a service over its tables: each table's Health, the first one that
    fails named in the answer. A service with no table yet (routes whose topics do not exist yet)
    is alive, and ready once `ready_without_tables` says so."""

    tables: dict[str, Health] = field(default_factory=dict)
    ready_without_tables: bool = False

    def ready(self) -> tuple[bool, str]:
        return self._all("ready", "no table yet")

    def alive(self) -> tuple[bool, str]:
        return self._all("alive", "")

    def _all(self, check: str, without: str) -> tuple[bool, str]:
        tables = dict(self.tables)
        if not tables:
            return (True, "ok") if check == "alive" or self.ready_without_tables else (False, without)
        for name, health in sorted(tables.items()):
            ok, why = getattr(health, check)()
            if not ok:
                return False, why if len(tables) == 1 else f"table {name}: {why}"
        return True, "ok"


def serve(
    registry: CollectorRegistry, health: Health | TablesHealth, port: int, host: str = "0.0.0.0"
) -> ThreadingHTTPServer:
    """/metrics, /healthz and /readyz on a daemon thread; returns the server (shutdown() stops it)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            if self.path.startswith("/metrics"):
                self._answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                alive, why = health.alive()
                self._answer(200 if alive else 503, f"{why}\n".encode(), "text/plain")
            elif self.path == "/readyz":
                ready, why = health.ready()
                self._answer(200 if ready else 503, f"{why}\n".encode(), "text/plain")
            else:
                self._answer(404, b"not found\n", "text/plain")

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # scrapes every few seconds are not news
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server

"""Wiring of the ingest service: settings -> Spark -> table -> streaming query, and its stop on SIGTERM."""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry
from pyiceberg.table import Table
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from app.logs import configure_logging  # noqa: F401 - the CLI and the demo take it from here
from app.maintenance import (  # noqa: F401 - the CLI takes MAINTENANCE_MODES from here
    MAINTENANCE_MODES,
    MaintenanceChild,
    MaintenanceRunner,
)
from app.maven import configure_iceberg_java
from app.metrics import Health, IngestMetrics, MaintenanceMetrics, TablesHealth, serve
from app.progress import ProgressReader
from app.settings import Settings
from app.spark import local_checkpoint_conf, spark_session
from streaming.contract import Contract
from streaming.decode.decoder import DecodeOptions
from streaming.decode.schema_registry import RegistrySettings
from streaming.job.checkpoint import checkpoint_has_progress, writer_id_for_checkpoint
from streaming.job.config import JobConfig
from streaming.job.processor import BatchProcessor, BatchReport
from streaming.job.stream import start_query
from streaming.source.admin import ensure_topic, partitions_of
from streaming.source.python_source import LatestOffsets, caught_up
from streaming.table.catalog import create_rejects_table, load_contract_table, open_catalog
from streaming.table.commit import resume_offsets
from streaming.table.turns import CommitTurns
from streaming.write.dead_letter import DeadLetterConfig

log = logging.getLogger("geoingest.service")


@dataclass
class RunTotals:
    """Running totals over the batches of one run (the demo summary reads them)."""

    batches: int = 0
    consumed: int = 0
    committed_rows: int = 0
    files: int = 0
    bytes: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    commits: dict[str, int] = field(default_factory=dict)

    def observe(self, report: BatchReport) -> None:
        self.batches += 1
        self.consumed += report.consumed
        self.committed_rows += report.committed_rows if report.outcome and report.outcome.status == "committed" else 0
        self.files += len(report.files)
        self.bytes += sum(f.file_size_in_bytes for f in report.files)
        for reason, n in report.rejected.items():
            self.rejected[reason] = self.rejected.get(reason, 0) + n
        if report.outcome is not None:
            self.commits[report.outcome.status] = self.commits.get(report.outcome.status, 0) + 1


def job_config(settings: Settings, contract: Contract, table: Table, writer_id: str | None = None) -> JobConfig:
    """The query settings of a table's lane: its checkpoint, its writer id (`writer_id`, the settings',
    or the one kept in its checkpoint), dead letters spilled beside the table."""
    checkpoint = settings.checkpoint_for(contract.table)
    return topic_config(
        settings,
        checkpoint,
        writer_id or settings.writer_id or writer_id_for_checkpoint(checkpoint),
        dead_letter_config(settings, table.location(), dict(table.io.properties)),
    )


def topic_config(
    settings: Settings, checkpoint: str, writer_id: str, dead_letter: DeadLetterConfig | None
) -> JobConfig:
    """The query settings of a query reading `settings.topic`."""
    return JobConfig(
        bootstrap_servers=settings.bootstrap_servers,
        topic=settings.topic,
        checkpoint_location=checkpoint,
        writer_id=writer_id,
        starting_offsets=settings.starting_offsets,
        max_offsets_per_trigger=settings.max_offsets_per_trigger,
        rows_per_partition=settings.rows_per_partition,
        clustering=settings.clustering,
        merge_in_task_max_rows=settings.merge_in_task_max_rows,
        kafka_options=dict(settings.kafka),
        decode=DecodeOptions(
            max_message_bytes=settings.max_message_bytes,
            max_vertices=settings.max_vertices,
            max_record_seconds=settings.max_record_seconds,
            max_nesting=settings.max_nesting,
            schema_registry=RegistrySettings.from_mapping(settings.schema_registry),
        ),
        dead_letter=dead_letter,
        rejects_table=settings.rejects_table,
        hold_after_commit_file=settings.hold_after_commit_file,
        source=settings.source,
    )


def dead_letter_config(settings: Settings, location: str, io_properties: dict[str, str]) -> DeadLetterConfig:
    """The dead letters of `settings.topic`, those too large for the topic spilled under
    `dead_letter_spill_location`, or `location`/dead-letters."""
    return DeadLetterConfig(
        bootstrap_servers=settings.bootstrap_servers,
        topic=settings.dead_letter_topic,
        kafka_options=dict(settings.kafka),
        max_record_bytes=settings.dead_letter_max_record_bytes,
        spill_location=settings.dead_letter_spill_location or f"{location.rstrip('/')}/dead-letters",
        io_properties=io_properties,
    )


def start_spark(settings: Settings) -> SparkSession:
    return spark_session(settings.spark_master, settings.cache_dir, settings.driver_memory, spark_conf(settings))


def spark_conf(settings: Settings) -> dict[str, str]:
    """The service's Spark configuration: the settings' spark.* over what its checkpoint location asks."""
    return {**local_checkpoint_conf(settings.checkpoint_location), **settings.spark}


@dataclass
class Lane:
    """One table the service writes from one topic: the table, its streaming query, its metrics,
    health and maintenance. A service runs one lane (the run's contract), or one per routed table
    (app/routing.py), each on its own: its checkpoint, its writer id, its commits."""

    settings: Settings  # the service's, `topic` the lane's
    contract: Contract
    table: Table
    config: JobConfig
    processor: BatchProcessor
    metrics: IngestMetrics
    health: Health
    maintenance: MaintenanceRunner | None
    latest_offsets: LatestOffsets | None = None
    query: StreamingQuery | None = None
    progress: ProgressReader | None = None

    @property
    def name(self) -> str:
        return self.contract.table

    def start(self, spark: SparkSession, until_idle: bool) -> None:
        self.query = start_query(
            spark, self.processor, until_idle=until_idle, trigger_interval=self.settings.trigger_interval
        )
        self.progress = ProgressReader(self.query, self.name)
        self.health.query_active = True
        self.health.last_progress = time.time()

    def watch(self) -> None:
        """Health and lag from the query's newest progress (the watch loop calls it every second)."""
        self.health.loop_beat = time.time()
        reports = [] if self.progress is None else self.progress.new_reports()
        if reports:
            self.observe_progress(reports[-1], None if self.latest_offsets is None else self.latest_offsets.get() or {})

    def observe_progress(self, progress: dict, latest_offsets: dict | None) -> None:
        """A new progress of the query that feeds the lane: the lane's health, and its lag."""
        self.health.last_progress = time.time()
        try:
            self.health.records_waiting = self.metrics.observe_progress(progress, latest_offsets)
        except (ValueError, TypeError, KeyError) as exc:  # a metric is not worth the service
            log.warning("unreadable query progress", extra={"summary": {"table": self.name, "error": str(exc)}})

    def table_names(self) -> tuple[str, ...]:
        return (self.name,)

    def failure(self) -> str | None:
        """Why the lane's query stopped, in one line, when it stopped on an error."""
        if self.processor.fatal_error is not None:
            return self.processor.fatal_error
        error = None if self.query is None else self.query.exception()
        return None if error is None else f"the streaming query failed: {error}"

    def close(self) -> None:
        self.health.query_active = False
        if self.latest_offsets is not None:
            self.latest_offsets.stop()
        if self.maintenance is not None:
            self.maintenance.stop()


def open_lane(
    settings: Settings,
    contract: Contract,
    table: Table,
    spark: SparkSession,
    registry: CollectorRegistry,
    observers: tuple[Callable[[BatchReport], None], ...] = (),
    resume_from_table: bool = False,
    maintenance_child: MaintenanceChild | None = None,
    writer_id: str | None = None,
    records_given: bool = False,
) -> Lane:
    """The lane of a table, its query not started yet: its maintenance started (in `maintenance_child`,
    shared by the lanes of a service of many tables, when given), its dead-letter topic made.
    A table of a split topic (app/routing.py) gets its writer id from the topic's query, and its
    batches as records (`records_given`)."""
    metrics = IngestMetrics(registry, contract.table, settings.topic)
    health = Health(max_silence_s=settings.ready_max_silence_s, max_stall_s=settings.live_max_stall_s)
    # Beside ingest, maintenance commits take turns with the batches' (streaming/table/turns.py).
    turns = CommitTurns() if settings.maintenance_mode in ("beside", "background") else None
    maintenance = None
    if settings.maintenance_mode != "off":
        maintenance = MaintenanceRunner(
            settings,
            contract.table,
            MaintenanceMetrics(registry, contract.table),
            turns=turns,
            shared_child=maintenance_child,
        )
        observers = (*observers, maintenance.after_batch)
    try:
        if maintenance is not None and settings.maintenance_mode in ("beside", "background"):
            maintenance.start()
        config = job_config(settings, contract, table, writer_id)
        if config.dead_letter is not None:
            ensure_topic(
                settings.bootstrap_servers,
                config.dead_letter.topic,
                settings.kafka,
                topic_config=config.dead_letter.topic_config(),
            )
        if resume_from_table:
            config = _resume_from_table(config, table, settings)
        log.info(
            "starting",
            extra={
                "settings": {
                    **settings.shown(),
                    "table": contract.table,
                    "writer_id": config.writer_id,
                }
            },
        )
        processor = BatchProcessor(
            spark,
            table,
            contract,
            config,
            observers=(metrics.observe_batch, health.observe_batch, *observers),
            turns=turns,
            records_given=records_given,
        )
    except BaseException:
        if maintenance is not None:
            maintenance.stop()
        raise
    health.batch_started = lambda: processor.running_since
    metrics.watch_health(health)
    latest_offsets = None
    if processor.layout.ranges_source is not None and not records_given:
        latest_offsets = LatestOffsets(processor.layout.ranges_source)
    return Lane(settings, contract, table, config, processor, metrics, health, maintenance, latest_offsets)


def run(
    settings: Settings,
    contract: Contract,
    until_idle: bool,
    observers: tuple[Callable[[BatchReport], None], ...] = (),
    spark: SparkSession | None = None,
    registry: CollectorRegistry | None = None,
    resume_from_table: bool = False,
) -> RunTotals:
    """Run the ingest. With until_idle, drain what the topic holds and return; otherwise run until
    SIGTERM or SIGINT, then stop after the batch in progress.

    Metrics and health are served on settings.metrics_port (0: not served) from `registry`
    (a fresh one by default). With resume_from_table, a query whose checkpoint holds no progress
    starts from the Kafka offsets recorded in the table's snapshots instead of starting_offsets."""
    configure_iceberg_java(Path(settings.cache_dir))
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    table = load_contract_table(catalog, contract)
    totals = RunTotals()
    registry = registry or CollectorRegistry()
    health = TablesHealth()
    server = serve(registry, health, settings.metrics_port) if settings.metrics_port else None
    lane: Lane | None = None
    if settings.rejects_table:
        create_rejects_table(catalog, settings.rejects_table)
    try:
        spark = spark or start_spark(settings)
        lane = open_lane(settings, contract, table, spark, registry, (totals.observe, *observers), resume_from_table)
        health.tables[lane.name] = lane.health
        lane.start(spark, until_idle)
        stop_requested = stop_on_signal() if not until_idle else threading.Event()
        stop_when_caught_up = until_idle and lane.config.source == "python"
        query = lane.query
        assert query is not None
        while query.isActive:
            lane.watch()
            if stop_requested.is_set() or (stop_when_caught_up and caught_up(query)):
                stop_after_current_batch(query)
                break
            try:
                query.awaitTermination(1)
            except Exception:  # noqa: BLE001 - the query stopped on an error, which is reported below in one line
                break
        lane.health.query_active = False
        failure = lane.failure()
        if failure is not None:
            raise RuntimeError(failure)
    finally:
        if lane is not None:
            lane.close()
        if server is not None:
            server.shutdown()
            server.server_close()
    return totals


def _resume_from_table(config: JobConfig, table, settings: Settings) -> JobConfig:
    if checkpoint_has_progress(config.checkpoint_location):
        log.info(
            "checkpoint has progress; it decides where to start",
            extra={"summary": {"checkpoint": config.checkpoint_location}},
        )
        return config
    partitions = partitions_of(settings.bootstrap_servers, settings.topic, settings.kafka)
    starting = resume_offsets(table, settings.topic, partitions)
    log.info("resuming from the offsets recorded in the table", extra={"summary": {"starting_offsets": starting}})
    return dataclasses.replace(config, starting_offsets=starting)


def stop_on_signal() -> threading.Event:
    """An event set by SIGTERM or SIGINT (handled on the main thread only)."""
    stop_requested = threading.Event()
    if threading.current_thread() is threading.main_thread():

        def request_stop(signum, _frame):
            log.info("stop requested", extra={"summary": {"signal": signal.Signals(signum).name}})
            stop_requested.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
    return stop_requested


def stop_after_current_batch(query) -> None:
    # A batch in progress finishes its commit; stopping between batches loses nothing, since
    # offsets are only recorded once a batch is done.
    while query.isActive and query.status.get("isTriggerActive"):
        time.sleep(0.2)
    query.stop()

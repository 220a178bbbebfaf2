"""A topic whose records a field route splits over tables (docs/routing.md): one streaming query
(streaming/job/split.py's RecordSplitter) and, per table, a lane of app/service.py without a query
of its own: the table, its processor, metrics, health and maintenance, opened on the table's first
record and the table created from the route's contract when missing.

The query's checkpoint is the topic's (`<checkpoint_location>/topic-<topic>`); each table's writer id
is the query's with the table's name digested into it, so a table's batches are known as its own
whatever the other tables of the topic did, and a new checkpoint gives every table a new one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry
from pyiceberg.catalog import Catalog
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from app.maintenance import MaintenanceChild
from app.metrics import IngestMetrics, TablesHealth
from app.progress import ProgressReader
from app.service import Lane, dead_letter_config, open_lane, topic_config
from app.settings import Settings
from streaming.contract import Contract
from streaming.job.checkpoint import writer_id_for_checkpoint
from streaming.job.processor import BatchProcessor, BatchReport
from streaming.job.routes import Route, RouteError
from streaming.job.split import RecordSplitter, SplitReport
from streaming.job.stream import start_stream
from streaming.source.admin import ensure_topic
from streaming.source.python_source import LatestOffsets
from streaming.table.catalog import create_table

log = logging.getLogger("geoingest.routing")


def split_checkpoint(settings: Settings, topic: str) -> str:
    return settings.checkpoint_for(f"topic-{topic}")


def table_writer_id(topic_writer_id: str, table: str) -> str:
    """A split topic's table's writer id: the query's, and a digest of the table's name."""
    return f"{topic_writer_id}-{hashlib.sha256(table.encode()).hexdigest()[:8]}"


class SplitLane:
    """The query of a split topic and the lanes of the tables its records went to so far."""

    def __init__(
        self,
        settings: Settings,
        route: Route,
        template: Contract,
        spark: SparkSession,
        registry: CollectorRegistry,
        health: TablesHealth,
        observers: tuple[Callable[[BatchReport], None], ...],
        catalog: Catalog,
        claim: Callable[[str], str | None],
        maintenance_child: MaintenanceChild | None = None,
    ):
        """settings: the service's, `topic` the split one. claim(table): the table claimed for this
        topic, or the other topic that writes it."""
        self.settings, self.route, self.template, self.spark = settings, route, template, spark
        self.registry, self.health, self.observers, self.catalog = registry, health, observers, catalog
        self.claim, self.maintenance_child = claim, maintenance_child
        self.tables: dict[str, Lane] = {}
        checkpoint = split_checkpoint(settings, settings.topic)
        self.config = topic_config(
            settings,
            checkpoint,
            settings.writer_id or writer_id_for_checkpoint(checkpoint),
            dead_letter_config(settings, _dead_letter_home(catalog, settings.topic), dict(catalog.properties)),
        )
        if self.config.dead_letter is not None:
            ensure_topic(
                settings.bootstrap_servers,
                self.config.dead_letter.topic,
                settings.kafka,
                topic_config=self.config.dead_letter.topic_config(),
            )
        # The records no table takes are counted under the route's table template.
        self.metrics = IngestMetrics(registry, route.table, settings.topic)
        self.splitter = RecordSplitter(spark, route, self.config, self._processor_for, (self._observe,))
        ranges = self.splitter.ranges_source
        self.latest_offsets = LatestOffsets(ranges) if ranges is not None else None
        self.query: StreamingQuery | None = None
        self.progress: ProgressReader | None = None

    @property
    def name(self) -> str:
        return self.route.table

    def table_names(self) -> tuple[str, ...]:
        return tuple(self.tables)

    def start(self, spark: SparkSession, until_idle: bool) -> None:
        name = f"topic-{self.settings.topic}"
        self.query = start_stream(spark, self.splitter, self.config, name, until_idle, self.settings.trigger_interval)
        self.progress = ProgressReader(self.query, name)

    def _processor_for(self, name: str) -> BatchProcessor:
        """The processor of a table the route names, its lane opened (and the table created) on its
        first record; RouteError when another lane writes it."""
        lane = self.tables.get(name)
        if lane is not None:
            return lane.processor
        writer = self.claim(name)
        if writer is not None:
            raise RouteError(f"route {self.route.name}: table {name} is written from topic {writer!r}")
        contract = dataclasses.replace(self.template, table=name)
        create_table(self.catalog, contract)
        lane = open_lane(
            self.settings,
            contract,
            self.catalog.load_table(name),
            self.spark,
            self.registry,
            self.observers,
            maintenance_child=self.maintenance_child,
            writer_id=table_writer_id(self.config.writer_id, name),
            records_given=True,
        )
        lane.health.query_active = True
        lane.health.last_progress = time.time()
        self.tables[name] = lane
        self.health.tables[name] = lane.health
        log.info("routed", extra={"summary": {"topic": self.settings.topic, "table": name, "route": self.route.name}})
        return lane.processor

    def _observe(self, report: SplitReport) -> None:
        if report.unrouted:
            self.metrics.events_consumed.labels(self.settings.topic, self.route.table).inc(report.unrouted)
            self.metrics.events_rejected.labels(self.settings.topic, self.route.table, "no_route").inc(report.unrouted)

    def watch(self) -> None:
        """Each table's health, and the topic's lag, from the query's last progress."""
        for lane in self.tables.values():
            lane.health.loop_beat = time.time()
        reports = [] if self.progress is None else self.progress.new_reports()
        if not reports:
            return
        progress = reports[-1]
        latest = None if self.latest_offsets is None else self.latest_offsets.get() or {}
        for lane in self.tables.values():
            lane.observe_progress(progress, latest)

    def failure(self) -> str | None:
        """Why the query stopped, in one line, when it stopped on an error."""
        for fatal in (self.splitter.fatal_error, *(lane.processor.fatal_error for lane in self.tables.values())):
            if fatal is not None:
                return fatal
        error = None if self.query is None else self.query.exception()
        return None if error is None else f"the streaming query failed: {error}"

    def close(self) -> None:
        if self.latest_offsets is not None:
            self.latest_offsets.stop()
        for lane in self.tables.values():
            lane.close()


def _dead_letter_home(catalog: Catalog, topic: str) -> str:
    """Where a split topic's dead letters too large for their topic are spilled when the settings
    name no place: under the catalog's warehouse."""
    warehouse = catalog.properties.get("warehouse")
    if not warehouse:
        raise RouteError(
            f"topic {topic!r}: set dead_letter_spill_location; the catalog names no warehouse to keep the "
            "dead letters of a split topic that are too large for the dead-letter topic"
        )
    return f"{warehouse.rstrip('/')}/topic-{topic}"

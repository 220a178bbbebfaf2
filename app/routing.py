"""The service over many tables: the routes of the settings (streaming/job/routes.py) followed, a
lane per routed topic (app/service.py's Lane: the topic's table, its own streaming query in the
one Spark session, its own checkpoint, writer id, commits, dead letters, metrics and maintenance).

A lane's table is created from its route's contract on the lane's start when it is missing. Topics
are listed at the start and every `routes_refresh_s`, so a topic created while the service runs gets
its lane without a restart. A lane whose query fails is logged in one line naming its table and
started again after a pause that doubles up to ten minutes; the other lanes go on. One query per
table rather than one for all: a Spark query's offsets move for all its topics at once, so a table
that fails would hold back, or lose, every other table's batch (docs/routing.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry
from pyspark.sql import SparkSession

from app.errors import one_line
from app.maintenance import MaintenanceChild
from app.maven import configure_iceberg_java
from app.metrics import TablesHealth, serve
from app.service import (
    Lane,
    RunTotals,
    open_lane,
    start_spark,
    stop_after_current_batch,
    stop_on_signal,
)
from app.settings import Settings
from app.split_lane import SplitLane
from streaming.contract import Contract, ContractError, load_contract
from streaming.job.processor import BatchReport
from streaming.job.routes import Route, RouteError, Routes, parse_routes
from streaming.source.admin import list_topics, offset_bounds
from streaming.source.python_source import caught_up
from streaming.table.catalog import create_rejects_table, create_table, open_catalog

log = logging.getLogger("geoingest.routing")

RESTART_FIRST_S = 10.0
RESTART_MAX_S = 600.0


class RoutingError(RuntimeError):
    """A route the service cannot follow at its start, or lanes that failed in a drain run."""


@dataclasses.dataclass
class _Failed:
    """A lane whose query stopped on an error, and when it may start again."""

    error: str
    failures: int
    retry_at: float


class RoutedService:
    """The lanes of a service's routes, started as their topics appear, watched every second."""

    def __init__(
        self,
        settings: Settings,
        routes: Routes,
        templates: dict[str, Contract],
        spark: SparkSession,
        registry: CollectorRegistry,
        health: TablesHealth,
        observers: tuple[Callable[[BatchReport], None], ...],
        until_idle: bool,
    ):
        self.settings, self.spark, self.registry, self.health = settings, spark, registry, health
        self.observers, self.until_idle = observers, until_idle
        self.routes = routes
        self.templates = templates
        self.catalog = open_catalog(settings.catalog_name, settings.catalog)
        self.lanes: dict[str, Lane | SplitLane] = {}  # by topic
        self.failed: dict[str, _Failed] = {}  # by topic
        self.finished: set[str] = set()  # topics drained (until_idle)
        self._told: set[str] = set()  # topics already logged as unroutable
        # table -> the topic that writes it: claimed by its first writer for the service's life, so a
        # drained or failed lane's table is still its own. Split topics claim from their queries.
        self.owners: dict[str, str] = {}
        self._owners_lock = threading.Lock()
        # "beside": one maintenance process for every table (a process each would cost ~200 MB a table)
        self.maintenance_child = MaintenanceChild(settings, {}) if settings.maintenance_mode == "beside" else None

    def discover(self) -> None:
        """Lanes for the routed topics that have none; a topic no route can take is logged once."""
        topics = list_topics(self.settings.bootstrap_servers, dict(self.settings.kafka))
        routed, unroutable = topic_routes(self.routes, self.settings, topics)
        for topic, why in unroutable.items():
            self._tell(topic, why)
        for topic, route in routed.items():
            # A topic's table is its own before any split topic's record can name it.
            if route.field is None and topic not in self.owners.values():
                with contextlib.suppress(RouteError):
                    self._claim(route.table_for_topic(topic), topic)
        for topic, route in routed.items():
            if topic not in self.lanes and topic not in self.failed and topic not in self.finished:
                self._start(topic, route)

    def _start(self, topic: str, route: Route) -> None:
        """The topic's lane opened and its query started; a table that cannot start fails (and is
        tried again), one whose name the route cannot make is left alone."""
        try:
            self._open(topic, route)
        except RouteError as exc:
            self._tell(topic, str(exc))
        except Exception as exc:  # noqa: BLE001 - this table fails, the others go on
            self._fail(topic, route, one_line(exc))
        else:
            self.failed.pop(topic, None)

    def _open(self, topic: str, route: Route) -> None:
        if route.field is not None:
            self._open_split(topic, route)
            return
        name = route.table_for_topic(topic)
        writer = self._claim(name, topic)
        if writer is not None:
            raise RouteError(f"route {route.name}: topic {topic!r} makes table {name}, which topic {writer!r} writes")
        contract = dataclasses.replace(self.templates[route.name], table=name)
        create_table(self.catalog, contract)
        table = self.catalog.load_table(name)
        lane = open_lane(
            self._lane_settings(topic),
            contract,
            table,
            self.spark,
            self.registry,
            self.observers,
            maintenance_child=self.maintenance_child,
        )
        self.lanes[topic] = lane
        self.health.tables[name] = lane.health
        lane.start(self.spark, self.until_idle)
        log.info("routed", extra={"summary": {"topic": topic, "table": name, "route": route.name}})

    def _open_split(self, topic: str, route: Route) -> None:
        """A topic whose records the route splits: its query started; its tables open as records name them."""
        lane = SplitLane(
            self._lane_settings(topic),
            route,
            self.templates[route.name],
            self.spark,
            self.registry,
            self.health,
            self.observers,
            self.catalog,
            lambda name: self._claim(name, topic),
            self.maintenance_child,
        )
        self.lanes[topic] = lane
        lane.start(self.spark, self.until_idle)
        log.info("split", extra={"summary": {"topic": topic, "tables": route.table, "route": route.name}})

    def _claim(self, table: str, topic: str) -> str | None:
        """`table` claimed for `topic`'s lane; the other topic that writes it, if one does."""
        with self._owners_lock:
            owner = self.owners.setdefault(table, topic)
        return None if owner == topic else owner

    def _lane_settings(self, topic: str) -> Settings:
        return dataclasses.replace(self.settings, topic=topic)

    def _tell(self, topic: str, why: str) -> None:
        if topic not in self._told:
            self._told.add(topic)
            log.error("topic not routed", extra={"summary": {"topic": topic, "error": why}})

    def watch(self) -> None:
        """One round: each lane's progress; a lane whose query ended closed, failed or drained."""
        for topic, lane in list(self.lanes.items()):
            lane.watch()
            query = lane.query
            assert query is not None
            if self.until_idle and lane.config.source == "python" and query.isActive and caught_up(query):
                stop_after_current_batch(query)
            if query.isActive:
                continue
            failure = lane.failure()
            lane.close()
            del self.lanes[topic]
            if failure is None:
                self.finished.add(topic)
                continue
            for name in lane.table_names():
                self.health.tables.pop(name, None)
            self._fail(topic, self.routes.route_of(topic), failure)
        if not self.until_idle:
            for topic, failed in list(self.failed.items()):
                route = self.routes.route_of(topic)
                if route is not None and time.monotonic() >= failed.retry_at:
                    self._start(topic, route)

    def _fail(self, topic: str, route: Route | None, error: str) -> None:
        """The topic's table failed: logged in one line, started again after a pause that doubles."""
        previous = self.failed.get(topic)
        failures = previous.failures + 1 if previous is not None else 1
        pause = min(RESTART_MAX_S, RESTART_FIRST_S * 2 ** (failures - 1))
        self.failed[topic] = _Failed(error, failures, time.monotonic() + pause)
        where = {"topic": topic, "route": None if route is None else route.name}
        log.error("table failed", extra={"summary": {**where, "error": error, "retry_in_s": pause}})

    def stop(self) -> None:
        """Each lane's query after the batch it runs."""
        for lane in self.lanes.values():
            if lane.query is not None and lane.query.isActive:
                stop_after_current_batch(lane.query)

    def close(self) -> None:
        for lane in self.lanes.values():
            lane.close()
        if self.maintenance_child is not None:
            self.maintenance_child.stop(60.0)


def run_routes(
    settings: Settings,
    until_idle: bool,
    observers: tuple[Callable[[BatchReport], None], ...] = (),
    spark: SparkSession | None = None,
    registry: CollectorRegistry | None = None,
    stop: threading.Event | None = None,
) -> RunTotals:
    """Run the routes' tables. With until_idle, drain what each routed topic holds at the start and
    return (an error naming every table that failed); otherwise run until SIGTERM or SIGINT (or
    `stop`), new topics picked up every routes_refresh_s, then stop every lane after the batch in
    progress."""
    configure_iceberg_java(Path(settings.cache_dir))
    routes = parse_routes(settings.routes)
    templates = load_templates(routes)
    totals = RunTotals()
    registry = registry or CollectorRegistry()
    health = TablesHealth(ready_without_tables=True)
    server = serve(registry, health, settings.metrics_port) if settings.metrics_port else None
    service: RoutedService | None = None
    try:
        if settings.rejects_table:
            create_rejects_table(open_catalog(settings.catalog_name, settings.catalog), settings.rejects_table)
        spark = spark or start_spark(settings)
        service = RoutedService(
            settings, routes, templates, spark, registry, health, (totals.observe, *observers), until_idle
        )
        stop_requested = stop or (stop_on_signal() if not until_idle else threading.Event())
        service.discover()
        next_discovery = time.monotonic() + settings.routes_refresh_s
        while not stop_requested.is_set():
            service.watch()
            if until_idle and not service.lanes:
                break
            if not until_idle and time.monotonic() >= next_discovery:
                try:
                    service.discover()
                except Exception as exc:  # noqa: BLE001 - the broker away for a while: the lanes go on
                    log.warning("topics not listed", extra={"summary": {"error": one_line(exc)}})
                next_discovery = time.monotonic() + settings.routes_refresh_s
            time.sleep(1.0)
        service.stop()
        if service.failed:
            named = "; ".join(f"{topic}: {failed.error}" for topic, failed in sorted(service.failed.items()))
            raise RoutingError(f"{len(service.failed)} routed table(s) failed: {named}")
    finally:
        if service is not None:
            service.close()
        if server is not None:
            server.shutdown()
            server.server_close()
    return totals


def load_templates(routes: Routes) -> dict[str, Contract]:
    """Each route's contract, by route name: read once, before anything starts."""
    templates = {}
    for route in routes:
        try:
            templates[route.name] = load_contract(route.contract)
        except ContractError as exc:
            raise RoutingError(f"route {route.name}: {exc}") from None
    return templates


def table_status(settings: Settings, tables: list[tuple[str, str]]) -> list[dict]:
    """Each (topic, table) of `tables`: whether the table exists, its last commit, and its lag: the
    records of its topic after the last offset any of the topic's tables recorded (a split topic's
    tables share its lag)."""
    from pyiceberg.exceptions import NoSuchTableError

    from streaming.table.commit import recorded_offsets

    catalog = open_catalog(settings.catalog_name, settings.catalog)
    bounds = offset_bounds(settings.bootstrap_servers, sorted({topic for topic, _ in tables}), dict(settings.kafka))
    rows = []
    done: dict[str, dict[int, int]] = {}  # topic -> partition -> the last offset one of its tables recorded
    for topic, name in sorted(tables, key=lambda pair: pair[1]):
        row: dict = {"table": name, "topic": topic, "exists": True, "last_commit": None, "snapshots": 0}
        try:
            table = catalog.load_table(name)
        except NoSuchTableError:
            row["exists"] = False
        else:
            snapshot = table.current_snapshot()
            row["snapshots"] = len(table.metadata.snapshots)
            if snapshot is not None:
                row["last_commit"] = datetime.fromtimestamp(snapshot.timestamp_ms / 1000, UTC).isoformat()
            last = done.setdefault(topic, {})
            for partition, (_, offset) in recorded_offsets(table).get(topic, {}).items():
                last[partition] = max(last.get(partition, offset), offset)
        rows.append(row)
    for row in rows:
        last = done.get(row["topic"], {})
        row["lag"] = sum(
            end - max(first, last[p] + 1) if p in last else end - first
            for p, (first, end) in bounds.get(row["topic"], {}).items()
        )
    return rows


def routed_tables(settings: Settings) -> list[tuple[str, str]]:
    """The tables the settings' routes give the broker's topics now, as (topic, table): a topic's
    table, or the tables a split topic's records made so far (dead-letter topics and topics no
    route can name left out)."""
    topics = list_topics(settings.bootstrap_servers, dict(settings.kafka))
    routed, _ = topic_routes(parse_routes(settings.routes), settings, topics)
    tables = []
    catalog = None
    for topic, route in routed.items():
        if route.field is not None:
            catalog = catalog or open_catalog(settings.catalog_name, settings.catalog)
            tables += [(topic, name) for name in catalog_tables(catalog) if route.makes(name)]
            continue
        try:
            tables.append((topic, route.table_for_topic(topic)))
        except RouteError:
            continue
    return tables


def catalog_tables(catalog) -> list[str]:
    """Every table of the catalog, as namespace.name."""
    return [
        ".".join(identifier) for namespace in catalog.list_namespaces() for identifier in catalog.list_tables(namespace)
    ]


def topic_routes(routes: Routes, settings: Settings, topics: set[str]) -> tuple[dict[str, Route], dict[str, str]]:
    """The route of each topic a route takes, in name order, and why each topic two routes take is
    left alone. A dead-letter topic is never routed as a table of its own, whatever its name matches."""
    dead_letters = {dataclasses.replace(settings, topic=t).dead_letter_topic for t in topics} | {settings.dlq_topic}
    routed: dict[str, Route] = {}
    unroutable: dict[str, str] = {}
    for topic in sorted(topics - dead_letters):
        try:
            route = routes.route_of(topic)
        except RouteError as exc:
            unroutable[topic] = str(exc)
            continue
        if route is not None:
            routed[topic] = route
    return routed, unroutable

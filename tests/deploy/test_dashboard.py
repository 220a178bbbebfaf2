"""The Grafana dashboard asks only for metrics the service exports, under their exported names,
and shows what an operator needs: throughput, rejects, commit latency, conflicts, file sizes,
freshness and Kafka lag."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.local.process import free_port
from app.local.prometheus import RULES_FILE, LocalPrometheus
from app.metrics import IngestMetrics, MaintenanceMetrics
from app.service import run
from streaming.contract import parse_contract
from streaming.job.processor import BatchReport
from streaming.maintenance.compaction import CompactionReport
from streaming.maintenance.maintain import ExpiryReport, MaintenanceReport, OrphanReport
from streaming.table.catalog import create_table, open_catalog
from streaming.table.commit import CommitOutcome
from streaming.write.data_files import DataFileRecord
from tests.conftest import CACHE_DIR, local_settings, produce_records

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "geoingest.json"
CHART_COPY = ROOT / "helm" / "geoingest" / "dashboards" / "geoingest.json"

# PromQL words that are not metric names.
_FUNCTIONS_AND_KEYWORDS = {
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "rate",
    "irate",
    "increase",
    "delta",
    "idelta",
    "deriv",
    "histogram_quantile",
    "clamp_min",
    "clamp_max",
    "clamp",
    "abs",
    "ceil",
    "floor",
    "round",
    "time",
    "timestamp",
    "vector",
    "scalar",
    "label_replace",
    "label_join",
    "sort",
    "sort_desc",
    "absent",
    "absent_over_time",
    "changes",
    "resets",
    "predict_linear",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "last_over_time",
    "quantile_over_time",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
    "label_values",
    "query_result",
    "metrics",
    "label_names",
}


def exported_metric_names() -> set[str]:
    """The names in the service's real exposition after one batch and one progress report."""
    registry = CollectorRegistry()
    metrics = IngestMetrics(registry, "demo.events", "geo-events")
    files = (
        DataFileRecord(
            path="file:///w/demo/events/data/f.parquet",
            file_size_in_bytes=4096,
            record_count=10,
            bbox=(2.2, 48.8, 2.5, 48.9),
            metrics={},
        ),
    )
    metrics.observe_batch(
        BatchReport(
            batch_id=0,
            consumed=12,
            committed_rows=10,
            rejected={"bad_wkb": 2},
            files=files,
            offsets={"geo-events": {0: (0, 11)}},
            outcome=CommitOutcome(status="committed", snapshot_id=1, attempts=2, conflicts=1, duration_s=0.2),
            seconds={"total": 1.5},
            oldest_event_ms={"geo-events/0": int(time.time() * 1000) - 5000},
        )
    )
    metrics.observe_progress(
        {"sources": [{"latestOffset": {"geo-events": {"0": 20}}, "endOffset": {"geo-events": {"0": 12}}}]}
    )
    maintenance = MaintenanceMetrics(registry, "demo.events")
    maintenance.observe(
        MaintenanceReport(
            table="demo.events",
            dry_run=False,
            compaction=CompactionReport(
                candidates=40,
                bins=1,
                files_rewritten=40,
                bytes_rewritten=4_000_000,
                files_written=2,
                bytes_written=3_000_000,
                rows=80_000,
                bins_abandoned=0,
                conflicts=1,
                snapshot_id=7,
                seconds=2.0,
            ),
            expiry=ExpiryReport(
                snapshots_before=140,
                snapshots_expired=40,
                files_deleted=80,
                bytes_deleted=4_000_000,
                conflicts=0,
                seconds=0.5,
            ),
            orphans=OrphanReport(found=2, deleted=2, bytes=1000, seconds=0.1),
            seconds=2.7,
        ),
        snapshots=100,
        data_manifests=3,
    )
    maintenance.observe_cost(cpu_s=0.9, paced_s=2.7)
    text = generate_latest(registry).decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (or a Grafana label_values() query)."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', "", expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges and subqueries
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    expr = re.sub(r"\$\{?\w+\}?", "", expr)  # Grafana variables
    if expr.strip().startswith("label_values"):  # label_values(metric, label): the label is no metric
        expr = re.sub(r",\s*\w+\s*\)\s*$", ")", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", expr):
        word, call = match.group(1), match.group(2)
        if call or word in _FUNCTIONS_AND_KEYWORDS or re.fullmatch(r"\d+\w*", word):
            continue
        names.add(word)
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def panel_with(dashboard: dict, *patterns: str) -> str | None:
    """The title of the first panel whose queries match every pattern."""
    for panel in panels(dashboard):
        text = " ".join(exprs(panel))
        if all(re.search(p, text) for p in patterns):
            return panel["title"]
    return None


def exprs(panel: dict) -> list[str]:
    return [t["expr"] for t in panel.get("targets", []) if t.get("expr")]


def test_the_metric_name_parser():
    assert metric_names('sum by (le) (rate(a_bucket{table=~"$table", x="y(z)"}[$__rate_interval]))') == {"a_bucket"}
    assert metric_names('time() - max(b_seconds{t="1"})') == {"b_seconds"}
    assert metric_names("sum(rate(c_total[5m])) / clamp_min(sum(d_total offset 1h), 1)") == {"c_total", "d_total"}
    assert metric_names("histogram_quantile(0.99, sum by (le) (rate(e_bucket[1m])))") == {"e_bucket"}
    assert metric_names("label_values(f_total, table)") == {"f_total"}


def test_every_metric_the_dashboard_asks_for_is_exported(dashboard):
    exported = exported_metric_names()
    assert {
        "geoingest_events_consumed_total",
        "geoingest_commit_duration_seconds_bucket",
        "geoingest_kafka_lag",
    } <= exported
    asked: dict[str, str] = {}
    for panel in panels(dashboard):
        for expr in exprs(panel):
            names = metric_names(expr)
            assert names, f"panel {panel['title']!r}: no metric in {expr!r}"
            asked.update({name: panel["title"] for name in names})
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            asked.update({name: f"variable {variable['name']}" for name in metric_names(query)})
    missing = {name: where for name, where in asked.items() if name not in exported}
    assert not missing, f"not exported by the service (see app/metrics.py): {missing}"


def test_panels_cover_the_operator_topics(dashboard):
    topics = {
        "events/s in, committed, rejected": (
            r"rate\(geoingest_events_consumed_total",
            r"rate\(geoingest_events_committed_total",
            r"rate\(geoingest_events_rejected_total",
        ),
        "rejects by reason": (r"sum by \(reason\) \(rate\(geoingest_events_rejected_total",),
        "commit latency p50/p95/p99": (
            r"histogram_quantile\(0\.5, [^\n]*geoingest_commit_duration_seconds_bucket",
            r"histogram_quantile\(0\.95, [^\n]*geoingest_commit_duration_seconds_bucket",
            r"histogram_quantile\(0\.99, [^\n]*geoingest_commit_duration_seconds_bucket",
        ),
        "conflicts and retries": (r"geoingest_commit_conflicts_total", r"geoingest_commit_retries_"),
        "files and bytes per commit": (
            r"geoingest_files_written_total",
            r"geoingest_bytes_written_total",
            r"geoingest_commits_total",
        ),
        "freshness": (r"geoingest_freshness_seconds_bucket",),
        "every event's freshness p50/p95/p99": (
            r"histogram_quantile\(0\.5, [^\n]*geoingest_event_freshness_seconds_bucket",
            r"histogram_quantile\(0\.95, [^\n]*geoingest_event_freshness_seconds_bucket",
            r"histogram_quantile\(0\.99, [^\n]*geoingest_event_freshness_seconds_bucket",
        ),
        "a slow batch": (r"geoingest_batch_running_seconds",),
        "kafka lag": (r"geoingest_kafka_lag",),
    }
    missing = [topic for topic, patterns in topics.items() if panel_with(dashboard, *patterns) is None]
    assert not missing, f"no panel shows: {missing}"


def test_every_query_goes_through_the_datasource_variable(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert 'table=~"$table"' in target["expr"], f"{panel['title']}: not filtered by the table variable"


def test_layout_is_sound(dashboard):
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36


def test_the_chart_ships_the_same_dashboard():
    assert CHART_COPY.read_bytes() == DASHBOARD.read_bytes(), (
        "helm/geoingest/dashboards/geoingest.json differs from dashboards/geoingest.json: copy it over"
    )


# -- a real Prometheus ------------------------------------------------------------------------------
GRAFANA_VARIABLES = {"$__rate_interval": "30s", "$__range": "1h", "$table": ".+"}


def panel_queries(board: dict) -> list[tuple[str, str]]:
    """(panel title, query) of every panel, Grafana's variables as a dashboard over the run fills them."""
    out = []
    for panel in panels(board):
        for expr in exprs(panel):
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            out.append((panel["title"], expr))
    return out


@pytest.mark.integration
def test_a_real_prometheus_answers_every_panel_after_a_run_with_load_rejects_and_maintenance(
    kafka, spark, topic, tmp_path, dashboard
):
    """Debian's Prometheus scrapes the service every second while it ingests a stream with bad
    records in it, maintenance racing it beside; every query of every panel, asked of that
    Prometheus over the run (as a panel shows a time range), answers with data. A panel without
    data fails by name, with how many of Prometheus's scrapes of the service succeeded."""
    raw = json.loads((ROOT / "schemas" / "demo_events.json").read_text())
    contract = parse_contract({**raw, "partition": ["day(event_time)"], "retention": "30 days"})
    good = [
        json.dumps(
            {
                "type": "Feature",
                "id": f"e{i}",
                "geometry": {"type": "Point", "coordinates": [i % 170, 10.0]},
                "properties": {},
            }
        ).encode()
        for i in range(6_000)
    ]
    # One in ten rejected: above the 5 % of the dead-letter alert, which must go pending on it.
    records = [(None, b"not json" if i % 10 == 0 else v, []) for i, v in enumerate(good)]
    assert produce_records(kafka.bootstrap, topic, records) == len(records)
    port = free_port()
    settings = replace(
        local_settings(
            kafka,
            topic,
            tmp_path,
            max_offsets_per_trigger=300,
            trigger_interval="0 seconds",
            maintenance_mode="beside",
            maintenance_nice=0,
            maintenance_cpu_percent=100.0,
            maintenance_interval_s=0,
            maintenance_min_file_age_s=0,
            maintenance_steps="retention,compact,expire,orphans",
        ),
        metrics_port=port,
    )
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    with LocalPrometheus(tmp_path / "prometheus", CACHE_DIR, [f"127.0.0.1:{port}"]) as prometheus:
        failure: list[BaseException] = []

        def ingest() -> None:
            try:
                run(settings, contract, until_idle=True, spark=spark)
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                failure.append(exc)

        worker = threading.Thread(target=ingest, daemon=True)
        started = time.time()
        worker.start()
        seen_at = None
        alerted: dict[str, dict] = {}
        while worker.is_alive() and (seen_at is None or "GeoingestDeadLetterRateHigh" not in alerted):
            time.sleep(1)
            alerted.update({alert["labels"]["alertname"]: alert for alert in prometheus.alerts()})
            runs = prometheus.query('sum(geoingest_maintenance_runs_total{outcome="completed"})')
            batches = prometheus.query("sum(geoingest_batches_total)")
            if (
                seen_at is None
                and runs
                and float(runs[0]["value"][1]) > 0
                and batches
                and float(batches[0]["value"][1]) >= 5
            ):
                seen_at = time.time()
        worker.join(timeout=900)
        assert not failure, failure
        assert seen_at is not None, "the run ended before Prometheus saw a maintenance run and five batches"
        ended = time.time() + 2  # a last scrape after the run
        time.sleep(2)
        empty = [
            f"{title}: {expr}"
            for title, expr in panel_queries(dashboard)
            if not any(series["values"] for series in prometheus.query_range(expr, started, ended, step_s=1))
        ]
        scrapes = prometheus.query(
            f"sum_over_time(up[{ended - started:.0f}s]) / count_over_time(up[{ended - started:.0f}s])"
        )
        rules = prometheus.rules()
    assert not empty, f"panels without data (scrapes that succeeded: {scrapes}):\n" + "\n".join(empty)
    # Every alert rule of the chart loaded and evaluated on the live series without an error; the
    # dead-letter one saw this run's rejects (pending: its `for` is longer than the run), by table.
    shipped = [r["alert"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]]
    assert sorted(r["name"] for r in rules) == sorted(shipped)
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
    dead_letters = alerted.get("GeoingestDeadLetterRateHigh")
    assert dead_letters is not None, f"alerts seen: {sorted(alerted)}"
    assert dead_letters["labels"]["table"] == contract.table and dead_letters["state"] in ("pending", "firing")
    assert 0.05 < float(dead_letters["value"]) < 0.2, dead_letters

"""Metrics and health as an operator sees them: scraped over HTTP during a real ingest run."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from app.local.broker import free_port
from app.metrics import Health, IngestMetrics, serve
from app.service import run
from app.settings import load_settings
from streaming.contract import load_contract
from streaming.job.processor import BatchReport
from streaming.table.catalog import create_table
from tests.conftest import CACHE_DIR, produce_records

CONTRACT = Path(__file__).resolve().parents[2] / "schemas" / "demo_events.json"


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.integration
def test_scraped_counters_match_what_was_produced_committed_and_rejected(kafka, spark, topic, tmp_path, catalog):
    good = [
        (
            f"g{i}".encode(),
            json.dumps(
                {
                    "type": "Feature",
                    "id": f"g{i}",
                    "properties": {},
                    "geometry": {"type": "Point", "coordinates": [i * 0.01, 45.0]},
                }
            ).encode(),
            [],
        )
        for i in range(500)
    ]
    bad = [(b"b1", b"garbage", []), (b"b2", None, []), (b"b3", b'{"type": "Feature"', [])]
    assert produce_records(kafka.bootstrap, topic, good + bad) == 503

    port = free_port()
    settings = load_settings(
        env={},
        bootstrap_servers=kafka.bootstrap,
        topic=topic,
        catalog={"type": "sql", "uri": f"sqlite:///{tmp_path / 'm.db'}", "warehouse": f"file://{tmp_path / 'wh'}"},
        checkpoint_location=str(tmp_path / "ck"),
        metrics_port=port,
        cache_dir=str(CACHE_DIR),
    )
    contract = load_contract(CONTRACT)
    from streaming.table.catalog import open_catalog

    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    scrapes: list[str] = []
    readiness: list[int] = []

    def scrape(_report) -> None:
        scrapes.append(get(f"http://127.0.0.1:{port}/metrics")[1])
        readiness.append(get(f"http://127.0.0.1:{port}/readyz")[0])
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200

    run(settings, contract, until_idle=True, observers=(scrape,), spark=spark)
    assert scrapes, "at least one batch ran"
    seen = samples(scrapes[-1])
    labels = (("table", "demo.events"), ("topic", topic))
    assert seen[("geoingest_events_consumed_total", labels)] == 503
    assert seen[("geoingest_events_committed_total", labels)] == 500
    rejected = {dict(k[1])["reason"]: v for k, v in seen.items() if k[0] == "geoingest_events_rejected_total" and v}
    assert rejected == {"unknown_format": 1, "null_value": 1, "malformed_json": 1}
    table_only = (("table", "demo.events"),)
    assert seen[("geoingest_commits_total", (("outcome", "committed"), *table_only))] == len(scrapes)
    assert seen[("geoingest_files_written_total", table_only)] >= 1
    assert seen[("geoingest_rows_per_file_sum", table_only)] == 500
    assert seen[("geoingest_commit_duration_seconds_count", table_only)] == len(scrapes)
    assert seen[("geoingest_last_snapshot_id", table_only)] != 0
    assert seen[("geoingest_freshness_seconds_count", table_only)] >= 1
    # Every committed event's age, not only the oldest of each partition; produced minutes ago at most.
    assert seen[("geoingest_event_freshness_seconds_count", table_only)] == 500
    assert seen[("geoingest_event_freshness_seconds_bucket", (("le", "900.0"), *table_only))] == 500
    assert readiness[-1] == 200, "ready while the query runs"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)  # server stopped with the run


@pytest.mark.integration
def test_the_python_source_reports_lag_from_the_topics_end_offsets(kafka, spark, topic, tmp_path):
    """Its progress holds only the end of the batch it planned, capped by maxOffsetsPerTrigger: the
    lag comes from the topic's end offsets, asked by the service."""
    feature = '{"type": "Feature", "id": "p%d", "properties": {}, "geometry": {"type": "Point", "coordinates": [1, 2]}}'
    assert produce_records(kafka.bootstrap, topic, [(b"k", (feature % i).encode(), []) for i in range(3000)]) == 3000
    port = free_port()
    settings = load_settings(
        env={},
        bootstrap_servers=kafka.bootstrap,
        topic=topic,
        source="python",
        max_offsets_per_trigger=300,
        catalog={"type": "sql", "uri": f"sqlite:///{tmp_path / 'm.db'}", "warehouse": f"file://{tmp_path / 'wh'}"},
        checkpoint_location=str(tmp_path / "ck"),
        metrics_port=port,
        cache_dir=str(CACHE_DIR),
    )
    contract = load_contract(CONTRACT)
    from streaming.table.catalog import open_catalog

    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    lags: list[float] = []

    def scrape(_report) -> None:
        seen = samples(get(f"http://127.0.0.1:{port}/metrics")[1])
        lags.append(sum(v for k, v in seen.items() if k[0] == "geoingest_kafka_lag"))

    totals = run(settings, contract, until_idle=True, observers=(scrape,), spark=spark)
    assert totals.consumed == 3000 and totals.batches >= 10
    assert max(lags) > 300, f"behind by more than a batch while it drains: {lags}"
    assert all(0 <= lag <= 3000 for lag in lags)


def test_lag_comes_from_the_query_progress():
    metrics = IngestMetrics(CollectorRegistry(), "demo.events", "geo")
    metrics.observe_progress(
        {
            "sources": [
                {
                    "endOffset": json.dumps({"geo": {"0": 100, "1": 50}}),
                    "latestOffset": json.dumps({"geo": {"0": 130, "1": 50}}),
                }
            ]
        }
    )
    registry = metrics.registry
    assert (
        registry.get_sample_value("geoingest_kafka_lag", {"topic": "geo", "partition": "0", "table": "demo.events"})
        == 30
    )
    assert (
        registry.get_sample_value("geoingest_kafka_lag", {"topic": "geo", "partition": "1", "table": "demo.events"})
        == 0
    )


def test_readiness_follows_the_query_and_its_progress():
    health = Health(max_silence_s=5)
    server = serve(CollectorRegistry(), health, port := free_port(), host="127.0.0.1")
    try:
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        status, body = get(f"http://127.0.0.1:{port}/readyz")
        assert status == 503 and "not active" in body
        health.query_active, health.last_progress = True, time.time()
        assert get(f"http://127.0.0.1:{port}/readyz")[0] == 200
        health.last_progress = time.time() - 60
        status, body = get(f"http://127.0.0.1:{port}/readyz")
        assert status == 503 and "no batch" in body
        assert get(f"http://127.0.0.1:{port}/nothing")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


def test_a_batch_running_far_longer_than_batches_do_shows_on_readyz_and_in_a_metric():
    registry = CollectorRegistry()
    health = Health(max_silence_s=120)
    metrics = IngestMetrics(registry, "demo.events", "events")
    metrics.watch_health(health)
    server = serve(registry, health, port := free_port(), host="127.0.0.1")
    started: list[float | None] = [None]
    health.batch_started = lambda: started[0]
    try:
        health.query_active, health.last_progress = True, time.time()
        for seconds in (2.0, 3.0, 4.0):
            health.observe_batch(BatchReport(0, 0, 0, {}, (), {}, None, {"total": seconds}))
        started[0] = time.time() - 25  # under the 30 s floor: not slow yet
        assert get(f"http://127.0.0.1:{port}/readyz")[0] == 200
        started[0] = time.time() - 45  # 10x the median (3 s) is 30 s: slow
        status, body = get(f"http://127.0.0.1:{port}/readyz")
        assert status == 503 and "has run for 45 s" in body and "30 s at most" in body
        scraped = get(f"http://127.0.0.1:{port}/metrics")[1]
        running = next(line for line in scraped.splitlines() if line.startswith("geoingest_batch_running_seconds{"))
        assert 44 <= float(running.split()[-1]) < 60
        started[0] = None  # the batch ended
        health.last_progress = time.time()
        assert get(f"http://127.0.0.1:{port}/readyz")[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_liveness_fails_when_the_driver_stalls_and_only_then() -> None:
    """/healthz: the kubelet restarts a driver whose watch loop stopped going round, whose batch
    runs for ever, or that ends no batch while records wait; an idle driver with nothing to read
    stays alive."""
    health = Health(max_silence_s=60, max_stall_s=900, query_active=True)
    assert health.alive() == (True, "ok")
    health.last_batch_end = time.time() - 3600  # a quiet topic: nothing waits
    assert health.alive()[0]
    health.records_waiting = 5_000
    alive, why = health.alive()
    assert not alive and why.startswith("no batch for 3600 s while 5000 records wait")
    health.records_waiting, health.loop_beat = 0, time.time() - 1000
    assert health.alive() == (False, "the driver's watch loop has not gone round for 1000 s")
    health.loop_beat, started = time.time(), time.time() - 1200
    health.batch_started = lambda: started
    assert health.alive() == (False, "the batch in progress has run for 1200 s")


def test_healthz_answers_503_with_the_reason() -> None:
    health = Health(max_silence_s=60, max_stall_s=900, query_active=True, loop_beat=time.time() - 2000)
    server = serve(CollectorRegistry(), health, port=0, host="127.0.0.1")
    try:
        port = server.server_address[1]
        status, body = get(f"http://127.0.0.1:{port}/healthz")
        assert status == 503 and "has not gone round for 2000 s" in body
    finally:
        server.shutdown()


def test_every_maintenance_counter_is_scraped_at_zero_before_the_first_run():
    """Prometheus's increase() and rate() need a sample before a counter moves: a series born at
    the first run hides that run from every dashboard panel (seen with a real Prometheus)."""
    from app.metrics import MaintenanceMetrics

    registry = CollectorRegistry()
    MaintenanceMetrics(registry, "demo.events")
    families = [f for f in registry.collect() if f.type in ("counter", "histogram")]
    assert families
    for family in families:
        counts = [s for s in family.samples if s.name.endswith(("_total", "_count"))]
        assert counts, f"{family.name} has no series before the first run"
        assert all(s.labels["table"] == "demo.events" and s.value == 0 for s in counts), family.name


def test_every_ingest_counter_and_each_reject_reason_is_scraped_at_zero_before_the_first_batch():
    """The same for ingest: a reject reason first seen in the 1,000th batch still shows in a
    rate() panel and fires DeadLetterRateHigh from its first reject."""
    from streaming.decode.rejects import Reason

    registry = CollectorRegistry()
    IngestMetrics(registry, "demo.events", "demo-topic")
    families = [f for f in registry.collect() if f.type in ("counter", "histogram")]
    for family in families:
        counts = [s for s in family.samples if s.name.endswith(("_total", "_count"))]
        assert counts, f"{family.name} has no series before the first batch"
        assert all(s.labels["table"] == "demo.events" and s.value == 0 for s in counts), family.name
    rejected = {s.labels["reason"] for f in families for s in f.samples if s.name == "geoingest_events_rejected_total"}
    assert rejected == {r.value for r in Reason}
    outcomes = {s.labels["outcome"] for f in families for s in f.samples if s.name == "geoingest_commits_total"}
    assert outcomes == {"committed", "skipped_replay", "failed"}

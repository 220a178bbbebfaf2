"""The chart's alert rules fired by a real Prometheus scraping a real service: a producer of bad
records fires the dead-letter alert, a driver frozen with SIGSTOP while records wait fires the
no-progress alert, and neither fires before its trouble.

The rules are the shipped expressions with their waiting cut short so that the test takes a
minute, not the quarter of an hour they give an operator: every `for` is 5 s, and the no-progress
alert's 300 s of silence is 20 s. What the test proves is that the expressions find the trouble in
the series the service really exports (and in the stale ones a frozen driver leaves); the
thresholds themselves are unit-tested by promtool (test_alerts.py)."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import yaml

from app.local.broker import free_port
from app.local.prometheus import RULES_FILE, LocalPrometheus
from streaming.contract import load_contract
from streaming.table.catalog import create_table
from tests.conftest import CACHE_DIR, produce_records
from tests.streaming.job.test_chaos import Service, catalog_of, service_env

ROOT = Path(__file__).resolve().parents[2]
CONTRACT_FILE = ROOT / "schemas" / "demo_events.json"
SHORT_FOR = "5s"
SHORT_SILENCE_S = 20


def rules_cut_short(into: Path) -> Path:
    groups = yaml.safe_load(RULES_FILE.read_text())
    for group in groups["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = SHORT_FOR
            if rule["alert"] == "GeoingestNoProgress":
                assert "> 300" in rule["expr"], rule["expr"]
                rule["expr"] = rule["expr"].replace("> 300", f"> {SHORT_SILENCE_S}")
    into.write_text(yaml.safe_dump(groups))
    return into


def feature(i: int) -> bytes:
    point = {"type": "Point", "coordinates": [(i * 7.3) % 340 - 170, (i * 3.1) % 160 - 80]}
    return json.dumps({"type": "Feature", "id": f"e{i}", "geometry": point, "properties": {}}).encode()


def firing(prometheus: LocalPrometheus) -> dict[str, dict]:
    return {a["labels"]["alertname"]: a for a in prometheus.alerts() if a["state"] == "firing"}


def wait_for_alert(prometheus: LocalPrometheus, name: str, service: Service, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alert = firing(prometheus).get(name)
        if alert is not None:
            return alert
        assert service.process.poll() is None, f"the service exited:\n{service.stderr_tail()}"
        time.sleep(1)
    raise AssertionError(f"{name} did not fire within {timeout_s} s; firing: {sorted(firing(prometheus))}")


@pytest.mark.integration
def test_bad_records_fire_the_dead_letter_alert_and_a_frozen_driver_the_no_progress_alert(kafka, tmp_path):
    topic = f"alerts-{uuid.uuid4().hex[:8]}"
    # One record in ten is not JSON: 10 % of what is consumed goes to the dead letters, over the 5 %.
    records = [(None, b"not json" if i % 10 == 0 else feature(i), []) for i in range(100_000)]
    assert produce_records(kafka.bootstrap, topic, records) == len(records)
    port = free_port()
    env = service_env(
        kafka.bootstrap,
        topic,
        tmp_path,
        GEOINGEST_METRICS_PORT=str(port),
        GEOINGEST_MAX_OFFSETS_PER_TRIGGER="1500",
    )
    contract = load_contract(CONTRACT_FILE)
    create_table(catalog_of(env), contract)
    rules = rules_cut_short(tmp_path / "rules.yaml")
    with LocalPrometheus(tmp_path / "prometheus", CACHE_DIR, [f"127.0.0.1:{port}"], rules_file=rules) as prometheus:
        service = Service(env, tmp_path, "alerting")
        try:
            dead_letters = wait_for_alert(prometheus, "GeoingestDeadLetterRateHigh", service, timeout_s=240)
            assert dead_letters["labels"]["table"] == contract.table
            assert 0.08 < float(dead_letters["value"]) < 0.12, dead_letters
            assert "GeoingestNoProgress" not in firing(prometheus), "no alert of silence while batches land"
            lag = prometheus.query("sum(geoingest_kafka_lag)")
            assert lag and float(lag[0]["value"][1]) > 0, "records still wait when the driver freezes"

            os.kill(service.process.pid, signal.SIGSTOP)  # the driver: its scrapes and its batches stop
            frozen_at = time.monotonic()
            silence = wait_for_alert(prometheus, "GeoingestNoProgress", service, timeout_s=120)
            assert silence["labels"]["table"] == contract.table
            assert time.monotonic() - frozen_at >= SHORT_SILENCE_S, "it fired on the silence, not before it"
        finally:
            os.kill(service.process.pid, signal.SIGCONT)
            service.kill()

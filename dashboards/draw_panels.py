"""What each row of dashboards/geoingest.json shows, drawn from a real Prometheus's answers: once
for a healthy service and once for one falling behind.

A broker of its own, Debian's Prometheus (app/local/prometheus.py) scraping every second, and the
real service (`geoingest run`, its own process) on the demo contract with maintenance beside it.
Two loads, each on a fresh table and topic, a producer sending GeoJSON points with one record in
thirty that is not JSON:

- healthy: 4,000 events/s, which the service keeps up with (batches of whatever waits, 1 s trigger);
- falling behind: 12,000 events/s into a service held to 6,000 records a 2 s trigger, 3,000/s.

After each load every query of every panel is asked of Prometheus over the load's time span, with
Grafana's variables as a dashboard over the last five minutes fills them, and drawn. Writes
docs/panels/<row>.png (the healthy run left, falling behind right) and prints what it drew.

    .venv/bin/python dashboards/draw_panels.py [--seconds 150]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the service harness lives in tests/

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from app.local.broker import free_port  # noqa: E402
from app.local.prometheus import LocalPrometheus  # noqa: E402
from bench.freshness import produce_at_rate  # noqa: E402
from bench.upsert import broker_topic  # noqa: E402
from streaming.table.catalog import create_table  # noqa: E402
from tests.conftest import CACHE_DIR  # noqa: E402
from tests.streaming.job.test_chaos import CONTRACT, Service, catalog_of, service_env, wait_for  # noqa: E402
from tests.streaming.job.test_faults import start_broker  # noqa: E402

DASHBOARD = ROOT / "dashboards" / "geoingest.json"
OUT = ROOT / "docs" / "panels"
STEP_S = 2.0
GRAFANA_VARIABLES = {"$__rate_interval": "30s", "$__range": "5m", "$table": ".+"}
LOADS = {
    "healthy": {"rate": 4_000, "max_offsets": "2000000", "trigger": "1 second"},
    "falling behind": {"rate": 12_000, "max_offsets": "6000", "trigger": "2 seconds"},
}
BAD_EVERY = 30


def rows(dashboard: dict) -> list[tuple[str, list[dict]]]:
    """(row title, its panels), in the dashboard's order."""
    out: list[tuple[str, list[dict]]] = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            out.append((panel["title"], list(panel.get("panels", []))))
        elif out:
            out[-1][1].append(panel)
    return out


def filled(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def legend(target: dict, labels: dict) -> str:
    text = target.get("legendFormat") or ""
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), text)
    return text or ",".join(f"{k}={v}" for k, v in labels.items() if k not in ("job", "instance")) or "value"


def one_load(bootstrap: str, workdir: Path, name: str, load: dict, seconds: float, dashboard: dict) -> dict:
    """Every panel's series over one load: {panel title: [(legend, times, values)]}."""
    topic = "panels-" + name.replace(" ", "-")
    broker_topic(bootstrap, topic, 4)
    port = free_port()
    env = service_env(
        bootstrap,
        topic,
        workdir / topic,
        GEOINGEST_METRICS_PORT=str(port),
        GEOINGEST_TRIGGER_INTERVAL=load["trigger"],
        GEOINGEST_MAX_OFFSETS_PER_TRIGGER=load["max_offsets"],
        GEOINGEST_MAINTENANCE_MODE="beside",
        GEOINGEST_MAINTENANCE_INTERVAL_S="20",
        GEOINGEST_MAINTENANCE_MIN_FILE_AGE_S="0",
    )
    create_table(catalog_of(env), CONTRACT)
    (workdir / topic).mkdir(parents=True, exist_ok=True)
    with LocalPrometheus(workdir / topic / "prometheus", CACHE_DIR, [f"127.0.0.1:{port}"]) as prometheus:
        service = Service(env, workdir / topic, "service")
        try:
            if not wait_for(service.query_started, timeout=180, service=service):
                raise RuntimeError(f"the service did not start its query:\n{service.stderr_tail()}")
            started = time.time()
            spawn = multiprocessing.get_context("spawn")
            out = spawn.Queue()
            producer = spawn.Process(
                target=produce_at_rate, args=(bootstrap, topic, load["rate"], seconds, None, out, BAD_EVERY)
            )
            producer.start()
            sent, _ = out.get(timeout=seconds + 300)
            producer.join()
            ended = time.time()
            series: dict[str, list] = {}
            for _, panels in rows(dashboard):
                for panel in panels:
                    drawn = series.setdefault(panel["title"], [])
                    for target in panel.get("targets", []):
                        if not target.get("expr"):
                            continue
                        for answer in prometheus.query_range(filled(target["expr"]), started, ended, STEP_S):
                            times = [float(t) - started for t, _ in answer["values"]]
                            values = [float(v) for _, v in answer["values"]]
                            drawn.append((legend(target, answer["metric"]), times, values))
        finally:
            service.stop()
    empty = sorted(title for title, drawn in series.items() if not drawn)
    print(f"{name}: {sent:,} records sent in {ended - started:.0f} s; panels without data: {empty or 'none'}")
    return series


def draw(dashboard: dict, drawn: dict[str, dict]) -> list[Path]:
    OUT.mkdir(parents=True, exist_ok=True)
    written = []
    for row, panels in rows(dashboard):
        figure, axes = plt.subplots(
            len(panels), len(drawn), figsize=(6.2 * len(drawn), 2.6 * len(panels)), squeeze=False
        )
        for column, (load, series) in enumerate(drawn.items()):
            for line, panel in enumerate(panels):
                ax = axes[line][column]
                for label, times, values in series[panel["title"]]:
                    ax.plot(times, values, label=label, linewidth=1.2)
                ax.set_title(f"{panel['title']} ({load})", fontsize=9)
                ax.tick_params(labelsize=7)
                unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
                if unit:
                    ax.set_ylabel(unit, fontsize=7)
                if series[panel["title"]]:
                    ax.legend(fontsize=6, loc="upper left")
                ax.set_xlabel("seconds into the load", fontsize=7)
        figure.tight_layout()
        path = OUT / (re.sub(r"[^a-z0-9]+", "-", row.lower()).strip("-") + ".png")
        figure.savefig(path, dpi=80)
        plt.close(figure)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=150)
    args = parser.parse_args()
    dashboard = json.loads(DASHBOARD.read_text())
    with tempfile.TemporaryDirectory(prefix="geoingest-panels-") as tmp:
        workdir = Path(tmp)
        broker = start_broker(workdir / "broker")
        try:
            drawn = {
                name: one_load(broker.bootstrap, workdir, name, load, args.seconds, dashboard)
                for name, load in LOADS.items()
            }
        finally:
            broker.stop()
    for path in draw(dashboard, drawn):
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

"""A deployment left on its defaults: does the table stay fast after thousands of small batches?

The service (`app.service.run`, as `geoingest run` runs it) on one local broker and Spark local[2],
every setting at its default (maintenance between batches, also after every
`maintenance_interval_commits` batches; at most `maintenance_max_snapshots` snapshots kept; the
maintenance lease) except what a benchmark must set: where the broker, catalog, warehouse and
checkpoint are, and the trigger, "0 seconds" instead of 10 s, so that --batches small batches
(--events-per-batch each, `max_offsets_per_trigger`) take minutes rather than hours. The demo's
sample stream and contract.

Per batch: the commit's wall time (the committer's own figure, retries included). Every
--sample-every batches, from a catalog connection of its own: the time to plan a bbox scan
(pyiceberg `plan_files` with the filter a query uses, median of 3), the snapshots, data manifests,
data files and the size of metadata.json. The figures of the first 100 batches are set against the
last 100: "within 2x" is the target.

What the trigger hides: ages. Files are compacted once `maintenance_min_file_age_s` (1 hour) old,
snapshots expire after `maintenance_snapshot_max_age_s`; a run of minutes sees neither, so the count
limits do all the work here (the file count grows for the whole run), as they do in the first hour
of a real deployment at any trigger.

Writes bench/results/defaults.json and defaults.md.

    .venv/bin/python bench/defaults.py [--batches 2000] [--events-per-batch 100]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.local.broker import LocalBroker, free_port  # noqa: E402
from app.local.sample import produce, sample_events  # noqa: E402
from app.settings import Settings, load_settings  # noqa: E402
from bench.maintenance import plan_ms  # noqa: E402  (a bbox scan over Paris planned, median of 3)
from streaming.contract import load_contract  # noqa: E402
from streaming.maintenance.maintain import data_manifest_count  # noqa: E402
from streaming.table.catalog import create_table, open_catalog  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CONTRACT = ROOT / "schemas" / "demo_events.json"
WINDOW = 100  # batches at the start and at the end that are set against each other


def table_facts(table) -> dict:
    table.refresh()
    snapshot = table.current_snapshot()
    files = int(snapshot.summary.get("total-data-files", 0)) if snapshot and snapshot.summary else 0
    return {
        "plan_ms": round(plan_ms(table), 2),
        "snapshots": len(table.metadata.snapshots),
        "data_manifests": data_manifest_count(table),
        "data_files": files,
        "metadata_bytes": len(table.io.new_input(table.metadata_location).open().read()),
    }


def run_service(settings: Settings, batches: int, sample_every: int) -> dict:
    from prometheus_client import CollectorRegistry

    from app.service import configure_logging, run

    configure_logging("WARNING")
    contract = load_contract(CONTRACT)
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    create_table(catalog, contract)
    watcher = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    commits: list[float] = []
    samples: list[dict] = []
    registry = CollectorRegistry()

    def observe(report) -> None:
        if report.outcome is not None and report.outcome.status == "committed":
            commits.append(report.outcome.duration_s * 1000)
        n = len(commits)
        if n and (n % sample_every == 0 or n == 1) and (not samples or samples[-1]["batch"] != n):
            samples.append({"batch": n, **table_facts(watcher)})
            print(f"  after {n} batches: {json.dumps(samples[-1])}", flush=True)
        if n >= batches:
            os.kill(os.getpid(), signal.SIGTERM)  # the service stops after this batch

    started = time.monotonic()
    run(settings, contract, until_idle=False, observers=(observe,), registry=registry)
    elapsed = time.monotonic() - started
    runs = {
        outcome: registry.get_sample_value(
            "geoingest_maintenance_runs_total", {"table": contract.table, "outcome": outcome}
        )
        for outcome in ("completed", "skipped", "gave_up", "failed")
    }
    return {"commit_ms": commits, "samples": samples, "seconds": round(elapsed, 1), "maintenance_runs": runs}


def summarise(result: dict) -> dict:
    commit_ms = result["commit_ms"]
    first, last = commit_ms[:WINDOW], commit_ms[-WINDOW:]
    samples = result["samples"]
    first_plans = [s["plan_ms"] for s in samples if s["batch"] <= WINDOW]
    last_plans = [s["plan_ms"] for s in samples if s["batch"] > len(commit_ms) - WINDOW]
    figures = {
        "batches": len(commit_ms),
        "commit_p50_first_ms": round(statistics.median(first), 1),
        "commit_p50_last_ms": round(statistics.median(last), 1),
        "plan_median_first_ms": round(statistics.median(first_plans), 2),
        "plan_median_last_ms": round(statistics.median(last_plans), 2),
        "largest_metadata_bytes": max(s["metadata_bytes"] for s in samples),
        "most_snapshots": max(s["snapshots"] for s in samples),
        "most_data_manifests": max(s["data_manifests"] for s in samples),
        "last": samples[-1],
        "maintenance_runs": result["maintenance_runs"],
        "seconds": result["seconds"],
    }
    figures["commit_ratio"] = round(figures["commit_p50_last_ms"] / figures["commit_p50_first_ms"], 2)
    figures["plan_ratio"] = round(figures["plan_median_last_ms"] / figures["plan_median_first_ms"], 2)
    return figures


def write_results(figures: dict, result: dict, args) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "defaults.json").write_text(
        json.dumps({"args": vars(args), "figures": figures, "samples": result["samples"]}, indent=2) + "\n"
    )
    f = figures
    lines = [
        "# The service on its default settings",
        "",
        f'{f["batches"]:,} batches of {args.events_per_batch} events (trigger "0 seconds", every other setting '
        f"at its default), {f['seconds']:,} s. Medians of the first {WINDOW} batches against the last {WINDOW}.",
        "",
        "| | first 100 | last 100 | last / first |",
        "|---|---|---|---|",
        f"| commit p50 (ms) | {f['commit_p50_first_ms']} | {f['commit_p50_last_ms']} | {f['commit_ratio']}x |",
        f"| bbox scan planning (ms) | {f['plan_median_first_ms']} | {f['plan_median_last_ms']} | {f['plan_ratio']}x |",
        "",
        f"Largest metadata.json {f['largest_metadata_bytes']:,} bytes; at most {f['most_snapshots']} snapshots and "
        f"{f['most_data_manifests']} data manifests; at the end {f['last']['data_files']:,} data files. "
        f"Maintenance runs: {', '.join(f'{k} {int(v or 0)}' for k, v in f['maintenance_runs'].items())}.",
        "",
    ]
    (RESULTS / "defaults.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--events-per-batch", type=int, default=100)
    parser.add_argument("--sample-every", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="geoingest-defaults-") as tmp:
        workdir = Path(tmp)
        broker = LocalBroker(
            workdir / "kafka", Path(load_settings(env={}).cache_dir), port=free_port(), controller_port=free_port()
        )
        broker.start()
        try:
            topic = "defaults"
            events = args.batches * args.events_per_batch + 10 * args.events_per_batch
            produce(broker.bootstrap, topic, sample_events(events), total=events, progress=False, partitions=2)
            settings = load_settings(
                env={},
                bootstrap_servers=broker.bootstrap,
                topic=topic,
                catalog={
                    "type": "sql",
                    "uri": f"sqlite:///{workdir}/catalog.db",
                    "warehouse": f"file://{workdir}/warehouse",
                },
                checkpoint_location=str(workdir / "checkpoints"),
                max_offsets_per_trigger=args.events_per_batch,
                trigger_interval="0 seconds",
                metrics_port=0,
            )
            result = run_service(settings, args.batches, args.sample_every)
        finally:
            broker.stop()
    write_results(summarise(result), result, args)


if __name__ == "__main__":
    main()

"""Where maintenance should run beside ingest: a thread of the driver or a child process.

The driver's part of a micro-batch (the Iceberg commit: refresh, replay check, manifest and
metadata writes, all Python) timed back to back for --seconds, on a table of small files, while
maintenance runs back to back (compaction at file age 0, manifest merging, expiry) in each of:
"off" (nothing), "background" (a thread of this process: it shares the GIL with the commits),
"beside" (a child process, niced, at maintenance_cpu_percent of one core) at --cpu-percents.
The files of every batch are written before the timed loop, so only the commit is timed.
Reports commit p50 / p95 / p99, commits per second, ingest conflicts and maintenance runs; the
ratios to "off" are what to read on a shared machine.

    .venv/bin/python bench/maintenance_beside.py [--seconds 40] [--cpu-percents 25,100]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the batch writer lives in tests/

import numpy as np  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from app.maintenance import MaintenanceRunner  # noqa: E402
from app.metrics import MaintenanceMetrics  # noqa: E402
from app.settings import load_settings  # noqa: E402
from streaming.contract import load_contract  # noqa: E402
from streaming.table.catalog import create_table, open_catalog  # noqa: E402
from streaming.table.commit import BatchCommit  # noqa: E402
from tests.streaming.maintenance.test_maintain import CONTRACT_PATH, BatchWriter, world_points  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def one_mode(workdir: Path, mode: str, cpu_percent: float, seconds: float, batches: int, rows: int) -> dict:
    settings = load_settings(
        env={},
        catalog={"type": "sql", "uri": f"sqlite:///{workdir / 'c.db'}", "warehouse": f"file://{workdir / 'wh'}"},
        maintenance_mode="beside" if mode.startswith("beside") else ("background" if mode == "background" else "off"),
        maintenance_cpu_percent=cpu_percent,
        maintenance_interval_s=0,
        maintenance_min_file_age_s=0,
        maintenance_snapshot_max_age_s=0,
        maintenance_max_manifests=2,
        maintenance_keep_snapshots=5,
        maintenance_max_snapshots=5,
        maintenance_steps="compact,expire",
    )
    contract = load_contract(CONTRACT_PATH)
    table, _ = create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    writer = BatchWriter(table, contract)
    rng = np.random.default_rng(5)
    # A table of small files for compaction to chew on, and the files of every timed batch.
    for batch_id in range(40):
        writer.commit(batch_id, *world_points(rng, rows))
    prepared = [(b, *writer.files(b, *world_points(rng, rows))) for b in range(40, 40 + batches)]
    registry = CollectorRegistry()
    runner = None
    if mode != "off":
        runner = MaintenanceRunner(settings, contract.table, MaintenanceMetrics(registry, contract.table))
        runner.start()
        time.sleep(1.0)  # the child process is up
    latencies, conflicts = [], 0
    started = time.monotonic()
    try:
        for batch_id, files, offsets in prepared:
            if time.monotonic() - started >= seconds:
                break
            step = time.monotonic()
            outcome = writer.committer.commit(BatchCommit(writer.writer_id, batch_id, offsets, files))
            latencies.append(time.monotonic() - step)
            conflicts += outcome.conflicts
    finally:
        elapsed = time.monotonic() - started
        if runner is not None:
            runner.stop()
    completed = registry.get_sample_value(
        "geoingest_maintenance_runs_total", {"table": contract.table, "outcome": "completed"}
    )
    rewritten = registry.get_sample_value("geoingest_maintenance_files_rewritten_total", {"table": contract.table})
    q = np.percentile(np.array(latencies) * 1000, [50, 95, 99])
    return {
        "mode": mode,
        "commits": len(latencies),
        "commits_per_s": round(len(latencies) / elapsed, 2),
        "commit_p50_ms": round(float(q[0]), 1),
        "commit_p95_ms": round(float(q[1]), 1),
        "commit_p99_ms": round(float(q[2]), 1),
        "ingest_conflicts": conflicts,
        "maintenance_runs": int(completed or 0),
        "files_rewritten": int(rewritten or 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--cpu-percents", default="25,100", help="maintenance_cpu_percent of the beside runs")
    parser.add_argument("--batches", type=int, default=600, help="batches prepared (at most this many commits)")
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--results", default="maintenance_beside")
    args = parser.parse_args()
    modes = [("off", 100.0), ("background", 100.0)]
    modes += [(f"beside {p}%", float(p)) for p in args.cpu_percents.split(",")]
    runs = []
    for mode, cpu in modes:
        with tempfile.TemporaryDirectory(prefix="geoingest-beside-") as tmp:
            run = one_mode(Path(tmp), mode, cpu, args.seconds, args.batches, args.rows)
        print(json.dumps(run), flush=True)
        runs.append(run)
    off = runs[0]
    lines = [
        "# Maintenance beside ingest: thread or process",
        "",
        f"Ingest commits back to back for {args.seconds:.0f} s (files written beforehand: the driver's part "
        f"only), {args.rows} rows a batch, SQLite catalog, while maintenance runs back to back "
        "(compaction at age 0, manifest merging, expiry). One run, 2 cores shared with other work: "
        "read the ratios to off.",
        "",
        "| maintenance | commits | commits/s | commit p50 ms | p95 ms | p99 ms | p99 / off | ingest conflicts "
        "| maintenance runs | files rewritten |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['mode']} | {r['commits']} | {r['commits_per_s']} | {r['commit_p50_ms']} | {r['commit_p95_ms']} "
            f"| {r['commit_p99_ms']} | {r['commit_p99_ms'] / off['commit_p99_ms']:.2f}x | {r['ingest_conflicts']} "
            f"| {r['maintenance_runs']} | {r['files_rewritten']} |"
        )
    lines.append("")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.results}.json").write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2) + "\n")
    (RESULTS / f"{args.results}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Concurrent commits: N writer processes append to one table, on SQLite and on PostgreSQL.

Each writer is a process with its own catalog connection (the writer of
tests/streaming/table/test_concurrency.py): it writes its batches' GeoParquet files first, then all
writers commit their batches back to back from the same moment, through `Committer`, so they race
for the table. Per run: commits/s over the commit phase, conflicts, retries per commit (mean,
max), commit latency, and rows lost or duplicated (read back from the table; must be 0).

Two retry policies: a multi-writer one (50 retries, 10 ms .. 500 ms) and Iceberg's defaults
(4 retries, 100 ms .. 60 s), under which a writer that loses 5 times in a row fails loudly.
PostgreSQL is a fresh cluster from Debian's packages (tests/postgres.py), with fsync on, like the
SQLite catalog.

Writes bench/results/concurrency.json and concurrency.md.

    .venv/bin/python bench/concurrency.py [--writers 1 4 8] [--batches 20] [--rows 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the writer and the PostgreSQL server live in tests/

from tests.postgres import postgres_server  # noqa: E402
from tests.streaming.table.test_concurrency import (  # noqa: E402
    committed_identities,
    event_id,
    new_table,
    run_writers,
    table_event_ids,
)

RESULTS = ROOT / "bench" / "results"
POLICIES = {
    "multi-writer": {
        "commit.retry.num-retries": "50",
        "commit.retry.min-wait-ms": "10",
        "commit.retry.max-wait-ms": "500",
        "commit.retry.total-timeout-ms": "300000",
    },
    "iceberg-defaults": {},
}


def run_once(catalog: str, uri: str, writers: int, batches: int, rows: int, policy: str, tmp: Path) -> dict:
    name = f"bench_{uuid.uuid4().hex[:8]}"
    warehouse = tmp / name
    props = {"type": "sql", "uri": uri, "warehouse": f"file://{warehouse}"}
    table = new_table(name, props, POLICIES[policy])
    reports, exit_codes = run_writers(name, props, writers, batches, rows, timeout_s=1800)

    outcomes = [r[3] for r in reports if r[0] == "outcome"]
    committed = [(r[1], r[2]) for r in reports if r[0] == "outcome"]
    exhausted = [r for r in reports if r[0] == "exhausted"]
    errors = [r for r in reports if r[0] == "error"]
    # The commit phase: from the barrier to the last writer's last commit (writers that failed
    # stop early; their commits still count).
    starts = [r[2] for r in reports if r[0] == "started"]
    ends = [r[3] for r in reports if r[0] == "done"]
    wall = (max(ends) - min(starts)) if starts and ends else None

    ids = table_event_ids(table)
    expected = {event_id(w, b, i) for w, b in committed for i in range(rows)}
    actual = set(ids)
    identities = committed_identities(table)
    conflicts = [o["conflicts"] for o in outcomes]
    durations = sorted(o["duration_s"] for o in outcomes)
    result = {
        "catalog": catalog,
        "policy": policy,
        "writers": writers,
        "batches_per_writer": batches,
        "rows_per_batch": rows,
        "commits": len(outcomes),
        "commit_phase_s": round(wall, 3) if wall else None,
        "commits_per_s": round(len(outcomes) / wall, 2) if wall else None,
        # Every CommitFailedException met, including those of writers that then gave up.
        "conflicts": sum(conflicts) + sum(r[5] for r in exhausted),
        "commits_with_conflicts": sum(1 for c in conflicts if c),
        "retries_per_commit_mean": round(statistics.fmean(conflicts), 3) if conflicts else None,
        "retries_per_commit_max": max(conflicts, default=None),
        "commit_latency_ms_p50": round(1000 * durations[len(durations) // 2], 1) if durations else None,
        "commit_latency_ms_p95": round(1000 * durations[int(len(durations) * 0.95)], 1) if durations else None,
        "commit_latency_ms_max": round(1000 * durations[-1], 1) if durations else None,
        "writers_failed_retries_exhausted": len(exhausted),
        "writers_failed_other": len(errors),
        "batches_not_committed": writers * batches - len(outcomes),
        "snapshots_in_table": len(identities),
        "snapshots_duplicated": len(identities) - len(set(identities)),
        "rows_expected": len(expected),
        "rows_in_table": len(ids),
        "rows_lost": len(expected - actual),
        "rows_duplicated": len(ids) - len(actual),
        "rows_unexpected": len(actual - expected),
        "exit_codes": sorted(exit_codes.values()),
        "first_error": (exhausted[0][3] if exhausted else errors[0][2][-500:] if errors else None),
    }
    return result


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        f"Concurrent commits: writer processes x {report['batches_per_writer']} batches x "
        f"{report['rows_per_batch']} rows, all committing from the same moment "
        f"({env['cores']} cores, shared; PostgreSQL {env['postgres_version']}, fsync on; SQLite file catalog)",
        "",
        "Policies: multi-writer = commit.retry.num-retries 50, min-wait 10 ms, max-wait 500 ms; "
        "iceberg-defaults = 4 retries, 100 ms .. 60 s.",
        "",
        "| catalog | policy | writers | commits | commits/s | conflicts | retries/commit mean | max "
        "| latency p50 ms | p95 ms | writers failed (exhausted) | rows lost | rows duplicated |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['catalog']} | {r['policy']} | {r['writers']} | {r['commits']} | {r['commits_per_s']} | "
            f"{r['conflicts']} | {r['retries_per_commit_mean']} | {r['retries_per_commit_max']} | "
            f"{r['commit_latency_ms_p50']} | {r['commit_latency_ms_p95']} | "
            f"{r['writers_failed_retries_exhausted']} | {r['rows_lost']} | {r['rows_duplicated']} |"
        )
    lines += [
        "",
        "commits/s: commits over the commit phase (barrier to last commit). conflicts: every "
        "CommitFailedException met, including those of writers that gave up; retries/commit: over the "
        "commits that landed. Rows lost / duplicated are read back from the table against every batch a "
        "writer was told had committed; a writer whose retries ran out exits non-zero and its batch is "
        "absent.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--catalogs", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--results", type=Path, default=RESULTS, help="where concurrency.json and .md go")
    args = parser.parse_args()

    runs = []
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="geoingest-conc-")))
        uris = {}
        pg_version = None
        if "postgres" in args.catalogs:
            started = time.monotonic()
            server = stack.enter_context(postgres_server(durable=True))
            pg_version = server.version
            print(
                f"PostgreSQL {server.version} up in {time.monotonic() - started:.1f} s"
                + (f" (installed in {server.install_seconds:.0f} s)" if server.install_seconds else "")
            )
            uris["postgres"] = server.uri
        if "sqlite" in args.catalogs:
            uris["sqlite"] = f"sqlite:///{tmp / 'catalog.db'}"
        for catalog in args.catalogs:
            for policy in args.policies:
                for writers in args.writers:
                    result = run_once(catalog, uris[catalog], writers, args.batches, args.rows, policy, tmp)
                    print(json.dumps({k: v for k, v in result.items() if k != "first_error"}))
                    runs.append(result)

    report = {
        "batches_per_writer": args.batches,
        "rows_per_batch": args.rows,
        "environment": {"cores": os.cpu_count(), "postgres_version": pg_version},
        "runs": runs,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "concurrency.json").write_text(json.dumps(report, indent=2) + "\n")
    md = markdown(report)
    (args.results / "concurrency.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()

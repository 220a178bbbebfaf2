"""Reliability under kill -9: the chaos run of tests/streaming/job/test_chaos.py at a larger scale.

Produces N sample events (the demo's mix, ~0.5 % malformed) to a broker of its own, then runs the
real service (`geoingest run`, a process group of its own: driver, Spark JVM, Python workers) and
SIGKILLs it K times at random moments (seeded), restarting it each time with the same checkpoint.
Every fifth kill is aimed between the Iceberg commit and Spark's checkpoint commit with the
GEOINGEST_HOLD_AFTER_COMMIT_FILE hook, and every fifth at a batch writing its data files. Then it
drains the topic with --until-idle and reads back:

    kills survived, and where each fell (read from the dead process's checkpoint and the table)
    events lost / duplicated / unexpected, by event id against the decoder's own verdict
    Kafka offsets recorded by no snapshot or by two
    replayed batches skipped, commits, conflicts and retries (from each run's /metrics and logs)
    DLQ records by reason (deduplicated by source topic/partition/offset) and how many were resent
    orphan files of killed batches, and the table after deleting them

Each run serves /metrics on a port of its own; a scraper keeps the last answer of each run, so the
counters of a killed run are those of its last scrape (at most a second old).

Writes bench/results/reliability.json and reliability.md.

    .venv/bin/python bench/reliability.py [--events 1000000] [--kills 20] [--max-offsets-per-trigger 25000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the chaos harness lives in tests/

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.conftest import CACHE_DIR  # noqa: E402
from tests.streaming.job.test_chaos import (  # noqa: E402
    CONTRACT,
    ChaosRun,
    catalog_of,
    expected_outcome,
    orphan_listing,
    prepare,
    run_chaos,
    verify,
)
from tests.streaming.job.test_faults import start_broker  # noqa: E402

RESULTS = ROOT / "bench" / "results"


class MetricsScraper(threading.Thread):
    """Keeps the last /metrics answer of every run of a chaos run."""

    def __init__(self, chaos: ChaosRun, every_s: float = 0.5):
        super().__init__(daemon=True, name="metrics-scraper")
        self.chaos = chaos
        self.every_s = every_s
        self.last: dict[str, str] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            for service in list(self.chaos.services[-2:]):
                if service.alive and service.metrics_port:
                    try:
                        url = f"http://127.0.0.1:{service.metrics_port}/metrics"
                        with urllib.request.urlopen(url, timeout=2) as answer:
                            self.last[service.name] = answer.read().decode()
                    except OSError:
                        pass  # not serving yet, or just killed
            self.stopped.wait(self.every_s)

    def totals(self) -> dict[str, float]:
        """Sums over the runs of their last scraped counters."""
        sums: Counter = Counter()
        for text in self.last.values():
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == "geoingest_commits_total":
                        sums[f"commits_{sample.labels['outcome']}"] += sample.value
                    elif sample.name in (
                        "geoingest_commit_conflicts_total",
                        "geoingest_commit_retries_sum",
                        "geoingest_batches_total",
                        "geoingest_events_consumed_total",
                        "geoingest_events_committed_total",
                    ):
                        sums[sample.name.removeprefix("geoingest_")] += sample.value
        return dict(sums)


def markdown(report: dict) -> str:
    p, v, c, lg = report["parameters"], report["verdict"], report["commits"], report["commits_logged"]
    kills = report["kills"]
    lines = [
        f"Reliability under kill -9: {p['events']:,} demo events, {p['kills']} kills "
        f"({p['hold_kills']} held between the Iceberg commit and the checkpoint commit, {p['write_kills']} aimed "
        f"at a batch writing its data files, the others at random moments), "
        f"batches of {p['max_offsets_per_trigger']:,} offsets, local[2] on {report['environment']['cores']} "
        f"shared cores; seed {p['seed']}.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| kills survived | {report['kills_survived']} of {len(kills)} |",
        f"| service starts (kills + self-exits + final drain) | {report['service_starts']} |",
        f"| self-exits (runs that died before their kill) | {len(report['self_exits'])} |",
        f"| events produced | {v['events']:,} |",
        f"| valid events expected (decoder) | {v['valid_expected']:,} |",
        f"| rows in the table | {v['rows_in_table']:,} |",
        f"| events lost | {v['lost']} |",
        f"| events duplicated | {v['duplicated']} |",
        f"| unexpected rows | {v['unexpected']} |",
        f"| Kafka offsets in no snapshot or in two | {len(v['offset_problems'])} |",
        f"| snapshots / duplicate (writer, batch) | {v['snapshots']} / {v['duplicate_identities']} |",
        f"| replayed batches skipped (`skipped_replay`) | {v['replays_skipped']} |",
        f"| held batches recognised on replay | {len(v['replayed_hold_batches'])} of {p['hold_kills']} |",
        f"| batch commits logged: committed / skipped_replay / failed | {lg.get('committed', 0)} / "
        f"{lg.get('skipped_replay', 0)} / {lg.get('failed', 0)} |",
        f"| commit conflicts / conflict retries (each run's /metrics, last scrape) | "
        f"{c.get('commit_conflicts_total', 0):.0f} / {c.get('commit_retries_sum', 0):.0f} |",
        f"| commit retries on an unreachable catalog (log) | {report['catalog_unavailable_retries']} |",
        f"| DLQ records / distinct sources / resent | {v['dlq_records']:,} / {v['dlq_distinct_sources']:,} / "
        f"{v['dlq_resent']:,} |",
        f"| rejects missing from the DLQ / with a wrong reason | {v['dlq_missing_keys']} / {v['dlq_wrong_reason']} |",
        f"| orphan files of killed batches (deleted) | {report['orphans']['files']} "
        f"({report['orphans']['bytes'] / 1e6:.1f} MB) |",
        f"| table intact after deleting orphans | {report['orphans']['table_intact_after_delete']} |",
        f"| wall time: chaos run incl. final drain | {report['seconds']['chaos']:.0f} s |",
        "",
        "DLQ by reason (deduplicated by source offset):",
        "",
        "| reason | records |",
        "|---|---|",
        *[f"| {reason} | {n:,} |" for reason, n in v["dlq_by_reason"].items()],
        "",
        "Where the kills fell (read back from the dead process's checkpoint and the table):",
        "",
        "| phase | kills |",
        "|---|---|",
        *[f"| {phase} | {n} |" for phase, n in report["kills_by_phase"].items()],
        "",
        "| strategy | kills |",
        "|---|---|",
        *[f"| {strategy} | {n} |" for strategy, n in report["kills_by_strategy"].items()],
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--hold-every", type=int, default=5, help="every n-th kill is held after the commit")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=25_000)
    parser.add_argument("--seed", type=int, default=20240611)
    parser.add_argument("--workdir", help="keep the run's folders here (default: a temporary folder)")
    parser.add_argument("--output", default=str(RESULTS / "reliability"), help="results path without suffix")
    args = parser.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="geoingest-reliability-"))
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    seconds: dict[str, float] = {}
    broker = start_broker(work / "broker")
    try:
        topic = f"reliability-{uuid.uuid4().hex[:8]}"
        started = time.monotonic()
        env, events = prepare(
            broker.bootstrap,
            topic,
            work,
            args.events,
            GEOINGEST_MAX_OFFSETS_PER_TRIGGER=str(args.max_offsets_per_trigger),
        )
        seconds["produce"] = time.monotonic() - started
        started = time.monotonic()
        valid, rejected = expected_outcome(events)
        seconds["expected"] = time.monotonic() - started
        print(
            f"{len(events):,} events produced in {seconds['produce']:.0f} s; "
            f"{len(valid):,} valid, {len(rejected):,} rejected by the decoder",
            flush=True,
        )

        hold_kills = {k for k in range(args.kills) if k % args.hold_every == args.hold_every - 1}
        # as many aimed at a batch writing its data files (their files become orphans)
        write_kills = {k for k in range(args.kills) if k % args.hold_every == args.hold_every // 2}
        # A batch of the default size takes a few seconds here; kills spread over that.
        batch_s = max(3.0, args.max_offsets_per_trigger / 8_000)
        chaos = ChaosRun()
        scraper = MetricsScraper(chaos)
        scraper.start()
        started = time.monotonic()
        run_chaos(
            env,
            logs,
            args.kills,
            random.Random(args.seed),
            hold_kills,
            write_kills,
            batch_s=batch_s,
            step_timeout_s=600,
            result=chaos,
            serve_metrics=True,
            progress=lambda message: print(f"[{time.monotonic() - started:6.0f} s] {message}", flush=True),
        )
        seconds["chaos"] = time.monotonic() - started
        scraper.stopped.set()
        scraper.join()

        started = time.monotonic()
        verdict = verify(env, topic, events, valid, rejected, chaos)
        orphans = orphan_listing(env)
        deleted = orphan_listing(env, delete=True)
        table = catalog_of(env).load_table(CONTRACT.table)
        ids = table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()
        intact = len(ids) == len(set(ids)) == len(valid) and set(ids) == valid and orphan_listing(env) == []
        seconds["verify"] = time.monotonic() - started
    finally:
        broker.stop()

    logged = Counter(b.get("commit") for s in chaos.services for b in s.batches())
    logged["failed"] = sum(1 for s in chaos.services for line in s.log() if line.get("msg") == "commit failed")
    unavailable_retries = sum(
        1 for s in chaos.services for line in s.log() if line.get("msg") == "catalog unavailable, retrying the commit"
    )
    clean = (
        verdict.lost == verdict.duplicated == verdict.unexpected == 0
        and not verdict.offset_problems
        and verdict.duplicate_identities == 0
    )
    report = {
        "parameters": {
            "events": args.events,
            "kills": args.kills,
            "hold_kills": len(hold_kills),
            "write_kills": len(write_kills),
            "max_offsets_per_trigger": args.max_offsets_per_trigger,
            "seed": args.seed,
            "trigger_interval": env["GEOINGEST_TRIGGER_INTERVAL"],
            "spark_master": env["GEOINGEST_SPARK_MASTER"],
        },
        "environment": {"cores": os.cpu_count(), "cache_dir": str(CACHE_DIR)},
        "kills_survived": len(chaos.kills) if clean else 0,
        "service_starts": len(chaos.services),
        "kills": [asdict(k) for k in chaos.kills],
        "kills_by_phase": dict(Counter(k.phase for k in chaos.kills).most_common()),
        "kills_by_strategy": dict(Counter(k.strategy for k in chaos.kills).most_common()),
        "self_exits": [asdict(e) for e in chaos.self_exits],
        "hold_batch_ids": chaos.hold_batch_ids,
        "verdict": asdict(verdict),
        "commits_logged": dict(logged),
        "commits": scraper.totals(),
        "catalog_unavailable_retries": unavailable_retries,
        "orphans": {
            "files": len(orphans),
            "bytes": sum(o["bytes"] for o in orphans),
            "deleted": len(deleted),
            "table_intact_after_delete": intact,
        },
        "final_drain": chaos.final_summary,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "workdir": str(work),
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    if not (clean and intact):
        sys.exit(1)


if __name__ == "__main__":
    main()

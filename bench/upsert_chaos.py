"""kill -9 on an upsert table: the chaos run of tests/streaming/job/test_chaos.py, on a stream of versions.

Produces --events records over --keys keys (tests/streaming/write/test_upsert.py's stream: every key
created once, then updates that move features anywhere, 10 % tombstones; keyed, so the versions of
a key share a partition) to a broker of its own, then runs the real service (`geoingest run` on the
demo contract in `mode: upsert`) and SIGKILLs it --kills times at random moments (seeded),
restarting it with the same checkpoint; two kills are aimed between the Iceberg commit and Spark's
checkpoint commit, one at a batch writing its files. Then it drains the topic and checks that the
table holds exactly the current version of every live key (rows and equality deletes applied by
`geoingest query`), that every Kafka offset is in exactly one snapshot, that no batch identity is
committed twice, and that the held batches' replays were skipped.

Writes bench/results/upsert_chaos.json and upsert_chaos.md.

    .venv/bin/python bench/upsert_chaos.py [--events 200000] [--keys 20000] [--kills 6]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the chaos harness lives in tests/

from bench.upsert import broker_topic, table_state  # noqa: E402
from streaming.contract import parse_contract  # noqa: E402
from streaming.table.catalog import create_table  # noqa: E402
from tests.conftest import produce_records  # noqa: E402
from tests.streaming.job.test_chaos import (  # noqa: E402
    CONTRACT,
    catalog_of,
    coverage_problems,
    end_offsets,
    identities,
    kafka_client,
    offset_coverage,
    run_chaos,
    service_env,
)
from tests.streaming.job.test_faults import start_broker  # noqa: E402
from tests.streaming.write.test_upsert import DEMO, expected_state, make_stream  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=20261124)
    args = parser.parse_args()
    records = make_stream(args.keys, args.events, seed=5)
    expected = expected_state(records)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="geoingest-upsert-chaos-") as tmp:
        workdir = Path(tmp)
        broker = start_broker(workdir / "kafka")
        try:
            topic = "versions"
            broker_topic(broker.bootstrap, topic)
            if produce_records(broker.bootstrap, topic, records) != len(records):
                raise RuntimeError("the broker did not take every record")
            env = service_env(
                broker.bootstrap,
                topic,
                workdir,
                GEOINGEST_MAX_OFFSETS_PER_TRIGGER=str(args.max_offsets_per_trigger),
                GEOINGEST_MAINTENANCE_MODE="off",
            )
            raw = {**DEMO, "mode": "upsert"}
            contract_file = workdir / "upsert.json"
            contract_file.write_text(json.dumps(raw))
            create_table(catalog_of(env), parse_contract(raw))
            chaos = run_chaos(
                env,
                workdir,
                args.kills,
                random.Random(args.seed),
                hold_kills={1, 4},
                write_kills={2},
                contract=contract_file,
                progress=print,
            )
            table = catalog_of(env).load_table(CONTRACT.table)
            state = table_state(table)
            idents = identities(table)
            pairs = Counter((i.writer_id, i.batch_id) for i in idents)
            skipped = {b["batch_id"] for _, b in chaos.batch_lines() if b.get("commit") == "skipped_replay"}
            report = {
                "args": vars(args),
                "seconds": round(time.monotonic() - started, 1),
                "kills": [{"phase": k.phase, "strategy": k.strategy, "batch_id": k.batch_id} for k in chaos.kills],
                "self_exits": len(chaos.self_exits),
                "live_keys_expected": len(expected),
                "rows_in_table": len(state),
                "keys_missing": len(set(expected) - set(state)),
                "keys_unexpected": len(set(state) - set(expected)),
                "keys_with_an_old_version": sum(1 for k, v in state.items() if k in expected and expected[k] != v),
                "state_matches": state == expected,
                "snapshots": len(idents),
                "duplicate_identities": sum(n - 1 for n in pairs.values() if n > 1),
                "offset_problems": coverage_problems(
                    offset_coverage(idents, topic), end_offsets(kafka_client(env), topic)
                ),
                "held_batches": chaos.hold_batch_ids,
                "held_batches_replayed_and_skipped": sorted(b for b in chaos.hold_batch_ids if b in skipped),
            }
        finally:
            broker.stop()
    write_results(report)


def write_results(report: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "upsert_chaos.json").write_text(json.dumps(report, indent=2) + "\n")
    a = report["args"]
    phases = Counter(k["phase"] for k in report["kills"])
    lines = [
        "# kill -9 on an upsert table",
        "",
        f"{a['events']:,} records over {a['keys']:,} keys (updates anywhere, 10 % tombstones), "
        f"{len(report['kills'])} kills ({', '.join(f'{p}: {n}' for p, n in sorted(phases.items()))}), "
        f"{report['self_exits']} runs that exited by themselves, {report['seconds']} s.",
        "",
        f"- live keys expected {report['live_keys_expected']:,}, rows in the table {report['rows_in_table']:,}: "
        f"missing {report['keys_missing']}, unexpected {report['keys_unexpected']}, "
        f"an old version {report['keys_with_an_old_version']}; the table equals the state computed from "
        f"the records: {report['state_matches']}",
        f"- snapshots {report['snapshots']}, batch identities committed twice {report['duplicate_identities']}, "
        f"offset problems {len(report['offset_problems'])}",
        f"- batches held after their Iceberg commit {report['held_batches']}, replayed and skipped "
        f"{report['held_batches_replayed_and_skipped']}",
        "",
    ]
    (RESULTS / "upsert_chaos.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

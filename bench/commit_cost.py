"""The driver's commit of one micro-batch, as the table's snapshots pile up: pyiceberg's own
Transaction against the one the committer uses (streaming/table/commit.py, _StagedMetadataTransaction),
which builds the metadata it would commit once per staged change instead of at every look.

The demo table on a SQLite catalog; each batch one small file appended by the real committer (the
replay check, the single-attempt view, the fast append). Reported: the median commit latency in
each band of snapshots the table holds, per transaction kind, and their ratio. Maintenance keeps
up to 100 snapshots by default (maintenance_max_snapshots), so the 100-150 band is the steady state.

Writes bench/results/commit_cost.json and commit_cost.md.

    .venv/bin/python bench/commit_cost.py [--batches 160]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the batch writer lives in tests/

import numpy as np  # noqa: E402
from pyiceberg.table import Table  # noqa: E402

from streaming.contract import load_contract  # noqa: E402
from streaming.table import commit  # noqa: E402
from streaming.table.catalog import create_table, open_catalog  # noqa: E402
from streaming.table.commit import BatchCommit  # noqa: E402
from tests.streaming.maintenance.test_maintain import CONTRACT_PATH, BatchWriter, world_points  # noqa: E402

RESULTS = ROOT / "bench" / "results"
BANDS = ((5, 15), (45, 55), (95, 105), (140, 160))


def latencies(kind: str, batches: int) -> list[float]:
    """Commit latency of each batch, in seconds, with the given transaction kind."""
    original = commit._SingleAttemptView.transaction
    if kind == "pyiceberg":
        commit._SingleAttemptView.transaction = Table.transaction  # type: ignore[method-assign]
    try:
        work = Path(tempfile.mkdtemp(prefix="commit-cost-"))
        catalog = open_catalog(
            "bench", {"type": "sql", "uri": f"sqlite:///{work / 'c.db'}", "warehouse": f"file://{work / 'wh'}"}
        )
        contract = load_contract(CONTRACT_PATH)
        table, _ = create_table(catalog, contract)
        writer = BatchWriter(table, contract)
        rng = np.random.default_rng(5)
        prepared = [(b, *writer.files(b, *world_points(rng, 200))) for b in range(batches)]
        out = []
        for batch_id, files, offsets in prepared:
            started = time.perf_counter()
            writer.committer.commit(BatchCommit(writer.writer_id, batch_id, offsets, files))
            out.append(time.perf_counter() - started)
        return out
    finally:
        commit._SingleAttemptView.transaction = original  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=160)
    parser.add_argument("--results", default="commit_cost")
    args = parser.parse_args()
    # Each kind in a fresh process: the first one's garbage must not slow the second's collections.
    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        runs = {kind: pool.apply(latencies, (kind, args.batches)) for kind in ("pyiceberg", "staged-once")}
    rows = []
    for lo, hi in BANDS:
        if hi > args.batches:
            continue
        plain, ours = (float(np.median(runs[k][lo:hi])) * 1000 for k in ("pyiceberg", "staged-once"))
        rows.append(
            {
                "snapshots": f"{lo}-{hi}",
                "pyiceberg_ms": round(plain, 1),
                "staged_once_ms": round(ours, 1),
                "ratio": round(plain / ours, 2),
            }
        )
    for row in rows:
        print(
            f"{row['snapshots']:>8} snapshots  pyiceberg {row['pyiceberg_ms']:7.1f} ms  "
            f"staged once {row['staged_once_ms']:7.1f} ms  {row['ratio']}x",
            flush=True,
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.results}.json").write_text(json.dumps({"batches": args.batches, "rows": rows}, indent=2) + "\n")
    lines = [
        "# A micro-batch's commit as snapshots pile up",
        "",
        "Median commit latency of one small append by the committer, the demo table on SQLite, "
        "one run on 2 shared cores (read the ratios).",
        "",
        "| snapshots held | pyiceberg Transaction ms | metadata built once per change ms | ratio |",
        "|---|---|---|---|",
        *(f"| {r['snapshots']} | {r['pyiceberg_ms']} | {r['staged_once_ms']} | {r['ratio']}x |" for r in rows),
    ]
    (RESULTS / f"{args.results}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

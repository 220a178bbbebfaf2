"""Table maintenance: a table that stays fast after thousands of micro-batches.

Part 1, commit latency, scan planning and metadata size against the number of commits, on the
SQLite and PostgreSQL catalogs. Each commit is a real micro-batch of `--rows` GeoJSON points,
decoded, Hilbert-sorted and written by the code a Spark task runs (`PartitionTask`, 2 tasks per
batch) and committed by `Committer`, without Spark or Kafka, as the issue's own measurements were.
Two tables per catalog in one run: one without maintenance (today's curve, `--baseline-commits`),
one with `maintain()` (compact, merge manifests, expire, delete orphans) every `--maintain-every`
commits, the way the service runs it between batches. Every `--sample-every` commits: the mean
commit time since the last sample, the time to plan a bbox scan (pyiceberg `plan_files` with the
bbox filter a query uses; median of 3), the size of metadata.json, snapshots, manifests, files.

Part 2, pruning after compaction: 1,000,000 skewed city points written as 25 batches of 40,000
(2 tasks each) against the same points written as one batch, then the small-batch table
compacted. Files and row groups a window query reads (the query's own pruning), over 100 windows
of 0.1 % of the data extent and a Paris window; before/after pictures of the file extents
(`geoingest inspect --plot`, here through the same function, the "before" by time travel).

Part 3, merge or re-sort: compaction's sort of the keys of k already sorted files, numpy's
stable sort (which merges sorted runs) against quicksort.

Writes bench/results/maintenance.json, maintenance.md and maintenance.png, and
docs/maintenance-before.png / docs/maintenance-after.png. Ratios are within one run; the machine
is shared, so absolute times are not conclusions.

    .venv/bin/python bench/maintenance.py [--commits 10000] [--baseline-commits 1000] [--catalogs sqlite postgresql]
    .venv/bin/python bench/maintenance.py --part pruning
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the batch writer and the PostgreSQL server live in tests/

from pyiceberg.expressions import And, GreaterThanOrEqual, LessThanOrEqual  # noqa: E402

from bench.cities import city_points  # noqa: E402
from streaming.contract import load_contract, parse_contract  # noqa: E402
from streaming.maintenance.maintain import data_manifest_count, maintain  # noqa: E402
from streaming.maintenance.plan import MaintenancePolicy  # noqa: E402
from streaming.read.inspect import file_extents, plot_file_extents  # noqa: E402
from streaming.read.predicate import Predicate  # noqa: E402
from streaming.read.query import query  # noqa: E402
from streaming.table.catalog import create_table, open_catalog  # noqa: E402
from tests.postgres import postgres_server  # noqa: E402
from tests.streaming.maintenance.test_maintain import BatchWriter, world_points  # noqa: E402

RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs"
CONTRACT = load_contract(ROOT / "schemas" / "demo_events.json")
PARIS = (2.2, 48.8, 2.5, 48.9)
# What the service would run between batches; ages 0 because the benchmark has no commit in
# flight while it maintains, and it compresses a month into an hour. Orphans keep their default
# age: a younger one is refused (below the table's commit window).
BENCH_POLICY = MaintenancePolicy(min_file_age_s=0, snapshot_max_age_s=0, keep_snapshots=20, max_manifests=8)


def bbox_filter(window):
    xmin, ymin, xmax, ymax = window
    return And(
        LessThanOrEqual("bbox.xmin", xmax),
        GreaterThanOrEqual("bbox.xmax", xmin),
        LessThanOrEqual("bbox.ymin", ymax),
        GreaterThanOrEqual("bbox.ymax", ymin),
    )


def plan_ms(table) -> float:
    table.refresh()
    times = []
    for _ in range(3):
        started = time.perf_counter()
        list(table.scan(row_filter=bbox_filter(PARIS)).plan_files())
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def metadata_bytes(table) -> int:
    return len(table.io.new_input(table.metadata_location))


# -- part 1 ---------------------------------------------------------------------------------------
def commit_curve(
    props: dict, name: str, commits: int, rows: int, sample_every: int, maintain_every: int | None, label: str
) -> dict:
    catalog = open_catalog("bench", props)
    contract = dataclasses.replace(CONTRACT, table=f"bench.{name}")
    table, _ = create_table(catalog, contract)
    writer = BatchWriter(table, contract, writer_id=f"w-{name}")
    rng = np.random.default_rng(7)
    samples, maintenance_runs = [], []
    window: list[float] = []
    all_commit_ms: list[float] = []
    started = time.monotonic()
    for batch_id in range(commits):
        outcome = writer.commit(batch_id, *world_points(rng, rows))
        assert outcome.status == "committed", outcome
        window.append(outcome.duration_s * 1000)
        all_commit_ms.append(outcome.duration_s * 1000)
        done = batch_id + 1
        if maintain_every and done % maintain_every == 0:
            report = maintain(table, BENCH_POLICY)
            maintenance_runs.append(
                {
                    "after_commit": done,
                    "seconds": round(report.seconds, 3),
                    "files_rewritten": report.compaction.files_rewritten,
                    "files_written": report.compaction.files_written,
                    "snapshots_expired": report.expiry.snapshots_expired,
                    "files_deleted": report.expiry.files_deleted + report.orphans.deleted,
                }
            )
            writer.committer.table.refresh()
        if done % sample_every == 0 or done == commits:
            table.refresh()
            sample = {
                "commits": done,
                "commit_ms": round(statistics.fmean(window), 2),
                "commit_p50_ms": round(statistics.median(window), 2),
                "plan_ms": round(plan_ms(table), 2),
                "metadata_bytes": metadata_bytes(table),
                "snapshots": len(table.metadata.snapshots),
                "manifests": data_manifest_count(table),
                "files": sum(1 for _ in table.scan().plan_files()),
                "elapsed_s": round(time.monotonic() - started, 1),
            }
            samples.append(sample)
            window = []
            print(f"  {label}: {json.dumps(sample)}", flush=True)
    paired = paired_with_a_new_table(catalog, writer, commits, rows, maintain_every, name)
    print(f"  {label}, paired: {json.dumps(paired)}", flush=True)
    table.refresh()
    rows_in_table = table.scan(selected_fields=("event_id",)).to_arrow().num_rows
    expected_rows = (commits + PAIRED_COMMITS) * rows
    assert rows_in_table == expected_rows, f"{label}: {rows_in_table} rows for {expected_rows}"
    first = [s for s in samples if s["commits"] <= 100]
    last = [s for s in samples if s["commits"] > samples[-1]["commits"] - 100]
    return {
        "label": label,
        "commits": commits,
        "rows_per_commit": rows,
        "maintain_every": maintain_every,
        "samples": samples,
        "maintenance_runs": maintenance_runs,
        "first_100_commit_ms": round(statistics.fmean(all_commit_ms[:100]), 2),
        "last_100_commit_ms": round(statistics.fmean(all_commit_ms[-100:]), 2),
        # Medians too: the machine is shared, and a burst of other work skews a mean.
        "first_100_commit_p50_ms": round(statistics.median(all_commit_ms[:100]), 2),
        "last_100_commit_p50_ms": round(statistics.median(all_commit_ms[-100:]), 2),
        "commit_ms_all": [round(v, 2) for v in all_commit_ms],
        "first_100_plan_ms": round(statistics.fmean(s["plan_ms"] for s in first), 2),
        "last_100_plan_ms": round(statistics.fmean(s["plan_ms"] for s in last), 2),
        "max_metadata_bytes": max(s["metadata_bytes"] for s in samples),
        "final_metadata_bytes": samples[-1]["metadata_bytes"],
        "maintenance_seconds_total": round(sum(r["seconds"] for r in maintenance_runs), 1),
        "paired": paired,
        "rows_checked": rows_in_table,
    }


PAIRED_COMMITS = 100


def paired_with_a_new_table(
    catalog, aged: BatchWriter, next_batch: int, rows: int, maintain_every: int | None, name: str
) -> dict:
    """The aged table's next 100 commits against the first 100 of a new table, alternating one and
    the other, with a bbox scan planned on each every 10 commits: both under the same load of the
    shared machine, unlike the first 100 commits of the long run, made an hour earlier. The aged
    table keeps its maintenance schedule."""
    contract = dataclasses.replace(CONTRACT, table=f"bench.{name}_new")
    table, _ = create_table(catalog, contract)
    new = BatchWriter(table, contract, writer_id=f"w-{name}-new")
    rng = np.random.default_rng(13)
    commit_ms: dict[str, list[float]] = {"aged": [], "new": []}
    planning: dict[str, list[float]] = {"aged": [], "new": []}
    for i in range(PAIRED_COMMITS):
        commit_ms["new"].append(new.commit(i, *world_points(rng, rows)).duration_s * 1000)
        commit_ms["aged"].append(aged.commit(next_batch + i, *world_points(rng, rows)).duration_s * 1000)
        if maintain_every and (next_batch + i + 1) % maintain_every == 0:
            maintain(aged.table, BENCH_POLICY)
        if (i + 1) % 10 == 0:
            planning["new"].append(plan_ms(table))
            planning["aged"].append(plan_ms(aged.table))
    out = {"aged_commits": next_batch}
    for key in ("aged", "new"):
        out[f"{key}_commit_p50_ms"] = round(statistics.median(commit_ms[key]), 2)
        out[f"{key}_commit_mean_ms"] = round(statistics.fmean(commit_ms[key]), 2)
        out[f"{key}_plan_p50_ms"] = round(statistics.median(planning[key]), 2)
    out["commit_p50_ratio"] = round(out["aged_commit_p50_ms"] / out["new_commit_p50_ms"], 2)
    out["commit_mean_ratio"] = round(out["aged_commit_mean_ms"] / out["new_commit_mean_ms"], 2)
    out["plan_p50_ratio"] = round(out["aged_plan_p50_ms"] / out["new_plan_p50_ms"], 2)
    return out


def part_latency(args, tmp: Path) -> dict:
    out = {}
    with ExitStack() as stack:
        for catalog in args.catalogs:
            if catalog == "sqlite":
                uri = f"sqlite:///{tmp / 'catalog.db'}"
            else:
                uri = stack.enter_context(postgres_server(durable=True)).uri
            props = {"type": "sql", "uri": uri, "warehouse": f"file://{tmp / catalog}"}
            print(f"{catalog}: {args.commits} commits with maintenance, {args.baseline_commits} without", flush=True)
            with_ = commit_curve(
                props,
                f"with_{catalog}",
                args.commits,
                args.rows,
                args.sample_every,
                args.maintain_every,
                f"{catalog} with maintenance",
            )
            without = commit_curve(
                props,
                f"without_{catalog}",
                args.baseline_commits,
                args.rows,
                args.sample_every,
                None,
                f"{catalog} without maintenance",
            )
            out[catalog] = {
                "with_maintenance": with_,
                "without_maintenance": without,
                # The headline: the aged table against a new one, measured side by side.
                "commit_p50_ratio_after_vs_first_100": with_["paired"]["commit_p50_ratio"],
                "plan_p50_ratio_after_vs_first_100": with_["paired"]["plan_p50_ratio"],
                "baseline_commit_p50_ratio_after_vs_first_100": without["paired"]["commit_p50_ratio"],
                "baseline_plan_p50_ratio_after_vs_first_100": without["paired"]["plan_p50_ratio"],
                "commit_ratio_last_vs_first_100": round(with_["last_100_commit_ms"] / with_["first_100_commit_ms"], 2),
                "commit_p50_ratio_last_vs_first_100": round(
                    with_["last_100_commit_p50_ms"] / with_["first_100_commit_p50_ms"], 2
                ),
                "baseline_commit_p50_ratio_last_vs_first_100": round(
                    without["last_100_commit_p50_ms"] / without["first_100_commit_p50_ms"], 2
                ),
                "plan_ratio_last_vs_first_100": round(with_["last_100_plan_ms"] / with_["first_100_plan_ms"], 2),
                "baseline_commit_ratio_last_vs_first_100": round(
                    without["last_100_commit_ms"] / without["first_100_commit_ms"], 2
                ),
                "baseline_plan_ratio_last_vs_first_100": round(
                    without["last_100_plan_ms"] / without["first_100_plan_ms"], 2
                ),
            }
            print(json.dumps({k: v for k, v in out[catalog].items() if "ratio" in k}), flush=True)
    return out


# -- part 2 ---------------------------------------------------------------------------------------
def windows(lon: np.ndarray, lat: np.ndarray, n: int, share: float, seed: int) -> list[tuple]:
    """n windows of `share` of the data extent's area, centred on data points."""
    rng = np.random.default_rng(seed)
    w = (lon.max() - lon.min()) * share**0.5
    h = (lat.max() - lat.min()) * share**0.5
    picks = rng.choice(len(lon), size=n, replace=False)
    return [(float(lon[i] - w / 2), float(lat[i] - h / 2), float(lon[i] + w / 2), float(lat[i] + h / 2)) for i in picks]


def read_per_window(table, boxes: list[tuple], snapshot_id: int | None = None) -> dict:
    stats = [query(table, Predicate.from_bbox(b), snapshot_id=snapshot_id).stats for b in boxes]
    paris = query(table, Predicate.from_bbox(PARIS), snapshot_id=snapshot_id).stats
    return {
        "files_total": stats[0].files_total,
        "files_read_per_window": round(statistics.fmean(s.files_scanned for s in stats), 3),
        "row_groups_read_per_window": round(statistics.fmean(s.row_groups_scanned for s in stats), 3),
        "rows_read_per_window": round(statistics.fmean(s.rows_read for s in stats), 1),
        "paris_files_read": paris.files_scanned,
        "paris_row_groups_read": paris.row_groups_scanned,
        "rows_matched_total": sum(s.rows_matched for s in stats),
    }


def part_pruning(args, tmp: Path) -> dict:
    props = {"type": "sql", "uri": f"sqlite:///{tmp / 'pruning.db'}", "warehouse": f"file://{tmp / 'pruning'}"}
    catalog = open_catalog("bench", props)
    lon, lat = city_points(args.events, seed=11, jitter_deg=0.05, bounds=(-180, -90, 180, 90))
    tables = {}
    # Files of 4 MiB in row groups of 16,384 rows (the layout default), so that one batch of the
    # whole set writes a few files and a 40k-event batch writes small ones, as at the default 64 MiB
    # with a larger set.
    # The table records its contract (compaction reads the target size there): change the source.
    clustering = {**CONTRACT.source["clustering"], "target_file_bytes": 4 * 1024 * 1024, "row_group_rows": 16_384}
    # One batch as one sorted run (what the "batch" clustering writes); small batches from 2 tasks.
    for name, batches, tasks in (("one_batch", 1, 1), ("small_batches", args.events // args.batch_events, 2)):
        contract = parse_contract({**CONTRACT.source, "table": f"bench.{name}", "clustering": clustering})
        table, _ = create_table(catalog, contract)
        writer = BatchWriter(table, contract, writer_id=name, tasks=tasks)
        for batch_id, part in enumerate(np.array_split(np.arange(args.events), batches)):
            writer.commit(batch_id, lon[part], lat[part])
        tables[name] = table
        print(f"  {name}: {batches} batches written", flush=True)
    boxes = windows(lon, lat, 100, 0.001, seed=5)
    small = tables["small_batches"]
    small.refresh()
    before_snapshot = small.current_snapshot().snapshot_id
    one = read_per_window(tables["one_batch"], boxes)
    before = read_per_window(small, boxes)
    report = maintain(
        small, MaintenancePolicy(min_file_age_s=0, snapshot_max_age_s=3600, orphan_min_age_s=3600), steps=("compact",)
    )
    after = read_per_window(small, boxes)
    before_again = read_per_window(small, boxes, snapshot_id=before_snapshot)  # time travel still works
    assert before_again == before, (before_again, before)
    assert after["rows_matched_total"] == before["rows_matched_total"] == one["rows_matched_total"]
    DOCS.mkdir(exist_ok=True)
    plot_file_extents(
        file_extents(small, snapshot_id=before_snapshot),
        DOCS / "maintenance-before.png",
        title=f"{args.events // args.batch_events} batches of {args.batch_events:,} events, before compaction",
    )
    plot_file_extents(
        file_extents(small),
        DOCS / "maintenance-after.png",
        title="the same table after `geoingest table maintain --compact`",
    )
    plot_file_extents(
        file_extents(tables["one_batch"]),
        DOCS / "maintenance-one-batch.png",
        title=f"the same {args.events:,} events written as one batch",
    )
    result = {
        "events": args.events,
        "batch_events": args.batch_events,
        "windows": len(boxes),
        "window_share": 0.001,
        "one_batch": one,
        "small_batches_before": before,
        "small_batches_after": after,
        "compaction": report.compaction.__dict__,
        "files_ratio_after_vs_one_batch": round(after["files_read_per_window"] / one["files_read_per_window"], 3),
        "row_groups_ratio_after_vs_one_batch": round(
            after["row_groups_read_per_window"] / one["row_groups_read_per_window"], 3
        ),
        "files_ratio_before_vs_one_batch": round(before["files_read_per_window"] / one["files_read_per_window"], 3),
        "row_groups_ratio_before_vs_one_batch": round(
            before["row_groups_read_per_window"] / one["row_groups_read_per_window"], 3
        ),
    }
    print(json.dumps({k: v for k, v in result.items() if "ratio" in k}), flush=True)
    return result


# -- part 3 ---------------------------------------------------------------------------------------
def part_sort(rows: int = 2_000_000, repeats: int = 5) -> dict:
    """Merge or re-sort: compaction's sort over the concatenated keys of k already sorted files,
    numpy's stable sort (a merge sort that finds sorted runs: the k-way merge) against quicksort,
    alternating, medians; and both on the same keys in random order, for scale."""
    rng = np.random.default_rng(3)
    out = {}
    for files in (2, 50, 500):
        runs = np.concatenate([np.sort(rng.integers(0, 2**32, rows // files)) for _ in range(files)])
        shuffled = rng.permutation(runs)
        times: dict[str, list[float]] = {}
        for _ in range(repeats):
            for data, keys in (("sorted_runs", runs), ("random", shuffled)):
                for kind in ("stable", "quicksort"):
                    started = time.perf_counter()
                    np.argsort(keys, kind=kind)
                    times.setdefault(f"{data}_{kind}_ms", []).append((time.perf_counter() - started) * 1000)
        out[str(files)] = {k: round(statistics.median(v), 1) for k, v in times.items()}
    print(json.dumps(out), flush=True)
    return {"rows": rows, "files": out}


# -- report ---------------------------------------------------------------------------------------
def plot(latency: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    metrics = (
        ("commit_ms", "commit latency (ms, mean per sample)"),
        ("plan_ms", "bbox scan planning (ms)"),
        ("metadata_bytes", "metadata.json (KB)"),
    )
    styles = {"sqlite": "tab:blue", "postgresql": "tab:orange"}
    for ax, (key, title) in zip(axes, metrics):
        for catalog, runs in latency.items():
            for run, dash in (("with_maintenance", "-"), ("without_maintenance", "--")):
                samples = runs[run]["samples"]
                x = [s["commits"] for s in samples]
                y = [s[key] / (1024 if key == "metadata_bytes" else 1) for s in samples]
                ax.plot(
                    x,
                    y,
                    dash,
                    color=styles.get(catalog, "k"),
                    linewidth=1.1,
                    label=f"{catalog}, {run.replace('_', ' ')}",
                )
        ax.set_title(title)
        ax.set_xlabel("commits")
        ax.set_yscale("log")
        ax.grid(True, linewidth=0.3, alpha=0.5)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        "One small commit after another: with maintenance every "
        f"{next(iter(latency.values()))['with_maintenance']['maintain_every']} commits, and without"
    )
    fig.savefig(path, dpi=130)


def markdown(results: dict) -> str:
    lines = ["# Table maintenance", ""]
    if "latency" in results:
        lines += [
            "## After N commits against the first 100, side by side",
            "",
            "The aged table's next 100 commits alternate with the first 100 of a new table on the "
            "same catalog, and a bbox scan is planned on each every 10 commits, so that both are "
            "measured under the same load of the shared machine.",
            "",
            "| catalog | run | commits before | commit ms p50, aged / new | ratio | plan ms p50, aged / new | ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        for catalog, runs in results["latency"].items():
            for run in ("with_maintenance", "without_maintenance"):
                q = runs[run]["paired"]
                lines.append(
                    f"| {catalog} | {run.replace('_', ' ')} | {q['aged_commits']:,} | "
                    f"{q['aged_commit_p50_ms']} / {q['new_commit_p50_ms']} | {q['commit_p50_ratio']}x | "
                    f"{q['aged_plan_p50_ms']} / {q['new_plan_p50_ms']} | {q['plan_p50_ratio']}x |"
                )
        lines += [
            "",
            "## Commit latency, planning and metadata size against commits (one long run)",
            "",
            "| catalog | run | commits | commit ms, first 100 (mean / median) | last 100 | ratio (mean / median) | "
            "plan ms, first 100 | last 100 | ratio | max metadata.json KB | snapshots at end |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for catalog, runs in results["latency"].items():
            for run in ("with_maintenance", "without_maintenance"):
                r = runs[run]
                lines.append(
                    f"| {catalog} | {run.replace('_', ' ')} | {r['commits']:,} | "
                    f"{r['first_100_commit_ms']} / {r['first_100_commit_p50_ms']} | "
                    f"{r['last_100_commit_ms']} / {r['last_100_commit_p50_ms']} | "
                    f"{r['last_100_commit_ms'] / r['first_100_commit_ms']:.2f}x / "
                    f"{r['last_100_commit_p50_ms'] / r['first_100_commit_p50_ms']:.2f}x | "
                    f"{r['first_100_plan_ms']} | {r['last_100_plan_ms']} | "
                    f"{r['last_100_plan_ms'] / r['first_100_plan_ms']:.2f}x | "
                    f"{r['max_metadata_bytes'] / 1024:.0f} | {r['samples'][-1]['snapshots']} |"
                )
        lines += ["", "![commit latency, planning, metadata size](maintenance.png)", ""]
    if "pruning" in results:
        p = results["pruning"]
        lines += [
            "## Pruning after compaction",
            "",
            f"{p['events']:,} city points; {p['windows']} windows of 0.1 % of the data extent, and Paris.",
            "",
            "| table | files | files read per window | row groups read per window | rows read per window | "
            "Paris files | Paris row groups |",
            "|---|---|---|---|---|---|---|",
        ]
        for key, label in (
            ("one_batch", "one batch"),
            ("small_batches_before", f"batches of {p['batch_events']:,}, before compaction"),
            ("small_batches_after", f"batches of {p['batch_events']:,}, after compaction"),
        ):
            r = p[key]
            lines.append(
                f"| {label} | {r['files_total']} | {r['files_read_per_window']} | "
                f"{r['row_groups_read_per_window']} | {r['rows_read_per_window']:,} | "
                f"{r['paris_files_read']} | {r['paris_row_groups_read']} |"
            )
        lines += [
            "",
            f"After compaction against one batch: {p['files_ratio_after_vs_one_batch']}x the files, "
            f"{p['row_groups_ratio_after_vs_one_batch']}x the row groups per window "
            f"(before: {p['files_ratio_before_vs_one_batch']}x, "
            f"{p['row_groups_ratio_before_vs_one_batch']}x).",
            "",
        ]
    if "sort" in results:
        lines += [
            "## Merge or re-sort",
            "",
            f"argsort of {results['sort']['rows']:,} Hilbert keys made of k sorted files, ms (median):",
            "",
            "| files | sorted runs, stable (merge) | sorted runs, quicksort | random, stable | random, quicksort |",
            "|---|---|---|---|---|",
        ]
        for files, t in results["sort"]["files"].items():
            lines.append(
                f"| {files} | {t['sorted_runs_stable_ms']} | {t['sorted_runs_quicksort_ms']} | "
                f"{t['random_stable_ms']} | {t['random_quicksort_ms']} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["latency", "pruning", "sort", "all"], default="all")
    parser.add_argument("--catalogs", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--commits", type=int, default=10_000)
    parser.add_argument("--baseline-commits", type=int, default=1_000)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--sample-every", type=int, default=50)
    parser.add_argument("--maintain-every", type=int, default=100)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch-events", type=int, default=40_000)
    args = parser.parse_args()

    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "maintenance.json"
    latency = pruning = sort = None
    with tempfile.TemporaryDirectory(prefix="geoingest-maintenance-") as tmp:
        if args.part in ("latency", "all"):
            latency = part_latency(args, Path(tmp))
        if args.part in ("pruning", "all"):
            pruning = part_pruning(args, Path(tmp))
        if args.part in ("sort", "all"):
            sort = part_sort()
    # Read at the end: the catalogs may be measured by separate runs, each keeping the others' figures.
    results = json.loads(path.read_text()) if path.exists() else {}
    if latency is not None:
        results["latency"] = {**results.get("latency", {}), **latency}
        results["latency_settings"] = {
            k: getattr(args, k) for k in ("commits", "baseline_commits", "rows", "sample_every", "maintain_every")
        }
        results["policy"] = BENCH_POLICY.__dict__
        plot(results["latency"], RESULTS / "maintenance.png")
    if pruning is not None:
        results["pruning"] = pruning
    if sort is not None:
        results["sort"] = sort
    path.write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "maintenance.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()

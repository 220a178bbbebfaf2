"""Upsert against append on the same stream: ingest rate, delete files, query cost, correctness.

One broker, one Spark session (local[2]). The stream: --events GeoJSON point events over --keys keys,
every key created once, then versions that move features anywhere on the map, 10 % of them
tombstones (tests/streaming/write/test_upsert.py's generator). The same topic is ingested into an append
table and into an upsert table (contract `mode: upsert`), --repeats times each, alternating, with
clustering "batch" at --batch-size events per batch, trigger as `until_idle` drains it; the faster
run of each is kept. A warm-up table first, so the JVM and the Python workers are warm.

For the upsert table: the equality delete files (count, keys, bytes), what copy-on-write would have
rewritten on the same stream (the files live before each batch that hold a key it touches), the state checked against the
state computed from the produced records (one row per live key, its last version), and the cost of a
window query (the query's own planning and reading, median of 5 over --windows windows of 0.1 % of
the world) before and after compaction (`maintain`, ages 0), against the append table's.

Writes bench/results/upsert.json and upsert.md (--results names them).

    .venv/bin/python bench/upsert.py [--events 1000000] [--keys 50000] [--batch-size 100000] [--partitions 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from app.local.broker import LocalBroker, free_port  # noqa: E402
from app.service import configure_logging, run, start_spark  # noqa: E402
from app.settings import load_settings  # noqa: E402
from streaming.contract import parse_contract  # noqa: E402
from streaming.maintenance.maintain import maintain  # noqa: E402
from streaming.maintenance.plan import MaintenancePolicy  # noqa: E402
from streaming.read.predicate import Predicate  # noqa: E402
from streaming.read.query import query  # noqa: E402
from streaming.table.catalog import create_table, open_catalog  # noqa: E402
from streaming.table.deletes import has_delete_files, snapshot_files  # noqa: E402
from tests.conftest import produce_records  # noqa: E402
from tests.streaming.write.test_upsert import (  # noqa: E402
    every_snapshot_matches,
    expected_state,
    make_stream,
    record_positions,
)

RESULTS = ROOT / "bench" / "results"
DEMO = json.loads((ROOT / "schemas" / "demo_events.json").read_text())
COMPACT_ALL = MaintenancePolicy(min_file_age_s=0, snapshot_max_age_s=0, keep_snapshots=1, orphan_min_age_s=0)


def windows(n: int, seed: int) -> list[tuple[float, float, float, float]]:
    rng = np.random.default_rng(seed)
    side_x, side_y = 360 * 0.0316, 160 * 0.0316  # 0.1 % of the area the points cover
    out = []
    for _ in range(n):
        x, y = rng.uniform(-179, 179 - side_x), rng.uniform(-80, 80 - side_y)
        out.append((float(x), float(y), float(x + side_x), float(y + side_y)))
    return out


def query_cost(table, boxes) -> dict:
    times, files = [], []
    for box in boxes:
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            result = query(table, Predicate.from_bbox(box))
            runs.append((time.perf_counter() - started) * 1000)
        times.append(statistics.median(runs))
        files.append(result.stats.files_scanned)
    return {
        "query_ms_median": round(statistics.median(times), 2),
        "files_scanned_mean": round(float(np.mean(files)), 2),
    }


def table_state(table) -> dict[str, tuple]:
    import shapely

    result = query(table, Predicate.from_bbox((-180.0, -90.0, 180.0, 90.0))).table
    points = shapely.from_wkb(result.column("geometry").to_numpy(zero_copy_only=False))
    ids = result.column("event_id").to_pylist()
    if len(ids) != len(set(ids)):
        raise AssertionError("an upsert table holds a key twice")
    return {
        k: (round(float(shapely.get_x(p)), 5), round(float(shapely.get_y(p)), 5), s)
        for k, p, s in zip(ids, points, result.column("speed").to_pylist())
    }


def delete_facts(table) -> dict:
    snapshot = table.current_snapshot()
    if not has_delete_files(table, snapshot):
        return {"delete_files": 0, "deleted_keys": 0, "delete_bytes": 0}
    deletes = snapshot_files(table, snapshot).equality_deletes
    return {
        "delete_files": len(deletes),
        "deleted_keys": sum(p.file.record_count for p in deletes),
        "delete_bytes": sum(p.file.file_size_in_bytes for p in deletes),
    }


def copy_on_write_cost(table) -> dict:
    """What copy-on-write would have rewritten on the same stream: per batch of the upsert table,
    the data files live before it that hold a key the batch replaces or deletes (a copy-on-write
    commit rewrites each of them whole), against what merge-on-read wrote (rows and delete files)."""
    import pyarrow.parquet as pq

    keys_of: dict[str, set] = {}
    sizes: dict[str, int] = {}
    live: set[str] = set()
    rewritten_files = rewritten_bytes = written_bytes = batches = 0
    for snapshot in sorted(table.metadata.snapshots, key=lambda s: s.sequence_number):
        added_data, touched = [], set()
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io):
                f = entry.data_file
                written_bytes += f.file_size_in_bytes
                with table.io.new_input(f.file_path).open() as stream:
                    ids = pq.read_table(stream, columns=["event_id"]).column("event_id").to_pylist()
                if f.content.name == "EQUALITY_DELETES":
                    touched.update(ids)
                else:
                    added_data.append(f.file_path)
                    keys_of[f.file_path], sizes[f.file_path] = set(ids), f.file_size_in_bytes
        hit = [path for path in live if not keys_of[path].isdisjoint(touched)]
        rewritten_files += len(hit)
        rewritten_bytes += sum(sizes[p] for p in hit)
        batches += bool(touched)
        live.update(added_data)
    table_bytes = sum(sizes[p] for p in live)
    return {
        "batches": batches,
        "cow_files_rewritten": rewritten_files,
        "cow_bytes_rewritten": rewritten_bytes,
        "mor_bytes_written": written_bytes,
        "cow_over_mor_bytes": round((rewritten_bytes + written_bytes) / max(written_bytes, 1), 2),
        "final_table_bytes": table_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--windows", type=int, default=20)
    # 1: every batch's versions are split over the tasks (a topic with fewer partitions than cores)
    parser.add_argument("--partitions", type=int, default=4, help="the topic's partitions")
    parser.add_argument("--results", default="upsert", help="the results' file name, without extension")
    args = parser.parse_args()
    configure_logging("WARNING")
    records = make_stream(args.keys, args.events, seed=11)
    expected = expected_state(records)
    boxes = windows(args.windows, seed=3)
    report: dict = {"args": vars(args), "runs": {"append": [], "upsert": []}}
    with tempfile.TemporaryDirectory(prefix="geoingest-upsert-") as tmp:
        workdir = Path(tmp)
        cache = Path(load_settings(env={}).cache_dir)
        broker = LocalBroker(workdir / "kafka", cache, port=free_port(), controller_port=free_port())
        broker.start()
        try:
            for topic, stream in (("warmup", records[: args.batch_size]), ("stream", records)):
                broker_topic(broker.bootstrap, topic, args.partitions)
                if produce_records(broker.bootstrap, topic, stream) != len(stream):
                    raise RuntimeError(f"the broker did not take every record of {topic}")
            spark = None
            tables = {}
            for attempt in range(args.repeats):
                for mode in ("append", "upsert"):
                    name = f"bench.{mode}_{attempt}"
                    contract = parse_contract({**DEMO, "table": name, "mode": mode})
                    settings = load_settings(
                        env={},
                        bootstrap_servers=broker.bootstrap,
                        topic="stream",
                        catalog={
                            "type": "sql",
                            "uri": f"sqlite:///{workdir}/catalog.db",
                            "warehouse": f"file://{workdir}/warehouse",
                        },
                        checkpoint_location=str(workdir / f"ck-{mode}-{attempt}"),
                        max_offsets_per_trigger=args.batch_size,
                        metrics_port=0,
                        maintenance_mode="off",
                        spark_master="local[2]",
                        driver_memory="4g",
                    )
                    catalog = open_catalog(settings.catalog_name, settings.catalog)
                    spark = spark or start_spark(settings)
                    if attempt == 0 and mode == "append":
                        warm = parse_contract({**DEMO, "table": "bench.warmup", "mode": "upsert"})
                        create_table(catalog, warm)
                        run(
                            load_settings(
                                env={},
                                **{
                                    **settings.__dict__,
                                    "topic": "warmup",
                                    "checkpoint_location": str(workdir / "ck-warm"),
                                },
                            ),
                            warm,
                            until_idle=True,
                            spark=spark,
                        )
                    table, _ = create_table(catalog, contract)
                    started = time.monotonic()
                    totals = run(settings, contract, until_idle=True, spark=spark)
                    seconds = time.monotonic() - started
                    rate = round(args.events / seconds)
                    report["runs"][mode].append(
                        {"seconds": round(seconds, 2), "events_per_s": rate, "batches": totals.batches}
                    )
                    print(f"  {mode} run {attempt}: {rate:,} events/s in {seconds:.1f} s", flush=True)
                    tables[mode] = catalog.load_table(name)
            append, upsert = tables["append"], tables["upsert"]
            state = table_state(upsert)
            report["upsert_state_matches"] = state == expected
            report["live_keys"] = len(expected)
            report["deletes"] = delete_facts(upsert)
            try:
                checked = every_snapshot_matches(
                    upsert, "stream", records, record_positions(broker.bootstrap, "stream", records)
                )
                report["every_snapshot_matches"] = {"snapshots": checked, "all_match": True}
            except AssertionError as exc:
                report["every_snapshot_matches"] = {"all_match": False, "first_mismatch": str(exc)[:300]}
            report["copy_on_write"] = copy_on_write_cost(upsert)
            report["append_query"] = query_cost(append, boxes)
            report["upsert_query_before"] = query_cost(upsert, boxes)
            compaction = maintain(upsert, COMPACT_ALL, steps=("compact", "expire"))
            upsert.refresh()
            report["compaction_files_rewritten"] = compaction.compaction.files_rewritten if compaction.compaction else 0
            report["upsert_query_after"] = query_cost(upsert, boxes)
            report["upsert_state_matches_after_compaction"] = table_state(upsert) == expected
        finally:
            broker.stop()
    best = {mode: max(r["events_per_s"] for r in runs) for mode, runs in report["runs"].items()}
    report["best_events_per_s"] = best
    report["upsert_over_append"] = round(best["upsert"] / best["append"], 2)
    write_results(report)


def broker_topic(bootstrap: str, name: str, partitions: int = 4) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()


def write_results(report: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{report['args']['results']}.json").write_text(json.dumps(report, indent=2) + "\n")
    a = report["args"]
    d = report["deletes"]
    c = report["copy_on_write"]
    lines = [
        "# Upsert against append",
        "",
        f"{a['events']:,} events over {a['keys']:,} keys (10 % tombstones, updates anywhere on the map), "
        f"batches of {a['batch_size']:,}, a topic of {a.get('partitions', 4)} partitions, Spark local[2], "
        f"clustering batch, best of {a['repeats']}.",
        "",
        "| | append | upsert | upsert / append |",
        "|---|---|---|---|",
        f"| events/s | {report['best_events_per_s']['append']:,} | {report['best_events_per_s']['upsert']:,} "
        f"| {report['upsert_over_append']}x |",
        f"| window query, median ms (files read) | {report['append_query']['query_ms_median']} "
        f"({report['append_query']['files_scanned_mean']}) | before compaction "
        f"{report['upsert_query_before']['query_ms_median']} ({report['upsert_query_before']['files_scanned_mean']}), "
        f"after {report['upsert_query_after']['query_ms_median']} ({report['upsert_query_after']['files_scanned_mean']}) | |",
        "",
        f"Equality delete files: {d['delete_files']}, {d['deleted_keys']:,} keys, {d['delete_bytes']:,} bytes. "
        f"Live keys {report['live_keys']:,}; the upsert table equals the state computed from the records: "
        f"{report['upsert_state_matches']} (after compaction: {report['upsert_state_matches_after_compaction']}). "
        f"Every snapshot against the state the records it covers make: {report['every_snapshot_matches']}.",
        "",
        f"Copy-on-write on the same stream would rewrite, over {c['batches']} batches, {c['cow_files_rewritten']:,} "
        f"data files holding a replaced or deleted key ({c['cow_bytes_rewritten']:,} bytes), on top of the "
        f"{c['mor_bytes_written']:,} bytes merge-on-read wrote (rows and delete files): "
        f"{c['cow_over_mor_bytes']}x the bytes written.",
        "",
    ]
    (RESULTS / f"{report['args']['results']}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

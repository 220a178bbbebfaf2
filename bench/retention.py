"""Retention: the time to drop a day, and what it writes.

A table partitioned by day(event_time) and a cell-like identity column (`kind`, `--cells` values)
holds `--days` days of points, `--files` files per partition of `--rows` rows each, written by the
project's GeoParquetWriter and committed one fast append per day (tests/partitioned_tables.py).
With a retention of `--days - 1` days, the horizon is moved on by one day `--repeat` times, and
each time `maintain(steps=("retention",))` drops the day that fell past it: seconds, files, rows,
and the data bytes it wrote (none: a metadata-only delete). Then expiry frees the dropped files.

Against it, the same rows in an unpartitioned table whose files each span the whole month (as
compaction across batches leaves them), where dropping the oldest day is pyiceberg's row-level
delete (`Table.delete(event_time < horizon)`): every file holds some of that day, so every file is
read and rewritten.

Writes bench/results/retention.json and retention.md. The machine is shared, so absolute times
are indications; the bytes written are exact.

    .venv/bin/python bench/retention.py [--days 31] [--cells 4] [--files 2] [--rows 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the partitioned-table helpers live in tests/

from pyiceberg.expressions import LessThan  # noqa: E402
from pyiceberg.transforms import DayTransform, IdentityTransform  # noqa: E402

from streaming.contract import parse_contract  # noqa: E402
from streaming.maintenance.maintain import maintain  # noqa: E402
from streaming.maintenance.plan import MaintenancePolicy  # noqa: E402
from streaming.table.catalog import create_table, open_catalog  # noqa: E402
from tests.partitioned_tables import DAY_US, append, rows  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CONTRACT = ROOT / "schemas" / "demo_events.json"
DAY0 = 20_000  # 2024-10-04


def data_files(table) -> dict[str, int]:
    table.refresh()
    return {t.file.file_path: int(t.file.file_size_in_bytes) for t in table.scan().plan_files()}


def row_count(table) -> int:
    table.refresh()
    return sum(int(t.file.record_count) for t in table.scan().plan_files())


def build(catalog, partitioned: bool, args) -> tuple:
    # The table's spec is set here, not by the contract's default (day of the event time).
    contract = parse_contract({**json.loads(CONTRACT.read_text()), "partition": []})
    table, _ = create_table(catalog, contract)
    if partitioned:
        with table.update_spec() as spec:
            spec.add_field("event_time", DayTransform(), "event_time_day")
            spec.add_field("kind", IdentityTransform(), "kind")
    cells = [f"c{i}" for i in range(args.cells)]
    started = time.monotonic()
    if partitioned:
        for d in range(args.days):
            day = DAY0 + d
            parts = [
                ((day, cell), rows(contract, day, cell, args.rows, seed=d * 1000 + c * 10 + f, first_id=f * args.rows))
                for c, cell in enumerate(cells)
                for f in range(args.files)
            ]
            append(table, contract, parts)
    else:
        # The same number of rows, each file spanning every day (as files compacted across batches do).
        per_file = args.rows * args.days
        for f in range(args.cells * args.files):
            parts = []
            for d in range(args.days):
                parts.append(rows(contract, DAY0 + d, cells[f % args.cells], args.rows, seed=d * 1000 + f, first_id=f))
            merged = pa.concat_tables(parts)
            assert merged.num_rows == per_file
            append(table, contract, [((), merged)])
    return table, contract, time.monotonic() - started


def bench_retention(catalog, args) -> dict:
    table, _, write_s = build(catalog, True, args)
    before_rows = row_count(table)
    policy = MaintenancePolicy(min_file_age_s=0, retention_s=(args.days - 1) * 86400)
    drops = []
    for step in range(args.repeat):
        # The horizon at 00:00 of day `step + 1`: day `step` is wholly past.
        now_ms = (DAY0 + args.days + step) * DAY_US // 1000
        files_before = data_files(table)
        started = time.monotonic()
        report = maintain(table, policy, steps=("retention",), now_ms=now_ms)
        seconds = time.monotonic() - started
        files_after = data_files(table)
        r = report.retention
        assert r is not None and r.partitions_dropped == args.cells
        added = set(files_after) - set(files_before)
        drops.append(
            {
                "seconds": round(seconds, 3),
                "step_seconds": round(r.seconds, 3),
                "partitions_dropped": r.partitions_dropped,
                "files_dropped": r.files_dropped,
                "rows_dropped": r.rows_dropped,
                "bytes_dropped": r.bytes_dropped,
                "data_files_written": len(added),
                "data_bytes_written": sum(files_after[p] for p in added),
            }
        )
        print(f"  retention drop {step + 1}: {json.dumps(drops[-1])}", flush=True)
    # Expiry frees the dropped days' files once no kept snapshot holds them.
    paths = {p.removeprefix("file://") for p in data_files(table)}
    started = time.monotonic()
    expiry = maintain(
        table, MaintenancePolicy(min_file_age_s=0, keep_snapshots=1, max_snapshots=1), steps=("expire",)
    ).expiry
    expire_s = time.monotonic() - started
    assert expiry is not None
    assert all(Path(p).exists() for p in paths), "expiry deletes none of the kept files"
    return {
        "write_seconds": round(write_s, 1),
        "rows_before": before_rows,
        "files_before": args.days * args.cells * args.files,
        "drops": drops,
        "drop_seconds_median": round(statistics.median(d["seconds"] for d in drops), 3),
        "expire": {
            "seconds": round(expire_s, 3),
            "files_deleted": expiry.files_deleted,
            "bytes_deleted": expiry.bytes_deleted,
        },
    }


def bench_row_delete(catalog, args) -> dict:
    table, _, write_s = build(catalog, False, args)
    horizon = dt.datetime.fromtimestamp((DAY0 + 1) * 86400, dt.UTC)
    files_before = data_files(table)
    rows_before = row_count(table)
    started = time.monotonic()
    table.delete(LessThan("event_time", horizon.isoformat()))
    seconds = time.monotonic() - started
    files_after = data_files(table)
    added = set(files_after) - set(files_before)
    out = {
        "write_seconds": round(write_s, 1),
        "seconds": round(seconds, 3),
        "rows_dropped": rows_before - row_count(table),
        "files_read_and_replaced": len(set(files_before) - set(files_after)),
        "data_files_written": len(added),
        "data_bytes_written": sum(files_after[p] for p in added),
    }
    print(f"  row-level delete of a day, unpartitioned: {json.dumps(out)}", flush=True)
    return out


def markdown(results: dict) -> str:
    s = results["settings"]
    r, d = results["retention"], results["row_delete"]
    lines = [
        "# Retention: dropping a day",
        "",
        f"{s['days']} days x {s['cells']} cells x {s['files']} files of {s['rows']:,} points "
        f"({r['rows_before']:,} rows, {r['files_before']} files), SQLite catalog, local files; "
        f"{results['machine']}.",
        "",
        "| how a day leaves the table | seconds | rows dropped | data files written | data bytes written |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for i, drop in enumerate(r["drops"], start=1):
        lines.append(
            f"| retention, day {i} (partitioned by day and cell: {drop['files_dropped']} files, metadata only) "
            f"| {drop['seconds']} | {drop['rows_dropped']:,} | {drop['data_files_written']} "
            f"| {drop['data_bytes_written']:,} |"
        )
    lines.append(
        f"| row-level delete (`Table.delete`), unpartitioned files spanning the month "
        f"| {d['seconds']} | {d['rows_dropped']:,} | {d['data_files_written']} | {d['data_bytes_written']:,} |"
    )
    lines += [
        "",
        f"Median time of a retention drop: {r['drop_seconds_median']} s. Expiry afterwards freed "
        f"{r['expire']['files_deleted']} files ({r['expire']['bytes_deleted']:,} bytes, manifests included) "
        f"in {r['expire']['seconds']} s.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=31)
    parser.add_argument("--cells", type=int, default=4)
    parser.add_argument("--files", type=int, default=2, help="files per partition")
    parser.add_argument("--rows", type=int, default=2000, help="rows per file")
    parser.add_argument("--repeat", type=int, default=3, help="days dropped one after the other")
    args = parser.parse_args()

    def catalog(folder: str):
        return open_catalog(
            "bench", {"type": "sql", "uri": f"sqlite:///{folder}/catalog.db", "warehouse": f"file://{folder}/warehouse"}
        )

    with tempfile.TemporaryDirectory() as days, tempfile.TemporaryDirectory() as plain:
        print("retention on a table partitioned by day and cell", flush=True)
        retention = bench_retention(catalog(days), args)
        print("row-level delete on an unpartitioned table", flush=True)
        row_delete = bench_row_delete(catalog(plain), args)
    results = {
        "settings": vars(args),
        "machine": f"{os.cpu_count()} cores, shared",
        "retention": retention,
        "row_delete": row_delete,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "retention.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "retention.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()

"""The `geoingest` command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

from app.errors import EXIT_FAILURE, EXIT_INTERRUPTED, one_line
from app.logs import configure_logging
from app.maven import configure_iceberg_java
from app.settings import Settings, SettingsError, load_settings


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    # A caller's own Spark (main() called in-process, as the tests do) is the caller's to stop.
    spark_was_running = _spark_running()
    try:
        settings = load_settings(args.config)
        configure_iceberg_java(Path(settings.cache_dir))
        status = args.handler(args, settings) or 0
        _stop_spark(spark_was_running)
        return status
    except KeyboardInterrupt:
        _stop_spark(spark_was_running)
        print("geoingest: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - every failure ends in one line naming its cause
        if not isinstance(exc, _NAMED_INPUT_ERRORS) and not _lease_held(exc):
            # The traceback goes to the log (JSON lines on stderr); the last line says what failed.
            if not logging.getLogger("geoingest").handlers:
                configure_logging()
            logging.getLogger("geoingest.cli").error("failed", exc_info=True)
        _stop_spark(spark_was_running)
        print(f"geoingest: {one_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE


def _spark_running() -> bool:
    if "pyspark" not in sys.modules:
        return False
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def _stop_spark(was_running: bool) -> None:
    """The JVM of a command that started Spark stops before the last line, so that its shutdown
    logging cannot come after that line."""
    if not was_running and _spark_running():
        from app.spark import stop_spark

        stop_spark()


# Errors that name their input (a setting, an argument, a table) are the message; a traceback in
# the log would only bury it.
_NAMED_INPUT_ERRORS = (SettingsError, ValueError, LookupError, NoSuchTableError, NoSuchNamespaceError)


def _lease_held(exc: BaseException) -> bool:
    """Another maintainer holds the table's lease: the message names it and its expiry."""
    lease = sys.modules.get("streaming.maintenance.lease")
    return lease is not None and isinstance(exc, lease.LeaseHeld)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="geoingest", description=__doc__)
    parser.add_argument("--config", help="settings file (TOML); also GEOINGEST_CONFIG")
    commands = parser.add_subparsers(dest="command", required=True)

    broker = commands.add_parser("broker", help="a local single-node Kafka broker for dev work")
    broker.add_argument("action", choices=["start", "stop", "status"])
    broker.add_argument("--home", default=".demo/broker", help="the broker's state folder")
    broker.add_argument("--port", type=int, help="listener port (default: the port of bootstrap_servers)")
    broker.set_defaults(handler=_broker)

    table = commands.add_parser("table", help="create, describe, evolve, copy or maintain a table")
    table.add_argument("action", choices=["create", "describe", "evolve", "copy", "orphans", "maintain"])
    table.add_argument(
        "--contract", help="table contract (JSON); evolve: the new contract of its table; copy: the new table's"
    )
    table.add_argument("--table", help="table name, for describe, orphans and maintain; copy: the table copied")
    table.add_argument(
        "--delete",
        action="store_true",
        help="orphans: delete them too, holding the table's maintenance lease (refused below the table's commit window)",
    )
    table.add_argument(
        "--min-age-minutes",
        type=float,
        default=60.0,
        help="orphans: only files at least this old (younger ones may be committing)",
    )
    table.add_argument(
        "--retention",
        action="store_true",
        help="maintain: drop the time partitions older than the retention (setting or contract), metadata only",
    )
    table.add_argument(
        "--compact",
        action="store_true",
        help="maintain: rewrite small files along the Hilbert curve within each partition, merge manifests",
    )
    table.add_argument("--expire", action="store_true", help="maintain: expire old snapshots and their files")
    table.add_argument("--orphans", action="store_true", help="maintain: delete files nothing references")
    table.add_argument(
        "--dry-run", action="store_true", help="maintain, evolve: say what would be done, change nothing"
    )
    table.add_argument(
        "--every",
        type=float,
        metavar="SECONDS",
        help="maintain: run again every SECONDS until stopped (metrics on metrics_port)",
    )
    table.set_defaults(handler=_table)

    run = commands.add_parser("run", help="run the ingest service")
    run.add_argument("--contract", help="table contract (JSON)")
    run.add_argument(
        "--routes",
        action="store_true",
        help="the tables the settings' routes name, not one contract's (docs/routing.md)",
    )
    run.add_argument("--until-idle", action="store_true", help="drain what the topic holds, then exit")
    run.add_argument(
        "--resume-from-table",
        action="store_true",
        help="with a lost checkpoint, start after the Kafka offsets recorded in the table",
    )
    run.add_argument(
        "--create-table",
        action="store_true",
        help="create the contract's table first if it is missing (as `table create` does); the image's default",
    )
    run.set_defaults(handler=_run)

    status = commands.add_parser(
        "status", help="the service's tables: each one's topic, last commit and lag (JSON lines)"
    )
    status.add_argument("--contract", help="table contract (JSON); without it, the tables the settings' routes name")
    status.set_defaults(handler=_status)

    query = commands.add_parser("query", help="features that intersect, lie within or contain a geometry")
    query.add_argument("--table", required=True)
    predicate = query.add_mutually_exclusive_group(required=True)
    predicate.add_argument("--bbox", help="xmin,ymin,xmax,ymax in the table CRS: features that intersect it")
    predicate.add_argument("--intersects", metavar="WKT", help="features that intersect the geometry")
    predicate.add_argument("--within", metavar="WKT", help="features that lie within the geometry")
    predicate.add_argument("--contains", metavar="WKT", help="features that contain the geometry")
    when = query.add_mutually_exclusive_group()
    when.add_argument("--snapshot", type=int, metavar="ID", help="read this snapshot")
    when.add_argument(
        "--as-of",
        metavar="TIMESTAMP",
        help="read the snapshot current then: ISO 8601 (no zone: UTC) or epoch milliseconds",
    )
    query.add_argument(
        "--from",
        dest="time_from",
        metavar="TIMESTAMP",
        help="only events at or after this time (event-time column): ISO 8601 (no zone: UTC) or epoch ms",
    )
    query.add_argument(
        "--to", dest="time_to", metavar="TIMESTAMP", help="only events before this time (ISO 8601 or epoch ms)"
    )
    query.add_argument("--limit", type=int)
    query.add_argument(
        "--format",
        choices=["geojson", "count", "geoparquet", "sql"],
        default="geojson",
        help="GeoJSON lines, a count, a GeoParquet 1.1 file (needs --output), or the SQL WHERE condition "
        "that lets Spark SQL, DuckDB or Trino prune the same query by partition and bounds (nothing is read)",
    )
    query.add_argument("--output", metavar="FILE", help="write there instead of stdout")
    query.set_defaults(handler=_query)

    inspect = commands.add_parser("inspect", help="data file extents of a snapshot, optionally drawn")
    inspect.add_argument("--table", required=True)
    inspect_when = inspect.add_mutually_exclusive_group()
    inspect_when.add_argument("--snapshot", type=int, metavar="ID", help="this snapshot, not the current one")
    inspect_when.add_argument("--as-of", metavar="TIMESTAMP", help="the snapshot current then")
    inspect.add_argument("--plot", metavar="PNG", help="draw the file extents into this PNG file")
    inspect.add_argument("--files", action="store_true", help="list every file's extent in the summary")
    inspect.add_argument(
        "--footprints", action="store_true", help="with --plot, draw each raster's footprint too (tables of rasters)"
    )
    inspect.set_defaults(handler=_inspect)

    demo = commands.add_parser("demo", help="broker, table, 200k sample events, ingest, summary")
    demo.add_argument("--events", type=int, default=200_000)
    demo.add_argument("--home", help="the demo's folder (wiped first; default .demo or .demo-lakehouse)")
    demo.add_argument(
        "--lakehouse",
        action="store_true",
        help="on an S3-compatible store, a REST catalog, a Spark cluster and a SASL_SSL broker",
    )
    demo.set_defaults(handler=_demo)
    return parser


def _broker(args, settings: Settings) -> int:
    from app.local.broker import LocalBroker

    port = args.port or int(settings.bootstrap_servers.rsplit(":", 1)[1])
    broker = LocalBroker(Path(args.home), Path(settings.cache_dir), port=port)
    if args.action == "start":
        broker.ensure_jars(progress=lambda msg: print(msg, file=sys.stderr))
        status = broker.start()
    elif args.action == "stop":
        broker.stop()
        status = broker.status()
    else:
        status = broker.status()
    print(json.dumps({"running": status.running, "pid": status.pid, "bootstrap": status.bootstrap}))
    return 0 if status.running or args.action == "stop" else 1


def _table(args, settings: Settings) -> int:
    from streaming.contract import load_contract
    from streaming.table.catalog import create_table, describe, open_catalog

    catalog = open_catalog(settings.catalog_name, settings.catalog)
    if args.action == "create":
        if not args.contract:
            raise ValueError("table create needs --contract")
        table, created = create_table(catalog, load_contract(args.contract))
        print(json.dumps({"table": ".".join(table.name()), "created": created, "location": table.location()}))
        return 0
    if args.action == "evolve":
        return _evolve(args, catalog)
    if args.action == "copy":
        return _copy(args, catalog)
    name = args.table or (load_contract(args.contract).table if args.contract else None)
    if not name:
        raise ValueError(f"table {args.action} needs --table or --contract")
    if args.action == "maintain":
        return _maintain(args, settings, name)
    table = catalog.load_table(name)
    if args.action == "orphans":
        orphans = _orphans(args, settings, table)
        for orphan in orphans:
            print(
                json.dumps(
                    {"path": orphan.path, "bytes": orphan.size, "age_s": round(orphan.age_s), "deleted": args.delete}
                )
            )
        return 0
    print(json.dumps(describe(table), indent=2))
    return 0


def _copy(args, catalog) -> int:
    """The live rows of --table into a new table made from --contract (a native-geometry one, say)."""
    from streaming.contract import load_contract
    from streaming.maintenance.copy import copy_table
    from streaming.table.catalog import create_table

    if not (args.table and args.contract):
        raise ValueError("table copy needs --table (the table copied) and --contract (the new table's)")
    contract = load_contract(args.contract)
    if contract.table == args.table:
        raise ValueError(f"table copy: --contract names {contract.table}, the table copied; it makes a new table")
    source = catalog.load_table(args.table)
    target, _ = create_table(catalog, contract)
    print(json.dumps(copy_table(source, target, contract).to_json()))
    return 0


def _orphans(args, settings: Settings, table) -> list:
    """The table's orphans; with --delete, deleted under the table's maintenance lease (one maintainer
    at a time, and none whose compaction is in flight) and only at an age the table's commits allow."""
    from streaming.maintenance.lease import MaintenanceLease
    from streaming.maintenance.orphans import check_orphan_age, delete_files, find_orphans

    min_age_s = args.min_age_minutes * 60
    if not args.delete:
        return find_orphans(table, min_age_s=min_age_s)
    check_orphan_age(table, min_age_s, f"--min-age-minutes {args.min_age_minutes:g}")
    lease = MaintenanceLease(table, settings.maintenance_lease_s)
    try:
        # No snapshot, no lease: nothing to compact either, only ingest's files, which the age keeps.
        leased = lease.acquire()
        with lease.keep_alive():
            orphans = find_orphans(table, min_age_s=min_age_s)
            if leased:
                lease.confirm()
            delete_files(table, [o.path for o in orphans])
    finally:
        lease.release()
    return orphans


def _evolve(args, catalog) -> int:
    """The table the new contract names, changed to it (or, with --dry-run, the changes it would take)."""
    from streaming.contract import load_contract
    from streaming.table.evolve import apply_evolution, plan_evolution

    if not args.contract:
        raise ValueError("table evolve needs --contract (the table's new contract)")
    contract = load_contract(args.contract)
    table = catalog.load_table(contract.table)
    changes = plan_evolution(table, contract) if args.dry_run else apply_evolution(table, contract)
    print(
        json.dumps(
            {
                "table": contract.table,
                "dry_run": args.dry_run,
                "schema_id": table.metadata.current_schema_id,
                "changes": [change.to_json() for change in changes],
            }
        )
    )
    return 0


def _maintain(args, settings: Settings, name: str) -> int:
    from prometheus_client import CollectorRegistry

    from app.logs import configure_logging
    from app.maintenance import MaintenanceRunner
    from app.metrics import Health, MaintenanceMetrics, serve
    from streaming.maintenance.plan import STEPS

    configure_logging()
    steps = tuple(s for s in STEPS if getattr(args, s)) or None  # none named: the maintenance_steps setting
    if args.every is None:
        runner = MaintenanceRunner(settings, name, raise_errors=True)
        with _ProgressBars() as bars:
            report = runner.run_once(steps, dry_run=args.dry_run, progress=bars)
        assert report is not None, "raise_errors: a failed run raises"
        print(json.dumps(report.to_json()))
        return 0
    if args.every <= 0:
        raise ValueError(f"--every {args.every:g}: must be a positive number of seconds")
    registry = CollectorRegistry()
    runner = MaintenanceRunner(settings, name, MaintenanceMetrics(registry, name))
    server = (
        serve(registry, Health(max_silence_s=float("inf"), query_active=True), settings.metrics_port)
        if settings.metrics_port
        else None
    )
    try:
        while True:
            report = runner.run_once(steps, dry_run=args.dry_run)
            if report is not None:
                print(json.dumps(report.to_json()), flush=True)
            time.sleep(args.every)
    except KeyboardInterrupt:
        return 0
    finally:
        if server is not None:
            server.shutdown()


class _ProgressBars:
    """One tqdm bar per maintenance step on stderr (none when stderr is not a terminal)."""

    def __enter__(self):
        self.bars = {}
        return self

    def __call__(self, step: str, advance: int, total: int, unit: str) -> None:
        from tqdm import tqdm

        bar = self.bars.get(step)
        if bar is None:
            bar = self.bars[step] = tqdm(
                total=total, desc=step, unit=unit, unit_scale=unit == "B", file=sys.stderr, disable=None, leave=True
            )
        bar.update(advance)

    def __exit__(self, *exc) -> None:
        for bar in self.bars.values():
            bar.close()


def _run(args, settings: Settings) -> int:
    from app.service import configure_logging, run
    from streaming.contract import load_contract

    configure_logging()
    if args.routes or not args.contract:
        return _run_routes(args, settings)
    if settings.routes:
        raise ValueError("run: the settings have routes; run them with --routes, or drop them to run --contract")
    if args.create_table:
        from streaming.table.catalog import create_table, open_catalog

        table, created = create_table(
            open_catalog(settings.catalog_name, settings.catalog), load_contract(args.contract)
        )
        print(json.dumps({"table": ".".join(table.name()), "created": created, "location": table.location()}))
    totals = run(
        settings, load_contract(args.contract), until_idle=args.until_idle, resume_from_table=args.resume_from_table
    )
    _print_totals(totals)
    return 0


def _run_routes(args, settings: Settings) -> int:
    """The settings' routes, each routed table created from its route's contract when missing."""
    from app.routing import run_routes

    if args.contract:
        raise ValueError("run: --contract names one table and --routes the settings' routes; give one of them")
    if not settings.routes:
        raise ValueError("run needs --contract, or --routes with routes in the settings (docs/routing.md)")
    if args.resume_from_table:
        raise ValueError("run: --resume-from-table reads one table's offsets; run each routed table with --contract")
    _print_totals(run_routes(settings, until_idle=args.until_idle))
    return 0


def _print_totals(totals) -> None:
    print(
        json.dumps(
            {
                "batches": totals.batches,
                "consumed": totals.consumed,
                "committed_rows": totals.committed_rows,
                "rejected": totals.rejected,
                "files": totals.files,
                "commits": totals.commits,
            }
        )
    )


def _status(args, settings: Settings) -> int:
    """One JSON line per table: its topic, whether it exists, its last commit and its lag."""
    from app.routing import routed_tables, table_status
    from streaming.contract import load_contract

    if args.contract:
        tables = [(settings.topic, load_contract(args.contract).table)]
    elif settings.routes:
        tables = routed_tables(settings)
    else:
        raise ValueError("status needs --contract, or routes in the settings (docs/routing.md)")
    for row in table_status(settings, tables):
        print(json.dumps(row))
    return 0


def _query(args, settings: Settings) -> int:
    from streaming.read.output import feature_id_column, to_geojson_lines, write_geoparquet
    from streaming.read.predicate import PREDICATES, Predicate, parse_bbox
    from streaming.read.query import query, table_contract
    from streaming.table.catalog import open_catalog

    if args.bbox is not None:
        predicate = Predicate.from_bbox(parse_bbox(args.bbox))
    else:
        kind = next(k for k in PREDICATES if getattr(args, k) is not None)
        predicate = Predicate.from_wkt(kind, getattr(args, kind))
    if args.format == "geoparquet" and not args.output:
        raise ValueError("query --format geoparquet needs --output FILE")
    table = open_catalog(settings.catalog_name, settings.catalog).load_table(args.table)
    if args.format == "sql":
        from streaming.read.query import sql_where

        print(sql_where(table, predicate, args.time_from, args.time_to))
        return 0
    result = query(
        table,
        predicate,
        limit=args.limit,
        snapshot_id=args.snapshot,
        as_of=args.as_of,
        time_from=args.time_from,
        time_to=args.time_to,
    )
    stats = result.stats.__dict__
    try:
        if args.format == "geoparquet":
            write_geoparquet(result, table_contract(table), args.output)
            print(json.dumps({**stats, "output": args.output}), file=sys.stderr)
            return 0
        out = open(args.output, "w") if args.output else sys.stdout
    except OSError as exc:
        raise ValueError(f"--output {args.output}: {exc.strerror or exc}") from None
    try:
        if args.format == "count":
            print(json.dumps({"count": result.table.num_rows, **stats}), file=out)
        else:
            geometry = table.properties.get("geo.primary-column", "geometry")
            for line in to_geojson_lines(result, geometry, feature_id_column(table_contract(table))):
                print(line, file=out)
            print(json.dumps(stats), file=sys.stderr)
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _inspect(args, settings: Settings) -> int:
    from streaming.read.inspect import file_extents, plot_file_extents, raster_footprints
    from streaming.table.catalog import open_catalog

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(args.table)
    layout = file_extents(table, snapshot_id=args.snapshot, as_of=args.as_of)
    summary = layout.summary()
    if args.footprints and not args.plot:
        raise ValueError("inspect --footprints draws them: it needs --plot PNG")
    if args.plot:
        footprints = raster_footprints(table, snapshot_id=args.snapshot, as_of=args.as_of) if args.footprints else None
        if footprints is not None:
            summary["footprints"] = len(footprints)
        try:
            plot_file_extents(layout, args.plot, footprints=footprints)
        except ImportError as exc:
            raise RuntimeError(f"inspect --plot needs matplotlib ({exc})") from None
        except OSError as exc:
            raise ValueError(f"--plot {args.plot}: {exc.strerror or exc}") from None
        summary["plot"] = args.plot
    if args.files:
        summary["file_extents"] = [
            {
                "path": f.path,
                "rows": f.record_count,
                "bytes": f.file_size_in_bytes,
                "bbox": list(f.bbox) if f.bbox else None,
                "hilbert_key": f.hilbert_key,
            }
            for f in layout.files
        ]
    print(json.dumps(summary, indent=2))
    return 0


def _demo(args, settings: Settings) -> int:
    from app.local.demo import run_demo

    home = args.home or (".demo-lakehouse" if args.lakehouse else ".demo")
    return run_demo(settings, Path(home), args.events, lakehouse=args.lakehouse)


if __name__ == "__main__":
    sys.exit(main())

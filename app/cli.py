"""The `geoingest` command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

from app.settings import Settings, SettingsError, load_settings


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
        return args.handler(args, settings) or 0
    except (SettingsError, ValueError, LookupError, RuntimeError, NoSuchTableError, NoSuchNamespaceError) as exc:
        # Errors that name their input are the message; a traceback would only bury it.
        print(f"geoingest: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="geoingest", description=__doc__)
    parser.add_argument("--config", help="settings file (TOML); also GEOINGEST_CONFIG")
    commands = parser.add_subparsers(dest="command", required=True)

    broker = commands.add_parser("broker", help="a local single-node Kafka broker for dev work")
    broker.add_argument("action", choices=["start", "stop", "status"])
    broker.add_argument("--home", default=".demo/broker", help="the broker's state folder")
    broker.add_argument("--port", type=int, help="listener port (default: the port of bootstrap_servers)")
    broker.set_defaults(handler=_broker)

    table = commands.add_parser("table", help="create or describe a table")
    table.add_argument("action", choices=["create", "describe", "orphans"])
    table.add_argument("--contract", help="table contract (JSON)")
    table.add_argument("--table", help="table name, for describe and orphans")
    table.add_argument("--delete", action="store_true", help="orphans: delete them too")
    table.add_argument("--min-age-minutes", type=float, default=60.0,
                       help="orphans: only files at least this old (younger ones may be committing)")
    table.set_defaults(handler=_table)

    run = commands.add_parser("run", help="run the ingest service")
    run.add_argument("--contract", required=True, help="table contract (JSON)")
    run.add_argument("--until-idle", action="store_true", help="drain what the topic holds, then exit")
    run.add_argument("--resume-from-table", action="store_true",
                     help="with a lost checkpoint, start after the Kafka offsets recorded in the table")
    run.set_defaults(handler=_run)

    query = commands.add_parser("query", help="features that intersect a window")
    query.add_argument("--table", required=True)
    query.add_argument("--bbox", required=True, help="xmin,ymin,xmax,ymax in the table CRS")
    query.add_argument("--limit", type=int)
    query.add_argument("--format", choices=["geojson", "count"], default="geojson")
    query.set_defaults(handler=_query)

    demo = commands.add_parser("demo", help="broker, table, 200k sample events, ingest, summary")
    demo.add_argument("--events", type=int, default=200_000)
    demo.add_argument("--home", default=".demo", help="the demo's folder (wiped first)")
    demo.set_defaults(handler=_demo)
    return parser


def _broker(args, settings: Settings) -> int:
    from app.broker import LocalBroker

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
    from streaming.catalog import create_table, describe, open_catalog
    from streaming.contract import load_contract

    catalog = open_catalog(settings.catalog_name, settings.catalog)
    if args.action == "create":
        if not args.contract:
            raise ValueError("table create needs --contract")
        table, created = create_table(catalog, load_contract(args.contract))
        print(json.dumps({"table": ".".join(table.name()), "created": created, "location": table.location()}))
        return 0
    name = args.table or (load_contract(args.contract).table if args.contract else None)
    if not name:
        raise ValueError(f"table {args.action} needs --table or --contract")
    table = catalog.load_table(name)
    if args.action == "orphans":
        from streaming.orphans import delete_files, find_orphans

        orphans = find_orphans(table, min_age_s=args.min_age_minutes * 60)
        if args.delete:
            delete_files(table, [o.path for o in orphans])
        for orphan in orphans:
            print(json.dumps({"path": orphan.path, "bytes": orphan.size, "age_s": round(orphan.age_s),
                              "deleted": args.delete}))
        return 0
    print(json.dumps(describe(table), indent=2))
    return 0


def _run(args, settings: Settings) -> int:
    from app.service import configure_logging, run
    from streaming.contract import load_contract

    configure_logging()
    totals = run(settings, load_contract(args.contract), until_idle=args.until_idle,
                 resume_from_table=args.resume_from_table)
    print(json.dumps({"batches": totals.batches, "consumed": totals.consumed,
                      "committed_rows": totals.committed_rows, "rejected": totals.rejected,
                      "files": totals.files, "commits": totals.commits}))
    return 0


def _query(args, settings: Settings) -> int:
    from streaming.catalog import open_catalog
    from streaming.query import parse_bbox, query_bbox, to_geojson_lines

    window = parse_bbox(args.bbox)
    table = open_catalog(settings.catalog_name, settings.catalog).load_table(args.table)
    result = query_bbox(table, window, limit=args.limit)
    stats = result.stats.__dict__
    if args.format == "count":
        print(json.dumps({"count": result.table.num_rows, **stats}))
    else:
        geometry = table.properties.get("geo.primary-column", "geometry")
        for line in to_geojson_lines(result, geometry):
            print(line)
        print(json.dumps(stats), file=sys.stderr)
    return 0


def _demo(args, settings: Settings) -> int:
    from app.demo import run_demo

    return run_demo(settings, Path(args.home), args.events)


if __name__ == "__main__":
    sys.exit(main())

"""`make demo`: a local broker, the demo table, a realistic sample stream, the ingest, a summary."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from pathlib import Path

from tqdm import tqdm

from app.local.broker import LocalBroker, free_port
from app.local.lakehouse import WAREHOUSE_BUCKET, Lakehouse
from app.local.sample import produce, sample_events
from app.service import RunTotals, configure_logging, run
from app.settings import Settings
from streaming.contract import load_contract
from streaming.job.processor import BatchReport
from streaming.read.query import query_bbox
from streaming.table.catalog import create_table, open_catalog

DEMO_CONTRACT = Path(__file__).resolve().parents[2] / "schemas" / "demo_events.json"
# Western Europe around Paris: a window of about 0.4 % of the world extent, over dense data.
DEMO_WINDOW = (-1.0, 46.5, 6.0, 50.5)


def run_demo(settings: Settings, home: Path, events: int, lakehouse: bool = False) -> int:
    """The demo on embedded defaults (a local broker, local Spark, a SQLite catalog and a local
    warehouse) or, with `lakehouse`, on the lakehouse shape (app/local/lakehouse.py): the table in a
    bucket of an S3-compatible store through a REST catalog, a Spark standalone cluster, the
    broker over SASL_SSL."""
    home = home.absolute()
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    configure_logging("WARNING")
    contract = load_contract(DEMO_CONTRACT)
    settings = dataclasses.replace(
        settings,
        topic="geo-events",
        checkpoint_location=str(home / "checkpoints"),
        max_offsets_per_trigger=100_000,
        metrics_port=0,
    )
    stack: Lakehouse | None = None
    if lakehouse:
        stack = Lakehouse.in_folder(home, Path(settings.cache_dir))
        broker = stack.broker
        settings = stack.settings(settings)
    else:
        broker = LocalBroker(home / "broker", Path(settings.cache_dir), port=free_port())
        settings = dataclasses.replace(
            settings,
            bootstrap_servers=broker.bootstrap,
            catalog={
                "type": "sql",
                "uri": f"sqlite:///{home / 'catalog.db'}",
                "warehouse": f"file://{home / 'warehouse'}",
            },
        )
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    try:
        if stack is not None:
            say(
                "1/6 starting the lakehouse: object store, REST catalog, Spark cluster, secured Kafka broker "
                "(first run fetches their jars from Maven Central)"
            )
            stack.start(say=lambda text: say(f"    {text}"))
        else:
            say("1/6 starting the local Kafka broker (first run fetches its jars from Maven Central)")
            broker.ensure_jars(progress=say)
            broker.start()

        say(f"2/6 creating table {contract.table}")
        catalog = open_catalog(settings.catalog_name, settings.catalog)
        create_table(catalog, contract)

        say(f"3/6 producing {events:,} sample events to topic {settings.topic}")
        # The demo's producer stands for the users' own: it writes on the broker's plain listener.
        produced = produce(broker.bootstrap, settings.topic, sample_events(events), total=events)

        say("4/6 ingesting until the topic is drained (first run fetches Spark's Kafka connector)")
        bar = tqdm(total=produced, unit="ev", desc="ingest", file=sys.stderr)
        first_batch_at: list[float] = []

        def advance(report: BatchReport) -> None:
            if not first_batch_at:
                first_batch_at.append(time.monotonic() - report.seconds["total"])
            bar.update(report.consumed)

        totals = run(settings, contract, until_idle=True, observers=(advance,))
        ingest_seconds = time.monotonic() - first_batch_at[0] if first_batch_at else float("nan")
        bar.close()

        say("5/6 summary")
        table = catalog.load_table(contract.table)
        _print_summary(totals, produced, ingest_seconds, len(table.metadata.snapshots))
        result = query_bbox(table, DEMO_WINDOW)
        s = result.stats
        print(f"\nquery --bbox {','.join(str(v) for v in DEMO_WINDOW)}")
        print(f"  features       {s.rows_matched:,}")
        print(f"  files          {s.files_scanned} of {s.files_total} scanned")
        print(f"  row groups     {s.row_groups_scanned} of {s.row_groups_total} scanned")
        print(f"  rows read      {s.rows_read:,} of {totals.committed_rows:,}")
        if stack is not None:
            print(
                f"\ncatalog {stack.catalog.uri}, warehouse {table.location()} "
                f"(bucket folder {stack.store.data_dir / WAREHOUSE_BUCKET}), table {contract.table}"
            )
        else:
            print(f"\ncatalog {home / 'catalog.db'}, warehouse {home / 'warehouse'}, table {contract.table}")
        return 0
    finally:
        if stack is not None:
            say("6/6 stopping the lakehouse")
            _stop_spark()  # the application leaves the cluster before the cluster goes
            stack.stop()
        else:
            say("6/6 stopping the broker")
            broker.stop()


def _stop_spark() -> None:
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()


def _print_summary(totals: RunTotals, produced: int, seconds: float, snapshots: int) -> None:
    rejected = sum(totals.rejected.values())
    print(f"events produced  {produced:,}")
    print(f"events consumed  {totals.consumed:,}")
    print(f"rows committed   {totals.committed_rows:,}")
    print(f"rejected         {rejected:,}" + "".join(f"\n  {r:<24} {n:,}" for r, n in sorted(totals.rejected.items())))
    print(f"files            {totals.files:,} ({totals.bytes / 1e6:.1f} MB)")
    print(f"batches          {totals.batches}, snapshots {snapshots}")
    print(f"events/s         {totals.consumed / seconds:,.0f} (ingest phase, {seconds:.1f} s)")

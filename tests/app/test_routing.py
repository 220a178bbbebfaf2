"""One service, many tables: routed topics each land in their own table, created from the route's
contract; a topic created while the service runs gets its table; a table that fails leaves the
others going. Real broker, real Spark, real SQLite catalog."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import NewTopic
from prometheus_client import CollectorRegistry
from pyiceberg.exceptions import NoSuchNamespaceError

from app.routing import RoutingError, routed_tables, run_routes, table_status
from app.settings import SettingsError, load_settings
from streaming.read.predicate import Predicate
from streaming.read.query import query
from streaming.table.catalog import open_catalog
from streaming.table.commit import BATCH_ID, WRITER_ID
from tests.conftest import local_settings, produce_records
from tests.streaming.job.test_chaos import GEOINGEST, service_env

pytestmark = pytest.mark.integration

CONTRACT_PATH = str(Path(__file__).resolve().parents[2] / "schemas" / "demo_events.json")


def feature(event_id: str, x: float, y: float) -> bytes:
    return json.dumps(
        {"type": "Feature", "id": event_id, "properties": {"kind": "ping"}, "geometry": {"type": "Point", "coordinates": [x, y]}}
    ).encode()  # fmt: skip


def events(prefix: str, n: int):
    return [
        (f"{prefix}{i}".encode(), feature(f"{prefix}{i}", (i % 300) * 0.1, (i % 170) * 0.1 - 8), []) for i in range(n)
    ]


def create_topics(bootstrap: str, *names: str, partitions: int = 2) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1) for name in names])
    finally:
        admin.close()


def ids_of(settings, table: str) -> list[str]:
    loaded = open_catalog(settings.catalog_name, settings.catalog).load_table(table)
    return sorted(loaded.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist())


def tables_of(settings, namespace: str) -> list[str]:
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    try:
        return sorted(".".join(identifier) for identifier in catalog.list_tables(namespace))
    except NoSuchNamespaceError:
        return []


def dead_letters(bootstrap: str, topic: str) -> int:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000)
    try:
        return sum(1 for _ in consumer)
    finally:
        consumer.close()


@contextlib.contextmanager
def service_running(settings, spark, registry: CollectorRegistry | None = None) -> Iterator[list[BaseException]]:
    """The routed service on a thread, as `geoingest run --routes` runs it, stopped after the block
    (which must end with the service stopped and nothing failed); yields the list its failure lands in."""
    stop = threading.Event()
    failure: list[BaseException] = []

    def service() -> None:
        try:
            run_routes(settings, until_idle=False, spark=spark, registry=registry, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failure.append(exc)

    thread = threading.Thread(target=service, daemon=True)
    thread.start()
    try:
        yield failure
    finally:
        stop.set()
        thread.join(120)
    assert not thread.is_alive() and not failure, failure


def killed_at_commit_time(bootstrap: str, tmp_path: Path, routes: list[dict], max_offsets_per_trigger: int) -> dict:
    """`geoingest run --routes` in a process group of its own, killed (-9, the whole group) once a
    table's batch is committed to Iceberg and not yet to its checkpoint; returns the service's
    environment, for the run after it."""
    hold = tmp_path / "held"
    env = service_env(
        bootstrap,
        "unused",
        tmp_path,
        GEOINGEST_ROUTES=json.dumps(routes),
        GEOINGEST_MAX_OFFSETS_PER_TRIGGER=str(max_offsets_per_trigger),
        GEOINGEST_MAINTENANCE_MODE="off",
    )
    with open(tmp_path / "first.stderr", "wb") as err:
        first = subprocess.Popen(
            [str(GEOINGEST), "run", "--routes"],
            env={**env, "GEOINGEST_HOLD_AFTER_COMMIT_FILE": str(hold)},
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while not hold.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert hold.exists(), (tmp_path / "first.stderr").read_text(errors="replace")[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
    return env


def routed_settings(kafka, tmp_path: Path, prefix: str, **more):
    routes = [
        {
            "name": "fleet",
            "topic_pattern": rf"{prefix}\.(?<city>[a-z]+)\.positions",
            "table": f"{prefix}.positions_{{city}}",
            "contract": CONTRACT_PATH,
        },
        {"name": "audit", "topic": f"{prefix}-audit", "table": f"{prefix}.audit", "contract": CONTRACT_PATH},
    ]
    return local_settings(kafka, "unused", tmp_path, routes=routes, maintenance_mode="off", **more)


def test_routed_topics_each_land_once_in_their_own_table_created_from_the_template(kafka, spark, tmp_path):
    prefix = f"r{uuid.uuid4().hex[:8]}"
    cities = ("paris", "lyon", "nice")
    topics = [f"{prefix}.{city}.positions" for city in cities]
    unrouted = f"{prefix}.paris.stops"
    create_topics(kafka.bootstrap, *topics, f"{prefix}-audit", unrouted)
    for i, topic in enumerate(topics):
        assert produce_records(kafka.bootstrap, topic, events(f"{topic}-", 300 + 100 * i)) == 300 + 100 * i
    bad = [(b"bad", b"{not json", [])] * 3
    assert produce_records(kafka.bootstrap, f"{prefix}-audit", events("audit-", 50) + bad) == 53
    assert produce_records(kafka.bootstrap, unrouted, events("stop-", 20)) == 20
    settings = routed_settings(kafka, tmp_path, prefix)
    registry = CollectorRegistry()

    totals = run_routes(settings, until_idle=True, spark=spark, registry=registry)

    assert tables_of(settings, prefix) == sorted(
        [f"{prefix}.audit", *(f"{prefix}.positions_{city}" for city in cities)]
    ), "a table per routed topic, none for the unrouted one or the dead letters"
    for i, (city, topic) in enumerate(zip(cities, topics, strict=True)):
        assert ids_of(settings, f"{prefix}.positions_{city}") == sorted(f"{topic}-{j}" for j in range(300 + 100 * i))
    assert ids_of(settings, f"{prefix}.audit") == sorted(f"audit-{j}" for j in range(50))
    assert dead_letters(kafka.bootstrap, f"{prefix}-audit.dlq") == 3, "each topic's dead letters beside it"
    assert totals.consumed == 300 + 400 + 500 + 53 and totals.committed_rows == 1250
    for city, n in zip(cities, (300, 400, 500), strict=True):
        committed = registry.get_sample_value(
            "geoingest_events_committed_total",
            {"topic": f"{prefix}.{city}.positions", "table": f"{prefix}.positions_{city}"},
        )
        assert committed == n, "each table's metrics under its own labels, on the one registry"

    # Run again with more events: the dead-letter topic now exists and matches no table, each table
    # goes on from its own checkpoint, and a table is never written twice.
    assert produce_records(kafka.bootstrap, topics[0], events("more-", 40)) == 40
    status = {row["table"]: row for row in table_status(settings, routed_tables(settings))}
    assert sorted(status) == tables_of(settings, prefix), "every routed table, no dead letters, no unrouted topic"
    assert status[f"{prefix}.positions_paris"]["lag"] == 40 and status[f"{prefix}.positions_lyon"]["lag"] == 0
    assert status[f"{prefix}.audit"]["lag"] == 0, "its rejected records are done too: dead letters"
    assert all(row["exists"] and row["last_commit"] for row in status.values())
    run_routes(settings, until_idle=True, spark=spark)
    assert tables_of(settings, prefix) == sorted([f"{prefix}.audit", *(f"{prefix}.positions_{c}" for c in cities)])
    assert ids_of(settings, f"{prefix}.positions_paris") == sorted(
        [*(f"{topics[0]}-{j}" for j in range(300)), *(f"more-{j}" for j in range(40))]
    )
    assert ids_of(settings, f"{prefix}.positions_lyon") == sorted(f"{topics[1]}-{j}" for j in range(400))


KINDS = ("air", "noise", "water", "soil", "light")


def kind_events(prefix: str, n: int, kind: str | None):
    """Events whose kind is both their `kind` header and their properties' `kind` (none: neither)."""
    headers = [("kind", kind.encode())] if kind is not None else []
    properties = {"kind": kind} if kind is not None else {}
    return [
        (
            f"{prefix}{i}".encode(),
            json.dumps(
                {
                    "type": "Feature",
                    "id": f"{prefix}{i}",
                    "properties": properties,
                    "geometry": {"type": "Point", "coordinates": [i * 0.01, 45 + i * 0.01]},
                }
            ).encode(),
            headers,
        )  # fmt: skip
        for i in range(n)
    ]


def dead_letter_records(bootstrap: str, topic: str) -> list[dict[str, str]]:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000)
    try:
        return [
            {k: v.decode() for k, v in m.headers if k.startswith("geoingest.")} | {"key": (m.key or b"").decode()}
            for m in consumer
        ]
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("source", "field"), [("spark-kafka", "header:kind"), ("python", "header:kind"), ("python", "json:properties.kind")]
)
def test_a_field_route_splits_one_topic_over_five_tables_and_dead_letters_what_names_none(
    kafka, spark, tmp_path, source, field
):
    """One topic, its records' kind (a header, or a member of their JSON) naming their table: five tables made from the template,
    each holding its kind's events once, across batches and a second run; a record without the
    header, one whose kind makes no table name and one naming another topic's table are dead
    letters `no_route` that say why."""
    prefix = f"s{uuid.uuid4().hex[:8]}"
    readings, taken = f"{prefix}-readings", f"{prefix}-a-taken"
    create_topics(kafka.bootstrap, readings, taken)
    counts = dict(zip(KINDS, (500, 300, 200, 120, 80), strict=True))
    for kind, n in counts.items():  # interleaved in the topic: each batch holds several kinds
        half = n // 2
        assert produce_records(kafka.bootstrap, readings, kind_events(f"{kind}-", half, kind)) == half
    for kind, n in counts.items():
        rest = kind_events(f"{kind}-", n, kind)[n // 2 :]
        assert produce_records(kafka.bootstrap, readings, rest) == len(rest)
    strays = [*kind_events("none-", 2, None), *kind_events("spaced-", 1, "two words"), *kind_events("t-", 1, "taken")]
    assert produce_records(kafka.bootstrap, readings, strays) == 4
    assert produce_records(kafka.bootstrap, taken, events("taken-", 30)) == 30
    routes = [
        {"name": "taken", "topic": taken, "table": f"{prefix}.taken", "contract": CONTRACT_PATH},
        {
            "name": "sensors",
            "topic": readings,
            "field": field,
            "table": f"{prefix}.{{value}}",
            "contract": CONTRACT_PATH,
        },
    ]
    settings = local_settings(
        kafka, "unused", tmp_path, routes=routes, maintenance_mode="off", source=source, max_offsets_per_trigger=400
    )
    registry = CollectorRegistry()

    totals = run_routes(settings, until_idle=True, spark=spark, registry=registry)

    assert tables_of(settings, prefix) == sorted([f"{prefix}.taken", *(f"{prefix}.{kind}" for kind in KINDS)])
    for kind, n in counts.items():
        assert ids_of(settings, f"{prefix}.{kind}") == sorted(f"{kind}-{i}" for i in range(n)), kind
    assert ids_of(settings, f"{prefix}.taken") == sorted(f"taken-{i}" for i in range(30))
    letters = sorted(dead_letter_records(kafka.bootstrap, f"{readings}.dlq"), key=lambda d: d["key"])
    assert [(d["key"], d["geoingest.reason"]) for d in letters] == [
        ("none-0", "no_route"),
        ("none-1", "no_route"),
        ("spaced-0", "no_route"),
        ("t-0", "no_route"),
    ]
    assert letters[0]["geoingest.detail"] == f"{field}: the record has none, so route sensors names no table"
    assert "'two words'" in letters[2]["geoingest.detail"] and "not a table name" in letters[2]["geoingest.detail"]
    assert f"table {prefix}.taken is written from topic {taken!r}" in letters[3]["geoingest.detail"]
    assert totals.committed_rows == sum(counts.values()) + 30
    no_route = {"topic": readings, "table": f"{prefix}.{{value}}", "reason": "no_route"}
    assert registry.get_sample_value("geoingest_events_rejected_total", no_route) == 4
    for kind, n in counts.items():
        labels = {"topic": readings, "table": f"{prefix}.{kind}"}
        assert registry.get_sample_value("geoingest_events_committed_total", labels) == n

    # More of two kinds and a new sixth: a second run goes on from the topic's checkpoint.
    more = [*kind_events("air-more-", 25, "air"), *kind_events("dust-", 15, "dust")]
    assert produce_records(kafka.bootstrap, readings, more) == 40
    status = {row["table"]: row for row in table_status(settings, routed_tables(settings))}
    assert sorted(status) == tables_of(settings, prefix), "status lists the tables the split topic made"
    assert status[f"{prefix}.air"]["topic"] == readings and status[f"{prefix}.air"]["lag"] == 40
    run_routes(settings, until_idle=True, spark=spark)
    assert ids_of(settings, f"{prefix}.air") == sorted(
        [*(f"air-{i}" for i in range(500)), *(f"air-more-{i}" for i in range(25))]
    )
    assert ids_of(settings, f"{prefix}.dust") == sorted(f"dust-{i}" for i in range(15))
    assert ids_of(settings, f"{prefix}.noise") == sorted(f"noise-{i}" for i in range(300))
    assert len(dead_letter_records(kafka.bootstrap, f"{readings}.dlq")) == 4


def test_a_topic_created_while_the_service_runs_lands_in_its_new_table(kafka, spark, tmp_path):
    prefix = f"r{uuid.uuid4().hex[:8]}"
    first = f"{prefix}.paris.positions"
    create_topics(kafka.bootstrap, first)
    assert produce_records(kafka.bootstrap, first, events("p-", 100)) == 100
    settings = routed_settings(kafka, tmp_path, prefix, routes_refresh_s=2, trigger_interval="1 second")
    with service_running(settings, spark) as failure:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not failure:
            if (
                f"{prefix}.positions_paris" in tables_of(settings, prefix)
                and len(ids_of(settings, f"{prefix}.positions_paris")) == 100
            ):
                break
            time.sleep(1)
        assert not failure and len(ids_of(settings, f"{prefix}.positions_paris")) == 100

        created = time.monotonic()
        second = f"{prefix}.lyon.positions"
        create_topics(kafka.bootstrap, second)
        assert produce_records(kafka.bootstrap, second, events("l-", 70)) == 70
        landed = None
        while time.monotonic() < created + 120 and not failure:
            if (
                f"{prefix}.positions_lyon" in tables_of(settings, prefix)
                and len(ids_of(settings, f"{prefix}.positions_lyon")) == 70
            ):
                landed = time.monotonic() - created
                break
            time.sleep(0.5)
        assert not failure
        assert landed is not None, "the new topic's events never landed"
        # Bounded by the topic listing's period, the new query's start and its first batch.
        assert landed < 60, f"the new topic landed after {landed:.0f} s"
        assert ids_of(settings, f"{prefix}.positions_lyon") == sorted(f"l-{j}" for j in range(70))
        assert len(ids_of(settings, f"{prefix}.positions_paris")) == 100


def test_a_table_that_cannot_be_written_fails_alone_and_is_named(kafka, spark, tmp_path):
    prefix = f"r{uuid.uuid4().hex[:8]}"
    good, broken = f"{prefix}.paris.positions", f"{prefix}.lyon.positions"
    create_topics(kafka.bootstrap, good, broken)
    assert produce_records(kafka.bootstrap, good, events("g-", 80)) == 80
    assert produce_records(kafka.bootstrap, broken, events("b-", 80)) == 80
    settings = routed_settings(kafka, tmp_path, prefix)
    # The table of one topic exists with another schema: its route's contract does not match it.
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    catalog.create_namespace(prefix)
    import pyarrow as pa

    catalog.create_table(f"{prefix}.positions_lyon", schema=pa.schema([("other", pa.string())]))

    with pytest.raises(RoutingError) as caught:
        run_routes(settings, until_idle=True, spark=spark)
    message = str(caught.value)
    assert "\n" not in message and f"{broken}:" in message and good not in message
    assert len(ids_of(settings, f"{prefix}.positions_paris")) == 80, "the other table landed its events"


def test_routes_a_user_mistyped_stop_the_service_at_start_in_one_line(kafka, tmp_path):
    with pytest.raises(SettingsError, match=r"routes\[1\]: 'contract' .* is missing"):
        local_settings(
            kafka,
            "t",
            tmp_path,
            routes=[{"topic": "a", "table": "a.b", "contract": "c"}, {"topic": "b", "table": "a.c"}],
        )
    settings = local_settings(
        kafka, "t", tmp_path, routes=[{"topic": "a", "table": "a.b", "contract": "/nowhere.json"}]
    )
    with pytest.raises(RoutingError, match=r"route routes\[0\]: /nowhere.json: no such contract file"):
        run_routes(settings, until_idle=True)


def test_kill_9_at_commit_time_leaves_every_routed_table_with_each_event_once(kafka, tmp_path):
    """The service of three routed tables killed (-9, the whole process group) while one table's
    batch is committed to Iceberg and not yet to its checkpoint, the other tables anywhere in their
    own batches; then run again until idle. Each table holds its topic's events, each once."""
    prefix = f"r{uuid.uuid4().hex[:8]}"
    cities = ("paris", "lyon", "nice")
    topics = [f"{prefix}.{city}.positions" for city in cities]
    create_topics(kafka.bootstrap, *topics)
    for topic in topics:
        assert produce_records(kafka.bootstrap, topic, events(f"{topic}-", 3000)) == 3000
    routes = [
        {
            "topic_pattern": rf"{prefix}\.(?<city>[a-z]+)\.positions",
            "table": f"{prefix}.positions_{{city}}",
            "contract": CONTRACT_PATH,
        }
    ]
    env = killed_at_commit_time(kafka.bootstrap, tmp_path, routes, max_offsets_per_trigger=700)

    rerun = subprocess.run(
        [str(GEOINGEST), "run", "--routes", "--until-idle"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    settings = load_settings(env=env)
    for topic, city in zip(topics, cities, strict=True):
        landed = ids_of(settings, f"{prefix}.positions_{city}")
        assert landed == sorted(f"{topic}-{j}" for j in range(3000)), f"{city}: {len(landed)} rows"
    status = subprocess.run([str(GEOINGEST), "status"], env=env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr[-2000:]
    rows = [json.loads(line) for line in status.stdout.splitlines()]
    assert [(r["table"], r["topic"], r["lag"]) for r in rows] == [
        (f"{prefix}.positions_{city}", topic, 0) for city, topic in sorted(zip(cities, topics, strict=True))
    ]


def test_kill_9_at_commit_time_leaves_every_table_of_a_split_upsert_topic_at_its_reference(kafka, tmp_path):
    """A topic split by its `kind` header over three upsert tables partitioned by day and cell, each
    key sent twice then some deleted by tombstones; the service killed (-9) when a table of a batch
    has committed, the batch's other tables anywhere in theirs, then run again until idle. Each
    table holds exactly its live keys at their last version: none twice, no deleted key back."""
    prefix = f"s{uuid.uuid4().hex[:8]}"
    readings = f"{prefix}-readings"
    create_topics(kafka.bootstrap, readings)
    kinds = ("air", "noise", "water")

    def version(kind: str, i: int, v: int):
        event = {"type": "Feature", "id": f"{kind}-{i}", "properties": {"speed": v},
                 "geometry": {"type": "Point", "coordinates": [i * 0.01 + v, 10.0 + v]}}  # fmt: skip
        return (f"{kind}-{i}".encode(), json.dumps(event).encode(), [("kind", kind.encode())])

    for v in (1, 2):
        records = [version(kind, i, v) for i in range(800) for kind in kinds]
        assert produce_records(kafka.bootstrap, readings, records) == len(records)
    deleted = {kind: set(range(0, 800, 7)) for kind in kinds}
    tombstones = [(f"{kind}-{i}".encode(), None, [("kind", kind.encode())]) for kind in kinds for i in deleted[kind]]
    assert produce_records(kafka.bootstrap, readings, tombstones) == len(tombstones)
    contract = json.loads(Path(CONTRACT_PATH).read_text())
    contract.update(mode="upsert", primary_key=["event_id"], partition=["day(event_time)", "geohash(geometry, 1)"])
    template = tmp_path / "readings.json"
    template.write_text(json.dumps(contract))
    routes = [{"topic": readings, "field": "header:kind", "table": f"{prefix}.{{value}}", "contract": str(template)}]
    env = killed_at_commit_time(kafka.bootstrap, tmp_path, routes, max_offsets_per_trigger=900)
    settings = load_settings(env=env)
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    assert tables_of(settings, prefix) == [f"{prefix}.air", f"{prefix}.noise", f"{prefix}.water"]
    committed = [kind for kind in kinds if catalog.load_table(f"{prefix}.{kind}").current_snapshot() is not None]
    assert committed, "killed after a table's commit (the batch's others, ingested beside it, anywhere in theirs)"

    rerun = subprocess.run(
        [str(GEOINGEST), "run", "--routes", "--until-idle"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    for kind in kinds:
        rows = query(catalog.load_table(f"{prefix}.{kind}"), Predicate.from_bbox((-180.0, -90.0, 180.0, 90.0))).table
        live = sorted(f"{kind}-{i}" for i in range(800) if i not in deleted[kind])
        assert sorted(rows.column("event_id").to_pylist()) == live, f"{kind}: {rows.num_rows} rows"
        assert set(rows.column("speed").to_pylist()) == {2.0}, f"{kind}: each key at its last version"
        snapshots = catalog.load_table(f"{prefix}.{kind}").metadata.snapshots
        batches = [
            (s.summary[WRITER_ID], s.summary[BATCH_ID]) for s in snapshots if s.summary and WRITER_ID in s.summary
        ]
        assert len({writer for writer, _ in batches}) == 1, f"{kind}: the rerun wrote as the same writer"
        assert len(batches) == len(set(batches)) > 1, f"{kind}: no batch committed twice"
    status = subprocess.run([str(GEOINGEST), "status"], env=env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr[-2000:]
    rows = [json.loads(line) for line in status.stdout.splitlines()]
    assert [(r["table"], r["topic"], r["lag"]) for r in rows] == [(f"{prefix}.{k}", readings, 0) for k in kinds]


def test_the_routed_tables_are_maintained_beside_the_stream_by_one_process(kafka, spark, tmp_path):
    import multiprocessing

    prefix = f"r{uuid.uuid4().hex[:8]}"
    cities = ("paris", "lyon", "nice")
    topics = [f"{prefix}.{city}.positions" for city in cities]
    create_topics(kafka.bootstrap, *topics)
    for topic in topics:
        assert produce_records(kafka.bootstrap, topic, events(f"{topic}-", 600)) == 600
    settings = dataclasses.replace(
        routed_settings(kafka, tmp_path, prefix, trigger_interval="1 second", max_offsets_per_trigger=100),
        maintenance_mode="beside",
        maintenance_interval_commits=2,
        maintenance_min_gap_s=0,
        maintenance_min_file_age_s=0,
    )
    registry = CollectorRegistry()
    at_once: list[int] = []  # maintenance processes alive at each look

    def completed(city: str) -> float:
        value = registry.get_sample_value(
            "geoingest_maintenance_runs_total", {"table": f"{prefix}.positions_{city}", "outcome": "completed"}
        )
        return value or 0.0

    with service_running(settings, spark, registry) as failure:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not failure and not all(completed(c) >= 1 for c in cities):
            at_once.append(sum(1 for p in multiprocessing.active_children() if p.name == "geoingest-maintenance"))
            time.sleep(0.5)
        assert not failure and all(completed(c) >= 1 for c in cities), {c: completed(c) for c in cities}
    # One process for the three tables (started again, between runs, when a table joins).
    assert max(at_once) == 1, f"maintenance processes alive at once: {max(at_once)}"
    assert not [p for p in multiprocessing.active_children() if p.name == "geoingest-maintenance"], "stopped"
    for city, topic in zip(cities, topics, strict=True):
        assert ids_of(settings, f"{prefix}.positions_{city}") == sorted(f"{topic}-{j}" for j in range(600))


def test_run_says_in_one_line_which_of_contract_and_routes_to_give(monkeypatch, capsys):
    from app.cli import main

    monkeypatch.setenv("GEOINGEST_ROUTES", json.dumps([{"topic": "a", "table": "a.b", "contract": CONTRACT_PATH}]))
    assert main(["run", "--contract", CONTRACT_PATH]) == 2
    assert "the settings have routes; run them with --routes" in capsys.readouterr().err
    assert main(["run", "--routes", "--contract", CONTRACT_PATH]) == 2
    assert "give one of them" in capsys.readouterr().err
    monkeypatch.delenv("GEOINGEST_ROUTES")
    assert main(["run", "--routes"]) == 2
    err = capsys.readouterr().err
    assert "run needs --contract, or --routes with routes in the settings" in err and err.count("\n") == 1

"""The service on the lakehouse shape, as a user deploys it: the table in an S3-compatible bucket
(s3proxy), Iceberg's REST catalog server, a Spark standalone cluster whose executors are other
processes with their own Python workers, and the broker over SASL_SSL (SCRAM-SHA-512 over TLS).

Everything runs as `geoingest` commands configured by the environment alone, the way docs/deploy.md
and the chart set it up: the catalog's `s3.*` properties are the only way to the bucket (no AWS_*
variable anywhere), and the broker is reached only through the secured listener. The checkpoint is
the driver's local volume; no table, staging, marker or spill file may land on a local disk.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import shapely
from kafka import KafkaConsumer

from app.local.broker import LocalBroker
from app.local.object_store import LocalObjectStore
from app.local.rest_catalog import LocalRestCatalog
from app.local.sample import produce, sample_events
from app.local.spark_cluster import LocalSparkCluster
from streaming.contract import load_contract
from streaming.source.admin import client_config
from streaming.table.catalog import create_table, open_catalog
from streaming.write.dead_letter import PAYLOAD_URI_HEADER, REASON_HEADER, read_spilled
from tests.conftest import CACHE_DIR, produce_records
from tests.streaming.job.test_chaos import CONTRACT, PARTITIONS, Service, check_kill_9_chaos

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
DEMO_CONTRACT = ROOT / "schemas" / "demo_events.json"
GEOINGEST = Path(sys.executable).parent / "geoingest"
# Files of these kinds are the table's, its staging runs' and its spilled dead letters'.
TABLE_FILE_SUFFIXES = (".parquet", ".arrow", ".avro", ".metadata.json")


@dataclasses.dataclass(frozen=True)
class Lakehouse:
    store: LocalObjectStore
    catalog: LocalRestCatalog
    cluster: LocalSparkCluster
    broker: LocalBroker

    def env(self, topic: str, workdir: Path, **extra: str) -> dict[str, str]:
        """A `geoingest` process's environment: settings only, no AWS_* variables."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GEOINGEST_", "AWS_"))}
        env.update(
            {
                "GEOINGEST_BOOTSTRAP_SERVERS": self.broker.secure_bootstrap,
                "GEOINGEST_KAFKA": json.dumps(self.broker.client_options()),
                "GEOINGEST_TOPIC": topic,
                "GEOINGEST_CATALOG": json.dumps(self.catalog.catalog_properties()),
                "GEOINGEST_CHECKPOINT_LOCATION": str(workdir / "checkpoints"),
                "GEOINGEST_SPARK_MASTER": self.cluster.master_url,
                "GEOINGEST_DRIVER_MEMORY": "1g",
                "GEOINGEST_CACHE_DIR": str(CACHE_DIR),
                "GEOINGEST_METRICS_PORT": "0",
                "GEOINGEST_TRIGGER_INTERVAL": "1 second",
            }
        )
        env.update(extra)
        return env

    def kafka_client(self) -> dict:
        return {"bootstrap_servers": self.broker.secure_bootstrap, **client_config(self.broker.client_options())}

    def open_catalog(self):
        return open_catalog("geoingest", self.catalog.catalog_properties())


@pytest.fixture(scope="module")
def lakehouse(object_store, rest_catalog, spark_cluster, kafka) -> Lakehouse:
    return Lakehouse(object_store, rest_catalog, spark_cluster, kafka)


@pytest.fixture(autouse=True)
def no_aws_variables(monkeypatch):
    """Nothing may reach the bucket through ambient AWS settings: only the catalog's properties."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)


def contract_file(tmp_path: Path, table: str, **changes) -> Path:
    """The demo contract under another table name (one REST catalog serves every test)."""
    raw = json.loads(DEMO_CONTRACT.read_text())
    raw["table"] = table
    raw.update(changes)
    path = tmp_path / f"{table}.json"
    path.write_text(json.dumps(raw))
    return path


def geoingest(
    env: dict[str, str], cwd: Path, *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess:
    result = subprocess.run([str(GEOINGEST), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"geoingest {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}")
    return result


def point(event_id: str, x: float, y: float) -> bytes:
    return json.dumps(
        {
            "type": "Feature",
            "id": event_id,
            "properties": {"kind": "ping"},
            "geometry": {"type": "Point", "coordinates": [x, y]},
        }
    ).encode()


def points(prefix: str, n: int) -> list[tuple[str, float, float]]:
    return [(f"{prefix}{i}", -10 + (i * 7919 % 4000) / 100, 35 + (i * 104729 % 2500) / 100) for i in range(n)]


def local_table_files(*roots: Path) -> list[Path]:
    """Table, staging, marker and spill files under local folders (the checkpoint aside)."""
    found = []
    for root in roots:
        for path in Path(root).rglob("*"):
            if "checkpoints" in path.parts or not path.is_file():
                continue
            if path.name.endswith(TABLE_FILE_SUFFIXES) or "staging" in path.parts or "dead-letters" in path.parts:
                found.append(path)
    return found


def dead_letters(lakehouse: Lakehouse, topic: str) -> list:
    consumer = KafkaConsumer(
        topic,
        **lakehouse.kafka_client(),
        auto_offset_reset="earliest",
        consumer_timeout_ms=8000,
        enable_auto_commit=False,
    )
    try:
        return list(consumer)
    finally:
        consumer.close()


def table_ids(lakehouse: Lakehouse, table: str, snapshot_id: int | None = None) -> list[str]:
    scan = lakehouse.open_catalog().load_table(table).scan(selected_fields=("event_id",), snapshot_id=snapshot_id)
    return scan.to_arrow().column("event_id").to_pylist()


def new_topic(lakehouse: Lakehouse, partitions: int = 3) -> str:
    from kafka.admin import KafkaAdminClient, NewTopic

    name = f"lh-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(**lakehouse.kafka_client())
    try:
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()
    return name


@pytest.mark.parametrize(
    ("clustering", "source"),
    [("batch", "spark-kafka"), ("task", "python"), ("shuffle", "spark-kafka")],
    ids=["batch", "task-python-source", "shuffle"],
)
def test_ingest_dead_letters_query_and_time_travel_on_the_lakehouse(lakehouse, clustering, source, tmp_path):
    """With the Python source the executors read Kafka themselves, over SASL_SSL, from the JVMs of
    the cluster's worker."""
    topic = new_topic(lakehouse)
    table = f"lh_{clustering}{'_py' if source == 'python' else ''}.events"
    contract = contract_file(tmp_path, table)
    first = points("a", 1500)
    bad = [
        (b"bad-json", b'{"type": "Feature", "geometry": {', []),
        (b"bad-lat", point("bad-lat", 10.0, 123.0), []),
        # over dead_letter_max_record_bytes below: stored in the bucket, pointed at by its dead letter
        (b"bad-big", b"\x07" + os.urandom(16 * 1024), [("trace", b"t-1")]),
    ]
    records = [(i.encode(), point(i, x, y), []) for i, x, y in first]
    records[100:100] = bad
    assert produce_records(lakehouse.broker.bootstrap, topic, records) == len(records)
    before = lakehouse.store.request_counts()

    env = lakehouse.env(
        topic,
        tmp_path,
        GEOINGEST_CLUSTERING=clustering,
        GEOINGEST_SOURCE=source,
        GEOINGEST_MAX_OFFSETS_PER_TRIGGER="600",
        GEOINGEST_DEAD_LETTER_MAX_RECORD_BYTES="4096",
        GEOINGEST_REJECTS_TABLE=f"{table.split('.')[0]}.rejects",
    )
    geoingest(env, tmp_path, "table", "create", "--contract", str(contract))
    summary = json.loads(geoingest(env, tmp_path, "run", "--contract", str(contract), "--until-idle").stdout)
    assert summary["committed_rows"] == len(first) and summary["consumed"] == len(records)
    ids = table_ids(lakehouse, table)
    assert sorted(ids) == sorted(i for i, _, _ in first), "every valid event once"

    spent = {kind: n - before.get(kind, 0) for kind, n in lakehouse.store.request_counts().items()}
    assert spent.get("PUT", 0) > 0 and spent.get("GET", 0) > 0, f"the store served the run: {spent}"
    catalog_table = lakehouse.open_catalog().load_table(table)
    assert catalog_table.location().startswith("s3://")
    data_files = [task.file.file_path for task in catalog_table.scan().plan_files()]
    assert data_files and all(path.startswith("s3://") for path in data_files)
    assert local_table_files(tmp_path, lakehouse.cluster.home) == [], "nothing of the table on a local disk"

    letters = dead_letters(lakehouse, f"{topic}.dlq")
    reasons = sorted((m.key, dict(m.headers)[REASON_HEADER].decode()) for m in letters if m.key)
    assert reasons == [(b"bad-json", "malformed_json"), (b"bad-lat", "outside_crs_area")]
    # The record over dead_letter_max_record_bytes: stored in the bucket, its dead letter a pointer.
    pointers = [dict(m.headers) for m in letters if m.key is None]
    assert len(pointers) == 1 and pointers[0][REASON_HEADER] == b"unknown_format"
    spilled = pointers[0][PAYLOAD_URI_HEADER].decode()
    assert spilled.startswith(catalog_table.location()), spilled
    original = read_spilled(spilled, lakehouse.catalog.catalog_properties())
    assert (original["key"], original["value"]) == (bad[2][0], bad[2][1])
    # The same rejects as rows of the rejects table in the bucket, the large one's bytes inline.
    rejects = lakehouse.open_catalog().load_table(f"{table.split('.')[0]}.rejects")
    assert all(task.file.file_path.startswith("s3://") for task in rejects.scan().plan_files())
    rows = rejects.scan().to_arrow().to_pylist()
    assert sorted((r["key"], r["value"], r["reason"]) for r in rows) == sorted(
        [
            (bad[0][0], bad[0][1], "malformed_json"),
            (bad[1][0], bad[1][1], "outside_crs_area"),
            (*bad[2][:2], "unknown_format"),
        ]
    )
    if clustering != "batch":
        return

    # A window query through the CLI, exact against the points produced.
    window = (0.0, 40.0, 20.0, 50.0)
    inside = sum(1 for _, x, y in first if shapely.box(*window).intersects(shapely.Point(x, y)))
    counted = json.loads(
        geoingest(
            env, tmp_path, "query", "--table", table, "--bbox", ",".join(map(str, window)), "--format", "count"
        ).stdout
    )
    assert counted["count"] == inside > 0
    # Staged runs, their markers and the folders' markers are gone from the bucket (an object
    # store keeps an empty `<folder>/` object for a folder whose files were deleted one by one).
    staging = lakehouse.store.file_of(catalog_table.location()) / "staging"
    left = sorted(str(p.relative_to(staging)) for p in staging.rglob("*")) if staging.exists() else []
    assert left == [], f"left in {staging}: {left[:10]}"

    # The checkpoint lost, more events: --resume-from-table goes on after the offsets in the table.
    snapshot = catalog_table.current_snapshot().snapshot_id
    subprocess.run(["rm", "-rf", str(tmp_path / "checkpoints")], check=True)
    more = points("b", 500)
    assert produce_records(
        lakehouse.broker.bootstrap, topic, [(i.encode(), point(i, x, y), []) for i, x, y in more]
    ) == len(more)
    geoingest(env, tmp_path, "run", "--contract", str(contract), "--until-idle", "--resume-from-table")
    ids = table_ids(lakehouse, table)
    assert len(ids) == len(set(ids)) == len(first) + len(more)
    # The first snapshot's answer, by time travel.
    then = json.loads(
        geoingest(
            env,
            tmp_path,
            "query",
            "--table",
            table,
            "--bbox",
            ",".join(map(str, window)),
            "--format",
            "count",
            "--snapshot",
            str(snapshot),
        ).stdout
    )
    assert then["count"] == inside
    assert local_table_files(tmp_path, lakehouse.cluster.home) == []


def test_maintenance_compacts_expires_and_finds_no_orphans_on_the_lakehouse(lakehouse, tmp_path):
    topic = new_topic(lakehouse)
    table = "lh_maintain.events"
    contract = contract_file(tmp_path, table)
    events = points("m", 2400)
    assert produce_records(lakehouse.broker.bootstrap, topic, [(i.encode(), point(i, x, y), []) for i, x, y in events])
    env = lakehouse.env(
        topic,
        tmp_path,
        GEOINGEST_MAX_OFFSETS_PER_TRIGGER="400",
        GEOINGEST_MAINTENANCE_MIN_FILE_AGE_S="0",
        GEOINGEST_MAINTENANCE_SNAPSHOT_MAX_AGE_S="0",
        GEOINGEST_MAINTENANCE_KEEP_SNAPSHOTS="1",
    )
    create_table(lakehouse.open_catalog(), load_contract(contract))
    geoingest(env, tmp_path, "run", "--contract", str(contract), "--until-idle")
    files_before = len(list(lakehouse.open_catalog().load_table(table).scan().plan_files()))
    assert files_before >= 6, "several small batches"

    # The object store frozen for 30 s while a compaction runs: it fails with one line (or waits
    # it out); either way the table keeps every row once.
    lakehouse.store.pause()
    try:
        compaction = subprocess.Popen(
            [str(GEOINGEST), "table", "maintain", "--table", table, "--compact"],
            cwd=tmp_path,
            text=True,
            env={
                **env,
                "GEOINGEST_CATALOG": json.dumps(
                    {**lakehouse.catalog.catalog_properties(), "s3.connect-timeout": "2", "s3.request-timeout": "5"}
                ),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        time.sleep(30)
    finally:
        lakehouse.store.resume()
    _, err = compaction.communicate(timeout=300)
    if compaction.returncode != 0:
        last = err.strip().splitlines()[-1]
        assert compaction.returncode == 2 and last.startswith("geoingest: "), err[-3000:]
    ids = table_ids(lakehouse, table)
    assert len(ids) == len(set(ids)) == len(events)

    report = json.loads(geoingest(env, tmp_path, "table", "maintain", "--table", table).stdout.splitlines()[-1])
    loaded = lakehouse.open_catalog().load_table(table)
    files_after = len(list(loaded.scan().plan_files()))
    assert files_after < files_before, report
    assert len(loaded.metadata.snapshots) <= 2, "old snapshots expired"
    ids = table_ids(lakehouse, table)
    assert len(ids) == len(set(ids)) == len(events)
    orphans = geoingest(env, tmp_path, "table", "orphans", "--table", table, "--min-age-minutes", "0").stdout
    assert orphans.strip() == "", "expiry deleted what it unreferenced"
    assert local_table_files(tmp_path) == []


def test_a_wrong_broker_password_stops_the_service_with_one_line(lakehouse, tmp_path):
    topic = new_topic(lakehouse)
    contract = contract_file(tmp_path, "lh_password.events")
    env = lakehouse.env(topic, tmp_path)
    create_table(lakehouse.open_catalog(), load_contract(contract))
    env["GEOINGEST_KAFKA"] = json.dumps(lakehouse.broker.client_options(password="not-the-password"))
    started = time.monotonic()
    result = geoingest(env, tmp_path, "run", "--contract", str(contract), "--until-idle", check=False, timeout=300)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2, result.stderr[-3000:]
    assert last.startswith("geoingest: ") and "auth" in last.lower(), last
    print(f"wrong password: exit {result.returncode} after {time.monotonic() - started:.0f} s: {last}")


def test_a_missing_bucket_stops_the_service_with_one_line_naming_it(lakehouse, tmp_path):
    """The table's data files go to a bucket of their own (Iceberg's write.data.path) that does not
    exist: deleted, expired by a lifecycle rule, or never made."""
    topic = new_topic(lakehouse)
    assert produce_records(lakehouse.broker.bootstrap, topic, [(b"k", point("k", 1.0, 2.0), [])])
    contract = contract_file(tmp_path, "lh_nobucket.events")
    env = lakehouse.env(topic, tmp_path)
    create_table(lakehouse.open_catalog(), load_contract(contract))
    with lakehouse.open_catalog().load_table("lh_nobucket.events").transaction() as tx:
        tx.set_properties({"write.data.path": "s3://no-such-bucket/lh_nobucket/data"})
    result = geoingest(env, tmp_path, "run", "--contract", str(contract), "--until-idle", check=False, timeout=300)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2, result.stderr[-3000:]
    assert last.startswith("geoingest: ") and "no-such-bucket" in last, last
    assert table_ids(lakehouse, "lh_nobucket.events") == [], "nothing committed"

    # The bucket made, the same command again: the batch is replayed, the event lands once.
    lakehouse.store.create_bucket("no-such-bucket")
    geoingest(env, tmp_path, "run", "--contract", str(contract), "--until-idle")
    assert table_ids(lakehouse, "lh_nobucket.events") == ["k"]
    files = [t.file.file_path for t in lakehouse.open_catalog().load_table("lh_nobucket.events").scan().plan_files()]
    assert files and all(f.startswith("s3://no-such-bucket/lh_nobucket/data/") for f in files)


# -- kill -9 and faults of the real parts ------------------------------------------------------------


def test_kill_9_at_random_moments_on_the_lakehouse(lakehouse, tmp_path):
    """The chaos of test_chaos on the lakehouse shape, smaller: a batch held between its Iceberg
    commit and Spark's checkpoint, then two aimed at a batch writing its files (one of them may
    land after its commit: the files are listed in the bucket, which takes longer than on a disk)."""
    topic = new_topic(lakehouse, partitions=PARTITIONS)
    events = list(sample_events(30_000, seed=11))
    assert produce(
        lakehouse.broker.bootstrap, topic, events, total=len(events), progress=False, partitions=PARTITIONS
    ) == len(events)
    env = lakehouse.env(topic, tmp_path, GEOINGEST_MAX_OFFSETS_PER_TRIGGER="10000")
    create_table(lakehouse.open_catalog(), CONTRACT)
    check_kill_9_chaos(
        env,
        topic,
        events,
        tmp_path,
        kills=3,
        hold_kills={0},
        write_kills={1, 2},
        stored_at=lambda uri: str(lakehouse.store.file_of(uri)),
    )
    assert local_table_files(tmp_path, lakehouse.cluster.home) == []


def wait_until(condition, timeout_s: float, service: Service | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if service is not None and not service.alive:
            raise AssertionError(f"{service.name} exited {service.process.returncode}:\n{service.stderr_tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s" + (f":\n{service.stderr_tail()}" if service else ""))
        time.sleep(0.5)


@dataclasses.dataclass
class Outage:
    env: dict[str, str]
    contract: Path
    table: str
    service: Service
    expected: list[str]


def outage_scenario(
    lakehouse: Lakehouse, tmp_path: Path, table: str, *outages, extra_env: dict[str, str] | None = None
) -> Outage:
    """A running service commits a batch; then, for each (away, back) of `outages`, a part is
    away for 30 s while more events arrive, and back. Returns the service (alive, or stopped by
    an outage)."""
    topic = new_topic(lakehouse)
    contract = contract_file(tmp_path, table)
    first = points("o", 600)
    assert produce_records(lakehouse.broker.bootstrap, topic, [(i.encode(), point(i, x, y), []) for i, x, y in first])
    env = lakehouse.env(topic, tmp_path, **(extra_env or {}))
    create_table(lakehouse.open_catalog(), load_contract(contract))
    service = Service(env, tmp_path, f"outage-{table}", contract=contract)
    produced = [i for i, _, _ in first]
    try:
        wait_until(lambda: len(service.batches()) >= 1, 240, service)
        for number, (away, back) in enumerate(outages):
            away()
            try:
                more = points(f"p{number}-", 400)
                assert produce_records(
                    lakehouse.broker.bootstrap, topic, [(i.encode(), point(i, x, y), []) for i, x, y in more]
                )
                produced += [i for i, _, _ in more]
                time.sleep(30)
            finally:
                back()
    except BaseException:
        service.kill()
        raise
    return Outage(env, contract, table, service, produced)


def came_through(lakehouse: Lakehouse, tmp_path: Path, outage: Outage) -> str:
    """Let the service catch up, or, when the outage stopped it, check its one line and exit code
    and start it again; then every event is in the table once. Says which of the two happened."""
    service = outage.service
    deadline = time.monotonic() + 240
    while service.alive and time.monotonic() < deadline:
        if len(table_ids(lakehouse, outage.table)) >= len(outage.expected):
            break
        time.sleep(1)
    if service.alive:
        service.stop()
        how = "rode it out"
    else:
        last = service.stderr().strip().splitlines()[-1]
        assert service.process.returncode == 2 and last.startswith("geoingest: "), service.stderr_tail()
        geoingest(outage.env, tmp_path, "run", "--contract", str(outage.contract), "--until-idle")
        how = f"stopped with {last!r}, restarted"
    ids = table_ids(lakehouse, outage.table)
    assert sorted(ids) == sorted(outage.expected), f"nothing lost, nothing twice ({how})"
    assert local_table_files(tmp_path, lakehouse.cluster.home) == []
    return how


def test_the_object_store_away_for_30_s_during_ingest(lakehouse, tmp_path):
    outage = outage_scenario(lakehouse, tmp_path, "lh_store_away.events", (lakehouse.store.stop, lakehouse.store.start))
    print("object store away:", came_through(lakehouse, tmp_path, outage))


def test_the_rest_catalog_stopped_then_frozen_for_30_s_during_commits(lakehouse, tmp_path):
    """Stopped (connections refused), then frozen (connections accepted and never answered:
    requests time out after geoingest.rest.request-timeout-s): each time the commit waits, is
    retried within commit.retry.total-timeout-ms, and ingest goes on."""
    catalog = lakehouse.catalog
    outage = outage_scenario(
        lakehouse,
        tmp_path,
        "lh_catalog_away.events",
        (catalog.stop, catalog.start),
        (catalog.pause, catalog.resume),
        extra_env={
            "GEOINGEST_CATALOG": json.dumps({**catalog.catalog_properties(), "geoingest.rest.request-timeout-s": "10"})
        },
    )
    how = came_through(lakehouse, tmp_path, outage)
    print("REST catalog stopped, then frozen:", how)
    assert how == "rode it out", "a commit waits for the catalog (commit.retry.total-timeout-ms)"
    assert any(line.get("msg") == "catalog unavailable, retrying the commit" for line in outage.service.log())


def test_an_upsert_table_on_the_lakehouse_holds_the_current_versions_before_and_after_compaction(lakehouse, tmp_path):
    from tests.streaming.write.test_upsert import expected_state, make_stream

    topic = new_topic(lakehouse)
    table = "lh_upsert.events"
    contract = contract_file(tmp_path, table, mode="upsert")
    records = make_stream(n_keys=600, n_events=6_000, seed=21)
    assert produce_records(lakehouse.broker.bootstrap, topic, records) == len(records)
    env = lakehouse.env(
        topic,
        tmp_path,
        GEOINGEST_MAX_OFFSETS_PER_TRIGGER="1500",
        GEOINGEST_MAINTENANCE_MIN_FILE_AGE_S="0",
        GEOINGEST_MAINTENANCE_SNAPSHOT_MAX_AGE_S="0",
        GEOINGEST_MAINTENANCE_KEEP_SNAPSHOTS="1",
    )
    geoingest(env, tmp_path, "table", "create", "--contract", str(contract))
    geoingest(env, tmp_path, "run", "--contract", str(contract), "--until-idle")
    expected = expected_state(records)

    def state() -> dict[str, tuple]:
        out = geoingest(env, tmp_path, "query", "--table", table, "--bbox=-180,-90,180,90").stdout
        features = [json.loads(line) for line in out.splitlines()]
        ids = [f["id"] for f in features]
        assert len(ids) == len(set(ids)), "one feature per key"
        return {
            f["id"]: (*f["geometry"]["coordinates"], f["properties"]["speed"])  # GeoJSON id from the primary key
            for f in features
        }

    assert state() == expected
    geoingest(env, tmp_path, "table", "maintain", "--table", table, "--compact", "--expire")
    assert state() == expected, "compaction applied the deletes"
    assert local_table_files(tmp_path) == []


def test_a_native_geometry_table_on_the_lakehouse_is_streamed_maintained_and_holds_geometry(lakehouse, tmp_path):
    """A v3 table (`geometry.native`) in the bucket behind the REST catalog, executors in other
    processes: Iceberg Java commits through the REST catalog with its S3FileIO, beside the writer's
    files in the bucket; the rows, the Parquet GEOMETRY column and maintenance hold."""
    import pyarrow.parquet as pq

    from streaming.read.predicate import Predicate
    from streaming.read.query import query
    from streaming.table.native import is_native

    topic = new_topic(lakehouse)
    table = "lh_native.events"
    geometry = {**json.loads(DEMO_CONTRACT.read_text())["geometry"], "native": True}
    contract = contract_file(tmp_path, table, geometry=geometry)
    events = points("v", 2400)
    assert produce_records(lakehouse.broker.bootstrap, topic, [(i.encode(), point(i, x, y), []) for i, x, y in events])
    env = lakehouse.env(
        topic,
        tmp_path,
        GEOINGEST_MAX_OFFSETS_PER_TRIGGER="400",
        GEOINGEST_MAINTENANCE_MIN_FILE_AGE_S="0",
        GEOINGEST_MAINTENANCE_SNAPSHOT_MAX_AGE_S="0",
        GEOINGEST_MAINTENANCE_KEEP_SNAPSHOTS="1",
    )
    geoingest(env, tmp_path, "table", "create", "--contract", str(contract))
    geoingest(env, tmp_path, "run", "--contract", str(contract), "--until-idle")

    loaded = lakehouse.open_catalog().load_table(table)
    assert is_native(loaded) and loaded.location().startswith("s3://")

    def ids() -> list[str]:
        loaded.refresh()
        return query(loaded, Predicate.from_bbox((-180.0, -90.0, 180.0, 90.0))).table.column("event_id").to_pylist()

    assert sorted(ids()) == sorted(i for i, _, _ in events)
    files_before = {task.file.file_path for task in loaded.scan().plan_files()}
    assert len(files_before) >= 6, "several small batches"
    path = next(iter(files_before))
    with loaded.io.new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        column = parquet.schema.column(parquet.schema_arrow.get_field_index("geometry"))
        assert column.logical_type.type == "GEOMETRY"

    report = json.loads(geoingest(env, tmp_path, "table", "maintain", "--table", table).stdout.splitlines()[-1])
    loaded.refresh()
    assert report["compaction"]["files_rewritten"] >= 6 and report["skipped"] is None, report
    assert len({task.file.file_path for task in loaded.scan().plan_files()}) < len(files_before)
    assert len(loaded.metadata.snapshots) <= 2, "old snapshots expired"
    assert sorted(ids()) == sorted(i for i, _, _ in events)
    orphans = geoingest(env, tmp_path, "table", "orphans", "--table", table, "--min-age-minutes", "0").stdout
    assert orphans.strip() == "", "expiry deleted what it unreferenced"
    assert local_table_files(tmp_path) == []

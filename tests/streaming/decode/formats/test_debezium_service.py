"""A PostGIS table mirrored live through Debezium into an Iceberg table, for real: PostgreSQL with
PostGIS (logical decoding, pgoutput), Kafka Connect with Debezium's connector, the broker, and the
`geoingest run` service in a process of its own. Inserts, updates that move geometries, deletes,
and a column added with ALTER TABLE while the stream runs; the service is killed with SIGKILL
mid-stream and restarted. At the end the Iceberg table equals the PostGIS table row for row
(geometries compared as normalised WKB), read by `geoingest query`, pyiceberg-free `query`, Spark
and DuckDB."""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import shapely
from kafka import KafkaConsumer

from app.local.kafka_connect import LocalKafkaConnect
from streaming.read.predicate import Predicate
from streaming.read.query import query
from streaming.table.catalog import create_table
from streaming.table.commit import KAFKA_OFFSETS
from tests.conftest import duckdb_connection
from tests.debezium import connect_db, kafka_connect, postgis, start_connector  # noqa: F401
from tests.postgres import PostgresServer
from tests.streaming.decode.formats.test_debezium import PLACES, RAW_PLACES
from tests.streaming.job.test_chaos import Service, catalog_of, geoingest, service_env

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[4]
WORLD = Predicate.from_bbox((-180.0, -90.0, 180.0, 90.0))
# Rows ever inserted into the source table: half in the snapshot, a quarter before the kill, a
# quarter after it, a tenth deleted. `make test` runs 40,000 (36,000 features at the end, about
# 3 minutes here); GEOINGEST_DEBEZIUM_ROWS=112000 is the run docs/debezium.md measures.
ROWS = int(os.environ.get("GEOINGEST_DEBEZIUM_ROWS", "40000"))


def shape(x: float, y: float, i: int) -> str:
    """Points and small polygons, as PostGIS SQL."""
    if i % 3 == 0:
        return f"ST_Buffer(ST_SetSRID(ST_MakePoint({x!r}, {y!r}), 4326), 0.01, 2)"
    return f"ST_SetSRID(ST_MakePoint({x!r}, {y!r}), 4326)"


def normalised(wkb: bytes) -> str:
    return shapely.to_wkb(shapely.normalize(shapely.from_wkb(wkb))).hex()


def all_normalised(wkbs: list) -> list[str]:
    return [b.hex() for b in shapely.to_wkb(shapely.normalize(shapely.from_wkb(np.array(wkbs, dtype=object))))]


def postgis_state(server: PostgresServer) -> dict[int, tuple]:
    with connect_db(server) as conn, conn.cursor() as cur:
        cur.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'places'")
        has_height = "height" in {r[0] for r in cur.fetchall()}
        height = "height" if has_height else "NULL::float8"
        cur.execute(f"SELECT id, name, {height}, ST_AsBinary(geom) FROM places")
        return {i: (name, h, normalised(bytes(g))) for i, name, h, g in cur.fetchall()}


def iceberg_state(table, snapshot_id: int | None = None) -> dict[int, tuple]:
    table.refresh()
    result = query(table, WORLD, snapshot_id=snapshot_id).table
    heights = result.column("height").to_pylist() if "height" in result.column_names else [None] * result.num_rows
    ids = result.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "one row per key"
    geometries = all_normalised(result.column("geometry").to_pylist())
    return {i: (name, h, g) for i, name, h, g in zip(ids, result.column("name").to_pylist(), heights, geometries)}


def apply_changes(server: PostgresServer, rng: np.random.Generator, first_id: int, n: int, with_height: bool) -> int:
    """n inserts, updates of about n existing rows moving their geometry, n/5 deletes; returns the next id."""
    with connect_db(server) as conn, conn.cursor() as cur:
        cur.execute("SELECT id FROM places")
        existing = np.array([r[0] for r in cur.fetchall()])
        for start in range(0, n, 500):
            values = []
            for i in range(first_id + start, first_id + min(n, start + 500)):
                x, y = rng.uniform(-170, 170), rng.uniform(-80, 80)
                height = f", {rng.uniform(0, 300)!r}" if with_height else ""
                values.append(f"({i}, 'new {i}', {shape(x, y, i)}{height})")
            columns = "(id, name, geom, height)" if with_height else "(id, name, geom)"
            cur.execute(f"INSERT INTO places {columns} VALUES {', '.join(values)}")
        moved = rng.choice(existing, size=min(n, existing.size), replace=False)
        for i in moved:
            x, y = rng.uniform(-170, 170), rng.uniform(-80, 80)
            height = f", height = {rng.uniform(0, 300)!r}" if with_height else ""
            cur.execute(f"UPDATE places SET name = 'moved {i}', geom = {shape(x, y, int(i))}{height} WHERE id = {i}")
        gone = rng.choice(np.setdiff1d(existing, moved), size=min(n // 5, existing.size - moved.size), replace=False)
        cur.execute(f"DELETE FROM places WHERE id IN ({', '.join(str(int(i)) for i in gone)})")
    return first_id + n


def topic_changes(bootstrap: str, topic: str) -> dict[int, list[tuple[int, int, tuple | None]]]:
    """Per partition, in offset order: (offset, id, the row the change leaves, None for a delete)."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000)
    changes: dict[int, list[tuple[int, int, tuple | None]]] = {}
    try:
        for message in consumer:
            key = json.loads(message.key)["payload"]["id"]
            row = None
            if message.value is not None:
                event = json.loads(message.value)["payload"]
                after = event["after"] if event["op"] != "d" else None
                if after is not None:
                    wkb = base64.b64decode(after["geom"]["wkb"])
                    row = (after["name"], after.get("height"), normalised(wkb))
            changes.setdefault(message.partition, []).append((message.offset, key, row))
    finally:
        consumer.close()
    return {p: sorted(c) for p, c in changes.items()}


def every_snapshot_matches(table, topic: str, changes: dict[int, list[tuple[int, int, tuple | None]]]) -> int:
    """Every snapshot holds the state the changes up to its Kafka offsets make; returns how many."""
    upto: dict[int, int] = {}
    checked = 0
    for snapshot in sorted(table.metadata.snapshots, key=lambda s: s.sequence_number):
        offsets = (snapshot.summary or {}).get(KAFKA_OFFSETS)
        if offsets:
            for partition, (_, last) in json.loads(offsets).get(topic, {}).items():
                upto[int(partition)] = max(upto.get(int(partition), -1), int(last))
        state: dict[int, tuple | None] = {}
        for partition, entries in changes.items():
            for offset, key, row in entries:
                if offset > upto.get(partition, -1):
                    break
                state[key] = row
        expected = {k: v for k, v in state.items() if v is not None}
        assert iceberg_state(table, snapshot.snapshot_id) == expected, f"snapshot {snapshot.snapshot_id}"
        checked += 1
    return checked


SPARK_READER = """
import json, sys
from pathlib import Path
from app.spark import spark_session
cache, jars, location, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
spark = spark_session("local[1]", cache, "1g", extra_jars=[Path(j) for j in jars.split(",")])
rows = spark.read.format("iceberg").load(location).select("id", "name", "height", "geometry").collect()
json.dump([[r.id, r.name, r.height, bytes(r.geometry).hex()] for r in rows], open(out, "w"))
spark.stop()
"""


def spark_state(metadata_location: str, tmp_path: Path) -> dict[int, tuple]:
    from tests.iceberg_spark import run_with_iceberg_spark

    state: dict[int, tuple] = {}
    for i, name, height, geometry in run_with_iceberg_spark(SPARK_READER, tmp_path, metadata_location):
        assert i not in state, f"Spark reads {i} twice"
        state[i] = (name, height, normalised(bytes.fromhex(geometry)))
    return state


def test_a_postgis_table_is_mirrored_live_through_debezium_across_a_kill_9(
    kafka, postgis: PostgresServer, kafka_connect: LocalKafkaConnect, tmp_path: Path
) -> None:
    rng = np.random.default_rng(32)
    snapshot_rows = ROWS // 2
    with connect_db(postgis) as conn, conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS places")
        cur.execute("CREATE TABLE places (id bigint PRIMARY KEY, name text, geom geometry(Geometry, 4326) NOT NULL)")
        for start in range(0, snapshot_rows, 1000):
            rows = [
                f"({i}, 'place {i}', {shape(rng.uniform(-170, 170), rng.uniform(-80, 80), i)})"
                for i in range(start, min(snapshot_rows, start + 1000))
            ]
            cur.execute(f"INSERT INTO places VALUES {', '.join(rows)}")
    prefix, _ = start_connector(kafka_connect, postgis, ["public.places"], schemas=True)
    topic = f"{prefix}.public.places"

    contract_file = tmp_path / "places.json"
    contract_file.write_text(json.dumps(RAW_PLACES))
    env = service_env(kafka.bootstrap, topic, tmp_path, GEOINGEST_MAX_OFFSETS_PER_TRIGGER=str(max(1000, ROWS // 10)))
    create_table(catalog_of(env), PLACES)
    table = catalog_of(env).load_table(PLACES.table)
    logs = tmp_path / "logs"
    logs.mkdir()

    service = Service(env, logs, "run-1", contract=contract_file)
    try:
        next_id = apply_changes(postgis, rng, snapshot_rows, ROWS // 4, with_height=False)
        # kill -9 once the service has committed a batch, while the changes are still coming in
        deadline = time.monotonic() + 300
        while not list(table.refresh().snapshots()) and time.monotonic() < deadline:
            assert service.alive, service.stderr_tail()
            time.sleep(0.5)
        assert list(table.snapshots()), f"no batch committed in 300 s:\n{service.stderr_tail()}"
        service.kill()
        with connect_db(postgis) as conn, conn.cursor() as cur:
            cur.execute("ALTER TABLE places ADD COLUMN height double precision")
        next_id = apply_changes(postgis, rng, next_id, ROWS // 4, with_height=True)
        service = Service(env, logs, "run-2", contract=contract_file)

        expected = postgis_state(postgis)
        deadline = time.monotonic() + 600
        state: dict[int, tuple] = {}
        while time.monotonic() < deadline:
            assert service.alive, service.stderr_tail()
            state = iceberg_state(table)
            if state == expected:
                break
            time.sleep(2)
    finally:
        service.stop()
    missing, extra = expected.keys() - state.keys(), state.keys() - expected.keys()
    differing = [i for i in expected.keys() & state.keys() if expected[i] != state[i]]
    assert state == expected, (len(missing), len(extra), differing[:5], service.stderr_tail())
    assert len(expected) > ROWS // 2 and any(h is not None for _, h, _ in expected.values())
    assert "height" in {f.name for f in table.schema().fields}, "the column added in PostGIS reached the table"
    assert every_snapshot_matches(table, topic, topic_changes(kafka.bootstrap, topic)) >= 2

    # Other readers: Spark with Iceberg's runtime, DuckDB's iceberg_scan, `geoingest query`.
    assert spark_state(table.metadata_location, tmp_path) == expected
    con = duckdb_connection()
    con.execute("SET enable_geoparquet_conversion = false")
    found = con.execute(f"SELECT id, name, height, geometry FROM iceberg_scan('{table.metadata_location}')").fetchall()
    assert {i: (name, h, normalised(bytes(g))) for i, name, h, g in found} == expected
    out = geoingest(env, "query", "--table", PLACES.table, "--bbox=-180,-90,180,90").stdout
    features = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert sorted(int(f["id"]) for f in features) == sorted(expected)
    for f in features[:500]:
        name, _, wkb = expected[int(f["id"])]
        assert f["properties"]["name"] == name
        read = shapely.normalize(shapely.from_geojson(json.dumps(f["geometry"])))
        assert shapely.equals_exact(read, shapely.from_wkb(bytes.fromhex(wkb)), 1e-9)

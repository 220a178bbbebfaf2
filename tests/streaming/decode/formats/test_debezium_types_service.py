"""A PostGIS table with numeric(12,2), date, timestamp, timestamptz, uuid, text[], int[] and jsonb
columns mirrored live through the real Debezium connector (its defaults: decimal.handling.mode
precise; the JSON converter with schemas, or Apicurio's Avro converter through the registry, whose
arrays are Avro arrays) into an Iceberg table of decimal, date, timestamp,
timestamptz, uuid, list and struct columns (and a jsonb kept as its text): after a snapshot,
inserts, updates of every typed value and deletes, the table read back by pyiceberg and by DuckDB
equals what PostgreSQL holds, row for row (pyiceberg's scan refuses the equality deletes upserts
write: the table pyiceberg loads is read by geoingest's reader, `streaming.read.query`)."""

from __future__ import annotations

import copy
import datetime
import json
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import psycopg2.extras
import pytest

from app.local.kafka_connect import LocalKafkaConnect, debezium_postgres_config
from streaming.contract import parse_contract
from streaming.read.predicate import Predicate
from streaming.read.query import query
from streaming.table.catalog import create_table
from tests.conftest import duckdb_connection
from tests.debezium import connect_db, kafka_connect, postgis, source_of  # noqa: F401
from tests.postgres import PostgresServer
from tests.streaming.decode.formats.test_debezium import RAW_PLACES
from tests.streaming.decode.formats.test_debezium_service import normalised
from tests.streaming.job.test_chaos import Service, catalog_of, service_env

pytestmark = pytest.mark.integration

SNAPSHOT_ROWS = 200
WORLD = Predicate.from_bbox((-180.0, -90.0, 180.0, 90.0))
UTC = datetime.UTC
COLUMNS = "id, name, price, day, seen, seen_tz, ref, tags, counts, doc, attrs"


def contract_raw() -> dict:
    raw = copy.deepcopy(RAW_PLACES)
    raw["table"] = "gis.typed_places"
    types: dict[str, Any] = {
        "price": "decimal(12, 2)",
        "day": "date",
        "seen": "timestamp",
        "seen_tz": "timestamptz",
        "ref": "uuid",
        # Nested ids left out: a new table's are assigned as Iceberg assigns them.
        "tags": {"type": "list", "element": "string", "element-required": False},
        "counts": {"type": "list", "element": "int", "element-required": False},
        "doc": {
            "type": "struct",
            "fields": [
                {"name": "kind", "type": "string", "required": False},
                {"name": "n", "type": "int", "required": False},
            ],
        },
        "attrs": "string",
    }
    for i, (name, kind) in enumerate(types.items(), start=3):
        raw["columns"].append({"id": i, "name": name, "type": kind, "from": [f"properties.{name}"]})
    raw["geometry"]["id"], raw["bbox"]["id"] = 12, 13
    return raw


def values_of(rng: np.random.Generator, i: int, version: int) -> tuple:
    """A row's values; about one row in eight holds nulls (or empty arrays) instead."""
    if rng.random() < 0.125:
        return (i, None, None, None, None, None, None, None, [], None, None)
    cents = int(rng.integers(-(10**12) + 1, 10**12))
    micros = int(rng.integers(-(10**15), 4 * 10**15))
    seen = datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=micros)
    tags = [f"t{version}-{int(k)}" for k in rng.integers(0, 99, int(rng.integers(0, 4)))] + [None, 'é,"{}'][: i % 3]
    return (
        i,
        f"p{i} v{version}",
        Decimal(cents).scaleb(-2),
        datetime.date(1900, 1, 1) + datetime.timedelta(days=int(rng.integers(0, 80_000))),
        seen,
        (seen + datetime.timedelta(hours=3)).replace(tzinfo=UTC),
        uuid.UUID(bytes=rng.bytes(16), version=4),
        tags,
        [int(v) for v in rng.integers(-(2**31), 2**31, int(rng.integers(0, 5)))],
        psycopg2.extras.Json({"kind": f"k{version}", "n": int(rng.integers(-1000, 1000)), "extra": [1, 2]}),
        psycopg2.extras.Json({"version": version, "nested": {"x": float(rng.uniform())}}),
    )


def write_rows(cur, rows: list[tuple]) -> None:
    psycopg2.extras.register_uuid()  # uuid.UUID as a uuid parameter
    psycopg2.extras.execute_values(
        cur,
        f"INSERT INTO typed_places ({COLUMNS}, geom) VALUES %s",
        [(*r, float(r[0] % 170), float(r[0] % 80)) for r in rows],
        template="(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, ST_SetSRID(ST_MakePoint(%s, %s), 4326))",
    )


def postgres_state(server: PostgresServer) -> dict[int, tuple]:
    with connect_db(server) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT id, name, price, day, seen, seen_tz, ref::text, tags, counts, "
            "jsonb_build_object('kind', doc->'kind', 'n', doc->'n'), attrs::text, ST_AsBinary(geom) FROM typed_places"
        )
        return {r[0]: comparable(r[1:11], bytes(r[11])) for r in cur.fetchall()}


def comparable(values, geometry: bytes) -> tuple:
    """A row as each reader's values compare: timestamptz as a UTC instant, the uuid as text, a
    struct as a dict, the geometry as normalised WKB."""
    name, price, day, seen, seen_tz, ref, tags, counts, doc, attrs = values
    if seen_tz is not None:
        seen_tz = seen_tz.astimezone(UTC)
    if ref is not None:
        ref = str(uuid.UUID(bytes=ref) if isinstance(ref, bytes) else uuid.UUID(str(ref)))
    if isinstance(doc, str):
        doc = json.loads(doc)
    if doc is not None and all(v is None for v in doc.values()):
        doc = None  # PostgreSQL's object of a null jsonb
    return (name, price, day, seen, seen_tz, ref, tags, counts, doc, attrs, normalised(geometry))


def iceberg_rows(table) -> dict[int, tuple]:
    """The table as pyiceberg's catalog has it, its equality deletes applied by geoingest's reader
    (pyiceberg's own scan refuses a table with equality deletes, which upserts write)."""
    table.refresh()
    read = query(table, WORLD).table.to_pylist()
    ids = [r["id"] for r in read]
    assert len(ids) == len(set(ids)), "one row per key"
    names = COLUMNS.split(", ")[1:]
    return {r["id"]: comparable([r[n] for n in names], r["geometry"]) for r in read}


@pytest.mark.parametrize("converter", ["json", "avro"])
def test_a_postgis_table_of_typed_columns_is_mirrored_equal_row_for_row(
    kafka, postgis: PostgresServer, kafka_connect: LocalKafkaConnect, request, tmp_path: Path, converter: str
) -> None:
    rng = np.random.default_rng(12)
    with connect_db(postgis) as conn, conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS typed_places")
        cur.execute(
            "CREATE TABLE typed_places (id bigint PRIMARY KEY, name text, price numeric(12,2), day date, "
            "seen timestamp, seen_tz timestamptz, ref uuid, tags text[], counts int[], doc jsonb, attrs jsonb, "
            "geom geometry(Point, 4326) NOT NULL)"
        )
        write_rows(cur, [values_of(rng, i, 0) for i in range(SNAPSHOT_ROWS)])
    # The connector's own defaults for numerics (precise); the local worker's settings otherwise.
    prefix = f"dbztyped{uuid.uuid4().hex[:8]}"
    registry = request.getfixturevalue("schema_registry") if converter == "avro" else None
    config = debezium_postgres_config(
        source_of(postgis),
        ["public.typed_places"],
        prefix,
        f"slot_{prefix}",
        avro_registry=registry.base_url if registry else "",
    )
    del config["decimal.handling.mode"]
    kafka_connect.start({f"pg-{prefix}": config})
    topic = f"{prefix}.public.typed_places"

    raw = contract_raw()
    contract_file = tmp_path / "typed_places.json"
    contract_file.write_text(json.dumps(raw))
    contract = parse_contract(raw)
    env = service_env(kafka.bootstrap, topic, tmp_path, GEOINGEST_MAX_OFFSETS_PER_TRIGGER="150")
    if registry is not None:
        env["GEOINGEST_SCHEMA_REGISTRY__URL"] = registry.url
    create_table(catalog_of(env), contract)
    table = catalog_of(env).load_table(contract.table)
    logs = tmp_path / "logs"
    logs.mkdir()
    service = Service(env, logs, "run", contract=contract_file)
    try:
        with connect_db(postgis) as conn, conn.cursor() as cur:
            write_rows(cur, [values_of(rng, i, 1) for i in range(SNAPSHOT_ROWS, SNAPSHOT_ROWS + 100)])
            for i in rng.choice(SNAPSHOT_ROWS + 100, 100, replace=False):
                new = values_of(rng, int(i), 2)
                psycopg2.extras.register_uuid()
                cur.execute(
                    "UPDATE typed_places SET name = %s, price = %s, day = %s, seen = %s, seen_tz = %s, ref = %s, "
                    "tags = %s, counts = %s, doc = %s, attrs = %s WHERE id = %s",
                    (*new[1:], int(i)),
                )
            cur.execute("DELETE FROM typed_places WHERE id % 15 = 0")
        expected = postgres_state(postgis)
        deadline = time.monotonic() + 240
        state: dict[int, tuple] = {}
        while time.monotonic() < deadline:
            assert service.alive, service.stderr_tail()
            state = iceberg_rows(table)
            if state == expected:
                break
            time.sleep(2)
    finally:
        service.stop()
    differing = [
        (expected.get(i), state.get(i)) for i in expected.keys() | state.keys() if expected.get(i) != state.get(i)
    ]
    assert state == expected, (len(differing), differing[:3], service.stderr_tail())
    assert len(expected) > SNAPSHOT_ROWS and any(r[1] is not None for r in expected.values())

    con = duckdb_connection()
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET enable_geoparquet_conversion = false")
    found = con.execute(f"SELECT {COLUMNS}, geometry FROM iceberg_scan('{table.metadata_location}')").fetchall()
    assert {r[0]: comparable(r[1:11], bytes(r[11])) for r in found} == expected

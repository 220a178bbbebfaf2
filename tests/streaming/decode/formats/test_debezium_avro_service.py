"""A PostGIS table mirrored through Debezium with Avro keys and values through the schema registry,
for real: PostgreSQL with PostGIS, Kafka Connect running Debezium's connector with Apicurio's Avro
converter against the Apicurio registry (tests/conftest.py), the broker, Spark and the service's
`run`. A snapshot, inserts, updates that move geometries, deletes with their tombstones; then
ALTER TABLE ADD COLUMN (a new version of the value schema) and as many changes again. The Iceberg
table equals the PostGIS table row for row at the end, the added column reached it by schema
evolution, and a record whose schema id the registry does not know is a dead letter with its reason."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from kafka import KafkaConsumer, TopicPartition

from app.local.kafka_connect import LocalKafkaConnect
from app.service import run
from streaming.decode.schema_registry import RegistrySettings, SchemaRegistryClient
from streaming.table.catalog import create_table, open_catalog
from tests.conftest import duckdb_connection, local_settings, produce_records
from tests.debezium import connect_db, kafka_connect, postgis, start_connector  # noqa: F401
from tests.postgres import PostgresServer
from tests.streaming.decode.formats.test_debezium import PLACES
from tests.streaming.decode.formats.test_debezium_service import (
    apply_changes,
    iceberg_state,
    normalised,
    postgis_state,
    shape,
)
from tests.streaming.decode.test_dead_letter_corpus import dead_letters

pytestmark = pytest.mark.integration

# Rows ever inserted: half in the snapshot, a quarter before the column is added, a quarter after.
ROWS = int(os.environ.get("GEOINGEST_DEBEZIUM_AVRO_ROWS", "3000"))


def row_count(server: PostgresServer) -> int:
    with connect_db(server) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM places")
        return int(cur.fetchone()[0])


def change_records(existing: int, n: int) -> int:
    """The Kafka records apply_changes(n) makes on a table of `existing` rows: an event per insert
    and update, a delete event and its tombstone per delete."""
    moved = min(n, existing)
    return n + moved + 2 * min(n // 5, existing - moved)


def wait_for_records(bootstrap: str, topic: str, n: int, worker: LocalKafkaConnect, timeout_s: float = 180) -> None:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        deadline = time.monotonic() + timeout_s
        total = 0
        while time.monotonic() < deadline:
            partitions = consumer.partitions_for_topic(topic) or set()
            total = sum(consumer.end_offsets([TopicPartition(topic, p) for p in partitions]).values())
            if total >= n:
                return
            time.sleep(0.5)
        raise AssertionError(f"{total} of {n} records on {topic} after {timeout_s} s:\n{worker.log_tail()}")
    finally:
        consumer.close()


def first_record(bootstrap: str, topic: str):
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000)
    try:
        return next(iter(consumer))
    finally:
        consumer.close()


def test_a_postgis_table_is_mirrored_through_debezium_with_avro_through_the_registry(
    kafka, spark, postgis: PostgresServer, kafka_connect: LocalKafkaConnect, schema_registry, tmp_path: Path
) -> None:
    rng = np.random.default_rng(33)
    snapshot_rows = ROWS // 2
    with connect_db(postgis) as conn, conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS places")
        cur.execute("CREATE TABLE places (id bigint PRIMARY KEY, name text, geom geometry(Geometry, 4326) NOT NULL)")
        rows = [
            f"({i}, 'place {i}', {shape(rng.uniform(-170, 170), rng.uniform(-80, 80), i)})"
            for i in range(snapshot_rows)
        ]
        cur.execute(f"INSERT INTO places VALUES {', '.join(rows)}")
    prefix, _ = start_connector(kafka_connect, postgis, ["public.places"], avro_registry=schema_registry.base_url)
    topic = f"{prefix}.public.places"
    expected_records = snapshot_rows + change_records(snapshot_rows, ROWS // 4)
    next_id = apply_changes(postgis, rng, snapshot_rows, ROWS // 4, with_height=False)
    wait_for_records(kafka.bootstrap, topic, expected_records, kafka_connect)

    # What the converter writes: the Confluent wire format, keys and values, with ids that the
    # registry's Confluent-compatible API serves, as geoingest's registry client asks for them.
    sample = first_record(kafka.bootstrap, topic)
    client = SchemaRegistryClient(RegistrySettings(url=schema_registry.url))
    for raw, record_name in ((sample.key, "Key"), (sample.value, "Envelope")):
        assert raw[0] == 0, raw[:8]
        (schema_id,) = struct.unpack(">I", raw[1:5])
        registered = client.schema(schema_id)
        assert registered.schema_type == "AVRO" and f'"name":"{record_name}"' in registered.text.replace(" ", "")
    # The converter registers the envelope's `source` record apart, which the envelope names: the
    # client fetched it with the envelope (a schema reference).
    assert any('"name":"Source"' in text.replace(" ", "") for text in registered.references)

    settings = local_settings(
        kafka, topic, tmp_path, max_offsets_per_trigger=1000, schema_registry={"url": schema_registry.url}
    )
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    create_table(catalog, PLACES)
    first = run(settings, PLACES, until_idle=True, spark=spark)
    table = catalog.load_table(PLACES.table)
    assert iceberg_state(table) == postgis_state(postgis), first

    # The schema change while the stream runs: a new version of the value schema, a new id.
    with connect_db(postgis) as conn, conn.cursor() as cur:
        cur.execute("ALTER TABLE places ADD COLUMN height double precision")
    expected_records += change_records(row_count(postgis), ROWS // 4)
    apply_changes(postgis, rng, next_id, ROWS // 4, with_height=True)
    unknown = b"\x00" + struct.pack(">I", 987_654) + sample.value[5:]
    assert produce_records(kafka.bootstrap, topic, [(b"unknown-id", unknown, [])]) == 1
    wait_for_records(kafka.bootstrap, topic, expected_records + 1, kafka_connect)
    second = run(settings, PLACES, until_idle=True, spark=spark)

    expected = postgis_state(postgis)
    state = iceberg_state(table)
    differing = [i for i in expected.keys() & state.keys() if expected[i] != state[i]]
    assert state == expected, (len(expected.keys() - state.keys()), len(state.keys() - expected.keys()), differing[:5])
    assert "height" in table.schema().column_names, "the column added in PostGIS reached the table"
    assert any(h is not None for _, h, _ in expected.values())
    for totals in (first, second):
        assert totals.commits == {"committed": totals.batches}
    assert first.consumed + second.consumed == expected_records + 1

    # Every record is in the table or a dead letter: only the one with the unknown schema id is.
    dead = dead_letters(kafka.bootstrap, settings.dead_letter_topic)
    assert [(d.key, d.reason) for d in dead.values()] == [(b"unknown-id", "unknown_schema_id")]
    assert next(iter(dead.values())).value == unknown

    con = duckdb_connection()
    con.execute("SET enable_geoparquet_conversion = false")
    found = con.execute(f"SELECT id, name, height, geometry FROM iceberg_scan('{table.metadata_location}')").fetchall()
    assert {i: (name, h, normalised(bytes(g))) for i, name, h, g in found} == expected

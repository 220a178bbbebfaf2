"""The local Kafka Connect worker with Debezium's PostgreSQL connector, for real: PostGIS rows
inserted, updated and deleted come out on the broker as Debezium change events."""

from __future__ import annotations

import base64
import json
import time

import pytest
import shapely
from kafka import KafkaConsumer

from app.local.kafka_connect import LocalKafkaConnect
from tests.debezium import connect_db, kafka_connect, postgis, start_connector  # noqa: F401
from tests.postgres import PostgresServer

pytestmark = pytest.mark.integration


def consume(bootstrap: str, topic: str, n: int, timeout_s: float = 90) -> list:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=1000)
    records: list = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(records) < n and time.monotonic() < deadline:
            records += list(consumer)
    finally:
        consumer.close()
    return records


@pytest.mark.parametrize("schemas", [True, False], ids=["schemas", "bare"])
def test_postgis_changes_come_out_as_debezium_events_with_their_geometry(
    postgis: PostgresServer, kafka_connect: LocalKafkaConnect, schemas: bool
) -> None:
    table = f"places_{'s' if schemas else 'b'}"
    with connect_db(postgis) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text, geom geometry(Point, 4326))")
        cur.execute(f"INSERT INTO {table} VALUES (1, 'snapshot', ST_SetSRID(ST_MakePoint(2.35, 48.85), 4326))")
    prefix, _ = start_connector(kafka_connect, postgis, [f"public.{table}"], schemas=schemas)
    with connect_db(postgis) as conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO {table} VALUES (2, 'streamed', ST_SetSRID(ST_MakePoint(-0.12, 51.5), 4326))")
        cur.execute(f"UPDATE {table} SET geom = ST_SetSRID(ST_MakePoint(13.4, 52.5), 4326) WHERE id = 1")
        cur.execute(f"DELETE FROM {table} WHERE id = 2")

    # snapshot read, insert, update, delete and the delete's tombstone
    records = consume(kafka_connect.bootstrap, f"{prefix}.public.{table}", 5)
    assert len(records) == 5, kafka_connect.log_tail()
    # The topic has several partitions: each key's changes keep their order within its partition.
    by_key: dict[int, list] = {}
    for record in records:
        key = json.loads(record.key)
        value = json.loads(record.value) if record.value is not None else None
        by_key.setdefault((key["payload"] if schemas else key)["id"], []).append(value)
    payloads = {k: [v["payload"] if schemas and v is not None else v for v in vs] for k, vs in by_key.items()}
    assert {k: [p["op"] if p else None for p in ps] for k, ps in payloads.items()} == {
        1: ["r", "u"],
        2: ["c", "d", None],
    }
    moved = payloads[1][1]["after"]["geom"]
    assert moved["srid"] == 4326
    geometry = shapely.from_wkb(base64.b64decode(moved["wkb"]))
    assert (geometry.x, geometry.y) == (13.4, 52.5)
    deleted = payloads[2][1]
    assert deleted["before"]["id"] == 2 and deleted["after"] is None
    assert deleted["source"]["lsn"] > payloads[2][0]["source"]["lsn"]
    if schemas:
        after = next(f for f in by_key[1][1]["schema"]["fields"] if f["field"] == "after")
        geom = next(f for f in after["fields"] if f["field"] == "geom")
        assert geom["name"] == "io.debezium.data.geometry.Geometry"


def test_a_restarted_worker_resumes_after_the_changes_it_sent(
    postgis: PostgresServer, kafka_connect: LocalKafkaConnect
) -> None:
    with connect_db(postgis) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE resumed (id bigint PRIMARY KEY, geom geometry(Point, 4326))")
        cur.execute("INSERT INTO resumed VALUES (1, ST_SetSRID(ST_MakePoint(1, 1), 4326))")
    prefix, connectors = start_connector(kafka_connect, postgis, ["public.resumed"], schemas=False)
    topic = f"{prefix}.public.resumed"
    assert len(consume(kafka_connect.bootstrap, topic, 1)) == 1
    kafka_connect.stop()
    with connect_db(postgis) as conn, conn.cursor() as cur:  # made while the worker is down
        cur.execute("INSERT INTO resumed VALUES (2, ST_SetSRID(ST_MakePoint(2, 2), 4326))")
    kafka_connect.start(connectors)
    # Waits for a third record for a while: the snapshot's read sent again would be one.
    records = consume(kafka_connect.bootstrap, topic, 3, timeout_s=20)
    ops = [(json.loads(r.key)["id"], json.loads(r.value)["op"]) for r in records]
    assert ops.count((1, "r")) == 1, "the snapshot is not taken again: its offsets were kept"
    assert (2, "c") in ops, kafka_connect.log_tail()

"""Large values of a PostGIS table through the real Debezium connector (3.6.1, pgoutput, the JSON
converter), decoded by the Decoder: a 12,000-character text, 3,200 bytes of bytea, a double that
is sometimes NaN and a 600-vertex polygon per row, under REPLICA IDENTITY DEFAULT and FULL, with
and without the reselect post-processor; updates of other columns, deletes. No placeholder is
stored, no update rejected, `_unavailable` names exactly the columns an event lacked, and FULL
events lack none."""

from __future__ import annotations

import base64
import json
import time
import uuid

import numpy as np
import pytest
import shapely
from kafka import KafkaConsumer, TopicPartition

from app.local.kafka_connect import LocalKafkaConnect, debezium_postgres_config
from streaming.decode.decoder import DELETE, HILBERT, REJECT_DETAIL, REJECT_REASON, UNAVAILABLE, Decoder
from tests.debezium import connect_db, kafka_connect, postgis, source_of  # noqa: F401
from tests.postgres import PostgresServer
from tests.streaming.decode.formats.test_debezium import LARGE, UNAVAILABLE_TEXT
from tests.streaming.decode.test_decoder import kafka_batch

pytestmark = pytest.mark.integration

ROWS = 12  # per table: the first half updated and kept, the second half deleted
KEPT = ROWS // 2
# The contract's column of each source column the placeholder may stand for, in the contract's order.
COLUMNS = {"name": "name", "note": "notes", "blob": "blob"}


def create(cur, table: str, identity: str) -> None:
    cur.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text NOT NULL, note text NOT NULL, "
        "score float8, blob bytea NOT NULL, geom geometry(Polygon, 4326) NOT NULL)"
    )
    cur.execute(f"ALTER TABLE {table} REPLICA IDENTITY {identity}")
    # Random text and bytes (incompressible: stored out of the row), a 601-point ring; every
    # third score NaN.
    cur.execute(
        f"""INSERT INTO {table}
        SELECT i, 'place ' || i,
               (SELECT string_agg(md5(random()::text || i || j), '') FROM generate_series(1, 375) j),
               CASE WHEN i % 3 = 0 THEN 'NaN'::float8 ELSE i + 0.25 END,
               (SELECT decode(string_agg(md5(random()::text || i || j), ''), 'hex') FROM generate_series(1, 200) j),
               ST_SetSRID(ST_Buffer(ST_MakePoint(i, 45), 0.5, 150), 4326)
        FROM generate_series(1, {ROWS}) i"""
    )


def changes(server: PostgresServer) -> None:
    with connect_db(server) as conn, conn.cursor() as cur:
        # DEFAULT: updates of other columns than the large ones, then one that moves the polygon
        # and one that changes the text; the second half renamed and deleted in one transaction
        # (the reselect post-processor finds no row for their updates).
        cur.execute(f"UPDATE big_default SET score = score + 1 WHERE id <= {KEPT}")
        cur.execute("UPDATE big_default SET geom = ST_Translate(geom, 0.125, 0) WHERE id = 1")
        cur.execute("UPDATE big_default SET note = note || '!' WHERE id = 2")
        cur.execute("BEGIN")
        cur.execute(f"UPDATE big_default SET name = 'renamed ' || id WHERE id > {KEPT}")
        cur.execute(f"DELETE FROM big_default WHERE id > {KEPT}")
        cur.execute("COMMIT")
        # FULL: scores set to NaN, then renames (their old score NaN), deletes (some old scores NaN).
        cur.execute(f"UPDATE big_full SET score = 'NaN' WHERE id <= {KEPT}")
        cur.execute(f"UPDATE big_full SET name = 'renamed ' || id WHERE id <= {KEPT}")
        cur.execute(f"DELETE FROM big_full WHERE id > {KEPT}")


# Records of each topic: the snapshot, then the changes above (a delete is an event and its tombstone).
RECORDS = {"big_default": ROWS + KEPT + 2 + 3 * (ROWS - KEPT), "big_full": ROWS + 2 * KEPT + 2 * (ROWS - KEPT)}


def records(bootstrap: str, topic: str, n: int, worker: LocalKafkaConnect, timeout_s: float = 180) -> list:
    """The topic's first n records, each partition's in order."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=2000)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
            if partitions and sum(consumer.end_offsets(partitions).values()) >= n:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"fewer than {n} records on {topic}:\n{worker.log_tail()}")
            time.sleep(0.5)
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        found = []
        while len(found) < n and time.monotonic() < deadline:
            found += list(consumer)
        return sorted(found, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def lacking(value: bytes | None) -> list[str] | None:
    """The contract columns the event did not carry, read from the event itself."""
    event = json.loads(value) if value is not None else None
    if event is None or event["op"] != "u":
        return None
    after = event["after"]
    placeholders = (UNAVAILABLE_TEXT, base64.b64encode(UNAVAILABLE_TEXT.encode()).decode())
    names = [column for source, column in COLUMNS.items() if after[source] in placeholders]
    names += ["geometry"] if after["geom"] is None else []
    return names or None


def source_rows(server: PostgresServer, table: str) -> dict[int, tuple]:
    with connect_db(server) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id, name, note, score, blob, ST_AsBinary(geom) FROM {table}")
        return {r[0]: (r[1], r[2], r[3], bytes(r[4]), bytes(r[5])) for r in cur.fetchall()}


def test_large_values_under_both_identities_are_never_stored_as_placeholders_nor_rejected(
    kafka, postgis: PostgresServer, kafka_connect: LocalKafkaConnect
) -> None:
    with connect_db(postgis) as conn, conn.cursor() as cur:
        create(cur, "big_default", "DEFAULT")
        create(cur, "big_full", "FULL")
        cur.execute(
            "SELECT max(pg_column_size(note)), max(pg_column_size(blob)), max(ST_NPoints(geom)) FROM big_default"
        )
        assert cur.fetchone() == (12_000, 3_200, 601)
    tables = ["public.big_default", "public.big_full"]
    suffix = uuid.uuid4().hex[:8]
    prefixes = {reselect: f"dbz{suffix}{'r' if reselect else 'p'}" for reselect in (False, True)}
    connectors = {
        f"pg-{prefix}": debezium_postgres_config(
            source_of(postgis), tables, prefix, f"slot_{prefix}", schemas=False, reselect=reselect
        )
        for reselect, prefix in prefixes.items()
    }
    kafka_connect.start(connectors)
    for prefix in prefixes.values():  # the snapshots first: their reads hold every value
        records(kafka.bootstrap, f"{prefix}.public.big_default", ROWS, kafka_connect)
    changes(postgis)
    current = {table: source_rows(postgis, table) for table in RECORDS}

    decoder = Decoder(LARGE)
    placeholder_bytes = UNAVAILABLE_TEXT.encode()
    for reselect, prefix in prefixes.items():
        for table, n in RECORDS.items():
            found = records(kafka.bootstrap, f"{prefix}.public.{table}", n, kafka_connect)
            assert len(found) == n, (table, len(found))
            rows = decoder.decode(kafka_batch([r.value for r in found], [r.key for r in found])).to_pylist()
            events = [json.loads(r.value) if r.value is not None else None for r in found]
            where = f"{table}, reselect {reselect}"
            for row, event in zip(rows, events):
                assert row[REJECT_REASON] is None, (where, row[REJECT_REASON], row[REJECT_DETAIL])
                assert UNAVAILABLE_TEXT not in (row["name"], row["notes"]) and row["blob"] != placeholder_bytes
                if event is not None and event["op"] == "d":
                    assert row[DELETE] and row["id"] == event["before"]["id"]
                elif event is not None:
                    assert not row[DELETE] and row["id"] == event["after"]["id"]
                    score = event["after"]["score"]
                    assert np.isnan(row["score"]) if score == "NaN" else row["score"] == score
            lacked = [lacking(r.value) for r in found]
            assert [row[UNAVAILABLE] for row in rows] == lacked, where
            for row, names in zip(rows, lacked):
                if names and "geometry" in names:
                    assert (row["geometry"], row["bbox"], row[HILBERT]) == (None, None, None)
            # Each key's updates, in order (one key's changes keep their order in its partition).
            updates: dict[int, list] = {}
            for event, names in zip(events, lacked):
                if event is not None and event["op"] == "u":
                    updates.setdefault(event["after"]["id"], []).append(names)
            last = {row["id"]: row for row, e in zip(rows, events) if e and e["op"] == "u" and row["id"] <= KEPT}
            if table == "big_full":
                # FULL: every update complete, its whole old row in before (NaN scores among them)
                assert all(names is None for each in updates.values() for names in each), where
                olds = [e["before"] for e in events if e is not None and e["op"] in ("u", "d")]
                assert len(olds) == 2 * KEPT + ROWS - KEPT and any(old["score"] == "NaN" for old in olds)
                assert all(UNAVAILABLE_TEXT not in (old["note"], old["name"]) for old in olds)
            else:
                # DEFAULT: an update lacks the large values it left unchanged, unless the
                # post-processor found its row (not for the rows deleted in the same transaction).
                everything = ["notes", "blob", "geometry"]
                expected = {key: [everything] for key in range(1, ROWS + 1)}
                expected[1].append(["notes", "blob"])  # the update that moved the polygon
                expected[2].append(["blob", "geometry"])  # the update of the text
                if reselect:
                    expected.update({key: [None] * len(expected[key]) for key in range(1, KEPT + 1)})
                assert updates == expected, where
            # The last update of each kept row, when complete, is the row as it is now.
            assert sorted(last) == list(range(1, KEPT + 1))
            for key, row in last.items():
                if row[UNAVAILABLE] is None:
                    name, note, score, blob, wkb = current[table][key]
                    assert (row["name"], row["notes"], row["blob"]) == (name, note, blob), (where, key)
                    assert np.isnan(row["score"]) if np.isnan(score) else row["score"] == score
                    assert shapely.equals(shapely.from_wkb(row["geometry"]), shapely.from_wkb(wkb))
            if table == "big_full" or reselect:
                assert all(row[UNAVAILABLE] is None for row in last.values()), where

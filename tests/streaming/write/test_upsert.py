"""Upsert tables (contract `mode: upsert`): one current row per primary key, tombstones delete.

The pure part (streaming/write/upsert.py) on hard-coded values; then the real service (broker, Spark,
SQLite catalog) over a stream of creations, updates that move features across the map and
tombstones, checked at every snapshot against the state computed from the produced records."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import shapely

from app.service import run
from app.settings import load_settings
from streaming.contract import load_contract, parse_contract
from streaming.maintenance.maintain import maintain
from streaming.maintenance.plan import MaintenancePolicy
from streaming.read.predicate import Predicate
from streaming.read.query import query
from streaming.table.catalog import create_table, open_catalog
from streaming.table.commit import KAFKA_OFFSETS
from streaming.table.deletes import snapshot_files
from streaming.write.upsert import OFFSET, PARTITION, TIMESTAMP, latest_versions
from tests.conftest import CACHE_DIR, duckdb_connection, produce_records
from tests.iceberg_spark import run_with_iceberg_spark

ROOT = Path(__file__).resolve().parents[3]
DEMO = json.loads((ROOT / "schemas" / "demo_events.json").read_text())
WORLD = Predicate.from_bbox((-180.0, -90.0, 180.0, 90.0))


# -- the versions of a batch ------------------------------------------------------------------------
def rows_of(keys, partitions, offsets, timestamps) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(keys, pa.string()),
            PARTITION: pa.array(partitions, pa.int32()),
            OFFSET: pa.array(offsets, pa.int64()),
            TIMESTAMP: pa.array(timestamps, pa.int64()),
        }
    )


def test_the_last_version_of_each_key_wins_and_a_final_tombstone_writes_nothing():
    rows = rows_of(["a", "b", "a", "c", "b"], [0, 0, 0, 1, 0], [1, 2, 3, 4, 5], [10, 10, 10, 10, 10])
    tombstones = rows_of(["c", "b"], [1, 0], [9, 4], [11, 10])
    latest, touched = latest_versions(rows, tombstones, ("k",))
    # a: offset 3 wins; b: the tombstone at 4 is followed by a version at 5; c: deleted at 9.
    assert latest.column(OFFSET).to_pylist() == [3, 5]
    assert latest.column("k").to_pylist() == ["a", "b"]
    assert sorted(touched.column("k").to_pylist()) == ["a", "b", "c"]


def test_across_partitions_the_later_timestamp_wins_whatever_the_offsets():
    rows = rows_of(["a", "a", "a"], [0, 1, 1], [900, 5, 6], [100, 200, 150])
    latest, _ = latest_versions(rows, rows_of([], [], [], []), ("k",))
    assert (latest.column(PARTITION).to_pylist(), latest.column(OFFSET).to_pylist()) == ([1], [6]), (
        "partition 1's last (offset 6) beats partition 0's: its last record is newer by timestamp"
    )


def test_keys_of_several_columns_are_told_apart_by_every_column():
    rows = rows_of(["a", "a", "b"], [0, 0, 0], [1, 2, 3], [1, 1, 1]).append_column("j", pa.array([1, 2, 1]))
    latest, touched = latest_versions(rows, pa.table({}), ("k", "j"))
    assert latest.num_rows == 3 and touched.num_rows == 3


# -- through the service ----------------------------------------------------------------------------
def make_stream(
    n_keys: int, n_events: int, seed: int, key_of: Callable[[int], bytes] = lambda k: f"k{k}".encode()
) -> list[tuple[bytes, bytes | None, list]]:
    """Every key created once, then updates that move features anywhere on the map and 10 % tombstones;
    the Kafka key of key number k is key_of(k)."""
    rng = np.random.default_rng(seed)
    records = []
    alive: set[int] = set()
    version = dict.fromkeys(range(n_keys), 0)
    order = list(range(n_keys)) + rng.integers(0, n_keys, n_events - n_keys).tolist()
    for key in order:
        name = key_of(key)
        if key in alive and rng.random() < 0.1:
            records.append((name, None, []))
            alive.discard(key)
            continue
        version[key] += 1
        lon, lat = round(float(rng.uniform(-179, 179)), 5), round(float(rng.uniform(-80, 80)), 5)
        feature = {
            "type": "Feature",
            "id": f"k{key}",
            "properties": {"kind": "probe", "speed": float(version[key])},
            "geometry": {"type": "Point", "coordinates": [lon, lat]},
        }
        records.append((name, json.dumps(feature).encode(), []))
        alive.add(key)
    return records


def expected_state(records: list, as_text: bool = True) -> dict:
    """Every key's last version in production order (a key's records share a partition, so this is
    the Kafka order the table follows), by key as text (or as the bytes it is)."""
    state: dict[str | bytes, tuple | None] = {}
    for key, value, _ in records:
        name = key.decode() if as_text else key
        if value is None:
            state[name] = None
        else:
            doc = json.loads(value)
            state[name] = (*doc["geometry"]["coordinates"], doc["properties"]["speed"])
    return {k: v for k, v in state.items() if v is not None}


def reference_state(records, positions: dict[int, list[int]], upto: dict[int, int]) -> dict[str, tuple]:
    """key -> (lon, lat, speed) after the records of each partition up to `upto[partition]` (inclusive)."""
    state: dict[str, tuple | None] = {}
    for partition, indices in positions.items():
        for offset, i in enumerate(indices):
            if offset > upto.get(partition, -1):
                break
            key, value, _ = records[i]
            if value is None:
                state[key.decode()] = None
            else:
                doc = json.loads(value)
                state[key.decode()] = (*doc["geometry"]["coordinates"], doc["properties"]["speed"])
    return {k: v for k, v in state.items() if v is not None}


def table_state(table, snapshot_id: int | None = None) -> dict:
    result = query(table, WORLD, snapshot_id=snapshot_id).table
    points = shapely.from_wkb(result.column("geometry").to_numpy(zero_copy_only=False))
    ids = result.column("event_id").to_pylist()
    assert len(ids) == len(set(ids)), "one row per key"
    return {
        key: (round(float(shapely.get_x(p)), 5), round(float(shapely.get_y(p)), 5), speed)
        for key, p, speed in zip(ids, points, result.column("speed").to_pylist())
    }


SPARK_READER = """
import json, sys
from pathlib import Path
from app.spark import spark_session
cache, jars, location, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
spark = spark_session("local[1]", cache, "1g", extra_jars=[Path(j) for j in jars.split(",")])
rows = spark.read.format("iceberg").load(location).select("event_id", "geometry", "speed").collect()
json.dump([[r.event_id, bytes(r.geometry).hex(), r.speed] for r in rows], open(out, "w"))
spark.stop()
"""


def spark_iceberg_state(metadata_location: str, tmp_path: Path) -> dict[str, tuple]:
    """The table as Spark with Iceberg's own runtime reads it (equality deletes applied by Iceberg)."""
    state = {}
    for key, geometry, speed in run_with_iceberg_spark(SPARK_READER, tmp_path, metadata_location):
        assert key not in state, f"Spark reads {key} twice"
        point = shapely.from_wkb(bytes.fromhex(geometry))
        state[key] = (round(float(shapely.get_x(point)), 5), round(float(shapely.get_y(point)), 5), speed)
    return state


def duckdb_rows_and_keys(metadata_location: str) -> tuple[int, int]:
    """(rows, distinct event_ids) as DuckDB's iceberg_scan reads the table (equality deletes applied)."""
    con = duckdb_connection()
    con.execute("SET enable_geoparquet_conversion = false")
    rows, keys = con.execute(
        f"SELECT count(*), count(DISTINCT event_id) FROM iceberg_scan('{metadata_location}')"
    ).fetchone()
    return rows, keys


def record_positions(bootstrap: str, topic: str, records: list) -> dict[int, list[int]]:
    """Per partition, the produced records in offset order, as indices into `records` (the
    versions of a key keep their order: they share a partition)."""
    messages = partition_positions(bootstrap, topic, len(records))
    by_key: dict[bytes, list[int]] = {}
    for i, (key, _, _) in enumerate(records):
        by_key.setdefault(key, []).append(i)
    seen: dict[bytes, int] = {}
    positions: dict[int, list[int]] = {}
    for (partition, _), message in sorted(messages.items()):
        n = seen.get(message.key, 0)
        seen[message.key] = n + 1
        positions.setdefault(partition, []).append(by_key[message.key][n])
    return positions


def every_snapshot_matches(table, topic: str, records: list, positions: dict[int, list[int]]) -> int:
    """Check that every snapshot holds the state the records it covers make; returns how many."""
    upto: dict[int, int] = {}
    checked = 0
    for snapshot in sorted(table.metadata.snapshots, key=lambda s: s.sequence_number):
        offsets = (snapshot.summary or {}).get(KAFKA_OFFSETS)
        if offsets:
            for partition, (_, last) in json.loads(offsets).get(topic, {}).items():
                upto[int(partition)] = max(upto.get(int(partition), -1), int(last))
        assert table_state(table, snapshot.snapshot_id) == reference_state(records, positions, upto), (
            f"snapshot {snapshot.snapshot_id} ({(snapshot.summary or {}).get('operation')})"
        )
        checked += 1
    return checked


def partition_positions(bootstrap: str, topic: str, n: int) -> dict:
    """(partition, offset) -> the message there, read back from the broker."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=10_000
    )
    try:
        found = {}
        for message in consumer:
            found[(message.partition, message.offset)] = message
            if len(found) == n:
                break
    finally:
        consumer.close()
    return found


@pytest.mark.integration
@pytest.mark.parametrize("clustering", ["batch", "task"])
def test_every_snapshot_of_an_upsert_table_holds_exactly_the_current_versions(
    kafka, spark, topic, tmp_path, clustering
):
    contract = parse_contract({**DEMO, "mode": "upsert"})
    records = make_stream(n_keys=2_000, n_events=20_000, seed=4)
    assert produce_records(kafka.bootstrap, topic, records) == len(records)
    positions = record_positions(kafka.bootstrap, topic, records)

    settings = load_settings(
        env={},
        bootstrap_servers=kafka.bootstrap,
        topic=topic,
        catalog={"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path / 'wh'}"},
        checkpoint_location=str(tmp_path / "ck"),
        metrics_port=0,
        cache_dir=str(CACHE_DIR),
        max_offsets_per_trigger=2_500,
        clustering=clustering,
    )
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.commits.get("failed", 0) == 0 and totals.batches >= 8

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    assert every_snapshot_matches(table, topic, records, positions) >= totals.batches
    final = reference_state(records, positions, {p: len(indices) - 1 for p, indices in positions.items()})
    assert len(final) > 1_000 and table_state(table) == final
    if clustering == "batch":
        assert spark_iceberg_state(table.metadata_location, tmp_path) == final, "Spark's Iceberg reader agrees"
        assert duckdb_rows_and_keys(table.metadata_location) == (len(final), len(final)), (
            "DuckDB's iceberg_scan applies the equality deletes"
        )

    # pyiceberg 0.12 cannot plan a scan that meets equality deletes (docs/upsert.md says so) ...
    with pytest.raises(ValueError, match="equality deletes"):
        list(table.scan().plan_files())

    # Compaction applies the deletes: the files it writes hold only current versions.
    report = maintain(
        table,
        MaintenancePolicy(min_file_age_s=0, snapshot_max_age_s=0, keep_snapshots=1, orphan_min_age_s=0),
        steps=("compact", "expire"),
    )
    assert report.compaction is not None and report.compaction.files_rewritten > 0
    table.refresh()
    assert table_state(table) == final
    assert snapshot_files(table, table.current_snapshot()).reaching_deletes() == [], (
        "every file older than the delete files was rewritten: readers need not load them"
    )

    # ... until every data file is newer than every delete file: then it reads the current rows too.
    by_pyiceberg = table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()
    assert sorted(by_pyiceberg) == sorted(final)


def test_a_tombstone_of_an_append_table_is_still_a_null_value_reject():
    contract = load_contract(ROOT / "schemas" / "demo_events.json")
    from streaming.write.upsert import tombstone_key_column

    assert tombstone_key_column(contract) is None
    assert tombstone_key_column(parse_contract({**DEMO, "mode": "upsert"})) == "event_id"


def binary_key(k: int) -> bytes:
    """A Kafka key that is no UTF-8 text (0xff and a lone continuation byte never are)."""
    return b"\xff" + k.to_bytes(2, "big") + b"\x80"


@pytest.mark.integration
def test_an_upsert_table_keyed_by_bytes_that_are_no_text_reads_and_compacts_to_the_current_rows(
    kafka, spark, topic, tmp_path
):
    columns = [
        {**c, "type": "binary", "from": ["kafka.key"]} if c["name"] == "event_id" else c for c in DEMO["columns"]
    ]
    contract = parse_contract({**DEMO, "mode": "upsert", "columns": columns})
    records = make_stream(n_keys=300, n_events=3_000, seed=8, key_of=binary_key)
    assert produce_records(kafka.bootstrap, topic, records) == len(records)
    assert sum(1 for _, value, _ in records if value is None) > 100, "tombstones of binary keys too"
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path / 'wh'}"}
    settings = load_settings(
        env={},
        bootstrap_servers=kafka.bootstrap,
        topic=topic,
        catalog=catalog,
        checkpoint_location=str(tmp_path / "ck"),
        metrics_port=0,
        cache_dir=str(CACHE_DIR),
        max_offsets_per_trigger=1_000,
    )
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.commits == {"committed": totals.batches} and totals.batches >= 3
    assert totals.rejected == {}, "every tombstone deletes its key: none is a null_value reject"

    final = expected_state(records, as_text=False)
    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    assert 100 < len(final) < 300 and table_state(table) == final

    # geoingest query, as a user runs it: every current row once, its id the key in base64.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GEOINGEST_")},
        "GEOINGEST_CATALOG__URI": catalog["uri"],
        "GEOINGEST_CATALOG__WAREHOUSE": catalog["warehouse"],
    }
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "geoingest"),
            "query",
            "--table",
            contract.table,
            "--bbox=-180,-90,180,90",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    features = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(features) == len(final)
    assert {
        base64.b64decode(f["id"]): (*(round(v, 5) for v in f["geometry"]["coordinates"]), f["properties"]["speed"])
        for f in features
    } == final

    # Compaction applies the deletes to binary keys: the files it writes hold the current rows only.
    report = maintain(
        table,
        MaintenancePolicy(min_file_age_s=0, snapshot_max_age_s=0, keep_snapshots=1, orphan_min_age_s=0),
        steps=("compact", "expire"),
    )
    assert report.compaction is not None and report.compaction.files_rewritten > 0
    table.refresh()
    assert snapshot_files(table, table.current_snapshot()).reaching_deletes() == []
    assert table_state(table) == final
    by_pyiceberg = table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()
    assert sorted(by_pyiceberg) == sorted(final)

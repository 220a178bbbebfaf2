"""Nested and typed columns through the real service (broker, Spark, SQLite catalog): generated
column types (structs, lists of structs, maps, decimals, dates, times, timestamps, UUIDs, fixed and
binary, three levels deep) and generated values, sent as GeoJSON properties and as plain JSON
fields, land as sent, and pyiceberg, DuckDB and Spark with Iceberg's own runtime read every value
back; a value that does not fit its nested type is a dead letter naming its path."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import shapely
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from app.service import run
from streaming.contract import check_fresh_ids, parse_contract
from streaming.maintenance.maintain import maintain
from streaming.maintenance.plan import MaintenancePolicy
from streaming.read.output import to_geojson_lines
from streaming.read.predicate import Predicate
from streaming.read.query import query
from streaming.table.catalog import create_table, open_catalog
from streaming.write.dead_letter import DETAIL_HEADER, REASON_HEADER
from tests.conftest import duckdb_connection, local_settings, produce_records
from tests.iceberg_spark import run_with_iceberg_spark
from tests.nested_values import PRIMITIVES, as_geojson_out, empty_for_null, plain, random_type, random_value
from tests.streaming.job.test_reliability import consume_all

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
DEMO = json.loads((ROOT / "schemas" / "demo_events.json").read_text())
EVENTS = 400
# Every kind at least once, beside the generated ones: a list of structs, a map of decimals, a struct
# holding a list and a map.
FIXED_TYPES = [
    {
        "type": "list",
        "element": {
            "type": "struct",
            "fields": [{"name": "at", "type": "timestamptz"}, {"name": "v", "type": "double"}],
        },
    },
    {"type": "map", "key": "string", "value": "decimal(12, 2)"},
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "required": True},
            {"name": "tags", "type": {"type": "list", "element": "string"}},
            {"name": "since", "type": "date"},
        ],
    },
    *PRIMITIVES,
]
_NUMBER = re.compile(r'"\\u0000number:([-0-9.eE+]+)"')

SPARK_READ = """
import sys
from pathlib import Path
from app.spark import spark_session
cache, jars, location, parquet, answer = sys.argv[1:6]
spark = spark_session("local[1]", cache, "1g", extra_jars=[Path(j) for j in jars.split(",")])
spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
spark.read.format("iceberg").load(location).drop("geometry", "bbox").coalesce(1).write.parquet(parquet)
open(answer, "w").write("{}")
spark.stop()
"""


def contract_of(types: list[Any], fmt: str) -> dict:
    """A table with a column per type, read from `properties.c<i>` (GeoJSON) or `json.payload.c<i>`."""
    columns = [
        {
            "id": 1,
            "name": "event_id",
            "type": "string",
            "required": True,
            "from": ["id"] if fmt == "geojson" else ["json.id"],
        }
    ]
    for i, kind in enumerate(types):
        source = f"properties.c{i}" if fmt == "geojson" else f"json.payload.c{i}"
        columns.append({"id": i + 2, "name": f"c{i}", "type": kind, "from": [source]})
    n = len(columns)
    raw = {
        "table": f"nested.events_{fmt}",
        "formats": [fmt],
        "columns": columns,
        "geometry": {**DEMO["geometry"], "id": n + 1},
        "bbox": {**DEMO["bbox"], "id": n + 2},
    }
    if fmt == "json":
        raw["json"] = {"lon": "lon", "lat": "lat"}
    return raw


def numbers_unquoted(text: str) -> str:
    return _NUMBER.sub(r"\1", text)


def as_sent(value: Any, kind: Any, rng: np.random.Generator) -> Any:
    """Decimals as JSON numbers half the time (strings otherwise), as producers send both."""
    if value is None:
        return None
    if isinstance(kind, dict):
        if kind["type"] == "struct":
            by_name = {f["name"]: f["type"] for f in kind["fields"]}
            return {k: as_sent(v, by_name[k], rng) for k, v in value.items()}
        if kind["type"] == "list":
            return [as_sent(v, kind["element"], rng) for v in value]
        return {k: as_sent(v, kind["value"], rng) for k, v in value.items()}
    if isinstance(kind, str) and kind.startswith("decimal") and rng.random() < 0.5:
        return "\u0000number:" + value
    return value


def make_events(types: list[Any], fmt: str, seed: int) -> tuple[list[bytes], dict[str, list[Any]]]:
    rng = np.random.default_rng(seed)
    values, expected = [], {}
    for e in range(EVENTS):
        sent, back = {}, []
        for i, kind in enumerate(types):
            value, plain_value = random_value(rng, kind)
            if value is not None or rng.random() < 0.5:
                sent[f"c{i}"] = as_sent(value, kind, rng)
            back.append(plain_value)
        lon, lat = float(rng.uniform(-170, 170)), float(rng.uniform(-80, 80))
        if fmt == "geojson":
            doc = {
                "type": "Feature",
                "id": f"e{e}",
                "geometry": {"type": "Point", "coordinates": [lon, lat]},
                "properties": sent,
            }
        else:
            doc = {"id": f"e{e}", "lon": lon, "lat": lat, "payload": sent}
        values.append(numbers_unquoted(json.dumps(doc)).encode())
        expected[f"e{e}"] = back
    return values, expected


def compare(
    rows: dict[str, list[Any]], expected: dict[str, list[Any]], types: list[Any], reader: str, seen=lambda v, k: v
) -> None:
    """Every event's values as `reader` read them equal to those sent, both seen through `seen`."""
    assert rows.keys() == expected.keys(), f"{reader}: other events than sent"
    for event_id, want in expected.items():
        for i, (value, sent, kind) in enumerate(zip(rows[event_id], want, types, strict=True)):
            got, sent = seen(plain(value, kind), kind), seen(sent, kind)
            assert got == sent, f"{reader}: {event_id}.c{i} ({kind}): read {got!r}, sent {sent!r}"


@pytest.mark.parametrize(
    ("fmt", "clustering", "source", "with_spark"),
    [("geojson", "batch", "spark-kafka", True), ("json", "task", "python", False)],
)
def test_generated_nested_values_land_as_sent_and_every_reader_reads_them_back(
    kafka, spark, topic, tmp_path, fmt, clustering, source, with_spark
) -> None:
    rng = np.random.default_rng(45)
    # Spark's Iceberg runtime refuses a table with a time column ("Spark does not support time
    # fields"): the run Spark reads has none.
    primitives = [p for p in PRIMITIVES if p != "time" or not with_spark]
    generated = [random_type(rng, 3) for _ in range(12)]
    types = [t for t in [*FIXED_TYPES, *generated] if t in primitives or isinstance(t, dict)]
    if with_spark:
        types = [t for t in types if "time" not in json.dumps(t).replace("timestamp", "")]
    raw = contract_of(types, fmt)
    contract = parse_contract(raw)
    check_fresh_ids(contract)
    values, expected = make_events(types, fmt, seed=7)
    assert produce_records(kafka.bootstrap, topic, [(None, v, []) for v in values]) == len(values)

    settings = local_settings(kafka, topic, tmp_path, clustering=clustering, source=source, max_offsets_per_trigger=150)
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.commits.get("failed", 0) == 0 and totals.batches >= 2
    assert not totals.rejected and totals.committed_rows == EVENTS, totals

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    names = [f"c{i}" for i in range(len(types))]
    read = table.scan().to_arrow()
    rows = {r["event_id"]: [r[n] for n in names] for r in read.to_pylist()}
    compare(rows, expected, types, "pyiceberg", empty_for_null)

    # `geoingest query` reads the data files itself (by field id) and writes GeoJSON that keeps the nesting.
    result = query(table, Predicate("intersects", shapely.box(-180, -90, 180, 90)))
    features = [json.loads(line) for line in to_geojson_lines(result, "geometry", "event_id")]
    assert {f["id"] for f in features} == expected.keys()
    for feature in features:
        want = [as_geojson_out(v, k) for v, k in zip(expected[feature["id"]], types, strict=True)]
        assert [feature["properties"][n] for n in names] == want, feature["id"]

    con = duckdb_connection()
    con.execute("SET TimeZone = 'UTC'")
    found = con.execute(
        f"SELECT event_id, {', '.join(names)} FROM iceberg_scan('{table.metadata_location}')"
    ).fetchall()
    compare({r[0]: list(r[1:]) for r in found}, expected, types, "DuckDB")

    if with_spark:
        out = tmp_path / "spark.parquet"
        run_with_iceberg_spark(SPARK_READ, tmp_path, table.metadata_location, str(out))
        spark_rows = pq.read_table(out).to_pylist()
        compare({r["event_id"]: [r[n] for n in names] for r in spark_rows}, expected, types, "Spark")


def test_a_producer_that_adds_nested_members_mid_stream_grows_the_table_and_old_rows_read_null(
    kafka, spark, topic, tmp_path
) -> None:
    """Under `add-columns`: an object property becomes a struct column, an array a list column; a
    member a struct's values gain mid-stream (nested too) becomes a member of the column, which the
    rows written before read as null; a value of another type is a reject naming its path."""
    stop = {"type": "struct", "fields": [{"name": "eta", "type": "long"}]}
    raw = contract_of(
        [
            {"type": "struct", "fields": [{"name": "id", "type": "long", "required": True}]},
            {"type": "map", "key": "string", "value": stop},
        ],
        "geojson",
    )
    raw["schema_evolution"] = "add-columns"
    contract = parse_contract(raw)

    def feature(i: int, c0: dict, c1: dict | None = None, **more) -> bytes:
        doc = {"type": "Feature", "id": f"e{i}", "geometry": {"type": "Point", "coordinates": [i % 90, 1.0]}}
        return json.dumps({**doc, "properties": {"c0": c0, "c1": c1, **more}}).encode()

    first = [
        feature(i, {"id": i}, {"a": {"eta": i}}, trip={"legs": [{"km": 1.5}], "fare": 3}, tags=["a", "b"])
        for i in range(60)
    ]
    later = [
        feature(
            i,
            {"id": i, "rating": 4.5, "car": {"plate": f"P{i}"}},
            {"a": {"eta": i}, "b": {"eta": 1, "gate": "G"}},  # a member of the map's values
            trip={"fare": 4, "paid": True, "legs": [{"km": 2.5, "mode": "rail"}]},
            tags=[],
        )
        for i in range(60, 120)
    ]
    later.append(feature(120, {"id": "not-a-number"}))
    settings = local_settings(kafka, topic, tmp_path, max_offsets_per_trigger=40)
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    for values in (first, later):
        assert produce_records(kafka.bootstrap, topic, [(None, v, []) for v in values]) == len(values)
        totals = run(settings, contract, until_idle=True, spark=spark)
        assert totals.commits.get("failed", 0) == 0

    assert totals.rejected == {"property_type_mismatch": 1}
    (dead,) = consume_all(kafka.bootstrap, settings.dead_letter_topic)
    headers = dict(dead.headers)
    assert headers[REASON_HEADER] == b"property_type_mismatch"
    assert headers[DETAIL_HEADER].decode() == "properties.c0.id: expected long, got 'not-a-number'"
    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    schema = table.schema()
    kinds = {
        path: re.sub(r"\d+: |optional |required ", "", str(schema.find_type(path)))
        for path in ("c0.id", "c0.rating", "c0.car.plate", "c1", "trip.legs", "trip.fare", "trip.paid", "tags")
    }
    assert kinds == {
        "c0.id": "long",
        "c0.rating": "double",
        "c0.car.plate": "string",
        "c1": "map<string, struct<eta: long, gate: string>>",
        "trip.legs": "list<struct<km: double, mode: string>>",  # a member of the list's element
        "trip.fare": "long",
        "trip.paid": "boolean",
        "tags": "list<string>",
    }
    # Members in the order the values showed them; each id the one Iceberg gave as the batch said.
    assert [f.name for f in schema.find_type("c0").fields] == ["id", "rating", "car"]
    assert [f.name for f in schema.find_type("trip").fields] == ["legs", "fare", "paid"]

    con = duckdb_connection()
    rows = {
        r[0]: r[1:]
        for r in con.execute(
            f"SELECT event_id, c0, trip, tags, bbox, c1 FROM iceberg_scan('{table.metadata_location}')"
        ).fetchall()
    }
    assert len(rows) == 120
    assert rows["e1"][:3] == (
        {"id": 1, "rating": None, "car": None},
        {"legs": [{"km": 1.5, "mode": None}], "fare": 3, "paid": None},
        ["a", "b"],
    )
    assert rows["e61"][:3] == (
        {"id": 61, "rating": 4.5, "car": {"plate": "P61"}},
        {"legs": [{"km": 2.5, "mode": "rail"}], "fare": 4, "paid": True},
        [],
    )
    # The covering of the rows written after the members were added is still each point's: a grown
    # struct column once moved the bbox's field ids in the files, and a window query missed them.
    for i in (1, 61, 119):
        assert rows[f"e{i}"][3] == {"xmin": i % 90, "ymin": 1.0, "xmax": i % 90, "ymax": 1.0}
    assert rows["e1"][4] == {"a": {"eta": 1, "gate": None}}
    assert rows["e61"][4] == {"a": {"eta": 61, "gate": None}, "b": {"eta": 1, "gate": "G"}}
    window = query(table, Predicate("intersects", shapely.box(59.5, 0, 89.5, 2))).table
    assert sorted(window.column("event_id").to_pylist()) == sorted(f"e{i}" for i in range(120) if i % 90 >= 60)


def test_nested_values_in_an_upsert_table_on_a_one_partition_topic_keep_each_keys_last_version_through_compaction(
    kafka, spark, tmp_path
) -> None:
    """Nested columns combined with the rest: an upsert table (keys from the Kafka key, 10 %
    tombstones), partitioned by a bucket of the key, fed from a topic of one partition, compacted
    after; `geoingest query` and DuckDB give each live key's last version, nested values equal."""
    rng = np.random.default_rng(46)
    types = [FIXED_TYPES[0], FIXED_TYPES[1], FIXED_TYPES[2], "decimal(12, 2)", "uuid", "date"]
    raw = contract_of(types, "geojson")
    raw["columns"][0]["from"] = ["kafka.key"]
    raw.update(mode="upsert", partition=["bucket(4, event_id)"])
    contract = parse_contract(raw)
    topic = f"nested-upsert-{rng.integers(1 << 30)}"
    KafkaAdminClient(bootstrap_servers=kafka.bootstrap).create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1)]
    )
    records, last = [], {}
    for i in range(600):
        key = f"k{rng.integers(120)}"
        if key in last and rng.random() < 0.1:
            records.append((key.encode(), None, []))
            last[key] = None
            continue
        sent, back = {}, []
        for c, kind in enumerate(types):
            value, plain_value = random_value(rng, kind)
            sent[f"c{c}"] = as_sent(value, kind, rng)
            back.append(plain_value)
        doc = {"type": "Feature", "geometry": {"type": "Point", "coordinates": [i % 170, 5.0]}, "properties": sent}
        records.append((key.encode(), numbers_unquoted(json.dumps(doc)).encode(), []))
        last[key] = back
    assert produce_records(kafka.bootstrap, topic, records) == len(records)
    settings = local_settings(kafka, topic, tmp_path, max_offsets_per_trigger=100, maintenance_mode="off")
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.commits.get("failed", 0) == 0 and totals.batches >= 5 and not totals.rejected
    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    report = maintain(
        table,
        MaintenancePolicy(min_file_age_s=0, snapshot_max_age_s=0, keep_snapshots=1, orphan_min_age_s=0),
        steps=("compact",),
    )
    assert report.compaction is not None and report.compaction.files_rewritten > 1
    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)

    live = {k: v for k, v in last.items() if v is not None}
    names = [f"c{i}" for i in range(len(types))]
    result = query(table, Predicate("intersects", shapely.box(-180, -90, 180, 90))).table
    compare({r["event_id"]: [r[n] for n in names] for r in result.to_pylist()}, live, types, "geoingest query")
    con = duckdb_connection()
    con.execute("SET TimeZone = 'UTC'")
    found = con.execute(
        f"SELECT event_id, {', '.join(names)} FROM iceberg_scan('{table.metadata_location}')"
    ).fetchall()
    assert len(found) == len({r[0] for r in found}), "one row per key"
    compare({r[0]: list(r[1:]) for r in found}, live, types, "DuckDB")

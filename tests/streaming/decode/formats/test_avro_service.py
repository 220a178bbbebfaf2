"""Avro through a schema registry, through the real service: a real broker, real Spark, a real
catalog and a real registry (Apicurio, tests/conftest.py). Midway the producer registers a new
version of its schema with a new optional field: under `schema_evolution: add-columns` it becomes
a column of the table. Every record lands in the table or in the dead-letter topic with its reason."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
import shapely

from app.local.process import free_port
from app.service import run
from streaming.contract import parse_contract
from streaming.table.catalog import create_table, open_catalog
from tests.app.local.test_schema_registry import V1, V2, register
from tests.conftest import duckdb_connection, local_settings, produce_records
from tests.streaming.decode.formats.test_avro import avro_bytes, wire
from tests.streaming.decode.test_dead_letter_corpus import dead_letters

pytestmark = pytest.mark.integration

CONTRACT = {
    "table": "fleet.pings",
    "formats": ["avro"],
    "registry": {"lon_field": "lon", "lat_field": "lat"},
    "columns": [
        {"id": 1, "name": "event_id", "type": "string", "required": True, "from": ["properties.id"]},
        {"id": 2, "name": "speed", "type": "double", "from": ["properties.speed"]},
        {"id": 3, "name": "event_time", "type": "timestamptz", "required": True, "from": ["kafka.timestamp"]},
    ],
    "geometry": {"id": 4, "name": "geometry", "types": ["Point"], "dimensions": ["XY"], "crs": "EPSG:4326"},
    "bbox": {"id": 5, "name": "bbox"},
    "schema_evolution": "add-columns",
}


# The second version adds a string, an optional record and an array of records.
_LEG = {
    "type": "record",
    "name": "Leg",
    "fields": [{"name": "km", "type": "double"}, {"name": "mode", "type": "string"}],
}
_DRIVER = {
    "type": "record",
    "name": "Driver",
    "fields": [{"name": "id", "type": "long"}, {"name": "shift", "type": "string"}],
}
V2_NESTED = {
    **V2,
    "fields": [
        *V2["fields"],
        {"name": "driver", "type": ["null", _DRIVER], "default": None},
        {"name": "legs", "type": {"type": "array", "items": _LEG}, "default": []},
    ],
}


def test_avro_records_through_the_registry_with_a_schema_change_midstream(
    kafka, spark, topic, schema_registry, tmp_path
):
    v1 = register(schema_registry.url, f"{topic}-value", V1)
    v2 = register(schema_registry.url, f"{topic}-value", V2_NESTED)
    expected: dict[str, tuple[float, float, float | None, str | None, dict | None, list | None]] = {}
    records = []
    for i in range(600):
        lon, lat = -170 + i * 0.5 + 1e-9 * i, -80 + (i % 300) * 0.5
        speed = None if i % 7 == 0 else i / 4
        key = f"p-{i}"
        if i < 300:
            value = wire(v1, avro_bytes(V1, {"id": key, "lon": lon, "lat": lat, "speed": speed}))
            expected[key] = (lon, lat, speed, None, None, None)
        else:  # the schema change: the producer's records now carry the new fields
            note = None if i % 5 == 0 else f"note {i}"
            driver = None if i % 3 == 0 else {"id": i, "shift": "night"}
            legs = [{"km": k + 0.5, "mode": "rail"} for k in range(i % 4)]
            fields = {"id": key, "lon": lon, "lat": lat, "speed": speed, "note": note, "driver": driver, "legs": legs}
            value = wire(v2, avro_bytes(V2_NESTED, fields))
            expected[key] = (lon, lat, speed, note, driver, legs)
        records.append((key.encode(), value, []))
    malformed = {
        b"bad-unknown-id": (
            wire(999_999, avro_bytes(V1, {"id": "x", "lon": 1.0, "lat": 2.0, "speed": None})),
            "unknown_schema_id",
        ),
        b"bad-truncated": (
            wire(
                v2,
                avro_bytes(
                    V2_NESTED,
                    {"id": "y", "lon": 1.0, "lat": 2.0, "speed": 3.0, "note": "z", "driver": None, "legs": []},
                )[:-3],
            ),
            "schema_mismatch",
        ),
        b"bad-header": (b"\x00\x00\x01", "bad_wire_format"),
        b"bad-latitude": (
            wire(v1, avro_bytes(V1, {"id": "w", "lon": 1.0, "lat": 123.0, "speed": None})),
            "outside_crs_area",
        ),
    }
    for n, (key, (value, _)) in enumerate(malformed.items()):
        records.insert(151 * n + 7, (key, value, []))
    assert produce_records(kafka.bootstrap, topic, records) == len(records)

    settings = local_settings(
        kafka, topic, tmp_path, max_offsets_per_trigger=250, schema_registry={"url": schema_registry.url}
    )
    contract = parse_contract(CONTRACT)
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.commits == {"committed": totals.batches}

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    # Added by schema evolution, midway: a record field as a struct column, an array of records as a list.
    added = {f.name: re.sub(r"\d+: |optional |required ", "", str(f.field_type)) for f in table.schema().fields[-3:]}
    assert added == {
        "note": "string",
        "driver": "struct<id: long, shift: string>",
        "legs": "list<struct<km: double, mode: string>>",
    }
    fields = ("event_id", "speed", "note", "driver", "legs", "geometry")
    rows = table.scan(selected_fields=fields).to_arrow().to_pylist()
    assert sorted(r["event_id"] for r in rows) == sorted(expected)
    for row in rows:
        lon, lat, speed, note, driver, legs = expected[row["event_id"]]
        point = shapely.from_wkb(row["geometry"])
        assert (point.x, point.y) == (lon, lat), row["event_id"]  # lossless
        assert (row["speed"], row["note"], row["driver"]) == (speed, note, driver), row["event_id"]
        # pyiceberg reads some null lists of structs as empty (apache/iceberg-python#3833): DuckDB below.
        assert row["legs"] == (legs or []), row["event_id"]
    found = duckdb_connection().execute(f"SELECT event_id, legs FROM iceberg_scan('{table.metadata_location}')")
    assert {event_id: legs for event_id, legs in found.fetchall()} == {key: e[5] for key, e in expected.items()}

    dead = dead_letters(kafka.bootstrap, settings.dead_letter_topic)
    assert {d.key: d.reason for d in dead.values()} == {key: reason for key, (_, reason) in malformed.items()}
    assert len(rows) + len(dead) == len(records) == totals.consumed


def test_an_unreachable_registry_stops_the_service_naming_it(kafka, spark, topic, tmp_path):
    nowhere = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    value = wire(1, avro_bytes(V1, {"id": "a", "lon": 1.0, "lat": 2.0, "speed": None}))
    assert produce_records(kafka.bootstrap, topic, [(b"a", value, [])]) == 1
    settings = local_settings(kafka, topic, tmp_path, schema_registry={"url": nowhere})
    contract = parse_contract({**CONTRACT, "schema_evolution": "off"})
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    with pytest.raises(Exception, match=f"schema registry at {nowhere} is unreachable"):
        run(settings, contract, until_idle=True, spark=spark)
    # Nothing was taken for the registry's fault: no commit, no dead letter.
    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    assert table.current_snapshot() is None
    assert dead_letters(kafka.bootstrap, settings.dead_letter_topic) == {}


def _widening_schema(count: object, reading: str, price_digits: int) -> dict:
    price = {"type": "bytes", "logicalType": "decimal", "precision": price_digits, "scale": 2}
    return {
        "type": "record",
        "name": "Meter",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "lon", "type": "double"},
            {"name": "lat", "type": "double"},
            {"name": "count", "type": count},
            {"name": "reading", "type": reading},
            {"name": "price", "type": price},
        ],
    }


def test_writer_schemas_that_widen_a_field_widen_its_column_and_one_iceberg_forbids_is_a_dead_letter(
    kafka, spark, topic, schema_registry, tmp_path
):
    """Avro's own promotions through the registry: a field int then long, float then double, a
    decimal(6, 2) then decimal(9, 2). The columns widen in the commit of the first batch that holds
    the wider values (old rows read as they were); a later schema that makes the count a string
    (which no Iceberg rule allows) leaves the column as it is, and its records are dead letters: a
    text is no number, whatever it spells."""
    narrow = register(schema_registry.url, f"{topic}-value", _widening_schema("int", "float", 6))
    wide = register(schema_registry.url, f"{topic}-value", _widening_schema("long", "double", 9))
    text = register(schema_registry.url, f"{topic}-other-value", _widening_schema("string", "double", 9))
    records, expected = [], {}
    for i in range(300):
        key = f"m-{i}"
        if i < 100:
            value = {"id": key, "lon": 1.0, "lat": 2.0, "count": i, "reading": 0.5 + i, "price": Decimal(i) / 4}
            schema_id, schema = narrow, _widening_schema("int", "float", 6)
        elif i < 250:
            value = {
                "id": key,
                "lon": 1.0,
                "lat": 2.0,
                "count": 2**40 + i,
                "reading": 0.1 + i,
                "price": Decimal("1234567.89") - i,
            }
            schema_id, schema = wide, _widening_schema("long", "double", 9)
        else:
            count = str(i) if i % 2 else "n/a"
            value = {"id": key, "lon": 1.0, "lat": 2.0, "count": count, "reading": 0.1 + i, "price": Decimal(i)}
            schema_id, schema = text, _widening_schema("string", "double", 9)
        records.append((key.encode(), wire(schema_id, avro_bytes(schema, value)), []))
        expected[key] = value
    assert produce_records(kafka.bootstrap, topic, records) == len(records)

    raw = {
        **CONTRACT,
        "table": "fleet.meters",
        "columns": [
            *CONTRACT["columns"][:1],
            {"id": 2, "name": "count", "type": "int", "from": ["properties.count"]},
            {"id": 3, "name": "event_time", "type": "timestamptz", "required": True, "from": ["kafka.timestamp"]},
            {"id": 4, "name": "reading", "type": "float", "from": ["properties.reading"]},
            {"id": 5, "name": "price", "type": "decimal(6, 2)", "from": ["properties.price"]},
        ],
        "geometry": {**CONTRACT["geometry"], "id": 6},
        "bbox": {"id": 7, "name": "bbox"},
    }
    settings = local_settings(
        kafka, topic, tmp_path, max_offsets_per_trigger=60, schema_registry={"url": schema_registry.url}
    )
    contract = parse_contract(raw)
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.commits == {"committed": totals.batches} and totals.batches >= 5

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert (types["count"], types["reading"], types["price"]) == ("long", "double", "decimal(9, 2)")
    rows = {r["event_id"]: r for r in table.scan().to_arrow().to_pylist()}
    dead = dead_letters(kafka.bootstrap, settings.dead_letter_topic)
    assert {d.key for d in dead.values()} == {f"m-{i}".encode() for i in range(250, 300)}
    assert {d.reason for d in dead.values()} == {"property_type_mismatch"}
    assert len(rows) + len(dead) == len(records)
    for key, row in rows.items():
        sent = expected[key]
        assert row["count"] == int(sent["count"]), key
        assert row["price"] == sent["price"], key
        # A float's value as the narrow schema sent it (a float32), a double's as sent.
        assert row["reading"] == pytest.approx(sent["reading"], rel=1e-6 if int(key[2:]) < 100 else 1e-15), key

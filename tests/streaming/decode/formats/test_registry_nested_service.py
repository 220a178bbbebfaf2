"""Nested Avro and Protobuf events through a schema registry and the real service (a real broker,
real Spark, a SQLite catalog, a real registry): a realistic event (30 fields: a nested position, an
array of 10 readings, a map, an enum, decimals, dates, times, timestamps, a UUID, fixed bytes /
repeated messages, a oneof, Timestamp, Duration, wrappers) lands as sent, and pyiceberg and DuckDB
read every value back; nested fields the contract leaves out are added by schema evolution."""

from __future__ import annotations

import datetime
import decimal
import re
import uuid
from typing import Any

import numpy as np
import pytest
from google.protobuf import message_factory

from app.service import run
from streaming.contract import parse_contract
from streaming.decode.formats.protobuf import general_proto_plan
from streaming.table.catalog import create_table, open_catalog
from tests.app.local.test_schema_registry import register
from tests.conftest import duckdb_connection, local_settings, produce_records
from tests.nested_values import empty_for_null, plain
from tests.streaming.decode.formats.test_avro import avro_bytes, wire

pytestmark = pytest.mark.integration

UTC = datetime.UTC
EVENTS = 300
FILLERS = [("f_long", "long", "long"), ("f_string", "string", "string"), ("f_bool", "boolean", "boolean")] * 5
READING = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "sensor", "type": "string"},
        {"name": "value", "type": "double"},
        {"name": "unit", "type": {"type": "enum", "name": "Unit", "symbols": ["CELSIUS", "PERCENT", "KPA"]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ],
}
AVRO_EVENT = {
    "type": "record",
    "name": "TelemetryEvent",
    "namespace": "fleet",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "device_id", "type": "string"},
        {
            "name": "position",
            "type": {
                "type": "record",
                "name": "Position",
                "fields": [
                    {"name": "lon", "type": "double"},
                    {"name": "lat", "type": "double"},
                    {"name": "altitude", "type": ["null", "float"], "default": None},
                ],
            },
        },
        {"name": "readings", "type": {"type": "array", "items": READING}},
        {"name": "tags", "type": {"type": "map", "values": "string"}},
        {"name": "fare", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "shift_start", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "seen", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "session", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "checksum", "type": {"type": "fixed", "name": "Checksum", "size": 4}},
        {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["IDLE", "MOVING", "PARKED"]}},
        {"name": "measure", "type": ["null", "long", "double"], "default": None},
        {"name": "speed", "type": ["null", "double"], "default": None},
        {"name": "heading", "type": "float"},
        *[{"name": f"{name}_{i}", "type": avro} for i, (name, avro, _) in enumerate(FILLERS)],
    ],
}
READING_COLUMN = {
    "type": "struct",
    "fields": [
        {"name": "sensor", "type": "string", "required": True},
        {"name": "value", "type": "double"},
        {"name": "unit", "type": "string"},
        {"name": "at", "type": "timestamptz"},
    ],
}
AVRO_COLUMNS: list[tuple[str, Any]] = [
    ("device_id", "string"),
    (
        "position",
        {
            "type": "struct",
            "fields": [
                {"name": "lon", "type": "double"},
                {"name": "lat", "type": "double"},
                {"name": "altitude", "type": "float"},
            ],
        },
    ),
    ("readings", {"type": "list", "element": READING_COLUMN}),
    ("tags", {"type": "map", "key": "string", "value": "string"}),
    ("fare", "decimal(12, 2)"),
    ("day", "date"),
    ("shift_start", "time"),
    ("seen", "timestamptz"),
    ("session", "uuid"),
    ("checksum", "fixed[4]"),
    ("state", "string"),
    ("measure", "double"),
    ("speed", "double"),
    ("heading", "float"),
    *[(f"{name}_{i}", kind) for i, (name, _, kind) in enumerate(FILLERS)],
]


def contract_of(fmt: str, columns: list[tuple[str, Any]]) -> dict:
    n = len(columns)
    return {
        "table": f"fleet.telemetry_{fmt}",
        "formats": [fmt],
        "registry": {"lon_field": "position.lon", "lat_field": "position.lat"},
        "columns": [
            {"id": 1, "name": "event_id", "type": "string", "required": True, "from": ["properties.event_id"]},
            *[
                {"id": i + 2, "name": name, "type": kind, "from": [f"properties.{name}"]}
                for i, (name, kind) in enumerate(columns)
            ],
        ],
        "geometry": {"id": n + 2, "name": "geometry", "types": ["Point"], "dimensions": ["XY"], "crs": "EPSG:4326"},
        "bbox": {"id": n + 3, "name": "bbox"},
    }


def avro_event(rng: np.random.Generator, e: int) -> tuple[dict, dict]:
    """(the record sent, each column's value as read back in `plain`'s form)"""
    base = datetime.datetime(2025, 3, 1, tzinfo=UTC) + datetime.timedelta(seconds=int(rng.integers(0, 10**7)))
    readings = [
        {
            "sensor": f"s{k}",
            "value": float(rng.normal()),
            "unit": ["CELSIUS", "PERCENT", "KPA"][k % 3],
            "at": base + datetime.timedelta(microseconds=k * 1_000_001),
        }
        for k in range(10)
    ]
    record = {
        "event_id": f"e{e}",
        "device_id": f"dev-{e % 17}",
        "position": {
            "lon": float(rng.uniform(-170, 170)),
            "lat": float(rng.uniform(-80, 80)),
            "altitude": None if e % 4 == 0 else float(np.float32(rng.uniform(0, 3000))),
        },
        "readings": readings,
        "tags": {} if e % 5 == 0 else {"route": f"r{e % 9}", "driver": f"d{e % 4}"},
        "fare": decimal.Decimal(int(rng.integers(-(10**11), 10**11))).scaleb(-2),
        "day": datetime.date(2025, 1, 1) + datetime.timedelta(days=e),
        "shift_start": datetime.time(e % 24, e % 60, e % 60, e * 7 % 1_000_000),
        "seen": base.replace(microsecond=(e % 1000) * 1000),
        "session": uuid.UUID(int=int(rng.integers(0, 2**62)) * 2**64 + e),
        "checksum": int(e).to_bytes(4, "big"),
        "state": ["IDLE", "MOVING", "PARKED"][e % 3],
        "measure": [None, e, e + 0.25][e % 3],
        "speed": None if e % 6 == 0 else float(rng.uniform(0, 40)),
        "heading": float(np.float32(rng.uniform(0, 360))),
        **{f"{name}_{i}": _filler(kind, e + i) for i, (name, _, kind) in enumerate(FILLERS)},
    }
    back = {name: record[name] for name, _ in AVRO_COLUMNS}
    back["readings"] = [{**r, "at": r["at"].replace(tzinfo=None)} for r in readings]
    back["seen"] = record["seen"].replace(tzinfo=None)
    back["measure"] = None if record["measure"] is None else float(record["measure"])
    return record, back


def _filler(kind: str, n: int) -> Any:
    return {"long": n * 1_000_003 - 2**40, "string": f"value {n} é", "boolean": n % 2 == 0}[kind]


def ingest_and_read(kafka, spark, topic, tmp_path, schema_registry, raw_contract: dict, values: list[bytes]):
    assert produce_records(kafka.bootstrap, topic, [(None, v, []) for v in values]) == len(values)
    settings = local_settings(
        kafka, topic, tmp_path, max_offsets_per_trigger=120, schema_registry={"url": schema_registry.url}
    )
    contract = parse_contract(raw_contract)
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.commits.get("failed", 0) == 0
    assert not totals.rejected and totals.committed_rows == len(values), totals
    return open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)


def assert_read_back(table, expected: dict[str, dict], columns: list[tuple[str, Any]]) -> None:
    names = [name for name, _ in columns]
    by_pyiceberg = {r["event_id"]: r for r in table.scan().to_arrow().to_pylist()}
    con = duckdb_connection()
    con.execute("SET TimeZone = 'UTC'")
    found = con.execute(f"SELECT event_id, {', '.join(names)} FROM iceberg_scan('{table.metadata_location}')")
    by_duckdb = {r[0]: dict(zip(names, r[1:], strict=True)) for r in found.fetchall()}
    for reader, rows, seen in (("pyiceberg", by_pyiceberg, empty_for_null), ("DuckDB", by_duckdb, lambda v, k: v)):
        assert rows.keys() == expected.keys(), f"{reader}: other events than sent"
        for event_id, want in expected.items():
            for name, kind in columns:
                got, sent = seen(plain(rows[event_id][name], kind), kind), seen(plain(want[name], kind), kind)
                assert got == sent, f"{reader}: {event_id}.{name}: read {got!r}, sent {sent!r}"


def test_nested_avro_events_through_the_registry_land_as_sent(kafka, spark, topic, tmp_path, schema_registry):
    schema_id = register(schema_registry.url, f"{topic}-value", AVRO_EVENT)
    rng = np.random.default_rng(11)
    values, expected = [], {}
    for e in range(EVENTS):
        record, back = avro_event(rng, e)
        values.append(wire(schema_id, avro_bytes(AVRO_EVENT, record)))
        expected[record["event_id"]] = back
    table = ingest_and_read(kafka, spark, topic, tmp_path, schema_registry, contract_of("avro", AVRO_COLUMNS), values)
    assert_read_back(table, expected, AVRO_COLUMNS)


PROTO_EVENT = """
syntax = "proto3";
package fleet;

import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";

message TelemetryEvent {
  message Position {
    double lon = 1;
    double lat = 2;
    optional float altitude = 3;
  }
  message Reading {
    string sensor = 1;
    double value = 2;
    google.protobuf.Timestamp at = 3;
  }
  enum State { STATE_UNSPECIFIED = 0; IDLE = 1; MOVING = 2; }
  string event_id = 1;
  string device_id = 2;
  Position position = 3;
  repeated Reading readings = 4;
  map<string, string> tags = 5;
  State state = 6;
  oneof label {
    string note = 7;
    int64 code = 8;
  }
  google.protobuf.Timestamp seen = 9;
  google.protobuf.Duration took = 10;
  google.protobuf.Int64Value odometer = 11;
  google.protobuf.StringValue driver = 12;
  repeated int32 levels = 13;
  bytes blob = 14;
  sint64 delta = 15;
}
"""
PROTO_READING = {
    "type": "struct",
    "fields": [
        {"name": "sensor", "type": "string", "required": True},
        {"name": "value", "type": "double"},
        {"name": "at", "type": "timestamptz"},
    ],
}
PROTO_COLUMNS: list[tuple[str, Any]] = [
    ("device_id", "string"),
    (
        "position",
        {
            "type": "struct",
            "fields": [
                {"name": "lon", "type": "double"},
                {"name": "lat", "type": "double"},
                {"name": "altitude", "type": "float"},
            ],
        },
    ),
    ("readings", {"type": "list", "element": PROTO_READING}),
    ("tags", {"type": "map", "key": "string", "value": "string"}),
    ("state", "string"),
    ("note", "string"),
    ("code", "long"),
    ("seen", "timestamptz"),
    ("took", "long"),
    ("odometer", "long"),
    ("driver", "string"),
    ("levels", {"type": "list", "element": "int"}),
    ("blob", "binary"),
    ("delta", "long"),
]


def test_nested_protobuf_events_through_the_registry_land_as_sent(kafka, spark, topic, tmp_path, schema_registry):
    schema_id = register(schema_registry.url, f"{topic}-value", PROTO_EVENT, schema_type="PROTOBUF")
    event_class = message_factory.GetMessageClass(general_proto_plan(schema_id, PROTO_EVENT).messages[0])
    rng = np.random.default_rng(12)
    values, expected = [], {}
    for e in range(EVENTS):
        base = datetime.datetime(2025, 3, 1, tzinfo=UTC) + datetime.timedelta(seconds=int(rng.integers(0, 10**7)))
        message = event_class(event_id=f"e{e}", device_id=f"dev-{e % 17}", state=e % 3, delta=-(e**3))
        message.position.lon, message.position.lat = float(rng.uniform(-170, 170)), float(rng.uniform(-80, 80))
        if e % 4:
            message.position.altitude = float(np.float32(rng.uniform(0, 3000)))
        readings = []
        for k in range(10):
            at = base + datetime.timedelta(microseconds=k * 1_000_001)
            reading = message.readings.add(sensor=f"s{k}", value=float(rng.normal()))
            reading.at.FromDatetime(at)
            readings.append({"sensor": f"s{k}", "value": reading.value, "at": at.replace(tzinfo=None)})
        tags = {} if e % 5 == 0 else {"route": f"r{e % 9}", "driver": f"d{e % 4}"}
        message.tags.update(tags)
        if e % 3 == 0:
            message.note = f"note {e}"
        elif e % 3 == 1:
            message.code = e * 1000
        message.seen.FromDatetime(base)
        message.took.FromMicroseconds(e * 1_500_001)
        if e % 2:
            message.odometer.value = e * 10_000_000_000
        if e % 7:
            message.driver.value = f"driver {e}"
        message.levels.extend(range(e % 6))
        message.blob = bytes(range(e % 11))
        values.append(wire(schema_id, b"\x00" + message.SerializeToString()))
        expected[f"e{e}"] = {
            "device_id": f"dev-{e % 17}",
            "position": {
                "lon": message.position.lon,
                "lat": message.position.lat,
                "altitude": message.position.altitude if e % 4 else None,
            },
            "readings": readings,
            "tags": tags,
            "state": ["STATE_UNSPECIFIED", "IDLE", "MOVING"][e % 3],
            "note": f"note {e}" if e % 3 == 0 else None,
            "code": e * 1000 if e % 3 == 1 else None,
            "seen": base.replace(tzinfo=None),
            "took": e * 1_500_001,
            "odometer": e * 10_000_000_000 if e % 2 else None,
            "driver": f"driver {e}" if e % 7 else None,
            "levels": list(range(e % 6)),
            "blob": bytes(range(e % 11)),
            "delta": -(e**3),
        }
    # Two nested fields are left out of the contract: schema evolution adds them, typed by the
    # writer schema, and the same batch's rows fill them.
    evolved = {"readings", "tags"}
    raw = contract_of("protobuf", [(name, kind) for name, kind in PROTO_COLUMNS if name not in evolved])
    raw["schema_evolution"] = "add-columns"
    table = ingest_and_read(kafka, spark, topic, tmp_path, schema_registry, raw, values)
    added = {f.name: re.sub(r"\d+: |optional ", "", str(f.field_type)) for f in table.schema().fields[-2:]}
    assert added == {
        "readings": "list<struct<sensor: string, value: double, at: timestamptz>>",
        "tags": "map<string, string>",
    }
    assert_read_back(table, expected, PROTO_COLUMNS)

"""Decode throughput of each input format against GeoJSON points on the same places, on one core.

The whole decoder (streaming/decode/decoder.py: routing, reading, the geometry rules, the contract's
columns, WKB, bbox and Hilbert key out) over batches of --batch records, as a Python worker gets
them, pinned to one core with Arrow's thread pools at one thread. The places are real cities
(bench/cities.py), the coordinates written with every digit (repr), so every format carries the
same doubles; each record carries an id and two other columns (kind, speed) where its format can.

  geojson points        GeoJSON Feature events, the baseline
  json lon/lat          {"vehicle": .., "position": {"lon": .., "lat": ..}, "kind": .., "speed": ..}
  json lon/lat (flat)   {"vehicle": .., "lon": .., "lat": .., "kind": .., "speed": ..}
  json wkt / wkb_hex / wkb_base64 / geojson field
                        the point in one field of a JSON event, in each encoding
  wkt points, ewkt points
                        `POINT (x y)`, `SRID=4326;POINT (x y)` values (no other columns: the Kafka key)
  geojson / wkt hexagons
                        7-vertex polygons around the same places
  debezium points (schemas off / on)
                        Debezium change events (updates) of a PostGIS row {id, kind, speed, geom}, the
                        JSON converter's schemas off, and on (the schema Debezium 3 writes, ~2.5 KB)
  debezium points (avro)
                        the same events with an Avro converter: the Confluent wire format, the
                        schema the converter makes of the same Connect schema, as the registry
                        hands it over (put in the registry client's cache: no registry runs here)
  avro points (flat)    {vehicle, lon, lat, kind, speed} Avro records in the Confluent wire format
                        (the columnar reader)
  avro nested event     a 30-field telemetry event: a nested position, an array of 10 readings
                        (records with an enum and a timestamp), a map, a decimal, a date, a time, a
                        UUID, fixed bytes, a union of two numbers; every field a column of its own
                        type (the nested reader, streaming/decode/formats/avro_nested.py)
  protobuf nested event the same event as a Protobuf message (a Position message, 10 repeated
                        Readings with an enum and a Timestamp, a map, a Duration, a Timestamp, a
                        oneof, an optional field; the nested reader, .../protobuf_nested.py)
  protobuf nested event (general)
                        the same, its enum `state` into an int column: the general reader (the
                        protobuf runtime, message by message), for reference

Each figure is the best of --repeats runs. Prints a table and writes bench/results/formats.json and .md.
"""

from __future__ import annotations

import argparse
import base64
import copy
import io
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):  # run as a script: streaming/ and bench/cities.py
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import fastavro  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import shapely  # noqa: E402
from cities import city_points  # noqa: E402

from streaming.contract import Contract, parse_contract  # noqa: E402
from streaming.decode.decoder import REJECT_REASON, DecodeOptions, Decoder  # noqa: E402
from streaming.decode.schema_registry import RegisteredSchema, RegistrySettings, client_for  # noqa: E402

RESULTS = ROOT / "bench" / "results"
# Registry-encoded cases read their schema from the registry client's cache, filled here: the
# decoder never asks this address.
REGISTRY = RegistrySettings(url="http://registry.invalid/apis/ccompat/v7")
CACHED = client_for(REGISTRY)._schemas
AVRO_ID = 7
DEMO = json.loads((ROOT / "schemas" / "demo_events.json").read_text())
HEXAGON = np.column_stack([np.cos(np.arange(7) * np.pi / 3), np.sin(np.arange(7) * np.pi / 3)]) * 0.001
HEXAGON[-1] = HEXAGON[0]


def contract(formats: list[str], json_section: dict | None = None) -> Contract:
    raw = copy.deepcopy(DEMO)
    raw["formats"] = formats
    if json_section is not None:
        raw["json"] = json_section
        for column in raw["columns"]:
            column["from"] = [
                "json.vehicle" if s == "id" else s.replace("properties.", "json.") for s in column["from"]
            ]
    raw["geometry"]["invalid_polygons"] = "reject"
    return parse_contract(raw)


def cases(n: int) -> dict[str, tuple[Contract, list[bytes]]]:
    x, y = city_points(n, seed=5, jitter_deg=0.05, bounds=(-179.0, -84.0, 179.0, 84.0))
    xs, ys = x.tolist(), y.tolist()
    points = [shapely.Point(a, b) for a, b in zip(xs, ys)]

    def event(i: int, **geometry) -> bytes:
        return json.dumps({"vehicle": f"e{i}", **geometry, "kind": "ping", "speed": i % 120}).encode()

    def json_field(encoding: str, spell) -> tuple[Contract, list[bytes]]:
        c = contract(["json"], {"geometry": {"path": "geom", "encoding": encoding}})
        return c, [event(i, geom=spell(p)) for i, p in enumerate(points)]

    def hexagon_wkt(a: float, b: float) -> str:
        return "POLYGON ((%s))" % ", ".join(f"{a + dx!r} {b + dy!r}" for dx, dy in HEXAGON.tolist())

    def hexagon_geojson(a: float, b: float) -> dict:
        return {"type": "Polygon", "coordinates": [[[a + dx, b + dy] for dx, dy in HEXAGON.tolist()]]}

    geojson = contract(["geojson", "wkb"])
    wkt = contract(["wkt", "ewkt"])
    return {
        "geojson points": (
            geojson,
            [
                json.dumps(
                    {
                        "type": "Feature",
                        "id": f"e{i}",
                        "geometry": {"type": "Point", "coordinates": [a, b]},
                        "properties": {"kind": "ping", "speed": i % 120},
                    }
                ).encode()
                for i, (a, b) in enumerate(zip(xs, ys))
            ],
        ),
        "json lon/lat": (
            contract(["json"], {"lon": "position.lon", "lat": "position.lat"}),
            [event(i, position={"lon": a, "lat": b}) for i, (a, b) in enumerate(zip(xs, ys))],
        ),
        "json lon/lat (flat)": (
            contract(["json"], {"lon": "lon", "lat": "lat"}),
            [event(i, lon=a, lat=b) for i, (a, b) in enumerate(zip(xs, ys))],
        ),
        "json wkt field": json_field("wkt", lambda p: f"POINT ({p.x!r} {p.y!r})"),
        "json wkb_hex field": json_field("wkb_hex", lambda p: shapely.to_wkb(p, hex=True)),
        "json wkb_base64 field": json_field("wkb_base64", lambda p: base64.b64encode(shapely.to_wkb(p)).decode()),
        "json geojson field": json_field("geojson", lambda p: {"type": "Point", "coordinates": [p.x, p.y]}),
        "wkt points": (wkt, [f"POINT ({a!r} {b!r})".encode() for a, b in zip(xs, ys)]),
        "ewkt points": (wkt, [f"SRID=4326;POINT ({a!r} {b!r})".encode() for a, b in zip(xs, ys)]),
        "geojson hexagons": (
            geojson,
            [
                json.dumps(
                    {"type": "Feature", "id": f"e{i}", "geometry": hexagon_geojson(a, b), "properties": {}}
                ).encode()
                for i, (a, b) in enumerate(zip(xs, ys))
            ],
        ),
        "wkt hexagons": (wkt, [hexagon_wkt(a, b).encode() for a, b in zip(xs, ys)]),
        "debezium points (schemas off)": (DEBEZIUM, debezium_events(points, schemas=False)),
        "debezium points (schemas on)": (DEBEZIUM, debezium_events(points, schemas=True)),
        "debezium points (avro)": (DEBEZIUM, debezium_avro_events(points)),
        "avro points (flat)": flat_avro_case(xs, ys),
        "avro nested event": nested_avro_case(xs, ys),
        "protobuf nested event": nested_protobuf_case(xs, ys),
        "protobuf nested event (general)": nested_protobuf_case(xs, ys, state_as_number=True),
    }


FLAT_AVRO_ID, NESTED_AVRO_ID = 8, 9
FLAT_AVRO = {
    "type": "record",
    "name": "Ping",
    "fields": [
        {"name": "vehicle", "type": "string"},
        {"name": "lon", "type": "double"},
        {"name": "lat", "type": "double"},
        {"name": "kind", "type": "string"},
        {"name": "speed", "type": ["null", "double"]},
    ],
}


def registry_contract(columns: list[tuple[str, object]], lon: str, lat: str, encoding: str = "avro") -> Contract:
    """A table of an Avro (or Protobuf) topic: `vehicle` and a column per (name, type), each from
    the field of its name."""
    n = len(columns)
    return parse_contract(
        {
            "table": f"bench.{encoding}",
            "formats": [encoding],
            "registry": {"lon_field": lon, "lat_field": lat},
            "columns": [
                {"id": 1, "name": "vehicle", "type": "string", "required": True, "from": ["properties.vehicle"]},
                *[
                    {"id": i + 2, "name": name, "type": kind, "from": [f"properties.{name}"]}
                    for i, (name, kind) in enumerate(columns)
                ],
            ],
            "geometry": {"id": n + 2, "name": "geometry", "types": ["Point"], "dimensions": ["XY"], "crs": "EPSG:4326"},
            "bbox": {"id": n + 3, "name": "bbox"},
        }
    )


def avro_values(schema_id: int, schema: dict, records) -> list[bytes]:
    CACHED[schema_id] = RegisteredSchema(schema_id, "AVRO", json.dumps(schema))
    parsed = fastavro.parse_schema(schema)
    out = []
    for record in records:
        body = io.BytesIO()
        fastavro.schemaless_writer(body, parsed, record)
        out.append(b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue())
    return out


def flat_avro_case(xs: list[float], ys: list[float]) -> tuple[Contract, list[bytes]]:
    c = registry_contract([("kind", "string"), ("speed", "double")], "lon", "lat")
    records = (
        {"vehicle": f"e{i}", "lon": a, "lat": b, "kind": "ping", "speed": float(i % 120)}
        for i, (a, b) in enumerate(zip(xs, ys))
    )
    return c, avro_values(FLAT_AVRO_ID, FLAT_AVRO, records)


_READING = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "sensor", "type": "string"},
        {"name": "value", "type": "double"},
        {"name": "unit", "type": {"type": "enum", "name": "Unit", "symbols": ["CELSIUS", "PERCENT", "KPA"]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ],
}
_FILLERS = [("long", "long"), ("string", "string"), ("boolean", "boolean"), ("double", "double")] * 4
_PROTO_FILLER = {"long": "int64", "string": "string", "boolean": "bool", "double": "double"}
NESTED_AVRO = {
    "type": "record",
    "name": "TelemetryEvent",
    "fields": [
        {"name": "vehicle", "type": "string"},
        {
            "name": "position",
            "type": {
                "type": "record",
                "name": "Position",
                "fields": [
                    {"name": "lon", "type": "double"},
                    {"name": "lat", "type": "double"},
                    {"name": "altitude", "type": ["null", "float"]},
                ],
            },
        },
        {"name": "readings", "type": {"type": "array", "items": _READING}},
        {"name": "tags", "type": {"type": "map", "values": "string"}},
        {"name": "fare", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "shift_start", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "seen", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "session", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "checksum", "type": {"type": "fixed", "name": "Checksum", "size": 4}},
        {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["IDLE", "MOVING"]}},
        {"name": "measure", "type": ["null", "long", "double"]},
        {"name": "speed", "type": ["null", "double"]},
        {"name": "heading", "type": "float"},
        *[{"name": f"{kind}_{i}", "type": kind} for i, (kind, _) in enumerate(_FILLERS)],
    ],
}
NESTED_COLUMNS: list[tuple[str, object]] = [
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
    (
        "readings",
        {
            "type": "list",
            "element": {
                "type": "struct",
                "fields": [
                    {"name": "sensor", "type": "string", "required": True},
                    {"name": "value", "type": "double"},
                    {"name": "unit", "type": "string"},
                    {"name": "at", "type": "timestamptz"},
                ],
            },
        },
    ),
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
    *[(f"{kind}_{i}", column) for i, (kind, column) in enumerate(_FILLERS)],
]


def nested_avro_case(xs: list[float], ys: list[float]) -> tuple[Contract, list[bytes]]:
    import datetime
    import decimal
    import uuid

    c = registry_contract(NESTED_COLUMNS, "position.lon", "position.lat")
    base = datetime.datetime(2025, 3, 1, tzinfo=datetime.UTC)
    filler = {"long": 2**40 + 7, "string": "a value of some length", "boolean": True, "double": 0.125}

    def record(i: int, a: float, b: float) -> dict:
        at = base + datetime.timedelta(seconds=i)
        return {
            "vehicle": f"e{i}",
            "position": {"lon": a, "lat": b, "altitude": None if i % 4 == 0 else 120.5},
            "readings": [{"sensor": f"s{k}", "value": i * 0.01 + k, "unit": "KPA", "at": at} for k in range(10)],
            "tags": {"route": f"r{i % 9}", "driver": f"d{i % 4}"},
            "fare": decimal.Decimal(i % 100_000).scaleb(-2),
            "day": datetime.date(2025, 1, 1) + datetime.timedelta(days=i % 365),
            "shift_start": datetime.time(i % 24, i % 60),
            "seen": at,
            "session": uuid.UUID(int=i),
            "checksum": (i % 2**32).to_bytes(4, "big"),
            "state": "MOVING" if i % 2 else "IDLE",
            "measure": i if i % 2 else i + 0.5,
            "speed": float(i % 120),
            "heading": 90.0,
            **{f"{kind}_{k}": filler[kind] for k, (kind, _) in enumerate(_FILLERS)},
        }

    return c, avro_values(NESTED_AVRO_ID, NESTED_AVRO, (record(i, a, b) for i, (a, b) in enumerate(zip(xs, ys))))


NESTED_PROTO_ID = 10
NESTED_PROTO = f"""
syntax = "proto3";
package bench;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";

message TelemetryEvent {{
  message Position {{ double lon = 1; double lat = 2; optional float altitude = 3; }}
  enum State {{ IDLE = 0; MOVING = 1; }}
  string vehicle = 1;
  Position position = 2;
  repeated Reading readings = 3;
  map<string, string> tags = 4;
  int64 fare_cents = 5;
  int32 day = 6;
  google.protobuf.Duration shift_start = 7;
  google.protobuf.Timestamp seen = 8;
  string session = 9;
  fixed32 checksum = 10;
  State state = 11;
  oneof measure {{ int64 measure_count = 12; double measure_value = 13; }}
  optional double speed = 14;
  float heading = 15;
  {" ".join(f"{_PROTO_FILLER[kind]} {kind}_{i} = {16 + i};" for i, (kind, _) in enumerate(_FILLERS))}
}}

message Reading {{
  enum Unit {{ CELSIUS = 0; PERCENT = 1; KPA = 2; }}
  string sensor = 1;
  double value = 2;
  Unit unit = 3;
  google.protobuf.Timestamp at = 4;
}}
"""
NESTED_PROTO_COLUMNS: list[tuple[str, object]] = [
    column
    for column in NESTED_COLUMNS
    if column[0] not in ("fare", "day", "shift_start", "session", "checksum", "measure")
] + [
    ("fare_cents", "long"),
    ("day", "int"),
    ("shift_start", "long"),
    ("session", "string"),
    ("checksum", "long"),
    ("measure_count", "long"),
    ("measure_value", "double"),
]


def nested_protobuf_case(
    xs: list[float], ys: list[float], state_as_number: bool = False
) -> tuple[Contract, list[bytes]]:
    """The nested event of the Avro case as Protobuf writes it: the runtime's own encoder, the
    schema put in the registry client's cache (the nested columnar reader, protobuf_nested.py);
    with `state_as_number`, the enum `state` into an int column, which the general reader reads
    (the protobuf runtime, message by message)."""
    from google.protobuf import message_factory

    from streaming.decode.formats.protobuf import general_proto_plan

    CACHED[NESTED_PROTO_ID] = RegisteredSchema(NESTED_PROTO_ID, "PROTOBUF", NESTED_PROTO)
    columns = [(name, "int" if name == "state" and state_as_number else kind) for name, kind in NESTED_PROTO_COLUMNS]
    c = registry_contract(columns, "position.lon", "position.lat", "protobuf")
    event = message_factory.GetMessageClass(general_proto_plan(NESTED_PROTO_ID, NESTED_PROTO).messages[0])
    header = b"\x00" + NESTED_PROTO_ID.to_bytes(4, "big") + b"\x00"
    filler = {"long": 2**40 + 7, "string": "a value of some length", "boolean": True, "double": 0.125}
    out = []
    for i, (a, b) in enumerate(zip(xs, ys)):
        m = event(
            vehicle=f"e{i}", fare_cents=i % 100_000, day=20089 + i % 365, session=f"00000000-0000-0000-0000-{i:012d}"
        )
        m.position.lon, m.position.lat = a, b
        if i % 4:
            m.position.altitude = 120.5
        for k in range(10):
            r = m.readings.add(sensor=f"s{k}", value=i * 0.01 + k, unit=2)
            r.at.seconds = 1_740_787_200 + i
        m.tags["route"], m.tags["driver"] = f"r{i % 9}", f"d{i % 4}"
        m.shift_start.seconds = (i % 24) * 3600 + (i % 60) * 60
        m.seen.seconds = 1_740_787_200 + i
        m.checksum, m.state = i % 2**32, i % 2
        if i % 2:
            m.measure_count = i
        else:
            m.measure_value = i + 0.5
        m.speed, m.heading = float(i % 120), 90.0
        for k, (kind, _) in enumerate(_FILLERS):
            setattr(m, f"{kind}_{k}", filler[kind])
        out.append(header + m.SerializeToString())
    return c, out


DEBEZIUM = parse_contract(
    {
        **json.loads((ROOT / "schemas" / "postgis_places.json").read_text()),
        "columns": [
            {"id": 1, "name": "id", "type": "long", "required": True, "from": ["properties.id"]},
            {"id": 2, "name": "kind", "type": "string", "from": ["properties.kind"]},
            {"id": 3, "name": "speed", "type": "double", "from": ["properties.speed"]},
        ],
        "geometry": {"id": 4, "name": "geometry", "types": ["Point"], "dimensions": ["XY"], "crs": "EPSG:4326"},
        "bbox": {"id": 5, "name": "bbox"},
    }
)


def _field(field: str, kind: str, optional: bool = True, **more) -> dict:
    return {"type": kind, "optional": optional, "field": field, **more}


def debezium_schema() -> dict:
    """The value schema Debezium 3's PostgreSQL connector writes with the JSON converter."""
    geometry = {
        "type": "struct",
        "fields": [_field("wkb", "bytes", False), _field("srid", "int32")],
        "optional": True,
        "name": "io.debezium.data.geometry.Geometry",
        "version": 1,
        "doc": "Geometry",
    }
    row = {
        "type": "struct",
        "fields": [
            _field("id", "int64", False),
            _field("kind", "string"),
            _field("speed", "double"),
            {**geometry, "field": "geom"},
        ],
        "optional": True,
        "name": "dbz.public.places.Value",
    }
    source = [
        _field(n, t, False)
        for n, t in (("version", "string"), ("connector", "string"), ("name", "string"), ("ts_ms", "int64"))
    ]
    source += [_field("snapshot", "string", True, name="io.debezium.data.Enum", version=1, default="false")]
    source += [
        _field(n, t, o)
        for n, t, o in (
            ("db", "string", False),
            ("sequence", "string", True),
            ("ts_us", "int64", True),
            ("ts_ns", "int64", True),
            ("schema", "string", False),
            ("table", "string", False),
            ("txId", "int64", True),
            ("lsn", "int64", True),
            ("xmin", "int64", True),
        )
    ]
    transaction = [
        _field("id", "string", False),
        _field("total_order", "int64", False),
        _field("data_collection_order", "int64", False),
    ]
    return {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {
                "type": "struct",
                "fields": source,
                "optional": False,
                "name": "io.debezium.connector.postgresql.Source",
                "field": "source",
            },
            {
                "type": "struct",
                "fields": transaction,
                "optional": True,
                "name": "event.block",
                "version": 1,
                "field": "transaction",
            },
            _field("op", "string", False),
            _field("ts_ms", "int64"),
            _field("ts_us", "int64"),
            _field("ts_ns", "int64"),
        ],
        "optional": False,
        "name": "dbz.public.places.Envelope",
        "version": 2,
    }


def avro_schema(connect: dict, named: set[str]) -> object:
    """The Avro schema an Avro converter makes of a Connect schema (structs as records, optional
    fields as unions with null first, a named record used again by its name)."""
    kinds = {"int64": "long", "int32": "int", "string": "string", "double": "double", "bytes": "bytes"}
    if connect["type"] == "struct":
        full = connect["name"]
        if full in named:
            avro: object = full
        else:
            named.add(full)
            space, _, name = full.rpartition(".")
            fields = [{"name": f["field"], "type": avro_schema(f, named)} for f in connect["fields"]]
            avro = {"type": "record", "name": name, "namespace": space, "fields": fields}
    else:
        avro = kinds[connect["type"]]
    return ["null", avro] if connect.get("optional", True) else avro


def debezium_avro_events(points: list) -> list[bytes]:
    schema = avro_schema({**debezium_schema(), "optional": False}, set())
    CACHED[AVRO_ID] = RegisteredSchema(AVRO_ID, "AVRO", json.dumps(schema))
    parsed = fastavro.parse_schema(schema)
    out = []
    for event in debezium_envelopes(points, base64_wkb=False):
        body = io.BytesIO()
        fastavro.schemaless_writer(body, parsed, event)
        out.append(b"\x00" + AVRO_ID.to_bytes(4, "big") + body.getvalue())
    return out


def debezium_events(points: list, schemas: bool) -> list[bytes]:
    schema = debezium_schema()
    out = []
    for envelope in debezium_envelopes(points, base64_wkb=True):
        doc = {"schema": schema, "payload": envelope} if schemas else envelope
        out.append(json.dumps(doc, separators=(",", ":")).encode())
    return out


def debezium_envelopes(points: list, base64_wkb: bool) -> list[dict]:
    out = []
    for i, p in enumerate(points):
        blob = shapely.to_wkb(shapely.set_srid(p, 4326), include_srid=True)
        wkb = base64.b64encode(blob).decode() if base64_wkb else blob
        source = {
            "version": "3.6.1.Final",
            "connector": "postgresql",
            "name": "dbz",
            "ts_ms": 1764000000000,
            "snapshot": "false",
            "db": "gis",
            "sequence": f'["{i}","{i + 1}"]',
            "ts_us": 1764000000000000,
            "ts_ns": 1764000000000000000,
            "schema": "public",
            "table": "places",
            "txId": 1000 + i,
            "lsn": 40000000 + 100 * i,
            "xmin": None,
        }
        after = {"id": i, "kind": "ping", "speed": float(i % 120), "geom": {"wkb": wkb, "srid": 4326}}
        envelope = {
            "before": None,
            "after": after,
            "source": source,
            "transaction": None,
            "op": "u",
            "ts_ms": 1764000000100,
            "ts_us": 1764000000100000,
            "ts_ns": 1764000000100000000,
        }
        out.append(envelope)
    return out


def kafka_batch(values: list[bytes], start: int) -> pa.RecordBatch:
    n = len(values)
    return pa.record_batch(
        {
            "key": pa.array([f"k{start + i}".encode() for i in range(n)], pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": pa.array(["bench"] * n, pa.string()),
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(np.arange(start, start + n), pa.int64()),
            "timestamp": pa.array(1_700_000_000_000_000 + np.arange(n), pa.timestamp("us")),
        }
    )


def leaf_values(array: pa.Array) -> int:
    """The values an array holds at its leaves, nulls left out: a struct's members', a list's
    elements', a map's keys and values."""
    if isinstance(array, pa.ChunkedArray):
        return sum(leaf_values(chunk) for chunk in array.chunks)
    if pa.types.is_struct(array.type):
        return sum(leaf_values(array.field(i)) for i in range(array.type.num_fields))
    if pa.types.is_map(array.type):
        return leaf_values(array.keys) + leaf_values(array.items)
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        return leaf_values(array.flatten())
    return len(array) - array.null_count


def measure(c: Contract, values: list[bytes], batch: int, repeats: int) -> tuple[float, float, int, float]:
    """Best events per CPU second and per wall second over `repeats` passes, the rejects of one
    pass (0: every event landed) and the values an event fills (its columns' leaf values and its
    geometry): a nested event fills many more than a point with three properties. CPU time is the
    figure: the machine is shared, and a pass that waits for the core counts that wait in wall time only."""
    batches = [kafka_batch(values[i : i + batch], i) for i in range(0, len(values), batch)]
    decoder = Decoder(c, DecodeOptions(schema_registry=REGISTRY))
    out = [decoder.decode(b) for b in batches]  # warm-up, the reject count and the values
    rejects = sum(o.num_rows - o.column(REJECT_REASON).null_count for o in out)
    columns = [column.name for column in c.all_columns] + [c.geometry.name]
    filled = sum(leaf_values(o.column(name)) for o in out for name in columns) / len(values)
    best_cpu = best_wall = 0.0
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        for b in batches:
            decoder.decode(b)
        best_cpu = max(best_cpu, len(values) / (time.process_time() - cpu))
        best_wall = max(best_wall, len(values) / (time.perf_counter() - wall))
    return best_cpu, best_wall, rejects, filled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", help="comma-separated case names")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)

    results = {}
    baseline = values_baseline = None
    for name, (c, values) in cases(args.events).items():
        if args.only and name not in args.only.split(","):
            continue
        per_second, per_wall_second, rejects, filled = measure(c, values, args.batch, args.repeats)
        if name == "geojson points":
            baseline, values_baseline = per_second, per_second * filled
        results[name] = {
            "events_per_cpu_second": round(per_second),
            "events_per_wall_second": round(per_wall_second),
            "vs_geojson_points": round(per_second / baseline, 2) if baseline else None,
            "mean_value_bytes": round(sum(map(len, values)) / len(values), 1),
            "rejects": rejects,
            "values_per_event": round(filled, 1),
            "values_per_cpu_second": round(per_second * filled),
            "values_vs_geojson_points": round(per_second * filled / values_baseline, 2) if values_baseline else None,
        }
        print(
            f"{name:24s} {per_second:12,.0f} events/CPU-s ({per_wall_second:,.0f}/s wall)  "
            f"{results[name]['vs_geojson_points'] or '':>5}x GeoJSON points  "
            f"{results[name]['mean_value_bytes']:6.1f} B/event  {filled:5.1f} values/event "
            f"({results[name]['values_vs_geojson_points'] or ''}x per value)  rejects {rejects}",
            flush=True,
        )
    meta = {"events": args.events, "batch": args.batch, "repeats": args.repeats, "cores": 1}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "formats.json").write_text(json.dumps({"settings": meta, "results": results}, indent=2) + "\n")
    lines = [
        "# Decode throughput per input format (one core)",
        "",
        f"Whole decoder, {args.events:,} events in batches of {args.batch:,}, best of {args.repeats}; "
        "the same real-city places in every format (bench/formats.py).",
        "",
        "The values an event fills are its columns' leaf values (a struct's members, a list's elements, a map's",
        "keys and values), nulls left out, and its geometry.",
        "",
        "| format | events per CPU second | vs GeoJSON points | events per wall second | bytes/event "
        "| values/event | values per CPU second | per value vs GeoJSON points | rejects |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['events_per_cpu_second']:,} | {r['vs_geojson_points']} | {r['events_per_wall_second']:,} "
            f"| {r['mean_value_bytes']} | {r['values_per_event']} | {r['values_per_cpu_second']:,} "
            f"| {r['values_vs_geojson_points']} | {r['rejects']} |"
        )
    (RESULTS / "formats.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""Debezium change events with an Avro converter (format "debezium", values in the Confluent wire
format): the envelope's schema as Apicurio's converter registers it for Debezium 3.6's PostgreSQL
connector (captured from tests/streaming/decode/formats/test_debezium_avro_service.py: the named
row type used twice, `connect.*` attributes, a union with "null" second, the `transaction` record,
ts_us / ts_ns), registered in the real registry (Apicurio, tests/conftest.py)
and its records written by fastavro; decoded with the same rules as the JSON converter's events.
tests/streaming/decode/formats/test_debezium_avro_service.py runs the real connector and converter."""

from __future__ import annotations

import copy
import json
import urllib.request
import uuid
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pytest
import shapely

from streaming.contract import parse_contract
from streaming.decode.decoder import DELETE, HILBERT, UNAVAILABLE, DecodeOptions, Decoder
from streaming.decode.formats.debezium import DebeziumFormat
from streaming.decode.properties import record_order
from streaming.decode.rejects import Reason
from streaming.decode.schema_registry import RegistrySettings
from tests.app.local.test_schema_registry import register
from tests.streaming.decode.formats.test_avro import avro_bytes, wire
from tests.streaming.decode.formats.test_debezium import (
    LARGE,
    PLACES,
    POLYGON,
    RAW_PLACES,
    UNAVAILABLE_TEXT,
    event,
    geom,
    key,
    large_values_contract,
)
from tests.streaming.decode.test_decoder import REJECT_DETAIL, REJECT_REASON, assert_valid, geometry_of, kafka_batch

pytestmark = pytest.mark.integration

GEOMETRY = {
    "type": "record",
    "name": "Geometry",
    "namespace": "io.debezium.data.geometry",
    "fields": [{"name": "wkb", "type": "bytes"}, {"name": "srid", "type": ["null", "int"], "default": None}],
    "connect.doc": "Geometry",
    "connect.version": 1,
    "connect.name": "io.debezium.data.geometry.Geometry",
}
ENUM_STRING = {
    "type": "string",
    "connect.version": 1,
    "connect.parameters": {
        "allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"
    },
    "connect.default": "false",
    "connect.name": "io.debezium.data.Enum",
}


def optional(avro_type: object) -> list:
    return ["null", avro_type]


SOURCE_FIELDS = [
    {"name": "version", "type": "string"},
    {"name": "connector", "type": "string"},
    {"name": "name", "type": "string"},
    {"name": "ts_ms", "type": "long"},
    {"name": "snapshot", "type": [ENUM_STRING, "null"], "default": "false"},
    {"name": "db", "type": "string"},
    {"name": "sequence", "type": optional("string"), "default": None},
    {"name": "ts_us", "type": optional("long"), "default": None},
    {"name": "ts_ns", "type": optional("long"), "default": None},
    {"name": "schema", "type": "string"},
    {"name": "table", "type": "string"},
    {"name": "txId", "type": optional("long"), "default": None},
    {"name": "lsn", "type": optional("long"), "default": None},
    {"name": "xmin", "type": optional("long"), "default": None},
    {"name": "origin", "type": optional("string"), "default": None},
    {"name": "origin_lsn", "type": optional("long"), "default": None},
]
SOURCE = {
    "type": "record",
    "name": "Source",
    "namespace": "io.debezium.connector.postgresql",
    "fields": SOURCE_FIELDS,
    "connect.version": 1,
    "connect.name": "io.debezium.connector.postgresql.Source",
}


def envelope(prefix: str, height: bool = False, source: object = SOURCE, large: bool = False) -> dict:
    """The value schema of `<prefix>.public.places` (id bigint, name text, geom geometry[, height
    float8][, note text, score float8, blob bytea]) as the Avro converter writes Debezium's Connect schema."""
    row = [
        {"name": "id", "type": "long"},
        {"name": "name", "type": optional("string"), "default": None},
        {"name": "geom", "type": optional(GEOMETRY), "doc": "Geometry", "default": None},
    ]
    if height:
        row.append({"name": "height", "type": optional("double"), "default": None})
    if large:
        row += [
            {"name": "note", "type": optional("string"), "default": None},
            {"name": "score", "type": optional("double"), "default": None},
            {"name": "blob", "type": optional("bytes"), "default": None},
        ]
    block = {
        "type": "record",
        "name": "block",
        "namespace": "event",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "total_order", "type": "long"},
            {"name": "data_collection_order", "type": "long"},
        ],
        "connect.version": 1,
        "connect.name": "event.block",
    }
    value = {"type": "record", "name": "Value", "fields": row, "connect.name": f"{prefix}.public.places.Value"}
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": f"{prefix}.public.places",
        "fields": [
            {"name": "before", "type": optional(value), "default": None},
            {"name": "after", "type": optional("Value"), "default": None},
            {"name": "source", "type": source},
            {"name": "transaction", "type": optional(block), "default": None},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": optional("long"), "default": None},
            {"name": "ts_us", "type": optional("long"), "default": None},
            {"name": "ts_ns", "type": optional("long"), "default": None},
        ],
        "connect.version": 2,
        "connect.name": f"{prefix}.public.places.Envelope",
    }


def key_schema(prefix: str) -> dict:
    return {
        "type": "record",
        "name": "Key",
        "namespace": f"{prefix}.public.places",
        "fields": [{"name": "id", "type": "long"}],
        "connect.name": f"{prefix}.public.places.Key",
    }


def ewkb(geometry: shapely.Geometry, srid: int = 4326) -> dict:
    return {"wkb": shapely.to_wkb(shapely.set_srid(geometry, srid), include_srid=True), "srid": srid}


def change(op: str, after: dict | None = None, before: dict | None = None, lsn: int = 100) -> dict:
    source = {
        "version": "3.6.1.Final",
        "connector": "postgresql",
        "name": "dbz",
        "ts_ms": 1_764_000_000_000,
        "snapshot": "true" if op == "r" else None,
        "db": "geo",
        "sequence": '["1","2"]',
        "ts_us": 1_764_000_000_000_000,
        "ts_ns": None,
        "schema": "public",
        "table": "places",
        "txId": 7,
        "lsn": lsn,
        "xmin": None,
        "origin": None,
        "origin_lsn": None,
    }
    return {
        "before": before,
        "after": after,
        "source": source,
        "transaction": None,
        "op": op,
        "ts_ms": 1_764_000_000_100,
        "ts_us": None,
        "ts_ns": None,
    }


def row(i: int, geometry: shapely.Geometry, **more) -> dict:
    return {"id": i, "name": f"p{i}", "geom": ewkb(geometry), **more}


class Registered(NamedTuple):
    """A topic's schemas in the registry: the value schema, its version with a column added, the key's."""

    prefix: str
    v1: int
    v2: int
    key: int


@pytest.fixture
def registered(schema_registry) -> Registered:
    prefix = f"dbz{uuid.uuid4().hex[:8]}"
    topic = f"{prefix}.public.places"
    return Registered(
        prefix,
        register(schema_registry.url, f"{topic}-value", envelope(prefix)),
        register(schema_registry.url, f"{topic}-value", envelope(prefix, height=True)),
        register(schema_registry.url, f"{topic}-key", key_schema(prefix)),
    )


def decoder(schema_registry, contract=PLACES) -> Decoder:
    return Decoder(contract, DecodeOptions(schema_registry=RegistrySettings(url=schema_registry.url)))


def value(ids: Registered, version: str, record: dict) -> bytes:
    schema_id = ids.v2 if version == "v2" else ids.v1
    return wire(schema_id, avro_bytes(envelope(ids.prefix, height=version == "v2"), record))


def avro_key(ids: Registered, i: int) -> bytes:
    return wire(ids.key, avro_bytes(key_schema(ids.prefix), {"id": i}))


def test_inserts_reads_updates_deletes_and_tombstones_as_the_json_events_are(schema_registry, registered):
    rng = np.random.default_rng(9)
    xy = rng.uniform([-170, -80], [170, 80], (300, 2))
    polygon = shapely.Polygon([(2.0, 48.0), (3.0, 48.0), (3.0, 49.0), (2.0, 48.0)])
    values: list[bytes | None] = [
        value(registered, "v1", change("cru"[i % 3], row(i, shapely.Point(x, y)))) for i, (x, y) in enumerate(xy)
    ]
    values += [
        value(registered, "v1", change("c", row(300, polygon))),
        value(registered, "v1", change("d", before={"id": 301, "name": None, "geom": ewkb(shapely.Point(0, 0))})),
        None,  # the tombstone of 301, its key an Avro record
        # The JSON converter's events in the same batch (a connector moved to Avro keeps its topic).
        event("c", {"id": 302, "name": "json", "geom": geom(shapely.Point(1, 2))}),
    ]
    keys = [avro_key(registered, i) for i in range(302)] + [avro_key(registered, 301), key(302)]
    rows = decoder(schema_registry).decode(kafka_batch(values, keys)).to_pylist()
    for i, r in enumerate(rows[:300]):
        assert_valid(r)
        assert (r["id"], r["name"], r[DELETE]) == (i, f"p{i}", False)
        point = geometry_of(r)
        assert (point.x, point.y) == tuple(xy[i])  # lossless: the EWKB's doubles as sent
    assert_valid(rows[300])
    assert shapely.equals(geometry_of(rows[300]), polygon)
    for r in rows[301:303]:
        assert_valid(r)
        assert (r["id"], r[DELETE], r["geometry"]) == (301, True, None)
    assert_valid(rows[303])
    assert (rows[303]["id"], rows[303]["name"], rows[303][DELETE]) == (302, "json", False)


def test_columns_read_the_operation_the_log_position_and_the_commit_time(schema_registry, registered):
    raw = copy.deepcopy(RAW_PLACES)
    raw["columns"] += [
        {"id": 5, "name": "op", "type": "string", "from": ["debezium.op"]},
        {"id": 6, "name": "lsn", "type": "long", "from": ["debezium.lsn"]},
        {"id": 7, "name": "committed_at", "type": "timestamptz", "required": True, "from": ["debezium.commit_time"]},
    ]
    point = shapely.Point(1, 2)
    values = [
        value(registered, "v1", change("u", row(1, point), lsn=42)),
        event("d", before={"id": 2}, lsn=43, schemas=True),
        value(registered, "v2", change("c", row(3, point, height=2.5), lsn=44)),
    ]
    rows = decoder(schema_registry, parse_contract(raw)).decode(kafka_batch(values)).to_pylist()
    for r in rows:
        assert_valid(r)
    assert [(r["op"], r["lsn"]) for r in rows] == [("u", 42), ("d", 43), ("c", 44)]
    assert rows[0]["committed_at"].timestamp() == 1_764_000_000.0  # source.ts_ms


def test_bad_events_are_rejects_with_their_reasons(schema_registry, registered):
    point = shapely.Point(1, 2)
    no_op = register(
        schema_registry.url,
        f"{registered.prefix}.other-value",
        {"type": "record", "name": "NotAnEnvelope", "fields": [{"name": "id", "type": "long"}]},
    )
    good = value(registered, "v1", change("c", row(1, point)))
    values: list[bytes | None] = [
        wire(999_999, good[5:]),  # an id the registry does not know
        good[:-4],  # truncated
        b"\x00\x00\x01",  # no room for a schema id
        wire(no_op, avro_bytes({"type": "record", "name": "N", "fields": [{"name": "id", "type": "long"}]}, {"id": 1})),
        value(registered, "v1", change("t", row(2, point))),  # a truncate
        value(registered, "v1", change("u", None)),  # an update without its row
        value(registered, "v1", change("d", None, None)),  # a delete without its key
        value(registered, "v1", change("c", {"id": 3, "name": "x", "geom": {"wkb": b"\x01\x01\x00", "srid": 4326}})),
        value(registered, "v1", change("c", {"id": 4, "name": "no geometry", "geom": None})),
        None,  # a tombstone whose Avro key names an unknown schema
    ]
    keys = [avro_key(registered, i) for i in range(len(values) - 1)] + [wire(999_998, b"\x02")]
    rows = decoder(schema_registry).decode(kafka_batch(values, keys)).to_pylist()
    assert [r[REJECT_REASON] for r in rows] == [
        Reason.UNKNOWN_SCHEMA_ID,
        Reason.SCHEMA_MISMATCH,
        Reason.BAD_WIRE_FORMAT,
        Reason.NOT_A_CHANGE_EVENT,
        Reason.UNKNOWN_OPERATION,
        Reason.MISSING_ROW,
        Reason.MISSING_ROW,
        Reason.BAD_WKB,
        Reason.MISSING_GEOMETRY,
        Reason.UNKNOWN_SCHEMA_ID,
    ]
    assert "999999" in rows[0][REJECT_DETAIL] and schema_registry.url in rows[0][REJECT_DETAIL]
    assert "'t'" in rows[4][REJECT_DETAIL]
    assert "after.geom" in rows[7][REJECT_DETAIL]
    assert "tombstone" in rows[9][REJECT_DETAIL]
    assert all(r[DELETE] is False for r in rows)


def test_a_column_added_in_a_new_schema_version_is_seen_for_schema_evolution(schema_registry, registered):
    point = shapely.Point(1, 2)
    values = [
        value(registered, "v1", change("c", row(1, point))),
        event("u", {"id": 2, "name": "b", "geom": geom(point), "floors": 4}),
        value(registered, "v2", change("u", row(1, point, height=12.5))),
    ]
    batch = kafka_batch(values)
    fmt = DebeziumFormat(PLACES, 32, {"id": pa.int64(), "name": pa.string()})
    fmt.use_registry(RegistrySettings(url=schema_registry.url))
    rows = np.arange(3)
    seen = fmt.unmapped_fields(batch.column("value"), rows, frozenset({"id", "name"}), record_order(batch, rows))
    assert {name: s.type for name, s in seen.items()} == {"height": "double", "floors": "long"}
    assert seen["height"].first[2] == batch.column("offset")[2].as_py()
    # and the decoder reads the new version's rows as the old one's
    for r in decoder(schema_registry).decode(batch).to_pylist():
        assert_valid(r)


def test_an_envelope_that_names_its_source_record_registered_apart_is_read_with_it(schema_registry):
    # What Apicurio's converter registers unless told to dereference (apicurio.registry.dereference-schema):
    # the envelope names its `source` record, a schema of its own (a schema reference).
    prefix = f"dbz{uuid.uuid4().hex[:8]}"
    register(schema_registry.url, f"{prefix}-source", SOURCE)
    full_name = f"{SOURCE['namespace']}.{SOURCE['name']}"
    request = urllib.request.Request(
        f"{schema_registry.url}/subjects/{prefix}.public.places-value/versions",
        data=json.dumps(
            {
                "schema": json.dumps(envelope(prefix, source=full_name)),
                "references": [{"name": full_name, "subject": f"{prefix}-source", "version": 1}],
            }
        ).encode(),
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        schema_id = int(json.loads(response.read())["id"])
    point = shapely.Point(13.4, 52.5)
    body = avro_bytes(envelope(prefix), change("c", row(1, point), lsn=77))  # the same bytes either way
    [r] = decoder(schema_registry).decode(kafka_batch([wire(schema_id, body)])).to_pylist()
    assert_valid(r)
    assert (r["id"], r["name"], geometry_of(r).coords[0]) == (1, "p1", (13.4, 52.5))


# -- large values: TOASTed columns, REPLICA IDENTITY FULL (as test_debezium.py's JSON events) -----
def large_row(i: int, **changes) -> dict:
    row = {"id": i, "name": f"p{i}", "geom": ewkb(POLYGON), "note": "n" * 12_000, "score": 1.5, "blob": b"\x01\x02"}
    return {**row, **changes}


@pytest.fixture
def large(schema_registry) -> tuple[str, int]:
    """The prefix and value schema id of a table with a text, a double and a bytea column."""
    prefix = f"dbz{uuid.uuid4().hex[:8]}"
    return prefix, register(schema_registry.url, f"{prefix}.public.places-value", envelope(prefix, large=True))


def large_value(large: tuple[str, int], record: dict) -> bytes:
    prefix, schema_id = large
    return wire(schema_id, avro_bytes(envelope(prefix, large=True), record))


def test_full_identity_updates_and_deletes_are_read_by_their_key_alone(schema_registry, large):
    # REPLICA IDENTITY FULL: before holds the whole old row; only its key is read. Avro holds a NaN
    # as it is (this converter's NaN was never rejected), but before this each old value was cast
    # to its column's type: a delete whose old value does not fit (a float8 source, a long column)
    # was rejected, although a delete needs its key alone.
    raw = copy.deepcopy(RAW_PLACES)
    raw["columns"].append({"id": 5, "name": "score", "type": "long", "from": ["properties.score"]})
    values = [
        large_value(large, change("u", large_row(1, score=None), before=large_row(1, score=float("nan")))),
        large_value(large, change("d", before=large_row(2, score=float("nan")))),
        large_value(large, change("d", before=large_row(3, score=2.5))),
        large_value(large, change("u", large_row(4, score=2.5))),  # a new value must fit, as ever
    ]
    rows = decoder(schema_registry, parse_contract(raw)).decode(kafka_batch(values)).to_pylist()
    for r in rows[:3]:
        assert_valid(r)
    assert [(r["id"], r[DELETE], r["score"]) for r in rows[:3]] == [(1, False, None), (2, True, None), (3, True, None)]
    assert rows[3][REJECT_REASON] == Reason.PROPERTY_TYPE_MISMATCH and "score" in rows[3][REJECT_DETAIL]


def test_nan_in_a_double_column_lands_as_nan(schema_registry, large):
    values = [large_value(large, change("u", large_row(1, score=float("nan"))))]
    [r] = decoder(schema_registry, LARGE).decode(kafka_batch(values)).to_pylist()
    assert_valid(r)
    assert np.isnan(r["score"])


def test_values_an_update_left_unchanged_are_listed_never_stored(schema_registry, large):
    # The Avro converter's shapes of them: the placeholder as text, its bytes for a bytea column,
    # a null struct for the geometry.
    lacking = large_row(1, note=UNAVAILABLE_TEXT, blob=UNAVAILABLE_TEXT.encode(), geom=None, score=3.5)
    values = [
        large_value(large, change("u", lacking)),
        large_value(large, change("u", large_row(2, geom=None))),
        large_value(large, change("u", large_row(3))),
        large_value(large, change("c", large_row(4, geom=None))),
        large_value(large, change("r", large_row(5, geom=None))),
    ]
    rows = decoder(schema_registry, LARGE).decode(kafka_batch(values)).to_pylist()
    for r in rows[:3]:
        assert_valid(r)
        assert r[DELETE] is False
    first = rows[0]
    assert (first["id"], first["name"], first["score"]) == (1, "p1", 3.5)
    assert (first["notes"], first["blob"], first["geometry"], first["bbox"], first[HILBERT]) == (None,) * 5
    assert [r[UNAVAILABLE] for r in rows[:3]] == [["notes", "blob", "geometry"], ["geometry"], None]
    assert (rows[1]["notes"], rows[1]["blob"]) == ("n" * 12_000, b"\x01\x02")
    assert shapely.equals(geometry_of(rows[2]), POLYGON)
    assert [r[REJECT_REASON] for r in rows[3:]] == [Reason.MISSING_GEOMETRY] * 2


def test_in_append_mode_an_update_without_its_geometry_is_a_reject(schema_registry, large):
    values = [large_value(large, change("u", large_row(1, geom=None, note=UNAVAILABLE_TEXT)))]
    [r] = decoder(schema_registry, large_values_contract(mode="append")).decode(kafka_batch(values)).to_pylist()
    assert r[REJECT_REASON] == Reason.UNAVAILABLE_VALUE and "after.geom" in r[REJECT_DETAIL]

"""Debezium change events (format "debezium"): the envelope with the JSON converter's schemas on or
off, PostGIS geometries as {wkb, srid} structs, inserts / reads / updates as rows, deletes and
tombstones as deletes of their key, bad envelopes as rejects with their reasons. The events are
spelt as Debezium's PostgreSQL connector writes them (tests/app/local/test_kafka_connect.py
checks the real connector's)."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import shapely
from pyproj import Transformer

from streaming.contract import ContractError, load_contract, parse_contract
from streaming.decode.decoder import DELETE, Decoder
from streaming.decode.formats.debezium import DebeziumFormat, _payloads
from streaming.decode.properties import record_order
from streaming.decode.rejects import Reason
from tests.streaming.decode.test_decoder import REJECT_DETAIL, REJECT_REASON, assert_valid, geometry_of, kafka_batch

SCHEMAS = Path(__file__).resolve().parents[4] / "schemas"
PLACES = load_contract(SCHEMAS / "postgis_places.json")
RAW_PLACES = json.loads((SCHEMAS / "postgis_places.json").read_text())
GEOMETRY_SCHEMA = {
    "type": "struct",
    "fields": [
        {"type": "bytes", "optional": False, "field": "wkb"},
        {"type": "int32", "optional": True, "field": "srid"},
    ],
    "optional": True,
    "name": "io.debezium.data.geometry.Geometry",
    "field": "geom",
}


def geom(geometry: shapely.Geometry, srid: int | None = 4326, ewkb: bool = True) -> dict:
    if ewkb and srid:
        geometry = shapely.set_srid(geometry, srid)
    blob = shapely.to_wkb(geometry, include_srid=ewkb and bool(srid))
    return {"wkb": base64.b64encode(blob).decode(), "srid": srid}


def event(
    op: str, after: dict | None = None, before: dict | None = None, lsn: int = 100, schemas: bool = False
) -> bytes:
    envelope = {
        "before": before,
        "after": after,
        "source": {"version": "3.6.1.Final", "connector": "postgresql", "lsn": lsn, "ts_ms": 1_764_000_000_000},
        "op": op,
        "ts_ms": 1_764_000_000_100,
    }
    if not schemas:
        return json.dumps(envelope).encode()
    row = {
        "type": "struct",
        "fields": [
            {"type": "int64", "optional": False, "field": "id"},
            {"type": "string", "field": "name"},
            GEOMETRY_SCHEMA,
        ],
    }
    schema = {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"}]}
    return json.dumps({"schema": schema, "payload": envelope}).encode()


def key(i: int, schemas: bool = False) -> bytes:
    if schemas:
        return json.dumps({"schema": {"type": "struct", "fields": []}, "payload": {"id": i}}).encode()
    return json.dumps({"id": i}).encode()


# The reasons only change events have (test_bad_envelopes_are_rejects_with_their_reasons).
DEBEZIUM_REASONS = {Reason.NOT_A_CHANGE_EVENT, Reason.UNKNOWN_OPERATION, Reason.MISSING_ROW}


def decode(values: list[bytes | None], keys: list[bytes | None] | None = None, contract=PLACES) -> list[dict]:
    return Decoder(contract).decode(kafka_batch(values, keys=keys)).to_pylist()


@pytest.mark.parametrize("schemas", [False, True], ids=["bare", "schemas"])
def test_inserts_reads_and_updates_are_rows_with_their_geometry(schemas: bool):
    rng = np.random.default_rng(5)
    xy = rng.uniform([-170, -80], [170, 80], (300, 2))
    ops = ["c", "r", "u"]
    values = [
        event(ops[i % 3], {"id": i, "name": f"p{i}", "geom": geom(shapely.Point(x, y))}, schemas=schemas)
        for i, (x, y) in enumerate(xy)
    ]
    rows = decode(values, [key(i, schemas) for i in range(len(values))])
    for i, row in enumerate(rows):
        assert_valid(row)
        assert (row["id"], row["name"], row[DELETE]) == (i, f"p{i}", False)
        point = geometry_of(row)
        assert (point.x, point.y) == tuple(xy[i])  # lossless: the bytes' doubles as sent


def test_polygons_and_lines_keep_their_shape_and_other_crs_are_reprojected():
    polygon = shapely.Polygon([(2.0, 48.0), (3.0, 48.0), (3.0, 49.0), (2.0, 48.0)])
    lambert = shapely.Point(652_000.0, 6_862_000.0)  # Paris in EPSG:2154 (RGF93 / Lambert-93)
    line = shapely.LineString([(0, 0), (1, 1)])
    rows = decode(
        [
            event("c", {"id": 1, "name": "poly", "geom": geom(polygon)}),
            event("c", {"id": 2, "name": "lambert", "geom": geom(lambert, 2154)}),
            # plain WKB with the SRID in the struct only, and plain WKB with no SRID (the contract's CRS)
            event("c", {"id": 3, "name": "struct srid", "geom": geom(lambert, 2154, ewkb=False)}),
            event("c", {"id": 4, "name": "no srid", "geom": geom(line, None, ewkb=False)}),
        ]
    )
    for row in rows:
        assert_valid(row)
    assert shapely.equals(geometry_of(rows[0]), polygon)
    lon, lat = Transformer.from_crs(2154, 4326, always_xy=True).transform(lambert.x, lambert.y)
    for row in rows[1:3]:
        assert geometry_of(row).distance(shapely.Point(lon, lat)) < 1e-9
    assert shapely.equals(geometry_of(rows[3]), line)


@pytest.mark.parametrize("schemas", [False, True], ids=["bare", "schemas"])
def test_deletes_and_tombstones_delete_their_key(schemas: bool):
    values = [
        event("d", before={"id": 7, "name": None, "geom": None}, schemas=schemas),
        None,  # the tombstone Debezium writes after the delete
    ]
    rows = decode(values, [key(7, schemas), key(7, schemas)])
    for row in rows:
        assert_valid(row)
        assert row[DELETE] is True and row["id"] == 7
        assert row["geometry"] is None and row["bbox"] is None


def test_bad_envelopes_are_rejects_with_their_reasons():
    point = geom(shapely.Point(1, 2))
    values = [
        b'{"before": null, "after": {"id": 1}}',  # no op
        event("t", {"id": 2, "geom": point}),  # a truncate
        event("u", None),  # an update without its row
        event("d", None, None),  # a delete without its key
        event("c", {"id": 5, "name": "x", "geom": None}),  # no geometry
        event("c", {"id": 6, "geom": {"wkb": "not base64!", "srid": 4326}}),
        event("c", {"id": 7, "geom": {"wkb": base64.b64encode(b"\x01\x01\x00").decode(), "srid": 4326}}),
        event("c", {"id": "eight", "geom": point}),  # a key of another type
        event("c", {"name": "no id", "geom": point}),
        b"[1, 2]",
        b"{not json",
        None,  # a tombstone whose key is not JSON
    ]
    keys = [key(i) for i in range(len(values) - 1)] + [b"\xff"]
    rows = decode(values, keys)
    reasons = [row[REJECT_REASON] for row in rows]
    assert reasons == [
        Reason.NOT_A_CHANGE_EVENT,
        Reason.UNKNOWN_OPERATION,
        Reason.MISSING_ROW,
        Reason.MISSING_ROW,
        Reason.MISSING_GEOMETRY,
        Reason.BAD_GEOMETRY_ENCODING,
        Reason.BAD_WKB,
        Reason.PROPERTY_TYPE_MISMATCH,
        Reason.MISSING_REQUIRED_FIELD,
        Reason.NOT_A_CHANGE_EVENT,
        Reason.MALFORMED_JSON,
        Reason.MALFORMED_JSON,
    ]
    assert "'t'" in rows[1][REJECT_DETAIL]
    assert "after.geom" in rows[4][REJECT_DETAIL] and "after.geom" in rows[6][REJECT_DETAIL]
    assert all(row[DELETE] is False for row in rows)


def test_a_source_column_the_contract_lacks_is_seen_for_schema_evolution():
    point = geom(shapely.Point(1, 2))
    values = [
        event("c", {"id": 1, "name": "a", "geom": point}),
        event("u", {"id": 1, "name": "a", "geom": point, "height": 12.5}, schemas=True),
        event("u", {"id": 2, "name": "b", "geom": point, "height": 3, "floors": 4}),
    ]
    batch = kafka_batch(values)
    fmt = DebeziumFormat(PLACES, 32, {"id": pa.int64(), "name": pa.string()})
    rows = np.arange(3)
    seen = fmt.unmapped_fields(batch.column("value"), rows, frozenset({"id", "name"}), record_order(batch, rows))
    assert {name: s.type for name, s in seen.items()} == {"height": "double", "floors": "long"}
    assert seen["height"].first[2] == batch.column("offset")[1].as_py()


def test_the_contract_section_is_checked():
    def with_changes(**changes):
        raw = copy.deepcopy(RAW_PLACES)
        raw.update(changes)
        return raw

    with pytest.raises(ContractError, match="mode"):
        parse_contract(with_changes(mode="append"))
    with pytest.raises(ContractError, match="debezium: missing"):
        raw = with_changes()
        del raw["debezium"]
        parse_contract(raw)
    with pytest.raises(ContractError, match="nothing else"):
        parse_contract(with_changes(formats=["debezium", "geojson"]))
    raw = with_changes()
    raw["columns"][1]["from"] = ["properties.geom"]
    with pytest.raises(ContractError, match="holds the geometry"):
        parse_contract(raw)


def test_an_enveloped_event_whose_schema_names_payload_itself_is_read_whole():
    # The payload is cut out of an enveloped event before reading; a schema holding the text
    # "payload": (a column's parameters) makes that cut wrong, and the event is read whole instead.
    point = geom(shapely.Point(3.5, 4.5))
    tricky = json.dumps(
        {
            "schema": {"type": "struct", "parameters": {"payload": {"op": "d"}}, "fields": []},
            "payload": json.loads(event("c", {"id": 9, "name": "tricky", "geom": point})),
        },
        separators=(",", ":"),
    ).encode()
    plain = event("u", {"id": 10, "name": "plain", "geom": point}, schemas=True)
    assert _payloads(pa.array([tricky, plain, event("c", {"id": 1})]))[1].tolist() == [True, True, False]
    rows = decode([tricky, plain])
    for row in rows:
        assert_valid(row)
    assert [(r["id"], r["name"], r[DELETE]) for r in rows] == [(9, "tricky", False), (10, "plain", False)]


def test_columns_can_read_the_operation_the_log_position_and_the_commit_time():
    raw = copy.deepcopy(RAW_PLACES)
    raw["columns"] += [
        {"id": 5, "name": "op", "type": "string", "from": ["debezium.op"]},
        {"id": 6, "name": "lsn", "type": "long", "from": ["debezium.lsn"]},
        {"id": 7, "name": "committed_at", "type": "timestamptz", "required": True, "from": ["debezium.commit_time"]},
    ]
    raw["geometry"]["id"], raw["bbox"]["id"] = 3, 4
    contract = parse_contract(raw)
    point = geom(shapely.Point(1, 2))
    rows = decode(
        [event("u", {"id": 1, "name": "a", "geom": point}, lsn=42), event("d", before={"id": 2}, lsn=43, schemas=True)],
        contract=contract,
    )
    for row in rows:
        assert_valid(row)
    assert [(r["op"], r["lsn"]) for r in rows] == [("u", 42), ("d", 43)]
    assert rows[0]["committed_at"].timestamp() == 1_764_000_000.0  # source.ts_ms
    demo = json.loads((SCHEMAS / "demo_events.json").read_text())
    demo["columns"][0]["from"] = ["debezium.lsn"]
    with pytest.raises(ContractError, match="'debezium' is not in formats"):
        parse_contract(demo)


def test_with_schema_evolution_off_the_source_columns_the_contract_lacks_are_counted():
    raw = copy.deepcopy(RAW_PLACES)
    raw["schema_evolution"] = "off"
    decoder = Decoder(parse_contract(raw))
    point = geom(shapely.Point(1, 2))
    decoder.decode(kafka_batch([event("c", {"id": 1, "name": "a", "geom": point, "height": 2.5})]))
    assert {name: seen.type for name, seen in decoder.unmapped.items()} == {"height": "double"}

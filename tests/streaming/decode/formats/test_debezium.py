"""Debezium change events (format "debezium"): the envelope with the JSON converter's schemas on or
off, PostGIS geometries as {wkb, srid} structs, inserts / reads / updates as rows, deletes and
tombstones as deletes of their key, bad envelopes as rejects with their reasons. The events are
spelt as Debezium's PostgreSQL connector writes them (tests/app/local/test_kafka_connect.py
checks the real connector's)."""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import shapely
from pyproj import Transformer

from streaming.contract import Contract, ContractError, load_contract, parse_contract
from streaming.decode.decoder import DELETE, HILBERT, UNAVAILABLE, Decoder
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


# The Connect schema of each source column the tests' rows hold, as the JSON converter writes it.
FIELD_SCHEMAS = {
    "id": {"type": "int64", "optional": False},
    "name": {"type": "string", "optional": True},
    "note": {"type": "string", "optional": True},
    "score": {"type": "double", "optional": True},
    "blob": {"type": "bytes", "optional": True},
    "height": {"type": "double", "optional": True},
    "floors": {"type": "int64", "optional": True},
    "geom": GEOMETRY_SCHEMA,
}


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
    columns = dict.fromkeys(["id", "name", "geom", *(after or {}), *(before or {})])
    fields = [{**FIELD_SCHEMAS.get(c, {"type": "string", "optional": True}), "field": c} for c in columns]
    row = {"type": "struct", "fields": fields, "optional": True, "name": "dbz.public.places.Value"}
    schema = {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"}]}
    return json.dumps({"schema": schema, "payload": envelope}).encode()


def key(i: int, schemas: bool = False) -> bytes:
    if schemas:
        return json.dumps({"schema": {"type": "struct", "fields": []}, "payload": {"id": i}}).encode()
    return json.dumps({"id": i}).encode()


# The reasons only change events have (test_bad_envelopes_are_rejects_with_their_reasons).
DEBEZIUM_REASONS = {Reason.NOT_A_CHANGE_EVENT, Reason.UNKNOWN_OPERATION, Reason.MISSING_ROW, Reason.UNAVAILABLE_VALUE}


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
        {"id": 3, "name": "op", "type": "string", "from": ["debezium.op"]},
        {"id": 4, "name": "lsn", "type": "long", "from": ["debezium.lsn"]},
        {"id": 5, "name": "committed_at", "type": "timestamptz", "required": True, "from": ["debezium.commit_time"]},
    ]
    raw["geometry"]["id"], raw["bbox"]["id"] = 6, 7
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


# -- large values: TOASTed columns, REPLICA IDENTITY FULL ----------------------------------------
# What Debezium's PostgreSQL connector (3.6.1, pgoutput, JSON converter) sends, measured with the real
# one (test_debezium_large_values.py decodes its events): an update that leaves a TOASTed value unchanged
# under REPLICA IDENTITY DEFAULT carries the placeholder for a text column, the placeholder's bytes
# (base64) for a bytea column and a null struct for a geometry; a double that is NaN or infinite is
# a string ("NaN", "Infinity", "-Infinity"); a delete or update under FULL has every old value in before.
UNAVAILABLE_TEXT = "__debezium_unavailable_value"
UNAVAILABLE_BYTES = base64.b64encode(UNAVAILABLE_TEXT.encode()).decode()


def large_values_contract(mode: str = "upsert", **debezium) -> Contract:
    """places with a text column the table names otherwise (notes, from the source's note), a
    double and a bytea column."""
    raw = copy.deepcopy(RAW_PLACES)
    raw["columns"] += [
        {"id": 3, "name": "notes", "type": "string", "from": ["properties.note"]},
        {"id": 4, "name": "score", "type": "double", "from": ["properties.score"]},
        {"id": 5, "name": "blob", "type": "binary", "from": ["properties.blob"]},
    ]
    raw["geometry"]["id"], raw["bbox"]["id"] = 6, 7
    raw["debezium"].update(debezium)
    contract = parse_contract(raw)
    # parse_contract takes format "debezium" in upsert tables alone; what a decoder does with one
    # in append mode is what it does for any table without current rows.
    return contract if mode == "upsert" else dataclasses.replace(contract, mode=mode)


LARGE = large_values_contract()
POLYGON = shapely.Polygon([(2.0, 48.0), (3.0, 48.0), (3.0, 49.0), (2.0, 48.0)])


def full_row(i: int, **changes) -> dict:
    row = {"id": i, "name": f"p{i}", "note": "n" * 12_000, "score": 1.5, "blob": None, "geom": geom(POLYGON)}
    return {**row, **changes}


@pytest.mark.parametrize("schemas", [False, True], ids=["bare", "schemas"])
def test_full_identity_updates_and_deletes_whose_old_values_hold_nan_are_applied(schemas: bool):
    # REPLICA IDENTITY FULL: before holds the whole old row. Only its key is read: before this,
    # every old value was parsed with its column's type and a NaN rejected the event.
    values = [
        event("u", full_row(1, score=2.5), before=full_row(1, score="NaN"), schemas=schemas),
        event("d", before=full_row(2, score="NaN"), schemas=schemas),
        event("d", before=full_row(3, score="Infinity", name=12, blob="not base64!"), schemas=schemas),
    ]
    rows = decode(values, contract=LARGE)
    for row in rows:
        assert_valid(row)
    assert [(r["id"], r[DELETE], r["score"]) for r in rows] == [(1, False, 2.5), (2, True, None), (3, True, None)]
    assert rows[0]["name"] == "p1" and shapely.equals(geometry_of(rows[0]), POLYGON)


@pytest.mark.parametrize("schemas", [False, True], ids=["bare", "schemas"])
def test_nan_and_infinities_in_a_double_column_land_as_they_are(schemas: bool):
    # The JSON converter quotes them; they were rejected as property_type_mismatch (not a double).
    values = [
        event("c", full_row(1, score="NaN"), schemas=schemas),
        event("u", full_row(2, score="Infinity"), schemas=schemas),
        event("r", full_row(3, score="-Infinity"), schemas=schemas),
        event("u", full_row(4, score=0.5), schemas=schemas),
        event("u", full_row(5, score="nan"), schemas=schemas),  # no spelling the converter writes
    ]
    rows = decode(values, contract=LARGE)
    for row in rows[:4]:
        assert_valid(row)
    assert np.isnan(rows[0]["score"])
    assert [r["score"] for r in rows[1:4]] == [float("inf"), float("-inf"), 0.5]
    assert rows[4][REJECT_REASON] == Reason.PROPERTY_TYPE_MISMATCH and "after.score" in rows[4][REJECT_DETAIL]


@pytest.mark.parametrize("schemas", [False, True], ids=["bare", "schemas"])
def test_a_bytea_column_holds_its_bytes(schemas: bool):
    # The JSON converter writes bytes as base64 text: they were stored as that text, or rejected.
    blob = bytes(range(256)) * 3
    values = [
        event("c", full_row(1, blob=base64.b64encode(blob).decode()), schemas=schemas),
        event("u", full_row(2, blob="", score="NaN"), schemas=schemas),  # an empty bytea, in a block read row by row
        event("u", full_row(3, blob=None), schemas=schemas),
        event("u", full_row(4, blob="AQI"), schemas=schemas),
    ]
    rows = decode(values, contract=LARGE)
    for row in rows[:3]:
        assert_valid(row)
    assert [r["blob"] for r in rows[:3]] == [blob, b"", None]
    assert rows[3][REJECT_REASON] == Reason.PROPERTY_TYPE_MISMATCH
    assert "properties.blob" in rows[3][REJECT_DETAIL] and "base64" in rows[3][REJECT_DETAIL]


@pytest.mark.parametrize("schemas", [False, True], ids=["bare", "schemas"])
def test_values_an_update_left_unchanged_are_listed_never_stored(schemas: bool):
    # REPLICA IDENTITY DEFAULT: an update of the score leaves the TOASTed note, blob and geometry
    # out of the log. They were stored as the placeholder, and the missing geometry rejected the
    # update (missing_geometry), so no change of a row with a large geometry ever landed.
    lacking_all = full_row(1, score=3.5, note=UNAVAILABLE_TEXT, blob=UNAVAILABLE_BYTES, geom=None)
    values = [
        event("u", lacking_all, schemas=schemas),
        event("u", full_row(2, name="renamed", geom=None), schemas=schemas),
        event("u", full_row(3, note=UNAVAILABLE_TEXT), schemas=schemas),
        event("u", full_row(4), schemas=schemas),
        # An insert or a snapshot read carries every value: a null geometry is one, and the
        # placeholder's text is the row's text.
        event("c", full_row(5, geom=None), schemas=schemas),
        event("r", full_row(6, geom=None), schemas=schemas),
        event("c", full_row(7, note=UNAVAILABLE_TEXT), schemas=schemas),
    ]
    rows = decode(values, contract=LARGE)
    for row in rows[:4]:
        assert_valid(row)
        assert row[DELETE] is False
    first = rows[0]
    assert (first["id"], first["name"], first["score"]) == (1, "p1", 3.5)
    assert (first["notes"], first["blob"], first["geometry"], first["bbox"], first[HILBERT]) == (None,) * 5
    assert [r[UNAVAILABLE] for r in rows[:4]] == [["notes", "blob", "geometry"], ["geometry"], ["notes"], None]
    # The upsert pass stages the rows in the table's row type, a null where a value is unavailable.
    staged = Decoder(LARGE).decode(kafka_batch(values)).filter(pa.array([True] * 4 + [False] * 3))
    nullable = pa.schema([field.with_nullable(True) for field in LARGE.arrow_schema])
    assert staged.select(nullable.names).cast(nullable).column("bbox").null_count == 2
    assert rows[1]["name"] == "renamed" and rows[1]["notes"] == "n" * 12_000
    assert shapely.equals(geometry_of(rows[2]), POLYGON) and rows[2]["bbox"] is not None and rows[2][HILBERT] > 0
    assert [r[REJECT_REASON] for r in rows[4:6]] == [Reason.MISSING_GEOMETRY] * 2
    assert_valid(rows[6])
    assert rows[6]["notes"] == UNAVAILABLE_TEXT and rows[6][UNAVAILABLE] is None
    assert all(r[UNAVAILABLE] is None for r in rows[4:6])


def test_a_required_column_whose_value_is_unavailable_does_not_reject_its_update():
    raw = copy.deepcopy(RAW_PLACES)
    raw["columns"].append({"id": 5, "name": "note", "type": "string", "required": True, "from": ["properties.note"]})
    values = [event("u", {"id": 1, "name": "a", "note": UNAVAILABLE_TEXT, "geom": geom(POLYGON)})]
    values.append(event("u", {"id": 2, "name": "b", "note": None, "geom": geom(POLYGON)}))
    rows = decode(values, contract=parse_contract(raw))
    assert_valid(rows[0])
    assert rows[0]["note"] is None
    assert rows[0][UNAVAILABLE] == ["note"]
    assert rows[1][REJECT_REASON] == Reason.MISSING_REQUIRED_FIELD  # a null the event carries


def test_the_placeholder_is_the_one_the_connector_is_set_with():
    # unavailable.value.placeholder, which takes hexadecimal octets after "hex:" too
    for placeholder, text in (("~gone~", "~gone~"), ("hex:7e676f6e657e", "~gone~")):
        contract = large_values_contract(unavailable_value=placeholder)
        lacking = full_row(1, note=text, blob=base64.b64encode(text.encode()).decode())
        default = full_row(2, note=UNAVAILABLE_TEXT)
        rows = decode([event("u", lacking), event("u", default)], contract=contract)
        for row in rows:
            assert_valid(row)
        assert (rows[0]["notes"], rows[0]["blob"], rows[0][UNAVAILABLE]) == (None, None, ["notes", "blob"])
        assert (rows[1]["notes"], rows[1][UNAVAILABLE]) == (UNAVAILABLE_TEXT, None)
    with pytest.raises(ContractError, match="unavailable_value"):
        large_values_contract(unavailable_value="hex:zz")
    with pytest.raises(ContractError, match="unavailable_value"):
        large_values_contract(unavailable_value=7)


def test_in_append_mode_an_update_without_its_geometry_is_a_reject_and_unavailable_text_is_null():
    contract = large_values_contract(mode="append")
    values = [
        event("u", full_row(1, geom=None, note=UNAVAILABLE_TEXT)),
        event("u", full_row(2, note=UNAVAILABLE_TEXT)),
    ]
    rows = decode(values, contract=contract)
    assert rows[0][REJECT_REASON] == Reason.UNAVAILABLE_VALUE
    for named in ("after.geom", "REPLICA IDENTITY FULL", "reselect"):
        assert named in rows[0][REJECT_DETAIL]
    assert rows[0][UNAVAILABLE] is None  # a reject: its dead letter holds the event
    assert_valid(rows[1])
    assert (rows[1]["notes"], rows[1][UNAVAILABLE]) == (None, ["notes"])

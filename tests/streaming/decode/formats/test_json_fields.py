"""Plain JSON events with the geometry in fields (format "json"): lon / lat (/ z) at any path, or one
field holding WKT, a GeoJSON geometry, hex or base64 WKB; the other columns from JSON paths; each
kind of bad input its own reason, naming the field."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path

import numpy as np
import pytest
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st
from pyproj import Transformer

from streaming.contract import Contract, load_contract, parse_contract
from streaming.decode.rejects import Reason
from tests.streaming.decode.test_decoder import REJECT_DETAIL, REJECT_REASON, assert_valid, decode, geometry_of

SCHEMAS = Path(__file__).resolve().parents[4] / "schemas"
VEHICLES = load_contract(SCHEMAS / "vehicle_positions.json")
RAW_VEHICLES = json.loads((SCHEMAS / "vehicle_positions.json").read_text())


def vehicle(lon=2.35, lat=48.85, name="v1", **more) -> bytes:
    doc = {"vehicle": name, "position": {"lon": lon, "lat": lat}, "speed": 12.5, "ts": "2026-11-25T14:00:00Z"}
    doc.update(more)
    return json.dumps(doc).encode()


def with_json(section: dict, **changes) -> Contract:
    raw = copy.deepcopy(RAW_VEHICLES)
    raw["json"] = section
    raw.update(changes)
    return parse_contract(raw)


def geometry_field(encoding: str, path: str = "shape", crs: str = "EPSG:4326", types=None) -> Contract:
    raw = copy.deepcopy(RAW_VEHICLES)
    raw["json"] = {"geometry": {"path": path, "encoding": encoding}, "crs": crs}
    raw["geometry"]["types"] = types or ["Point", "LineString", "Polygon", "MultiPolygon"]
    raw["columns"][3]["from"] = ["json.heading"]
    return parse_contract(raw)


def test_a_position_lands_with_its_columns_and_exact_coordinates():
    rng = np.random.default_rng(3)
    lons, lats = rng.uniform(-180, 180, 500), rng.uniform(-90, 90, 500)
    values = [
        json.dumps(
            {
                "vehicle": f"v{i}",
                "position": {"lon": float(x), "lat": float(y), "heading": i % 360},
                "speed": i / 2,
                "ts": "2026-11-25T14:00:00Z",
            }
        ).encode()
        for i, (x, y) in enumerate(zip(lons, lats))
    ]
    rows = decode(values, VEHICLES)
    for i, row in enumerate(rows):
        assert_valid(row)
        assert row["vehicle"] == f"v{i}" and row["speed"] == i / 2 and row["heading"] == i % 360
        assert str(row["event_time"]) == "2026-11-25 14:00:00+00:00"
        point = geometry_of(row)
        assert (point.x, point.y) == (lons[i], lats[i]), "coordinates come back bit for bit"
        assert row["bbox"] == {"xmin": lons[i], "ymin": lats[i], "xmax": lons[i], "ymax": lats[i]}


def test_columns_fall_back_to_their_next_source_and_nested_paths_read():
    rows = decode([b'{"position": {"lon": 1, "lat": 2}}'], VEHICLES, keys=[b"from-key"])
    assert_valid(rows[0])
    assert rows[0]["vehicle"] == "from-key" and rows[0]["speed"] is None and rows[0]["heading"] is None


def test_a_z_field_makes_xyz_points_and_a_null_z_an_xy_point():
    contract = with_json({"lon": "position.lon", "lat": "position.lat", "z": "position.alt"})
    rows = decode(
        [b'{"vehicle": "a", "position": {"lon": 1.5, "lat": 2.5, "alt": 35.25}}', vehicle(3, 4)],
        contract,
    )
    assert geometry_of(rows[0]).equals_exact(shapely.Point(1.5, 2.5, 35.25), 0) and shapely.has_z(geometry_of(rows[0]))
    assert not shapely.has_z(geometry_of(rows[1]))


def test_coordinates_in_another_geographic_crs_are_reprojected():
    contract = with_json({"lon": "position.lon", "lat": "position.lat", "crs": "EPSG:4258"})
    rows = decode([vehicle(2.35, 48.85)], contract)
    assert_valid(rows[0])
    expected = Transformer.from_crs("EPSG:4258", "EPSG:4326", always_xy=True).transform(2.35, 48.85)
    assert geometry_of(rows[0]).equals_exact(shapely.Point(*expected), 1e-9)


# Each kind of bad input: its reason, and what the detail names.
BAD = {
    "lon as a string": (vehicle(lon="2.35"), Reason.COORDINATE_AS_STRING, ["position.lon", "'2.35'"]),
    "lat as a string": (vehicle(lat="48.85"), Reason.COORDINATE_AS_STRING, ["position.lat"]),
    "lat missing": (b'{"vehicle": "v", "position": {"lon": 1}}', Reason.MISSING_COORDINATES, ["position.lat"]),
    "lon null": (vehicle(lon=None), Reason.MISSING_COORDINATES, ["position.lon"]),
    "no position": (b'{"vehicle": "v"}', Reason.MISSING_COORDINATES, ["position.lon"]),
    "position null": (b'{"vehicle": "v", "position": null}', Reason.MISSING_COORDINATES, ["position.lon"]),
    "lon a boolean": (vehicle(lon=True), Reason.COORDINATE_NOT_A_NUMBER, ["position.lon", "True"]),
    "lat an object": (vehicle(lat={"deg": 48}), Reason.COORDINATE_NOT_A_NUMBER, ["position.lat"]),
    "position a number": (b'{"vehicle": "v", "position": 5}', Reason.COORDINATE_NOT_A_NUMBER, ["position", "5"]),
    "lat beyond 90": (vehicle(lon=100, lat=95.5), Reason.LATITUDE_OUT_OF_RANGE, ["position.lat", "95.5"]),
    "lat below -90": (vehicle(lon=-100, lat=-90.5), Reason.LATITUDE_OUT_OF_RANGE, ["-90.5"]),
    "lon beyond 180": (vehicle(lon=180.5, lat=10), Reason.LONGITUDE_OUT_OF_RANGE, ["position.lon", "180.5"]),
    "swapped": (vehicle(lon=48.85, lat=120.0), Reason.SWAPPED_AXES, ["swapped", "EPSG:4326"]),
    "NaN": (b'{"vehicle": "v", "position": {"lon": NaN, "lat": 1}}', Reason.NON_FINITE_COORDINATES, ["position.lon"]),
    "Infinity": (
        b'{"vehicle": "v", "position": {"lon": 1, "lat": -Infinity}}',
        Reason.NON_FINITE_COORDINATES,
        ["position.lat"],
    ),
    "1e400": (b'{"vehicle": "v", "position": {"lon": 1e400, "lat": 1}}', Reason.NON_FINITE_COORDINATES, ["lon"]),
    "column of another type": (vehicle(speed="fast"), Reason.PROPERTY_TYPE_MISMATCH, ["json.speed", "'fast'"]),
    "vehicle a number": (vehicle(name=17), Reason.PROPERTY_TYPE_MISMATCH, ["json.vehicle", "17"]),
    "bad timestamp": (vehicle(ts="yesterday"), Reason.PROPERTY_TYPE_MISMATCH, ["json.ts"]),
    "cut JSON": (b'{"vehicle": "v", "position": {"lon"', Reason.MALFORMED_JSON, ["not valid JSON"]),
    "two documents": (vehicle() + vehicle(), Reason.MALFORMED_JSON, ["Extra data"]),
    "not UTF-8": (b'{"vehicle": "\xff", "position": {"lon": 1, "lat": 2}}', Reason.MALFORMED_JSON, ["UTF-8"]),
    "an array": (b"[2.35, 48.85]", Reason.NOT_A_JSON_OBJECT, ["array"]),
    "a GeoJSON Feature": (
        b'{"type": "Feature", "geometry": {"type": "Point", "coordinates": [1, 2]}}',
        Reason.MISSING_COORDINATES,
        ["position.lon"],
    ),
}


def test_each_kind_of_bad_input_has_its_reason_between_good_records():
    values = []
    for value, _, _ in BAD.values():
        values += [vehicle(name="good"), value]
    rows = decode([*values, vehicle(name="good")], VEHICLES)
    for i, (name, (_, reason, names)) in enumerate(BAD.items()):
        good, bad = rows[2 * i], rows[2 * i + 1]
        assert_valid(good)
        assert bad[REJECT_REASON] == reason.value, (name, bad[REJECT_DETAIL])
        for part in names:
            assert part in bad[REJECT_DETAIL], (name, bad[REJECT_DETAIL])
    assert_valid(rows[-1])


def test_swapped_axes_are_told_by_a_regional_crs_area_of_use():
    contract = with_json({"lon": "position.lon", "lat": "position.lat", "crs": "EPSG:4258"})
    rows = decode([vehicle(lon=48.85, lat=2.35), vehicle(lon=2.35, lat=48.85)], contract)
    assert rows[0][REJECT_REASON] == "swapped_axes" and "EPSG:4258" in rows[0][REJECT_DETAIL]
    assert_valid(rows[1])


def test_one_bad_record_among_thousands_keeps_every_column_with_its_row():
    good = [vehicle(lon=i % 170, lat=i % 80, name=f"g-{i}", speed=float(i)) for i in range(3000)]
    bad_at = {617: vehicle(lon="1"), 618: vehicle(speed="x"), 2000: b"{bad", 2999: vehicle(lat=[1])}
    values = list(good)
    for at, value in sorted(bad_at.items()):
        values.insert(at, value)
    rows = decode(values, VEHICLES)
    rejected = [i for i, r in enumerate(rows) if r[REJECT_REASON] is not None]
    assert rejected == sorted(bad_at)
    valid = [r for r in rows if r[REJECT_REASON] is None]
    assert [r["vehicle"] for r in valid] == [f"g-{i}" for i in range(3000)]
    assert [r["speed"] for r in valid] == [float(i) for i in range(3000)]
    assert [geometry_of(r).x for r in valid] == [float(i % 170) for i in range(3000)]


def test_a_batch_of_mostly_strings_for_numbers_is_read_one_by_one_not_block_by_block():
    values = [vehicle(lon=str(i % 170)) if i % 3 else vehicle(lon=i % 170) for i in range(3000)]
    rows = decode(values, VEHICLES)
    assert [r[REJECT_REASON] for r in rows] == ["coordinate_as_string" if i % 3 else None for i in range(3000)]


# -- one field holding the geometry ---------------------------------------------------------------
SQUARE = shapely.Polygon([(0, 0), (1, 0), (1, 1), (0, 1), (0, 0)])
LINE = shapely.LineString([(0.5, 1.25), (2.125, 3.0)])


def shaped(value, **more) -> bytes:
    return json.dumps({"vehicle": "v", "shape": value, "heading": 7, **more}).encode()


@pytest.mark.parametrize(
    "encoding, spell",
    [
        ("wkt", lambda g: shapely.to_wkt(g, rounding_precision=-1)),
        ("wkb_hex", lambda g: shapely.to_wkb(g, hex=True)),
        ("wkb_hex", lambda g: shapely.to_wkb(g, hex=True).lower()),
        ("wkb_base64", lambda g: base64.b64encode(shapely.to_wkb(g)).decode()),
        ("geojson", lambda g: json.loads(shapely.to_geojson(g))),
    ],
    ids=["wkt", "hex", "hex-lower", "base64", "geojson"],
)
def test_a_geometry_field_in_each_encoding(encoding, spell):
    contract = geometry_field(encoding)
    geometries = [shapely.Point(2.35, 48.85), LINE, SQUARE, shapely.Point(-0.1, 51.5)]
    rows = decode([shaped(spell(g)) for g in geometries], contract)
    for row, geometry in zip(rows, geometries):
        assert_valid(row)
        assert row["heading"] == 7
        assert geometry_of(row).equals_exact(geometry, 0)


def test_a_geometry_field_at_a_nested_path_in_another_crs():
    to_3857 = Transformer.from_crs("EPSG:4326", "EPSG:3857", always_xy=True)
    x, y = to_3857.transform(2.35, 48.85)
    for encoding, value in (
        ("wkt", f"POINT ({x!r} {y!r})"),
        ("wkb_hex", shapely.to_wkb(shapely.Point(x, y), hex=True)),
        ("geojson", {"type": "Point", "coordinates": [x, y]}),
    ):
        contract = geometry_field(encoding, path="place.shape", crs="EPSG:3857")
        rows = decode([json.dumps({"vehicle": "v", "place": {"shape": value}}).encode()], contract)
        assert_valid(rows[0])
        assert geometry_of(rows[0]).equals_exact(shapely.Point(2.35, 48.85), 1e-9), encoding


def test_an_ewkt_or_ewkb_srid_in_the_field_wins_over_the_json_crs():
    ewkb = shapely.to_wkb(shapely.set_srid(shapely.Point(261600, 6250000), 3857), include_srid=True, hex=True)
    for encoding, value in (("wkt", "SRID=3857;POINT(261600 6250000)"), ("wkb_hex", ewkb)):
        rows = decode([shaped(value)], geometry_field(encoding))
        assert_valid(rows[0])
        assert abs(geometry_of(rows[0]).x - 2.35) < 1e-4, encoding


GEOMETRY_FIELD_BAD = [
    ("wkt", shaped(None), Reason.MISSING_GEOMETRY, ["shape"]),
    ("wkt", b'{"vehicle": "v"}', Reason.MISSING_GEOMETRY, ["shape"]),
    ("wkt", shaped("POINT (1 2"), Reason.BAD_WKT, ["json.shape"]),
    ("wkt", shaped(17), Reason.BAD_GEOMETRY_ENCODING, ["shape", "17"]),
    ("wkt", shaped("CIRCULARSTRING (0 0, 1 1, 2 0)"), Reason.GEOMETRY_TYPE_NOT_ALLOWED, ["curve"]),
    ("wkt", shaped("MULTIPOINT (1 2)"), Reason.GEOMETRY_TYPE_NOT_ALLOWED, ["MultiPoint"]),
    ("wkb_hex", shaped("0101"), Reason.BAD_WKB, ["json.shape"]),
    ("wkb_hex", shaped("01g1"), Reason.BAD_GEOMETRY_ENCODING, ["hexadecimal"]),
    ("wkb_hex", shaped("010"), Reason.BAD_GEOMETRY_ENCODING, ["hexadecimal"]),
    ("wkb_hex", shaped(""), Reason.BAD_GEOMETRY_ENCODING, ["hexadecimal"]),
    ("wkb_base64", shaped("AQ=A"), Reason.BAD_GEOMETRY_ENCODING, ["base64"]),
    ("wkb_base64", shaped("AQE"), Reason.BAD_GEOMETRY_ENCODING, ["base64"]),
    ("wkb_base64", shaped("AQ=="), Reason.BAD_WKB, ["json.shape"]),
    ("geojson", shaped({"type": "Point", "coordinates": "x"}), Reason.INVALID_GEOJSON_GEOMETRY, ["shape"]),
    ("geojson", shaped("POINT (1 2)"), Reason.INVALID_GEOJSON_GEOMETRY, ["shape"]),
    ("geojson", shaped({"type": "Feature"}), Reason.INVALID_GEOJSON_GEOMETRY, ["shape"]),
    ("geojson", shaped({"type": "Point", "coordinates": []}), Reason.EMPTY_GEOMETRY, []),
    (
        "geojson",
        b'{"shape": '
        + b'{"type": "GeometryCollection", "geometries": [' * 40
        + b'{"type": "Point", "coordinates": [1, 2]}'
        + b"]}" * 40
        + b"}",
        Reason.NESTING_TOO_DEEP,
        ["shape", "max_nesting=32"],
    ),
]


@pytest.mark.parametrize("encoding, value, reason, names", GEOMETRY_FIELD_BAD)
def test_a_bad_geometry_field_has_its_reason(encoding, value, reason, names):
    good = {
        "wkt": "POINT (1 2)",
        "wkb_hex": shapely.to_wkb(shapely.Point(1, 2), hex=True),
        "wkb_base64": base64.b64encode(shapely.to_wkb(shapely.Point(1, 2))).decode(),
        "geojson": {"type": "Point", "coordinates": [1, 2]},
    }[encoding]
    rows = decode([shaped(good), value, shaped(good)], geometry_field(encoding))
    assert_valid(rows[0])
    assert_valid(rows[2])
    assert rows[1][REJECT_REASON] == reason.value, rows[1][REJECT_DETAIL]
    for name in names:
        assert name in rows[1][REJECT_DETAIL]


# -- hostile input ------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=80).map(lambda b: b"{" + b), min_size=1, max_size=20))
def test_no_bytes_after_a_brace_break_the_decoder(values):
    for contract, good in (
        (VEHICLES, vehicle()),
        (geometry_field("wkt"), shaped("POINT (1 2)")),
        (geometry_field("geojson"), shaped({"type": "Point", "coordinates": [1, 2]})),
        (geometry_field("wkb_base64"), shaped(base64.b64encode(shapely.to_wkb(shapely.Point(1, 2))).decode())),
    ):
        rows = decode([good, *values], contract)
        assert_valid(rows[0])
        assert all(r[REJECT_REASON] != "decode_failed" for r in rows), [r[REJECT_DETAIL] for r in rows]

"""WKT and EWKT values (formats "wkt" and "ewkt"): claimed by their keyword, read exactly, EWKT
SRIDs honoured, each kind of bad value its reason."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st
from pyproj import Transformer

from streaming.decode.rejects import Reason
from tests.gpkg_blobs import kart
from tests.streaming.decode.test_decoder import (
    DEMO,
    REJECT_DETAIL,
    REJECT_REASON,
    WKT_CONTRACT,
    assert_valid,
    decode,
    geometry_of,
)

WKT_AND_GPKG = dataclasses.replace(WKT_CONTRACT, formats=(*WKT_CONTRACT.formats, "gpkg"))


def test_points_and_other_shapes_come_back_exactly():
    rng = np.random.default_rng(7)
    xs, ys = rng.uniform(-180, 180, 2000), rng.uniform(-90, 90, 2000)
    values = []
    for i, (x, y) in enumerate(zip(xs.tolist(), ys.tolist())):
        if i % 4 == 0:
            values.append(f"LINESTRING ({x!r} {y!r}, {x / 2!r} {y / 2!r})".encode())
        elif i % 4 == 1:
            values.append(f"  point({x!r}   {y!r}) ".encode())
        else:
            values.append(f"POINT ({x!r} {y!r})".encode())
    rows = decode(values, WKT_CONTRACT)
    for value, row in zip(values, rows):
        assert_valid(row)
        assert geometry_of(row).equals_exact(shapely.from_wkt(value.decode()), 0), value


def test_the_fast_point_reading_agrees_with_geos_on_every_spelling():
    numbers = [
        "1",
        "-1",
        "+1.5",
        ".5",
        "5.",
        "1e1",
        "1E-5",
        "-0",
        "2.2250738585072014e-308",
        "4.9e-324",
        "0.1",
        "89.99999999999999",
    ]
    values = [f"POINT({x} {y})".encode() for x in numbers for y in numbers]
    rows = decode(values, WKT_CONTRACT)
    for value, row in zip(values, rows):
        assert_valid(row)
        assert geometry_of(row).equals_exact(shapely.from_wkt(value.decode()), 0), value


def test_ewkt_srids_are_honoured():
    x, y = Transformer.from_crs("EPSG:4326", "EPSG:3857", always_xy=True).transform(2.35, 48.85)
    rows = decode(
        [f"SRID=3857;POINT ({x!r} {y!r})".encode(), f"srid = 3857 ; LINESTRING ({x!r} {y!r}, 0 0)".encode()],
        WKT_CONTRACT,
    )
    assert geometry_of(rows[0]).equals_exact(shapely.Point(2.35, 48.85), 1e-9)
    assert geometry_of(rows[1]).equals_exact(shapely.LineString([(2.35, 48.85), (0, 0)]), 1e-9)


def test_wkt_and_ewkt_are_accepted_apart():
    only_wkt = dataclasses.replace(DEMO, formats=("geojson", "wkt"))
    rows = decode([b"POINT (1 2)", b"SRID=4326;POINT (1 2)"], only_wkt)
    assert_valid(rows[0])
    assert rows[1][REJECT_REASON] == "format_not_accepted" and "EWKT" in rows[1][REJECT_DETAIL]
    rows = decode([b"POINT (1 2)"], DEMO)
    assert rows[0][REJECT_REASON] == "format_not_accepted" and "WKT" in rows[0][REJECT_DETAIL]


def test_a_geometrycollection_is_wkt_and_gp_is_still_geopackage():
    rows = decode([b"GEOMETRYCOLLECTION (POINT (1 2))", kart(shapely.Point(1, 2)), b"garbage"], WKT_AND_GPKG)
    assert rows[0][REJECT_REASON] == "geometry_type_not_allowed"  # the demo table takes no collections
    assert_valid(rows[1])
    assert rows[2][REJECT_REASON] == "unknown_format"


BAD = [
    (b"POINT (1 2) junk", Reason.BAD_WKT, ["Unexpected text"]),
    (b"POINT (1, 2)", Reason.BAD_WKT, ["Expected number"]),
    (b"POLYGON ((0 0, 1 0, 1 1))", Reason.BAD_WKT, ["value"]),
    (b"LINESTRING (0 0", Reason.BAD_WKT, ["value"]),
    (b"SRID=4326 POINT (1 2)", Reason.BAD_WKT, ["SRID=<code>;"]),
    (b"SRID=1234567890;POINT (1 2)", Reason.BAD_WKT, ["9 digits"]),
    (b"POINT (\xff 2)", Reason.BAD_WKT, ["UTF-8"]),
    (b"SRID=999999;POINT (1 2)", Reason.UNKNOWN_SRID, ["999999"]),
    (b"CIRCULARSTRING (0 0, 1 1, 2 0)", Reason.GEOMETRY_TYPE_NOT_ALLOWED, ["curve"]),
    (b"TRIANGLE ((0 0, 1 0, 0 1, 0 0))", Reason.GEOMETRY_TYPE_NOT_ALLOWED, ["Triangle"]),
    (b"POINT EMPTY", Reason.EMPTY_GEOMETRY, []),
    (b"POINT (1e400 2)", Reason.NON_FINITE_COORDINATES, []),
    (b"POINT (nan 2)", Reason.NON_FINITE_COORDINATES, []),
    (b"POINT ZM (1 2 3 4)", Reason.DIMENSION_NOT_ALLOWED, ["XYZM"]),
    (b"POINT (200 10)", Reason.OUTSIDE_CRS_AREA, ["200"]),
    (b"POLYGON ((0 0, 2 2, 2 0, 0 2, 0 0))", Reason.INVALID_POLYGON, ["Self-intersection"]),
    (b"GEOMETRYCOLLECTION (" * 40 + b"POINT (1 2)" + b")" * 40, Reason.NESTING_TOO_DEEP, ["max_nesting=32"]),
]


@pytest.mark.parametrize("value, reason, names", BAD, ids=[v[:30].decode("latin-1") for v, _, _ in BAD])
def test_each_bad_value_has_its_reason(value, reason, names):
    contract = dataclasses.replace(
        WKT_CONTRACT, geometry=dataclasses.replace(WKT_CONTRACT.geometry, invalid_polygons="reject")
    )
    rows = decode([b"POINT (1 2)", value, b"POINT (3 4)"], contract)
    assert_valid(rows[0])
    assert_valid(rows[2])
    assert rows[1][REJECT_REASON] == reason.value, rows[1][REJECT_DETAIL]
    for name in names:
        assert name in rows[1][REJECT_DETAIL]


def test_many_flat_collections_are_not_too_deep():
    many = b"MULTIPOLYGON (" + b", ".join([b"((0 0, 1 0, 1 1, 0 0))"] * 5) + b")"
    collection = b"GEOMETRYCOLLECTION (" + b", ".join([b"GEOMETRYCOLLECTION (POINT (1 2))"] * 50) + b")"
    contract = dataclasses.replace(
        WKT_CONTRACT,
        geometry=dataclasses.replace(WKT_CONTRACT.geometry, types=(*WKT_CONTRACT.geometry.types, "GeometryCollection")),
    )
    rows = decode([many, collection], contract)
    assert rows[0][REJECT_REASON] in (None, "invalid_polygon")
    assert_valid(rows[1])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([b"POINT", b"LINESTRING", b"POLYGON", b"SRID=3857;POINT", b"GEOMETRYCOLLECTION", b"point"]),
            st.binary(max_size=60),
        ).map(lambda t: t[0] + t[1]),
        min_size=1,
        max_size=20,
    )
)
def test_no_text_after_a_keyword_breaks_the_decoder(values):
    rows = decode([b"POINT (1 2)", *values], WKT_AND_GPKG)
    assert_valid(rows[0])
    assert all(r[REJECT_REASON] != "decode_failed" for r in rows), [r[REJECT_DETAIL] for r in rows]

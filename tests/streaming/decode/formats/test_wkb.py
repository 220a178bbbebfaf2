"""WKB and EWKB events (formats "wkb", "ewkb"): the table CRS or the SRID, Z and M, spellings other
than GEOS writes, byte orders, and the CRS rules an SRID meets."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.decode.decoder import HILBERT, REJECT_DETAIL, REJECT_REASON
from streaming.decode.rejects import Reason
from tests.streaming.decode.test_decoder import (
    DEMO,
    POINT_WKB,
    WEB_MERCATOR_TO_WGS84,
    XYM_CONTRACT,
    assert_valid,
    decode,
    ewkb,
    geometry_of,
    with_geometry,
)


def test_plain_wkb_is_taken_in_the_table_crs_and_the_key_is_the_id():
    line = shapely.LineString([(2.0, 48.0), (2.5, 48.5)])
    row = decode([shapely.to_wkb(line)], keys=[b"line-7"])[0]
    assert_valid(row)
    assert row["event_id"] == "line-7"
    assert shapely.equals_exact(geometry_of(row), line, tolerance=0)


def test_ewkb_in_web_mercator_is_reprojected_like_pyproj():
    box = shapely.box(261_600.0, 6_250_000.0, 262_100.0, 6_250_300.0)
    point_z = shapely.Point(-8_238_310.0, 4_970_072.0, 12.5)
    rows = decode([ewkb(box, 3857), ewkb(point_z, 3857)])
    for row, source in zip(rows, (box, point_z)):
        assert_valid(row)
        src = shapely.get_coordinates(source)
        lon, lat = WEB_MERCATOR_TO_WGS84.transform(src[:, 0], src[:, 1])
        stored = geometry_of(row)
        np.testing.assert_allclose(shapely.get_coordinates(stored), np.column_stack([lon, lat]), rtol=0, atol=1e-9)
    assert geometry_of(rows[1]).z == 12.5, "Z rides along the reprojection"


def test_xym_wkb_is_kept_when_the_contract_allows_it():
    row = decode([shapely.to_wkb(shapely.from_wkt("LINESTRING M (1 2 3, 4 5 6)"))], XYM_CONTRACT)[0]
    assert_valid(row)
    stored = geometry_of(row)
    assert stored.has_m and not stored.has_z
    assert shapely.get_coordinates(stored, include_m=True).tolist() == [[1, 2, 3], [4, 5, 6]]


def test_xym_wkb_is_rejected_when_the_contract_does_not_allow_it():
    row = decode([shapely.to_wkb(shapely.from_wkt("LINESTRING M (1 2 3, 4 5 6)"))])[0]
    assert row[REJECT_REASON] == Reason.DIMENSION_NOT_ALLOWED
    assert "XYM" in row[REJECT_DETAIL]


def test_ewkb_far_outside_its_own_crs_is_rejected():
    row = decode([ewkb(shapely.Point(500_000.0, 1e9), 32631)])[0]
    assert row[REJECT_REASON] in (Reason.OUTSIDE_CRS_AREA, Reason.REPROJECTION_FAILED)


@pytest.mark.parametrize(
    "levels, reason",
    [(32, Reason.GEOMETRY_TYPE_NOT_ALLOWED), (33, Reason.NESTING_TOO_DEEP), (1200, Reason.NESTING_TOO_DEEP)],
)
def test_max_nesting_is_the_limit_whether_geos_or_the_walk_measures_it(levels, reason):
    value = b"\x01\x07\x00\x00\x00\x01\x00\x00\x00" * levels + POINT_WKB
    assert decode([value])[0][REJECT_REASON] == reason.value


def test_wkb_spelled_otherwise_than_geos_writes_it_is_still_read():
    # Parts in the other byte order, big-endian EWKB with Z and M: all well-formed WKB.
    mixed_order = (
        b"\x01\x04\x00\x00\x00\x02\x00\x00\x00" + POINT_WKB + shapely.to_wkb(shapely.Point(2.4, 48.9), byte_order=0)
    )
    big_endian_ewkb = shapely.to_wkb(
        shapely.set_srid(shapely.from_wkt("POINT Z (2.35 48.86 35)"), 4326), include_srid=True, byte_order=0
    )
    iso_big_endian = shapely.to_wkb(shapely.from_wkt("LINESTRING Z (0 0 1, 1 1 2)"), byte_order=0, flavor="iso")
    rows = decode([mixed_order, big_endian_ewkb, iso_big_endian])
    for row in rows:
        assert_valid(row)
    assert geometry_of(rows[0]).equals(shapely.MultiPoint([(2.35, 48.86), (2.4, 48.9)]))
    assert shapely.get_coordinates(geometry_of(rows[1]), include_z=True).tolist() == [[2.35, 48.86, 35.0]]


@pytest.mark.parametrize(
    "contract",
    [
        DEMO,
        with_geometry(types=("Polygon",)),
        with_geometry(dimensions=("XYZ",)),
        with_geometry(types=("Point",)),
    ],
    ids=["demo", "no-points", "xyz-only", "points-only"],
)
@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    coordinates=st.lists(
        st.one_of(
            st.tuples(st.floats(), st.floats()),
            st.binary(min_size=16, max_size=16).map(lambda b: struct.unpack("<dd", b)),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_a_little_endian_point_fares_as_the_same_point_sent_big_endian(contract, coordinates):
    # Little-endian 2D points are read from their bytes; big-endian ones by GEOS: both must end
    # the same, whatever the coordinates (NaN, infinities, -0.0, subnormals, beyond the CRS area)
    # and whatever the contract allows.
    little = [b"\x01\x01\x00\x00\x00" + struct.pack("<dd", x, y) for x, y in coordinates]
    big = [b"\x00\x00\x00\x00\x01" + struct.pack(">dd", x, y) for x, y in coordinates]
    rows = decode(little + big, contract)
    for (x, y), sent, read_by_geos, by_bytes in zip(coordinates, little, rows[len(little) :], rows[: len(little)]):
        assert by_bytes[REJECT_REASON] == read_by_geos[REJECT_REASON], (x, y)
        assert by_bytes[REJECT_DETAIL] == read_by_geos[REJECT_DETAIL], (x, y)
        for column in ("geometry", "bbox", HILBERT):
            assert by_bytes[column] == read_by_geos[column], (x, y, column)
        if by_bytes[REJECT_REASON] is None:
            assert by_bytes["geometry"] == sent, "a valid little-endian point is stored as sent"


def polygon_wkb(rings: list[list[tuple[float, float]]], order: str, trailing: bytes = b"") -> bytes:
    """A 2D ISO WKB polygon spelt by hand in one byte order: any rings, closed or not."""
    byte = b"\x01" if order == "<" else b"\x00"
    body = struct.pack(f"{order}I", len(rings)) + b"".join(
        struct.pack(f"{order}I", len(ring)) + b"".join(struct.pack(f"{order}dd", x, y) for x, y in ring)
        for ring in rings
    )
    return byte + struct.pack(f"{order}I", 3) + body + trailing


coordinate = st.one_of(st.floats(-200, 200), st.sampled_from([0.0, -0.0, 1.0, 5e-324, float("nan"), float("inf")]))
ring = st.lists(st.tuples(coordinate, coordinate), min_size=0, max_size=7).map(
    lambda points: points + points[:1] if points and len(points) % 2 else points
)  # some closed, some not


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    polygons=st.lists(
        st.tuples(st.lists(ring, min_size=0, max_size=3), st.sampled_from([b"", b"\x00", b"\x01\x02\x03\x04"])),
        min_size=1,
        max_size=10,
    )
)
def test_a_little_endian_polygon_fares_as_the_same_polygon_sent_big_endian(polygons):
    # Little-endian 2D polygons of the right length are stored as sent; big-endian ones are read
    # by GEOS and written back. Both must end the same: valid, repaired or rejected alike.
    little = [polygon_wkb(rings, "<", trailing) for rings, trailing in polygons]
    big = [polygon_wkb(rings, ">", trailing) for rings, trailing in polygons]
    rows = decode(little + big)
    for sent, read_by_geos, by_bytes in zip(little, rows[len(little) :], rows[: len(little)]):
        assert by_bytes[REJECT_REASON] == read_by_geos[REJECT_REASON], sent.hex()
        for column in ("geometry", "bbox", HILBERT):
            assert by_bytes[column] == read_by_geos[column], (sent.hex(), column)
        if by_bytes[REJECT_REASON] is None and shapely.from_wkb(sent).is_valid:
            assert by_bytes["geometry"] == sent, "a valid little-endian polygon is stored as sent"


def test_ewkb_in_a_crs_whose_area_crosses_the_antimeridian():
    # NAD83 and NZGD2000 areas of use run from a longitude east of the antimeridian to one west of it.
    rows = decode([ewkb(shapely.Point(-77.0, 38.9), 4269), ewkb(shapely.Point(174.8, -41.3), 4167)])
    for row in rows:
        assert_valid(row)
    assert abs(shapely.get_x(geometry_of(rows[0])) + 77.0) < 1e-4

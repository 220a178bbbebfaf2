"""GeoPackage binary geometries (format "gpkg"): headers built by hand from GeoPackage 1.3
§2.1.3, features spelt as Kart writes them, and the rows of a real GeoPackage file read back
with sqlite3, each fed to the decoder as a Kafka value."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest
import shapely
from pyproj import Transformer

from streaming.contract import FORMATS
from streaming.decode.formats import INPUT_FORMATS
from streaming.decode.rejects import Reason
from tests.gpkg_blobs import envelope_of, gpkg, header, kart, read_geopackage, write_geopackage
from tests.streaming.decode.test_decoder import (
    DEMO,
    REJECT_DETAIL,
    REJECT_REASON,
    assert_valid,
    decode,
    geometry_of,
    with_geometry,
)

GPKG = dataclasses.replace(DEMO, formats=(*DEMO.formats, "gpkg"))
XYZM = with_geometry(GPKG, dimensions=("XY", "XYZ", "XYM", "XYZM"))
POINT = shapely.Point(2.35, 48.86)
SQUARE = shapely.box(2.3, 48.8, 2.4, 48.9)
LINE_Z = shapely.from_wkt("LINESTRING Z (2.3 48.8 10, 2.4 48.9 35)")
TO_3857 = Transformer.from_crs("EPSG:4326", "EPSG:3857", always_xy=True)


def reject_of(value: bytes, contract=GPKG) -> tuple[str | None, str | None]:
    row = decode([value], contract)[0]
    return row[REJECT_REASON], row[REJECT_DETAIL]


def test_every_format_the_contract_names_has_a_decoder_and_back():
    assert sorted(name for f in INPUT_FORMATS for name in f.names) == sorted(FORMATS)


# -- malformed headers: each its reason and a detail naming the byte or field ---------------------
MALFORMED = [
    pytest.param(b"G", Reason.GPKG_TOO_SHORT, ["1 bytes", "8-byte"], id="one-byte"),
    pytest.param(b"GP\x00\x01\x00\x00\x00", Reason.GPKG_TOO_SHORT, ["7 bytes", "8-byte"], id="seven-bytes"),
    pytest.param(
        b"GX\x00\x01\x00\x00\x00\x00" + shapely.to_wkb(POINT),
        Reason.GPKG_BAD_MAGIC,
        ["bytes 0-1", "0x4758"],
        id="magic",
    ),
    pytest.param(b"Gp", Reason.GPKG_BAD_MAGIC, ["bytes 0-1"], id="magic-short"),
    pytest.param(
        header(version=1) + shapely.to_wkb(POINT), Reason.GPKG_UNKNOWN_VERSION, ["byte 2", "is 1"], id="version"
    ),
    *[
        pytest.param(
            header(kind=k) + b"\x00" * 80, Reason.GPKG_BAD_FLAGS, ["byte 3", f"indicator {k}"], id=f"indicator-{k}"
        )
        for k in (5, 6, 7)
    ],
    pytest.param(
        header(extra_flags=0x80) + shapely.to_wkb(POINT),
        Reason.GPKG_BAD_FLAGS,
        ["byte 3", "bits 6-7"],
        id="reserved-bit",
    ),
    pytest.param(
        header(extended=True) + shapely.to_wkb(POINT), Reason.GPKG_EXTENDED_TYPE, ["byte 3", "bit 5"], id="extended"
    ),
    *[
        pytest.param(
            header(kind=k) + b"\x00" * (8 * n - 1),
            Reason.GPKG_ENVELOPE_TRUNCATED,
            [f"bytes 8-{7 + 8 * n}", f"needs {8 * n} bytes", f"ends after {8 * n - 1}"],
            id=f"envelope-{k}-truncated",
        )
        for k, n in ((1, 4), (2, 6), (3, 6), (4, 8))
    ],
    pytest.param(header(), Reason.BAD_WKB, ["after the GeoPackage header", "0 bytes"], id="no-wkb"),
    pytest.param(
        header() + shapely.to_wkb(POINT)[:15],
        Reason.BAD_WKB,
        ["after the GeoPackage header", "15 bytes"],
        id="wkb-truncated",
    ),
    pytest.param(
        header() + shapely.to_wkb(POINT) + b"\x00",
        Reason.BAD_WKB,
        ["1 bytes after its 21-byte geometry"],
        id="wkb-trailing",
    ),
    pytest.param(header() + b"\x01\x63\x00\x00\x00", Reason.BAD_WKB, ["after the GeoPackage header"], id="wkb-garbage"),
    pytest.param(
        header() + shapely.to_wkb(shapely.set_srid(POINT, 4326), include_srid=True),
        Reason.BAD_WKB,
        ["EWKB SRID", "srs_id (bytes 4-7)"],
        id="wkb-with-srid",
    ),
    pytest.param(
        header() + (b"\x01\x07\x00\x00\x00\x01\x00\x00\x00") * 40 + shapely.to_wkb(POINT),
        Reason.NESTING_TOO_DEEP,
        ["max_nesting=32"],
        id="wkb-nested",
    ),
]


@pytest.mark.parametrize("value, reason, names", MALFORMED)
def test_a_malformed_header_is_rejected_with_its_reason_naming_the_byte(value, reason, names):
    got, detail = reject_of(value)
    assert got == reason.value, detail
    for name in names:
        assert name in detail


def test_a_malformed_header_in_a_batch_rejects_only_its_own_record():
    values = [kart(SQUARE), *(p.values[0] for p in MALFORMED), kart(POINT)]
    rows = decode(values, GPKG)
    assert [r[REJECT_REASON] for r in rows] == [None, *(p.values[1].value for p in MALFORMED), None]


def test_gpkg_is_format_not_accepted_where_the_contract_leaves_it_out():
    assert reject_of(kart(POINT), DEMO)[0] == Reason.FORMAT_NOT_ACCEPTED.value
    assert "GeoPackage" in reject_of(kart(POINT), DEMO)[1]
    # Text starting with 'G' that is no GeoPackage geometry is named so, whatever the contract.
    assert reject_of(b"Garbage", DEMO)[0] == Reason.GPKG_BAD_MAGIC.value


def test_unknown_format_names_the_geopackage_magic_too():
    reason, detail = reject_of(b"hello")
    assert reason == Reason.UNKNOWN_FORMAT.value and "'G'" in detail and "GeoPackage" in detail


# -- byte orders, envelopes, the empty flag ------------------------------------------------------
@pytest.mark.parametrize("header_little", [True, False])
@pytest.mark.parametrize("wkb_little", [True, False])
@pytest.mark.parametrize("geometry", [POINT, SQUARE, LINE_Z], ids=["point", "polygon", "line-z"])
def test_either_byte_order_of_header_and_wkb_reads_the_same_geometry(geometry, header_little, wkb_little):
    value = gpkg(
        geometry, srs_id=4326, kind=2 if shapely.has_z(geometry) else 1, little=header_little, wkb_little=wkb_little
    )
    row = decode([value], GPKG)[0]
    assert_valid(row)
    assert shapely.equals_exact(geometry_of(row), geometry, 0)
    assert shapely.has_z(geometry_of(row)) == shapely.has_z(geometry)


@pytest.mark.parametrize("kind", [0, 1, 2, 3, 4])
def test_every_envelope_kind_that_matches_the_geometry_is_accepted(kind):
    geometry = shapely.from_wkt("LINESTRING ZM (2.3 48.8 10 1, 2.4 48.9 35 2)")
    row = decode([gpkg(geometry, kind=kind, little=kind % 2 == 0)], XYZM)[0]
    assert_valid(row)
    assert shapely.equals_exact(geometry_of(row), geometry, 0)
    assert shapely.get_coordinates(geometry_of(row), include_z=True, include_m=True).tolist() == [
        [2.3, 48.8, 10, 1],
        [2.4, 48.9, 35, 2],
    ]


@pytest.mark.parametrize(
    "kind, wrong, name",
    [(1, 0, "minx"), (1, 3, "maxy"), (2, 4, "minz"), (2, 5, "maxz"), (3, 4, "minm"), (4, 7, "maxm")],
)
def test_an_envelope_off_the_geometry_is_a_mismatch_naming_the_value(kind, wrong, name):
    geometry = shapely.from_wkt("LINESTRING ZM (2.3 48.8 10 1, 2.4 48.9 35 2)")
    envelope = envelope_of(geometry, kind)
    envelope[wrong] += 0.5
    reason, detail = reject_of(gpkg(geometry, kind=kind, envelope=envelope), XYZM)
    assert reason == Reason.GPKG_ENVELOPE_MISMATCH.value
    assert f"{name} " in detail and "bytes 8-" in detail


def test_an_envelope_within_a_tiny_tolerance_is_accepted_and_one_beyond_it_is_not():
    envelope = envelope_of(SQUARE, 1)
    close = [v * (1 + 1e-12) for v in envelope]
    far = [envelope[0], envelope[1] + 1e-6, envelope[2], envelope[3]]
    rows = decode([gpkg(SQUARE, kind=1, envelope=close), gpkg(SQUARE, kind=1, envelope=far)], GPKG)
    assert [r[REJECT_REASON] for r in rows] == [None, Reason.GPKG_ENVELOPE_MISMATCH.value]


def test_a_z_envelope_on_a_geometry_without_z_is_a_mismatch():
    reason, detail = reject_of(gpkg(POINT, kind=2, envelope=[2.35, 2.35, 48.86, 48.86, 0.0, 0.0]))
    assert reason == Reason.GPKG_ENVELOPE_MISMATCH.value and "no Z" in detail


def test_an_envelope_on_a_point_is_checked_too():
    rows = decode([gpkg(POINT, kind=1), gpkg(POINT, kind=1, envelope=[0.0, 0.0, 0.0, 0.0])], GPKG)
    assert [r[REJECT_REASON] for r in rows] == [None, Reason.GPKG_ENVELOPE_MISMATCH.value]


@pytest.mark.parametrize("wkt", ["POINT EMPTY", "LINESTRING EMPTY", "POLYGON EMPTY", "GEOMETRYCOLLECTION EMPTY"])
def test_an_empty_geometry_is_rejected_as_empty_with_or_without_the_flag(wkt):
    geometry = shapely.from_wkt(wkt)
    flagged, unflagged = decode([gpkg(geometry), gpkg(geometry, empty=False)], GPKG)
    assert flagged[REJECT_REASON] == unflagged[REJECT_REASON] == Reason.EMPTY_GEOMETRY.value
    assert "bit 4" in flagged[REJECT_DETAIL]
    # as the same geometry sent as WKB
    assert decode([shapely.to_wkb(geometry)], GPKG)[0][REJECT_REASON] == Reason.EMPTY_GEOMETRY.value


def test_the_empty_flag_on_a_geometry_with_coordinates_rejects_it_as_empty():
    reason, detail = reject_of(gpkg(POINT, empty=True))
    assert reason == Reason.EMPTY_GEOMETRY.value and "bit 4" in detail


# -- srs_id --------------------------------------------------------------------------------------
@pytest.mark.parametrize("srs_id", [0, -1, 4326])
def test_srs_id_0_minus_1_and_the_table_crs_are_taken_as_they_are(srs_id):
    row = decode([gpkg(SQUARE, srs_id=srs_id), gpkg(POINT, srs_id=srs_id)], GPKG)
    for r, geometry in zip(row, (SQUARE, POINT)):
        assert_valid(r)
        assert r["geometry"] == shapely.to_wkb(geometry, flavor="iso", byte_order=1)


@pytest.mark.parametrize("geometry", [POINT, SQUARE], ids=["point", "polygon"])
def test_another_srs_id_is_reprojected_to_the_table_crs_like_pyproj(geometry):
    in_3857 = shapely.transform(geometry, lambda xy: np.column_stack(TO_3857.transform(xy[:, 0], xy[:, 1])))
    for little in (True, False):
        row = decode([gpkg(in_3857, srs_id=3857, little=little)], GPKG)[0]
        assert_valid(row)
        assert shapely.equals_exact(geometry_of(row), geometry, 1e-9)


def test_an_srs_id_that_is_no_known_crs_is_unknown_srid():
    reason, detail = reject_of(gpkg(POINT, srs_id=999999))
    assert reason == Reason.UNKNOWN_SRID.value and "999999" in detail


def test_the_table_rules_apply_as_to_any_format():
    rows = decode(
        [
            kart(shapely.Point(10, 123)),  # outside EPSG:4326's area
            kart(shapely.from_wkt("POINT M (2 48 3)")),
            kart(shapely.from_wkt("POLYGON ((0 0, 2 2, 2 0, 0 2, 0 0))")),  # a bow tie: repaired under `repair`
            kart(shapely.from_wkt("GEOMETRYCOLLECTION (POINT (1 2))")),
        ],
        GPKG,
    )
    assert [r[REJECT_REASON] for r in rows] == [
        Reason.OUTSIDE_CRS_AREA.value,
        Reason.DIMENSION_NOT_ALLOWED.value,
        None,
        Reason.GEOMETRY_TYPE_NOT_ALLOWED.value,
    ]
    assert shapely.get_type_id(geometry_of(rows[2])) == 6


# -- as Kart writes them, and from a real GeoPackage file ------------------------------------------
KART_FEATURES = [
    "POINT (2.35 48.86)",
    "POINT Z (2.35 48.86 35)",
    "LINESTRING (2.3 48.8, 2.4 48.9, 2.5 48.85)",
    "POLYGON ((2.3 48.8, 2.4 48.8, 2.4 48.9, 2.3 48.9, 2.3 48.8), (2.32 48.82, 2.34 48.82, 2.34 48.84, 2.32 48.82))",
    "POLYGON Z ((2.3 48.8 1, 2.4 48.8 2, 2.4 48.9 3, 2.3 48.8 1))",
    "MULTIPOINT ((2.3 48.8), (2.4 48.9))",
    "MULTILINESTRING ((2.3 48.8, 2.4 48.9), (2.5 48.7, 2.6 48.6))",
    "MULTIPOLYGON (((2.3 48.8, 2.4 48.8, 2.4 48.9, 2.3 48.8)), ((2.5 48.5, 2.6 48.5, 2.6 48.6, 2.5 48.5)))",
]


def test_features_as_kart_writes_them_land_with_their_geometry():
    geometries = [shapely.from_wkt(w) for w in KART_FEATURES]
    values = [kart(g) for g in geometries]
    # Kart's spelling: little-endian header, srs_id 0, no envelope for points, XYZ for Z, else XY.
    assert [v[3] for v in values] == [0x01, 0x01, 0x03, 0x03, 0x05, 0x03, 0x03, 0x03]
    assert all(struct.unpack_from("<i", v, 4)[0] == 0 for v in values)
    rows = decode(values, GPKG, keys=[f"kart-{i}".encode() for i in range(len(values))])
    for row, geometry in zip(rows, geometries):
        assert_valid(row)
        assert shapely.equals_exact(geometry_of(row), geometry, 0)
        assert shapely.has_z(geometry_of(row)) == shapely.has_z(geometry)
        xmin, ymin, xmax, ymax = shapely.bounds(geometry)
        assert row["bbox"] == {"xmin": xmin, "ymin": ymin, "xmax": xmax, "ymax": ymax}
    assert [r["event_id"] for r in rows] == [f"kart-{i}" for i in range(len(values))]


def test_rows_of_a_real_geopackage_file_decode_as_their_geometries(tmp_path):
    geometries = [shapely.from_wkt(w) for w in KART_FEATURES]
    features = [(i + 1, f"feature {i}", kart(g)) for i, g in enumerate(geometries)]
    features.append(
        (
            len(features) + 1,
            "big-endian header in EPSG:3857",
            gpkg(shapely.Point(*TO_3857.transform(2.35, 48.86)), srs_id=3857, kind=1, little=False),
        )
    )
    features.append((len(features) + 1, "damaged", kart(SQUARE)[:30]))
    path = tmp_path / "features.gpkg"
    write_geopackage(path, "places", features, srs_id=4326, srs_name="WGS 84 geodetic")

    read = read_geopackage(path, "places")
    assert [fid for fid, _, _ in read] == list(range(1, len(features) + 1))
    rows = decode([blob for _, _, blob in read], GPKG, keys=[str(fid).encode() for fid, _, _ in read])
    for row, geometry in zip(rows, geometries):
        assert_valid(row)
        assert shapely.equals_exact(geometry_of(row), geometry, 0)
    assert_valid(rows[-2])
    assert shapely.equals_exact(geometry_of(rows[-2]), POINT, 1e-9)
    assert rows[-1][REJECT_REASON] == Reason.GPKG_ENVELOPE_TRUNCATED.value

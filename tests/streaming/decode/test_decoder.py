"""Decoder: one Kafka record batch in, one decoded row per record out (pure: no Spark, no Kafka).

Batches are shaped like Spark's Kafka source (key, value, topic, partition, offset, timestamp,
headers). Every reject must carry a stable reason code and a detail naming what was wrong.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import shapely
from pyproj import Transformer

from streaming.contract import Contract, load_contract, parse_contract
from streaming.decode.decoder import (
    HEADERS_TYPE,
    HILBERT,
    RAW_KEY,
    RAW_VALUE,
    REJECT_DETAIL,
    REJECT_REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    DecodeOptions,
    Decoder,
    decoded_schema,
)
from streaming.decode.rejects import Reason
from streaming.decode.validate import GeometryRules
from streaming.kernels.hilbert import hilbert_keys_of_bounds
from tests.gpkg_blobs import gpkg, header

CONTRACT_PATH = Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json"
DEMO = load_contract(CONTRACT_PATH)
RAW_CONTRACT = json.loads(CONTRACT_PATH.read_text())
TOPIC = "demo-events"
FIRST_OFFSET = 1_000
KAFKA_TIMESTAMP_US = 1_700_000_000_000_000


# -- helpers ---------------------------------------------------------------------------------------
def kafka_batch(
    values: list[bytes | None],
    keys: list[bytes | None] | None = None,
    headers: list[list[tuple[str, bytes]]] | None = None,
    partition: int = 2,
) -> pa.RecordBatch:
    """A batch shaped like Spark's Kafka source. Keys default to k-<index>."""
    n = len(values)
    keys = keys if keys is not None else [f"k-{i}".encode() for i in range(n)]
    headers = headers if headers is not None else [[] for _ in range(n)]
    return pa.record_batch(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": pa.array([TOPIC] * n, pa.string()),
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(np.arange(FIRST_OFFSET, FIRST_OFFSET + n), pa.int64()),
            "timestamp": pa.array(KAFKA_TIMESTAMP_US + np.arange(n), pa.timestamp("us")),
            "headers": pa.array([[{"key": k, "value": v} for k, v in h] for h in headers], HEADERS_TYPE),
        }
    )


def feature(geometry: dict | None, fid: object = "f-1", **properties) -> bytes:
    return json.dumps({"type": "Feature", "id": fid, "geometry": geometry, "properties": properties}).encode()


def point(*coordinates: float) -> dict:
    return {"type": "Point", "coordinates": list(coordinates)}


def decode(
    values: list[bytes | None], contract: Contract = DEMO, options: DecodeOptions | None = None, **batch_args
) -> list[dict]:
    out = Decoder(contract, options).decode(kafka_batch(values, **batch_args))
    assert out.num_rows == len(values), "one output row per input record"
    return out.to_pylist()


def geometry_of(row: dict) -> shapely.Geometry:
    return shapely.from_wkb(row["geometry"])


def assert_valid(row: dict) -> None:
    assert row[REJECT_REASON] is None, f"rejected: {row[REJECT_REASON]}: {row[REJECT_DETAIL]}"


def with_geometry(contract: Contract = DEMO, **changes) -> Contract:
    return dataclasses.replace(contract, geometry=dataclasses.replace(contract.geometry, **changes))


def contract_from(edit) -> Contract:
    raw = copy.deepcopy(RAW_CONTRACT)
    edit(raw)
    return parse_contract(raw)


def table_in_web_mercator(raw: dict) -> None:
    raw["geometry"]["crs"] = "EPSG:3857"
    del raw["clustering"]["extent"]


GOOD = feature(point(2.35, 48.86), fid="good", kind="ping", speed=3.5)
XYM_CONTRACT = with_geometry(dimensions=("XY", "XYZ", "XYM"))
BOW_TIE = {"type": "Polygon", "coordinates": [[[0, 0], [2, 2], [2, 0], [0, 2], [0, 0]]]}
SQUARE = [[0.0, 0.0], [4.0, 0.0], [4.0, 4.0], [0.0, 4.0], [0.0, 0.0]]
HOLE = [[1.0, 1.0], [2.0, 1.0], [2.0, 2.0], [1.0, 2.0], [1.0, 1.0]]
WEB_MERCATOR_TO_WGS84 = Transformer.from_crs("EPSG:3857", "EPSG:4326", always_xy=True)


GPKG = dataclasses.replace(DEMO, formats=(*DEMO.formats, "gpkg"))
POINT_WKB = shapely.to_wkb(shapely.Point(2.35, 48.86))


def ewkb(geometry: shapely.Geometry, srid: int) -> bytes:
    return shapely.to_wkb(shapely.set_srid(geometry, srid), include_srid=True)


# -- every reason code, with a detail naming the culprit -------------------------------------------
def self_crossing_ring(vertices: int, seed: int = 1) -> np.ndarray:
    """A ring through random points: it crosses itself almost everywhere, GEOS's slowest repair
    (2,000 vertices take it far longer than a second)."""
    points = np.random.default_rng(seed).uniform(2.0, 2.01, (vertices, 2))
    return np.vstack([points, points[:1]])


REASON_CASES = [
    pytest.param(Reason.NULL_VALUE, None, DEMO, None, ["null value"], id="null_value"),
    pytest.param(
        Reason.MESSAGE_TOO_LARGE,
        feature(point(1, 2), note="x" * 300),
        DEMO,
        DecodeOptions(max_message_bytes=250),
        ["max_message_bytes=250", "bytes"],
        id="message_too_large",
    ),
    pytest.param(Reason.UNKNOWN_FORMAT, b"garbage bytes", DEMO, None, ["first byte"], id="unknown_format"),
    pytest.param(
        Reason.FORMAT_NOT_ACCEPTED,
        feature(point(1, 2)),
        dataclasses.replace(DEMO, formats=("wkb",)),
        None,
        ["GeoJSON"],
        id="format_not_accepted-geojson",
    ),
    pytest.param(
        Reason.FORMAT_NOT_ACCEPTED,
        ewkb(shapely.Point(1, 2), 4326),
        dataclasses.replace(DEMO, formats=("geojson", "wkb")),
        None,
        ["EWKB"],
        id="format_not_accepted-ewkb",
    ),
    pytest.param(
        Reason.FORMAT_NOT_ACCEPTED,
        shapely.to_wkb(shapely.Point(1, 2)),
        dataclasses.replace(DEMO, formats=("geojson", "ewkb")),
        None,
        ["without an SRID"],
        id="format_not_accepted-wkb",
    ),
    pytest.param(
        Reason.MALFORMED_JSON,
        b'{"type": "Feature", "id": "cut", "geometry": {"type": "Po',
        DEMO,
        None,
        ["not valid JSON"],
        id="malformed_json",
    ),
    pytest.param(
        Reason.NOT_A_FEATURE,
        b'{"type": "FeatureCollection", "features": []}',
        DEMO,
        None,
        ["'FeatureCollection'", "'Feature'"],
        id="not_a_feature",
    ),
    pytest.param(Reason.NOT_A_FEATURE, b"[1, 2]", DEMO, None, ["array"], id="not_a_feature-array"),
    pytest.param(Reason.MISSING_GEOMETRY, feature(None), DEMO, None, ["geometry"], id="missing_geometry"),
    pytest.param(
        Reason.INVALID_GEOJSON_GEOMETRY,
        feature({"type": "Point", "coordinates": "abc"}),
        DEMO,
        None,
        ["geometry", "abc"],
        id="invalid_geojson_geometry",
    ),
    pytest.param(
        Reason.BAD_WKB, b"\x01\x01\x00\x00\x00\x00\x00", DEMO, None, ["WKB", "7 bytes", "01010000"], id="bad_wkb"
    ),
    pytest.param(Reason.GPKG_TOO_SHORT, b"GP\x00\x01", GPKG, None, ["4 bytes", "8-byte"], id="gpkg_too_short"),
    pytest.param(Reason.GPKG_BAD_MAGIC, b"GQ\x00\x01\x00\x00\x00\x00", GPKG, None, ["bytes 0-1"], id="gpkg_bad_magic"),
    pytest.param(
        Reason.GPKG_UNKNOWN_VERSION,
        header(version=2) + POINT_WKB,
        GPKG,
        None,
        ["byte 2", "2"],
        id="gpkg_unknown_version",
    ),
    pytest.param(
        Reason.GPKG_BAD_FLAGS, header(kind=5) + POINT_WKB, GPKG, None, ["byte 3", "indicator 5"], id="gpkg_bad_flags"
    ),
    pytest.param(
        Reason.GPKG_ENVELOPE_TRUNCATED,
        header(kind=2) + b"\x00" * 20,
        GPKG,
        None,
        ["bytes 8-55", "48 bytes"],
        id="gpkg_envelope_truncated",
    ),
    pytest.param(
        Reason.GPKG_EXTENDED_TYPE, header(extended=True) + POINT_WKB, GPKG, None, ["bit 5"], id="gpkg_extended_type"
    ),
    pytest.param(
        Reason.GPKG_ENVELOPE_MISMATCH,
        gpkg(shapely.box(2, 48, 3, 49), kind=1, envelope=[2.0, 3.0, 48.0, 50.0]),
        GPKG,
        None,
        ["envelope", "maxy 50"],
        id="gpkg_envelope_mismatch",
    ),
    pytest.param(Reason.EMPTY_GEOMETRY, feature(point()), DEMO, None, ["empty"], id="empty_geometry-geojson"),
    pytest.param(
        Reason.EMPTY_GEOMETRY,
        shapely.to_wkb(shapely.from_wkt("LINESTRING EMPTY")),
        DEMO,
        None,
        ["empty"],
        id="empty_geometry-wkb",
    ),
    pytest.param(
        Reason.GEOMETRY_TYPE_NOT_ALLOWED,
        feature({"type": "GeometryCollection", "geometries": [point(1, 2)]}),
        DEMO,
        None,
        ["GeometryCollection"],
        id="geometry_type_not_allowed",
    ),
    pytest.param(
        Reason.DIMENSION_NOT_ALLOWED,
        shapely.to_wkb(shapely.from_wkt("POINT M (1 2 3)")),
        DEMO,
        None,
        ["XYM"],
        id="dimension_not_allowed-xym",
    ),
    pytest.param(
        Reason.DIMENSION_NOT_ALLOWED,
        feature(point(1, 2, 3)),
        with_geometry(dimensions=("XY",)),
        None,
        ["XYZ"],
        id="dimension_not_allowed-xyz",
    ),
    pytest.param(
        Reason.DIMENSION_NOT_ALLOWED,
        feature(point(1, 2, 3, 4)),
        DEMO,
        None,
        ["geometry.coordinates", "4 values"],
        id="dimension_not_allowed-4d-geojson",
    ),
    pytest.param(
        Reason.NON_FINITE_COORDINATES,
        shapely.to_wkb(shapely.Point(float("nan"), 1)),
        DEMO,
        None,
        ["NaN"],
        id="non_finite_coordinates-wkb",
    ),
    pytest.param(
        Reason.NON_FINITE_COORDINATES,
        b'{"type":"Feature","id":"n","geometry":{"type":"Point","coordinates":[NaN,1]},"properties":{}}',
        DEMO,
        None,
        ["geometry.coordinates"],
        id="non_finite_coordinates-geojson",
    ),
    pytest.param(Reason.UNKNOWN_SRID, ewkb(shapely.Point(1, 2), 999999), DEMO, None, ["999999"], id="unknown_srid"),
    # Just past the pole: PROJ has no Web Mercator coordinates for it (inf).
    pytest.param(
        Reason.REPROJECTION_FAILED,
        ewkb(shapely.Point(0, 91), 4326),
        with_geometry(epsg=3857),
        None,
        ["EPSG:4326", "EPSG:3857"],
        id="reprojection_failed-proj",
    ),
    pytest.param(
        Reason.REPROJECTION_FAILED,
        ewkb(shapely.from_wkt("POINT M (261600 6250000 7)"), 3857),
        XYM_CONTRACT,
        None,
        ["EPSG:3857", " M "],
        id="reprojection_failed-m",
    ),
    pytest.param(
        Reason.OUTSIDE_CRS_AREA, feature(point(10.0, 123.0)), DEMO, None, ["123", "EPSG:4326"], id="outside_crs_area"
    ),
    pytest.param(
        Reason.INVALID_POLYGON,
        feature(BOW_TIE),
        with_geometry(invalid_polygons="reject"),
        None,
        ["Self-intersection"],
        id="invalid_polygon-reject",
    ),
    pytest.param(
        Reason.INVALID_POLYGON,
        feature(BOW_TIE),
        with_geometry(types=("Point", "Polygon")),
        None,
        ["Self-intersection", "MultiPolygon"],
        id="invalid_polygon-repair-not-allowed",
    ),
    pytest.param(
        Reason.TOO_MANY_VERTICES,
        feature({"type": "LineString", "coordinates": [[0, 0], [1, 1], [2, 2]]}),
        DEMO,
        DecodeOptions(max_vertices=2),
        ["max_vertices=2", "3 vertices"],
        id="too_many_vertices",
    ),
    pytest.param(
        Reason.TIME_BUDGET_EXCEEDED,
        feature({"type": "Polygon", "coordinates": [self_crossing_ring(2_000).tolist()]}),
        DEMO,
        DecodeOptions(max_record_seconds=0.3),
        ["2001 vertices", "max_record_seconds=0.3"],
        id="time_budget_exceeded",
    ),
    pytest.param(
        Reason.MISSING_REQUIRED_FIELD,
        feature(point(1, 2), fid=None),
        DEMO,
        None,
        ["event_id", "'id'", "'kafka.key'"],
        id="missing_required_field",
    ),
    pytest.param(
        Reason.PROPERTY_TYPE_MISMATCH,
        feature(point(1, 2), speed="fast"),
        DEMO,
        None,
        ["properties.speed", "'fast'"],
        id="property_type_mismatch-property",
    ),
    pytest.param(
        Reason.PROPERTY_TYPE_MISMATCH,
        feature(point(1, 2), population=1.5),
        DEMO,
        None,
        ["properties.population", "1.5"],
        id="property_type_mismatch-float-for-long",
    ),
    pytest.param(
        Reason.PROPERTY_TYPE_MISMATCH, feature(point(1, 2), fid=[1]), DEMO, None, ["id"], id="property_type_mismatch-id"
    ),
    pytest.param(
        Reason.NESTING_TOO_DEEP,
        b'{"type":"Feature","id":"d","properties":{},"geometry":'
        + b'{"type":"GeometryCollection","geometries":[' * 40
        + b'{"type":"Point","coordinates":[1,2]}'
        + b"]}" * 40
        + b"}",
        DEMO,
        None,
        ["max_nesting=32"],
        id="nesting_too_deep-geojson",
    ),
    pytest.param(
        Reason.NESTING_TOO_DEEP,
        (b"\x01\x07\x00\x00\x00\x01\x00\x00\x00") * 40 + shapely.to_wkb(shapely.Point(1, 2)),
        DEMO,
        None,
        ["max_nesting=32"],
        id="nesting_too_deep-wkb",
    ),
]

# Plain JSON events (format "json") and WKT: WKB points stay accepted, for the good records around.
WKT_CONTRACT = dataclasses.replace(DEMO, formats=(*DEMO.formats, "wkt", "ewkt"))


def json_contract(section: dict | None = None) -> Contract:
    raw = copy.deepcopy(RAW_CONTRACT)
    raw["formats"] = ["json", "wkb", "ewkb"]
    raw["json"] = section or {"lon": "lon", "lat": "lat"}
    raw["columns"][4]["from"] = ["json.speed"]
    return parse_contract(raw)


JSON_LON_LAT = json_contract()
REASON_CASES += [
    pytest.param(Reason.BAD_WKT, b"POINT (1 2) junk", WKT_CONTRACT, None, ["Unexpected text", "junk"], id="bad_wkt"),
    pytest.param(Reason.NOT_A_JSON_OBJECT, b"[1, 2]", JSON_LON_LAT, None, ["array"], id="not_a_json_object"),
    pytest.param(
        Reason.MISSING_COORDINATES, b'{"lon": 1.5, "lat": null}', JSON_LON_LAT, None, ["lat"], id="missing_coordinates"
    ),
    pytest.param(
        Reason.COORDINATE_AS_STRING,
        b'{"lon": "1.5", "lat": 2}',
        JSON_LON_LAT,
        None,
        ["lon", "'1.5'"],
        id="coordinate_as_string",
    ),
    pytest.param(
        Reason.COORDINATE_NOT_A_NUMBER,
        b'{"lon": [1.5], "lat": 2}',
        JSON_LON_LAT,
        None,
        ["lon", "[1.5]"],
        id="coordinate_not_a_number",
    ),
    pytest.param(
        Reason.LATITUDE_OUT_OF_RANGE, b'{"lon": 100, "lat": 95}', JSON_LON_LAT, None, ["lat", "95"], id="lat_range"
    ),
    pytest.param(
        Reason.LONGITUDE_OUT_OF_RANGE, b'{"lon": 190, "lat": 10}', JSON_LON_LAT, None, ["lon", "190"], id="lon_range"
    ),
    pytest.param(
        Reason.SWAPPED_AXES,
        b'{"lon": 48.85, "lat": 2.35}',
        json_contract({"lon": "lon", "lat": "lat", "crs": "EPSG:4258"}),
        None,
        ["EPSG:4258", "swapped"],
        id="swapped_axes",
    ),
    pytest.param(
        Reason.BAD_GEOMETRY_ENCODING,
        b'{"geom": "01zz"}',
        json_contract({"geometry": {"path": "geom", "encoding": "wkb_hex"}}),
        None,
        ["geom", "hexadecimal"],
        id="bad_geometry_encoding",
    ),
]

# Rasters (format "stac"): plain raster references, one thing wrong in each.
SCENES = load_contract(CONTRACT_PATH.parent / "scenes.json")


def raster_reference(**changes) -> bytes:
    event = {"id": "r", "uri": "s3://r.tif", "crs": "EPSG:32631", "transform": [10, 0, 448e3, 0, -10, 5411e3]}
    event["shape"] = [100, 200]
    event.update(changes)
    return json.dumps({k: v for k, v in event.items() if v is not None}).encode()


REASON_CASES += [
    pytest.param(
        Reason.RASTER_WITHOUT_TRANSFORM,
        raster_reference(transform=None),
        SCENES,
        None,
        ["transform", "missing"],
        id="raster_without_transform",
    ),
    pytest.param(
        Reason.UNKNOWN_RASTER_CRS, raster_reference(crs="EPSG:1"), SCENES, None, ["EPSG:1"], id="unknown_raster_crs"
    ),
    pytest.param(
        Reason.BAD_RASTER_SHAPE, raster_reference(shape=[100, -2]), SCENES, None, ["shape"], id="bad_raster_shape"
    ),
]


def test_reason_cases_cover_every_reason_code():
    # decode_failed marks a defect of the decoder, which no input is meant to reach:
    # test_a_decoder_defect_dead_letters_only_the_record_it_struck produces it. The registry
    # formats' reasons have cases of their own (tests/streaming/decode/formats/test_avro.py), and
    # so do Debezium's (tests/streaming/decode/formats/test_debezium.py). no_route is given before
    # decoding, to a split topic's record that names no table (tests/app/test_routing.py).
    from tests.streaming.decode.formats.test_avro import REGISTRY_REASONS
    from tests.streaming.decode.formats.test_debezium import DEBEZIUM_REASONS

    expected = set(Reason) - {Reason.DECODE_FAILED, Reason.NO_ROUTE} - REGISTRY_REASONS - DEBEZIUM_REASONS
    assert {case.values[0] for case in REASON_CASES} == expected


@pytest.mark.parametrize("reason, value, contract, options, detail_names", REASON_CASES)
def test_each_reject_has_its_reason_and_names_the_culprit(reason, value, contract, options, detail_names):
    # The bad record sits between good ones: only it is rejected.
    keys = [b"good-key", None if reason is Reason.MISSING_REQUIRED_FIELD else b"bad-key", b"good-key-2"]
    good = GOOD if "geojson" in contract.formats else shapely.to_wkb(shapely.Point(2.35, 48.86))
    if "stac" in contract.formats:
        good = raster_reference()
    rows = decode([good, value, good], contract, options, keys=keys)
    bad = rows[1]
    assert bad[REJECT_REASON] == reason.value, bad[REJECT_DETAIL]
    for name in detail_names:
        assert name in bad[REJECT_DETAIL]
    assert bad[RAW_VALUE] == value
    assert bad[HILBERT] is None and bad["bbox"] is None and bad["geometry"] is None
    assert_valid(rows[0])
    assert_valid(rows[2])


# -- valid events ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, reason",
    [
        (b'{"type": "Feature", "id": "cut", "geometry": {"type": "Po', Reason.MALFORMED_JSON),
        (feature(point(1, 2), fid="bad", speed="fast"), Reason.PROPERTY_TYPE_MISMATCH),
        (b'{"type": "Feature", "id": "a"}{"type": "Feature", "id": "b"}', Reason.MALFORMED_JSON),
    ],
    ids=["malformed", "type-mismatch", "two-documents-in-one"],
)
def test_one_bad_record_among_a_thousand_good_ones(bad, reason):
    """The block parser refuses the whole block and must bisect down to the one bad document."""
    good = [feature(point(i % 170, i % 80), fid=f"g-{i}", speed=float(i), population=i) for i in range(1000)]
    at = 617
    rows = decode(good[:at] + [bad] + good[at:])
    reasons = [r[REJECT_REASON] for r in rows]
    assert reasons.count(None) == 1000
    assert reasons[at] == reason
    valid = rows[:at] + rows[at + 1 :]
    assert [r["event_id"] for r in valid] == [f"g-{i}" for i in range(1000)]
    assert [r["speed"] for r in valid] == [float(i) for i in range(1000)], "properties stay with their row"
    assert [r["population"] for r in valid] == list(range(1000))


def mixed_batch() -> list[bytes | None]:
    return [
        GOOD,
        None,
        b"garbage",
        shapely.to_wkb(shapely.Point(5, 6)),
        feature(point(10, 123)),
        b"  \n" + feature(point(1, 2), speed="fast"),
        ewkb(shapely.Point(261_600.0, 6_250_000.0), 3857),
        b'{"type": "Fea\n',
        feature(point(7, 8, 9), fid=7),
    ]


def test_rows_and_source_coordinates_are_carried_for_every_record():
    values = mixed_batch()
    rows = decode(values)
    assert [r[SOURCE_OFFSET] for r in rows] == list(range(FIRST_OFFSET, FIRST_OFFSET + len(values)))
    assert {r[SOURCE_PARTITION] for r in rows} == {2}
    assert {r[SOURCE_TOPIC] for r in rows} == {TOPIC}
    valid = [r for r in rows if r[REJECT_REASON] is None]
    assert len(valid) == 4
    assert all(r["source_offset"] == r[SOURCE_OFFSET] and r["source_partition"] == 2 for r in valid)


def test_raw_bytes_are_kept_untouched_for_rejects_and_dropped_for_valid_rows():
    values = mixed_batch()
    keys = [f"key-{i}".encode() for i in range(len(values))]
    rows = decode(values, keys=keys)
    for row, value, key in zip(rows, values, keys):
        if row[REJECT_REASON] is None:
            assert row[RAW_VALUE] is None and row[RAW_KEY] is None
        else:
            assert row[RAW_VALUE] == value, "byte for byte, leading whitespace and line breaks included"
            assert row[RAW_KEY] == key


def test_hilbert_key_and_bbox_of_valid_rows_come_from_the_stored_geometry():
    rows = [
        r
        for r in decode(mixed_batch() + [feature({"type": "Polygon", "coordinates": [SQUARE, HOLE]})])
        if r[REJECT_REASON] is None
    ]
    assert len(rows) == 5
    bounds = np.array([shapely.bounds(geometry_of(r)) for r in rows])
    bbox = np.array([[r["bbox"][k] for k in ("xmin", "ymin", "xmax", "ymax")] for r in rows])
    np.testing.assert_array_equal(bbox, bounds)
    expected = hilbert_keys_of_bounds(
        bbox[:, 0], bbox[:, 1], bbox[:, 2], bbox[:, 3], DEMO.clustering.extent, DEMO.clustering.hilbert_bits
    )
    assert [r[HILBERT] for r in rows] == expected.tolist()
    assert len(set(expected.tolist())) > 1


def test_hilbert_key_uses_the_table_crs_extent():
    """In a Web Mercator table, keys are computed on reprojected metres over the 3857 extent."""
    contract = contract_from(table_in_web_mercator)
    rows = decode([feature(point(2.35, 48.86)), feature(point(-74.0, 40.7))], contract)
    for row in rows:
        assert_valid(row)
        b = row["bbox"]
        assert abs(b["xmin"]) > 1000, "stored in metres"
        key = hilbert_keys_of_bounds(
            np.array([b["xmin"]]),
            np.array([b["ymin"]]),
            np.array([b["xmax"]]),
            np.array([b["ymax"]]),
            contract.clustering.extent,
            contract.clustering.hilbert_bits,
        )
        assert row[HILBERT] == key[0]


def test_all_rejected_batch_keeps_every_row():
    rows = decode([None, b"nope", b"\x01\x02"])
    assert [r[REJECT_REASON] for r in rows] == ["null_value", "unknown_format", "bad_wkb"]


def test_empty_batch_decodes_to_an_empty_batch_with_the_decoded_schema():
    decoder = Decoder(DEMO)
    out = decoder.decode(kafka_batch([]))
    assert out.num_rows == 0
    assert out.schema == decoded_schema(DEMO)
    as_table = decoder.decode(pa.Table.from_batches([kafka_batch([])]))
    assert as_table.num_rows == 0 and as_table.schema == decoded_schema(DEMO)


def test_a_sliced_batch_decodes_its_own_rows():
    wkb = shapely.to_wkb(shapely.Point(1, 2))
    batch = kafka_batch([GOOD, wkb, wkb], headers=[[("kind", b"h0")], [("kind", b"h1")], [("kind", b"h2")]])
    rows = Decoder(DEMO).decode(batch.slice(1)).to_pylist()
    assert [(r["event_id"], r["kind"], r[SOURCE_OFFSET]) for r in rows] == [
        ("k-1", "h1", FIRST_OFFSET + 1),
        ("k-2", "h2", FIRST_OFFSET + 2),
    ]


# -- bugs found while writing these tests --------------------------------------------------------------


# -- hostile input: whatever the bytes, one row out with a reason, and the neighbours unharmed ------
def deep(opening: bytes, closing: bytes, levels: int) -> bytes:
    return opening * levels + closing * levels


HOSTILE_CASES = [
    # depth: Python's parser gives up (RecursionError), GEOS would overflow its stack
    pytest.param(
        b'{"type":"Feature","id":"d","properties":{},"geometry":{"type":"Point","coordinates":'
        + deep(b"[", b"]", 100_000)
        + b"}}",
        Reason.NESTING_TOO_DEEP,
        id="coordinates-100k-deep",
    ),
    pytest.param(
        b'{"type":"Feature","id":"d","properties":{},"geometry":'
        + b'{"type":"GeometryCollection","geometries":[' * 20_000
        + b'{"type":"Point","coordinates":[1,2]}'
        + b"]}" * 20_000
        + b"}",
        Reason.NESTING_TOO_DEEP,
        id="geometry-collections-20k-deep",
    ),
    pytest.param(
        b'{"type":"Feature","id":"d","properties":{},"geometry":'
        + b'{"type":"Feature","geometry":' * 20_000
        + b'{"type":"Point","coordinates":[1,2]}'
        + b"}" * 20_000
        + b"}",
        Reason.NESTING_TOO_DEEP,
        id="features-in-geometry-20k-deep",
    ),
    pytest.param(deep(b'{"a":', b"}", 50_000), Reason.NESTING_TOO_DEEP, id="objects-50k-deep"),
    pytest.param(
        b"\x01\x07\x00\x00\x00\x01\x00\x00\x00" * 100_000 + POINT_WKB,
        Reason.NESTING_TOO_DEEP,
        id="wkb-collections-100k-deep",
    ),
    pytest.param(
        b"\x00\x00\x00\x00\x06\x00\x00\x00\x01" * 100_000 + POINT_WKB,
        Reason.NESTING_TOO_DEEP,
        id="wkb-big-endian-multipolygons-100k-deep",
    ),
    # short enough for GEOS to read (or refuse) safely: the nesting is checked on what it read
    pytest.param(
        b"\x01\x06\x00\x00\x00\x01\x00\x00\x00" * 40 + POINT_WKB,
        Reason.NESTING_TOO_DEEP,
        id="wkb-multipolygons-40-deep",
    ),
    pytest.param(
        b"\x01\x07\x00\x00\x00\x01\x00\x00\x00" * 39 + b"\x01\x04\x00\x00\x00\x01\x00\x00\x00" + POINT_WKB,
        Reason.NESTING_TOO_DEEP,
        id="wkb-multipoint-in-collections-40-deep",
    ),
    # control bytes
    pytest.param(
        b'{"type":"Feature","id":"a\x01b","properties":{},"geometry":{"type":"Point","coordinates":[1,2]}}',
        Reason.MALFORMED_JSON,
        id="control-byte-in-id",
    ),
    pytest.param(
        b'{"type":"Feature","id":"a","properties":{},"geometry":{"type":"Po\x1fint","coordinates":[1,2]}}',
        Reason.MALFORMED_JSON,
        id="control-byte-in-geometry-type",
    ),
    pytest.param(
        b'{"type":"Feature","id":"a","properties":{"kind":"x\x00y"},"geometry":{"type":"Point","coordinates":[1,2]}}',
        Reason.MALFORMED_JSON,
        id="nul-byte-in-property",
    ),
    # trailing bytes
    pytest.param(POINT_WKB + b"junk", Reason.BAD_WKB, id="wkb-trailing-junk"),
    pytest.param(POINT_WKB + b"\x00", Reason.BAD_WKB, id="wkb-one-trailing-zero"),
    pytest.param(ewkb(shapely.Point(2.35, 48.86), 4326) + POINT_WKB, Reason.BAD_WKB, id="ewkb-two-geometries"),
    pytest.param(GOOD + b" {}", Reason.MALFORMED_JSON, id="json-two-documents"),
    pytest.param(GOOD + b"\x00", Reason.MALFORMED_JSON, id="json-trailing-nul"),
    # wrong nesting
    pytest.param(
        feature({"type": "Feature", "geometry": point(1, 2), "properties": {}}),
        Reason.INVALID_GEOJSON_GEOMETRY,
        id="feature-as-geometry",
    ),
    pytest.param(
        feature({"type": "FeatureCollection", "features": []}),
        Reason.INVALID_GEOJSON_GEOMETRY,
        id="feature-collection-as-geometry",
    ),
    pytest.param(feature("POINT (1 2)"), Reason.INVALID_GEOJSON_GEOMETRY, id="wkt-string-as-geometry"),
    pytest.param(feature([1, 2]), Reason.INVALID_GEOJSON_GEOMETRY, id="array-as-geometry"),
    pytest.param(
        feature({"type": "GeometryCollection", "geometries": [{"type": "Feature", "geometry": point(1, 2)}]}),
        Reason.INVALID_GEOJSON_GEOMETRY,
        id="feature-in-geometry-collection",
    ),
    pytest.param(
        json.dumps({"type": "Feature", "id": "x", "geometry": {"type": 5}, "properties": {}}).encode(),
        Reason.INVALID_GEOJSON_GEOMETRY,
        id="number-as-geometry-type",
    ),
    # size claims
    pytest.param(b"\x01\x02\x00\x00\x00\xff\xff\xff\x7f" + b"\x00" * 32, Reason.BAD_WKB, id="wkb-claims-2G-points"),
    pytest.param(b"\x01\x04\x00\x00\x00\xff\xff\xff\x7f" + POINT_WKB * 2, Reason.BAD_WKB, id="wkb-claims-2G-parts"),
    # line breaks the block readers would take as spaces, encodings json.loads would guess
    pytest.param(
        b'{"type":"Feature","id":"a\nb","properties":{},"geometry":{"type":"Point","coordinates":[1,2]}}',
        Reason.MALFORMED_JSON,
        id="raw-line-feed-in-id",
    ),
    pytest.param(
        b'{"type":"Feature","id":"a","properties":{"kind":"x\ry"},"geometry":{"type":"Point","coordinates":[1,2]}}',
        Reason.MALFORMED_JSON,
        id="raw-cr-in-property",
    ),
    pytest.param(GOOD.decode().encode("utf-16-le"), Reason.MALFORMED_JSON, id="utf-16-le"),
    pytest.param(GOOD.decode().encode("utf-16-be"), Reason.BAD_WKB, id="utf-16-be-looks-like-big-endian-wkb"),
    pytest.param(b"\xef\xbb\xbf" + GOOD, Reason.UNKNOWN_FORMAT, id="utf-8-bom"),
    # numbers beyond what the readers hold
    pytest.param(
        b'{"type":"Feature","id":"n","properties":{},"geometry":{"type":"Point","coordinates":['
        + b"1" * 5000
        + b",2]}}",
        Reason.NON_FINITE_COORDINATES,
        id="5000-digit-coordinate",
    ),
    pytest.param(
        b'{"type":"Feature","id":' + b"9" * 5000 + b',"properties":{},"geometry":{"type":"Point","coordinates":[1,2]}}',
        Reason.PROPERTY_TYPE_MISMATCH,
        id="5000-digit-id",
    ),
    pytest.param(
        b'{"type":"Feature","id":1e999,"properties":{},"geometry":{"type":"Point","coordinates":[1,2]}}',
        Reason.PROPERTY_TYPE_MISMATCH,
        id="infinite-id",
    ),
    pytest.param(
        b'{"type":"Feature","id":"a","properties":{"speed":NaN},"geometry":{"type":"Point","coordinates":[1,2]}}',
        Reason.PROPERTY_TYPE_MISMATCH,
        id="nan-property",
    ),
    pytest.param(
        b'{"type":"Feature","id":"a","properties":{"speed":-Infinity},"geometry":{"type":"Point","coordinates":[1,2]}}',
        Reason.PROPERTY_TYPE_MISMATCH,
        id="infinite-property",
    ),
    # WKB that GEOS reads but that is not one well-formed WKB geometry
    pytest.param(
        b"\x01" + (0x00010001).to_bytes(4, "little") + POINT_WKB[5:],
        Reason.BAD_WKB,
        id="wkb-type-word-with-undefined-bits",
    ),
    pytest.param(
        b"\x01\x04\x00\x00\x00\x01\x00\x00\x00\x07" + POINT_WKB[1:], Reason.BAD_WKB, id="wkb-part-with-byte-order-7"
    ),
    pytest.param(
        b"\x01\x04\x00\x00\x00\x01\x00\x00\x00" + ewkb(shapely.Point(2.35, 48.86), 3857),
        Reason.BAD_WKB,
        id="ewkb-srid-on-a-part",
    ),
    pytest.param(
        b"\x01\x04\x00\x00\x00\x02\x00\x00\x00" + POINT_WKB + shapely.to_wkb(shapely.Point(2.35, 48.86, 1)),
        Reason.BAD_WKB,
        id="wkb-parts-of-mixed-dimensions",
    ),
    pytest.param(
        b"\x01"
        + (0x20000000 | 1001).to_bytes(4, "little")
        + (4326).to_bytes(4, "little")
        + shapely.to_wkb(shapely.Point(2.35, 48.86, 1))[5:],
        Reason.BAD_WKB,
        id="iso-z-type-with-ewkb-srid-flag",
    ),
    pytest.param(b"\x01\x07\x00\x00\x00\x00\x00\x00\x00" + POINT_WKB, Reason.BAD_WKB, id="empty-collection-then-junk"),
    # a curve inside a collection: shapely holds the collection, not the curve
    pytest.param(
        b"\x01\x07\x00\x00\x00\x02\x00\x00\x00"
        + POINT_WKB
        + b"\x01\x08\x00\x00\x00\x03\x00\x00\x00"
        + np.array([0, 0, 1, 1, 2, 0], dtype="<f8").tobytes(),
        Reason.GEOMETRY_TYPE_NOT_ALLOWED,
        id="circular-string-in-a-collection",
    ),
    # CRSs that are no place on a map
    pytest.param(b"\x01\x01\x00\x00\x20\x00\x00\x00\x00" + POINT_WKB[5:], Reason.UNKNOWN_SRID, id="ewkb-srid-0"),
    pytest.param(ewkb(shapely.Point(1, 2), 5773), Reason.UNKNOWN_SRID, id="vertical-crs"),
    pytest.param(ewkb(shapely.Point(1, 2, 3), 4978), Reason.UNKNOWN_SRID, id="geocentric-crs"),
    pytest.param(ewkb(shapely.Point(1, 2), -5), Reason.UNKNOWN_SRID, id="negative-srid"),
]


@pytest.mark.parametrize("value, reason", HOSTILE_CASES)
def test_hostile_input_is_rejected_with_its_reason_between_good_records(value, reason):
    rows = decode([GOOD, value, POINT_WKB, value, GOOD], options=DecodeOptions(max_message_bytes=64 * 1024 * 1024))
    for bad in (rows[1], rows[3]):
        assert bad[REJECT_REASON] == reason.value, bad[REJECT_DETAIL]
        assert bad[RAW_VALUE] == value
    for good in (rows[0], rows[2], rows[4]):
        assert_valid(good)


def test_key_and_headers_count_toward_max_message_bytes():
    small = feature(point(1, 2))
    rows = decode(
        [small, small, small],
        options=DecodeOptions(max_message_bytes=len(small) + 100),
        keys=[b"k", b"k" * 200, b"k"],
        headers=[[], [], [("note", b"h" * 200)]],
    )
    assert_valid(rows[0])
    for row in rows[1:]:
        assert row[REJECT_REASON] == Reason.MESSAGE_TOO_LARGE
        assert "key + value + headers" in row[REJECT_DETAIL]


def test_details_stay_short_whatever_the_value_they_name():
    huge = b'{"type":"Feature","id":"a","properties":{"kind":"' + b"x" * 100_000 + b'"},"geometry":'
    deep_kind = (
        b'{"type":"Feature","id":"a","properties":{"kind":'
        + deep(b"[", b"]", 900)
        + b'},"geometry":{"type":"Point","coordinates":[1,2]}}'
    )
    rows = decode(
        [
            huge + b'{"type":"Point","coordinates":[1,2]}}'.replace(b"Point", b"P" * 50_000, 1),
            feature(point(1, 2), kind=["y" * 100_000]),
            deep_kind,
        ]
    )
    for row in rows:
        assert row[REJECT_REASON] is not None
        assert len(row[REJECT_DETAIL]) < 400


def test_the_fate_of_a_record_does_not_depend_on_its_neighbours():
    # A block the JSON reader refuses is split until single records remain; each must then meet
    # the same verdict it meets alone.
    tricky = [
        feature(point(1, 2), fid=7),
        deep(b'{"a":', b"}", 2000),
        feature(point(1, 2), speed="x"),
        GOOD,
        b'{"type":"Feature","id":"a\x01","properties":{},"geometry":{"type":"Point","coordinates":[1,2]}}',
        # valid, with a member deeper than json.loads reads: read one by one, it must still land
        b'{"type":"Feature","id":"deep","properties":{},"other":'
        + deep(b"[", b"]", 5000)
        + b',"geometry":{"type":"Point","coordinates":[1,2]}}',
        feature(point(1, 2), fid=1.5),
        b'{"type":"Feature","id":"x","properties":{"speed":NaN},"geometry":{"type":"Point","coordinates":[1,2]}}',
    ]

    def fate(row: dict) -> tuple:
        return (row[REJECT_REASON], row["event_id"]) if row[REJECT_REASON] is None else (row[REJECT_REASON],)

    alone = [fate(row) for value in tricky for row in decode([value])]
    # Among many refused records the reader goes one by one: the verdicts stay the same.
    crowd = [feature(point(1, 2), speed="x")] * 300
    together = decode(crowd + tricky + crowd + tricky[::-1])
    assert [fate(row) for row in together[300 : 300 + len(tricky)]] == alone
    assert [fate(row) for row in together[-len(tricky) :]] == alone[::-1]
    assert alone[5] == (None, "deep")


def test_a_decoder_defect_dead_letters_only_the_record_it_struck():
    # A defect cannot be produced by input on purpose (it would be fixed), so one is injected:
    # the geometry check fails on one record, as a bug in it would.
    class DefectiveRules(GeometryRules):
        def apply(self, decoded):
            # A 2D point is read as plain x, y, without a geometry object.
            if (decoded.points_xy[:, 0] == 7.0).any():
                raise ZeroDivisionError("a defect")
            super().apply(decoded)

    defective = Decoder(DEMO)
    defective._rules = DefectiveRules(DEMO, defective.options.max_vertices)
    values = [GOOD, feature(point(7.0, 1.0)), GOOD, POINT_WKB]
    rows = defective.decode(kafka_batch(values)).to_pylist()
    assert [r[REJECT_REASON] for r in rows] == [None, Reason.DECODE_FAILED.value, None, None]
    assert "ZeroDivisionError: a defect" in rows[1][REJECT_DETAIL]
    assert rows[1][RAW_VALUE] == values[1]
    assert [r[SOURCE_OFFSET] for r in rows] == [FIRST_OFFSET + i for i in range(4)]

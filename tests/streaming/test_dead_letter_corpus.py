"""A corpus of over 30 kinds of bad input, interleaved with good events, through a real broker:
each bad record reaches the dead-letter topic with its reason, every good one the table, and the
job never stops."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import pytest
import shapely
from kafka import KafkaConsumer

from app.service import run
from app.settings import load_settings
from streaming.catalog import create_table, open_catalog
from streaming.contract import load_contract
from streaming.dead_letter import REASON_HEADER, SOURCE_OFFSET_HEADER, SOURCE_PARTITION_HEADER
from tests.conftest import CACHE_DIR, produce_records

pytestmark = pytest.mark.integration

DEMO = load_contract(Path(__file__).resolve().parents[2] / "schemas" / "demo_events.json")
# Reject invalid polygons here, so that policy is exercised end to end too; allow XYM, so that an
# M geometry outside the table CRS meets the reprojection rule rather than the dimension rule.
CONTRACT = dataclasses.replace(DEMO, geometry=dataclasses.replace(
    DEMO.geometry, invalid_polygons="reject", dimensions=("XY", "XYZ", "XYM")))
MAX_MESSAGE_BYTES = 64 * 1024
MAX_VERTICES = 1000


def feature(geometry, fid="f", **properties) -> bytes:
    doc = {"type": "Feature", "geometry": geometry, "properties": properties}
    if fid is not None:
        doc["id"] = fid
    return json.dumps(doc).encode()


def point(x=1.0, y=2.0):
    return {"type": "Point", "coordinates": [x, y]}


def ewkb(geometry, srid: int) -> bytes:
    return shapely.to_wkb(shapely.set_srid(geometry, srid), include_srid=True)


LONG_LINE = {"type": "LineString", "coordinates": [[i * 0.001, 1.0] for i in range(MAX_VERTICES + 500)]}
BOW_TIE = {"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]}

# kind -> (key, value, expected reason)
CORPUS = {
    "null value": (b"k-null", None, "null_value"),
    "oversized message": (b"k-big", feature(point(), name="x" * (MAX_MESSAGE_BYTES + 10)), "message_too_large"),
    "plain text": (b"k-text", b"hello world", "unknown_format"),
    "empty value": (b"k-empty", b"", "unknown_format"),
    "whitespace only": (b"k-space", b"   \n ", "unknown_format"),
    "JSON string scalar": (b"k-str", b'"a string"', "unknown_format"),
    "JSON array": (b"k-arr", b"[1, 2, 3]", "not_a_feature"),
    "truncated JSON": (b"k-trunc", b'{"type": "Feature", "id": "t", "geometry": {"type": "Po', "malformed_json"),
    "invalid UTF-8": (b"k-utf8", b'{"type": "Feature", "id": "u", "properties": {"name": "caf\xe9"}, '
                                b'"geometry": {"type": "Point", "coordinates": [1, 2]}}', "malformed_json"),
    "FeatureCollection": (b"k-fc", b'{"type": "FeatureCollection", "features": []}', "not_a_feature"),
    "misspelled Feature": (b"k-typo", json.dumps({"type": "Fature", "geometry": point()}).encode(), "not_a_feature"),
    "null geometry": (b"k-nullgeom", feature(None), "missing_geometry"),
    "missing geometry": (b"k-nogeom", json.dumps({"type": "Feature", "id": "g", "properties": {}}).encode(),
                         "missing_geometry"),
    "empty Point": (b"k-emptypt", feature({"type": "Point", "coordinates": []}), "empty_geometry"),
    "one-point LineString": (b"k-line1", feature({"type": "LineString", "coordinates": [[1, 2]]}),
                             "invalid_geojson_geometry"),
    "unclosed ring": (b"k-ring", feature({"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1]]]}),
                      "invalid_geojson_geometry"),
    "unknown geometry type": (b"k-circle", feature({"type": "Circle", "coordinates": [1, 2]}),
                              "invalid_geojson_geometry"),
    "GeometryCollection": (b"k-gc", feature({"type": "GeometryCollection", "geometries": [point()]}),
                           "geometry_type_not_allowed"),
    "4D GeoJSON position": (b"k-4d", feature({"type": "Point", "coordinates": [1, 2, 3, 4]}), "dimension_not_allowed"),
    "XYZM WKB": (b"k-xyzm", shapely.to_wkb(shapely.from_wkt("POINT ZM (1 2 3 4)"), output_dimension=4,
                                            flavor="iso"), "dimension_not_allowed"),
    "NaN in WKB": (b"k-nan", shapely.to_wkb(shapely.Point(float("nan"), 2.0)), "non_finite_coordinates"),
    "overflowing GeoJSON number": (b"k-inf", b'{"type": "Feature", "id": "i", "properties": {}, '
                                            b'"geometry": {"type": "Point", "coordinates": [1e999, 2]}}',
                                   "non_finite_coordinates"),
    "latitude 123": (b"k-lat", feature(point(10.0, 123.0)), "outside_crs_area"),
    "longitude 200": (b"k-lon", feature(point(200.0, 10.0)), "outside_crs_area"),
    "unknown SRID": (b"k-srid", ewkb(shapely.Point(1, 2), 999999), "unknown_srid"),
    "M geometry in another CRS": (b"k-m3857", ewkb(shapely.from_wkt("POINT M (261600 6250000 7)"), 3857),
                                  "reprojection_failed"),
    "bow-tie polygon": (b"k-bowtie", feature(BOW_TIE), "invalid_polygon"),
    "too many vertices": (b"k-verts", feature(LONG_LINE), "too_many_vertices"),
    "truncated WKB": (b"k-wkbcut", shapely.to_wkb(shapely.Point(1, 2))[:11], "bad_wkb"),
    "garbage after a WKB byte order": (b"k-wkbjunk", b"\x01" + b"\xff" * 20, "bad_wkb"),
    "unknown WKB type code": (b"k-wkbtype", b"\x01" + struct.pack("<I", 99) + struct.pack("<dd", 1, 2), "bad_wkb"),
    "no id and no key": (None, feature(point(), fid=None), "missing_required_field"),
    "string for a double": (b"k-speed", feature(point(), speed="fast"), "property_type_mismatch"),
    "fraction for a long": (b"k-pop", feature(point(), population=1.5), "property_type_mismatch"),
    "number for a string": (b"k-kind", feature(point(), kind=5), "property_type_mismatch"),
    "properties not an object": (b"k-props", json.dumps({"type": "Feature", "id": "p", "properties": [1],
                                                         "geometry": point()}).encode(), "property_type_mismatch"),
    "boolean id": (b"k-boolid", json.dumps({"type": "Feature", "id": True, "properties": {},
                                            "geometry": point()}).encode(), "property_type_mismatch"),
}


def test_each_bad_event_reaches_the_dead_letter_topic_with_its_reason(kafka, spark, topic, tmp_path):
    assert len(CORPUS) >= 30
    good = [(f"good-{i}".encode(),
             feature(point((i % 360) - 179.5, (i % 170) - 84.5), fid=f"good-{i}", speed=1.0 * i), [])
            for i in range(3000)]
    records = list(good)
    for n, (kind, (key, value, _)) in enumerate(CORPUS.items()):
        records.insert(80 * n + 11, (key, value, [("corpus-kind", kind.encode())]))
    assert produce_records(kafka.bootstrap, topic, records) == len(records)

    settings = load_settings(
        env={}, bootstrap_servers=kafka.bootstrap, topic=topic, metrics_port=0, cache_dir=str(CACHE_DIR),
        catalog={"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path / 'wh'}"},
        checkpoint_location=str(tmp_path / "ck"), max_message_bytes=MAX_MESSAGE_BYTES, max_vertices=MAX_VERTICES,
        max_offsets_per_trigger=1000,  # several batches, each with bad records in it
    )
    create_table(open_catalog(settings.catalog_name, settings.catalog), CONTRACT)
    totals = run(settings, CONTRACT, until_idle=True, spark=spark)
    assert totals.batches >= 3 and totals.commits == {"committed": totals.batches}, "the job never stopped"

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(CONTRACT.table)
    ids = table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()
    assert sorted(ids) == sorted(f"good-{i}" for i in range(3000))

    consumer = KafkaConsumer(settings.dead_letter_topic, bootstrap_servers=kafka.bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=5000)
    dead = list(consumer)
    consumer.close()
    # At-least-once: a record is identified by where it came from.
    unique = {(dict(m.headers)[SOURCE_PARTITION_HEADER], dict(m.headers)[SOURCE_OFFSET_HEADER]): m for m in dead}
    found = {dict(m.headers)["corpus-kind"].decode(): dict(m.headers)[REASON_HEADER].decode() for m in unique.values()}
    assert found == {kind: reason for kind, (_, _, reason) in CORPUS.items()}
    assert len(ids) + len(unique) == len(records) == totals.consumed

"""A corpus of over 60 kinds of bad (and odd but valid) input, interleaved with good events, through
a real broker: each bad record reaches the dead-letter topic with one reason and its original key,
value and headers (inline, or stored beside the table when it is too large for a Kafka record),
each valid one the table, the job never stops, and table rows + dead letters == records produced.

The source topic takes records of up to 64 MiB, as a topic may: a 50 MB record is consumed and
dead-lettered like any other."""

from __future__ import annotations

import dataclasses
import json
import struct
import uuid
from pathlib import Path

import pytest
import shapely
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import NewTopic

from app.service import run
from streaming.contract import load_contract
from streaming.table.catalog import create_table, open_catalog
from streaming.write.dead_letter import (
    PAYLOAD_BYTES_HEADER,
    PAYLOAD_URI_HEADER,
    PRODUCER_HEADER_PREFIX,
    REASON_HEADER,
    SERVICE_HEADER_PREFIX,
    SOURCE_OFFSET_HEADER,
    SOURCE_PARTITION_HEADER,
    read_spilled,
)
from tests.conftest import local_settings, produce_records

pytestmark = pytest.mark.integration

DEMO = load_contract(Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json")
# Reject invalid polygons here, so that policy is exercised end to end too; allow XYM, so that an
# M geometry outside the table CRS meets the reprojection rule rather than the dimension rule.
CONTRACT = dataclasses.replace(
    DEMO, geometry=dataclasses.replace(DEMO.geometry, invalid_polygons="reject", dimensions=("XY", "XYZ", "XYM"))
)
MAX_MESSAGE_BYTES = 1024 * 1024  # the default
MAX_VERTICES = 1000
SOURCE_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MIB = 1024 * 1024


def feature(geometry, fid="f", **properties) -> bytes:
    doc = {"type": "Feature", "geometry": geometry, "properties": properties}
    if fid is not None:
        doc["id"] = fid
    return json.dumps(doc).encode()


def point(x=1.0, y=2.0):
    return {"type": "Point", "coordinates": [x, y]}


def ewkb(geometry, srid: int) -> bytes:
    return shapely.to_wkb(shapely.set_srid(geometry, srid), include_srid=True)


def deep(opening: bytes, closing: bytes, levels: int) -> bytes:
    return opening * levels + closing * levels


def in_feature(geometry: bytes, fid: bytes = b"x") -> bytes:
    return b'{"type":"Feature","id":"' + fid + b'","properties":{},"geometry":' + geometry + b"}"


def padded_to(size: int) -> bytes:
    """A valid Feature of exactly `size` bytes."""
    head = b'{"type":"Feature","id":"pad","properties":{"name":"'
    tail = b'"},"geometry":{"type":"Point","coordinates":[1,2]}}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


LONG_LINE = {"type": "LineString", "coordinates": [[i * 0.001, 1.0] for i in range(MAX_VERTICES + 500)]}
BOW_TIE = {"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]}
PT = b'{"type":"Point","coordinates":[1,2]}'
POINT_WKB = shapely.to_wkb(shapely.Point(2.35, 48.86))
WKB_GC = b"\x01\x07\x00\x00\x00\x01\x00\x00\x00"  # a GeometryCollection header of one part

# kind -> (key, value, extra headers, expected reason: None for a record that lands)
CORPUS: dict[str, tuple[bytes | None, bytes | None, list, str | None]] = {
    "null value": (b"k-null", None, [], "null_value"),
    "oversized message": (b"k-big", feature(point(), name="x" * (MAX_MESSAGE_BYTES + 10)), [], "message_too_large"),
    "plain text": (b"k-text", b"hello world", [], "unknown_format"),
    "empty value": (b"k-empty", b"", [], "unknown_format"),
    "whitespace only": (b"k-space", b"   \n ", [], "unknown_format"),
    "JSON string scalar": (b"k-str", b'"a string"', [], "unknown_format"),
    "JSON array": (b"k-arr", b"[1, 2, 3]", [], "not_a_feature"),
    "truncated JSON": (b"k-trunc", b'{"type": "Feature", "id": "t", "geometry": {"type": "Po', [], "malformed_json"),
    "invalid UTF-8": (
        b"k-utf8",
        b'{"type": "Feature", "id": "u", "properties": {"name": "caf\xe9"}, '
        b'"geometry": {"type": "Point", "coordinates": [1, 2]}}',
        [],
        "malformed_json",
    ),
    "FeatureCollection": (b"k-fc", b'{"type": "FeatureCollection", "features": []}', [], "not_a_feature"),
    "misspelled Feature": (
        b"k-typo",
        json.dumps({"type": "Fature", "geometry": point()}).encode(),
        [],
        "not_a_feature",
    ),
    "null geometry": (b"k-nullgeom", feature(None), [], "missing_geometry"),
    "missing geometry": (
        b"k-nogeom",
        json.dumps({"type": "Feature", "id": "g", "properties": {}}).encode(),
        [],
        "missing_geometry",
    ),
    "empty Point": (b"k-emptypt", feature({"type": "Point", "coordinates": []}), [], "empty_geometry"),
    "empty GeometryCollection": (
        b"k-emptygc",
        feature({"type": "GeometryCollection", "geometries": []}),
        [],
        "empty_geometry",
    ),
    "WKB polygon of one empty ring": (
        b"k-emptyring",
        b"\x01\x03\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00",
        [],
        "empty_geometry",
    ),
    "one-point LineString": (
        b"k-line1",
        feature({"type": "LineString", "coordinates": [[1, 2]]}),
        [],
        "invalid_geojson_geometry",
    ),
    "unclosed ring": (
        b"k-ring",
        feature({"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1]]]}),
        [],
        "invalid_geojson_geometry",
    ),
    "unknown geometry type": (
        b"k-circle",
        feature({"type": "Circle", "coordinates": [1, 2]}),
        [],
        "invalid_geojson_geometry",
    ),
    "Feature as geometry": (
        b"k-featgeom",
        feature({"type": "Feature", "geometry": point(), "properties": {}}),
        [],
        "invalid_geojson_geometry",
    ),
    "WKT string as geometry": (b"k-wktgeom", feature("POINT (1 2)"), [], "invalid_geojson_geometry"),
    "Feature inside a GeometryCollection": (
        b"k-featgc",
        feature({"type": "GeometryCollection", "geometries": [{"type": "Feature", "geometry": point()}]}),
        [],
        "invalid_geojson_geometry",
    ),
    "GeometryCollection": (
        b"k-gc",
        feature({"type": "GeometryCollection", "geometries": [point()]}),
        [],
        "geometry_type_not_allowed",
    ),
    "WKB CircularString": (
        b"k-curve",
        b"\x01\x08\x00\x00\x00\x03\x00\x00\x00" + struct.pack("<6d", 0, 0, 1, 1, 2, 0),
        [],
        "geometry_type_not_allowed",
    ),
    "4D GeoJSON position": (
        b"k-4d",
        feature({"type": "Point", "coordinates": [1, 2, 3, 4]}),
        [],
        "dimension_not_allowed",
    ),
    "XYZM WKB": (
        b"k-xyzm",
        shapely.to_wkb(shapely.from_wkt("POINT ZM (1 2 3 4)"), output_dimension=4, flavor="iso"),
        [],
        "dimension_not_allowed",
    ),
    "NaN in WKB": (b"k-nan", shapely.to_wkb(shapely.Point(float("nan"), 2.0)), [], "non_finite_coordinates"),
    "overflowing GeoJSON number": (
        b"k-inf",
        b'{"type": "Feature", "id": "i", "properties": {}, "geometry": {"type": "Point", "coordinates": [1e999, 2]}}',
        [],
        "non_finite_coordinates",
    ),
    "5000-digit coordinate": (
        b"k-digits",
        in_feature(b'{"type":"Point","coordinates":[' + b"1" * 5000 + b",2]}"),
        [],
        "non_finite_coordinates",
    ),
    "latitude 123": (b"k-lat", feature(point(10.0, 123.0)), [], "outside_crs_area"),
    "longitude 200": (b"k-lon", feature(point(200.0, 10.0)), [], "outside_crs_area"),
    "unknown SRID": (b"k-srid", ewkb(shapely.Point(1, 2), 999999), [], "unknown_srid"),
    "EWKB SRID 0": (b"k-srid0", b"\x01\x01\x00\x00\x20\x00\x00\x00\x00" + POINT_WKB[5:], [], "unknown_srid"),
    "vertical CRS": (b"k-vertical", ewkb(shapely.Point(1, 2), 5773), [], "unknown_srid"),
    "M geometry in another CRS": (
        b"k-m3857",
        ewkb(shapely.from_wkt("POINT M (261600 6250000 7)"), 3857),
        [],
        "reprojection_failed",
    ),
    "bow-tie polygon": (b"k-bowtie", feature(BOW_TIE), [], "invalid_polygon"),
    "too many vertices": (b"k-verts", feature(LONG_LINE), [], "too_many_vertices"),
    "truncated WKB": (b"k-wkbcut", shapely.to_wkb(shapely.Point(1, 2))[:11], [], "bad_wkb"),
    "garbage after a WKB byte order": (b"k-wkbjunk", b"\x01" + b"\xff" * 20, [], "bad_wkb"),
    "unknown WKB type code": (b"k-wkbtype", b"\x01" + struct.pack("<I", 99) + struct.pack("<dd", 1, 2), [], "bad_wkb"),
    "WKB with trailing junk": (b"k-wkbtail", POINT_WKB + b"junk", [], "bad_wkb"),
    "two WKB geometries in one value": (b"k-wkb2", POINT_WKB + POINT_WKB, [], "bad_wkb"),
    "WKB claiming 2G points": (b"k-wkb2g", b"\x01\x02\x00\x00\x00\xff\xff\xff\x7f" + b"\x00" * 32, [], "bad_wkb"),
    "WKB type word with undefined bits": (
        b"k-wkbbits",
        b"\x01" + (0x00010001).to_bytes(4, "little") + POINT_WKB[5:],
        [],
        "bad_wkb",
    ),
    "WKB part with byte order 7": (
        b"k-wkborder",
        b"\x01\x04\x00\x00\x00\x01\x00\x00\x00\x07" + POINT_WKB[1:],
        [],
        "bad_wkb",
    ),
    "EWKB SRID on a part": (
        b"k-partsrid",
        b"\x01\x04\x00\x00\x00\x01\x00\x00\x00" + ewkb(shapely.Point(1, 2), 3857),
        [],
        "bad_wkb",
    ),
    "WKB parts of mixed dimensions": (
        b"k-wkbdims",
        b"\x01\x04\x00\x00\x00\x02\x00\x00\x00" + POINT_WKB + shapely.to_wkb(shapely.Point(2.35, 48.86, 1)),
        [],
        "bad_wkb",
    ),
    "UTF-16 big-endian GeoJSON": (b"k-utf16be", feature(point()).decode().encode("utf-16-be"), [], "bad_wkb"),
    "UTF-16 little-endian GeoJSON": (b"k-utf16le", feature(point()).decode().encode("utf-16-le"), [], "malformed_json"),
    "UTF-8 byte order mark": (b"k-bom", b"\xef\xbb\xbf" + feature(point()), [], "unknown_format"),
    "raw control byte in a string": (
        b"k-ctl",
        b'{"type":"Feature","id":"a\x01b","properties":{},"geometry":' + PT + b"}",
        [],
        "malformed_json",
    ),
    "raw line break in a string": (
        b"k-lf",
        b'{"type":"Feature","id":"a\nb","properties":{},"geometry":' + PT + b"}",
        [],
        "malformed_json",
    ),
    "NUL byte in a string": (
        b"k-nul",
        b'{"type":"Feature","id":"a\x00b","properties":{},"geometry":' + PT + b"}",
        [],
        "malformed_json",
    ),
    "escaped lone surrogate": (
        b"k-surrogate",
        b'{"type":"Feature","id":"a\\ud800","properties":{},"geometry":' + PT + b"}",
        [],
        "malformed_json",
    ),
    "two JSON documents in one value": (b"k-2docs", feature(point()) + b"\n" + feature(point()), [], "malformed_json"),
    "JSON arrays 100,000 deep": (
        b"k-deeparr",
        in_feature(b'{"type":"Point","coordinates":' + deep(b"[", b"]", 100_000) + b"}"),
        [],
        "nesting_too_deep",
    ),
    "JSON objects 50,000 deep": (b"k-deepobj", deep(b'{"a":', b"}", 50_000), [], "nesting_too_deep"),
    "GeoJSON GeometryCollections 20,000 deep": (
        b"k-deepgc",
        in_feature(b'{"type":"GeometryCollection","geometries":[' * 20_000 + PT + b"]}" * 20_000),
        [],
        "nesting_too_deep",
    ),
    "Features nested in geometry 20,000 deep": (
        b"k-deepfeat",
        in_feature(b'{"type":"Feature","geometry":' * 20_000 + PT + b"}" * 20_000),
        [],
        "nesting_too_deep",
    ),
    "WKB collections 100,000 deep": (b"k-deepwkb", WKB_GC * 100_000 + POINT_WKB, [], "nesting_too_deep"),
    "WKB collections 40 deep": (b"k-deepwkb40", WKB_GC * 40 + POINT_WKB, [], "nesting_too_deep"),
    "no id and no key": (None, feature(point(), fid=None), [], "missing_required_field"),
    "string for a double": (b"k-speed", feature(point(), speed="fast"), [], "property_type_mismatch"),
    "NaN for a double": (
        b"k-nanspeed",
        b'{"type":"Feature","id":"n","properties":{"speed":NaN},"geometry":' + PT + b"}",
        [],
        "property_type_mismatch",
    ),
    "fraction for a long": (b"k-pop", feature(point(), population=1.5), [], "property_type_mismatch"),
    "number for a string": (b"k-kind", feature(point(), kind=5), [], "property_type_mismatch"),
    "properties not an object": (
        b"k-props",
        json.dumps({"type": "Feature", "id": "p", "properties": [1], "geometry": point()}).encode(),
        [],
        "property_type_mismatch",
    ),
    "boolean id": (
        b"k-boolid",
        json.dumps({"type": "Feature", "id": True, "properties": {}, "geometry": point()}).encode(),
        [],
        "property_type_mismatch",
    ),
    "infinite id": (
        b"k-infid",
        b'{"type":"Feature","id":1e999,"properties":{},"geometry":' + PT + b"}",
        [],
        "property_type_mismatch",
    ),
    "non-UTF-8 header for a string column": (
        b"k-hdr",
        shapely.to_wkb(shapely.Point(1, 2)),
        [("kind", b"\xff\xfe")],
        "property_type_mismatch",
    ),
    # Records far larger than a Kafka record's default limit (1 MiB): the dead letter must take them.
    "3 MB GeoJSON": (b"k-3mb", feature(point(), name="x" * 3_000_000), [], "message_too_large"),
    "1.5 MB key": (b"k" * 1_500_000, feature(point(), fid="big-key"), [], "message_too_large"),
    "value of exactly 1 MiB": (b"k-1mib", padded_to(MIB), [], "message_too_large"),
    "50 MB value": (b"k-50mb", padded_to(50_000_000), [], "message_too_large"),
    # Records kafka-python cannot produce (other clients do): stored beside the table, exactly.
    "tombstone without a key": (None, None, [], "null_value"),
    "rejected record with a header without a value": (b"k-nullhdr-bad", b"junk", [("trace", None)], "unknown_format"),
    # Odd but valid: these land.
    "header without a value": (b"k-nullhdr", feature(point(), fid="null-header"), [("trace", None)], None),
    # A producer's headers under the service's own names: moved aside, so each is read once, the service's.
    "forged provenance headers": (
        b"k-forged",
        b"not an event",
        [
            ("geoingest.reason", b"forged"),
            ("geoingest.source.offset", b"0"),
            ("geoingest.source.topic", b"elsewhere"),
        ],
        "unknown_format",
    ),
    "null key, id set": (None, feature(point(), fid="null-key"), [], None),
    "escaped NUL in a string": (
        b"k-escnul",
        b'{"type":"Feature","id":"esc\\u0000nul","properties":{},"geometry":' + PT + b"}",
        [],
        None,
    ),
    "pretty-printed GeoJSON": (
        b"k-pretty",
        json.dumps({"type": "Feature", "id": "pretty", "properties": {}, "geometry": point()}, indent=2).encode(),
        [],
        None,
    ),
    "big-endian EWKB in NAD83": (
        b"k-nad83",
        shapely.to_wkb(shapely.set_srid(shapely.Point(-77.0, 38.9), 4269), include_srid=True, byte_order=0),
        [],
        None,
    ),
    "WKB parts in both byte orders": (
        b"k-orders",
        b"\x01\x04\x00\x00\x00\x02\x00\x00\x00" + POINT_WKB + shapely.to_wkb(shapely.Point(2.4, 48.9), byte_order=0),
        [],
        None,
    ),
}


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None, list]]) -> int:
    """Send (key, value, headers) records of up to 64 MiB; returns how many the broker acknowledged."""
    return produce_records(bootstrap, topic, records, max_request_size=SOURCE_MAX_MESSAGE_BYTES, flush_timeout_s=120)


def java_client_only(key: bytes | None, value: bytes | None, headers: list) -> bool:
    """Records kafka-python refuses to send: neither key nor value, or a header without a value."""
    return (key is None and value is None) or any(v is None for _, v in headers)


def produce_with_spark(spark, bootstrap: str, topic: str, records: list) -> None:
    """Records kafka-python cannot send, through Spark's Kafka writer (the Java client)."""
    rows = [(k, v, [(hk, hv) for hk, hv in h]) for k, v, h in records]
    (
        spark.createDataFrame(rows, "key binary, value binary, headers array<struct<key: string, value: binary>>")
        .write.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .save()
    )


def large_record_topic(bootstrap: str, partitions: int = 3) -> str:
    """A fresh topic that takes records of up to 64 MiB."""
    name = f"geo-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics(
            [
                NewTopic(
                    name,
                    num_partitions=partitions,
                    replication_factor=1,
                    topic_configs={"max.message.bytes": str(SOURCE_MAX_MESSAGE_BYTES)},
                )
            ]
        )
    finally:
        admin.close()
    return name


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A dead letter as a consumer of the dead-letter topic reads it, the original record restored."""

    reason: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]  # the original headers, without the geoingest.* ones
    spilled: bool


def dead_letters(bootstrap: str, topic: str) -> dict[tuple[int, int], DeadLetter]:
    """The dead letters of a topic, one per source record (writes are at-least-once)."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=10_000,
        enable_auto_commit=False,
        fetch_max_bytes=64 * MIB,
        max_partition_fetch_bytes=16 * MIB,
    )
    try:
        messages = list(consumer)
    finally:
        consumer.close()
    found = {}
    for m in messages:
        names = [k for k, _ in m.headers if k.startswith(SERVICE_HEADER_PREFIX)]
        assert len(names) == len(set(names)), f"each of the service's headers once: {names}"
        added = {k: v for k, v in m.headers if k.startswith(SERVICE_HEADER_PREFIX)}
        if PAYLOAD_URI_HEADER in added:
            original = read_spilled(added[PAYLOAD_URI_HEADER].decode())
            key, value = original["key"], original["value"]
            headers = [(h["key"], h["value"]) for h in original["headers"] or ()]
            assert int(added[PAYLOAD_BYTES_HEADER]) == len(key or b"") + len(value or b"") + sum(
                len(k.encode()) + len(v or b"") for k, v in headers
            )
        else:
            key, value = m.key, m.value
            # The producer's own headers in the service's namespace, back under their names.
            headers = [
                (k.removeprefix(PRODUCER_HEADER_PREFIX), v)
                if k.startswith(PRODUCER_HEADER_PREFIX + SERVICE_HEADER_PREFIX)
                else (k, v)
                for k, v in m.headers
                if not k.startswith(SERVICE_HEADER_PREFIX)
            ]
        where = (int(added[SOURCE_PARTITION_HEADER]), int(added[SOURCE_OFFSET_HEADER]))
        found[where] = DeadLetter(
            added[REASON_HEADER].decode(), *where, key, value, headers, PAYLOAD_URI_HEADER in added
        )
    return found


def test_each_bad_record_reaches_the_dead_letter_topic_with_its_reason_and_bytes(kafka, spark, tmp_path):
    assert len(CORPUS) >= 60
    topic = large_record_topic(kafka.bootstrap)
    good = [
        (f"good-{i}".encode(), feature(point((i % 360) - 179.5, (i % 170) - 84.5), fid=f"good-{i}", speed=1.0 * i), [])
        for i in range(2000)
    ]
    tail = [
        (f"good-{i}".encode(), feature(point(i * 0.01, 5.0), fid=f"good-{i}"), [])
        for i in range(len(good), len(good) + 200)
    ]
    records, java_only = list(good), []
    for n, (kind, (key, value, headers, _)) in enumerate(CORPUS.items()):
        record = (key, value, [("corpus-kind", kind.encode()), *headers])
        if java_client_only(*record):
            java_only.append(record)
        else:
            records.insert(25 * n + 11, record)
    assert produce(kafka.bootstrap, topic, records) == len(records)
    produce_with_spark(spark, kafka.bootstrap, topic, java_only)
    assert produce(kafka.bootstrap, topic, tail) == len(tail)
    records += java_only + tail
    good += tail

    settings = local_settings(
        kafka,
        topic,
        tmp_path,
        max_message_bytes=MAX_MESSAGE_BYTES,
        max_vertices=MAX_VERTICES,
        max_offsets_per_trigger=700,  # several batches, each with bad records in it
    )
    create_table(open_catalog(settings.catalog_name, settings.catalog), CONTRACT)
    totals = run(settings, CONTRACT, until_idle=True, spark=spark)
    assert totals.batches >= 3 and totals.commits == {"committed": totals.batches}, "the job never stopped"

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(CONTRACT.table)
    ids = table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()
    landing = {kind for kind, (*_, reason) in CORPUS.items() if reason is None}
    assert len(ids) == len(good) + len(landing)
    assert {f"good-{i}" for i in range(len(good))} <= set(ids)

    dead = dead_letters(kafka.bootstrap, settings.dead_letter_topic)
    by_kind = {dict(d.headers)["corpus-kind"].decode(): d for d in dead.values()}
    assert len(by_kind) == len(dead), "one dead letter per bad record"
    assert {kind: d.reason for kind, d in by_kind.items()} == {
        kind: reason for kind, (*_, reason) in CORPUS.items() if reason is not None
    }
    for kind, letter in by_kind.items():
        key, value, headers, _ = CORPUS[kind]
        assert (letter.key, letter.value) == (key, value), f"{kind}: the original bytes"
        assert letter.headers == [("corpus-kind", kind.encode()), *headers], f"{kind}: the original headers"
    # Over dead_letter_max_record_bytes (8 MiB), or not writable as it was by kafka-python, the record
    # is stored beside the table; the rest inline.
    assert {kind for kind, d in by_kind.items() if d.spilled} == {
        "50 MB value",
        "tombstone without a key",
        "rejected record with a header without a value",
    }
    assert len(ids) + len(dead) == len(records) == totals.consumed

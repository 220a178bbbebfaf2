"""Avro in the Confluent wire format: the columnar reader against fastavro's encoder, and the format
through the decoder (schemas put in the format's cache by id, as the registry would hand them over;
tests/app/local/test_schema_registry.py runs the same through a real registry)."""

from __future__ import annotations

import io
import json
import struct

import fastavro
import numpy as np
import pyarrow as pa
import pytest
import shapely

from streaming.contract import ContractError, parse_contract
from streaming.decode.decoder import REJECT_DETAIL, REJECT_REASON, Decoder
from streaming.decode.formats.avro import AvroFormat, RecordReader
from streaming.decode.formats.avro_schema import (
    BeyondColumnar,
    GeneralPlan,
    UnsupportedSchema,
    compile_avro,
    compile_schema,
)
from streaming.decode.rejects import Reason
from streaming.kernels.buffers import offsets_and_bytes
from tests.streaming.decode.test_decoder import kafka_batch

# Reasons only registry-encoded records have; each has a test here or in tests/app/local/test_schema_registry.py.
REGISTRY_REASONS = {
    Reason.BAD_WIRE_FORMAT,
    Reason.UNKNOWN_SCHEMA_ID,
    Reason.SCHEMA_NOT_SUPPORTED,
    Reason.SCHEMA_MISMATCH,
}

POINT_SCHEMA = {
    "type": "record",
    "name": "Position",
    "namespace": "geo",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "lon", "type": "double"},
        {"name": "lat", "type": "double"},
        {"name": "speed", "type": ["null", "float"], "default": None},
        {"name": "count", "type": "long"},
        {"name": "small", "type": "int"},
        {"name": "ok", "type": "boolean"},
        {"name": "blob", "type": "bytes"},
        {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["IDLE", "MOVING"]}},
        {"name": "tag", "type": {"type": "fixed", "name": "Tag", "size": 3}},
        {"name": "seen", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "meta",
            "type": ["null", {"type": "record", "name": "Meta", "fields": [{"name": "source", "type": "string"}]}],
            "default": None,
        },
    ],
}


def record(i: int, **over) -> dict:
    r = {
        "id": f"ev-{i}-é",
        "lon": 13.4 + i * 1e-7,
        "lat": 52.5 - i * 1e-7,
        "speed": None if i % 3 == 0 else float(i) / 2,
        "count": (-1) ** i * (i * 1_000_003) ** 2,
        "small": -i,
        "ok": i % 2 == 0,
        "blob": bytes(range(i % 7)),
        "state": "MOVING" if i % 2 else "IDLE",
        "tag": b"abc",
        "seen": 1_700_000_000_000 + i,
        "meta": None if i % 2 else {"source": f"s{i}"},
    }
    r.update(over)
    return r


def avro_bytes(schema: dict, rec: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), rec)
    return out.getvalue()


def wire(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + body


def read(schema: dict, bodies: list[bytes]) -> RecordReader:
    plan = compile_schema(7, json.dumps(schema))
    values = pa.array(bodies, pa.binary())
    offsets, data = offsets_and_bytes(values)
    offsets = offsets.astype(np.int64)
    reader = RecordReader(plan, data, offsets[:-1], offsets[1:])
    reader.read()
    return reader


def test_every_supported_type_reads_as_fastavro_wrote_it():
    records = [record(i) for i in range(300)]
    reader = read(POINT_SCHEMA, [avro_bytes(POINT_SCHEMA, r) for r in records])
    assert not reader.bad.any()
    for name in ("id", "lon", "lat", "speed", "count", "small", "ok", "blob", "state", "tag"):
        assert reader.arrow(name).to_pylist() == [r[name] for r in records], name
    # Doubles lose nothing: the same 64 bits come back.
    assert reader.arrow("lon").to_numpy().tobytes() == np.array([r["lon"] for r in records]).tobytes()
    seen = reader.arrow("seen")
    assert seen.type == pa.timestamp("ms", tz="UTC")
    assert seen.cast(pa.int64()).to_pylist() == [r["seen"] for r in records]
    assert reader.arrow("meta.source").to_pylist() == [
        None if r["meta"] is None else r["meta"]["source"] for r in records
    ]


def test_long_varints_and_extremes():
    schema = {"type": "record", "name": "R", "fields": [{"name": "v", "type": "long"}, {"name": "s", "type": "string"}]}
    values = [0, -1, 1, 63, -64, 64, 2**31, -(2**31) - 1, 2**62, 2**63 - 1, -(2**63)]
    records = [{"v": v, "s": "x" * (v % 300 if v >= 0 else 200)} for v in values]
    reader = read(schema, [avro_bytes(schema, r) for r in records])
    assert not reader.bad.any()
    assert reader.arrow("v").to_pylist() == values
    assert reader.arrow("s").to_pylist() == [r["s"] for r in records]


@pytest.mark.parametrize(
    "body, fault",
    [
        (lambda b: b[:4], "field 'a': the record ends inside its 8 bytes"),
        (lambda b: b + b"\x00", "1 bytes after the record's last field"),
        (lambda b: b[:-1], "field 's': a length of [21] bytes runs past the record's end"),
        (lambda b: b[:8] + b"\x80", "field 's': the record ends inside a variable-length integer"),
    ],
)
def test_a_record_that_does_not_match_its_schema_is_flagged_alone(body, fault):
    schema = {
        "type": "record",
        "name": "R",
        "fields": [{"name": "a", "type": "double"}, {"name": "s", "type": "string"}],
    }
    good = [avro_bytes(schema, {"a": 1.5, "s": "hello world, a string"}) for _ in range(3)]
    bodies = [good[0], body(good[1]), good[2]]
    reader = read(schema, bodies)
    assert reader.bad.tolist() == [False, True, False]
    assert fault in reader.detail[1]
    assert reader.arrow("s").to_pylist() == ["hello world, a string", None, "hello world, a string"]


def test_union_branch_and_enum_out_of_range_and_bad_utf8():
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "o", "type": ["null", "long"]},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}},
            {"name": "s", "type": "string"},
        ],
    }
    ok = avro_bytes(schema, {"o": 5, "e": "A", "s": "é"})
    bad_branch = b"\x04" + ok[2:]  # branch 2 of 2
    bad_enum = ok[:2] + b"\x02" + ok[3:]  # symbol 1 of 1
    bad_utf8 = ok[:3] + b"\x04\xc3\x28"  # 2 bytes, not UTF-8
    reader = read(schema, [ok, bad_branch, bad_enum, bad_utf8])
    strings = reader.arrow("s")
    assert reader.bad.tolist() == [False, True, True, True]
    assert "union branch" in reader.detail[1]
    assert "enum index" in reader.detail[2]
    assert "not UTF-8" in reader.detail[3]
    assert strings.to_pylist()[0] == "é"


def test_arrays_maps_and_wide_unions_go_to_the_general_reader_or_are_an_envelopes_leaves():
    for field_type in (
        {"type": "array", "items": "long"},
        {"type": "map", "values": "long"},
        ["null", "long", "string"],
    ):
        schema = {"type": "record", "name": "R", "fields": [{"name": "x", "type": field_type}]}
        with pytest.raises(BeyondColumnar):
            compile_schema(1, json.dumps(schema))
        assert isinstance(compile_avro(1, json.dumps(schema), (), {"x": pa.int64()}), GeneralPlan)
        # The Debezium format's reading of its envelopes: the columnar reader, the field a leaf read whole.
        envelope = compile_avro(1, json.dumps(schema), (), {"x": pa.int64()}, general=False)
        assert not isinstance(envelope, GeneralPlan) and envelope.leaves["x"].kind == "nested"
    # A logical type the columnar reader reads as its underlying type: general when a column reads it.
    dated = {"type": "record", "name": "R", "fields": [{"name": "x", "type": {"type": "int", "logicalType": "date"}}]}
    assert not isinstance(compile_avro(1, json.dumps(dated), (), {}), GeneralPlan)
    assert isinstance(compile_avro(1, json.dumps(dated), (), {"x": pa.date32()}), GeneralPlan)
    # A contract that reads its day number into a long column keeps it (and the columnar reader).
    assert not isinstance(compile_avro(1, json.dumps(dated), (), {"x": pa.int64()}), GeneralPlan)
    with pytest.raises(UnsupportedSchema, match="not a record"):
        compile_avro(1, '"long"', (), {})


# -- through the decoder ---------------------------------------------------------------------------
def contract(registry: dict, extra_columns: list[dict] | None = None) -> dict:
    return {
        "table": "t.avro",
        "formats": ["avro"],
        "registry": registry,
        "columns": [
            {"id": 1, "name": "event_id", "type": "string", "required": True, "from": ["properties.id"]},
            {"id": 2, "name": "speed", "type": "double", "from": ["properties.speed"]},
            {"id": 3, "name": "seen", "type": "timestamptz", "from": ["properties.seen"]},
            *(extra_columns or []),
        ],
        "geometry": {
            "id": 4 + len(extra_columns or []),
            "name": "geometry",
            "types": ["Point", "LineString", "Polygon"],
            "dimensions": ["XY"],
            "crs": "EPSG:4326",
        },
        "bbox": {"id": 5 + len(extra_columns or []), "name": "bbox"},
    }


def decoder_with(contract_json: dict, schemas: dict[int, dict]) -> Decoder:
    decoder = Decoder(parse_contract(contract_json))
    (fmt,) = decoder._formats
    assert isinstance(fmt, AvroFormat)
    for schema_id, schema in schemas.items():
        fmt._plans[schema_id] = compile_schema(schema_id, json.dumps(schema))
    return decoder


def test_points_from_lon_lat_fields_keep_their_coordinates_exactly():
    decoder = decoder_with(contract({"lon_field": "lon", "lat_field": "lat"}), {3: POINT_SCHEMA})
    records = [record(i) for i in range(50)]
    out = decoder.decode(kafka_batch([wire(3, avro_bytes(POINT_SCHEMA, r)) for r in records]))
    assert out.column(REJECT_REASON).null_count == 50
    geoms = shapely.from_wkb(out.column("geometry").to_numpy(zero_copy_only=False))
    assert shapely.get_x(geoms).tolist() == [r["lon"] for r in records]
    assert shapely.get_y(geoms).tolist() == [r["lat"] for r in records]
    assert out.column("event_id").to_pylist() == [r["id"] for r in records]
    assert out.column("speed").to_pylist() == [r["speed"] for r in records]
    assert out.column("seen").cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist() == [
        r["seen"] for r in records
    ]


def test_geometry_from_wkb_or_wkt_field_and_rejects_with_reasons():
    wkb_schema = {
        "type": "record",
        "name": "Shape",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "geom", "type": ["null", "bytes"]},
        ],
    }
    wkt_schema = {
        "type": "record",
        "name": "ShapeText",
        "fields": [{"name": "id", "type": "string"}, {"name": "geom", "type": "string"}],
    }
    decoder = decoder_with(contract({"geometry_field": "geom"}), {1: wkb_schema, 2: wkt_schema})
    line = shapely.LineString([(0, 0), (1, 1)])
    values = [
        wire(1, avro_bytes(wkb_schema, {"id": "a", "geom": shapely.to_wkb(line)})),
        wire(2, avro_bytes(wkt_schema, {"id": "b", "geom": "POLYGON ((0 0, 1 0, 1 1, 0 0))"})),
        wire(1, avro_bytes(wkb_schema, {"id": "c", "geom": None})),
        wire(2, avro_bytes(wkt_schema, {"id": "d", "geom": "POLYGON ((0 0"})),
        wire(1, avro_bytes(wkb_schema, {"id": "e", "geom": b"\x01\x02"})),
        wire(2, avro_bytes(wkt_schema, {"id": "f", "geom": "POINT (1 2)"})[:-3]),
        b"\x00\x00\x01",
    ]
    out = decoder.decode(kafka_batch(values))
    assert out.column(REJECT_REASON).to_pylist() == [
        None,
        None,
        "missing_geometry",
        "bad_wkt",
        "bad_wkb",
        "schema_mismatch",
        "bad_wire_format",
    ]
    assert "schema (id 2)" in out.column(REJECT_DETAIL)[5].as_py()
    assert shapely.from_wkb(out.column("geometry")[0].as_py()).equals(line)
    assert out.column("event_id").to_pylist()[:2] == ["a", "b"]


def test_contract_keeps_registry_topics_apart_from_wkb():
    with pytest.raises(ContractError, match="big-endian WKB"):
        parse_contract({**contract({"geometry_field": "g"}), "formats": ["avro", "wkb"]})
    with pytest.raises(ContractError, match="registry: missing"):
        parse_contract({k: v for k, v in contract({"geometry_field": "g"}).items() if k != "registry"})
    with pytest.raises(ContractError, match="either geometry_field"):
        parse_contract(contract({"geometry_field": "g", "lon_field": "x", "lat_field": "y"}))


def test_an_srid_field_or_an_ewkb_srid_is_honoured_and_reprojected():
    mercator = {
        "type": "record",
        "name": "M",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "x", "type": "double"},
            {"name": "y", "type": "double"},
            {"name": "epsg", "type": ["null", "int"]},
        ],
    }
    ewkb = {"type": "record", "name": "E", "fields": [{"name": "id", "type": "string"}, {"name": "g", "type": "bytes"}]}
    paris_3857 = (261_600.0, 6_250_000.0)
    by_fields = decoder_with(contract({"lon_field": "x", "lat_field": "y", "srid_field": "epsg"}), {1: mercator})
    out = by_fields.decode(
        kafka_batch(
            [
                wire(1, avro_bytes(mercator, {"id": "m", "x": paris_3857[0], "y": paris_3857[1], "epsg": 3857})),
                wire(1, avro_bytes(mercator, {"id": "d", "x": 2.35, "y": 48.86, "epsg": None})),  # the table's CRS
            ]
        )
    )
    assert out.column(REJECT_REASON).to_pylist() == [None, None]
    reprojected, as_sent = shapely.from_wkb(out.column("geometry").to_numpy(zero_copy_only=False))
    assert reprojected.x == pytest.approx(2.35, abs=0.01) and reprojected.y == pytest.approx(48.86, abs=0.05)
    assert (as_sent.x, as_sent.y) == (2.35, 48.86)

    by_ewkb = decoder_with(contract({"geometry_field": "g"}), {2: ewkb})
    point = shapely.set_srid(shapely.Point(*paris_3857), 3857)
    out = by_ewkb.decode(
        kafka_batch([wire(2, avro_bytes(ewkb, {"id": "e", "g": shapely.to_wkb(point, include_srid=True)}))])
    )
    assert out.column(REJECT_REASON).to_pylist() == [None]
    stored = shapely.from_wkb(out.column("geometry")[0].as_py())
    assert stored.x == pytest.approx(2.35, abs=0.01) and stored.y == pytest.approx(48.86, abs=0.05)

"""Protobuf in the Confluent wire format: the columnar reader against the protobuf runtime's own
encoder, and the format through the decoder (schemas put in the format's cache by id;
tests/app/local/test_schema_registry.py reads one through a real registry)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import shapely
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from streaming.contract import ContractError, parse_contract
from streaming.decode.decoder import REJECT_DETAIL, REJECT_REASON, Decoder
from streaming.decode.formats.avro_schema import UnsupportedSchema
from streaming.decode.formats.protobuf import (
    GeneralProtoPlan,
    ProtobufFormat,
    ProtoReader,
    compile_proto,
    general_proto_plan,
)
from streaming.kernels.buffers import offsets_and_bytes
from tests.streaming.decode.formats.test_avro import contract, wire
from tests.streaming.decode.test_decoder import kafka_batch

PING_PROTO = """
syntax = "proto3";
package geo;

// A position of a device.
message Ping {
  enum Kind { IDLE = 0; MOVING = 1; }
  string id = 1;
  double lon = 2;
  double lat = 3;
  optional double speed = 4;  /* null when not sent */
  sint64 delta = 5;
  int32 small = 6;
  bool ok = 7;
  bytes blob = 8;
  Kind kind = 9;
  fixed32 f32 = 10;
  sfixed64 s64 = 11;
  float ratio = 12;
  oneof label { string note = 13; }
}
"""


def ping_class(extra_field: bool = False):
    """The same message, described to the protobuf runtime (which reads no .proto text)."""
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name=f"ping{extra_field}.proto", package="geo", syntax="proto3")
    m = fdp.message_type.add(name="Ping")
    kind = m.enum_type.add(name="Kind")
    kind.value.add(name="IDLE", number=0)
    kind.value.add(name="MOVING", number=1)
    m.oneof_decl.add(name="label")
    m.oneof_decl.add(name="_speed")  # proto3 optional: a synthetic oneof, after the real ones

    def add(name: str, number: int, kind: int, **more) -> None:
        m.field.add(name=name, number=number, type=kind, label=F.LABEL_OPTIONAL, **more)

    add("id", 1, F.TYPE_STRING)
    add("lon", 2, F.TYPE_DOUBLE)
    add("lat", 3, F.TYPE_DOUBLE)
    add("speed", 4, F.TYPE_DOUBLE, proto3_optional=True, oneof_index=1)
    add("delta", 5, F.TYPE_SINT64)
    add("small", 6, F.TYPE_INT32)
    add("ok", 7, F.TYPE_BOOL)
    add("blob", 8, F.TYPE_BYTES)
    add("kind", 9, F.TYPE_ENUM, type_name=".geo.Ping.Kind")
    add("f32", 10, F.TYPE_FIXED32)
    add("s64", 11, F.TYPE_SFIXED64)
    add("ratio", 12, F.TYPE_FLOAT)
    add("note", 13, F.TYPE_STRING, oneof_index=0)
    if extra_field:
        add("unknown_to_reader", 20, F.TYPE_STRING)
        add("unknown_number", 21, F.TYPE_INT64)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("geo.Ping"))


Ping = ping_class()


def message(i: int) -> dict:
    m = {
        "id": f"p-{i}-é",
        "lon": 13.4 + i * 1e-7,
        "lat": 52.5 - i * 1e-7,
        "delta": (-1) ** i * i * 1_000_003,
        "small": -i,
        "ok": i % 2 == 0,
        "blob": bytes(range(i % 5)),
        "kind": i % 2,
        "f32": 4_000_000_000 - i,
        "s64": -(2**62) + i,
        "ratio": 0.5 + i,
    }
    if i % 3:
        m["speed"] = i / 4
    if i % 4 == 0:
        m["note"] = f"n{i}"
    return m


def read(bodies: list[bytes]) -> ProtoReader:
    plan = compile_proto(9, PING_PROTO)
    values = pa.array(bodies, pa.binary())
    offsets, data = offsets_and_bytes(values)
    offsets = offsets.astype(np.int64)
    reader = ProtoReader(plan, data, offsets[:-1], offsets[1:])
    reader.read()
    return reader


def indexed(body: bytes) -> bytes:
    return b"\x00" + body  # the message indexes: the first message


def test_every_scalar_reads_as_the_protobuf_runtime_wrote_it():
    messages = [message(i) for i in range(200)]
    reader = read([indexed(Ping(**m).SerializeToString()) for m in messages])
    assert not reader.bad.any(), reader.detail[reader.bad][:3]
    for name in ("id", "lon", "lat", "delta", "small", "ok", "blob", "kind", "f32", "s64"):
        assert reader.arrow(name).to_pylist() == [m[name] for m in messages], name
    assert reader.arrow("ratio").to_pylist() == [np.float32(m["ratio"]) for m in messages]
    # Presence: optional and oneof fields are null when absent; plain fields take their default.
    assert reader.arrow("speed").to_pylist() == [m.get("speed") for m in messages]
    assert reader.arrow("note").to_pylist() == [m.get("note") for m in messages]
    empty = read([indexed(b"")])
    assert (empty.arrow("id")[0].as_py(), empty.arrow("lon")[0].as_py(), empty.arrow("speed")[0].as_py()) == (
        "",
        0.0,
        None,
    )


def test_fields_in_any_order_last_wins_and_unknown_fields_are_skipped():
    later = Ping(id="second", lon=2.0).SerializeToString()
    first = Ping(id="first", lat=1.0).SerializeToString()
    extra = ping_class(extra_field=True)(id="x", unknown_to_reader="skip me", unknown_number=-5, lon=3.0)
    reader = read([indexed(later + first), indexed(extra.SerializeToString())])
    assert not reader.bad.any()
    assert reader.arrow("id").to_pylist() == ["first", "x"]
    assert reader.arrow("lon").to_pylist() == [2.0, 3.0]
    assert reader.arrow("lat").to_pylist() == [1.0, 0.0]


def test_a_message_that_does_not_match_its_schema_is_flagged_alone():
    good = indexed(Ping(id="ok", lon=1.0, lat=2.0).SerializeToString())
    wrong_wire = indexed(b"\x10\x05")  # field 2 (lon, a double) as a varint
    truncated = indexed(Ping(id="a long enough id", lon=1.0).SerializeToString()[:-3])
    other_message = b"\x02\x02" + Ping(id="x").SerializeToString()  # message index [1]
    reader = read([good, wrong_wire, truncated, other_message, good])
    assert reader.bad.tolist() == [False, True, True, True, False]
    assert "field 'lon': wire type 0" in reader.detail[1]
    assert "the record ends inside" in reader.detail[2] or "runs past" in reader.detail[2]
    assert "other than the schema's first" in reader.detail[3]


def test_repeated_maps_and_message_fields_go_to_the_general_reader():
    for field in ("repeated int64 xs = 1;", "map<string, int64> m = 1;", "Other o = 1;"):
        text = f'syntax = "proto3"; message M {{ {field} }} message Other {{ int64 a = 1; }}'
        with pytest.raises(UnsupportedSchema):
            compile_proto(1, text)
        assert isinstance(general_proto_plan(1, text), GeneralProtoPlan)


def test_protobuf_through_the_decoder_with_geometry_from_lon_lat_or_wkb():
    decoder = Decoder(parse_contract({**contract({"lon_field": "lon", "lat_field": "lat"}), "formats": ["protobuf"]}))
    (fmt,) = decoder._formats
    assert isinstance(fmt, ProtobufFormat)
    fmt._plans[9] = compile_proto(9, PING_PROTO)
    values = [
        wire(9, indexed(Ping(id="a", lon=2.35, lat=48.86, speed=3.5).SerializeToString())),
        wire(9, indexed(Ping(id="b", lon=13.4, lat=52.5).SerializeToString())),
        wire(9, b"\x00\x12\x05ab"),  # field 2 as a length-delimited value
    ]
    out = decoder.decode(kafka_batch(values))
    assert out.column(REJECT_REASON).to_pylist() == [None, None, "schema_mismatch"]
    assert "field 'lon'" in out.column(REJECT_DETAIL)[2].as_py()
    points = shapely.from_wkb(out.column("geometry").to_numpy(zero_copy_only=False)[:2])
    assert [(p.x, p.y) for p in points] == [(2.35, 48.86), (13.4, 52.5)]
    assert out.column("event_id").to_pylist()[:2] == ["a", "b"]
    assert out.column("speed").to_pylist()[:2] == [3.5, None]


def test_one_registry_format_per_topic():
    with pytest.raises(ContractError, match="holds one of them"):
        parse_contract({**contract({"geometry_field": "g"}), "formats": ["avro", "protobuf"]})

"""Protobuf schemas the flat reader does not read (nested messages, repeated fields, maps, the
well-known types, enums read as names) through the decoder: the nested reader, or for an enum read
as a number the general reader (the protobuf runtime, with the message classes built from the
registry's .proto text), fills the contract's nested and typed columns; a value that does not fit
its column is rejected naming its nested path. tests/streaming/decode/formats/
test_protobuf_nested_reader.py holds the nested reader to the runtime, record for record."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, message_factory

from streaming.contract import parse_contract
from streaming.decode.decoder import REJECT_DETAIL, REJECT_REASON, Decoder
from streaming.decode.formats.avro_schema import UnsupportedSchema
from streaming.decode.formats.proto_text import parse_proto
from streaming.decode.formats.protobuf import GeneralProtoPlan, ProtobufFormat, ProtoPlan, general_proto_plan
from streaming.decode.schema_registry import RegisteredSchema
from tests.streaming.decode.formats.test_avro import contract, wire
from tests.streaming.decode.formats.test_protobuf import PING_PROTO, Ping
from tests.streaming.decode.test_decoder import kafka_batch

UTC = datetime.UTC
EVENT_PROTO = """
syntax = "proto3";
package fleet;

import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";

message Event {
  message Position {
    double lon = 1;
    double lat = 2;
    optional double altitude = 3;
  }
  enum State { STATE_UNKNOWN = 0; IDLE = 1; MOVING = 2; }
  string id = 1;
  Position position = 2;
  repeated Reading readings = 3;
  map<string, int64> counters = 4;
  State state = 5;
  oneof label {
    string note = 6;
    int64 code = 7;
  }
  google.protobuf.Timestamp seen = 8;
  google.protobuf.Duration took = 9;
  google.protobuf.Int64Value odometer = 10;
  google.protobuf.StringValue driver = 11;
  repeated string tags = 12 [packed = false];
}

// A reading of one sensor.
message Reading {
  string sensor = 1;
  double value = 2;
}
"""
PLAN = general_proto_plan(21, EVENT_PROTO)
Event = message_factory.GetMessageClass(PLAN.messages[0])
READING_COLUMN = {
    "type": "struct",
    "fields": [{"name": "sensor", "type": "string", "required": True}, {"name": "value", "type": "double"}],
}

# (the field, the contract's column type, the message's fields, what the column holds)
KINDS: dict[str, tuple[str, Any, dict, Any]] = {
    "nested message": (
        "position",
        {"type": "struct", "fields": [{"name": "lon", "type": "double"}, {"name": "altitude", "type": "double"}]},
        {"position": {"lon": 13.4, "lat": 52.5}},
        {"lon": 13.4, "altitude": None},
    ),
    "repeated messages": (
        "readings",
        {"type": "list", "element": READING_COLUMN},
        {"readings": [{"sensor": "t1", "value": 1.5}, {"sensor": "t2", "value": -3.0}]},
        [{"sensor": "t1", "value": 1.5}, {"sensor": "t2", "value": -3.0}],
    ),
    "repeated strings": ("tags", {"type": "list", "element": "string"}, {"tags": ["a", "b"]}, ["a", "b"]),
    "map": (
        "counters",
        {"type": "map", "key": "string", "value": "long"},
        {"counters": {"a": 1, "b": -(2**40)}},
        [("a", 1), ("b", -(2**40))],
    ),
    "enum as its name": ("state", "string", {"state": 2}, "MOVING"),
    "enum as its number": ("state", "int", {"state": 2}, 2),
    "oneof member set": ("note", "string", {"note": "hello"}, "hello"),
    "oneof member not set": ("code", "long", {"note": "hello"}, None),
    "Timestamp": (
        "seen",
        "timestamptz",
        {"seen": {"seconds": 1_700_000_000, "nanos": 123_456_789}},
        datetime.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC),
    ),
    "Duration": ("took", "long", {"took": {"seconds": -2, "nanos": -500_000}}, -2_000_500),
    "Int64Value": ("odometer", "long", {"odometer": {"value": 0}}, 0),
    "Int64Value absent": ("odometer", "long", {}, None),
    "StringValue": ("driver", "string", {"driver": {"value": "ana"}}, "ana"),
}


def decoder_for(column_type: Any, source: str) -> Decoder:
    raw = {
        **contract(
            {"lon_field": "position.lon", "lat_field": "position.lat"},
            [{"id": 4, "name": "x", "type": column_type, "from": [f"properties.{source}"]}],
        ),
        "formats": ["protobuf"],
    }
    decoder = Decoder(parse_contract(raw))
    (fmt,) = decoder._formats
    assert isinstance(fmt, ProtobufFormat)
    fmt._plans[21] = fmt.compile(RegisteredSchema(21, "PROTOBUF", EVENT_PROTO))
    return decoder


def event_bytes(i: int, fields: dict) -> bytes:
    message = Event(id=f"e{i}", **fields)
    if "position" not in fields:
        message.position.lon, message.position.lat = 1.0, 2.0
    return wire(21, b"\x00" + message.SerializeToString())


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_protobuf_kind_fills_its_typed_column(kind):
    source, column_type, fields, held = KINDS[kind]
    decoder = decoder_for(column_type, source)
    out = decoder.decode(kafka_batch([event_bytes(0, fields), event_bytes(1, fields)]))
    assert out.column(REJECT_REASON).to_pylist() == [None, None], out.column(REJECT_DETAIL).to_pylist()
    assert out.column("event_id").to_pylist() == ["e0", "e1"]
    assert out.column("x").to_pylist() == [held, held]


def test_a_value_that_does_not_fit_is_rejected_naming_its_nested_path():
    strict = {"type": "list", "element": {"type": "struct", "fields": [{"name": "value", "type": "int"}]}}
    decoder = decoder_for(strict, "readings")
    fine = {"readings": [{"sensor": "a", "value": 2.0}]}
    wrong = {"readings": [{"sensor": "a", "value": 2.0}, {"sensor": "b", "value": 0.5}]}
    out = decoder.decode(kafka_batch([event_bytes(0, fine), event_bytes(1, wrong)]))
    assert out.column(REJECT_REASON).to_pylist() == [None, "property_type_mismatch"]
    assert out.column(REJECT_DETAIL)[1].as_py() == "properties.readings[1].value: expected int, got 0.5"


def test_a_message_that_does_not_match_its_schema_and_other_messages_of_the_file():
    decoder = decoder_for({"type": "struct", "fields": [{"name": "lon", "type": "double"}]}, "position")
    reading = message_factory.GetMessageClass(PLAN.messages[1])(sensor="s", value=1.0)
    values = [
        event_bytes(0, {}),
        wire(21, b"\x00" + b"\x12\x05ab"),  # position's length runs past the end
        wire(21, b"\x02\x02" + reading.SerializeToString()),  # message indexes [1]: a Reading
    ]
    out = decoder.decode(kafka_batch(values))
    reasons = out.column(REJECT_REASON).to_pylist()
    assert reasons[0] is None and reasons[1] == "schema_mismatch"
    assert reasons[2] == "missing_geometry"  # read as a Reading, which has no position


def test_flat_schemas_keep_the_columnar_reader():
    flat = decoder_for("long", "delta")
    (fmt,) = flat._formats
    registered = RegisteredSchema(9, "PROTOBUF", PING_PROTO)
    assert isinstance(fmt.compile(registered), ProtoPlan)
    # The columnar reader reads enums as their numbers: a string column of one takes the general reader.
    assert isinstance(decoder_for("string", "kind")._formats[0].compile(registered), GeneralProtoPlan)
    assert isinstance(decoder_for("long", "kind")._formats[0].compile(registered), ProtoPlan)
    # A file of several messages: the records may name any of them.
    two = RegisteredSchema(9, "PROTOBUF", PING_PROTO + "message Other { int64 a = 1; }")
    assert isinstance(fmt.compile(two), GeneralProtoPlan)


def test_the_proto_text_reads_as_protoc_would_describe_it():
    parsed = parse_proto(PING_PROTO)
    built = descriptor_pb2.DescriptorProto()
    Ping.DESCRIPTOR.CopyToProto(built)
    (message,) = parsed.message_type
    assert [(f.name, f.number, f.label, f.proto3_optional, f.oneof_index) for f in message.field] == [
        (f.name, f.number, f.label, f.proto3_optional, f.oneof_index) for f in built.field
    ]
    assert [o.name for o in message.oneof_decl] == [o.name for o in built.oneof_decl]
    assert [e.name for e in message.enum_type[0].value] == ["IDLE", "MOVING"]


POSITION_PROTO = 'syntax = "proto3"; package geo; message Position { double lon = 1; double lat = 2; }'
UNITS_PROTO = 'syntax = "proto3"; package geo; enum Unit { UNIT_UNSPECIFIED = 0; KM = 1; }'
TRIP_PROTO = """
syntax = "proto3";
package fleet;
import "geo/position.proto";
import "geo/units.proto";
import "google/protobuf/timestamp.proto";
message Trip { string id = 1; geo.Position position = 2; geo.Unit unit = 3; google.protobuf.Timestamp at = 4; }
"""


def test_a_schema_that_imports_files_held_as_its_schema_references_is_read_with_them():
    raw = {
        **contract(
            {"lon_field": "position.lon", "lat_field": "position.lat"},
            [{"id": 4, "name": "unit", "type": "string", "from": ["properties.unit"]}],
        ),
        "formats": ["protobuf"],
    }
    decoder = Decoder(parse_contract(raw))
    (fmt,) = decoder._formats
    # As the registry client gives them: the imported files first, each named by its import path.
    registered = RegisteredSchema(
        31, "PROTOBUF", TRIP_PROTO, (UNITS_PROTO, POSITION_PROTO), ("geo/units.proto", "geo/position.proto")
    )
    plan = fmt.learn(registered)
    trip = message_factory.GetMessageClass(plan.messages[0])(id="t1", unit=1)
    trip.position.lon, trip.position.lat = 13.4, 52.5
    [row] = decoder.decode(kafka_batch([wire(31, b"\x00" + trip.SerializeToString())])).to_pylist()
    assert (row[REJECT_REASON], row["unit"], row["event_id"]) == (None, "KM", "t1")
    # An import no reference names (or one named otherwise) is no schema the runtime builds.
    for names in (("geo/units.proto", "position.proto"), ()):
        with pytest.raises(UnsupportedSchema, match="geo/position.proto"):
            general_proto_plan(32, TRIP_PROTO, list(zip(names, (UNITS_PROTO, POSITION_PROTO), strict=False)))


def test_schemas_the_runtime_cannot_build_are_not_supported():
    with pytest.raises(UnsupportedSchema, match="imports"):
        general_proto_plan(1, 'syntax = "proto3"; import "other.proto"; message M { other.T t = 1; }')
    with pytest.raises(UnsupportedSchema, match="not a .proto"):
        general_proto_plan(1, 'syntax = "proto3"; message M { Missing m = 1; }')


def test_two_versions_of_a_message_each_read_with_their_own_fields():
    v1 = 'syntax = "proto3"; message M { message P { double lon = 1; double lat = 2; } P position = 1; string id = 3; }'
    v2 = v1.replace("P position = 1;", "P position = 1; repeated string tags = 2;")
    raw = {
        **contract(
            {"lon_field": "position.lon", "lat_field": "position.lat"},
            [{"id": 4, "name": "tags", "type": {"type": "list", "element": "string"}, "from": ["properties.tags"]}],
        ),
        "formats": ["protobuf"],
    }
    decoder = Decoder(parse_contract(raw))
    (fmt,) = decoder._formats
    classes = {}
    for schema_id, text in ((1, v1), (2, v2)):
        fmt._plans[schema_id] = fmt.compile(RegisteredSchema(schema_id, "PROTOBUF", text))
        classes[schema_id] = message_factory.GetMessageClass(fmt._plans[schema_id].messages[0])
    old, new = classes[1](id="old"), classes[2](id="new", tags=["a", "b"])
    for m in (old, new):
        m.position.lon, m.position.lat = 1.0, 2.0
    out = decoder.decode(
        kafka_batch([wire(1, b"\x00" + old.SerializeToString()), wire(2, b"\x00" + new.SerializeToString())])
    )
    assert out.column(REJECT_REASON).to_pylist() == [None, None]
    assert out.column("tags").to_pylist() == [None, ["a", "b"]]


def test_schema_evolution_types_a_messages_nested_repeated_and_map_fields_as_the_general_reader_fills_them():
    from streaming.decode.formats.protobuf import proto_field_kinds
    from streaming.decode.properties import NESTED, spelling_of

    tree = general_proto_plan(
        22,
        """
syntax = "proto3";
import "google/protobuf/any.proto";
import "google/protobuf/timestamp.proto";
message Node { string name = 1; repeated Node children = 2; }
message Holder { Node root = 1; google.protobuf.Any extra = 2; repeated google.protobuf.Timestamp at = 3; }
""",
    )
    position = {
        "type": "struct",
        "fields": [
            {"name": "lon", "type": "double"},
            {"name": "lat", "type": "double"},
            {"name": "altitude", "type": "double"},
        ],
    }
    reading = {"type": "struct", "fields": [{"name": "sensor", "type": "string"}, {"name": "value", "type": "double"}]}
    kinds = {name: spelling_of(kind) for name, kind in proto_field_kinds(PLAN.messages[0]).items()}
    # Scalars, well-known types and wrappers are the flat leaves' (not listed here).
    assert kinds == {
        "position": position,
        "readings": {"type": "list", "element": reading},
        "counters": {"type": "map", "key": "string", "value": "long"},
        "tags": {"type": "list", "element": "string"},
    }
    # A message that holds itself is no type a column holds; a repeated Timestamp is (a single Any
    # is a flat leaf, as a single Timestamp is).
    assert proto_field_kinds(tree.messages[1]) == {"root": NESTED, "at": '{"type":"list","element":"timestamptz"}'}

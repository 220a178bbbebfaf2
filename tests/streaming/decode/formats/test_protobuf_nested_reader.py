"""The nested columnar Protobuf reader against the protobuf runtime: generated schemas (nested
messages, repeated fields packed and not, maps, enums, oneofs, proto3 optional fields, Timestamp,
Duration and wrappers) and messages written by the runtime's own encoder, read by both readers,
record for record equal; and the wire's corners (a message field written twice, a map key twice,
a oneof switched, unknown fields, a truncated nested message), where the runtime's parse of the
same bytes is the reference."""

from __future__ import annotations

import datetime
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from google.protobuf import json_format, message_factory

from streaming.decode.formats.protobuf import (
    GeneralProtoPlan,
    GeneralProtoReader,
    NestedProtoPlan,
    ProtobufFormat,
    general_proto_plan,
)
from streaming.decode.formats.protobuf_nested import NestedProtoReader
from streaming.decode.python_values import NamedNumber
from streaming.decode.schema_registry import RegisteredSchema
from tests.streaming.decode.formats.test_avro import contract

SCALARS = [
    "double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64",
    "fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes",
]  # fmt: skip
WELL_KNOWN = [
    "google.protobuf.Timestamp", "google.protobuf.Duration", "google.protobuf.Int64Value",
    "google.protobuf.StringValue", "google.protobuf.DoubleValue", "google.protobuf.BoolValue",
]  # fmt: skip
HEADER = """syntax = "proto3";
package gen;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
"""


class Schema:
    """A generated .proto file: its text, and each message's fields as (label, type, name, number)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.messages: dict[str, list[tuple[str, str, str, int, int]]] = {}
        self.enum_values = {"Color": {0: "COLOR_NONE", 1: "RED", 2: "GREEN", 5: "BLUE"}}
        self._message("Top", depth=0)
        self.text = (
            HEADER
            + "enum Color { COLOR_NONE = 0; RED = 1; GREEN = 2; BLUE = 5; }\n"
            + "".join(self._text(name) for name in self.messages)
        )

    def _message(self, name: str, depth: int) -> None:
        rng = self.rng
        fields: list[tuple[str, str, str, int, int]] = []
        self.messages[name] = fields
        oneof = 0
        for number in range(1, rng.randint(2, 9 if depth else 12)):
            kind = rng.random()
            if kind < 0.55:
                proto_type = rng.choice(SCALARS)
            elif kind < 0.65:
                proto_type = "Color"
            elif kind < 0.8:
                proto_type = rng.choice(WELL_KNOWN)
            elif depth < 2:
                proto_type = f"{name}M{number}"
                self._message(proto_type, depth + 1)
            else:
                proto_type = rng.choice(SCALARS)
            label = rng.choice(["", "", "optional", "repeated", "repeated", "map", "oneof"])
            if label == "map":
                key = rng.choice(["string", "int64", "int32", "bool", "uint32"])
                proto_type = f"map<{key}, {proto_type}>"
            if label == "oneof":
                oneof = oneof or rng.randint(1, 2)
            fields.append((label, proto_type, f"f{number}", number, oneof if label == "oneof" else 0))

    def _text(self, name: str) -> str:
        lines = []
        groups: dict[int, list[str]] = {}
        for label, proto_type, field_name, number, oneof in self.messages[name]:
            packed = " [packed = false]" if label == "repeated" and number % 3 == 0 else ""
            if label == "oneof":
                groups.setdefault(oneof, []).append(f"{proto_type} {field_name} = {number};")
            elif label == "map":
                lines.append(f"{proto_type} {field_name} = {number};")
            else:
                lines.append(f"{label} {proto_type} {field_name} = {number}{packed};".strip())
        lines += [f"oneof choice{k} {{ {' '.join(members)} }}" for k, members in groups.items()]
        return f"message {name} {{\n  " + "\n  ".join(lines) + "\n}\n"

    def value(self, name: str) -> dict[str, Any]:
        """A message's JSON form, as json_format reads it: some fields left out."""
        rng = self.rng
        out: dict[str, Any] = {}
        chosen: set[int] = set()
        for label, proto_type, field_name, _number, oneof in self.messages[name]:
            if rng.random() < 0.25:
                continue
            if label == "oneof":
                if oneof in chosen:
                    continue
                chosen.add(oneof)
            if label == "repeated":
                out[field_name] = [self._one(proto_type) for _ in range(rng.randint(0, 4))]
            elif label == "map":
                key_type, value_type = proto_type[4:-1].split(", ")
                out[field_name] = {self._key(key_type): self._one(value_type) for _ in range(rng.randint(0, 3))}
            else:
                out[field_name] = self._one(proto_type)
        return out

    def _key(self, key_type: str) -> str:
        if key_type == "string":
            return self.rng.choice(["", "a", "b", "zz", "é"])
        if key_type == "bool":
            return self.rng.choice(["true", "false"])
        return str(self.rng.choice([0, 1, 7, 300] + ([] if key_type == "uint32" else [-5])))

    def _one(self, proto_type: str) -> Any:
        rng = self.rng
        if proto_type in self.messages:
            return self.value(proto_type)
        if proto_type == "Color":
            return rng.choice(list(self.enum_values["Color"].values()) + [3])  # 3: a number it does not name
        if proto_type == "google.protobuf.Timestamp":
            return rng.choice(["1970-01-01T00:00:00Z", "2024-02-29T12:34:56.789123456Z", "1900-01-01T00:00:00.5Z"])
        if proto_type == "google.protobuf.Duration":
            return rng.choice(["0s", "1.5s", "-2.000500s", "315576000000s"])
        if proto_type == "google.protobuf.Int64Value":
            return rng.choice([0, -1, 2**62])
        if proto_type == "google.protobuf.StringValue":
            return rng.choice(["", "x", "ünï"])
        if proto_type == "google.protobuf.DoubleValue":
            return rng.choice([0.0, -1.25, 1e300])
        if proto_type == "google.protobuf.BoolValue":
            return rng.choice([True, False])
        numbers = {
            "double": [0.0, -0.5, 1e-300, 12345.678],
            "float": [0.0, 1.5, -2.25],
            "int32": [0, 1, -1, 2**31 - 1, -(2**31)],
            "int64": [0, 300, -(2**63), 2**63 - 1],
            "uint32": [0, 1, 2**32 - 1],
            "uint64": [0, 2**64 - 1, 2**40],
            "sint32": [0, -1, 2**31 - 1, -(2**31)],
            "sint64": [0, -(2**63), 2**63 - 1],
            "fixed32": [0, 2**32 - 1],
            "fixed64": [0, 2**64 - 1],
            "sfixed32": [0, -(2**31)],
            "sfixed64": [0, -(2**63)],
            "bool": [True, False],
            "string": ["", "a", "ünï cödé", "x" * 300],
            "bytes": ["", "AAEC", "/w=="],
        }
        return rng.choice(numbers[proto_type])


def readers(text: str, bodies: list[bytes]) -> tuple[NestedProtoReader, GeneralProtoReader]:
    fmt = format_reading_every_field()
    plan = fmt._nested_or_general(RegisteredSchema(5, "PROTOBUF", text))  # a flat one too
    assert isinstance(plan, NestedProtoPlan), type(plan)
    values = [b"\x00" + body for body in bodies]  # message indexes: the file's first message
    data = np.frombuffer(b"".join(values), dtype=np.uint8)
    ends = np.cumsum([len(v) for v in values])
    starts = ends - [len(v) for v in values]
    nested = fmt.reader(plan, data, starts, ends)
    general = GeneralProtoReader(general_proto_plan(5, text), data, starts, ends)
    assert isinstance(nested, NestedProtoReader)
    nested.read()
    general.read()
    return nested, general


def format_reading_every_field() -> ProtobufFormat:
    from streaming.contract import parse_contract

    raw = {**contract({"lon_field": "lon", "lat_field": "lat"}, []), "formats": ["protobuf"]}
    return ProtobufFormat(parse_contract(raw), 10, {})


def as_general(value: Any, kind: pa.DataType) -> Any:
    """A value of the nested reader's records (of Arrow type `kind`) as the general reader gives it."""
    if value is None:
        return None
    if pa.types.is_struct(kind):
        return {f.name: as_general(value[f.name], f.type) for f in kind}
    if pa.types.is_map(kind):
        return {k: as_general(v, kind.item_type) for k, v in value}
    if pa.types.is_list(kind):
        return [as_general(v, kind.value_type) for v in value]
    return value


def from_general(value: Any) -> Any:
    if isinstance(value, NamedNumber):
        return str(value)
    if isinstance(value, dict):
        return {k: from_general(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_general(v) for v in value]
    return value


def same_records(nested: NestedProtoReader, general: GeneralProtoReader) -> None:
    assert nested.bad.tolist() == general.bad.tolist(), (nested.detail, general.detail)
    mine = [as_general(r, nested.records.type) for r in nested.records.to_pylist()]
    theirs = [from_general(r) for r in general.records]
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        assert a == b, f"record {i}:\n nested  {a}\n general {b}"


@pytest.mark.parametrize("seed", range(40))
def test_generated_schemas_and_messages_read_as_the_runtime_reads_them(seed):
    rng = random.Random(seed)
    schema = Schema(rng)
    plan = general_proto_plan(5, schema.text)
    top = message_factory.GetMessageClass(plan.messages[0])
    bodies = []
    for _ in range(60):
        parts = [schema.value("Top") for _ in range(1 if rng.random() < 0.8 else 2)]
        # Two messages written one after the other are one message: fields merged, the last of a
        # scalar winning, repeated fields appended, a oneof switched, a map's keys overwritten.
        bodies.append(b"".join(json_format.ParseDict(p, top()).SerializeToString() for p in parts))
    nested, general = readers(schema.text, bodies)
    assert not nested.bad.any(), nested.detail[nested.bad][:3]
    same_records(nested, general)


CORNERS = """syntax = "proto3";
package c;
import "google/protobuf/timestamp.proto";
message Top {
  message Inner { string name = 1; repeated int64 ids = 2; Inner2 deeper = 3; }
  message Inner2 { double x = 1; }
  Inner inner = 1;
  repeated sint32 packed = 2;
  repeated sint32 loose = 3 [packed = false];
  map<string, Inner> by_name = 4;
  oneof choice { string text = 5; int64 number = 6; Inner other = 7; }
  google.protobuf.Timestamp at = 8;
  int32 small = 9;
}
"""
TOP = message_factory.GetMessageClass(general_proto_plan(6, CORNERS).messages[0])


def test_the_corners_of_the_wire_read_as_the_runtime_reads_them():
    def body(**fields: Any) -> bytes:
        return json_format.ParseDict(fields, TOP()).SerializeToString()

    bodies = [
        body(inner={"name": "a", "ids": [1]}) + body(inner={"ids": [2, 3], "deeper": {"x": 1.5}}),  # merged
        body(packed=[1, -1, 2**31 - 1, -(2**31)], loose=[0, -7]) + body(packed=[5], loose=[9]),
        body(byName={"k": {"name": "one"}, "a": {}}) + body(byName={"k": {"name": "two"}}),  # a key twice
        body(text="t") + body(number=7),  # the oneof switched
        body(number=7) + body(other={"name": "o"}),
        body(at="2020-01-01T00:00:00.000001999Z", small=-1),  # nanos cut to micros; a 10-byte varint
        b"\x9a\x05\x03abc" + body(small=3),  # field 83 (not in the schema) skipped
        b"",  # every field absent: proto3 defaults, messages null
        b"\x22\x04\x0a\x01k\x12\x00" + b"\x22\x03\x0a\x01j",  # map entries: an empty value, no value
    ]
    nested, general = readers(CORNERS, bodies)
    same_records(nested, general)
    assert nested.records[0].as_py()["inner"] == {"name": "a", "ids": [1, 2, 3], "deeper": {"x": 1.5}}
    assert nested.records[2].as_py()["by_name"] == [
        ("a", {"name": "", "ids": [], "deeper": None}),
        ("k", {"name": "two", "ids": [], "deeper": None}),
    ]
    assert nested.records[4].as_py()["number"] is None and nested.records[4].as_py()["other"]["name"] == "o"
    assert nested.records[5].as_py()["at"] == datetime.datetime(2020, 1, 1, 0, 0, 0, 1, tzinfo=datetime.UTC)


def test_a_record_that_does_not_match_is_flagged_naming_its_nested_field():
    good = json_format.ParseDict({"inner": {"name": "a"}}, TOP()).SerializeToString()
    bodies = [
        good,
        b"\x0a\x05\x0a\x09abc",  # inner.name's length runs past inner's end
        b"\x0a\x04\x0a\x02\xc3\x28",  # inner.name is not UTF-8
        b"\x12\x02\x80\x80",  # a packed run that ends inside an integer
        b"\x0a\x02\x10\x80",  # inner.ids (one not packed) ends inside its integer
        b"\x09" + b"\x00" * 8,  # field 1 (inner) written as a double
    ]
    nested, general = readers(CORNERS, bodies)
    assert nested.bad.tolist() == [False, True, True, True, True, True]
    # The runtime refuses each too, but the last: it keeps a field of another wire type than its
    # type's as an unknown field, which no column reads; as the flat reader, this one says so.
    assert general.bad.tolist() == [False, True, True, True, True, False]
    details = nested.detail.tolist()
    assert "field 'inner': field 'name'" in details[1] and "runs past" in details[1]
    assert "field 'inner': field 'name': not UTF-8" in details[2]
    assert "field 'packed'" in details[3] and "inside a variable-length integer" in details[3]
    assert details[4].startswith("field 'inner': field 'ids'")
    assert "field 'inner': wire type 1" in details[5]
    assert nested.records[0].as_py()["inner"]["name"] == "a"
    assert nested.records.null_count == 5


def test_schemas_it_does_not_read_go_to_the_general_reader():
    fmt = format_reading_every_field()
    recursive = 'syntax = "proto3"; message Node { string v = 1; repeated Node children = 2; }'
    holds_any = 'syntax = "proto3"; import "google/protobuf/any.proto"; message A { google.protobuf.Any x = 1; }'
    for text in (recursive, holds_any):
        plan = fmt.compile(RegisteredSchema(7, "PROTOBUF", text))
        assert isinstance(plan, GeneralProtoPlan) and not isinstance(plan, NestedProtoPlan)


def test_an_enum_read_into_an_integer_column_goes_to_the_general_reader():
    from streaming.contract import parse_contract

    text = 'syntax = "proto3"; enum E { A = 0; B = 1; } message M { double lon = 1; double lat = 2; repeated E e = 3; }'
    raw = {**contract({"lon_field": "lon", "lat_field": "lat"}, []), "formats": ["protobuf"]}
    as_numbers = ProtobufFormat(parse_contract(raw), 10, {"e": pa.list_(pa.int64())})
    as_names = ProtobufFormat(parse_contract(raw), 10, {"e": pa.list_(pa.string())})
    registered = RegisteredSchema(8, "PROTOBUF", text)
    assert not isinstance(as_numbers.compile(registered), NestedProtoPlan)
    assert isinstance(as_names.compile(registered), NestedProtoPlan)


def test_a_timestamp_past_year_9999_is_refused_by_both_readers():
    bodies = []
    for seconds in (253_402_300_799, 253_402_300_800, 10**15, -62_135_596_801):
        message = TOP()
        message.at.seconds = seconds
        bodies.append(message.SerializeToString())
    nested, general = readers(CORNERS, bodies)
    assert nested.bad.tolist() == general.bad.tolist() == [False, True, True, True]
    assert nested.records[0].as_py()["at"] == datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.UTC)
    assert nested.detail[2] == "field 'at': a timestamp of 1000000000000000 s and 0 ns is out of range"

"""The shape of a Protobuf message type, from the descriptors the protobuf runtime builds of a
.proto file (streaming/decode/formats/proto_text.py): each field's number, label (single, repeated,
map), presence, oneof and value (a scalar and how it is written, an enum and its names, a message
and its own shape, or a well-known type: Timestamp, Duration, a wrapper), and the Arrow type the
nested columnar reader (streaming/decode/formats/protobuf_nested.py) gives it.

A message type that contains itself has no Arrow type, nor have Any, Struct, Empty and FieldMask
(`UnsupportedSchema`): the general reader reads those schemas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from streaming.decode.formats.avro_schema import UnsupportedSchema

WRAPPERS = {
    f"google.protobuf.{name}Value"
    for name in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")
}
SINGLE, REPEATED, MAP = 0, 1, 2  # a field's label

# Each scalar type: how it is written (its wire encoding) and the Arrow type it is read as.
_SCALAR = {
    FieldDescriptor.TYPE_DOUBLE: ("double", pa.float64()),
    FieldDescriptor.TYPE_FLOAT: ("float", pa.float32()),
    FieldDescriptor.TYPE_INT64: ("varint", pa.int64()),
    FieldDescriptor.TYPE_UINT64: ("varint", pa.uint64()),
    FieldDescriptor.TYPE_INT32: ("varint", pa.int32()),
    FieldDescriptor.TYPE_FIXED64: ("fixed64", pa.uint64()),
    FieldDescriptor.TYPE_FIXED32: ("fixed32", pa.uint32()),
    FieldDescriptor.TYPE_BOOL: ("varint", pa.bool_()),
    FieldDescriptor.TYPE_STRING: ("len", pa.string()),
    FieldDescriptor.TYPE_BYTES: ("len", pa.binary()),
    FieldDescriptor.TYPE_UINT32: ("varint", pa.uint32()),
    FieldDescriptor.TYPE_ENUM: ("varint", pa.string()),
    FieldDescriptor.TYPE_SFIXED32: ("sfixed32", pa.int32()),
    FieldDescriptor.TYPE_SFIXED64: ("sfixed64", pa.int64()),
    FieldDescriptor.TYPE_SINT32: ("zigzag", pa.int32()),
    FieldDescriptor.TYPE_SINT64: ("zigzag", pa.int64()),
}
# Each encoding's wire type (the flat reader's too).
WIRE_TYPE = {
    "varint": 0,
    "zigzag": 0,
    "fixed64": 1,
    "sfixed64": 1,
    "double": 1,
    "len": 2,
    "fixed32": 5,
    "sfixed32": 5,
    "float": 5,
}


@dataclass
class Value:
    """One value of a field (an item of a repeated one): a scalar written as `encoding`, or a
    message (`message`, read whole and then taken as `kind` says)."""

    kind: str  # "scalar", "enum", "message", "timestamp", "duration" or "wrapper"
    arrow: pa.DataType
    encoding: str = "len"
    message: MessageShape | None = None
    symbols: dict[int, str] = field(default_factory=dict)  # enum


@dataclass
class Field:
    name: str
    number: int
    value: Value
    label: int  # SINGLE, REPEATED or MAP (a repeated entry message of a key and a value)
    presence: bool  # null when absent (else a proto3 field absent is its default)
    arrow: pa.DataType
    oneof: int = -1  # which oneof of its message it is a member of


@dataclass
class MessageShape:
    name: str
    fields: list[Field]
    arrow: pa.StructType
    by_number: dict[int, Field] = field(default_factory=dict)
    oneofs: int = 0


def message_shape(descriptor: Descriptor) -> MessageShape:
    """The shape of a message type; raises UnsupportedSchema for one the reader does not read."""
    return _message(descriptor, ())


def _message(descriptor: Descriptor, inside: tuple[str, ...]) -> MessageShape:
    name = descriptor.full_name
    if name in inside:
        raise UnsupportedSchema(f"message {name} contains itself: no column type holds it")
    fields = []
    oneofs = {oneof.full_name: i for i, oneof in enumerate(descriptor.oneofs) if not _synthetic(oneof)}
    for fd in descriptor.fields:
        repeated = bool(fd.is_repeated)
        if repeated and fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            entry = _message(fd.message_type, (*inside, name))
            key_field, value_field = entry.by_number[1], entry.by_number[2]
            # An entry without its key or value holds the default of its type (for a message, the
            # message of no fields set), as the runtime gives it.
            key_field.presence = value_field.presence = False
            arrow: pa.DataType = pa.map_(key_field.arrow, value_field.arrow)
            fields.append(Field(fd.name, fd.number, Value("message", entry.arrow, message=entry), MAP, False, arrow))
            continue
        value = _value(fd, (*inside, name))
        oneof = fd.containing_oneof
        fields.append(
            Field(
                fd.name,
                fd.number,
                value,
                REPEATED if repeated else SINGLE,
                bool(fd.has_presence) and not repeated,
                pa.list_(value.arrow) if repeated else value.arrow,
                -1 if oneof is None or _synthetic(oneof) else oneofs[oneof.full_name],
            )
        )
    arrow = pa.struct([pa.field(f.name, f.arrow) for f in fields])
    return MessageShape(name, fields, arrow, {f.number: f for f in fields}, len(oneofs))


def _synthetic(oneof: Any) -> bool:
    """A proto3 `optional` field's own oneof, which only gives it presence."""
    return (
        len(oneof.fields) == 1 and bool(getattr(oneof.fields[0], "has_presence", False)) and oneof.name.startswith("_")
    )


def _value(fd: FieldDescriptor, inside: tuple[str, ...]) -> Value:
    if fd.type == FieldDescriptor.TYPE_GROUP:
        raise UnsupportedSchema(f"field {fd.name!r} is a group")
    if fd.type != FieldDescriptor.TYPE_MESSAGE:
        encoding, arrow = _SCALAR[fd.type]
        if fd.type == FieldDescriptor.TYPE_ENUM:
            return Value("enum", arrow, encoding, symbols={v.number: v.name for v in fd.enum_type.values})
        return Value("scalar", arrow, encoding)
    full_name = fd.message_type.full_name
    message = _message(fd.message_type, inside)
    if full_name == "google.protobuf.Timestamp":
        return Value("timestamp", pa.timestamp("us", tz="UTC"), message=message)
    if full_name == "google.protobuf.Duration":
        return Value("duration", pa.int64(), message=message)
    if full_name in WRAPPERS:
        return Value("wrapper", message.by_number[1].arrow, message=message)
    if full_name.startswith("google.protobuf."):
        raise UnsupportedSchema(f"field {fd.name!r} is a {full_name}")
    return Value("message", message.arrow, message=message)


def reads_enum_as_number(shape: MessageShape, path: str, target: pa.DataType) -> bool:
    """Whether a column of type `target` fed the field at `path` (`position.unit`) takes an enum's
    number somewhere in it (an integer where this reader gives the value's name): the general
    reader reads such a schema."""
    message: MessageShape | None = shape
    steps = path.split(".")
    for step in steps[:-1]:
        found = next((f for f in message.fields if f.name == step), None) if message else None
        message = found.value.message if found and found.label == SINGLE and found.value.kind == "message" else None
    last = next((f for f in message.fields if f.name == steps[-1]), None) if message else None
    return last is not None and _number_wanted(last, target)


def enum_read_as_number(message: MessageShape, target: pa.DataType) -> bool:
    """Whether a column of type `target` fed a message of `message` type takes an enum's number."""
    if not pa.types.is_struct(target):
        return False
    for member in target:
        found = next((f for f in message.fields if f.name == member.name), None)
        if found is not None and _number_wanted(found, member.type):
            return True
    return False


def _number_wanted(f: Field, target: pa.DataType) -> bool:
    if f.label == MAP:
        if not pa.types.is_map(target):
            return False
        assert f.value.message is not None
        key, value = f.value.message.by_number[1], f.value.message.by_number[2]
        return _value_number_wanted(key.value, target.key_type) or _value_number_wanted(value.value, target.item_type)
    if f.label == REPEATED:
        return pa.types.is_list(target) and _value_number_wanted(f.value, target.value_type)
    return _value_number_wanted(f.value, target)


def _value_number_wanted(value: Value, target: pa.DataType) -> bool:
    if value.kind == "enum":
        return pa.types.is_integer(target)
    if value.kind == "message" and value.message is not None:
        return enum_read_as_number(value.message, target)
    return False

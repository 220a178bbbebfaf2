"""Protobuf messages in the Confluent wire format (contract format "protobuf"), their schemas from a
registry.

A value is a zero byte, the 4-byte big-endian schema id, the message indexes (which message of the
schema: a zigzag count and as many zigzag indexes, a single 0 byte for the first message), and the
message in Protobuf's binary encoding. As for Avro (streaming/decode/formats/avro.py, whose reader,
geometry and columns this format shares) the records of a batch are grouped by schema id and read
together with numpy: every record's next field tag at once, then the value of each field number
for the records that have it, until every record is read. Fields come in any order; the last value
of a field wins, as Protobuf says; a field the schema does not name is skipped by its wire type.

Three readers, chosen per writer schema id (and the contract's columns), never per record:

- The flat columnar reader above reads a file of one message, its scalar fields (double,
  float, int32, int64, uint32, uint64, sint32, sint64, fixed32, fixed64, sfixed32, sfixed64, bool,
  string, bytes, enums as their numbers), `optional` and `oneof` fields (null when absent; a plain
  proto3 field absent is its default: 0, false, "").
- The nested columnar reader (streaming/decode/formats/protobuf_nested.py) reads the first message
  of any other file, the same way, a level at a time: nested messages (-> struct; a message field
  absent is null), repeated fields packed or not (-> list; absent: empty), maps (-> map, in key
  order), enums (-> the value's name; a number the enum does not name is its digits), oneof
  members (each a field of its own, null unless it is the one set), google.protobuf.Timestamp
  (-> timestamptz, nanoseconds cut to microseconds), Duration (-> long microseconds), the wrappers
  (Int64Value, StringValue, ...: their value, null when absent). Records of the file's other
  messages (named by their message indexes) it hands to the general reader.
- The general reader (GeneralProtoReader) reads the rest: a message type that holds itself, Any
  and Struct, and a schema with an enum field that an integer column reads (it takes the number).
  The .proto text becomes the runtime's FileDescriptorProto (streaming/decode/formats/proto_text.py),
  the runtime builds the message class and parses each message, which is walked to Python values
  (the same values the nested reader gives) and converted to each column's type by
  streaming/decode/python_values.py, record by record.

A file may import the well-known types' files and the .proto files the registry holds as its schema
references (each reference's name is the import path; fetched with the schema, the files they import
first); an import that is neither rejects the schema's records with `schema_not_supported`, as do
groups and `extend`.

A value that does not fit its column rejects its record with `property_type_mismatch`, naming the
nested path (`properties.readings[1].value: expected int, got 0.5`).
"""

from __future__ import annotations

import datetime
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
from google.protobuf import (
    any_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    message_factory,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from streaming.decode.formats.avro import AnyReader, AvroFormat, GeneralReader, RecordReader
from streaming.decode.formats.avro_schema import GeneralPlan, Node, Plan, UnsupportedSchema
from streaming.decode.formats.proto_text import ProtoSyntaxError, parse_proto
from streaming.decode.formats.protobuf_nested import (
    NestedProtoReader,
    fixed_scalars,
    length_delimited,
    next_fields,
    skip_field,
)
from streaming.decode.formats.protobuf_shape import (
    WIRE_TYPE,
    WRAPPERS,
    MessageShape,
    message_shape,
    reads_enum_as_number,
)
from streaming.decode.python_values import NamedNumber
from streaming.decode.schema_registry import RegisteredSchema

# proto type -> (the reader's kind, how it is encoded)
_SCALARS = {
    "double": ("double", "double"),
    "float": ("float", "float"),
    "int32": ("long", "varint"),
    "int64": ("long", "varint"),
    "uint32": ("long", "varint"),
    "uint64": ("long", "varint"),
    "sint32": ("long", "zigzag"),
    "sint64": ("long", "zigzag"),
    "fixed32": ("long", "fixed32"),
    "sfixed32": ("long", "sfixed32"),
    "fixed64": ("long", "fixed64"),
    "sfixed64": ("long", "sfixed64"),
    "bool": ("boolean", "varint"),
    "string": ("string", "len"),
    "bytes": ("bytes", "len"),
}
_FIELD = re.compile(
    r"^(optional\s+|repeated\s+|required\s+)?([A-Za-z_][\w.<>, ]*?)\s+([A-Za-z_]\w*)\s*=\s*(\d+)\s*(\[.*\])?$"
)


@dataclass
class ProtoPlan(Plan):
    numbers: dict[int, Node] = field(default_factory=dict)
    # Fields with presence (optional, oneof): null when absent; the others read as their default.
    optional: set[str] = field(default_factory=set)
    # Enum fields (read as their numbers here; a string column of one takes the general reader).
    enums: set[str] = field(default_factory=set)


def compile_proto(schema_id: int, text: str) -> ProtoPlan:
    """A reading plan of the first message of a .proto file; raises UnsupportedSchema."""
    body = re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    enums = set(re.findall(r"\benum\s+(\w+)\s*\{", body))
    start = re.search(r"^\s*message\s+(\w+)\s*\{", body, flags=re.M)
    if start is None:
        raise UnsupportedSchema(f"schema id {schema_id} has no message")
    depth, i, opened = 1, start.end(), start.end()
    while depth and i < len(body):
        depth += {"{": 1, "}": -1}.get(body[i], 0)
        i += 1
    message = body[opened : i - 1]
    # Nested message and enum definitions are types, not fields; oneof members have presence.
    message = re.sub(r"\b(message|enum)\s+\w+\s*\{[^{}]*\}", " ", message)
    oneof_members: set[str] = set()
    for members in re.findall(r"\boneof\s+\w+\s*\{([^{}]*)\}", message):
        oneof_members |= {m.group(3) for m in (_FIELD.match(s.strip()) for s in members.split(";")) if m}
    message = re.sub(r"\boneof\s+\w+\s*\{([^{}]*)\}", r"\1", message)
    leaves: dict[str, Node] = {}
    numbers: dict[int, Node] = {}
    optional: set[str] = set()
    enum_fields: set[str] = set()
    for statement in message.split(";"):
        statement = " ".join(statement.split())
        if not statement or statement.startswith(("option ", "reserved ", "extensions ")):
            continue
        match = _FIELD.match(statement)
        if match is None:
            raise UnsupportedSchema(f"schema id {schema_id}: cannot read {statement[:80]!r}")
        label, proto_type, name, number = match.group(1), match.group(2).strip(), match.group(3), int(match.group(4))
        label = (label or "").strip()
        if label == "repeated" or proto_type.startswith("map<"):
            raise UnsupportedSchema(f"schema id {schema_id}: field {name!r} is repeated; not supported")
        if proto_type in _SCALARS:
            kind, encoding = _SCALARS[proto_type]
        elif proto_type.rsplit(".", 1)[-1] in enums:
            kind, encoding = "long", "varint"
            enum_fields.add(name)
        else:
            raise UnsupportedSchema(f"schema id {schema_id}: field {name!r} is a message ({proto_type}); not supported")
        node = Node(kind, name, logical=f"pb:{encoding}")
        leaves[name] = numbers[number] = node
        if label == "optional" or name in oneof_members:
            optional.add(name)
    return ProtoPlan(
        schema_id, Node("record", "", fields=list(leaves.values())), leaves, numbers, optional, enum_fields
    )


class ProtoReader(RecordReader):
    """Reads the messages of one schema, all at once."""

    plan: ProtoPlan

    def read(self) -> None:
        everyone = np.arange(len(self.pos))
        self._message_indexes(everyone)
        present = {name: np.zeros(len(self.pos), dtype=bool) for name in self.plan.leaves}
        while (fields := next_fields(self)) is not None:
            for key, rows in fields:
                node = self.plan.numbers.get(key >> 3)
                if node is None:
                    skip_field(self, rows, key & 7, f"field {key >> 3} (not in the schema)")
                    continue
                encoding = node.logical.removeprefix("pb:")
                if key & 7 != WIRE_TYPE[encoding]:
                    self._fail(
                        rows,
                        np.ones(rows.size, dtype=bool),
                        f"field {node.name!r}: wire type {key & 7}, its type is written as {WIRE_TYPE[encoding]}",
                    )
                    continue
                self._value(node, encoding, rows)
                present[node.name][rows] = True
        for name, column in self.columns.items():
            if name not in self.plan.optional:
                column.valid |= ~present[name]  # absent: the type's default, which the column holds

    def _message_indexes(self, sel: np.ndarray) -> None:
        count = self._varint(sel, "message indexes")
        ok = ~self.bad[sel]
        one = ok & (count == 1)
        if one.any():
            index = np.zeros(sel.size, dtype=np.int64)
            index[one] = self._varint(sel[one], "message index")
            other = one & (index != 0)
            self._fail(sel, other, "a message other than the schema's first; not supported")
        wrong = ok & ((count < 0) | (count > 1))
        self._fail(sel, wrong, "a nested message type; not supported")

    def _value(self, node: Node, encoding: str, rows: np.ndarray) -> None:
        column = self.columns[node.name]
        what = f"field {node.name!r}"
        if encoding in ("varint", "zigzag"):
            value = self._varint(rows, what, zigzag=encoding == "zigzag")
            ok = ~self.bad[rows]
            column.values[rows[ok]] = value[ok] != 0 if node.kind == "boolean" else value[ok]
            column.valid[rows[ok]] = True
        elif encoding == "len":
            start, length, ok = length_delimited(self, rows, what)
            column.start[rows[ok]] = start[ok]
            column.length[rows[ok]] = length[ok]
            column.valid[rows[ok]] = True
        else:
            values, fits = fixed_scalars(self, encoding, rows, what)
            column.values[rows[fits]] = values[fits]
            column.valid[rows[fits]] = True


# -- the general reader: the protobuf runtime, message by message ----------------------------------
_WELL_KNOWN = (timestamp_pb2, duration_pb2, wrappers_pb2, any_pb2, empty_pb2, struct_pb2, field_mask_pb2)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_KIND_OF = {
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_BOOL: "boolean",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_ENUM: "enum",
    FieldDescriptor.TYPE_MESSAGE: "record",
}


@dataclass
class GeneralProtoPlan(GeneralPlan):
    """A .proto schema read by the protobuf runtime: its top-level message descriptors, in order."""

    messages: list[Descriptor] = field(default_factory=list)


@dataclass
class NestedProtoPlan(GeneralProtoPlan):
    """A schema the nested columnar reader reads (streaming/decode/formats/protobuf_nested.py): the
    shape of its file's first message, beside the descriptors the general reader's plan holds."""

    shape: MessageShape = field(default_factory=lambda: MessageShape("", [], pa.struct([])))


def general_proto_plan(schema_id: int, text: str, references: Sequence[tuple[str, str]] = ()) -> GeneralProtoPlan:
    """The general reader's plan of a .proto file and the files it imports that the registry holds
    as its schema references (`references`: import path and text each, imported ones first);
    raises UnsupportedSchema."""
    pool = descriptor_pool.DescriptorPool()
    for module in _WELL_KNOWN:
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    known = {module.DESCRIPTOR.name for module in _WELL_KNOWN}
    try:
        for path, referred in references:
            if path not in known:
                imported = parse_proto(referred, name=path)
                missing = [d for d in imported.dependency if d not in known]
                if missing:
                    raise UnsupportedSchema(
                        f"schema id {schema_id}: {path} imports {missing}, which it has no reference to"
                    )
                pool.Add(imported)
                known.add(path)
        fdp = parse_proto(text, name=f"registry-schema-{schema_id}.proto")
        other = [d for d in fdp.dependency if d not in known]
        if other:
            raise UnsupportedSchema(
                f"schema id {schema_id} imports {other}: neither a well-known type's file nor a schema reference"
            )
        described = pool.Add(fdp)
    except (ProtoSyntaxError, TypeError, ValueError) as exc:
        raise UnsupportedSchema(
            f"schema id {schema_id} is not a .proto file the protobuf runtime reads: {exc}"
        ) from None
    messages = [described.message_types_by_name[m.name] for m in fdp.message_type]
    if not messages:
        raise UnsupportedSchema(f"schema id {schema_id} has no message")
    leaves: dict[str, Node] = {}
    paths: set[str] = set()
    _proto_fields(messages[0], "", leaves, paths)
    return GeneralProtoPlan(schema_id, Node("record"), leaves, paths=frozenset(paths), messages=messages)


def proto_field_kinds(message: Descriptor) -> dict[str, str]:
    """The type of each field of a message that is a message (not a well-known type), repeated
    or a map, as schema evolution spells a struct, list or map column (PropertySeen's kind), as
    the general reader's values fill it; NESTED for one no column type holds (Any, Struct, a
    message that holds itself)."""
    # Here, not at the top: streaming.decode.properties imports the formats package.
    from streaming.decode.properties import NESTED, kind_of_spelling

    kinds = {}
    for fd in message.fields:
        plain = fd.type != FieldDescriptor.TYPE_MESSAGE or fd.message_type.full_name.startswith("google.protobuf.")
        if plain and not _is_repeated(fd):
            continue
        spelling = _field_spelling(fd, ())
        kinds[fd.name] = NESTED if spelling is None else kind_of_spelling(spelling)
    return kinds


_SCALAR_SPELLING = {
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_FLOAT: "double",
    FieldDescriptor.TYPE_BOOL: "boolean",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "binary",
    FieldDescriptor.TYPE_ENUM: "string",
}


def _field_spelling(fd: FieldDescriptor, inside: tuple[str, ...]) -> Any:
    if _is_repeated(fd) and fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        key = _value_spelling(fd.message_type.fields_by_name["key"], inside)
        value = _value_spelling(fd.message_type.fields_by_name["value"], inside)
        return None if key is None or value is None else {"type": "map", "key": key, "value": value}
    element = _value_spelling(fd, inside)
    if _is_repeated(fd):
        return None if element is None else {"type": "list", "element": element}
    return element


def _value_spelling(fd: FieldDescriptor, inside: tuple[str, ...]) -> Any:
    """One value of the field (an element of a repeated one) as a column type is spelt."""
    if fd.type != FieldDescriptor.TYPE_MESSAGE:
        return _SCALAR_SPELLING.get(fd.type, "long")  # every integer type
    full_name = fd.message_type.full_name
    if full_name == "google.protobuf.Timestamp":
        return "timestamptz"
    if full_name == "google.protobuf.Duration":
        return "long"  # microseconds
    if full_name in WRAPPERS:
        return _value_spelling(fd.message_type.fields_by_name["value"], inside)
    if full_name.startswith("google.protobuf.") or full_name in inside:
        return None
    members = [(f.name, _field_spelling(f, (*inside, full_name))) for f in fd.message_type.fields]
    if not members or any(kind is None for _, kind in members):
        return None
    return {"type": "struct", "fields": [{"name": name, "type": kind} for name, kind in members]}


def _is_repeated(fd: FieldDescriptor) -> bool:
    return bool(fd.is_repeated)


def _proto_fields(message: Descriptor, prefix: str, leaves: dict[str, Node], paths: set[str]) -> None:
    for fd in message.fields:
        name = f"{prefix}{fd.name}"
        paths.add(name)
        plain_message = fd.type == FieldDescriptor.TYPE_MESSAGE and not _is_repeated(fd)
        if (
            plain_message
            and fd.message_type.full_name not in WRAPPERS
            and not fd.message_type.full_name.startswith("google.protobuf.")
        ):
            _proto_fields(fd.message_type, f"{name}.", leaves, paths)
        elif _is_repeated(fd):
            leaves[name] = Node("map" if fd.message_type and fd.message_type.GetOptions().map_entry else "array", name)
        else:
            leaves[name] = Node(_KIND_OF.get(fd.type, "long"), name)


def message_values(message: Any) -> dict[str, Any]:
    """A message as Python values: nested messages as dicts, repeated fields as lists, maps as
    dicts in key order, enums as NamedNumber, Timestamp as a datetime (UTC), Duration as
    microseconds, a wrapper as its value; a field with presence that is not set is None, a plain
    proto3 field its default."""
    out: dict[str, Any] = {}
    for name, shape, presence, convert in _fields_of(message.DESCRIPTOR):
        value = getattr(message, name)
        if shape == _MAP:
            # In key order: the runtime's own order is its hash table's.
            out[name] = {key: convert(value[key]) for key in sorted(value)}
        elif shape == _REPEATED:
            out[name] = [convert(v) for v in value]
        elif presence and not message.HasField(name):
            out[name] = None
        else:
            out[name] = convert(value)
    return out


_SINGLE, _REPEATED, _MAP = 0, 1, 2
# Per message type, what message_values does with each field: looked up once per type, not per
# message (the descriptor's attributes and options are slow to ask); by descriptor, not by name:
# two versions of a schema name their message alike.
_FIELD_PLANS: dict[Descriptor, list[tuple[str, int, bool, Any]]] = {}


def _fields_of(descriptor: Descriptor) -> list[tuple[str, int, bool, Any]]:
    plan = _FIELD_PLANS.get(descriptor)
    if plan is None:
        plan = []
        for fd in descriptor.fields:
            if _is_repeated(fd) and fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                plan.append((fd.name, _MAP, False, _converter(fd.message_type.fields_by_name["value"])))
            elif _is_repeated(fd):
                plan.append((fd.name, _REPEATED, False, _converter(fd)))
            else:
                plan.append((fd.name, _SINGLE, bool(fd.has_presence), _converter(fd)))
        _FIELD_PLANS[descriptor] = plan
    return plan


def _as_is(value: Any) -> Any:
    return value


def _converter(fd: FieldDescriptor) -> Any:
    """The function that makes one value of the field a Python value."""
    if fd.type == FieldDescriptor.TYPE_ENUM:
        names = {v.number: v.name for v in fd.enum_type.values}
        return lambda number: NamedNumber(names.get(number, str(number)), number)
    if fd.type != FieldDescriptor.TYPE_MESSAGE:
        return _as_is
    full_name = fd.message_type.full_name
    if full_name == "google.protobuf.Timestamp":
        return lambda t: _EPOCH + datetime.timedelta(seconds=t.seconds, microseconds=t.nanos // 1000)
    if full_name == "google.protobuf.Duration":
        return lambda d: d.seconds * 1_000_000 + int(d.nanos / 1000)  # nanos share the seconds' sign
    if full_name in WRAPPERS:
        return lambda w: w.value
    return message_values


class GeneralProtoReader(GeneralReader):
    """Reads the messages of a schema the columnar reader does not read with the protobuf runtime,
    one by one, any message of the file the message indexes name."""

    plan: GeneralProtoPlan

    def __init__(self, plan: GeneralProtoPlan, data: np.ndarray, pos: np.ndarray, end: np.ndarray):
        super().__init__(plan, data, pos, end)
        self._classes: dict[tuple[int, ...], Any] = {}

    def read(self) -> None:
        buffer = memoryview(self.data.data)
        for i, (start, stop) in enumerate(zip(self.pos.tolist(), self.end.tolist(), strict=True)):
            body = bytes(buffer[start:stop])
            try:
                indexes, at = _message_indexes(body)
                message = self._class(indexes)()
                message.ParseFromString(body[at:])
                self.records[i] = message_values(message)
            except (DecodeError, IndexError, ValueError, OverflowError, RuntimeWarning) as exc:
                self.bad[i] = True
                self.detail[i] = str(exc) or type(exc).__name__

    def _class(self, indexes: tuple[int, ...]) -> Any:
        found = self._classes.get(indexes)
        if found is None:
            descriptor = self.plan.messages[indexes[0]]
            for index in indexes[1:]:
                descriptor = descriptor.nested_types[index]
            found = self._classes[indexes] = message_factory.GetMessageClass(descriptor)
        return found


def _varint(body: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(body):
            raise IndexError("the record ends inside the message indexes")
        byte = body[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), at  # zigzag


def _message_indexes(body: bytes) -> tuple[tuple[int, ...], int]:
    """Which message of the file (Confluent's message indexes: a count, then as many indexes; a
    count of 0 is the first message), and where the message starts."""
    count, at = _varint(body, 0)
    if count < 0 or count > 32:
        raise ValueError(f"message indexes: a count of {count}")
    if count == 0:
        return (0,), at
    indexes = []
    for _ in range(count):
        index, at = _varint(body, at)
        indexes.append(index)
    if min(indexes) < 0:
        raise ValueError(f"message indexes {indexes}")
    return tuple(indexes), at


def _message_names(text: str) -> list[str]:
    """The top-level messages of a .proto file (none read: one, as the flat reader reads it)."""
    try:
        return [m.name for m in parse_proto(text).message_type]
    except ProtoSyntaxError:
        return []


def _references(registered: RegisteredSchema) -> list[tuple[str, str]]:
    """(import path, text) of each file the schema refers to; a reference of no name matches no import."""
    names = registered.reference_names or ("",) * len(registered.references)
    return list(zip(names, registered.references, strict=True))


class ProtobufFormat(AvroFormat):
    """Protobuf in the Confluent wire format, read with the schema the registry holds for its id."""

    names: ClassVar[tuple[str, ...]] = ("protobuf",)
    described: ClassVar[str] = "a Protobuf message in the Confluent wire format"
    schema_type: ClassVar[str] = "PROTOBUF"
    # int32 and int64 fields are both read as long: a writer schema's int64 widens no int column.
    integer_widths: ClassVar[bool] = False

    def nested_kinds(self, registered: RegisteredSchema, plan: Plan | UnsupportedSchema) -> dict[str, str]:
        """Schema evolution's types of the first message's nested fields (`proto_field_kinds`),
        from the general reader's plan when it was just built, so the descriptors are not built again."""
        if not isinstance(plan, GeneralProtoPlan):
            try:
                plan = general_proto_plan(registered.id, registered.text, _references(registered))
            except UnsupportedSchema:
                return {}
        return proto_field_kinds(plan.messages[0])

    def compile(self, registered: RegisteredSchema) -> Plan:
        """The flat columnar reader's plan when it reads the schema, the file has one message (it
        reads the first only; the records may name any) and no string column reads an enum field
        (it reads enums as numbers); else the nested columnar reader's when it reads the first
        message (records of the file's other messages it hands to the general reader) and no
        column takes an enum as a number; else the general reader's."""
        try:
            plan = compile_proto(registered.id, registered.text)
        except UnsupportedSchema:
            if not self.reads_every_schema:
                raise
            return self._nested_or_general(registered)
        if not self.reads_every_schema:
            return plan
        if any(name in plan.enums and not pa.types.is_integer(kind) for name, kind in self.property_types.items()):
            return self._nested_or_general(registered)
        return plan if len(_message_names(registered.text)) <= 1 else self._nested_or_general(registered)

    def _nested_or_general(self, registered: RegisteredSchema) -> GeneralProtoPlan:
        general = general_proto_plan(registered.id, registered.text, _references(registered))
        try:
            shape = message_shape(general.messages[0])
        except UnsupportedSchema:
            return general  # a message that holds itself, a group, Any or Struct
        if any(reads_enum_as_number(shape, name, kind) for name, kind in self.property_types.items()):
            return general
        return NestedProtoPlan(
            general.schema_id, general.root, general.leaves, general.parsed, general.paths, general.messages, shape
        )

    def reader(self, plan: Plan, data: np.ndarray, start: np.ndarray, end: np.ndarray) -> AnyReader:
        if isinstance(plan, NestedProtoPlan):
            general = functools.partial(GeneralProtoReader, plan)
            return NestedProtoReader(plan, data, start, end, others=general)
        if isinstance(plan, GeneralProtoPlan):
            return GeneralProtoReader(plan, data, start, end)
        return ProtoReader(plan, data, start, end)

"""Protobuf messages in the Confluent wire format (contract format "protobuf"), their schemas from a
registry.

A value is a zero byte, the 4-byte big-endian schema id, the message indexes (which message of the
schema: a zigzag count and as many zigzag indexes, a single 0 byte for the first message), and the
message in Protobuf's binary encoding. As for Avro (streaming/decode/formats/avro.py, whose reader,
geometry and columns this format shares) the records of a batch are grouped by schema id and read
together with numpy: every record's next field tag at once, then the value of each field number
for the records that have it, until every record is read. Fields come in any order; the last value
of a field wins, as Protobuf says; a field the schema does not name is skipped by its wire type.

Supported schemas (the registry holds them as .proto text): the first message of the file, its
scalar fields (double, float, int32, int64, uint32, uint64, sint32, sint64, fixed32, fixed64,
sfixed32, sfixed64, bool, string, bytes, enums as their numbers), `optional` and `oneof` fields
(null when absent; a plain proto3 field absent is its default: 0, false, ""). Repeated fields,
maps, fields of message types and records of another message of the file are rejected with
`schema_not_supported`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from streaming.decode.formats.avro import AvroFormat, Node, Plan, RecordReader, UnsupportedSchema
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
_WIRE_TYPE = {
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
_FIELD = re.compile(
    r"^(optional\s+|repeated\s+|required\s+)?([A-Za-z_][\w.<>, ]*?)\s+([A-Za-z_]\w*)\s*=\s*(\d+)\s*(\[.*\])?$"
)


@dataclass
class ProtoPlan(Plan):
    numbers: dict[int, Node] = field(default_factory=dict)
    # Fields with presence (optional, oneof): null when absent; the others read as their default.
    optional: set[str] = field(default_factory=set)


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
        else:
            raise UnsupportedSchema(f"schema id {schema_id}: field {name!r} is a message ({proto_type}); not supported")
        node = Node(kind, name, logical=f"pb:{encoding}")
        leaves[name] = numbers[number] = node
        if label == "optional" or name in oneof_members:
            optional.add(name)
    return ProtoPlan(schema_id, Node("record", "", fields=list(leaves.values())), leaves, numbers, optional)


class ProtoReader(RecordReader):
    """Reads the messages of one schema, all at once."""

    plan: ProtoPlan

    def read(self) -> None:
        everyone = np.arange(len(self.pos))
        self._message_indexes(everyone)
        present = {name: np.zeros(len(self.pos), dtype=bool) for name in self.plan.leaves}
        while True:
            sel = np.flatnonzero(~self.bad & (self.pos < self.end))
            if sel.size == 0:
                break
            tag = self._varint(sel, "field tag", zigzag=False)
            ok = ~self.bad[sel]
            number, wire = tag >> 3, tag & 7
            zero = ok & (number < 1)
            self._fail(sel, zero, "field number 0")
            ok &= ~zero
            keys = number * 8 + wire
            for key in np.unique(keys[ok]):
                rows = sel[ok & (keys == key)]
                node = self.plan.numbers.get(int(key >> 3))
                if node is None:
                    self._skip(rows, int(key & 7), int(key >> 3))
                    continue
                encoding = node.logical.removeprefix("pb:")
                if int(key & 7) != _WIRE_TYPE[encoding]:
                    self._fail(
                        rows,
                        np.ones(rows.size, dtype=bool),
                        f"field {node.name!r}: wire type {int(key & 7)}, its type is written as {_WIRE_TYPE[encoding]}",
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

    def _skip(self, rows: np.ndarray, wire: int, number: int) -> None:
        what = f"field {number} (not in the schema)"
        if wire == 0:
            self._varint(rows, what, zigzag=False)
        elif wire in (1, 5):
            self._fixed(rows, 8 if wire == 1 else 4, what)
        elif wire == 2:
            length = self._varint(rows, what, zigzag=False)
            live = ~self.bad[rows]
            p = self.pos[rows]
            over = live & ((length < 0) | (p + length > self.end[rows]))
            self._fail(rows, over, f"{what}: a length of {length[over][:1]} bytes runs past the record's end")
            fine = live & ~over
            self.pos[rows[fine]] = p[fine] + length[fine]
        else:
            self._fail(rows, np.ones(rows.size, dtype=bool), f"{what}: wire type {wire} (groups) is not supported")

    def _value(self, node: Node, encoding: str, rows: np.ndarray) -> None:
        column = self.columns[node.name]
        what = f"field {node.name!r}"
        if encoding in ("varint", "zigzag"):
            value = self._varint(rows, what, zigzag=encoding == "zigzag")
            ok = ~self.bad[rows]
            column.values[rows[ok]] = value[ok] != 0 if node.kind == "boolean" else value[ok]
            column.valid[rows[ok]] = True
        elif encoding == "len":
            length = self._varint(rows, what, zigzag=False)
            ok = ~self.bad[rows]
            p = self.pos[rows]
            over = ok & ((length < 0) | (p + length > self.end[rows]))
            self._fail(rows, over, f"{what}: a length of {length[over][:1]} bytes runs past the record's end")
            ok &= ~over
            column.start[rows[ok]] = p[ok]
            column.length[rows[ok]] = length[ok]
            column.valid[rows[ok]] = True
            self.pos[rows[ok]] = p[ok] + length[ok]
        else:
            size = 8 if encoding in ("double", "fixed64", "sfixed64") else 4
            p, fits = self._fixed(rows, size, what)
            raw = np.ascontiguousarray(self.data[p[fits, None] + np.arange(size)])
            dtype = {
                "double": "<f8",
                "float": "<f4",
                "fixed64": "<u8",
                "sfixed64": "<i8",
                "fixed32": "<u4",
                "sfixed32": "<i4",
            }[encoding]
            column.values[rows[fits]] = raw.view(dtype).ravel()
            column.valid[rows[fits]] = True


class ProtobufFormat(AvroFormat):
    """Protobuf in the Confluent wire format, read with the schema the registry holds for its id."""

    names: ClassVar[tuple[str, ...]] = ("protobuf",)
    described: ClassVar[str] = "a Protobuf message in the Confluent wire format"
    schema_type: ClassVar[str] = "PROTOBUF"

    def compile(self, registered: RegisteredSchema) -> Plan:
        return compile_proto(registered.id, registered.text)

    def reader(self, plan: Plan, data: np.ndarray, start: np.ndarray, end: np.ndarray) -> RecordReader:
        return ProtoReader(plan, data, start, end)

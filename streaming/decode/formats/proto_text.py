""".proto text (what a schema registry holds for a Protobuf schema) as the protobuf runtime's
FileDescriptorProto, which it builds message classes from: the runtime reads no .proto text and
protoc is no dependency of the service.

Read: `syntax`, `package`, `import` (the well-known types' files, which the runtime carries, and the
schema's references, given by their import name), `option` (skipped), messages (nested too) with
their fields (`optional`, `required`, `repeated`, `map<K, V>`, `oneof`, field options skipped),
enums, `reserved` and `extensions` (skipped), services (skipped). Groups and extensions (`extend`)
are not read: such a schema raises ProtoSyntaxError naming where.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from google.protobuf import descriptor_pb2

F = descriptor_pb2.FieldDescriptorProto
SCALAR_TYPES = {
    "double": F.TYPE_DOUBLE,
    "float": F.TYPE_FLOAT,
    "int32": F.TYPE_INT32,
    "int64": F.TYPE_INT64,
    "uint32": F.TYPE_UINT32,
    "uint64": F.TYPE_UINT64,
    "sint32": F.TYPE_SINT32,
    "sint64": F.TYPE_SINT64,
    "fixed32": F.TYPE_FIXED32,
    "fixed64": F.TYPE_FIXED64,
    "sfixed32": F.TYPE_SFIXED32,
    "sfixed64": F.TYPE_SFIXED64,
    "bool": F.TYPE_BOOL,
    "string": F.TYPE_STRING,
    "bytes": F.TYPE_BYTES,
}
_TOKEN = re.compile(
    r"""\s+|//[^\n]*|/\*.*?\*/|(?P<t>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[A-Za-z_][\w.]*|\.[A-Za-z_][\w.]*|[-+]?\d[\w.+-]*|.)""",
    re.S,
)


class ProtoSyntaxError(ValueError):
    """.proto text this reader does not read."""


class _Tokens:
    def __init__(self, text: str):
        self.items = [m.group("t") for m in _TOKEN.finditer(text) if m.group("t")]
        self.i = 0

    def peek(self) -> str:
        return self.items[self.i] if self.i < len(self.items) else ""

    def next(self) -> str:
        token = self.peek()
        if not token:
            raise ProtoSyntaxError("the text ends inside a definition")
        self.i += 1
        return token

    def expect(self, token: str) -> None:
        got = self.next()
        if got != token:
            raise ProtoSyntaxError(f"expected {token!r}, got {got!r} (token {self.i})")

    def skip_statement(self) -> None:
        """To the `;` ending a statement, over any bracketed option values."""
        depth = 0
        while True:
            token = self.next()
            depth += token in "[{(" and len(token) == 1
            depth -= token in "]})" and len(token) == 1
            if token == ";" and depth <= 0:
                return
            if token == "}" and depth == 0:
                return


def parse_proto(text: str, name: str = "schema.proto") -> descriptor_pb2.FileDescriptorProto:
    """The file descriptor of .proto text; raises ProtoSyntaxError."""
    tokens = _Tokens(text)
    fdp = descriptor_pb2.FileDescriptorProto(name=name, syntax="proto2")
    while tokens.peek():
        word = tokens.next()
        if word == "syntax" or word == "edition":
            tokens.expect("=")
            fdp.syntax = tokens.next().strip("\"'")
            tokens.expect(";")
        elif word == "package":
            fdp.package = tokens.next()
            tokens.expect(";")
        elif word == "import":
            path = tokens.next()
            if path in ("public", "weak"):
                path = tokens.next()
            fdp.dependency.append(path.strip("\"'"))
            tokens.expect(";")
        elif word == "option":
            tokens.skip_statement()
        elif word == "message":
            _message(tokens, fdp.message_type.add(), fdp.syntax)
        elif word == "enum":
            _enum(tokens, fdp.enum_type.add())
        elif word == "service":
            tokens.next()
            _skip_block(tokens)
        elif word == ";":
            continue
        else:
            raise ProtoSyntaxError(f"cannot read {word!r} at the top of the file")
    if fdp.syntax == "proto2":
        fdp.ClearField("syntax")
    return _with_synthetic_oneofs(fdp)


def _skip_block(tokens: _Tokens) -> None:
    tokens.expect("{")
    depth = 1
    while depth:
        token = tokens.next()
        depth += {"{": 1, "}": -1}.get(token, 0)


def _enum(tokens: _Tokens, enum: descriptor_pb2.EnumDescriptorProto) -> None:
    enum.name = tokens.next()
    tokens.expect("{")
    while (token := tokens.next()) != "}":
        if token in ("option", "reserved"):
            tokens.skip_statement()
        elif token == ";":
            continue
        else:
            tokens.expect("=")
            number = int(tokens.next(), 0)
            enum.value.add(name=token, number=number)
            if tokens.peek() == "[":
                tokens.skip_statement()
            else:
                tokens.expect(";")


def _message(tokens: _Tokens, message: descriptor_pb2.DescriptorProto, syntax: str) -> None:
    message.name = tokens.next()
    tokens.expect("{")
    _members(tokens, message, syntax, oneof=None)


def _members(tokens: _Tokens, message: descriptor_pb2.DescriptorProto, syntax: str, oneof: int | None) -> None:
    while (token := tokens.next()) != "}":
        if token in ("option", "reserved", "extensions"):
            tokens.skip_statement()
        elif token == ";":
            continue
        elif token == "message":
            _message(tokens, message.nested_type.add(), syntax)
        elif token == "enum":
            _enum(tokens, message.enum_type.add())
        elif token == "oneof":
            message.oneof_decl.add(name=tokens.next())
            tokens.expect("{")
            _members(tokens, message, syntax, oneof=len(message.oneof_decl) - 1)
        elif token in ("extend", "group"):
            raise ProtoSyntaxError(f"message {message.name}: {token} is not read")
        else:
            _field(tokens, token, message, syntax, oneof)


def _field(
    tokens: _Tokens, first: str, message: descriptor_pb2.DescriptorProto, syntax: str, oneof: int | None
) -> None:
    label = F.LABEL_OPTIONAL
    explicit_optional = False
    type_name = first
    if first in ("optional", "required", "repeated"):
        label = {"optional": F.LABEL_OPTIONAL, "required": F.LABEL_REQUIRED, "repeated": F.LABEL_REPEATED}[first]
        explicit_optional = first == "optional"
        type_name = tokens.next()
    if type_name == "map":
        tokens.expect("<")
        key = tokens.next()
        tokens.expect(",")
        value = tokens.next()
        tokens.expect(">")
        name = tokens.next()
        entry = message.nested_type.add(name="".join(p.capitalize() for p in name.split("_")) + "Entry")
        entry.options.map_entry = True
        _typed(entry.field.add(name="key", number=1, label=F.LABEL_OPTIONAL), key)
        _typed(entry.field.add(name="value", number=2, label=F.LABEL_OPTIONAL), value)
        field = message.field.add(name=name, label=F.LABEL_REPEATED, type=F.TYPE_MESSAGE)
        field.type_name = entry.name
    else:
        name = tokens.next()
        field = message.field.add(name=name, label=label)
        _typed(field, type_name)
    tokens.expect("=")
    field.number = int(tokens.next(), 0)
    if tokens.peek() == "[":
        tokens.skip_statement()
    else:
        tokens.expect(";")
    if oneof is not None:
        field.oneof_index = oneof
    elif explicit_optional and syntax == "proto3":
        # proto3 `optional`: a synthetic oneof of its own, after the real ones (as protoc writes it).
        field.proto3_optional = True


def _typed(field: descriptor_pb2.FieldDescriptorProto, type_name: str) -> None:
    if type_name in SCALAR_TYPES:
        field.type = SCALAR_TYPES[type_name]
    else:
        field.type_name = type_name  # a message or an enum: the pool resolves which, in scope


def _with_synthetic_oneofs(fdp: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """proto3 `optional` fields each in a oneof of their own, declared after the real oneofs."""
    for message in _messages(fdp.message_type):
        for field in message.field:
            if field.proto3_optional:
                message.oneof_decl.add(name=f"_{field.name}")
                field.oneof_index = len(message.oneof_decl) - 1
    return fdp


def _messages(messages) -> Iterator[descriptor_pb2.DescriptorProto]:
    for message in messages:
        yield message
        yield from _messages(message.nested_type)

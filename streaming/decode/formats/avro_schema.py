"""Avro writer schemas compiled to reading plans, one per schema id: which reader reads a schema
(the flat columnar one, the nested one or fastavro's, streaming/decode/formats/avro.py), what each
field is read as, and the types schema evolution sees in it (`nested_field_kinds`, `declared_kind`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import fastavro
import pyarrow as pa

from streaming.contract.types import spelling_of_arrow
from streaming.decode.formats.avro_nested import RecursiveSchema, Shape, shape_of

_PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")


class UnsupportedSchema(ValueError):
    """A schema this reader does not read (the records are rejected, not misread)."""


class BeyondColumnar(UnsupportedSchema):
    """A schema the columnar reader does not read, but the general one does (GeneralPlan)."""


# Logical types the columnar reader reads as what they stand for; it reads the others (decimal,
# date, time-*, uuid, local-timestamp-*, ...) as their underlying type (what the Debezium format's
# envelopes want: streaming/decode/formats/debezium_avro.py), so a column that reads one sends its
# schema to the general reader.
_COLUMNAR_LOGICAL = ("", "timestamp-millis", "timestamp-micros")


@dataclass
class Node:
    """One type of a compiled schema."""

    kind: str  # a primitive name, "record", "enum", "fixed", "union" or "nested" (an array or map)
    name: str = ""  # the column a leaf fills ("a.b" for field b of record field a)
    fields: list[Node] = field(default_factory=list)  # record: its fields' types, in order
    branches: list[Node] = field(default_factory=list)  # union
    symbols: list[str] = field(default_factory=list)  # enum
    size: int = 0  # fixed
    logical: str = ""
    # What Kafka Connect's Avro converters note of the Connect type: its name ("connect.name", e.g.
    # io.debezium.time.Date) and a decimal's scale.
    connect_name: str = ""
    scale: int | None = None
    precision: int | None = None  # a decimal's
    shape: Shape | None = None  # "nested": what the nested reader reads


@dataclass
class Plan:
    schema_id: int
    root: Node
    leaves: dict[str, Node]  # column name -> its leaf node


def compile_schema(schema_id: int, text: str, references: Sequence[str] = (), nested: bool = False) -> Plan:
    """A reading plan of an Avro schema (JSON text), the types it names from the schemas it refers
    to (`references`, each after those it uses); raises UnsupportedSchema. An array or map field
    is a leaf read whole by the nested reader's steps if `nested`, else raises BeyondColumnar."""
    try:
        raw = json.loads(text)
        referred = [json.loads(r) for r in references]
    except ValueError as exc:
        raise UnsupportedSchema(f"schema id {schema_id} is not Avro schema JSON: {exc}") from None
    named: dict[str, Any] = {}
    for schema in referred:
        _compile(schema, "", named, {}, None, nested)
    leaves: dict[str, Node] = {}
    root = _compile(raw, "", named, leaves, None, nested)
    if root.kind != "record":
        raise UnsupportedSchema(f"schema id {schema_id} is a {root.kind}, not a record")
    return Plan(schema_id, root, leaves)


def _compile(
    raw: Any, name: str, named: dict[str, Any], leaves: dict[str, Node], namespace: str | None, nested: bool
) -> Node:
    if isinstance(raw, list):
        branches = [_compile(b, name, named, {}, namespace, nested) for b in raw]
        others = [b for b in branches if b.kind != "null"]
        if len(others) > 1:
            if not nested:
                raise BeyondColumnar(f"field {name!r}: a union of several non-null types")
            leaves[name] = _nested_leaf(raw, name, named, "union of several non-null types")
            return leaves[name]
        if others and others[0].kind in ("record",):
            # The branch's own leaves are those of the field.
            branches = [
                _compile(b, name, named, leaves, namespace, nested) if b != "null" else Node("null") for b in raw
            ]
        elif others:
            leaves[name] = others[0]
        return Node("union", name, branches=branches)
    if isinstance(raw, str):
        if raw in _PRIMITIVES:
            node = Node(raw, name)
            if raw != "null":
                leaves[name] = node
            return node
        full = raw if "." in raw or namespace is None else f"{namespace}.{raw}"
        target = named.get(full, named.get(raw))
        if target is None:
            raise UnsupportedSchema(f"field {name!r}: unknown type name {raw!r}")
        return _compile(target, name, named, leaves, namespace, nested)
    if not isinstance(raw, dict) or "type" not in raw:
        raise UnsupportedSchema(f"field {name!r}: {str(raw)[:80]!r} is not an Avro type")
    kind = raw["type"]
    if isinstance(kind, dict | list):
        return _compile(kind, name, named, leaves, namespace, nested)
    space = raw.get("namespace", namespace)
    if kind in ("record", "error", "enum", "fixed") and "name" in raw:
        type_name = raw["name"] if "." in raw["name"] or space is None else f"{space}.{raw['name']}"
        named[type_name] = raw
        named[raw["name"]] = raw
    if kind in ("record", "error"):
        fields = raw.get("fields")
        if not isinstance(fields, list):
            raise UnsupportedSchema(f"record {raw.get('name')!r} has no fields list")
        prefix = f"{name}." if name else ""
        return Node(
            "record",
            name,
            fields=[_compile(f["type"], f"{prefix}{f['name']}", named, leaves, space, nested) for f in fields],
        )
    if kind == "enum":
        node = Node("enum", name, symbols=[str(s) for s in raw.get("symbols", [])])
    elif kind == "fixed":
        node = Node("fixed", name, size=int(raw.get("size", 0)), logical=str(raw.get("logicalType", "")))
    elif kind in _PRIMITIVES:
        parameters = raw.get("connect.parameters") or {}
        scale = raw.get("scale", parameters.get("scale") if isinstance(parameters, dict) else None)
        node = Node(
            kind,
            name,
            logical=str(raw.get("logicalType", "")),
            connect_name=str(raw.get("connect.name", "")),
            scale=_digits(scale),
            precision=_digits(raw.get("precision")),
        )
    elif kind in ("array", "map"):
        if not nested:
            raise BeyondColumnar(f"field {name!r}: an Avro {kind}")
        node = _nested_leaf(raw, name, named, kind)
    else:
        raise UnsupportedSchema(f"field {name!r}: unknown Avro type {kind!r}")
    if node.kind != "null":
        leaves[name] = node
    return node


def _digits(value: Any) -> int | None:
    return int(value) if isinstance(value, int | str) and str(value).isdigit() else None


def _nested_leaf(raw: Any, name: str, named: dict[str, Any], what: str) -> Node:
    """A field the nested reader's steps read whole (an array, a map, a union of several types)."""
    try:
        return Node("nested", name, shape=shape_of(raw, named))
    except RecursiveSchema:
        raise BeyondColumnar(f"field {name!r}: an Avro {what} of a type that holds itself") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedSchema(f"field {name!r}: an Avro {what} of no type read here ({exc})") from None


@dataclass
class GeneralPlan(Plan):
    """A schema the general reader reads: fastavro's parse of it; `leaves` names every field that is
    not a record (its kind the Avro type's: "array", "map", "union", ...), `paths` every field."""

    parsed: Any = None
    paths: frozenset[str] = frozenset()


def compile_avro(
    schema_id: int, text: str, references: Sequence[str], wanted: dict[str, pa.DataType], general: bool = True
) -> Plan:
    """The plan of a writer schema: the columnar reader's when it reads the schema and every field
    in `wanted` (the contract's `properties.<field>` sources, and their column types) is one of its
    leaves, of no logical type it reads as its underlying type into a column of the type the logical
    type stands for; else the general reader's. Without `general` (a Debezium envelope), always the
    columnar reader's, its arrays and maps read whole as leaves. Raises UnsupportedSchema for what
    is no Avro record schema at all."""
    try:
        plan = compile_schema(schema_id, text, references, nested=not general)
    except BeyondColumnar:
        if not general:
            raise
        return general_plan(schema_id, text, references)
    if not general:
        return plan
    for name, target in wanted.items():
        leaf = plan.leaves.get(name)
        if leaf is None and any(other.startswith(f"{name}.") for other in plan.leaves):
            return general_plan(schema_id, text, references)  # a record field as a struct column
        if leaf is not None and leaf.logical not in _COLUMNAR_LOGICAL and not _takes_underlying(target):
            return general_plan(schema_id, text, references)  # a decimal, date, time, uuid column
    return plan


def _takes_underlying(target: pa.DataType) -> bool:
    """Whether a column of `target` takes a logical type's underlying value (a date's day number
    into a long column, a UUID's text into a string column), as the columnar reader gives it and as
    contracts written before the general reader read them."""
    return any(
        test(target) for test in (pa.types.is_integer, pa.types.is_floating, pa.types.is_string, pa.types.is_binary)
    )


@dataclass
class NestedPlan(GeneralPlan):
    """A schema the nested columnar reader reads (streaming/decode/formats/avro_nested.py): every
    one without recursion."""

    shape: Shape = field(default_factory=lambda: Shape("record", pa.struct([])))


def general_plan(schema_id: int, text: str, references: Sequence[str] = ()) -> GeneralPlan:
    """The plan of an Avro schema (JSON text) the flat reader does not read: the nested columnar
    reader's, or for a recursive schema fastavro's; raises UnsupportedSchema."""
    try:
        raw = json.loads(text)
        referred = [json.loads(r) for r in references]
        named: dict[str, Any] = {}
        for schema in referred:
            fastavro.parse_schema(schema, named_schemas=named)
        parsed = fastavro.parse_schema(raw, named_schemas=named)
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise UnsupportedSchema(f"schema id {schema_id} is not an Avro schema fastavro reads: {exc}") from None
    if not (isinstance(parsed, dict) and parsed.get("type") in ("record", "error")):
        raise UnsupportedSchema(f"schema id {schema_id} is not a record")
    leaves: dict[str, Node] = {}
    paths: set[str] = set()
    _general_fields(parsed, "", named, leaves, paths)
    try:
        shape = shape_of(parsed, named)
    except RecursiveSchema:
        return GeneralPlan(schema_id, Node("record"), leaves, parsed=parsed, paths=frozenset(paths))
    return NestedPlan(schema_id, Node("record"), leaves, parsed=parsed, paths=frozenset(paths), shape=shape)


def nested_field_kinds(
    schema_id: int, text: str, references: Sequence[str] = (), whole: GeneralPlan | None = None
) -> dict[str, str]:
    """The type of each field of a writer schema's record that is a record, an array or a map
    (optional or not), as schema evolution spells a struct, list or map column (PropertySeen's
    kind); NESTED for one no column type holds (a union of several types inside). Empty for a
    schema of no shape the nested reader knows (a recursive one). `whole`: the schema's general
    plan when one is at hand."""
    # Here, not at the top: streaming.decode.properties imports the formats package.
    from streaming.decode.properties import NESTED, kind_of_spelling

    if whole is None:
        try:
            whole = general_plan(schema_id, text, references)
        except UnsupportedSchema:
            return {}
    kinds = {}
    for name, shape in whole.shape.fields if isinstance(whole, NestedPlan) else ():
        if pa.types.is_nested(shape.arrow):
            spelling = spelling_of_arrow(shape.arrow)
            kinds[name] = NESTED if spelling is None else kind_of_spelling(spelling)
    return kinds


def _general_fields(raw: Any, name: str, named: dict[str, Any], leaves: dict[str, Node], paths: set[str]) -> None:
    """The field paths of a parsed schema (a record's fields `record.field`, an optional record's too)."""
    if isinstance(raw, str):
        raw = named.get(raw, raw)
    if isinstance(raw, list):
        others = [b for b in raw if b != "null"]
        if len(others) == 1:
            _general_fields(others[0], name, named, leaves, paths)
        elif name:
            leaves[name] = Node("union", name)
        return
    kind = raw.get("type") if isinstance(raw, dict) else raw
    if kind in ("record", "error"):
        if name:
            paths.add(name)
        prefix = f"{name}." if name else ""
        for f in raw["fields"]:
            paths.add(f"{prefix}{f['name']}")
            _general_fields(f["type"], f"{prefix}{f['name']}", named, leaves, paths)
        return
    if isinstance(kind, dict | list):
        _general_fields(kind, name, named, leaves, paths)
    elif name:
        logical = raw.get("logicalType", "") if isinstance(raw, dict) else ""
        # A logical type's value is no Python int, float or str here: schema evolution adds no column of it.
        leaves[name] = Node(
            f"{kind} ({logical})" if logical else str(kind),
            name,
            logical=str(logical),
            scale=_digits(raw.get("scale")) if logical else None,
            precision=_digits(raw.get("precision")) if logical else None,
        )


def declared_kind(node: Node, integer_widths: bool = True) -> str | None:
    """The type a writer schema declares for a leaf, as a column type is spelt, where a column of a
    narrower type could be widened to it (int, long, float, double, decimal(P, S)); integers only
    where the schema's kinds tell int from long (`integer_widths`)."""
    if node.kind in ("float", "double") or (integer_widths and node.kind in ("int", "long")):
        return node.kind if node.logical in ("", "pb:double", "pb:float") else None
    if node.logical == "decimal" and node.precision is not None:
        return f"decimal({node.precision}, {node.scale or 0})"
    return None


# The column type of an Avro leaf, as schema evolution names them (streaming/decode/properties.py).
EVOLVED_KIND = {
    "boolean": "boolean",
    "int": "long",
    "long": "long",
    "float": "double",
    "double": "double",
    "string": "string",
    "enum": "string",
}

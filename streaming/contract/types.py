"""The column types a contract names: every type an Iceberg v2 table holds, spelt as Iceberg spells
them in a table's metadata.

Primitives by name: `string`, `int`, `long`, `float`, `double`, `boolean`, `date`, `time`,
`timestamp` (no zone), `timestamptz`, `uuid`, `binary`, `decimal(P, S)` and `fixed[N]`. Nested
ones as objects:

    {"type": "struct", "fields": [{"name": "id", "type": "long", "required": true}, ...]}
    {"type": "list", "element": "string", "element-required": false}
    {"type": "map", "key": "string", "value": "double", "value-required": false}

nested as deep as wanted. A nested field's id (`id`, `element-id`, `key-id`, `value-id`) may be
given; those left out are assigned as Iceberg assigns a new table's: after every top-level field,
each struct's fields before what they hold, in declaration order (pyiceberg's assign_fresh_schema_ids).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from streaming.contract.terms import ContractError

PRIMITIVE_TYPES: dict[str, PrimitiveType] = {
    "string": StringType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "boolean": BooleanType(),
    "date": DateType(),
    "time": TimeType(),
    "timestamp": TimestampType(),
    "timestamptz": TimestamptzType(),
    "uuid": UUIDType(),
    # Bytes as they come, e.g. a Kafka key that is no text: an upsert table's primary key.
    "binary": BinaryType(),
}
NESTED_KINDS = ("struct", "list", "map")
_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")
_FIXED = re.compile(r"fixed\[\s*(\d+)\s*\]")
MAX_DECIMAL_PRECISION = 38
_KEYS = {
    "struct": ("type", "fields", "doc"),
    "list": ("type", "element", "element-id", "element-required"),
    "map": ("type", "key", "key-id", "value", "value-id", "value-required"),
    "field": ("id", "name", "type", "required", "doc"),
}
_SHOWN = ", ".join([*PRIMITIVE_TYPES, "decimal(P, S)", "fixed[N]", *(f"{{type: {k}}}" for k in NESTED_KINDS)])


def primitive_type(name: str) -> PrimitiveType | None:
    """The primitive type a name spells (`decimal(12, 2)` and `decimal(12,2)` alike), else None."""
    if name in PRIMITIVE_TYPES:
        return PRIMITIVE_TYPES[name]
    if (match := _DECIMAL.fullmatch(name)) is not None:
        precision, scale = int(match.group(1)), int(match.group(2))
        if 1 <= precision <= MAX_DECIMAL_PRECISION and scale <= precision:
            return DecimalType(precision, scale)
    if (match := _FIXED.fullmatch(name)) is not None and int(match.group(1)) >= 1:
        return FixedType(int(match.group(1)))
    return None


def type_name(kind: IcebergType) -> str:
    """The name a contract gives a type: a primitive's Iceberg name, or struct, list or map."""
    if isinstance(kind, StructType):
        return "struct"
    if isinstance(kind, ListType):
        return "list"
    if isinstance(kind, MapType):
        return "map"
    return str(kind)


def parse_type(raw: Any, where: str, unassigned: Iterator[int]) -> IcebergType:
    """The type `raw` spells; nested ids it leaves out are taken from `unassigned` (negative
    placeholders that `assign_ids` replaces). Errors name the path (`columns[3].type.fields[1]`)."""
    if isinstance(raw, str):
        kind = primitive_type(raw)
        if kind is None:
            raise ContractError(f"{where}: {raw!r} is not a column type; expected one of {_SHOWN}")
        return kind
    if not isinstance(raw, dict):
        raise ContractError(f"{where}: expected a type name or a struct, list or map object, got {raw!r}")
    nested = raw.get("type")
    if nested not in NESTED_KINDS:
        raise ContractError(f"{where}.type: {nested!r} is not one of {list(NESTED_KINDS)}")
    for key in raw:
        if key not in _KEYS[nested]:
            raise ContractError(f"{where}.{key}: not a key of a {nested}; expected one of {', '.join(_KEYS[nested])}")
    if nested == "struct":
        return _parse_struct(raw, where, unassigned)
    if nested == "list":
        element_id = _nested_id(raw, "element-id", where, unassigned)
        return ListType(
            element_id=element_id,
            element=parse_type(_require(raw, "element", where), f"{where}.element", unassigned),
            element_required=_flag(raw, "element-required", where),
        )
    key_id = _nested_id(raw, "key-id", where, unassigned)
    value_id = _nested_id(raw, "value-id", where, unassigned)
    return MapType(
        key_id=key_id,
        key_type=parse_type(_require(raw, "key", where), f"{where}.key", unassigned),
        value_id=value_id,
        value_type=parse_type(_require(raw, "value", where), f"{where}.value", unassigned),
        value_required=_flag(raw, "value-required", where),
    )


def _parse_struct(raw: dict, where: str, unassigned: Iterator[int]) -> StructType:
    fields = raw.get("fields")
    if not isinstance(fields, list) or not fields:
        raise ContractError(f"{where}.fields: a struct needs a list of at least one field")
    parsed: list[NestedField] = []
    for i, field in enumerate(fields):
        here = f"{where}.fields[{i}]"
        if not isinstance(field, dict):
            raise ContractError(f"{here}: expected an object with a name and a type")
        for key in field:
            if key not in _KEYS["field"]:
                raise ContractError(
                    f"{here}.{key}: not a key of a struct field; expected one of id, name, type, required"
                )
        name = _require(field, "name", here)
        if not isinstance(name, str) or not name or "." in name:
            raise ContractError(f"{here}.name: expected a name without dots, got {name!r}")
        if any(f.name == name for f in parsed):
            raise ContractError(f"{here}.name: {name!r} is the name of another field of this struct")
        field_id = _nested_id(field, "id", here, unassigned)
        parsed.append(
            NestedField(
                field_id=field_id,
                name=name,
                field_type=parse_type(_require(field, "type", here), f"{here}.type", unassigned),
                required=_flag(field, "required", here),
                doc=field.get("doc"),
            )
        )
    return StructType(*parsed)


def _require(raw: dict, key: str, where: str) -> Any:
    if key not in raw:
        raise ContractError(f"{where}.{key}: missing")
    return raw[key]


def _flag(raw: dict, key: str, where: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise ContractError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def _nested_id(raw: dict, key: str, where: str, unassigned: Iterator[int]) -> int:
    if key not in raw:
        return next(unassigned)
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ContractError(f"{where}.{key}: expected a positive whole number, got {value!r}")
    return value


def placeholders() -> Iterator[int]:
    """Ids for the nested fields a contract leaves unnumbered, until `assign_ids` numbers them."""
    return itertools.count(-1, -1)


def nested_fields(kind: IcebergType) -> Iterator[tuple[int, str]]:
    """(id, path below the column) of every field `kind` holds, in Iceberg's pre-order."""
    if isinstance(kind, StructType):
        for field in kind.fields:
            yield field.field_id, field.name
        for field in kind.fields:
            for fid, path in nested_fields(field.field_type):
                yield fid, f"{field.name}.{path}"
    elif isinstance(kind, ListType):
        yield kind.element_id, "element"
        for fid, path in nested_fields(kind.element_type):
            yield fid, f"element.{path}"
    elif isinstance(kind, MapType):
        yield kind.key_id, "key"
        yield kind.value_id, "value"
        for fid, path in nested_fields(kind.key_type):
            yield fid, f"key.{path}"
        for fid, path in nested_fields(kind.value_type):
            yield fid, f"value.{path}"


def assign_ids(kind: IcebergType, next_id: Callable[[], int]) -> IcebergType:
    """`kind` with its placeholder (negative) ids numbered by `next_id`, in Iceberg's order:
    a struct's fields first, then what each holds."""
    if isinstance(kind, StructType):
        ids = [f.field_id if f.field_id > 0 else next_id() for f in kind.fields]
        return StructType(
            *(
                NestedField(fid, f.name, assign_ids(f.field_type, next_id), required=f.required, doc=f.doc)
                for fid, f in zip(ids, kind.fields, strict=True)
            )
        )
    if isinstance(kind, ListType):
        element_id = kind.element_id if kind.element_id > 0 else next_id()
        return ListType(element_id, assign_ids(kind.element_type, next_id), element_required=kind.element_required)
    if isinstance(kind, MapType):
        key_id = kind.key_id if kind.key_id > 0 else next_id()
        value_id = kind.value_id if kind.value_id > 0 else next_id()
        return MapType(
            key_id,
            assign_ids(kind.key_type, next_id),
            value_id,
            assign_ids(kind.value_type, next_id),
            value_required=kind.value_required,
        )
    return kind


def type_spelling(kind: IcebergType) -> Any:
    """How a contract spells `kind`, ids included: the inverse of parse_type."""
    if isinstance(kind, StructType):
        return {
            "type": "struct",
            "fields": [
                {"id": f.field_id, "name": f.name, "type": type_spelling(f.field_type), "required": f.required}
                for f in kind.fields
            ],
        }
    if isinstance(kind, ListType):
        return {
            "type": "list",
            "element-id": kind.element_id,
            "element": type_spelling(kind.element_type),
            "element-required": kind.element_required,
        }
    if isinstance(kind, MapType):
        return {
            "type": "map",
            "key-id": kind.key_id,
            "key": type_spelling(kind.key_type),
            "value-id": kind.value_id,
            "value": type_spelling(kind.value_type),
            "value-required": kind.value_required,
        }
    return str(kind)


def promotes(wider: IcebergType, kind: IcebergType) -> bool:
    """Whether Iceberg's rules let a column of `kind` become `wider` (int to long, float to double,
    a decimal's precision up at the same scale)."""
    if isinstance(kind, IntegerType):
        return isinstance(wider, LongType)
    if isinstance(kind, FloatType):
        return isinstance(wider, DoubleType)
    if isinstance(kind, DecimalType) and isinstance(wider, DecimalType):
        return wider.scale == kind.scale and wider.precision > kind.precision
    return False


def grown_from(grown: IcebergType, kind: IcebergType) -> bool:
    """Whether `grown` is `kind` with optional struct members added (in a list's element and a
    map's value too) or a primitive widened by Iceberg's rules (at ingest, as the values held
    them), at any depth: a table's column that a
    contract without those changes still fits."""
    if grown == kind or promotes(grown, kind):
        return True
    if isinstance(grown, ListType) and isinstance(kind, ListType):
        return (grown.element_id, grown.element_required) == (kind.element_id, kind.element_required) and grown_from(
            grown.element_type, kind.element_type
        )
    if isinstance(grown, MapType) and isinstance(kind, MapType):
        return (grown.key_id, grown.key_type, grown.value_id, grown.value_required) == (
            kind.key_id,
            kind.key_type,
            kind.value_id,
            kind.value_required,
        ) and grown_from(grown.value_type, kind.value_type)
    if not isinstance(grown, StructType) or not isinstance(kind, StructType):
        return False
    by_id = {f.field_id: f for f in grown.fields}
    for field in kind.fields:
        match = by_id.pop(field.field_id, None)
        if match is None or match.name != field.name or match.required != field.required:
            return False
        if not grown_from(match.field_type, field.field_type):
            return False
    return all(not f.required for f in by_id.values())


def spelling_of_arrow(t: pa.DataType) -> Any:
    """The contract's spelling of the column type that holds values of Arrow type `t`, as schema
    evolution gives a new column (whole numbers as `long`, fractions as `double`, as for JSON);
    None for a type no column holds (a union of several types, a null)."""
    if pa.types.is_struct(t):
        members = [(f.name, spelling_of_arrow(f.type)) for f in t]
        if not members or any(kind is None or name.startswith("union.branch.") for name, kind in members):
            return None
        return {"type": "struct", "fields": [{"name": name, "type": kind} for name, kind in members]}
    if pa.types.is_map(t):
        value = spelling_of_arrow(t.item_type)
        return None if value is None else {"type": "map", "key": "string", "value": value}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        element = spelling_of_arrow(t.value_type)
        return None if element is None else {"type": "list", "element": element}
    if pa.types.is_decimal(t):
        return f"decimal({t.precision}, {t.scale})"
    if pa.types.is_fixed_size_binary(t):
        return f"fixed[{t.byte_width}]"
    if pa.types.is_timestamp(t):
        return "timestamptz" if t.tz is not None else "timestamp"
    for test, spelling in _ARROW_SPELLINGS:
        if test(t):
            return spelling
    return None


_ARROW_SPELLINGS = (
    (pa.types.is_boolean, "boolean"),
    (pa.types.is_integer, "long"),
    (pa.types.is_floating, "double"),
    (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "string"),
    (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), "binary"),
    (pa.types.is_date, "date"),
    (pa.types.is_time, "time"),
)


# -- the Arrow side -----------------------------------------------------------------------------------
def arrow_type_holds(kind: pa.DataType, test: Callable[[pa.DataType], bool]) -> bool:
    """Whether `kind`, or a type anywhere inside it (a member, an element, a map's value), passes `test`."""
    if test(kind):
        return True
    if pa.types.is_struct(kind):
        return any(arrow_type_holds(f.type, test) for f in kind)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return arrow_type_holds(kind.value_type, test)
    if pa.types.is_map(kind):
        return arrow_type_holds(kind.item_type, test)
    return False


def _regular_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_regular_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(
            t.key_field.with_type(_regular_type(t.key_type)), t.item_field.with_type(_regular_type(t.item_type))
        )
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_regular_type(t.value_type)))
    return t


def transport_type(t: pa.DataType) -> pa.DataType:
    """The type a column's values have between the decoder and the writer: Spark's Arrow exchange
    takes no time of day, UUID or fixed-size binary, so they travel as microseconds and bytes."""
    if pa.types.is_time(t):
        return pa.int64()
    if isinstance(t, pa.BaseExtensionType):
        return transport_type(t.storage_type)
    if pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(transport_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(
            t.key_field.with_type(transport_type(t.key_type)), t.item_field.with_type(transport_type(t.item_type))
        )
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(transport_type(t.value_type)))
    return t


def regular_types(schema: pa.Schema) -> pa.Schema:
    """The schema with Arrow's regular string and binary types where it has the large ones."""
    return pa.schema([f.with_type(_regular_type(f.type)) for f in schema], metadata=schema.metadata)

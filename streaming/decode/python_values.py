"""Python values as an Arrow array of a column's data-file type, nested or not: what the general
readers of registry-encoded records (fastavro's records, Protobuf messages walked to dicts) hand
over, converted value by value, checking each against the type and naming the path of every value
that does not fit (`properties.reading[3].value: expected double, got 'n/a'`).

What a value may be, per type (the types a record's reader gives, and the lossless ones beside):

- struct: a dict (an Avro record, a Protobuf message); members by name, others ignored; a required
  member missing or null is a problem;
- list: a list or tuple; map: a dict (its keys of the map's key type) or a list of (key, value) pairs;
- string: a str (an enum's name), a UUID (its canonical text), or an integer (its digits); boolean: a bool;
- int / long: an int (not a bool) in range, a whole float, or an enum value's number (NamedNumber);
  float / double: an int, a float or a bool (0.0 / 1.0);
- decimal(P, S): a Decimal or an int whose digits fit P and S (none dropped);
- date: a date, or a datetime's wall-clock day; time: a time (its time zone, if any, dropped);
- timestamptz: a datetime; one without a time zone is taken as UTC;
  timestamp: a datetime without a time zone, or one with, as its UTC wall-clock time;
- uuid: a UUID, its canonical text, or 16 bytes;
- binary: bytes, or a str's UTF-8 bytes; fixed[N]: bytes of length N.

These are the conversions pyarrow makes of Python values, so a batch converts alike whether it is
built in one call or value by value.
"""

from __future__ import annotations

import datetime
import decimal
import math
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from streaming.decode.json_values import ValueProblem, _described, is_uuid
from streaming.decode.rejects import shown

# (the index of the value in the input, what is wrong with it, path first)
Problem = tuple[int, str]

_UTC = datetime.UTC


class NamedNumber(str):
    """An enum value: its name, which a string column takes, and its number, which an integer
    column takes (a Protobuf enum; columns of either type read them)."""

    number: int

    def __new__(cls, name: str, number: int) -> NamedNumber:
        named = super().__new__(cls, name)
        named.number = number
        return named


def to_arrow(values: Sequence[Any], kind: pa.DataType, path: str) -> tuple[pa.Array, list[Problem]]:
    """`values` as an array of `kind`: a value that does not fit is null, and a problem naming its
    index and the path of its part that does not fit (the first such part).

    pyarrow's own conversion builds the array in one call where every value fits (it checks types,
    ranges, decimal digits and fixed sizes as `coerce` does, in C); only a batch holding a value it
    refuses, a UUID, or a required member left null is converted value by value, which names the path
    of each value that does not fit."""
    build = _fast_type(kind)
    if build is not None:
        try:
            array = pa.array(_uuid_bytes(values) if is_uuid(kind) else values, build)
            array = array if build == kind else array.cast(kind)  # safe: an integer out of range raises
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            pass
        else:
            if not _required_left_null(array):
                return array, []
    return _one_by_one(values, kind, path)


def _fast_type(kind: pa.DataType) -> pa.DataType | None:
    """The type pyarrow builds `kind` from Python values as: an integer as decimal128(38, 0), since
    pyarrow builds an integer from a float by truncating it (2.5 -> 2) but a decimal from a float not
    at all; a top-level UUID as its 16 bytes. None: no such type (a UUID in a nested type)."""
    if is_uuid(kind):
        return pa.binary(16)
    if pa.types.is_integer(kind):
        return pa.decimal128(38, 0)
    if pa.types.is_struct(kind):
        fields = [(f, _fast_type(f.type)) for f in kind]
        if any(t is None or is_uuid(f.type) for f, t in fields):
            return None
        return pa.struct([f.with_type(t) for f, t in fields])
    if pa.types.is_map(kind):
        key, item = _fast_type(kind.key_type), _fast_type(kind.item_type)
        if key is None or item is None or is_uuid(kind.key_type) or is_uuid(kind.item_type):
            return None
        return pa.map_(kind.key_field.with_type(key), kind.item_field.with_type(item))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        element = _fast_type(kind.value_type)
        if element is None or is_uuid(kind.value_type):
            return None
        return pa.list_(kind.value_field.with_type(element))
    return kind


def _uuid_bytes(values: Sequence[Any]) -> list[Any]:
    return [v.bytes if isinstance(v, uuid.UUID) else v for v in values]


def _required_left_null(array: pa.Array) -> bool:
    """Whether a required member (of a struct, a list's element, a map's value) is null anywhere
    its parent is not."""
    kind = array.type
    if pa.types.is_struct(kind):
        valid = array.is_valid()
        for i, f in enumerate(kind):
            child = array.field(i)
            if not f.nullable and pc.any(pc.and_(valid, child.is_null())).as_py():
                return True
            if _required_left_null(pc.filter(child, valid)):
                return True
        return False
    if pa.types.is_map(kind):
        items = array.items
        return (not kind.item_field.nullable and items.null_count > 0) or _required_left_null(items)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        elements = _elements(array)
        return (not kind.value_field.nullable and elements.null_count > 0) or _required_left_null(elements)
    return False


def _elements(lists: pa.Array) -> pa.Array:
    """The elements of a list array's lists. pyarrow's flatten builds an empty result it cannot
    build for an extension type inside (a list of structs of UUIDs whose lists are all empty or
    null: "cannot construct builder for type extension<arrow.uuid>"); the values between the
    first and last offsets are then those elements (none)."""
    try:
        return lists.flatten()
    except pa.ArrowNotImplementedError:
        offsets = lists.offsets
        start, end = offsets[0].as_py(), offsets[-1].as_py()
        return lists.values.slice(start, end - start)


def _one_by_one(values: Sequence[Any], kind: pa.DataType, path: str) -> tuple[pa.Array, list[Problem]]:
    problems: list[Problem] = []
    built: list[Any] = []
    for i, value in enumerate(values):
        try:
            built.append(coerce(value, kind, path))
        except ValueProblem as exc:
            problems.append((i, str(exc)))
            built.append(None)
    build = storage_type(kind)
    array = pa.array(built, build)
    return (array if build == kind else array.cast(kind)), problems


def storage_type(kind: pa.DataType) -> pa.DataType:
    """`kind` with each UUID as its 16 bytes: pyarrow builds no extension type from Python values."""
    if is_uuid(kind):
        return pa.binary(16)
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(storage_type(f.type)) for f in kind])
    if pa.types.is_map(kind):
        return pa.map_(
            kind.key_field.with_type(storage_type(kind.key_type)),
            kind.item_field.with_type(storage_type(kind.item_type)),
        )
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(kind.value_field.with_type(storage_type(kind.value_type)))
    return kind


def coerce(value: Any, kind: pa.DataType, path: str) -> Any:
    """One value as pyarrow builds `storage_type(kind)` from it; raises ValueProblem naming the path
    of the part that does not fit."""
    if value is None:
        return None
    if pa.types.is_struct(kind):
        if not isinstance(value, dict):
            raise ValueProblem(f"{path}: expected a record, got {shown(value)}")
        out = {}
        for f in kind:
            member = coerce(value.get(f.name), f.type, f"{path}.{f.name}")
            if member is None and not f.nullable:
                raise ValueProblem(f"{path}.{f.name}: required, but missing or null")
            out[f.name] = member
        return out
    if pa.types.is_map(kind):
        pairs: list[Any] = list(value.items()) if isinstance(value, dict) else value
        if not isinstance(pairs, list | tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
            raise ValueProblem(f"{path}: expected a map, got {shown(value)}")
        entries = []
        for key, item in pairs:
            key_out = coerce(key, kind.key_type, f"{path} (a key)")
            if key_out is None:
                raise ValueProblem(f"{path}: a null key")
            item_out = coerce(item, kind.item_type, f"{path}.{key}")
            if item_out is None and not kind.item_field.nullable:
                raise ValueProblem(f"{path}.{key}: required, but null")
            entries.append((key_out, item_out))
        return entries
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        if not isinstance(value, list | tuple):
            raise ValueProblem(f"{path}: expected an array, got {shown(value)}")
        items = []
        for i, item in enumerate(value):
            item_out = coerce(item, kind.value_type, f"{path}[{i}]")
            if item_out is None and not kind.value_field.nullable:
                raise ValueProblem(f"{path}[{i}]: required, but null")
            items.append(item_out)
        return items
    try:
        return _scalar(value, kind)
    except (TypeError, ValueError, OverflowError, decimal.InvalidOperation, pa.ArrowInvalid):
        raise ValueProblem(f"{path}: expected {_described(kind)}, got {shown(value)}") from None


def _scalar(value: Any, kind: pa.DataType) -> Any:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        if isinstance(value, uuid.UUID):
            return str(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # its digits, as the columnar readers' cast of an integer field spells it
        if not isinstance(value, str):
            raise TypeError
        return str(value)
    if pa.types.is_boolean(kind):
        if not isinstance(value, bool):
            raise TypeError
        return value
    if pa.types.is_integer(kind):
        if isinstance(value, NamedNumber):
            value = value.number
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # a whole double fits, as the columnar path's safe cast takes it
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError
        pa.scalar(value, kind)  # range check
        return value
    if pa.types.is_floating(kind):
        if not isinstance(value, int | float):  # a bool too, as 0.0 / 1.0 (as pyarrow converts it)
            raise TypeError
        number = float(value)
        if math.isinf(number) and not math.isinf(value):
            raise ValueError("out of the double range")
        return number
    if pa.types.is_decimal(kind):
        if isinstance(value, bool) or not isinstance(value, int | decimal.Decimal):
            raise TypeError
        exact = decimal.Decimal(value)
        pa.scalar(exact, kind)  # precision and scale: no digit is dropped
        return exact
    if is_uuid(kind):
        if isinstance(value, uuid.UUID):
            return value.bytes
        if isinstance(value, str):
            return uuid.UUID(value).bytes
        if isinstance(value, bytes) and len(value) == 16:
            return value
        raise TypeError
    if pa.types.is_fixed_size_binary(kind):
        if not isinstance(value, bytes) or len(value) != kind.byte_width:
            raise TypeError
        return value
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        if isinstance(value, str):
            return value.encode("utf-8")  # as pyarrow converts it
        if not isinstance(value, bytes):
            raise TypeError
        return value
    if pa.types.is_timestamp(kind):
        if not isinstance(value, datetime.datetime):
            raise TypeError
        if kind.tz is not None:
            return value if value.tzinfo is not None else value.replace(tzinfo=_UTC)
        return value if value.tzinfo is None else value.astimezone(_UTC).replace(tzinfo=None)
    if pa.types.is_date(kind):
        if isinstance(value, datetime.datetime):
            return value.date()  # its wall-clock day, as pyarrow converts it
        if not isinstance(value, datetime.date):
            raise TypeError
        return value
    if pa.types.is_time(kind):
        if not isinstance(value, datetime.time):
            raise TypeError
        return value.replace(tzinfo=None)
    raise TypeError
